"""Query, key and value inputs in the (B, T, N, H) layout, and their validation.

Shape legend (the one `jax.nn.dot_product_attention` uses)::

    B  batch                  T  query length          S  key/value length
    N  query heads            K  key/value heads       H  head dimension

    q: (B, T, N, H)    k: (B, S, K, H)    v: (B, S, K, H)    out: (B, T, N, H)

K must divide N: each group of N // K query heads shares one key/value head (K == N is multi-head
attention, 1 < K < N grouped-query attention, K == 1 multi-query attention).
"""

from __future__ import annotations

import functools
import math
import numbers
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify


class Unsupported(ValueError):
    """A well-formed problem that one implementation cannot run (cuDNN's head-dim or dtype limits, a window shape
    it does not take, no GPU). A ``ValueError``, so code that catches bad input catches it too; a sweep records it
    as "unsupported", not as an error."""


class AttentionShape(NamedTuple):
    """The sizes of one attention problem (see the module's shape legend)."""

    batch: int  # B
    seq_q: int  # T
    seq_kv: int  # S
    heads: int  # N
    kv_heads: int  # K
    head_dim: int  # H

    @property
    def groups(self) -> int:
        """Query heads per key/value head, N // K."""
        return self.heads // self.kv_heads


def make_qkv(
    batch: int,
    seq_q: int,
    heads: int,
    head_dim: int,
    *,
    seq_kv: int | None = None,
    kv_heads: int | None = None,
    dtype=jnp.float32,
    seed: int = 0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Random q (B, T, N, H), k and v (B, S, K, H), standard normal, in ``dtype``.

    ``seq_kv`` (S) defaults to ``seq_q`` (T); ``kv_heads`` (K) defaults to ``heads`` (N).
    The values are never all zeros: zeros hide unwritten outputs and can time faster than real data.
    """
    seq_kv = seq_q if seq_kv is None else seq_kv
    kv_heads = heads if kv_heads is None else kv_heads
    sizes = {
        "batch": batch,
        "seq_q": seq_q,
        "seq_kv": seq_kv,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
    }
    for name, n in {**sizes, "seed": seed}.items():
        if not _is_int(n):
            raise ValueError(f"{name} must be an int; got {type(n).__name__} {n!r:.60}. Pass e.g. {name}=int({name}).")
    if seed < 0:
        raise ValueError(f"seed must be >= 0 (it seeds jax.random.key); got {int(seed)}. Pass e.g. seed=0.")
    shape = AttentionShape(*(int(n) for n in sizes.values()))
    _check_sizes(shape)
    try:
        dtype = jnp.dtype(dtype)
    except TypeError:
        raise ValueError(
            f"dtype must be a floating type (jnp.float32, jnp.bfloat16, ...); got {dtype!r:.60}."
        ) from None
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"dtype must be a floating type (float32, bfloat16, float16); got {dtype}.")
    if jax.dtypes.canonicalize_dtype(dtype) != dtype:
        raise ValueError(f"dtype {dtype} needs jax.config.update('jax_enable_x64', True); else use float32.")
    _check_fits(shape, dtype)
    key = jax.random.key(seed)  # outside jit: any seed >= 0 (a traced one would have to fit in int32)
    return _random_qkv(key, (batch, seq_q, heads, head_dim), (batch, seq_kv, kv_heads, head_dim), dtype)


@functools.partial(jax.jit, static_argnames=("q_shape", "kv_shape", "dtype"))
def _random_qkv(key, q_shape, kv_shape, dtype):
    # one compiled program per shape and dtype (run op by op, a GPU compiles each of the ops on its own)
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.random.normal(kq, q_shape, jnp.float32).astype(dtype)
    k = jax.random.normal(kk, kv_shape, jnp.float32).astype(dtype)
    v = jax.random.normal(kv, kv_shape, jnp.float32).astype(dtype)
    return q, k, v


def check_flag(name: str, value) -> bool:
    """``value`` as a bool; a string, number or array is refused (``bool("no")`` is True: a silent causal mask)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} must be True or False; got {value!r} ({type(value).__name__}).")


def resolve_scale(scale, head_dim: int) -> float:
    """The softmax scale as a Python float: ``None`` -> 1/sqrt(head_dim); anything not a finite real -> ``ValueError``.

    Python and NumPy ints and floats (and 0-d arrays) are accepted. Zero and negative scales are allowed: they are
    well defined (zero averages v uniformly). Booleans, strings, complex numbers, NaN and infinities are refused.
    """
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    fix = "pass a finite real number such as 1 / math.sqrt(head_dim), or None for that default"
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (numbers.Real, np.generic, np.ndarray, jax.Array)):
        raise ValueError(f"scale must be a real number; got {type(scale).__name__} {scale!r:.60}; {fix}.")
    dt = jnp.result_type(scale)
    if np.ndim(scale) != 0 or not jnp.issubdtype(dt, jnp.number) or jnp.issubdtype(dt, jnp.complexfloating):  # type: ignore[arg-type]
        raise ValueError(f"scale must be a real scalar; got shape {np.shape(scale)}, dtype {dt}; {fix}.")  # type: ignore[arg-type]
    try:
        value = float(scale)
    except (TypeError, jax.errors.ConcretizationTypeError):
        raise ValueError(f"scale must be a concrete number, not a traced value; {fix} (or close over it).") from None
    if not math.isfinite(value):
        raise ValueError(f"scale must be finite; got {value}; {fix}.")
    return value


def check_int(name: str, value, *, minimum: int = 0, example: str = "") -> int:
    """``value`` as a Python int >= ``minimum`` (NumPy integers accepted; bools, floats and strings refused, also
    integral floats such as 2.0: a count is written as an int); ``ValueError`` naming ``name``, the value and the fix."""
    example = f" (e.g. {name}={example})" if example else ""
    if not _is_int(value):
        raise ValueError(
            f"{name} must be an integer >= {minimum}{example}; got {type(value).__name__} {value!r:.60}. Pass an int."
        )
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}{example}; got {int(value)}.")
    return int(value)


def check_number(name: str, value, *, positive: bool = False, non_negative: bool = False, example: str = "") -> float:
    """``value`` as a finite Python float (ints and NumPy scalars accepted; bools, strings, NaN and infinities
    refused), > 0 with ``positive``, >= 0 with ``non_negative``; ``ValueError`` naming ``name``, the value and the fix."""
    want = "a finite number" + (" > 0" if positive else " >= 0" if non_negative else "")
    example = f" (e.g. {name}={example})" if example else ""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.integer, np.floating)):
        raise ValueError(f"{name} must be {want}{example}; got {type(value).__name__} {value!r:.60}.")
    x = float(value)
    if not math.isfinite(x) or (positive and x <= 0) or (non_negative and x < 0):
        raise ValueError(f"{name} must be {want}{example}; got {x}.")
    return x


F32_MAX = float(np.finfo(np.float32).max)


@jax.jit
def _finite_abs_max(q, k):
    # max |x| over the finite entries of q and of k, float32: one program per pair of shapes (run op by op on
    # concrete arrays, each of the four ops would compile on its own, for q and for k)
    return tuple(jnp.max(jnp.where(jnp.isfinite(x), jnp.abs(x), 0)).astype(jnp.float32) for x in (q, k))


def check_scores_fit(q, k, scale: float, *, what: str) -> None:
    """Refuse a ``scale`` with which float32 scores ``scale · q·kᵀ`` may overflow (``what``: the function that would
    compute them as they are, for the message). ``|scale| · H · max|q| · max|k|`` (finite entries) bounds every score:
    checked at once when q and k are concrete; traced under ``jit`` their values are unknown, and the check runs
    only under ``jax.experimental.checkify.checkify`` (else it costs nothing: XLA drops it)."""
    H = np.shape(q)[-1]
    finite_max = [float(jnp.finfo(jnp.result_type(x)).max) for x in (q, k)]
    if scale == 0 or abs(scale) * H * finite_max[0] * finite_max[1] <= F32_MAX:  # no values of these dtypes can
        return
    big = _finite_abs_max(q, k)
    if isinstance(q, jax.core.Tracer) or isinstance(k, jax.core.Tracer):  # under jit: checked only under checkify
        limit = F32_MAX / (abs(scale) * H)  # compared as max|q| <= limit / max|k|: no overflow in the test itself
        checkify.debug_check(
            big[0] <= limit / jnp.maximum(big[1], np.finfo(np.float32).tiny),
            f"scale={scale:g} can make scores overflow float32 with these q and k (max|q| = {{mq}}, max|k| = {{mk}}, "
            f"H = {H}); {what} would return NaN. Use a smaller |scale|.",
            mq=big[0],
            mk=big[1],
        )
        return
    bound = abs(scale) * H * float(big[0]) * float(big[1])
    if bound > F32_MAX:
        raise ValueError(
            f"scale={scale:g} can make scores up to {bound:.3g} with these q and k (|scale| · H · max|q| · max|k|), "
            f"past float32's {F32_MAX:.3g}: {what} would return NaN or wrong weights. Use a smaller |scale| (the "
            f"default is 1/sqrt(H) = {H**-0.5:.3g}), or naive_attention / blockwise_attention, which compute any "
            "finite scale exactly."
        )


def check_block_size(name: str, value) -> int:
    """``value`` as a positive Python int (NumPy integers accepted); ``ValueError`` naming ``name`` otherwise."""
    if not _is_int(value):
        raise ValueError(
            f"{name} must be a positive integer (e.g. 64 or 128); got {type(value).__name__} {value!r:.60}. "
            f"Pass an int, e.g. {name}=int({name})."
        )
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer (e.g. 64 or 128); got {int(value)}.")
    return int(value)


def memory_limit_bytes(device: jax.Device | None = None) -> int | None:
    """How many bytes arrays may take on ``device`` (default: the first): the GPU's ``bytes_limit``, else RAM."""
    device = jax.devices()[0] if device is None else device
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        return stats.get("bytes_limit")
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows) or the name is unknown
        return None


def _check_fits(shape: AttentionShape, dtype) -> None:
    """Refuse inputs that cannot fit in memory, with the sizes, before XLA aborts the process trying."""
    B, T, S, N, K, H = shape
    itemsize = jnp.dtype(dtype).itemsize
    draw = 0 if itemsize == 4 else 4 * max(B * T * N * H, B * S * K * H)  # one float32 draw alive while it is cast
    need = (B * T * N * H + 2 * B * S * K * H) * itemsize + draw
    limit = memory_limit_bytes()
    if limit is not None and need > limit:
        raise ValueError(
            f"q, k, v of {dict(zip(shape._fields, shape))} in {jnp.dtype(dtype).name} need about {need / 2**30:.1f} GiB "
            f"to create, more than the {limit / 2**30:.1f} GiB this {jax.devices()[0].platform.upper()} has; "
            "choose smaller sizes (batch or sequence length)."
        )


def attention_shape(q, k, v) -> AttentionShape:
    """Validate q, k, v and return their sizes; raise ``ValueError`` naming the fix otherwise."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, (np.ndarray, jax.Array)):
            raise ValueError(
                f"{name} must be an array (jax.Array or numpy.ndarray); got {type(x).__name__}. "
                f"Convert it with jnp.asarray({name}, jnp.float32)."
            )
        if np.ndim(x) != 4:
            raise ValueError(
                f"{name} must have rank 4 (B, T|S, N|K, H); got shape {np.shape(x)}. "
                "Add a batch axis with x[None] or a head axis with x[:, :, None, :]."
            )
        dt = jnp.result_type(x)
        if not jnp.issubdtype(dt, jnp.floating):
            raise ValueError(f"{name} must be floating point; got {dt}. Cast it, e.g. {name}.astype(jnp.bfloat16).")
    B, T, N, H = np.shape(q)
    Bk, S, K, Hk = np.shape(k)
    if np.shape(v) != np.shape(k):
        raise ValueError(f"k and v must have the same shape (B, S, K, H); got k {np.shape(k)} and v {np.shape(v)}.")
    if Bk != B:
        raise ValueError(f"q and k/v must have the same batch size; got q {np.shape(q)} and k {np.shape(k)}.")
    if Hk != H:
        raise ValueError(f"q and k/v must have the same head_dim (last axis); got q {np.shape(q)} and k {np.shape(k)}.")
    shape = AttentionShape(B, T, S, N, K, H)
    _check_sizes(shape)
    dtypes = {jnp.result_type(x) for x in (q, k, v)}
    if len(dtypes) != 1:
        raise ValueError(f"q, k and v must share one dtype; got {sorted(str(d) for d in dtypes)}. Cast them alike.")
    return shape


def invalid_reason(shape, dtype) -> str | None:
    """Why ``shape`` (an AttentionShape or 6 ints) in ``dtype`` is no valid attention problem, or None if it is.

    The checks ``attention_shape`` and ``make_qkv`` make, as a sentence: every ``why_not`` starts with them, so
    "can run" never covers a problem the function would refuse.
    """
    if not (isinstance(shape, tuple) and len(shape) == 6 and all(_is_int(n) for n in shape)):
        return f"shape must be an AttentionShape(B, T, S, N, K, H) of 6 ints; got {type(shape).__name__} {shape!r:.80}."
    try:
        _check_sizes(AttentionShape(*(int(n) for n in shape)))
        dt = jnp.dtype(dtype)
    except ValueError as e:
        return str(e)
    except TypeError:
        return f"dtype must be a floating dtype (float32, bfloat16, float16); got {dtype!r:.60}."
    if not jnp.issubdtype(dt, jnp.floating):
        return f"inputs must be floating point (float32, bfloat16, float16); got {dt}. Cast them, e.g. .astype(jnp.bfloat16)."
    return None


def _is_int(n) -> bool:
    return isinstance(n, (numbers.Integral, np.integer)) and not isinstance(n, (bool, np.bool_))


def _check_sizes(shape: AttentionShape) -> None:
    if min(shape) <= 0:
        empty = [f for f, n in zip(shape._fields, shape) if n <= 0]
        raise ValueError(f"every dimension must be at least 1; got {dict(zip(shape._fields, shape))} ({empty} empty).")
    if shape.heads % shape.kv_heads:
        raise ValueError(
            f"heads N={shape.heads} must be a multiple of kv_heads K={shape.kv_heads} "
            f"(each kv head serves N // K query heads); choose K among the divisors of {shape.heads}."
        )
