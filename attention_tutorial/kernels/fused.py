"""Fused attention: a thin, validating wrapper over ``jax.nn.dot_product_attention``.

``implementation`` picks the path: ``"xla"`` (einsums + softmax, compiled by XLA; runs everywhere, but float16 on a CPU),
``"cudnn"`` (NVIDIA's fused flash-attention kernel; GPU, fp16/bf16 only) or ``None`` (JAX chooses; see the
"which kernel ran" page for what it really picks). Shapes as in :mod:`attention_tutorial.inputs`; the masking
keywords and their accepted shapes as in :mod:`attention_tutorial.kernels.masks` (checked before JAX sees them).

``causal_alignment="bottom_right"`` (which ``jax.nn`` has no flag for) is passed to JAX as an explicit mask
(:func:`~attention_tutorial.kernels.masks.causal_args`), ANDed with any mask of the caller's.

Rows with nothing to see: the XLA path returns the mean of v over all S keys for a row emptied by a mask, the
causal triangle, a window or ``key_value_seq_lengths`` (JAX masks with a large finite negative number, so the
softmax of such a row is uniform), and zeros for rows at or past ``query_seq_lengths`` (JAX zeroes those).
JAX does not guard its scores: a ``|scale|`` so large that q·kᵀ·scale overflows float32 (~3.4e38) would give NaN, so
such a scale is refused (``ValueError``) when q and k are concrete — checked against ``|scale| · H · max|q| · max|k|``;
under ``jit`` their values are unknown and the check cannot run. The naive version and blockwise compute any
finite scale exactly (the hard maximum at huge ones), as the float64 reference does.
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp

from ..inputs import AttentionShape, Unsupported, attention_shape, check_scores_fit, invalid_reason, resolve_scale
from .masks import Alignment, causal_mask, check_mask_args, segment_mask

Implementation = Literal["xla", "cudnn"] | None
CUDNN_DTYPES = ("bfloat16", "float16")
XLA_DTYPES = ("bfloat16", "float16", "float32", "float64")  # not FP8: jax.nn refuses to promote 8-bit floats


def dot_product_attention(
    q,
    k,
    v,
    *,
    implementation: Implementation = None,
    is_causal: bool = False,
    causal_alignment: Alignment = "top_left",
    scale: float | None = None,
    mask=None,
    bias=None,
    local_window_size: int | tuple[int, int] | None = None,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    segment_ids=None,
) -> jax.Array:
    """``jax.nn.dot_product_attention`` after checking shapes (and, for cuDNN, what cuDNN accepts).

    q (B, T, N, H), k and v (B, S, K, H) -> (B, T, N, H). Causal masks are aligned top-left unless
    ``causal_alignment="bottom_right"``. ``segment_ids`` (B, T) integers (or a pair (B, T), (B, S)), as our kernel
    takes them: a query sees only keys of its own segment (packed documents); JAX has no such argument, so they
    become a (B, 1, T, S) mask, combined with ``mask`` (cuDNN then runs its kernel with a mask). Raises
    ``ValueError`` naming the fix for any bad shape, dtype or option.
    """
    shape = attention_shape(q, k, v)
    if implementation not in (None, "xla", "cudnn"):
        raise ValueError(f'implementation must be None, "xla" or "cudnn"; got {implementation!r:.60}.')
    if reason := invalid_reason(shape, jnp.result_type(q)):  # bad input: a plain ValueError
        raise ValueError(f"jax.nn.dot_product_attention: {reason}")
    if reason := xla_why_not(shape, jnp.result_type(q)):  # a valid problem it cannot run
        raise Unsupported(f"jax.nn.dot_product_attention cannot run this: {reason}")
    scale = resolve_scale(scale, shape.head_dim)
    check_scores_fit(q, k, scale, what="jax.nn.dot_product_attention")
    opt = check_mask_args(
        shape,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        mask=mask,
        bias=bias,
        local_window_size=local_window_size,
        query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths,
    )
    mask, is_causal = opt["mask"], opt["is_causal"]
    if segment_ids is not None:
        docs = segment_mask(segment_ids, shape.batch, shape.seq_q, shape.seq_kv)
        mask = docs if mask is None else jnp.logical_and(mask, docs)
    if is_causal and causal_alignment == "bottom_right" and shape.seq_q != shape.seq_kv:
        tri = jnp.asarray(causal_mask(shape.seq_q, shape.seq_kv, alignment="bottom_right"))[None, None]
        mask, is_causal = (tri if mask is None else jnp.logical_and(mask, tri)), False
    if implementation == "cudnn":
        reason = cudnn_why_not(shape, jnp.result_type(q))
        window = opt["local_window_size"]
        if reason is None and window is not None and window[1] != 0 and not is_causal:
            reason = f"its windows look left only; got local_window_size={window}. Use (left, 0), or the XLA path."
        if reason:
            raise Unsupported(f"cuDNN attention cannot run this: {reason}")
    lengths = {
        n: None if opt[n] is None else jnp.asarray(opt[n], jnp.int32)
        for n in ("query_seq_lengths", "key_value_seq_lengths")
    }
    window = opt["local_window_size"]
    return _fused(
        q,
        k,
        v,
        opt["bias"],
        mask,
        lengths,
        scale=scale,
        is_causal=is_causal,
        local_window_size=window,
        implementation=implementation,
    )


# One compiled program per shape and set of options: called outside jit, the XLA path runs as one program rather
# than op by op (on a GPU each op alone is a compilation of its own).
@functools.partial(jax.jit, static_argnames=("scale", "is_causal", "local_window_size", "implementation"))
def _fused(q, k, v, bias, mask, lengths, *, scale, is_causal, local_window_size, implementation):
    return jax.nn.dot_product_attention(
        q,
        k,
        v,
        bias,
        mask,
        scale=scale,
        is_causal=is_causal,
        local_window_size=local_window_size,
        implementation=implementation,
        **lengths,
    )


def xla_why_not(shape: AttentionShape, dtype, *, device: jax.Device | None = None) -> str | None:
    """Why ``jax.nn.dot_product_attention`` (XLA path) cannot run ``shape`` in ``dtype`` on ``device`` (default: the
    first), or None. On a CPU, float16 is refused: compiled, its float16 matmul accumulating in float32 is one XLA's
    CPU backend does not have."""
    if reason := invalid_reason(shape, dtype):
        return reason
    name = jnp.dtype(dtype).name
    if name not in XLA_DTYPES:
        return f"it takes {', '.join(XLA_DTYPES)} inputs, not {name}; cast with .astype(jnp.bfloat16)."
    device = jax.devices()[0] if device is None else device
    if not isinstance(device, jax.Device):
        raise ValueError(f"device must be a jax.Device (e.g. jax.devices()[0]) or None; got {device!r:.60}.")
    if name == "float16" and device.platform == "cpu":
        return (
            "XLA on a CPU cannot compile a float16 matmul that accumulates in float32; use float32 or bfloat16 "
            "on a CPU (float16 runs on a GPU)."
        )
    return None


def cudnn_why_not(shape: AttentionShape, dtype, *, device: jax.Device | None = None) -> str | None:
    """Why cuDNN's fused attention cannot run ``shape`` in ``dtype`` on ``device`` (default: the first), or None.

    Mirrors the checks JAX makes before it calls cuDNN, so a page or a sweep can say why instead of failing:
    a CUDA GPU of compute capability >= 8.0, fp16/bf16 inputs, head_dim a multiple of 8 and at most 128
    (256 from Hopper, sm_90, on).
    """
    if reason := invalid_reason(shape, dtype):
        return reason
    device = jax.devices()[0] if device is None else device
    if not isinstance(device, jax.Device):
        raise ValueError(f"device must be a jax.Device (e.g. jax.devices()[0]) or None; got {device!r:.60}.")
    if device.platform != "gpu" or "cuda" not in getattr(device.client, "platform_version", "").lower():
        return f"it needs an NVIDIA GPU; this build runs on {device.platform.upper()} ({device.device_kind})."
    cc = tuple(int(x) for x in str(getattr(device, "compute_capability", "0.0")).split("."))
    if cc < (8, 0):
        return f"it needs compute capability >= 8.0 (Ampere or newer); {device.device_kind} is {cc[0]}.{cc[1]}."
    name = jnp.dtype(dtype).name
    if name not in CUDNN_DTYPES:
        return f"it takes float16 or bfloat16 inputs, not {name}; cast q, k, v with .astype(jnp.bfloat16)."
    h_max = 256 if cc >= (9, 0) else 128
    if shape.head_dim % 8 or shape.head_dim > h_max:
        return f"head_dim must be a multiple of 8 and at most {h_max} on this GPU; got {shape.head_dim}."
    return None
