"""Attention from scratch: the naive JAX version the pages teach, and a float64 NumPy reference for tests.

Shapes follow :mod:`attention_tutorial.inputs`: q (B, T, N, H), k and v (B, S, K, H), out (B, T, N, H).

Mask conventions (the same as ``jax.nn.dot_product_attention``; accepted shapes and the worked T != S
example in :mod:`attention_tutorial.kernels.masks`):

* ``is_causal``: query i sees keys j <= i, aligned **top-left** (query 0 with key 0) also when T != S.
  ``causal_alignment="bottom_right"`` aligns the last query with the last key instead (j <= i + S - T): what
  decoding against a cache and chunked prefill need.
* ``mask``: boolean, (T, S) or (B|1, N|1, T|1, S|1); True means "may attend". ``bias``: real, the same shapes.
* ``local_window_size=(left, right)``: query i sees keys i - left <= j <= i + right; an int w means (w, w).
* ``query_seq_lengths`` / ``key_value_seq_lengths``: (B,) ints, padding: positions at or past the length are masked.

Every bad value raises ``ValueError`` naming the fix (:func:`~attention_tutorial.kernels.masks.check_mask_args`).

Rows with nothing to see (every key masked): the output is **zeros** here and in the float64 reference, never
NaN. JAX's XLA path (:mod:`attention_tutorial.kernels.fused`) instead gives the mean of v over all S keys for a row emptied by ``mask``,
``is_causal``, a window or ``key_value_seq_lengths``, and zeros for a row at or past ``query_seq_lengths``.
Any finite ``scale`` is computed exactly: the scale multiplies each score's distance to its row's best, which is
never positive, so ``scale · q·kᵀ`` beyond float32's range (~3.4e38) neither overflows nor ties at a clamp: a huge
``|scale|`` gives the hard maximum, as in float64. An infinite entry in q or k counts as ±float32's maximum (no
NaN); -inf in ``bias`` hides a key like False in ``mask`` (a row whose keys are all hidden so is a row with nothing
to see).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..inputs import attention_shape, resolve_scale
from .masks import Alignment, check_mask_args

F32_MAX = float(np.finfo(np.float32).max)


def naive_attention(
    q,
    k,
    v,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    causal_alignment: Alignment = "top_left",
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
    B, T, S, N, K, H = shape = attention_shape(q, k, v)
    scale = resolve_scale(scale, H)
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
    arrays = {n: opt[n] for n in _ARRAYS}  # traced arguments; the rest shapes the program
    static = {n: opt[n] for n in opt if n not in _ARRAYS}
    return _naive(q, k, v, arrays, scale=scale, **static)


_ARRAYS = ("mask", "bias", "query_seq_lengths", "key_value_seq_lengths")


# One compiled program per shape and set of options: called outside jit, the four steps run as one program
# rather than op by op (on a GPU each op alone is a compilation of its own).
@functools.partial(jax.jit, static_argnames=("scale", "is_causal", "causal_alignment", "local_window_size"))
def _naive(q, k, v, arrays, *, scale, is_causal, causal_alignment, local_window_size):
    B, T, S, N, K, H = attention_shape(q, k, v)
    opt = {
        **arrays,
        "is_causal": is_causal,
        "causal_alignment": causal_alignment,
        "local_window_size": local_window_size,
    }
    qg = q.reshape(B, T, K, N // K, H)  # group the query heads by the kv head they share

    # 1. scores: every query against every key -> (B, N, T, S), float32 accumulation, then scaled
    raw = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=jnp.float32).reshape(B, N, T, S)
    raw = jnp.clip(raw, -F32_MAX, F32_MAX)  # an infinite entry in q or k: ±max, not inf - inf = NaN below
    allowed = _allowed(T, S, opt)
    scores = _scaled(raw, scale, allowed)  # scale · raw less a constant per row: the softmax stays the same
    if opt["bias"] is not None:  # -inf in the bias hides a key, as False in the mask does
        scores = jnp.minimum(scores + jnp.asarray(opt["bias"], jnp.float32), F32_MAX)
    # 2. mask: positions a query may not see get a score of -inf (weight exactly 0)
    if allowed is not None:
        scores = jnp.where(allowed, scores, -jnp.inf)
    # 3. softmax over the keys, written out: the (B, N, T, S) weight matrix, O(T·S) memory
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    row_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))  # -inf: the row sees nothing
    e = jnp.exp(scores - row_max)
    total = jnp.sum(e, axis=-1, keepdims=True)
    weights = e / jnp.where(total > 0, total, 1.0)  # rows with nothing to see: all weights 0, output zeros
    # 4. weighted sum of the values -> (B, T, N, H)
    weights = weights.astype(v.dtype).reshape(B, K, N // K, T, S)
    out = jnp.einsum("bkgts,bskh->btkgh", weights, v, preferred_element_type=jnp.float32)
    return out.reshape(B, T, N, H).astype(q.dtype)


def _scaled(raw, scale: float, allowed):
    """scale · (raw − best) per row, where best is the raw score among the keys a row may see that the scale makes
    largest: every result is <= 0, so a huge |scale| cannot overflow float32 (scale · raw itself would, to ±inf, and
    ties at the clamp would hide the true maximum). Softmax ignores a constant per row: the weights are unchanged."""
    if scale == 0:
        return 0.0 * raw  # zeros (a NaN stays NaN)
    pick, fill = (jnp.max, -jnp.inf) if scale > 0 else (jnp.min, jnp.inf)
    best = pick(raw if allowed is None else jnp.where(allowed, raw, fill), axis=-1, keepdims=True)
    best = jax.lax.stop_gradient(jnp.where(jnp.isfinite(best), best, 0.0))  # a row that sees nothing: no shift
    return jnp.float32(min(max(scale, -F32_MAX), F32_MAX)) * (raw - best)


def _allowed(T, S, opt):
    """The boolean (B|1, N|1, T, S) 'may attend' matrix, or None when nothing is masked."""
    i = jnp.arange(T)[:, None]  # query positions
    j = jnp.arange(S)[None, :]  # key positions
    allowed = None

    def both(a, b):
        return b if a is None else jnp.logical_and(a, b)

    if opt["mask"] is not None:
        allowed = both(allowed, jnp.asarray(opt["mask"], bool))
    if opt["is_causal"]:
        shift = S - T if opt["causal_alignment"] == "bottom_right" else 0  # bottom-right: last query meets last key
        allowed = both(allowed, j <= i + shift)
    if opt["local_window_size"] is not None:
        left, right = opt["local_window_size"]
        allowed = both(allowed, (j >= i - left) & (j <= i + right))
    if opt["query_seq_lengths"] is not None:
        allowed = both(allowed, (i[None] < jnp.asarray(opt["query_seq_lengths"])[:, None, None])[:, None])
    if opt["key_value_seq_lengths"] is not None:
        allowed = both(allowed, (j[None] < jnp.asarray(opt["key_value_seq_lengths"])[:, None, None])[:, None])
    return allowed


def reference_attention(
    q,
    k,
    v,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    causal_alignment: Alignment = "top_left",
    mask=None,
    bias=None,
    local_window_size: int | tuple[int, int] | None = None,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
) -> np.ndarray:
    """The same function in float64 NumPy, written independently with loops over heads: the tests' ground truth."""
    B, T, S, N, K, H = shape = attention_shape(q, k, v)
    scale = resolve_scale(scale, H)
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
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    ok = np.ones((B, N, T, S), bool)
    if opt["mask"] is not None:
        ok &= np.broadcast_to(np.asarray(opt["mask"], bool), ok.shape)
    rows, cols = np.meshgrid(np.arange(T), np.arange(S), indexing="ij")
    if is_causal:
        ok &= cols - rows <= (S - T if causal_alignment == "bottom_right" else 0)
    if opt["local_window_size"] is not None:
        left, right = opt["local_window_size"]
        ok &= (cols >= rows - left) & (cols <= rows + right)
    for b in range(B):
        if opt["query_seq_lengths"] is not None:
            ok[b, :, int(opt["query_seq_lengths"][b]) :, :] = False
        if opt["key_value_seq_lengths"] is not None:
            ok[b, :, :, int(opt["key_value_seq_lengths"][b]) :] = False
    bias = None if opt["bias"] is None else np.broadcast_to(np.asarray(opt["bias"], np.float64), ok.shape)
    big = np.finfo(np.float64).max
    out = np.zeros((B, T, N, H))
    for b in range(B):
        for n in range(N):
            kv_head = n // (N // K)
            with np.errstate(over="ignore"):  # overflows go to ±inf, clipped; -big - big = -inf: weight exactly 0
                s = np.clip(q[b, :, n] @ k[b, :, kv_head].T * scale, -big, big)
                if bias is not None:
                    s = np.minimum(s + bias[b, n], big)
                s = np.where(ok[b, n], s, -np.inf)
                m = s.max(axis=-1, keepdims=True)
                e = np.where(ok[b, n], np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
            den = e.sum(axis=-1, keepdims=True)
            p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
            p = np.where(np.isnan(den), np.nan, p)  # a NaN in q, k or the bias stays NaN (not a row of zeros)
            out[b, :, n] = p @ v[b, :, kv_head]
    return out
