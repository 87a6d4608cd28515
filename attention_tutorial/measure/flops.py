"""FLOP and byte models for attention, kept apart from timing (as in FlashAttention's benchmarks).

Forward: two matmuls, q kᵀ (B·N·T·S·H multiply-adds) and P v (as many), so 4·B·N·T·S·H FLOPs. A causal
mask over self-attention (T == S) skips half of the pairs: the convention, also used by FlashAttention's
benchmarks, counts half. The backward pass does five such matmuls to the forward's two: ×2.5, so a
forward+backward step is 3.5× the forward. Softmax FLOPs are not counted (they run on other units).
"""

from __future__ import annotations

import jax.numpy as jnp

PASSES = ("fwd", "fwd+bwd")


def attention_flops(batch, seq_q, seq_kv, heads, head_dim, *, causal=False, pass_="fwd") -> float:
    """Matmul FLOPs of one attention call: 4·B·N·T·S·H, halved when causal, ×3.5 for fwd+bwd."""
    if pass_ not in PASSES:
        raise ValueError(f"pass_ must be one of {PASSES}; got {pass_!r}.")
    flops = 4.0 * batch * heads * seq_q * seq_kv * head_dim
    if causal:
        flops /= 2
    return flops * (3.5 if pass_ == "fwd+bwd" else 1.0)


def attention_bytes(batch, seq_q, seq_kv, heads, kv_heads, head_dim, dtype) -> int:
    """The fewest bytes a forward pass must move: read q, k, v once and write the output once."""
    item = jnp.dtype(dtype).itemsize
    q_and_out = 2 * batch * seq_q * heads * head_dim
    k_and_v = 2 * batch * seq_kv * kv_heads * head_dim
    return (q_and_out + k_and_v) * item


def kv_cache_bytes(kv_heads, head_dim, dtype, *, tokens=1, batch=1, layers=1) -> int:
    """Bytes of a key/value cache: 2 (k and v) · layers · K · H · itemsize per token, times tokens and batch.

    Only K, the number of key/value heads, enters: query heads don't. That is why GQA (K < N) and MQA (K = 1)
    shrink the cache by N / K.
    """
    return 2 * layers * kv_heads * head_dim * jnp.dtype(dtype).itemsize * tokens * batch
