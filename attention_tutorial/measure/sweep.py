"""A named grid of attention problems -> one record per point; out-of-memory and unsupported points are
recorded (with the reason) and the sweep goes on.

This module owns the record schema: every record (sweeps, the FP8 experiments, the recorder, the CLI) is built by
:func:`empty_record` / :func:`gemm_record` (the problem, null timings) and :func:`timed_record` (a measurement)
or :func:`failure_fields` (why not), and checked by :func:`check_record`. An attention record holds the problem
(impl, batch, seq_q, seq_kv, heads, kv_heads, head_dim, dtype, causal, mask, pass); a GEMM record (``problem``:
"gemm") holds m, k, n instead. Both hold ``status`` (ok / oom / unsupported / error) with ``reason``, and for ok
points the timing (median/p10/p90 ms, compile s), ``tflops`` (FLOP model in :mod:`attention_tutorial.measure.flops`:
only the score positions the mask keeps), ``pct_peak`` and its ``peak_basis`` (the bf16 matmul measured in the same
run, a reference on that card, ×2 for FP8), and for attention sweeps single-call and dispatch ms, ``gbps`` (fewest bytes over
time), ``temp_bytes`` (XLA's compiled temporaries) and ``kernel`` (what computed the attention).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any

import jax
import jax.numpy as jnp

from .. import registry
from ..inputs import AttentionShape, Unsupported, make_qkv
from ..kernels.masks import MASK_KINDS, mask_args, split_static
from .compiled import compile_stats
from .flops import PASSES, attention_bytes, attention_flops, peak_for
from .timing import Timing, time_fn

STATUSES = ("ok", "oom", "unsupported", "error")
PROBLEMS = ("attention", "gemm")  # a record's ``problem`` (absent: attention)
# The record schema: fields every record has, the sizes each problem has, and numbers that may never be negative.
COMMON_FIELDS = {
    "impl": str,
    "dtype": str,
    "pass": str,
    "status": str,
    "median_ms": (int, float, type(None)),
    "p10_ms": (int, float, type(None)),
    "p90_ms": (int, float, type(None)),
    "tflops": (int, float, type(None)),
}
SIZE_FIELDS = {
    "attention": ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim"),
    "gemm": ("m", "k", "n"),
}
TIMED_FIELDS = ("median_ms", "p10_ms", "p90_ms")
NON_NEGATIVE = (
    *TIMED_FIELDS,
    "tflops",
    "pct_peak",
    "single_call_ms",
    "dispatch_ms",
    "compile_s",
    "gbps",
    "temp_bytes",
    "pct_read",
    "repeats",
    "rel_error",
)


@dataclass(frozen=True)
class Point:
    """One problem of a sweep."""

    impl: str
    batch: int
    seq_q: int
    seq_kv: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    causal: bool = False
    pass_: str = "fwd"
    mask: str = "none"

    @property
    def shape(self) -> AttentionShape:
        return AttentionShape(self.batch, self.seq_q, self.seq_kv, self.heads, self.kv_heads, self.head_dim)

    def as_record(self) -> dict:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        return d


def grid(
    impls,
    *,
    seq_q,
    batch=(1,),
    heads=(16,),
    head_dim=(128,),
    kv_heads=(None,),
    seq_kv=(None,),
    dtype=("bfloat16",),
    causal=(False,),
    passes=("fwd",),
    masks=("none",),
    tokens: int | None = None,
) -> list[Point]:
    """The cartesian product of the axes. ``None`` for seq_kv/kv_heads means 'same as seq_q/heads'.

    ``tokens`` fixes B·T instead of ``batch``: batch = max(1, tokens // seq_q), so long and short sequences
    keep the chip equally busy.
    """
    axes = {
        "impls": impls,
        "seq_q": seq_q,
        "batch": batch,
        "heads": heads,
        "head_dim": head_dim,
        "kv_heads": kv_heads,
        "seq_kv": seq_kv,
        "dtype": dtype,
        "causal": causal,
        "passes": passes,
        "masks": masks,
    }
    for name, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, range)):
            example = {
                "impls": "('xla',)",
                "dtype": "('bfloat16',)",
                "causal": "(False,)",
                "passes": "('fwd',)",
                "masks": "('none',)",
            }.get(name, "(1024,)")
            raise TypeError(f"{name} must be a list or tuple of values, e.g. {example}; got {values!r}")
    for impl in impls:
        registry.get(impl)  # a ValueError naming the known ones
    for name in ("seq_q", "batch", "heads", "head_dim", "kv_heads", "seq_kv"):
        for v in axes[name]:
            if not (v is None and name in ("kv_heads", "seq_kv")) and not _positive_int(v):
                raise ValueError(f"{name} values must be positive integers; got {v!r} in {axes[name]!r}")
    if tokens is not None and not _positive_int(tokens):
        raise ValueError(f"tokens (B·T) must be a positive integer or None; got {tokens!r}")
    for d in dtype:
        _check_dtype(d)
    if any(not isinstance(c, bool) for c in causal):
        raise TypeError(f"causal values must be True or False; got {causal!r}")
    for m in masks:
        if m not in MASK_KINDS:
            raise ValueError(f"mask must be one of {MASK_KINDS}; got {m!r}.")
    points = []
    for impl, t, b, n, h, kh, s, dt, c, p, m in itertools.product(
        impls, seq_q, batch, heads, head_dim, kv_heads, seq_kv, dtype, causal, passes, masks
    ):
        if p not in PASSES:
            raise ValueError(f"pass must be one of {PASSES}; got {p!r}.")
        b = max(1, tokens // t) if tokens else b
        points.append(Point(impl, b, t, t if s is None else s, n, n if kh is None else kh, h, dt, c, p, m))
    return points


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _check_dtype(d) -> None:
    try:
        jnp.dtype(d)
    except TypeError:
        raise ValueError(f"dtype {d!r} is not a dtype JAX knows; use e.g. 'bfloat16', 'float16' or 'float32'") from None


def _check_point(point) -> None:
    """A ``ValueError``/``TypeError`` naming the field of a malformed point (a programming error, not a result)."""
    if not isinstance(point, Point):
        raise TypeError(f"a point must be a Point (see grid()); got {type(point).__name__} {point!r}")
    for field in ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim"):
        if not _positive_int(getattr(point, field)):
            raise ValueError(f"Point.{field} must be a positive integer; got {getattr(point, field)!r}")
    _check_dtype(point.dtype)
    if not isinstance(point.causal, bool):
        raise TypeError(f"Point.causal must be True or False; got {point.causal!r}")
    if point.pass_ not in PASSES or point.mask not in MASK_KINDS:
        raise ValueError(
            f"Point.pass_ must be one of {PASSES} and Point.mask one of {MASK_KINDS}; got "
            f"{point.pass_!r}, {point.mask!r}"
        )


def run_point(point: Point, *, peak_tflops: float | None = None, seed: int = 0, **timing) -> dict:
    """Measure one point; never raises for OOM, unsupported or failing points: they become records (a malformed
    point, or an unknown implementation, raises a ``ValueError``/``TypeError`` naming it)."""
    _check_point(point)
    rec = empty_record(point)
    impl = registry.get(point.impl)
    reason = impl.why_not(point.shape, jnp.dtype(point.dtype), point.causal)
    if not reason and point.mask not in impl.masks:
        reason = f"{impl.label} takes no {point.mask!r} mask (it takes {', '.join(impl.masks)})."
    if reason:
        return {**rec, "status": "unsupported", "reason": reason}
    try:
        q, k, v = make_qkv(
            point.batch,
            point.seq_q,
            point.heads,
            point.head_dim,
            seq_kv=point.seq_kv,
            kv_heads=point.kv_heads,
            dtype=point.dtype,
            seed=seed,
        )
        arrays, static = split_static(mask_args(point.mask, point.shape, q.dtype, causal=point.causal, seed=seed))
        fn = _callable(impl.fn, point, tuple(arrays), static)
        args = (q, k, v, *arrays.values())
        if point.pass_ == "fwd+bwd":
            args += (jax.random.normal(jax.random.key(seed + 1), q.shape, q.dtype),)  # dO, the output gradient
        stats = compile_stats(fn, *args)
        if _exceeds_memory(stats.temp_bytes, args):
            return {
                **rec,
                "status": "oom",
                "reason": f"needs {stats.temp_bytes / 2**30:.1f} GiB of temporaries",  # type: ignore[operator]
                "temp_bytes": stats.temp_bytes,
            }
        t = time_fn(fn, *args, compiled=stats.compiled, **timing)
    except Exception as err:
        return {**rec, **failure_fields(err)}
    finally:
        args = q = k = v = None  # free device memory before the next point
    flops = attention_flops(
        point.batch,
        point.seq_q,
        point.seq_kv,
        point.heads,
        point.head_dim,
        causal=point.causal,
        pass_=point.pass_,
        mask=point.mask,
        seed=seed,
    )
    nbytes = attention_bytes(
        point.batch, point.seq_q, point.seq_kv, point.heads, point.kv_heads, point.head_dim, point.dtype
    )
    extra = {"backend": _backend(impl, point)} if impl.backend else {}
    try:
        timed = timed_record(
            rec,
            t,
            flops=flops,
            peak_tflops=peak_tflops,
            single_call_ms=t.single_call_ms,
            dispatch_ms=t.dispatch_ms,
            repeats=t.repeats,
            compile_s=stats.compile_s,
            gbps=nbytes / (t.median_ms * 1e-3) / 1e9,
            temp_bytes=stats.temp_bytes,
            kernel=stats.attention_kernel,
            **extra,
        )
    except ZeroDivisionError:  # a median of 0 ms: the clock did not see the call
        return {**rec, "status": "error", "reason": f"the timing is not usable: median {t.median_ms} ms"}
    problems = check_record(timed)
    if problems:  # a measurement no result file may hold (a NaN, a negative time): said, not saved as a result
        return {**rec, "status": "error", "reason": "the measurement is not usable: " + "; ".join(problems[:3])}
    return timed


def run_sweep(
    points, *, peak_tflops: float | None = None, progress: bool = False, on_record=None, **timing
) -> list[dict]:
    """Run every point in order (see :func:`run_point`); ``progress`` shows a tqdm bar on long sweeps;
    ``on_record(record)`` is called after each point (to save as it goes)."""
    points = list(points)
    if on_record is not None and not callable(on_record):
        raise TypeError(f"on_record must be a function of one record (or None); got {on_record!r}")
    for p in points:
        _check_point(p)
    if progress:
        from tqdm.auto import tqdm

        points = tqdm(points, desc="sweep", unit="pt")
    records = []
    for p in points:
        records.append(run_point(p, peak_tflops=peak_tflops, **timing))
        if on_record is not None:
            on_record(records[-1])
    return records


def _backend(impl, point: Point) -> str:
    """Which backend a front end (TransformerEngine) picked for the point; a failed query is reported, not fatal."""
    try:
        return impl.backend(point.shape, jnp.dtype(point.dtype), point.causal, point.pass_ == "fwd+bwd")
    except Exception as err:
        return f"unknown ({type(err).__name__}: {str(err)[:120]})"


def _callable(fn, point: Point, array_names: tuple[str, ...], static: dict):
    """fn(q, k, v, *mask_arrays) for the forward pass; for fwd+bwd, fn(q, k, v, *mask_arrays, dO) returning
    (dq, dk, dv) through jax.vjp. Mask arrays are inputs, so they are not baked into the program as constants."""
    causal = point.causal

    def forward(q, k, v, *arrays):
        return fn(q, k, v, is_causal=causal, **dict(zip(array_names, arrays)), **static)

    if point.pass_ == "fwd":
        return forward

    def forward_backward(q, k, v, *rest):
        *arrays, d_out = rest
        _, vjp = jax.vjp(lambda q, k, v: forward(q, k, v, *arrays), q, k, v)
        return vjp(d_out)

    return forward_backward


def _exceeds_memory(temp_bytes, args) -> bool:
    """True when the compiled temporaries cannot fit beside the inputs in the device's memory."""
    if not temp_bytes:
        return False
    try:
        limit = jax.devices()[0].memory_stats()["bytes_limit"]
    except (TypeError, KeyError, AttributeError, jax.errors.JaxRuntimeError):
        return False  # this backend does not say (the CPU): let the run itself tell
    return temp_bytes + sum(a.nbytes for a in args) > limit


NO_TIMING = {"median_ms": None, "p10_ms": None, "p90_ms": None, "tflops": None}


def empty_record(point: Point) -> dict:
    """A point's record before measuring: its fields, and null timings (what a failed point keeps)."""
    return {**point.as_record(), **NO_TIMING}


def gemm_record(impl: str, *, m: int, k: int, n: int, dtype: str, **extra) -> dict:
    """An (m, k) × (k, n) matrix product's record before measuring (``problem`` "gemm"), null timings."""
    return {
        "impl": impl,
        "problem": "gemm",
        "m": m,
        "k": k,
        "n": n,
        "dtype": dtype,
        "pass": "fwd",
        **NO_TIMING,
        **extra,
    }


def timed_record(base: dict, t: Timing, *, flops: float, peak_tflops: float | None = None, **extra) -> dict:
    """``base`` (from :func:`empty_record` / :func:`gemm_record`) measured: status ok, the timing, TFLOP/s from
    ``flops``, and % of the reference for its dtype (``peak_tflops`` is the bf16 matmul measured in the run, a reference
    on that card, not a ceiling; FP8 gets ×2, named in ``peak_basis``)."""
    tflops = flops / (t.median_ms * 1e-3) / 1e12
    peak, basis = peak_for(base["dtype"], peak_tflops)
    judged = {"pct_peak": 100 * tflops / peak, "peak_basis": basis} if peak else {"pct_peak": None}
    return {
        **base,
        "status": "ok",
        "median_ms": t.median_ms,
        "p10_ms": t.p10_ms,
        "p90_ms": t.p90_ms,
        "compile_s": t.compile_s,
        "tflops": tflops,
        **judged,
        **extra,
    }


POINT_FIELDS = (
    "grid",
    "problem",
    "experiment",
    "impl",
    *SIZE_FIELDS["attention"],
    *SIZE_FIELDS["gemm"],
    "dtype",
    "causal",
    "mask",
    "pass",
)


def point_key(rec: dict) -> tuple:
    """What identifies a record's point (grid, problem, impl, sizes, dtype, mask, pass): a new measurement of the
    same point replaces the old one when results are merged."""
    return tuple(rec.get(f) for f in POINT_FIELDS)


def check_record(rec) -> list[str]:
    """Every way ``rec`` breaks the record schema, as messages; an empty list means it is valid."""
    if not isinstance(rec, dict):
        return [f"is a {type(rec).__name__}, not an object"]
    problem = rec.get("problem", "attention")
    if problem not in PROBLEMS:
        return [f"has unknown problem {problem!r} (known: {PROBLEMS})"]
    out = []
    types: dict[str, Any] = {**COMMON_FIELDS, **dict.fromkeys(SIZE_FIELDS[problem], int)}
    if problem == "attention":
        types.update(causal=bool)
    for field, want in types.items():
        value: Any = rec.get(field)
        if field not in rec:
            out.append(f"lacks {field!r}")
        elif not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
            out.append(f"{field!r} has type {type(value).__name__}")
        elif field in SIZE_FIELDS[problem] and value <= 0:
            out.append(f"{field!r} must be positive; got {value}")
    for field in NON_NEGATIVE:
        value = rec.get(field)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            if value is not None:
                out.append(f"{field!r} has type {type(value).__name__}")
        elif math.isnan(value) or math.isinf(value) or value < 0:
            out.append(f"{field!r} must be a finite number >= 0; got {value}")
    status = rec.get("status")
    if status not in STATUSES:
        out.append(f"has unknown status {status!r} (known: {STATUSES})")
    elif status == "ok":
        if not all(isinstance(rec.get(f), (int, float)) for f in (*TIMED_FIELDS, "tflops")):
            out.append("is ok but has no median_ms/p10_ms/p90_ms/tflops")
        elif rec["median_ms"] <= 0:
            out.append(f"is ok but its median_ms is {rec['median_ms']}")
        elif not rec["p10_ms"] <= rec["median_ms"] <= rec["p90_ms"]:
            out.append(f"has p10/median/p90 ms out of order: {rec['p10_ms']}, {rec['median_ms']}, {rec['p90_ms']}")
    else:
        if not rec.get("reason"):
            out.append(f"has status {status!r} but no reason")
        if any(rec.get(f) is not None for f in (*TIMED_FIELDS, "tflops")):
            out.append(f"has status {status!r} but carries timings")
    if rec.get("pass") not in PASSES:
        out.append(f"has unknown pass {rec.get('pass')!r} (known: {PASSES})")
    if problem == "attention":
        if rec.get("mask", "none") not in MASK_KINDS:
            out.append(f"has unknown mask {rec.get('mask')!r} (known: {MASK_KINDS})")
        if not out and rec["heads"] % rec["kv_heads"]:
            out.append(f"heads {rec['heads']} is not a multiple of kv_heads {rec['kv_heads']}")
    if "grid" in rec and not (isinstance(rec["grid"], str) and rec["grid"]):
        out.append(f"has a malformed grid name {rec['grid']!r}")
    return out


def failure_fields(err: Exception) -> dict:
    """``status`` (oom / unsupported / error) and ``reason`` for an exception raised while measuring."""
    text = f"{type(err).__name__}: {err}"
    first = text.strip().splitlines()[0][:300]
    low = text.lower()
    if "resource_exhausted" in low or "out of memory" in low or isinstance(err, MemoryError):
        return {"status": "oom", "reason": first}
    if isinstance(err, (NotImplementedError, ImportError, Unsupported)):
        return {"status": "unsupported", "reason": first}
    return {"status": "error", "reason": first}
