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
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from ..inputs import attention_shape

F32 = jnp.float32


def blockwise_attention(q, k, v, *, is_causal: bool = False, scale: float | None = None,
                        block_q: int = 512, block_k: int = 512) -> jax.Array:  # fmt: skip
    """softmax(q kᵀ·scale) v computed block by block; q (B, T, N, H), k/v (B, S, K, H) -> (B, T, N, H).

    Causal masks align top-left, as everywhere in this package. Differentiable (custom VJP, O(T) memory).
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    scale = 1.0 / math.sqrt(H) if scale is None else float(scale)
    bq, bk = min(block_q, T), min(block_k, S)
    if bq < 1 or bk < 1:
        raise ValueError(f"block sizes must be >= 1; got block_q={block_q}, block_k={block_k}.")
    return _flash(q, k, v, is_causal, scale, bq, bk)


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


def _skip(i, j, bq, bk, causal):
    """True when block j of keys lies wholly after block i of queries (nothing to see under a causal mask)."""
    return jnp.logical_and(causal, j * bk > i * bq + bq - 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _flash(q, k, v, causal, scale, bq, bk):
    return _forward(q, k, v, causal, scale, bq, bk)[0]


def _forward(q, k, v, causal, scale, bq, bk):
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    qb, kb, vb = _blocks(q, k, v, bq, bk)
    G = N // K

    def one_query_block(args):
        i, q_i = args  # q_i: (B, bq, K, G, H)

        def step(carry, xs):
            j, k_j, v_j = xs

            def update(carry):
                m, l, acc = carry  # (B, K, G, bq), (B, K, G, bq), (B, bq, K, G, H)
                s = jnp.einsum("bqkgh,bskh->bkgqs", q_i, k_j, preferred_element_type=F32) * scale
                s = jnp.where(_allowed(i, j, bq, bk, S, causal), s, -jnp.inf)
                m_new = jnp.maximum(m, s.max(-1))
                m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)  # a row with nothing seen yet stays at 0
                p = jnp.exp(s - m_safe[..., None])
                alpha = jnp.exp(m - m_safe)
                l = alpha * l + p.sum(-1)
                pv = jnp.einsum("bkgqs,bskh->bqkgh", p.astype(v_j.dtype), v_j, preferred_element_type=F32)
                acc = alpha.transpose(0, 3, 1, 2)[..., None] * acc + pv
                return m_new, l, acc

            return lax.cond(_skip(i, j, bq, bk, causal), lambda c: c, update, carry), None

        init = (jnp.full((B, K, G, bq), -jnp.inf, F32), jnp.zeros((B, K, G, bq), F32), jnp.zeros((B, bq, K, G, H), F32))
        (m, l, acc), _ = lax.scan(step, init, (jnp.arange(kb.shape[0]), kb, vb))
        l_t = l.transpose(0, 3, 1, 2)[..., None]
        out = jnp.where(l_t > 0, acc / jnp.where(l_t > 0, l_t, 1.0), 0.0)  # rows that see nothing: zeros
        lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), jnp.inf)  # +inf makes their weights 0
        return out, lse

    out, lse = lax.map(one_query_block, (jnp.arange(qb.shape[0]), qb))  # one query block at a time: O(T) memory
    out = out.transpose(1, 0, 2, 3, 4, 5).reshape(B, -1, N, H)[:, :T].astype(q.dtype)
    return out, (q, k, v, out, lse)


def _flash_fwd(q, k, v, causal, scale, bq, bk):
    return _forward(q, k, v, causal, scale, bq, bk)


def _flash_bwd(causal, scale, bq, bk, residuals, d_out):
    q, k, v, out, lse = residuals  # lse: (nq, B, K, G, bq)
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    G = N // K
    qb, kb, vb = _blocks(q, k, v, bq, bk)
    dob = _blocks(d_out, k, v, bq, bk)[0]
    # D = rowsum(dO * O), the softmax-gradient term per query row: (nq, B, K, G, bq)
    delta = jnp.sum(d_out.astype(F32) * out.astype(F32), axis=-1)
    delta = _pad(delta, 1, bq).reshape(B, -1, bq, K, G).transpose(1, 0, 3, 4, 2)
    nq = qb.shape[0]

    def one_key_block(dq, xs):
        j, k_j, v_j = xs

        def step(carry, ys):
            i, q_i, do_i, lse_i, d_i = ys

            def grads(carry):
                dk, dv = carry
                s = jnp.einsum("bqkgh,bskh->bkgqs", q_i, k_j, preferred_element_type=F32) * scale
                p = jnp.where(_allowed(i, j, bq, bk, S, causal), jnp.exp(s - lse_i[..., None]), 0.0)
                dv = dv + jnp.einsum("bkgqs,bqkgh->bskh", p.astype(do_i.dtype), do_i, preferred_element_type=F32)
                dp = jnp.einsum("bqkgh,bskh->bkgqs", do_i, v_j, preferred_element_type=F32)
                ds = (p * (dp - d_i[..., None])).astype(q_i.dtype)
                dk = dk + jnp.einsum("bkgqs,bqkgh->bskh", ds, q_i, preferred_element_type=F32) * scale
                dq_i = jnp.einsum("bkgqs,bskh->bqkgh", ds, k_j, preferred_element_type=F32) * scale
                return (dk, dv), dq_i

            def skip(carry):
                return carry, jnp.zeros(q_i.shape, F32)

            return lax.cond(_skip(i, j, bq, bk, causal), skip, grads, carry)

        init = (jnp.zeros(k_j.shape, F32), jnp.zeros(v_j.shape, F32))
        (dk_j, dv_j), dq_parts = lax.scan(step, init, (jnp.arange(nq), qb, dob, lse, delta))
        return dq + dq_parts, (dk_j, dv_j)

    dq0 = jnp.zeros(qb.shape, F32)
    dq, (dk, dv) = lax.scan(one_key_block, dq0, (jnp.arange(kb.shape[0]), kb, vb))
    dq = dq.transpose(1, 0, 2, 3, 4, 5).reshape(B, -1, N, H)[:, :T]
    dk = dk.transpose(1, 0, 2, 3, 4).reshape(B, -1, K, H)[:, :S]
    dv = dv.transpose(1, 0, 2, 3, 4).reshape(B, -1, K, H)[:, :S]
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


_flash.defvjp(_flash_fwd, _flash_bwd)
