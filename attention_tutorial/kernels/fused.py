"""Fused attention: a thin, validating wrapper over ``jax.nn.dot_product_attention``.

``implementation`` picks the path: ``"xla"`` (einsums + softmax, compiled by XLA; runs everywhere),
``"cudnn"`` (NVIDIA's fused flash-attention kernel; GPU, fp16/bf16 only) or ``None`` (JAX chooses; see the
"which kernel ran" page for what it really picks). Shapes as in :mod:`attention_tutorial.inputs`.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from ..inputs import AttentionShape, attention_shape

Implementation = Literal["xla", "cudnn"] | None
CUDNN_DTYPES = ("bfloat16", "float16")


def dot_product_attention(
    q,
    k,
    v,
    *,
    implementation: Implementation = None,
    is_causal: bool = False,
    scale: float | None = None,
    mask=None,
    bias=None,
    local_window_size: int | tuple[int, int] | None = None,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
) -> jax.Array:
    """``jax.nn.dot_product_attention`` after checking shapes (and, for cuDNN, what cuDNN accepts).

    q (B, T, N, H), k and v (B, S, K, H) -> (B, T, N, H). Causal masks are aligned top-left (see
    :mod:`attention_tutorial.kernels.reference`). Raises ``ValueError`` with the fix for bad shapes or dtypes.
    """
    shape = attention_shape(q, k, v)
    if implementation not in (None, "xla", "cudnn"):
        raise ValueError(f'implementation must be None, "xla" or "cudnn"; got {implementation!r}.')
    if implementation == "cudnn":
        reason = cudnn_why_not(shape, jnp.result_type(q))
        if reason:
            raise ValueError(f"cuDNN attention cannot run this: {reason}")
    return jax.nn.dot_product_attention(
        q,
        k,
        v,
        bias,
        mask,
        scale=scale,
        is_causal=is_causal,
        query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths,
        local_window_size=local_window_size,
        implementation=implementation,
    )


def cudnn_why_not(shape: AttentionShape, dtype, *, device: jax.Device | None = None) -> str | None:
    """Why cuDNN's fused attention cannot run ``shape`` in ``dtype`` on ``device`` (default: the first), or None.

    Mirrors the checks JAX makes before it calls cuDNN, so a page or a sweep can say why instead of failing:
    a CUDA GPU of compute capability >= 8.0, fp16/bf16 inputs, head_dim a multiple of 8 and at most 128
    (256 from Hopper, sm_90, on).
    """
    device = jax.devices()[0] if device is None else device
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
