"""Our own FlashAttention kernels (forward and backward) in Pallas (Triton lowering), and JAX's bundled one.

Why the Triton lowering: it runs on every NVIDIA GPU JAX supports (Ampere, Hopper, ...) and the same kernel runs
on a CPU in Pallas's interpreter, so the tests check it without a GPU. Mosaic GPU, Pallas's Hopper-only lowering,
reaches further (warpgroup matmuls, TMA copies, explicit pipelining) at the price of a longer kernel; the page
compares with JAX's own Mosaic GPU kernel and says what it would take.

The kernel: the grid is (query blocks, batch, heads); one program owns ``block_q`` query rows of one head and
walks over the keys ``block_k`` at a time with the online softmax of :mod:`attention_tutorial.kernels.blockwise`:

1. load its q tile once (it stays in registers/shared memory); the softmax scale and log2(e) multiply the
   float32 scores, so the loop uses ``exp2``, the GPU's native exponential;
2. for each key block: s = q kᵀ (tensor cores, float32 accumulate); running max; p = exp2(s - m);
   rescale the accumulator and add p v;
3. causal: blocks wholly after the query block are never visited (the loop stops at the diagonal), and only the
   blocks that straddle the diagonal pay for building a mask;
4. GQA: the key/value BlockSpec maps query head n to kv head n // (N // K), so shared heads are never copied;
5. it also writes each row's log-sum-exp, which the backward (a ``jax.custom_vjp``, FlashAttention-2: see
   :func:`flash_attention`) uses to recompute the weights block by block instead of storing them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ..inputs import AttentionShape, attention_shape, check_block_size, check_flag, resolve_scale

F32_MAX = float(jnp.finfo(jnp.float32).max)  # scores are clamped to it, as naive attention does
LOG2E = math.log2(math.e)


# JAX 0.11 deprecates Pallas's Triton lowering (for Mosaic GPU) and its bundled Triton attention, warning when a
# kernel is lowered. This module chooses that lowering on purpose and the page says so once, so the warnings are
# filtered here instead of repeated in every output.
_DEPRECATIONS = ("The Pallas Triton backend is deprecated", "jax.experimental.pallas.ops.gpu.attention is deprecated")
for _message in _DEPRECATIONS:
    warnings.filterwarnings("ignore", message=_message, category=DeprecationWarning)


def _i32(x):
    """An int32 scalar: loop bounds stay int32 also under JAX_ENABLE_X64=1 (Python ints would become int64)."""
    return jnp.asarray(x, jnp.int32)


def _kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, causal, block_q, block_k, seq_kv, scale):
    i = pl.program_id(0)  # which block of queries
    q = q_ref[...]  # (block_q, H), loaded once
    c = scale * LOG2E  # softmax in base 2: exp(scale·x) = 2^(c·x), applied to the float32 scores (one multiply)
    m = jnp.full((block_q,), -jnp.inf, jnp.float32)  # running max (base-2 logits)
    l = jnp.zeros((block_q,), jnp.float32)  # running sum
    acc = jnp.zeros(q.shape, jnp.float32)  # unnormalised output

    def step(j, carry, masked):
        m, l, acc = carry
        k = k_ref[pl.ds(j * block_k, block_k), :]  # (block_k, H)
        v = v_ref[pl.ds(j * block_k, block_k), :]
        s = jnp.clip(
            jnp.dot(q, k.T, preferred_element_type=jnp.float32) * c, -F32_MAX, F32_MAX
        )  # (block_q, block_k); a huge scale: no inf - inf
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

    n_blocks = _i32(seq_kv // block_k)
    if causal:
        # blocks entirely at or below the diagonal need no mask; the ones that straddle it do; the rest are skipped
        first_masked = jnp.minimum(lax.div(i * block_q, _i32(block_k)), n_blocks)
        end = jnp.minimum(lax.div((i + 1) * block_q + block_k - 1, _i32(block_k)), n_blocks)
        carry = lax.fori_loop(_i32(0), first_masked, functools.partial(step, masked=False), (m, l, acc))
        m, l, acc = lax.fori_loop(first_masked, end, functools.partial(step, masked=True), carry)
    else:
        m, l, acc = lax.fori_loop(_i32(0), n_blocks, functools.partial(step, masked=False), (m, l, acc))
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l) * LOG2E  # base-2 log-sum-exp of the scaled logits: the backward's residual


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, causal, block_q, block_k,
                seq_q, scale):  # fmt: skip
    """One key block of one query head: walk the query blocks that see it; dV += Pᵀ dO, dK += dSᵀ Q · scale."""
    j = pl.program_id(0)  # which block of keys
    k, v = k_ref[...], v_ref[...]  # (block_k, H), loaded once
    dk = jnp.zeros(k.shape, jnp.float32)
    dv = jnp.zeros(v.shape, jnp.float32)

    def step(i, carry, masked):
        dk, dv = carry
        rows = pl.ds(i * block_q, block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]  # (block_q, H)
        lse, delta = lse_ref[rows], delta_ref[rows]  # (block_q,)
        s = jnp.clip(jnp.dot(q, k.T, preferred_element_type=jnp.float32) * (scale * LOG2E), -F32_MAX, F32_MAX)
        p = jnp.exp2(s - lse[:, None])  # the forward's weights, recomputed from its log-sum-exp
        if masked:
            r = i * block_q + lax.broadcasted_iota(jnp.int32, s.shape, 0)
            c = j * block_k + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            p = jnp.where(c <= r, p, 0.0)
        dv = dv + jnp.dot(p.astype(do.dtype).T, do, preferred_element_type=jnp.float32)
        dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32)
        ds = p * (dp - delta[:, None])
        dk = dk + jnp.dot(ds.astype(q.dtype).T, q, preferred_element_type=jnp.float32)
        return dk, dv

    n_q = _i32(seq_q // block_q)
    if causal:  # query blocks wholly above the diagonal never see these keys: start at the first that does
        first = jnp.minimum(lax.div(j * block_k, _i32(block_q)), n_q)
        unmasked = jnp.minimum(lax.div((j + 1) * block_k + block_q - 1, _i32(block_q)), n_q)
        carry = lax.fori_loop(first, unmasked, functools.partial(step, masked=True), (dk, dv))
        dk, dv = lax.fori_loop(unmasked, n_q, functools.partial(step, masked=False), carry)
    else:
        dk, dv = lax.fori_loop(_i32(0), n_q, functools.partial(step, masked=False), (dk, dv))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, causal, block_q, block_k, seq_kv,
               scale):  # fmt: skip
    """One query block: walk the key blocks it sees (as the forward does); dQ += dS K · scale."""
    i = pl.program_id(0)
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]
    dq = jnp.zeros(q.shape, jnp.float32)

    def step(j, dq, masked):
        cols = pl.ds(j * block_k, block_k)
        k, v = k_ref[cols, :], v_ref[cols, :]
        s = jnp.clip(jnp.dot(q, k.T, preferred_element_type=jnp.float32) * (scale * LOG2E), -F32_MAX, F32_MAX)
        p = jnp.exp2(s - lse[:, None])
        if masked:
            r = i * block_q + lax.broadcasted_iota(jnp.int32, s.shape, 0)
            c = j * block_k + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            p = jnp.where(c <= r, p, 0.0)
        dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32)
        ds = p * (dp - delta[:, None])
        return dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    n_kv = _i32(seq_kv // block_k)
    if causal:
        first_masked = jnp.minimum(lax.div(i * block_q, _i32(block_k)), n_kv)
        end = jnp.minimum(lax.div((i + 1) * block_q + block_k - 1, _i32(block_k)), n_kv)
        dq = lax.fori_loop(_i32(0), first_masked, functools.partial(step, masked=False), dq)
        dq = lax.fori_loop(first_masked, end, functools.partial(step, masked=True), dq)
    else:
        dq = lax.fori_loop(_i32(0), n_kv, functools.partial(step, masked=False), dq)
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


# Tuned on the H200 (tools/tune.py pallas, eight configurations, B=8, T=4096, N=16): (block_q, block_k, warps)
TUNED = {64: (128, 64, 4), 128: (128, 128, 8)}
BWD_BLOCK = 64  # the backward holds more tiles per program (k, v, dk, dv or q, dO, dq): smaller blocks


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything static about one call: mask, scale, blocks (forward and backward), Triton settings."""

    causal: bool
    scale: float
    block_q: int
    block_k: int
    bwd_q: int
    bwd_k: int
    num_warps: int
    num_stages: int
    interpret: bool


def flash_attention(q, k, v, *, is_causal: bool = False, scale: float | None = None, block_q: int | None = None,
                    block_k: int | None = None, num_warps: int | None = None, num_stages: int = 3,
                    interpret: bool | None = None, return_lse: bool = False):  # fmt: skip
    """Our Pallas FlashAttention: q (B, T, N, H), k/v (B, S, K, H) -> (B, T, N, H), differentiable.

    Needs T % block_q == 0 and S % block_k == 0 (block sizes shrink to T or S when those are smaller); causal
    masks align top-left. ``interpret`` (default: when not on a GPU) runs Pallas's interpreter instead.
    ``return_lse=True`` returns ``(out, lse)`` with lse (B, N, T) float32, the natural log of each row's sum of
    exp(scale · q·k) — what context parallelism needs to merge partial results (differentiable too).

    The backward (a ``jax.custom_vjp``) recomputes the weights block by block from the saved log-sum-exp
    (FlashAttention-2) in two kernels: one per key block accumulates dK and dV over the query blocks that see it,
    one per query block accumulates dQ over the key blocks it sees. dQ gets its own pass rather than being
    accumulated into from the dK/dV kernel because every program then owns its output: no atomic adds (which
    Pallas's Triton lowering offers only in float32 and which make results run-to-run nondeterministic), at the
    cost of recomputing q·kᵀ and dO·vᵀ once more. GQA: dK and dV are computed per query head and summed over the
    N // K heads that share a kv head.
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    tuned_q, tuned_k, tuned_warps = TUNED.get(H, (128, 64, 4 if H <= 64 else 8))
    bq = min(check_block_size("block_q", block_q) if block_q is not None else tuned_q, T)
    bk = min(check_block_size("block_k", block_k) if block_k is not None else tuned_k, S)
    if T % bq or S % bk:
        raise ValueError(
            f"T={T} and S={S} must be multiples of block_q={bq} and block_k={bk}; pad the sequences or pick "
            f"blocks that divide them (q {tuple(q.shape)}, k {tuple(k.shape)})."
        )
    plan = _Plan(
        causal=check_flag("is_causal", is_causal),
        scale=resolve_scale(scale, H),
        block_q=bq,
        block_k=bk,
        bwd_q=_bwd_block(bq),
        bwd_k=_bwd_block(bk),
        num_warps=check_block_size("num_warps", num_warps) if num_warps is not None else tuned_warps,
        num_stages=check_block_size("num_stages", num_stages),
        interpret=jax.default_backend() != "gpu" if interpret is None else bool(interpret),
    )
    out, lse2 = _flash(q, k, v, plan)
    return (out, lse2 * (1.0 / LOG2E)) if return_lse else out


def _bwd_block(block: int) -> int:
    return BWD_BLOCK if block > BWD_BLOCK and block % BWD_BLOCK == 0 else block


def _params(plan: _Plan, warps: int | None = None) -> dict:
    if plan.interpret:
        return {}
    from jax.experimental.pallas import triton as plgpu

    return {"compiler_params": plgpu.CompilerParams(num_warps=warps or plan.num_warps, num_stages=plan.num_stages)}


@functools.partial(jax.jit, static_argnums=3)  # calls with the same shapes and plan share one lowering
def _forward(q, k, v, plan: _Plan):
    """The forward kernel: (out, lse2) with lse2 (B, N, T) the base-2 log-sum-exp of the scaled logits."""
    B, T, S, N, K, H = attention_shape(q, k, v)
    G, bq = N // K, plan.block_q
    kernel = functools.partial(_kernel, causal=plan.causal, block_q=bq, block_k=plan.block_k, seq_kv=S,
                               scale=plan.scale)  # fmt: skip
    call = pl.pallas_call(
        kernel,
        grid=(T // bq, B, N),
        in_specs=[
            pl.BlockSpec((None, bq, None, H), lambda i, b, n: (b, i, n, 0)),  # one q tile of head n
            pl.BlockSpec((None, S, None, H), lambda i, b, n: (b, 0, n // G, 0)),  # all keys of kv head n // G
            pl.BlockSpec((None, S, None, H), lambda i, b, n: (b, 0, n // G, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, bq, None, H), lambda i, b, n: (b, i, n, 0)),
            pl.BlockSpec((None, None, bq), lambda i, b, n: (b, n, i)),  # the log-sum-exp of each row
        ],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, N, T), jnp.float32)],
        interpret=plan.interpret,
        name="our_flash_forward",
        **_params(plan),
    )
    return tuple(call(q, k, v))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _flash(q, k, v, plan):
    return _forward(q, k, v, plan)


def _flash_fwd(q, k, v, plan):
    out, lse2 = _forward(q, k, v, plan)
    return (out, lse2), (q, k, v, out, lse2)


def _flash_bwd(plan: _Plan, residuals, cotangents):
    q, k, v, out, lse2 = residuals
    d_out, d_lse2 = cotangents
    # D = rowsum(dO ∘ O); a cotangent on the log-sum-exp adds P·d_lse to dS, i.e. shifts D (base 2 -> natural).
    delta = jnp.einsum("btnh,btnh->bnt", out.astype(jnp.float32), d_out.astype(jnp.float32))
    delta = delta - LOG2E * d_lse2.astype(jnp.float32)
    return _backward(q, k, v, d_out.astype(q.dtype), lse2, delta, plan)


@functools.partial(jax.jit, static_argnums=6)  # as _forward: one lowering per shape and plan
def _backward(q, k, v, d_out, lse2, delta, plan: _Plan):
    """The two backward kernels: (dq, dk, dv)."""
    B, T, S, N, K, H = attention_shape(q, k, v)
    G, bq, bk = N // K, plan.bwd_q, plan.bwd_k
    row = pl.BlockSpec((None, None, T), lambda j, b, n: (b, n, 0))
    whole_q = pl.BlockSpec((None, T, None, H), lambda j, b, n: (b, 0, n, 0))
    kv_tile = pl.BlockSpec((None, bk, None, H), lambda j, b, n: (b, j, n // G, 0))
    dkv_dtype = q.dtype if G == 1 else jnp.float32  # per-query-head partial sums stay float32 until summed
    dkv_out = pl.BlockSpec((None, bk, None, H), lambda j, b, n: (b, j, n, 0))
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, causal=plan.causal, block_q=bq, block_k=bk, seq_q=T, scale=plan.scale),
        grid=(S // bk, B, N),
        in_specs=[whole_q, kv_tile, kv_tile, whole_q, row, row],
        out_specs=[dkv_out, dkv_out],
        out_shape=[jax.ShapeDtypeStruct((B, S, N, H), dkv_dtype)] * 2,
        interpret=plan.interpret,
        name="our_flash_backward_dkv",
        **_params(plan),
    )(q, k, v, d_out, lse2, delta)
    if G > 1:  # GQA: sum over the query heads that share each kv head
        dk = dk.reshape(B, S, K, G, H).sum(axis=3).astype(k.dtype)
        dv = dv.reshape(B, S, K, G, H).sum(axis=3).astype(v.dtype)
    q_tile = pl.BlockSpec((None, bq, None, H), lambda i, b, n: (b, i, n, 0))
    whole_kv = pl.BlockSpec((None, S, None, H), lambda i, b, n: (b, 0, n // G, 0))
    row_tile = pl.BlockSpec((None, None, bq), lambda i, b, n: (b, n, i))
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, causal=plan.causal, block_q=bq, block_k=bk, seq_kv=S, scale=plan.scale),
        grid=(T // bq, B, N),
        in_specs=[q_tile, whole_kv, whole_kv, q_tile, row_tile, row_tile],
        out_specs=q_tile,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=plan.interpret,
        name="our_flash_backward_dq",
        **_params(plan),
    )(q, k, v, d_out, lse2, delta)
    return dq, dk, dv


_flash.defvjp(_flash_fwd, _flash_bwd)


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
