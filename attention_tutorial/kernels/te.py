"""NVIDIA TransformerEngine attention behind the package's call shape, imported lazily and guarded.

``te_attention(q, k, v, is_causal=...)`` runs ``transformer_engine.jax.flax.DotProductAttention`` on the same
(B, T, N, H) / (B, S, K, H) arrays as every other implementation here: ``te_config`` maps our arguments onto
TE's (N -> ``num_attention_heads``, K -> ``num_gqa_groups``, causal -> ``attn_mask_type``, the bshd layout,
batch first). Without TE (any CPU build, or a GPU without the ``te`` extra) ``why_not`` says so and nothing
imports it.

FP8, honestly (see the TransformerEngine page): under ``te.autocast`` only TE's GEMM layers (``DenseGeneral``
and friends) compute in FP8; ``DotProductAttention`` stays in bf16. ``hlo_fp8_types`` shows it from the
compiled program. Real FP8 attention is cuDNN's, reached through a private JAX function (:mod:`attention_tutorial.measure.fp8`).
"""

from __future__ import annotations

import importlib.util
import math
from typing import cast

import jax
import jax.numpy as jnp

from ..inputs import AttentionShape, attention_shape, check_flag, invalid_reason
from .masks import check_mask_args

INSTALL_HINT = "pip install 'attention-tutorial[te]' on a CUDA GPU builder; see the README's 'TransformerEngine'"


def te_config(shape: AttentionShape, causal: bool) -> dict:
    """TE ``DotProductAttention`` arguments for our shape: (B, T, N, H) batch-first, N heads, K GQA groups."""
    if reason := invalid_reason(shape, "bfloat16"):
        raise ValueError(reason)
    shape, causal = AttentionShape(*(int(n) for n in shape)), check_flag("causal", causal)
    return {
        "head_dim": shape.head_dim,
        "num_attention_heads": shape.heads,
        "num_gqa_groups": shape.kv_heads,
        "attn_mask_type": "causal" if causal else "no_mask",
        "qkv_layout": "bshd_bshd_bshd",
        "transpose_batch_sequence": False,
        "scale_factor": 1.0 / math.sqrt(shape.head_dim),
        "attention_dropout": 0.0,
    }


def installed() -> bool:
    """Whether the TransformerEngine JAX package can be found (without importing it)."""
    return importlib.util.find_spec("transformer_engine") is not None


def why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why TE attention cannot run here, or None."""
    check_flag("causal", causal)
    if reason := invalid_reason(shape, dtype):
        return reason
    if jax.default_backend() != "gpu":
        return f"TransformerEngine needs an NVIDIA GPU; this build runs on {jax.default_backend().upper()}."
    if not installed():
        return f"TransformerEngine is not installed here ({INSTALL_HINT})."
    if jnp.dtype(dtype).name not in ("bfloat16", "float16"):
        return f"TE fused attention takes bfloat16/float16, not {jnp.dtype(dtype).name}."
    return None


def import_te():
    """Import ``transformer_engine.jax``, quietly: TE warns at import when PyTorch is installed without TE's
    PyTorch extension (the GPU image has PyTorch), and TE 2.20 uses a jax API that jax 0.11 deprecates; both
    warnings are about TE's packaging, not about this code."""
    import warnings

    if not installed():
        raise ImportError(f"TransformerEngine is not installed here: {INSTALL_HINT}.")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected a PyTorch installation", category=RuntimeWarning)
        warnings.filterwarnings("ignore", message="jax.interpreters.pxla.thread_resources", category=DeprecationWarning)
        import transformer_engine.jax as te_jax
    return te_jax


def te_attention(q, k, v, *, is_causal: bool = False) -> jax.Array:
    """TransformerEngine's fused ``DotProductAttention``: q (B, T, N, H), k/v (B, S, K, H) -> (B, T, N, H)."""
    import warnings

    shape = attention_shape(q, k, v)
    check_mask_args(shape, is_causal=is_causal)
    te_flax = import_te().flax
    module = te_flax.DotProductAttention(**te_config(shape, is_causal))
    with warnings.catch_warnings():  # TE 2.20's module itself calls fused_attn the deprecated way when unmasked
        warnings.filterwarnings("ignore", message="Pass mask to fused_attn is deprecated", category=DeprecationWarning)
        return module.apply({}, q, k, v, deterministic=True)


def te_backend(shape: AttentionShape, dtype, causal: bool, training: bool = False) -> str:
    """The fused-attention backend TE selects for this problem — what ``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=1`` logs —
    asked through TE's own ``FusedAttnHelper`` with the arguments ``te_config`` gives DotProductAttention, e.g.
    'NVTE_F16_arbitrary_seqlen' (its cuDNN flash-attention backend); with TE's reason when it rejects all."""
    import_te()
    from transformer_engine.jax.attention import AttnBiasType, AttnMaskType, AttnSoftmaxType, QKVLayout
    from transformer_engine.jax.cpp_extensions.attention import FusedAttnHelper

    helper = FusedAttnHelper(
        is_training=training,
        batch_size=shape.batch,
        q_dtype=jnp.dtype(dtype),
        kv_dtype=jnp.dtype(dtype),
        qkv_layout=QKVLayout.BSHD_BSHD_BSHD,
        attn_bias_type=AttnBiasType.NO_BIAS,
        attn_mask_type=AttnMaskType.CAUSAL_MASK if causal else AttnMaskType.NO_MASK,
        softmax_type=AttnSoftmaxType.VANILLA_SOFTMAX,
        dropout_probability=0.0,
        q_num_heads=shape.heads,
        kv_num_heads=shape.kv_heads,
        q_max_seqlen=shape.seq_q,
        kv_max_seqlen=shape.seq_kv,
        head_dim_qk=shape.head_dim,
        head_dim_v=shape.head_dim,
        window_size=(-1, -1),
        bottom_right_diagonal=False,
        attn_scale=1.0 / math.sqrt(shape.head_dim),
    )
    backend, message = helper.get_fused_attn_backend()
    name = getattr(backend, "name", str(backend))
    return f"{name} ({message})" if message else name


def hlo_fp8_types(fn, *args) -> tuple[str, ...]:
    """The FP8 element types (f8e4m3fn, f8e5m2, ...) that appear in ``fn``'s compiled HLO: empty means no FP8."""
    import re

    text = cast(str, jax.jit(fn).lower(*args).compile().as_text())
    return tuple(sorted(set(re.findall(r"\bf8e\w+", text))))


def delayed_scaling_recipe():
    """The codelab's recipe: HYBRID (E4M3 forward, E5M2 gradients), amax history 1024, scale from its max."""
    import_te()
    from transformer_engine.common.recipe import DelayedScaling, Format

    return DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=1024, amax_compute_algo="max")
