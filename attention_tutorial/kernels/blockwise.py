"""FlashAttention's algorithm in pure JAX: attention one block of keys at a time, with an online softmax.

Naive attention writes the whole (T, S) weight matrix because softmax needs a row's maximum and sum before it
can normalise. The online softmax keeps, per query row, a running maximum ``m``, a running sum ``l`` and an
unnormalised output ``acc``; when a new block of scores ``s`` arrives::

    m_new = max(m, rowmax(s))
    p     = exp(s - m_new)                      # this block's weights, on the new scale
    l     = exp(m - m_new) * l + rowsum(p)      # old sum rescaled, new one added
    acc   = exp(m - m_new) * acc + p @ v_block  # same for the output
    ...   out = acc / l  after the last block

Memory is O(T) (per row: m, l, acc), never O(T·S). With ``is_causal`` a block of keys that lies wholly after a
block of queries is skipped (``lax.cond``), halving the work. The backward pass is a custom VJP that saves only
the output and the log-sum-exp per row and recomputes each block's weights (FlashAttention-2), so the gradient is
O(T) in memory too. Shapes as in :mod:`attention_tutorial.inputs`; GQA is handled by grouping query heads.

``return_lse=True`` also returns the log-sum-exp of each row's scores, lse = log Σⱼ exp(sⱼ), shape (B, N, T),
float32 (float64 for float64 inputs): what merges partial results computed over different blocks of keys (ring attention in
:mod:`attention_tutorial.kernels.context_parallel`). Its gradient is handled too (∂lse/∂sⱼ = pⱼ).

Special values, as in :func:`~attention_tutorial.kernels.reference.naive_attention`: the scale multiplies only a
score's distance to its row's running maximum (never positive), so any finite ``scale`` is exact — a huge
``|scale|`` gives the hard maximum, not an overflow — and an infinite entry in q or k counts as ±float32's maximum
(no NaN); a NaN in q, k or v propagates to the rows it touches, an infinite v gives an infinite output. The
log-sum-exp itself is scale · max + log Σ: past float32's range (~3.4e38) it is ±inf, and a ring's merges of such
rows are undefined (:mod:`~attention_tutorial.kernels.context_parallel` refuses such a scale). A row that sees no key (which
blockwise's own masks never produce: a top-left causal row always sees key 0) would give zeros and lse = −inf.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..inputs import attention_shape, check_block_size, check_flag, resolve_scale

F32 = jnp.float32
F32_MAX = float(np.finfo(np.float32).max)


def blockwise_attention(
    q,
    k,
    v,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_q: int = 512,
    block_k: int = 512,
    return_lse: bool = False,
):
    """softmax(q kᵀ·scale) v computed block by block; q (B, T, N, H), k/v (B, S, K, H) -> (B, T, N, H).

    Causal masks align top-left, as everywhere in this package. Differentiable (custom VJP, O(T) memory).
    ``return_lse=True`` returns ``(out, lse)`` with lse (B, N, T) in float32 (float64 for float64 inputs),
    differentiable as well.
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    scale = min(max(resolve_scale(scale, H), -F32_MAX), F32_MAX)  # a float32 number
    bq = min(check_block_size("block_q", block_q), T)
    bk = min(check_block_size("block_k", block_k), S)
    return_lse = check_flag("return_lse", return_lse)
    out, lse = _flash(q, k, v, check_flag("is_causal", is_causal), scale, bq, bk)
    return (out, lse) if return_lse else out


def _pad(x, axis, multiple):
    extra = -x.shape[axis] % multiple
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def _blocks(q, k, v, bq, bk):
    """Split into blocks: q -> (nq, B, bq, K, G, H); k, v -> (nk, B, bk, K, H)."""
    B, T, N, H = q.shape
    K = k.shape[2]
    qb = _pad(q, 1, bq).reshape(B, -1, bq, K, N // K, H).transpose(1, 0, 2, 3, 4, 5)
    kb = _pad(k, 1, bk).reshape(B, -1, bk, K, H).transpose(1, 0, 2, 3, 4)
    vb = _pad(v, 1, bk).reshape(B, -1, bk, K, H).transpose(1, 0, 2, 3, 4)
    return qb, kb, vb


def _allowed(i, j, bq, bk, S, causal):
    """(bq, bk) boolean: which keys of block j the queries of block i may see."""
    qpos = i * bq + jnp.arange(bq)[:, None]
    kpos = j * bk + jnp.arange(bk)[None, :]
    ok = kpos < S  # padding keys are never seen
    return ok & (kpos <= qpos) if causal else ok


def _scores(q_i, k_j, scale, acc_t):
    """Scores (B, K, G, bq, bk) in units of |scale|: sign(scale) · q·kᵀ, an infinite q or k entry clamped to ±max.
    The kernel multiplies by |scale| only differences to a row's maximum (never positive): no scale overflows."""
    s = jnp.einsum("bqkgh,bskh->bkgqs", q_i, k_j, preferred_element_type=acc_t)
    return jnp.clip(s if scale >= 0 else -s, -F32_MAX, F32_MAX)


def _exp(a, d):
    """exp(a · d) for d <= 0, and 0 where d is -inf (a key not seen), also for a = |scale| = 0."""
    return jnp.exp(jnp.where(jnp.isneginf(d), -jnp.inf, a * d))


def _acc_type(dtype):
    """float32 accumulation, or float64 for float64 inputs (JAX_ENABLE_X64)."""
    return jnp.promote_types(dtype, F32)


def _skip(i, j, bq, bk, causal):
    """True when block j of keys lies wholly after block i of queries (nothing to see under a causal mask)."""
    return jnp.logical_and(causal, j * bk > i * bq + bq - 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _flash(q, k, v, causal, scale, bq, bk):
    out, (*_, m, log_l) = _forward(q, k, v, causal, scale, bq, bk)
    return out, _lse_rows(_lse(scale, m, log_l), q.shape)


def _lse(scale, m, log_l):
    """log Σ exp(scale · scores) of each row from its maximum ``m`` (in units of |scale|) and log-sum ``log_l``."""
    return abs(scale) * m + log_l


def _lse_rows(lse, q_shape):
    """(nq, B, K, G, bq) block layout -> (B, N, T)."""
    B, T, N, _ = q_shape
    return lse.transpose(1, 2, 3, 0, 4).reshape(B, N, -1)[:, :, :T]


def _lse_blocks(lse, K, bq):
    """(B, N, T) -> (nq, B, K, G, bq), zero-padded: the inverse of :func:`_lse_rows`."""
    B, N, _ = lse.shape
    return _pad(lse, 2, bq).reshape(B, K, N // K, -1, bq).transpose(3, 0, 1, 2, 4)


def _forward(q, k, v, causal, scale, bq, bk):
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    qb, kb, vb = _blocks(q, k, v, bq, bk)
    G = N // K
    acc_t = _acc_type(q.dtype)
    a = abs(scale)

    def one_query_block(args):
        i, q_i = args  # q_i: (B, bq, K, G, H)

        def step(carry, xs):
            j, k_j, v_j = xs

            def update(carry):
                m, l, acc = carry  # (B, K, G, bq), (B, K, G, bq), (B, bq, K, G, H)
                s = jnp.where(_allowed(i, j, bq, bk, S, causal), _scores(q_i, k_j, scale, acc_t), -jnp.inf)
                m_new = jnp.maximum(m, s.max(-1))
                m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)  # a row with nothing seen yet stays at 0
                p = _exp(a, s - m_safe[..., None])  # exp(scale · q·kᵀ − the row's max so far)
                alpha = _exp(a, m - m_safe)
                l = alpha * l + p.sum(-1)
                pv = jnp.einsum("bkgqs,bskh->bqkgh", p.astype(v_j.dtype), v_j, preferred_element_type=acc_t)
                acc = alpha.transpose(0, 3, 1, 2)[..., None] * acc + pv
                return m_new, l, acc

            return lax.cond(_skip(i, j, bq, bk, causal), lambda c: c, update, carry), None

        init = (
            jnp.full((B, K, G, bq), -jnp.inf, acc_t),
            jnp.zeros((B, K, G, bq), acc_t),
            jnp.zeros((B, bq, K, G, H), acc_t),
        )
        (m, l, acc), _ = lax.scan(step, init, (jnp.arange(kb.shape[0]), kb, vb))
        l_t = l.transpose(0, 3, 1, 2)[..., None]
        empty = l_t == 0  # a row that saw no key: zeros (a NaN row keeps l = NaN and stays NaN)
        out = jnp.where(empty, 0.0, acc / jnp.where(empty, 1.0, l_t))
        log_l = jnp.where(l == 0, -jnp.inf, jnp.log(jnp.where(l == 0, 1.0, l)))
        return out, (m, log_l)

    out, (m, log_l) = lax.map(one_query_block, (jnp.arange(qb.shape[0]), qb))  # one query block at a time: O(T)
    out = out.transpose(1, 0, 2, 3, 4, 5).reshape(B, -1, N, H)[:, :T].astype(q.dtype)
    return out, (q, k, v, out, m, log_l)


def _flash_fwd(q, k, v, causal, scale, bq, bk):
    out, res = _forward(q, k, v, causal, scale, bq, bk)
    return (out, _lse_rows(_lse(scale, *res[-2:]), q.shape)), res


def _flash_bwd(causal, scale, bq, bk, residuals, cotangents):
    q, k, v = residuals[:3]
    dq, dk, dv = _backward(causal, scale, bq, bk, residuals, cotangents)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def blockwise_backward(
    q,
    k,
    v,
    out,
    lse,
    d_out,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_q: int = 512,
    block_k: int = 512,
):
    """(dq, dk, dv) of attention given its output ``out`` and row log-sum-exp ``lse`` (B, N, T), in float32.

    ``out`` and ``lse`` may belong to a larger set of keys than ``k``, ``v`` (a ring's merged result): the
    gradients are then these keys' contributions — dq summed over the blocks gives the whole dq.
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    scale = min(max(resolve_scale(scale, H), -F32_MAX), F32_MAX)  # a float32 number
    bq = min(check_block_size("block_q", block_q), T)
    bk = min(check_block_size("block_k", block_k), S)
    for name, x, want in (("out", out, q.shape), ("d_out", d_out, q.shape), ("lse", lse, (B, N, T))):
        if not isinstance(x, (np.ndarray, jax.Array)) or x.shape != want:
            got = x.shape if isinstance(x, (np.ndarray, jax.Array)) else type(x).__name__
            raise ValueError(f"{name} must be an array of shape {want} (q's (B, T, N, H), lse (B, N, T)); got {got}.")
    acc_t = _acc_type(q.dtype)
    lse = _lse_blocks(jnp.asarray(lse, acc_t), K, bq)
    res = (q, k, v, out, jnp.zeros_like(lse), lse)  # the row maximum folded into the log-sum: m = 0, log l = lse
    return _backward(check_flag("is_causal", is_causal), scale, bq, bk, res, (d_out, jnp.zeros((B, N, T), acc_t)))


def _backward(causal, scale, bq, bk, residuals, cotangents):
    q, k, v, out, m, log_l = residuals  # per row, (nq, B, K, G, bq): its max score (units of |scale|), log-sum
    d_out, d_lse = cotangents
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    G = N // K
    qb, kb, vb = _blocks(q, k, v, bq, bk)
    dob = _blocks(d_out, k, v, bq, bk)[0]
    acc_t = _acc_type(q.dtype)
    # D = rowsum(dO * O), the softmax-gradient term per query row: (nq, B, K, G, bq). The lse's own cotangent
    # enters as dS += P * dlse (∂lse/∂s = P), i.e. D -= dlse.
    delta = jnp.sum(d_out.astype(acc_t) * out.astype(acc_t), axis=-1)
    delta = _pad(delta, 1, bq).reshape(B, -1, bq, K, G).transpose(1, 0, 3, 4, 2)
    delta = delta - _lse_blocks(jnp.asarray(d_lse, acc_t), K, bq)
    m = jnp.where(jnp.isneginf(m), 0.0, m)
    log_l = jnp.where(jnp.isneginf(log_l), jnp.inf, log_l)  # a row that saw nothing: every weight exp(... - inf) = 0
    nq = qb.shape[0]
    a = abs(scale)

    def one_key_block(dq, xs):
        j, k_j, v_j = xs

        def step(carry, ys):
            i, q_i, do_i, m_i, log_l_i, d_i = ys

            def grads(carry):
                dk, dv = carry
                raw = jnp.einsum("bqkgh,bskh->bkgqs", q_i, k_j, preferred_element_type=acc_t)
                s = jnp.clip(raw if scale >= 0 else -raw, -F32_MAX, F32_MAX)  # as the forward: units of |scale|
                p = a * (s - m_i[..., None]) - log_l_i[..., None]  # the weights, exp(scale · q·kᵀ - lse)
                p = jnp.where(_allowed(i, j, bq, bk, S, causal), jnp.exp(p), 0.0)
                # 1. dV += Pᵀ dO
                dv = dv + jnp.einsum("bkgqs,bqkgh->bskh", p.astype(do_i.dtype), do_i, preferred_element_type=acc_t)
                # 2. dP = dO Vᵀ
                dp = jnp.einsum("bqkgh,bskh->bkgqs", do_i, v_j, preferred_element_type=acc_t)
                # 3. dS = P ∘ (dP − D)
                ds = p * (dp - d_i[..., None])
                ds = jnp.where(jnp.abs(raw) > F32_MAX, 0.0, ds).astype(q_i.dtype)  # the clamp passes no gradient
                # 4. dK += dSᵀ Q · scale, dQ = dS K · scale
                dk = dk + jnp.einsum("bkgqs,bqkgh->bskh", ds, q_i, preferred_element_type=acc_t) * scale
                dq_i = jnp.einsum("bkgqs,bskh->bqkgh", ds, k_j, preferred_element_type=acc_t) * scale
                return (dk, dv), dq_i

            def skip(carry):
                return carry, jnp.zeros(q_i.shape, acc_t)

            return lax.cond(_skip(i, j, bq, bk, causal), skip, grads, carry)

        init = (jnp.zeros(k_j.shape, acc_t), jnp.zeros(v_j.shape, acc_t))
        (dk_j, dv_j), dq_parts = lax.scan(step, init, (jnp.arange(nq), qb, dob, m, log_l, delta))
        return dq + dq_parts, (dk_j, dv_j)

    dq0 = jnp.zeros(qb.shape, acc_t)
    dq, (dk, dv) = lax.scan(one_key_block, dq0, (jnp.arange(kb.shape[0]), kb, vb))
    dq = dq.transpose(1, 0, 2, 3, 4, 5).reshape(B, -1, N, H)[:, :T]
    dk = dk.transpose(1, 0, 2, 3, 4).reshape(B, -1, K, H)[:, :S]
    dv = dv.transpose(1, 0, 2, 3, 4).reshape(B, -1, K, H)[:, :S]
    return dq, dk, dv


_flash.defvjp(_flash_fwd, _flash_bwd)
