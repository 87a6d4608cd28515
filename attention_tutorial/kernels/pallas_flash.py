"""Our own FlashAttention forward kernel, written in Pallas (Triton lowering), and JAX's bundled one to race.

Why the Triton lowering: it runs on every NVIDIA GPU JAX supports (Ampere, Hopper, ...) and the same kernel runs
on a CPU in Pallas's interpreter, so the tests check it without a GPU. Mosaic GPU, Pallas's Hopper-only lowering,
reaches further (warpgroup matmuls, TMA copies, explicit pipelining) at the price of a longer kernel; the page
compares with JAX's own Mosaic GPU kernel and says what it would take.

The kernel: the grid is (query blocks, batch, heads); one program owns ``block_q`` query rows of one head and
walks over the keys ``block_k`` at a time with the online softmax of :mod:`attention_tutorial.kernels.blockwise`:

1. load its q tile once (it stays in registers/shared memory) and fold the softmax scale and log2(e) into it,
   so the loop uses ``exp2``, the GPU's native exponential;
2. for each key block: s = q kᵀ (tensor cores, float32 accumulate); running max; p = exp2(s - m);
   rescale the accumulator and add p v;
3. causal: blocks wholly after the query block are never visited (the loop stops at the diagonal), and only the
   blocks that straddle the diagonal pay for building a mask;
4. GQA: the key/value BlockSpec maps query head n to kv head n // (N // K), so shared heads are never copied.
"""

from __future__ import annotations

import functools
import math
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ..inputs import AttentionShape, attention_shape

LOG2E = math.log2(math.e)


# JAX 0.11 deprecates Pallas's Triton lowering (for Mosaic GPU) and its bundled Triton attention, warning when a
# kernel is lowered. This module chooses that lowering on purpose and the page says so once, so the warnings are
# filtered here instead of repeated in every output.
_DEPRECATIONS = ("The Pallas Triton backend is deprecated", "jax.experimental.pallas.ops.gpu.attention is deprecated")
for _message in _DEPRECATIONS:
    warnings.filterwarnings("ignore", message=_message, category=DeprecationWarning)


def _kernel(q_ref, k_ref, v_ref, o_ref, *, causal, block_q, block_k, seq_kv, scale):
    i = pl.program_id(0)  # which block of queries
    q = q_ref[...]  # (block_q, H), loaded once
    q = (q.astype(jnp.float32) * (scale * LOG2E)).astype(q_ref.dtype)  # softmax in base 2: exp(x) = 2^(x·log2 e)
    m = jnp.full((block_q,), -jnp.inf, jnp.float32)  # running max (base-2 logits)
    l = jnp.zeros((block_q,), jnp.float32)  # running sum
    acc = jnp.zeros(q.shape, jnp.float32)  # unnormalised output

    def step(j, carry, masked):
        m, l, acc = carry
        k = k_ref[pl.ds(j * block_k, block_k), :]  # (block_k, H)
        v = v_ref[pl.ds(j * block_k, block_k), :]
        s = jnp.dot(q, k.T, preferred_element_type=jnp.float32)  # (block_q, block_k)
        if masked:  # only the diagonal blocks build a mask
            rows = i * block_q + lax.broadcasted_iota(jnp.int32, s.shape, 0)
            cols = j * block_k + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(cols <= rows, s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(axis=1))
        p = jnp.exp2(s - m_new[:, None])
        alpha = jnp.exp2(m - m_new)
        l = alpha * l + p.sum(axis=1)
        acc = alpha[:, None] * acc + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return m_new, l, acc

    n_blocks = seq_kv // block_k
    if causal:
        # blocks entirely at or below the diagonal need no mask; the ones that straddle it do; the rest are skipped
        first_masked = jnp.minimum((i * block_q) // block_k, n_blocks)
        end = jnp.minimum(lax.div((i + 1) * block_q + block_k - 1, block_k), n_blocks)
        carry = lax.fori_loop(0, first_masked, functools.partial(step, masked=False), (m, l, acc))
        m, l, acc = lax.fori_loop(first_masked, end, functools.partial(step, masked=True), carry)
    else:
        m, l, acc = lax.fori_loop(0, n_blocks, functools.partial(step, masked=False), (m, l, acc))
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)


# Tuned on the H200 (scripts/tune.py pallas, eight configurations, B=8, T=4096, N=16): (block_q, block_k, warps)
TUNED = {64: (128, 64, 4), 128: (128, 128, 8)}


def flash_attention(q, k, v, *, is_causal: bool = False, scale: float | None = None, block_q: int | None = None,
                    block_k: int | None = None, num_warps: int | None = None, num_stages: int = 3,
                    interpret: bool | None = None) -> jax.Array:  # fmt: skip
    """Our Pallas FlashAttention forward: q (B, T, N, H), k/v (B, S, K, H) -> (B, T, N, H).

    Needs T % block_q == 0 and S % block_k == 0 (block sizes shrink to T or S when those are smaller); causal
    masks align top-left. ``interpret`` (default: when not on a GPU) runs Pallas's interpreter instead.
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    tuned_q, tuned_k, tuned_warps = TUNED.get(H, (128, 64, 4 if H <= 64 else 8))
    bq, bk = min(block_q or tuned_q, T), min(block_k or tuned_k, S)
    if T % bq or S % bk:
        raise ValueError(f"T={T} and S={S} must be multiples of block_q={bq} and block_k={bk}; pad or pick blocks.")
    scale = 1.0 / math.sqrt(H) if scale is None else float(scale)
    interpret = jax.default_backend() != "gpu" if interpret is None else interpret
    G = N // K
    kernel = functools.partial(_kernel, causal=is_causal, block_q=bq, block_k=bk, seq_kv=S, scale=scale)
    params = {}
    if not interpret:
        from jax.experimental.pallas import triton as plgpu

        warps = num_warps or tuned_warps
        params["compiler_params"] = plgpu.CompilerParams(num_warps=warps, num_stages=num_stages)
    call = pl.pallas_call(
        kernel,
        grid=(T // bq, B, N),
        in_specs=[
            pl.BlockSpec((None, bq, None, H), lambda i, b, n: (b, i, n, 0)),  # one q tile of head n
            pl.BlockSpec((None, S, None, H), lambda i, b, n: (b, 0, n // G, 0)),  # all keys of kv head n // G
            pl.BlockSpec((None, S, None, H), lambda i, b, n: (b, 0, n // G, 0)),
        ],
        out_specs=pl.BlockSpec((None, bq, None, H), lambda i, b, n: (b, i, n, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=interpret,
        name="our_flash_forward",
        **params,
    )
    return call(q, k, v)


def why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why our kernel cannot run this problem here (it times only on a GPU), or None."""
    if jax.default_backend() != "gpu":
        return "our Pallas kernel is timed on a GPU only (on a CPU it runs in Pallas's slow interpreter, for tests)."
    return _block_why_not(shape, dtype, *TUNED.get(shape.head_dim, (128, 64, 0))[:2])


def _block_why_not(shape, dtype, bq, bk):
    if jnp.dtype(dtype).name not in ("bfloat16", "float16"):
        return f"it takes bfloat16/float16 (tensor-core) inputs, not {jnp.dtype(dtype).name}."
    if shape.head_dim not in (16, 32, 64, 128, 256):
        return f"head_dim must be a power of two between 16 and 256; got {shape.head_dim}."
    if shape.seq_q % min(bq, shape.seq_q) or shape.seq_kv % min(bk, shape.seq_kv):
        return f"T and S must be multiples of the blocks ({bq}, {bk}); got T={shape.seq_q}, S={shape.seq_kv}."
    return None


def jax_bundled_mha(q, k, v, *, is_causal: bool = False):
    """JAX's bundled Pallas (Triton) attention, ``jax.experimental.pallas.ops.gpu.attention.mha``, for the race.

    It has no GQA: k/v heads are repeated to N first. Its default softmax scale is 1.0, so we pass 1/sqrt(H).
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    if K != N:
        k, v = jnp.repeat(k, N // K, axis=2), jnp.repeat(v, N // K, axis=2)
    from jax.experimental.pallas.ops.gpu import attention

    return attention.mha(q, k, v, None, sm_scale=1.0 / math.sqrt(H), causal=is_causal)


def bundled_why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why JAX's bundled Pallas kernel cannot run this problem here, or None."""
    if jax.default_backend() != "gpu":
        return "JAX's bundled Pallas kernel lowers through Triton: it needs an NVIDIA GPU."
    return _block_why_not(shape, dtype, 128, 128)
