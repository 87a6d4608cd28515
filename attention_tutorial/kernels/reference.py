"""Attention from scratch: the naive JAX version the pages teach, and a float64 NumPy reference for tests.

Shapes follow :mod:`attention_tutorial.inputs`: q (B, T, N, H), k and v (B, S, K, H), out (B, T, N, H).

Mask conventions (the same as ``jax.nn.dot_product_attention``):

* ``is_causal``: query i sees keys j <= i, aligned **top-left** (query 0 with key 0) also when T != S.
  For decoding one new token against a cache (T=1), do not pass ``is_causal``: top-left alignment would
  let it see key 0 only. Use ``key_value_seq_lengths`` for the cache's valid length instead.
* ``mask``: boolean, broadcastable to (B, N, T, S); True means "may attend".
* ``local_window_size=(left, right)``: query i sees keys i - left <= j <= i + right; an int w means (w, w).
* ``query_seq_lengths`` / ``key_value_seq_lengths``: (B,) int, padding: positions at or past the length are masked.
* A query row that may attend to no key at all gets an output of **zeros** here (never NaN). JAX's XLA path
  gives the mean of v for a row emptied by ``mask`` and zeros for a row past ``query_seq_lengths``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ..inputs import attention_shape


def naive_attention(
    q,
    k,
    v,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    mask=None,
    bias=None,
    local_window_size: int | tuple[int, int] | None = None,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
) -> jax.Array:
    """Scaled dot-product attention in four explicit steps; materializes the (B, N, T, S) weights.

    softmax(q kᵀ · scale + bias, masked) v, with ``scale`` defaulting to 1/sqrt(H). Scores and the softmax
    are computed in float32 and the output has q's dtype. GQA: each kv head serves N // K query heads.
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    scale = 1.0 / math.sqrt(H) if scale is None else scale
    qg = q.reshape(B, T, K, N // K, H)  # group the query heads by the kv head they share

    # 1. scores: every query against every key -> (B, K, G, T, S), float32 accumulation
    scores = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    scores = scores.reshape(B, N, T, S)
    if bias is not None:
        scores = scores + jnp.asarray(bias, jnp.float32)
    # 2. mask: positions a query may not see get a large negative score
    allowed = _allowed(B, T, S, is_causal, mask, local_window_size, query_seq_lengths, key_value_seq_lengths)
    if allowed is not None:
        scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
    # 3. softmax over the keys: the (B, N, T, S) weight matrix, O(T·S) memory
    weights = jax.nn.softmax(scores, axis=-1)
    if allowed is not None:  # rows with no allowed key: zeros, not a uniform average
        weights = jnp.where(jnp.any(allowed, axis=-1, keepdims=True), weights, 0.0)
    # 4. weighted sum of the values -> (B, T, N, H)
    weights = weights.astype(v.dtype).reshape(B, K, N // K, T, S)
    out = jnp.einsum("bkgts,bskh->btkgh", weights, v, preferred_element_type=jnp.float32)
    return out.reshape(B, T, N, H).astype(q.dtype)


def _allowed(B, T, S, is_causal, mask, window, q_lens, kv_lens):
    """The boolean (B|1, N|1, T, S) 'may attend' matrix, or None when nothing is masked."""
    i = jnp.arange(T)[:, None]  # query positions
    j = jnp.arange(S)[None, :]  # key positions
    allowed = None

    def both(a, b):
        return b if a is None else jnp.logical_and(a, b)

    if mask is not None:
        allowed = both(allowed, jnp.asarray(mask, bool))
    if is_causal:
        allowed = both(allowed, j <= i)
    if window is not None:
        left, right = (window, window) if isinstance(window, int) else window
        allowed = both(allowed, (j >= i - left) & (j <= i + right))
    if q_lens is not None:
        allowed = both(allowed, (i[None] < jnp.asarray(q_lens)[:, None, None])[:, None])
    if kv_lens is not None:
        allowed = both(allowed, (j[None] < jnp.asarray(kv_lens)[:, None, None])[:, None])
    return allowed


def reference_attention(
    q,
    k,
    v,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    mask=None,
    bias=None,
    local_window_size: int | tuple[int, int] | None = None,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
) -> np.ndarray:
    """The same function in float64 NumPy, written independently with loops over heads: the tests' ground truth."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(H) if scale is None else scale
    ok = np.ones((B, N, T, S), bool)
    if mask is not None:
        ok &= np.broadcast_to(np.asarray(mask, bool), ok.shape)
    rows, cols = np.meshgrid(np.arange(T), np.arange(S), indexing="ij")
    if is_causal:
        ok &= cols <= rows
    if local_window_size is not None:
        w = local_window_size
        left, right = (w, w) if isinstance(w, int) else w
        ok &= (cols >= rows - left) & (cols <= rows + right)
    for b in range(B):
        if query_seq_lengths is not None:
            ok[b, :, int(query_seq_lengths[b]) :, :] = False
        if key_value_seq_lengths is not None:
            ok[b, :, :, int(key_value_seq_lengths[b]) :] = False
    bias = None if bias is None else np.broadcast_to(np.asarray(bias, np.float64), ok.shape)
    out = np.zeros((B, T, N, H))
    for b in range(B):
        for n in range(N):
            kv_head = n // (N // K)
            s = q[b, :, n] @ k[b, :, kv_head].T * scale
            if bias is not None:
                s = s + bias[b, n]
            s = np.where(ok[b, n], s, -np.inf)
            m = s.max(axis=-1, keepdims=True)
            e = np.where(ok[b, n], np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
            den = e.sum(axis=-1, keepdims=True)
            p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
            out[b, :, n] = p @ v[b, :, kv_head]
    return out
