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


class Kernel(NamedTuple):
    """One row of the table: a kernel (or host op) name, its time per call in µs, launches per call, and kind."""

    name: str
    device_us: float
    count: float
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


def trace(compiled, args, *, repeats: int, log_dir) -> Path:
    """Run ``compiled(*args)`` ``repeats`` times under the profiler; the path of the ``.xplane.pb`` written."""
    options = jax.profiler.ProfileOptions()
    if hasattr(options, "python_tracer_level"):
        options.python_tracer_level = 0  # Python frames are not what we measure; they only bloat the trace
    jax.block_until_ready(compiled(*args))  # warm: nothing of the first call's set-up lands in the trace
    with jax.profiler.trace(str(log_dir), profiler_options=options):
        out = None
        for _ in range(repeats):
            out = compiled(*args)
        jax.block_until_ready(out)
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
    compiled = compiled or jax.jit(fn).lower(*args).compile()
    with tempfile.TemporaryDirectory(prefix="attention-profile-") as tmp:
        evts, where = events(trace(compiled, args, repeats=repeats, log_dir=tmp))
    if where == "host" and jax.default_backend() == "gpu":
        raise RuntimeError("the profile holds no /device:GPU plane: CUPTI could not trace this GPU (permissions?)")
    return kernel_table(evts, repeats)


def device_ms(kernels) -> float:
    """Summed time per call in ms of the device work (kernels, copies, memsets) — or of the host ops on a CPU."""
    return sum(k.device_us for k in kernels if k.kind in (*DEVICE_KINDS, HOST_KIND)) / 1e3


def compare(t: Timing, kernels, *, profiled_calls: int) -> dict:
    """Record fields: the pipelined timing beside the summed profiled time per call, their ratio and the dispatch
    overhead. ``device_ratio`` = pipelined median / summed time (1: they agree; above 1: time the kernels do not
    account for); ``time_source`` says whether the sum is device ("device") or host ("host") time."""
    summed = device_ms(kernels)
    host = any(k.kind == HOST_KIND for k in kernels)
    return {
        "median_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms, "single_call_ms": t.single_call_ms,
        "dispatch_ms": t.dispatch_ms, "repeats": t.repeats, "inner": t.inner,
        "device_ms": summed, "device_ratio": t.median_ms / summed if summed > 0 else None,
        "time_source": "host" if host else "device", "profiled_calls": profiled_calls,
        "kernels": [{"name": k.name[:200], "us": k.device_us, "count": k.count, "kind": k.kind}
                    for k in kernels[:RECORD_KERNELS]],
    }  # fmt: skip


def compare_with_timing(fn, *args, profiled_calls: int = 50, compiled=None, **timing) -> dict:
    """Profile ``profiled_calls`` calls of ``fn(*args)`` and time it with ``time_fn`` (``timing`` are its options,
    ``repeats`` among them); the comparison of :func:`compare`, plus ``compile_s``."""
    compile_s = 0.0
    if compiled is None:
        t0 = time.perf_counter()
        compiled = jax.jit(fn).lower(*args).compile()
        compile_s = time.perf_counter() - t0
    t = time_fn(fn, *args, compiled=compiled, **timing)
    kernels = device_kernels(fn, *args, repeats=profiled_calls, compiled=compiled)
    return {**compare(t, kernels, profiled_calls=profiled_calls), "compile_s": compile_s}


def agreement_pct(rec: dict) -> float | None:
    """How far the pipelined time is from the summed device time, in % of the latter (None without a ratio)."""
    ratio = rec.get("device_ratio")
    return None if ratio is None else 100 * abs(ratio - 1)


PROFILED_IMPLS = ("cudnn", "xla", "mosaic", "pallas", "blockwise", "te")


def profile_records(impls=PROFILED_IMPLS, *, batch=4, seq=4096, heads=16, head_dim=128, dtype="bfloat16",
                    causal=(False, True), peak_tflops: float | None = None, profiled_calls: int = 50, seed: int = 0,
                    **timing) -> list[dict]:  # fmt: skip
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
    t = Timing(fields["median_ms"], fields["p10_ms"], fields["p90_ms"], fields["repeats"], fields["inner"],
               fields["compile_s"], fields["single_call_ms"])  # fmt: skip
    flops = attention_flops(point.batch, point.seq_q, point.seq_kv, point.heads, point.head_dim, causal=point.causal)
    return timed_record(rec, t, flops=flops, peak_tflops=peak_tflops, **fields)


AGREE_PCT = 3.0  # the target: pipelined and summed device time agree within this, for calls of MIN_MS or more
MIN_MS = 1.0


def summary_row(rec: dict) -> dict:
    """A record's comparison as table cells (readable keys, formatted numbers; '–' where not measured)."""

    def fmt(v, spec):
        return "–" if v is None else format(v, spec)

    src = {"device": "GPU kernels", "host": "host XLA ops (no device plane)"}.get(rec.get("time_source"), "–")
    return {
        "impl": rec["impl"], "causal": rec["causal"], "status": rec["status"],
        "pipelined median (ms)": fmt(rec.get("median_ms"), ".4g"),
        "p10–p90 (ms)": "–" if rec.get("p10_ms") is None else f"{rec['p10_ms']:.4g}–{rec['p90_ms']:.4g}",
        "summed profile (ms)": fmt(rec.get("device_ms"), ".4g"), "summed over": src,
        "pipelined / summed": fmt(rec.get("device_ratio"), ".3f"),
        "dispatch (ms)": fmt(rec.get("dispatch_ms"), ".3g"), "reason": rec.get("reason"),
    }  # fmt: skip


def kernel_rows(records, top: int = 3) -> list[dict]:
    """The ``top`` longest kernels (or host ops) of each ok record, as table cells."""
    return [
        {"impl": r["impl"], "causal": r["causal"], "kernel or op": _short(k["name"]), "kind": k["kind"],
         "µs per call": f"{k['us']:.4g}" if k["us"] < 1e4 else f"{k['us']:.0f}", "launches per call": f"{k['count']:.3g}"}
        for r in records if r.get("status") == "ok" for k in r.get("kernels", [])[:top]
    ]  # fmt: skip


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def agreement_sentence(records, *, within: float = AGREE_PCT, min_ms: float = MIN_MS) -> str:
    """What the records say about pipelined vs summed device time, worded from the data."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("device_ratio") is not None]
    long = [r for r in ok if r.get("time_source") == "device" and r["device_ms"] >= min_ms]
    if not ok:
        return "No call was profiled here."
    if not long:
        lo, hi = min(r["device_ratio"] for r in ok), max(r["device_ratio"] for r in ok)
        what = "host XLA op times (no device plane)" if ok[0]["time_source"] == "host" else "device time"
        return (f"No call here did {min_ms:g} ms or more of GPU work, so the {within:g} % agreement is not tested on "
                f"this build. The summed profile here is {what}; pipelined / summed ranges over "
                f"{lo:.2f}–{hi:.2f} for the {len(ok)} profiled calls.")  # fmt: skip
    worst = max(long, key=agreement_pct)
    pct = agreement_pct(worst)
    verdict = f"inside the {within:g} % target" if pct <= within else f"outside the {within:g} % target"
    mask = "causal" if worst["causal"] else "no mask"
    text = (f"For the {len(long)} calls with {min_ms:g} ms or more of GPU work, the pipelined median and the summed "
            f"kernel time agree within {pct:.1f} % ({verdict}; the largest gap: {worst['impl']}, {mask}).")  # fmt: skip
    short = [r["device_ratio"] for r in ok if r.get("time_source") == "device" and r["device_ms"] < min_ms]
    if short:
        text += (f" For the {len(short)} shorter calls, pipelined / summed ranges over "
                 f"{min(short):.2f}–{max(short):.2f}.")  # fmt: skip
    return text
