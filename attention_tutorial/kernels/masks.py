"""The masks real models use, expressed through ``jax.nn.dot_product_attention``'s own arguments.

=============  ===========================================================  ==============================
kind           what it means                                                argument
=============  ===========================================================  ==============================
``none``       every query sees every key (or the causal triangle)          ``is_causal``
``padding``    batch rows of different lengths; pad positions are ignored   ``query_seq_lengths``,
                                                                            ``key_value_seq_lengths``
``window``     sliding-window / local attention: the last ``w`` keys only   ``local_window_size=(w, 0|w)``
``dense``      an explicit boolean (B|1, 1, T, S) matrix (here: causal)     ``mask``
``bias``       an additive (1, N, T, S) bias (here: ALiBi's linear slopes)  ``bias``
=============  ===========================================================  ==============================

``mask_args`` builds the arrays for a problem; every kind is checked against the naive reference in the tests.

Causal alignment when T != S. ``is_causal`` (JAX, this package's default, ``"top_left"``) lets query i see keys
j <= i: query 0 lines up with key 0. Decoding and chunked prefill need ``"bottom_right"`` (FlashAttention >= 2.1,
PyTorch's ``causal_lower_right``): the last query lines up with the last key, so query i sees keys j <= i + S - T.
``jax.nn.dot_product_attention`` has no flag for it; ``causal_args`` gives the arguments that express it (an
explicit mask), and ``causal_mask`` the (T, S) matrix itself. Example, T=2 queries against S=4 keys::

    top_left      bottom_right
    1 0 0 0       1 1 1 0
    1 1 0 0       1 1 1 1

With T > S and ``"bottom_right"`` the first T - S queries see no key at all (see "rows with nothing to see" in
:mod:`attention_tutorial.kernels.reference`). ``local_window_size`` is always measured from j == i, as in JAX.

Accepted shapes (``check_mask_args`` enforces them for every implementation here):

* ``mask``: boolean, (T, S) or (B|1, N|1, T|1, S|1). A rank-3 mask is refused: (B, T, S) and (N, T, S) look alike,
  and JAX would silently read the first axis as heads; write ``mask[:, None]`` (per batch row) or ``mask[None]``
  (per head). Additive masks (0 / -inf) belong in ``bias``.
* ``bias``: real numbers, the same shapes as ``mask``.
* ``query_seq_lengths`` / ``key_value_seq_lengths``: (B,) integers in [0, T] / [0, S] (lists accepted). Lengths
  traced under ``jit`` have no values to check when the function is traced: they are checked when the call runs
  under ``jax.experimental.checkify.checkify`` (``err.throw()`` names the argument and the range), and otherwise
  clamped to [0, T] / [0, S] (a length past the end means all positions, a negative one none).
* ``local_window_size``: an int w >= 0 or a pair (left, right) of ints >= 0 (NumPy integers accepted). It shapes
  the computation, so it must be a Python value: under ``jit`` pass it as a static argument or close over it.
"""

from __future__ import annotations

import numbers
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from ..inputs import AttentionShape

Alignment = Literal["top_left", "bottom_right"]
ALIGNMENTS = ("top_left", "bottom_right")

MASK_KINDS = ("none", "padding", "window", "dense", "bias")
WINDOW = 256


def mask_args(
    kind: str, shape: AttentionShape, dtype, *, causal: bool = False, window: int = WINDOW, seed: int = 0
) -> dict:
    """The keyword arguments (arrays and static values) that express mask ``kind`` for ``shape``."""
    if not (isinstance(shape, tuple) and len(shape) == 6 and all(_is_int(n) and n > 0 for n in shape)):
        raise ValueError(f"shape must be an AttentionShape(B, T, S, N, K, H) of positive ints; got {shape!r:.80}.")
    shape = AttentionShape(*(int(n) for n in shape))
    window, seed = _count("window", window, 0), _count("seed", seed, 0)
    B, T, S, N = shape.batch, shape.seq_q, shape.seq_kv, shape.heads
    if kind == "none":
        return {}
    if kind == "padding":  # lengths between half and all of the sequence, the first row full
        rng = np.random.default_rng(seed)
        kv = rng.integers(max(1, S // 2), S + 1, size=B)
        kv[0] = S
        q = np.minimum(kv, T) if T == S else np.full(B, T)
        return {"query_seq_lengths": jnp.asarray(q, jnp.int32), "key_value_seq_lengths": jnp.asarray(kv, jnp.int32)}
    if kind == "window":
        return {"local_window_size": (window, 0 if causal else window)}
    # built on the host (NumPy) and moved to the device once: no device op to compile
    if kind == "dense":  # the causal triangle as an explicit matrix: same math as is_causal=True, other kernel
        return {"mask": jnp.asarray(np.tril(np.ones((T, S), bool))[None, None])}
    if kind == "bias":  # ALiBi: head n adds -slope_n * (distance between query and key)
        slopes = 2.0 ** (-8.0 * np.arange(1, N + 1, dtype=np.float32) / np.float32(N))
        dist = np.abs(np.arange(T)[:, None] - np.arange(S)[None, :]).astype(np.float32)
        return {"bias": jnp.asarray((-slopes[:, None, None] * dist[None]).astype(jnp.dtype(dtype))[None])}
    raise ValueError(f"unknown mask kind {kind!r}; choose from {MASK_KINDS}.")


def split_static(kwargs: dict) -> tuple[dict, dict]:
    """(array arguments, static arguments): arrays go into a jitted function as inputs, not as constants."""
    arrays = {k: v for k, v in kwargs.items() if isinstance(v, jax.Array)}
    return arrays, {k: v for k, v in kwargs.items() if k not in arrays}


def causal_mask(seq_q: int, seq_kv: int, *, alignment: Alignment = "top_left") -> np.ndarray:
    """The (T, S) causal 'may attend' matrix: j <= i (top_left) or j <= i + S - T (bottom_right)."""
    _check_alignment(alignment)
    seq_q, seq_kv = _count("seq_q", seq_q, 1), _count("seq_kv", seq_kv, 1)
    return np.tril(np.ones((seq_q, seq_kv), bool), k=0 if alignment == "top_left" else seq_kv - seq_q)


def causal_args(seq_q: int, seq_kv: int, *, alignment: Alignment = "top_left") -> dict:
    """``jax.nn.dot_product_attention`` keywords for a causal mask of either alignment.

    top_left (or T == S, where both agree): ``is_causal=True``. bottom_right: an explicit (1, 1, T, S) ``mask``;
    AND it with any mask of your own.
    """
    if _check_alignment(alignment) == "top_left" or seq_q == seq_kv:
        return {"is_causal": True}
    return {"mask": jnp.asarray(causal_mask(seq_q, seq_kv, alignment=alignment))[None, None]}


def _check_alignment(alignment) -> str:
    if alignment not in ALIGNMENTS:
        raise ValueError(f"causal_alignment must be one of {ALIGNMENTS}; got {alignment!r:.60}.")
    return alignment


def check_mask_args(
    shape: AttentionShape,
    *,
    is_causal=False,
    causal_alignment="top_left",
    mask=None,
    bias=None,
    local_window_size=None,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
) -> dict:
    """Validate the masking keywords for ``shape``; return them normalised, or raise ``ValueError`` naming the fix.

    Normalised: ``mask``/``bias`` rank 4 (B|1, N|1, T|1, S|1); the window a pair of ints; lengths int32 arrays
    (NumPy when concrete, so the float64 reference stays NumPy). Lengths are range-checked unless traced.
    """
    if not isinstance(is_causal, (bool, np.bool_)):
        raise ValueError(f"is_causal must be True or False; got {type(is_causal).__name__} {is_causal!r:.60}.")
    if _check_alignment(causal_alignment) != "top_left" and not is_causal:
        raise ValueError(f"causal_alignment={causal_alignment!r} only applies to a causal mask; pass is_causal=True.")
    B, T, S, N = shape.batch, shape.seq_q, shape.seq_kv, shape.heads
    return {
        "is_causal": bool(is_causal),
        "causal_alignment": causal_alignment,
        "mask": _mask_or_bias("mask", mask, (B, N, T, S)),
        "bias": _mask_or_bias("bias", bias, (B, N, T, S)),
        "local_window_size": _window(local_window_size),
        "query_seq_lengths": _lengths("query_seq_lengths", query_seq_lengths, B, T, "T"),
        "key_value_seq_lengths": _lengths("key_value_seq_lengths", key_value_seq_lengths, B, S, "S"),
    }


def _count(name: str, x, minimum: int) -> int:
    if not _is_int(x) or x < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {type(x).__name__} {x!r:.60}.")
    return int(x)


def _is_int(x) -> bool:
    return isinstance(x, (numbers.Integral, np.integer)) and not isinstance(x, (bool, np.bool_))


def _window(w):
    if w is None:
        return None
    pair = (w, w) if _is_int(w) else w
    fix = "pass an int w >= 0 (w keys each side) or a pair (left, right) of ints >= 0, e.g. (128, 0)"
    if any(isinstance(x, jax.core.Tracer) for x in (pair if isinstance(pair, (tuple, list)) else [pair])):
        raise ValueError(
            "local_window_size must be a Python int or pair of ints, not a traced value: under jax.jit pass it as a "
            "static argument (static_argnames=('local_window_size',)) or close over it; it shapes the computation."
        )
    if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(_is_int(x) for x in pair):
        raise ValueError(f"local_window_size must be integers; got {type(w).__name__} {w!r:.60}; {fix}.")
    if min(pair) < 0:
        raise ValueError(f"local_window_size must not be negative; got {tuple(int(x) for x in pair)}; {fix}.")
    return int(pair[0]), int(pair[1])


def _mask_or_bias(name, x, full):
    if x is None:
        return None
    what = "boolean" if name == "mask" else "real-valued"
    if not isinstance(x, (np.ndarray, jax.Array)):
        raise ValueError(f"{name} must be a {what} array; got {type(x).__name__}. Convert it with jnp.asarray({name}).")
    dt = x.dtype
    if name == "mask" and dt != np.bool_:
        raise ValueError(
            f"mask must be boolean (True = may attend); got dtype {dt}. Use mask.astype(bool) for 0/1 values; "
            "an additive mask (0 / -inf) belongs in bias=."
        )
    if name == "bias" and not (jnp.issubdtype(dt, jnp.floating) or jnp.issubdtype(dt, jnp.integer)):
        raise ValueError(
            f"bias must hold real numbers; got dtype {dt}. A boolean belongs in mask=; else cast to float."
        )
    legend = f"(B|1, N|1, T|1, S|1) = ({full[0]}|1, {full[1]}|1, {full[2]}|1, {full[3]}|1)"
    if x.ndim == 3 and x.shape[0] not in (1, full[0], full[1]):
        raise ValueError(
            f"{name} {x.shape}: its first axis {x.shape[0]} matches neither B={full[0]} nor N={full[1]}; give a "
            f"rank-4 {name} {legend}."
        )
    if x.ndim == 3:
        raise ValueError(
            f"a rank-3 {name} {x.shape} is ambiguous ((B, T, S) or (N, T, S)?). Write {name}[:, None] for one per "
            f"batch row or {name}[None] for one per head, to get the rank-4 {legend}."
        )
    if x.ndim == 2:
        x = x[None, None]
    if x.ndim != 4 or any(n not in (1, f) for n, f in zip(x.shape, full)):
        raise ValueError(f"{name} must have shape (T, S) = {full[2:]} or {legend}; got {x.shape}.")
    return x


def _lengths(name, x, B, limit, axis):
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        try:
            x = np.asarray(x)
        except ValueError:
            raise ValueError(f"{name} must be a flat list of {B} ints (one per batch row).") from None
    if not isinstance(x, (np.ndarray, jax.Array)):
        raise ValueError(
            f"{name} must be a (B,) = ({B},) integer array, one length per batch row; got {type(x).__name__} "
            f"{x!r:.40}. For one length for all rows use jnp.full(({B},), length, jnp.int32)."
        )
    if x.shape != (B,):
        raise ValueError(f"{name} must have shape (B,) = ({B},), one length per batch row; got shape {x.shape}.")
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must be integers; got dtype {x.dtype}. Cast with jnp.asarray({name}, jnp.int32).")
    if isinstance(x, jax.core.Tracer):  # traced under jit: the values are checked under checkify, else clamped
        checkify.debug_check(
            jnp.all((x >= 0) & (x <= limit)),
            f"{name} must lie in [0, {axis}] = [0, {limit}]; got values from {{lo}} to {{hi}}.",
            lo=jnp.min(x),
            hi=jnp.max(x),
        )
        return jnp.clip(x, 0, limit).astype(jnp.int32)
    values = np.asarray(x)
    bad = np.flatnonzero((values < 0) | (values > limit))
    if bad.size:
        row = int(bad[0])
        raise ValueError(
            f"{name} must lie in [0, {axis}] = [0, {limit}]; batch row {row} has {int(values[row])} "
            f"({bad.size} row(s) out of range). Lengths count valid positions from the start."
        )
    return values.astype(np.int32)


def segment_pair(segment_ids, B: int, T: int, S: int):
    """(q_segment (B, T), kv_segment (B, S)) int32 from ``segment_ids``: one (B, T) array when T == S, or a pair;
    (None, None) for None. Packed documents: a query sees only the keys of its own segment."""
    if segment_ids is None:
        return None, None
    pair = segment_ids if isinstance(segment_ids, (tuple, list)) else (segment_ids, segment_ids)
    if len(pair) != 2:
        raise ValueError(
            f"segment_ids must be one (B, T) array or a pair (q_ids (B, T), kv_ids (B, S)); got {len(pair)} arrays."
        )
    out = []
    for name, ids, n in (("query", pair[0], T), ("key", pair[1], S)):
        ids = jnp.asarray(ids)
        if ids.shape != (B, n) or not jnp.issubdtype(ids.dtype, jnp.integer):
            raise ValueError(
                f"segment_ids: the {name} ids must be integers of shape (B, {'T' if name == 'query' else 'S'}) = "
                f"{(B, n)}; got {ids.dtype} {ids.shape}."
                + (" For T != S pass a pair (q_ids, kv_ids)." if T != S else "")
            )
        out.append(ids.astype(jnp.int32))
    return tuple(out)


def segment_mask(segment_ids, B: int, T: int, S: int):
    """(B, 1, T, S) bool, True where query r and key c of a batch row share a segment (:func:`segment_pair`): the
    document mask as a matrix, for attention that takes no segment ids."""
    q_ids, kv_ids = segment_pair(segment_ids, B, T, S)
    return q_ids[:, None, :, None] == kv_ids[:, None, None, :]
