"""A named grid of attention problems -> one record per point; out-of-memory and unsupported points are
recorded (with the reason) and the sweep goes on.

A record holds the problem (impl, batch, seq_q, seq_kv, heads, kv_heads, head_dim, dtype, causal, pass),
``status`` (ok / oom / unsupported / error) with ``reason``, and for ok points the timing (median/p10/p90 ms,
single-call and dispatch ms, compile s), ``tflops`` (FLOP model in :mod:`attention_tutorial.measure.flops`),
``pct_peak`` (against the matmul ceiling measured in the same run, when given), ``gbps`` (fewest bytes over time),
``temp_bytes`` (XLA's compiled temporaries) and ``kernel`` (what computed the attention).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp

from .. import registry
from ..inputs import AttentionShape, make_qkv
from ..kernels.masks import mask_args, split_static
from .compiled import compile_stats
from .flops import PASSES, attention_bytes, attention_flops
from .timing import time_fn

STATUSES = ("ok", "oom", "unsupported", "error")


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
    points = []
    for impl, t, b, n, h, kh, s, dt, c, p, m in itertools.product(
        impls, seq_q, batch, heads, head_dim, kv_heads, seq_kv, dtype, causal, passes, masks
    ):
        if p not in PASSES:
            raise ValueError(f"pass must be one of {PASSES}; got {p!r}.")
        b = max(1, tokens // t) if tokens else b
        points.append(Point(impl, b, t, t if s is None else s, n, n if kh is None else kh, h, dt, c, p, m))
    return points


def run_point(point: Point, *, peak_tflops: float | None = None, seed: int = 0, **timing) -> dict:
    """Measure one point; never raises for OOM, unsupported or failing points: they become records."""
    rec = empty_record(point)
    impl = registry.get(point.impl)
    reason = impl.why_not(point.shape, jnp.dtype(point.dtype), point.causal)
    if not reason and point.mask not in impl.masks:
        reason = f"{impl.label} takes no {point.mask!r} mask (it takes {', '.join(impl.masks)})."
    if reason:
        return {**rec, "status": "unsupported", "reason": reason}
    try:
        q, k, v = make_qkv(
            point.batch, point.seq_q, point.heads, point.head_dim,
            seq_kv=point.seq_kv, kv_heads=point.kv_heads, dtype=point.dtype, seed=seed,
        )  # fmt: skip
        arrays, static = split_static(mask_args(point.mask, point.shape, q.dtype, causal=point.causal, seed=seed))
        fn = _callable(impl.fn, point, tuple(arrays), static)
        args = (q, k, v, *arrays.values())
        if point.pass_ == "fwd+bwd":
            args += (jax.random.normal(jax.random.key(seed + 1), q.shape, q.dtype),)  # dO, the output gradient
        stats = compile_stats(fn, *args)
        if _exceeds_memory(stats.temp_bytes, args):
            return {**rec, "status": "oom", "reason": f"needs {stats.temp_bytes / 2**30:.1f} GiB of temporaries",
                    "temp_bytes": stats.temp_bytes}  # fmt: skip
        t = time_fn(fn, *args, compiled=stats.compiled, **timing)
    except Exception as err:
        return {**rec, **failure_fields(err)}
    finally:
        args = q = k = v = None  # free device memory before the next point
    flops = attention_flops(point.batch, point.seq_q, point.seq_kv, point.heads, point.head_dim,
                            causal=point.causal, pass_=point.pass_)  # fmt: skip
    nbytes = attention_bytes(point.batch, point.seq_q, point.seq_kv, point.heads, point.kv_heads, point.head_dim,
                             point.dtype)  # fmt: skip
    tflops = flops / (t.median_ms * 1e-3) / 1e12
    extra = {"backend": _backend(impl, point)} if impl.backend else {}
    return {
        **extra,
        **rec,
        "status": "ok",
        "median_ms": t.median_ms,
        "p10_ms": t.p10_ms,
        "p90_ms": t.p90_ms,
        "single_call_ms": t.single_call_ms,
        "dispatch_ms": t.dispatch_ms,
        "repeats": t.repeats,
        "compile_s": stats.compile_s,
        "tflops": tflops,
        "pct_peak": 100 * tflops / peak_tflops if peak_tflops else None,
        "gbps": nbytes / (t.median_ms * 1e-3) / 1e9,
        "temp_bytes": stats.temp_bytes,
        "kernel": stats.attention_kernel,
    }


def run_sweep(points, *, peak_tflops: float | None = None, progress: bool = False, **timing) -> list[dict]:
    """Run every point in order (see :func:`run_point`); ``progress`` shows a tqdm bar on long sweeps."""
    points = list(points)
    if progress:
        from tqdm.auto import tqdm

        points = tqdm(points, desc="sweep", unit="pt")
    return [run_point(p, peak_tflops=peak_tflops, **timing) for p in points]


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


def empty_record(point: Point) -> dict:
    """A point's record before measuring: its fields, and null timings (what a failed point keeps)."""
    return {**point.as_record(), "median_ms": None, "p10_ms": None, "p90_ms": None, "tflops": None}


def failure_fields(err: Exception) -> dict:
    """``status`` (oom / unsupported / error) and ``reason`` for an exception raised while measuring."""
    text = f"{type(err).__name__}: {err}"
    first = text.strip().splitlines()[0][:300]
    low = text.lower()
    if "resource_exhausted" in low or "out of memory" in low or isinstance(err, MemoryError):
        return {"status": "oom", "reason": first}
    if isinstance(err, (NotImplementedError, ImportError)):
        return {"status": "unsupported", "reason": first}
    return {"status": "error", "reason": first}
