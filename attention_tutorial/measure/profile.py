"""Device time, not only host time: what the profiler says each kernel took, beside what ``time_fn`` measured.

:func:`device_kernels` runs a compiled function ``repeats`` times under ``jax.profiler.trace``, reads the trace with
JAX's own reader (``jax.profiler.ProfileData``, no TensorBoard) and sums the events per name: on a GPU, the kernels,
copies and memsets CUPTI recorded on the device plane (``/device:GPU:…``, one line per stream). A CPU has no device
plane; there the table holds the XLA ops as the host's threads ran them, labelled ``kind = "host op"`` (ops on
several threads can overlap, so their sum is CPU time, not elapsed time).

:func:`compare_with_timing` puts the summed device time per call beside the pipelined median of
:func:`~attention_tutorial.measure.timing.time_fn` (and its dispatch overhead, a waited single call minus the
pipelined time), and :func:`profile_records` does so for each attention implementation at one shape, as result
records (grid "device_time").

Under an active profiler XLA runs a program's CUDA graphs (command buffers) op by op unless
``--xla_enable_command_buffers_during_profiling`` is set: the kernels are the same, their launches are not, which is
one more reason to compare the two methods only where the kernels are long.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import registry
from ..inputs import make_qkv
from .flops import attention_flops
from .sweep import Point, empty_record, failure_fields, timed_record
from .timing import Timing, time_fn

DEVICE_KINDS = ("kernel", "memcpy", "memset")  # device work summed into device_ms; "graph"/"other" are listed only
HOST_KIND = "host op"
# stat that marks each kind of device event (names from XLA's CUPTI collector); a CUDA graph's span would count its
# kernels twice, so it is listed, not summed
RECORD_KERNELS = 8  # kernels kept in a record, longest first
TRACED_EXTRA = 1  # untimed calls trace() runs inside the profiler before the timed ones (same work: counted per call)


class Kernel(NamedTuple):
    """One row of the table: a kernel (or host op) name, its time per call in µs, launches per call, and kind."""

    name: str
    device_us: float
    count: float  # type: ignore[assignment]  # a field, in place of tuple.count
    kind: str


def profile_data_class():
    """JAX's trace reader: public ``jax.profiler.ProfileData`` (jax 0.10 and 0.11 have it), else the private one."""
    cls = getattr(jax.profiler, "ProfileData", None)
    if cls is None:  # pragma: no cover - older jax
        try:
            from jax._src.profiler import ProfileData as cls
        except ImportError as err:
            raise ImportError(f"jax {jax.__version__} has no ProfileData trace reader; upgrade jax.") from err
    return cls


def trace(compiled, args, *, repeats: int, log_dir, wall_ms: list | None = None) -> Path:
    """Run ``compiled(*args)`` ``repeats`` times under the profiler; the path of the ``.xplane.pb`` written.

    The calls are issued back to back and waited for once, as ``time_fn`` does; their host time per call (ms) is
    appended to ``wall_ms`` when a list is given, to set beside the device's busy span of the same calls."""
    options = jax.profiler.ProfileOptions()
    if hasattr(options, "python_tracer_level"):
        options.python_tracer_level = 0  # Python frames are not what we measure; they only bloat the trace
    jax.block_until_ready(compiled(*args))  # warm: nothing of the first call's set-up lands in the trace
    with jax.profiler.trace(str(log_dir), profiler_options=options):
        for _ in range(TRACED_EXTRA):  # the profiler's own start-up, outside the timed calls
            jax.block_until_ready(compiled(*args))
        t0 = time.perf_counter()
        out = None
        for _ in range(repeats):
            out = compiled(*args)
        jax.block_until_ready(out)
        if wall_ms is not None:
            wall_ms.append((time.perf_counter() - t0) * 1e3 / repeats)
    files = sorted(Path(log_dir).rglob("*.xplane.pb"))
    if not files:
        raise RuntimeError(f"the profiler wrote no .xplane.pb under {log_dir}")
    return files[-1]


def events(path) -> tuple[list[tuple[str, str, float]], str]:
    """(name, kind, duration ns) of every timed event in a trace file, and where they come from: "device" when
    the trace has a GPU device plane, else "host" (the XLA ops on the host's threads)."""
    data = profile_data_class().from_file(str(path))
    planes = list(data.planes)
    device = [p for p in planes if p.name.startswith("/device:GPU")]
    if device:
        out = []
        for plane in device:
            for line in plane.lines:
                if line.name.startswith("Stream"):  # not "CUPTI overhead" nor the counter line
                    out += [(e.name, _kind(e), float(e.duration_ns)) for e in line.events]
        return out, "device"
    out = []
    for plane in planes:
        if plane.name.startswith("/host:"):
            for line in plane.lines:
                out += [(e.name, HOST_KIND, d) for e, d in _outermost_ops(line.events)]
    return out, "host"


def device_span_ms(path, calls: int) -> float | None:
    """The GPU's busy span per call (ms): from the first device event's start to the last one's end over the last
    ``calls`` calls' worth of events, gaps between kernels included; None for a trace without a device plane.

    The trace also holds one extra call issued before the timed ones (see :func:`trace`); its events come first in
    time and are left out here by counting events per call from the end."""
    data = profile_data_class().from_file(str(path))
    spans = []
    for plane in data.planes:
        if plane.name.startswith("/device:GPU"):
            for line in plane.lines:
                if line.name.startswith("Stream"):
                    spans += [(e.start_ns, e.start_ns + e.duration_ns) for e in line.events]
    return busy_span_ms(spans, calls)


def busy_span_ms(spans, calls: int) -> float | None:
    """Busy span per call (ms) from (start ns, end ns) device events of ``calls`` + 1 calls, the first untimed one
    left out; None when the events do not split evenly into calls (which ones were timed is then unclear)."""
    if not spans or calls < 1:
        return None
    spans = sorted(spans)
    per_call = len(spans) / (calls + TRACED_EXTRA)  # the untimed call runs the same events
    if not per_call.is_integer():
        return None
    timed = spans[int(per_call) * TRACED_EXTRA :]
    return (max(end for _, end in timed) - timed[0][0]) / 1e6 / calls


def _kind(event) -> str:
    """The kind of a device-stream event, read from its name: reading its stats (``dict(event.stats)``) aborted the
    process on the H200 (jax 0.11.2) for some events, so the stats are not touched on the device plane."""
    name = event.name
    if name.startswith("Memset"):
        return "memset"
    if name.startswith(("Memcpy", "MemcpyH2D", "MemcpyD2H", "MemcpyD2D")):
        return "memcpy"
    if "graph" in name.lower() and "cudnn" not in name.lower():
        return "graph"
    return "kernel"


def _outermost_ops(line_events):
    """(event, duration ns) of the XLA ops (events with an ``hlo_op`` stat) not nested in another op of the line."""
    ops = sorted((e for e in line_events if "hlo_op" in dict(e.stats)), key=lambda e: (e.start_ns, -e.duration_ns))
    end = -math.inf
    for e in ops:
        if e.start_ns >= end:
            end = e.start_ns + e.duration_ns
            yield e, float(e.duration_ns)


def kernel_table(evts, repeats: int) -> list[Kernel]:
    """Per-call rows from (name, kind, duration ns) events of ``repeats`` calls, longest first."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; got {repeats}.")
    total: dict[tuple[str, str], list[float]] = {}
    for name, kind, ns in evts:
        row = total.setdefault((name, kind), [0.0, 0])
        row[0] += ns
        row[1] += 1
    rows = [Kernel(name, ns / 1e3 / repeats, n / repeats, kind) for (name, kind), (ns, n) in total.items()]
    return sorted(rows, key=lambda r: -r.device_us)


def device_kernels(fn, *args, repeats: int = 10, compiled=None) -> list[Kernel]:
    """Profile ``repeats`` calls of ``fn(*args)`` (jitted here, or ``compiled``): one row per kernel name with its
    device µs per call and launches per call. On a CPU the rows are host XLA ops, ``kind`` "host op" (no device
    plane exists there). A GPU trace without a device plane (CUPTI unavailable) raises ``RuntimeError``."""
    return device_profile(fn, *args, repeats=repeats, compiled=compiled)[0]


def device_profile(fn, *args, repeats: int = 10, compiled=None) -> tuple[list[Kernel], float, float | None]:
    """(:func:`device_kernels`' rows, the host time per call of the ``repeats`` timed calls in ms, the device's busy
    span per call of the same calls in ms — None without a device plane). The kernel table averages over every
    traced call: the timed ones and the untimed one before them, which does the same work."""
    compiled = compiled or jax.jit(fn).lower(*args).compile()
    wall: list[float] = []
    with tempfile.TemporaryDirectory(prefix="attention-profile-") as tmp:
        path = trace(compiled, args, repeats=repeats, log_dir=tmp, wall_ms=wall)
        evts, where = events(path)
        span = device_span_ms(path, repeats) if where == "device" else None
    if where == "host" and jax.default_backend() == "gpu":
        raise RuntimeError("the profile holds no /device:GPU plane: CUPTI could not trace this GPU (permissions?)")
    # the trace holds repeats + TRACED_EXTRA calls (the untimed one starts the profiler up): per call of them all
    return kernel_table(evts, repeats + TRACED_EXTRA), wall[0], span


def device_ms(kernels) -> float:
    """Summed time per call in ms of the device work (kernels, copies, memsets) — or of the host ops on a CPU."""
    return sum(k.device_us for k in kernels if k.kind in (*DEVICE_KINDS, HOST_KIND)) / 1e3


def compare(
    t: Timing, kernels, *, profiled_calls: int, traced_wall_ms: float | None = None, device_span_ms: float | None = None
) -> dict:
    """Record fields: the pipelined timing beside the summed profiled time per call, their ratio and the dispatch
    overhead. ``device_ratio`` = pipelined median / summed time (1: they agree; above 1: time the kernels do not
    account for, such as gaps between them); ``time_source`` says whether the sum is device ("device") or host
    ("host") time. With the profiled calls' own host time (``traced_wall_ms``) and the span of their device work
    (``device_span_ms``, first start to last end), ``span_ratio`` = host / span and, through :func:`same_calls_ratio`
    and :func:`occupancy`, host time against summed kernel time on the very same calls."""
    summed = device_ms(kernels)
    host = any(k.kind == HOST_KIND for k in kernels)
    span_ok = traced_wall_ms is not None and device_span_ms
    return {
        "median_ms": t.median_ms,
        "p10_ms": t.p10_ms,
        "p90_ms": t.p90_ms,
        "single_call_ms": t.single_call_ms,
        "dispatch_ms": t.dispatch_ms,
        "repeats": t.repeats,
        "inner": t.inner,
        "device_ms": summed,
        "device_ratio": t.median_ms / summed if summed > 0 else None,
        "traced_wall_ms": traced_wall_ms,
        "device_span_ms": device_span_ms,
        "span_ratio": traced_wall_ms / device_span_ms if span_ok else None,  # type: ignore[operator]
        "time_source": "host" if host else "device",
        "profiled_calls": profiled_calls,
        "kernels": [
            {"name": k.name[:200], "us": k.device_us, "count": k.count, "kind": k.kind}
            for k in kernels[:RECORD_KERNELS]
        ],
    }


def compare_with_timing(fn, *args, profiled_calls: int = 50, compiled=None, **timing) -> dict:
    """Profile ``profiled_calls`` calls of ``fn(*args)`` and time it with ``time_fn`` (``timing`` are its options,
    ``repeats`` among them); the comparison of :func:`compare`, plus ``compile_s``."""
    compile_s = 0.0
    if compiled is None:
        t0 = time.perf_counter()
        compiled = jax.jit(fn).lower(*args).compile()
        compile_s = time.perf_counter() - t0
    t = time_fn(fn, *args, compiled=compiled, **timing)
    kernels, wall, span = device_profile(fn, *args, repeats=profiled_calls, compiled=compiled)
    fields = compare(t, kernels, profiled_calls=profiled_calls, traced_wall_ms=wall, device_span_ms=span)
    return {**fields, "compile_s": compile_s}


def same_calls_ratio(rec: dict) -> float | None:
    """Host time / summed kernel time of the same profiled calls (no clock change between two runs in it); None
    where the record lacks the profiled calls' host time."""
    wall, summed = rec.get("traced_wall_ms"), rec.get("device_ms")
    return wall / summed if wall and summed else None


def occupancy(rec: dict) -> float | None:
    """The share of the profiled calls' device span (first start to last end) that kernels ran: below 1, the GPU sat
    idle between kernels. None without a span."""
    span, summed = rec.get("device_span_ms"), rec.get("device_ms")
    return summed / span if span and summed else None


def agreement_pct(rec: dict) -> float | None:
    """How far the host time is from the summed kernel time, in % of the latter: of the same profiled calls where
    the record has their host time (:func:`same_calls_ratio`), else the pipelined median of a separate run against
    the summed time (``device_ratio``); None without either."""
    ratio = same_calls_ratio(rec) or rec.get("device_ratio")
    return None if ratio is None else 100 * abs(ratio - 1)


PROFILED_IMPLS = ("cudnn", "xla", "mosaic", "pallas", "blockwise", "te")


def profile_records(
    impls=PROFILED_IMPLS,
    *,
    batch=4,
    seq=4096,
    heads=16,
    head_dim=128,
    dtype="bfloat16",
    causal=(False, True),
    peak_tflops: float | None = None,
    profiled_calls: int = 50,
    seed: int = 0,
    **timing,
) -> list[dict]:
    """One record per implementation and mask at one shape (B, T = S, N = K, H): the timing and TFLOP/s of
    :func:`~attention_tutorial.measure.sweep.timed_record` plus the fields of :func:`compare`. Unsupported or
    failing points become records with the reason, as in a sweep; ``timing`` goes to ``time_fn``."""
    records = []
    for name in impls:
        for c in causal:
            point = Point(name, batch, seq, seq, heads, heads, head_dim, dtype, c)
            records.append(_profile_point(point, peak_tflops, profiled_calls, seed, timing))
    return records


def _profile_point(point: Point, peak_tflops, profiled_calls, seed, timing) -> dict:
    rec = empty_record(point)
    impl = registry.get(point.impl)
    reason = impl.why_not(point.shape, jnp.dtype(point.dtype), point.causal)
    if reason:
        return {**rec, "status": "unsupported", "reason": reason}
    try:
        q, k, v = make_qkv(point.batch, point.seq_q, point.heads, point.head_dim, dtype=point.dtype, seed=seed)

        def fn(q, k, v):
            return impl.fn(q, k, v, is_causal=point.causal)

        fields = compare_with_timing(fn, q, k, v, profiled_calls=profiled_calls, **timing)
    except Exception as err:
        return {**rec, **failure_fields(err)}
    finally:
        q = k = v = None  # free device memory before the next point
    t = Timing(
        fields["median_ms"],
        fields["p10_ms"],
        fields["p90_ms"],
        fields["repeats"],
        fields["inner"],
        fields["compile_s"],
        fields["single_call_ms"],
    )
    flops = attention_flops(point.batch, point.seq_q, point.seq_kv, point.heads, point.head_dim, causal=point.causal)
    return timed_record(rec, t, flops=flops, peak_tflops=peak_tflops, **fields)


def kernel_rows(records, top: int = 3) -> list[dict]:
    """The ``top`` longest kernels (or host ops) of each ok record, as table cells."""
    return [
        {
            "impl": r["impl"],
            "causal": r["causal"],
            "kernel or op": _short(k["name"]),
            "kind": k["kind"],
            "µs per call": f"{k['us']:.4g}" if k["us"] < 1e4 else f"{k['us']:.0f}",
            "launches per call": f"{k['count']:.3g}",
        }
        for r in records
        if r.get("status") == "ok"
        for k in r.get("kernels", [])[:top]
    ]


def _short(name: str, width: int = 110) -> str:  # cuDNN's kernel names differ only past character 100
    return name if len(name) <= width else name[: width - 1] + "…"


# Reading two profiled records side by side: which kernel did the work, and what else each call launched.


def main_kernel(rec: dict) -> dict | None:
    """The longest entry of kind "kernel" in a record's profiled list (the attention kernel); None without one."""
    kernels = [k for k in rec.get("kernels") or [] if k.get("kind") == "kernel"]
    return max(kernels, key=lambda k: k["us"]) if kernels else None


def same_kernel(rec_a: dict, rec_b: dict) -> bool | None:
    """Whether two records' main kernels are the very same one: identical full names as recorded (cut at 200
    characters by :func:`compare`, so two names that long are not told apart); None when either lists no kernel."""
    a, b = main_kernel(rec_a), main_kernel(rec_b)
    return None if a is None or b is None else a["name"] == b["name"]


def extra_kernels(rec: dict) -> list[dict]:
    """Everything a record's profile lists besides its main kernel: kernels, memsets and copies, longest first."""
    main = main_kernel(rec)
    return [k for k in rec.get("kernels") or [] if k is not main and k.get("kind") in DEVICE_KINDS]


def listed_all(rec: dict, rel: float = 1e-3) -> bool:
    """Whether the record's kernel list sums to its summed device time (it keeps only the RECORD_KERNELS longest)."""
    listed = sum(k["us"] for k in rec.get("kernels") or [] if k.get("kind") in DEVICE_KINDS) / 1e3
    return rec.get("device_ms") is not None and abs(listed - rec["device_ms"]) <= rel * rec["device_ms"]
