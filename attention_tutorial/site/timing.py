"""What the timing page needs: the calls it timed, summarised; dispatch against the call; host time against the
profiler's device time. Numbers and verdicts only: the sentences are in ``docs/timing.md``.

Shapes of the data: :class:`CallTimes` holds every timed call of one function in the order
:func:`~attention_tutorial.measure.timing_lesson.five_ways` ran them (live, or recorded on the GPU:
:func:`recorded_calls`); :func:`summarize_calls` reduces it to the numbers the page quotes, :func:`one_stall` says
what a single stalled sample would do to its mean and median, and :func:`calls_figure` draws it. At the codelab's
shape :func:`dispatch_share` and :func:`versus` read the ``seed_shape`` records. The profiler part reads
``device_time`` records (:func:`attention_tutorial.measure.profile.profile_records`): :func:`agreement`,
:func:`host_kernel_rows`, :func:`device_row`. :func:`five_ways_listing` is the timing code as the page prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

from ..measure import profile
from ..measure.timing import summarize
from ..measure.timing_lesson import five_ways
from ..results.plotting import PALETTE, label
from .claims import compare
from .pallas_kernels import listing

EARLY = 0.5  # an unwaited clock below this share of a waited call: the call returned before its result was ready
AGREE_PCT = 3.0  # the target: host (pipelined) and device time agree within this, for calls of MIN_MS or more
MIN_MS = 1.0


@dataclass(frozen=True)
class CallTimes:
    """Every timed call of one function, in the order they ran: milliseconds, compile in seconds.

    ``warmup_ms``: the first calls after compiling, each waited for (the first pays first-call costs);
    ``no_wait_ms``: one call whose clock stopped before its result was ready; ``waited_ms``: single calls, each
    waited for; ``samples_ms``: the per-call time of each pipelined sample (``inner`` calls queued, one wait)."""

    compile_s: float
    warmup_ms: tuple[float, ...]
    no_wait_ms: float
    waited_ms: tuple[float, ...]
    samples_ms: tuple[float, ...]
    inner: int

    def __post_init__(self):
        for name in ("warmup_ms", "waited_ms", "samples_ms"):
            values = getattr(self, name)
            if not values or any(not np.isfinite(v) or v < 0 for v in values):
                raise ValueError(f"CallTimes.{name} needs at least one finite time >= 0; got {values!r}.")
        if self.inner < 1:
            raise ValueError(f"CallTimes.inner must be >= 1; got {self.inner}.")

    @classmethod
    def from_record(cls, rec: dict) -> CallTimes:
        """The times of one :func:`~attention_tutorial.measure.timing_lesson.five_ways` result (a dict, live or as
        the recorder keeps it)."""
        missing = [f for f in ("compile_s", "warmup_ms", "no_wait_ms", "waited_ms", "samples_ms", "inner")
                   if f not in rec]  # fmt: skip
        if missing:
            raise ValueError(f"CallTimes.from_record needs a five_ways result; it lacks {', '.join(missing)}.")
        return cls(rec["compile_s"], tuple(rec["warmup_ms"]), rec["no_wait_ms"], tuple(rec["waited_ms"]),
                   tuple(rec["samples_ms"]), rec["inner"])  # fmt: skip


@dataclass(frozen=True)
class CallSummary:
    """What the page says about one :class:`CallTimes`.

    ``spread_pct``: the p10–p90 range as a % of the median; ``mean_ms``: the samples' mean; ``slowest_over_median``: the slowest sample against the
    median; ``mean_over_median``: how far one slow sample pulls the
    mean; ``no_wait_pct``: the unwaited clock as a % of a waited call; ``compile_calls``: how many pipelined calls
    the compilation would have paid for; ``first_over_median``: the first call after compiling against a pipelined
    one; ``dispatch_ms``: a waited call minus a pipelined one (>= 0), the host's share of a call that waits;
    ``returned_early``: whether the unwaited clock read less than :data:`EARLY` of a waited call (the call returned
    before its result was ready: asynchronous dispatch), else dispatch was effectively synchronous."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    spread_pct: float
    mean_ms: float
    slowest_over_median: float
    mean_over_median: float
    no_wait_pct: float
    compile_calls: float
    first_over_median: float
    waited_ms: float
    dispatch_ms: float
    samples: int
    returned_early: bool


def summarize_calls(times: CallTimes) -> CallSummary:
    """The numbers the page quotes about ``times``."""
    median, p10, p90 = summarize(times.samples_ms)
    waited = summarize(times.waited_ms)[0]
    return CallSummary(
        median_ms=median,
        p10_ms=p10,
        p90_ms=p90,
        spread_pct=100 * (p90 - p10) / median,
        mean_ms=float(np.mean(times.samples_ms)),
        slowest_over_median=max(times.samples_ms) / median,
        mean_over_median=float(np.mean(times.samples_ms)) / median,
        no_wait_pct=100 * times.no_wait_ms / waited,
        compile_calls=times.compile_s * 1e3 / median,
        first_over_median=times.warmup_ms[0] / median,
        waited_ms=waited,
        dispatch_ms=max(waited - median, 0.0),
        samples=len(times.samples_ms),
        returned_early=times.no_wait_ms < EARLY * waited,
    )


def recorded_calls(provenance: dict | None) -> tuple[CallTimes, dict] | None:
    """(times, record) of the five-way timing the recorder kept in a result file's provenance (``lessons["timing"]``,
    from ``record --extras timing_lesson``); None where the file has none."""
    rec = ((provenance or {}).get("lessons") or {}).get("timing")
    return (CallTimes.from_record(rec), rec) if rec else None


@dataclass(frozen=True)
class Stall:
    """The samples' mean and median as measured (``mean_ms``, ``median_ms``) and with one sample replaced by a stall
    of ``factor`` times the median (``stalled_mean_ms``, ``stalled_median_ms``): what one garbage-collection pause or
    one burst of another process would do to each."""

    factor: float
    mean_ms: float
    median_ms: float
    stalled_mean_ms: float
    stalled_median_ms: float

    @property
    def mean_rise_pct(self) -> float:
        return 100 * (self.stalled_mean_ms / self.mean_ms - 1)

    @property
    def median_rise_pct(self) -> float:
        return 100 * (self.stalled_median_ms / self.median_ms - 1)


def one_stall(times: CallTimes, factor: float = 10.0) -> Stall:
    """:class:`Stall` of ``times``' pipelined samples, its last sample replaced by ``factor`` times their median."""
    if factor <= 0:
        raise ValueError(f"one_stall needs a factor > 0; got {factor}.")
    samples = np.asarray(times.samples_ms, dtype=float)
    median = float(np.median(samples))
    stalled = np.concatenate([samples[:-1], [factor * median]])
    return Stall(factor, float(np.mean(samples)), median, float(np.mean(stalled)), float(np.median(stalled)))


def five_ways_listing() -> str:
    """The source of :func:`~attention_tutorial.measure.timing_lesson.five_ways` as the page prints it: without the
    statements that only check its arguments (those calling ``check_int``), so the five numbered steps stand out."""
    import ast

    source = listing(five_ways)
    (fn,) = ast.parse(source).body
    checks = [stmt for stmt in fn.body
              if any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "check_int" for n in ast.walk(stmt))]  # fmt: skip
    drop = {line for stmt in checks for line in range(stmt.lineno, stmt.end_lineno + 1)}
    return "\n".join(line for i, line in enumerate(source.splitlines(), 1) if i not in drop) + "\n"


#: The calls :func:`calls_figure` draws, in the order they ran: (label, colour). The compilation is not a call: the
#: page states its time in words.
PHASES = (
    ("warm-up calls, each waited for", PALETTE[1]),
    ("clock read without waiting", PALETTE[4]),
    ("single calls, each waited for", PALETTE[0]),
    ("pipelined samples (per call)", PALETTE[3]),
)


def calls_figure(times: CallTimes, *, title: str = ""):
    """Every timed call in the order it ran, on linear axes, in two panels: left, every call from zero (the warm-up
    calls, the unwaited clock, the single waited calls, the pipelined samples: one point per call, per sample for
    the pipelined ones); right, the same waited calls and samples zoomed in, with the samples' median and p10–p90
    band, so the gap between a waited and a pipelined call and the samples' spread can be read. Returns the
    figure."""
    s = summarize_calls(times)
    groups = [times.warmup_ms, (times.no_wait_ms,), times.waited_ms, times.samples_ms]
    fig, (full, zoom) = plt.subplots(1, 2, figsize=(9.0, 3.9), facecolor="white", layout="constrained",
                                     gridspec_kw={"width_ratios": (3, 2)})  # fmt: skip
    starts = np.cumsum([0, *map(len, groups)])
    for ax, shown in ((full, range(4)), (zoom, (2, 3))):
        ax.set_facecolor("white")
        for i in shown:
            name, colour = PHASES[i]
            ax.plot(np.arange(starts[i], starts[i + 1]), groups[i], "o", color=colour, label=name, markersize=5)
        first, end = starts[3], starts[4]
        ax.fill_between([first - 0.5, end - 0.5], s.p10_ms, s.p90_ms, color=PHASES[3][1], alpha=0.18, linewidth=0,
                        label="p10–p90 of the samples")  # fmt: skip
        ax.hlines(s.median_ms, first - 0.5, end - 0.5, color=PHASES[3][1], linewidth=1.5,
                  label="median of the samples")  # fmt: skip
        ax.grid(True, color="#dddddd", linewidth=0.8)
        ax.set_xlabel("call, in the order they ran")
    full.set_ylim(0, 1.08 * max(max(g) for g in groups))
    full.set_ylabel("milliseconds per call")
    full.set_title("every call, from zero", fontsize=10)
    shown = [*times.waited_ms, *times.samples_ms]
    pad = 0.15 * (max(shown) - min(shown)) or 0.01 * max(shown)
    zoom.set_ylim(min(shown) - pad, max(shown) + pad)
    zoom.set_xlim(starts[2] - 1, starts[4])
    zoom.set_title("waited and pipelined calls, zoomed in", fontsize=10)
    if title:
        fig.suptitle(title, fontsize=11)
    handles, labels = full.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    return fig


@dataclass(frozen=True)
class Slow:
    """One timed record whose dispatch took longer than the call: implementation, dtype, dispatch and call (ms)."""

    impl: str | None
    dtype: str | None
    dispatch_ms: float
    call_ms: float

    @property
    def ratio(self) -> float:
        return self.dispatch_ms / self.call_ms


@dataclass(frozen=True)
class DispatchShare:
    """Of ``ok`` timed records, in how many the host's dispatch (a waited call minus a pipelined one) took longer
    than the pipelined call itself (``over``), the largest dispatch / call ratio among them, and those records
    (``slow``, :class:`Slow`, largest ratio first)."""

    over: int
    ok: int
    largest_ratio: float | None
    slow: tuple[Slow, ...] = ()


def dispatch_share(records) -> DispatchShare:
    """:class:`DispatchShare` of ``records`` (records with ``dispatch_ms`` and ``median_ms``)."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("dispatch_ms") is not None and r.get("median_ms")]
    ratios = [r["dispatch_ms"] / r["median_ms"] for r in ok]
    slow = sorted((Slow(r.get("impl"), r.get("dtype"), r["dispatch_ms"], r["median_ms"]) for r in ok
                   if r["dispatch_ms"] > r["median_ms"]), key=lambda x: -x.ratio)  # fmt: skip
    return DispatchShare(len(slow), len(ok), max(ratios) if ratios else None, tuple(slow))


@dataclass(frozen=True)
class Versus:
    """A against B at one point: their pipelined medians (ms) and the word of
    :func:`~attention_tutorial.site.claims.compare` ("faster", "slower", "on par"), about A."""

    a_ms: float
    b_ms: float
    word: str


def versus(records, a: str = "cudnn", b: str = "xla", **where) -> Versus | None:
    """:class:`Versus` of implementations ``a`` and ``b`` among ``records`` (ok ones, filtered by ``where``, say
    ``dtype="bfloat16"``); None where either has no ok record."""

    def pick(impl):
        return [r for r in records if r.get("impl") == impl and r.get("status") == "ok" and r.get("median_ms")
                and all(r.get(k) == v for k, v in where.items())]  # fmt: skip

    ra, rb = pick(a), pick(b)
    if not (ra and rb):
        return None
    claim = compare(ra, rb)
    return Versus(float(np.median([r["median_ms"] for r in ra])), float(np.median([r["median_ms"] for r in rb])),
                  claim.word)  # fmt: skip


def count_word(n: float) -> str:
    """A count in words of its size: "a few" (< 10), "dozens" (< 100), "hundreds" (< 1,000), else "thousands"."""
    return "a few" if n < 10 else "dozens" if n < 100 else "hundreds" if n < 1000 else "thousands"


@dataclass(frozen=True)
class Outlier:
    """A profiled call whose host time lies outside the target of its summed kernel time: by how much (%), the share
    of its device span the GPU sat idle between kernels, and its launches per call (``at_least``: the record lists
    only its longest kernels, so there may be more)."""

    impl: str
    causal: bool
    gap_pct: float
    idle: float | None
    launches: float
    at_least: bool


@dataclass(frozen=True)
class Agreement:
    """Host time against the profiler's device time over profiled records (``device_time`` records).

    ``long``: the calls with ``MIN_MS`` or more of device work; ``worst_pct``: the largest gap between the host
    time and the summed kernel time among them (of the very same profiled calls where the records have it:
    ``same_calls``), at ``worst_impl``/``worst_causal``; ``within``: whether every one is inside ``AGREE_PCT``;
    ``inside``: how many of them are within it, the largest gap among those ``inside_pct``, and the ``outliers``;
    ``busy``: the (lowest, highest) share of the calls' device span the kernels ran; ``separate``: the (lowest,
    highest) summed kernel time as a share of the pipelined median of a separate timing run; ``short``: how many
    shorter calls, with their (lowest, highest) pipelined / summed ratio; ``source``: "device" (GPU kernels) or
    "host" (XLA ops on a CPU's threads)."""

    long: int
    worst_pct: float | None
    worst_impl: str | None
    worst_causal: bool | None
    within: bool
    same_calls: bool
    busy: tuple[float, float] | None
    separate: tuple[float, float] | None
    short: int
    short_ratio: tuple[float, float] | None
    source: str | None
    inside: int = 0
    inside_pct: float | None = None
    outliers: tuple = ()


def agreement(records, *, within: float = AGREE_PCT, min_ms: float = MIN_MS) -> Agreement:
    """How far host and device time are apart in ``records``, as :class:`Agreement`."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("device_ratio") is not None]
    source = ok[0].get("time_source") if ok else None
    long = [r for r in ok if r.get("time_source") == "device" and r["device_ms"] >= min_ms]
    shorter = [r["device_ratio"] for r in ok if r not in long]

    def span(xs):
        return (min(xs), max(xs)) if xs else None

    if not long:
        return Agreement(0, None, None, None, False, False, None, None, len(shorter), span(shorter), source)
    same = all(profile.same_calls_ratio(r) is not None for r in long)
    gap = profile.agreement_pct if same else (lambda r: 100 * abs(r["device_ratio"] - 1))
    worst = max(long, key=gap)
    busy = [b for r in long if (b := profile.occupancy(r)) is not None]
    inside = [gap(r) for r in long if gap(r) <= within]
    outliers = tuple(
        Outlier(r["impl"], r["causal"], gap(r), None if (o := profile.occupancy(r)) is None else 1 - o,
                sum(k["count"] for k in r.get("kernels") or [] if k.get("kind") in profile.DEVICE_KINDS),
                not profile.listed_all(r))
        for r in long if gap(r) > within
    )  # fmt: skip
    return Agreement(
        long=len(long),
        worst_pct=gap(worst),
        worst_impl=worst["impl"],
        worst_causal=worst["causal"],
        within=all(gap(r) <= within for r in long),
        same_calls=same,
        busy=span(busy),
        separate=span([1 / r["device_ratio"] for r in long]),
        short=len(shorter),
        short_ratio=span(shorter),
        source=source,
        inside=len(inside),
        inside_pct=max(inside) if inside else None,
        outliers=outliers,
    )


def device_row(rec: dict) -> dict:
    """A profiled record as table cells: the pipelined median and its p10–p90, the kernels summed, their ratio,
    the host / kernel time of the same profiled calls, the GPU's busy share, the dispatch ('–' where not
    measured)."""

    def fmt(v, spec):
        return "–" if v is None else format(v, spec)

    ratio, busy = profile.same_calls_ratio(rec), profile.occupancy(rec)
    return {
        "impl": rec["impl"], "causal": rec["causal"], "status": rec["status"],
        "pipelined ms (p10–p90)": "–" if rec.get("median_ms") is None else
        f"{rec['median_ms']:.4g} ({rec['p10_ms']:.4g}–{rec['p90_ms']:.4g})",
        "kernels summed (ms)": fmt(rec.get("device_ms"), ".4g"),
        "pipelined / kernels": fmt(rec.get("device_ratio"), ".3f"),
        "host clock / kernels (ms)":
            "–" if ratio is None else f"{rec['traced_wall_ms']:.4g} / {rec['device_ms']:.4g} = {ratio:.3f}",
        "GPU busy": "–" if busy is None else f"{100 * busy:.0f} %",
        "dispatch (ms)": fmt(rec.get("dispatch_ms"), ".3g"), "reason": rec.get("reason"),
    }  # fmt: skip


DEVICE_COLUMNS = ("impl", "causal", "status", "pipelined ms (p10–p90)", "kernels summed (ms)",
                  "pipelined / kernels", "host clock / kernels (ms)", "GPU busy", "dispatch (ms)", "reason")  # fmt: skip


#: The columns of :func:`host_kernel_rows`, as the page's open table shows them.
HOST_KERNEL_COLUMNS = ("implementation", "mask", "host clock (ms)", "kernels summed (ms)", "host / kernels",
                       "GPU busy")  # fmt: skip


def host_kernel_rows(records, *, min_ms: float = MIN_MS) -> list[dict]:
    """The profiled calls with ``min_ms`` or more of GPU work, as table cells (:data:`HOST_KERNEL_COLUMNS`): the host
    time per call of the calls inside the trace, the kernels' summed time per call, their ratio and the GPU's busy
    share, longest call first. Records without the traced calls' host time are left out."""
    long = [r for r in records if r.get("status") == "ok" and r.get("time_source") == "device"
            and (r.get("device_ms") or 0) >= min_ms and profile.same_calls_ratio(r) is not None]  # fmt: skip
    rows = []
    for r in sorted(long, key=lambda r: -r["device_ms"]):
        busy = profile.occupancy(r)
        rows.append({
            "implementation": label(r["impl"]), "mask": "causal" if r["causal"] else "none",
            "host clock (ms)": f"{r['traced_wall_ms']:.3f}", "kernels summed (ms)": f"{r['device_ms']:.3f}",
            "host / kernels": f"{profile.same_calls_ratio(r):.3f}",
            "GPU busy": "–" if busy is None else f"{100 * busy:.0f} %",
        })  # fmt: skip
    return rows
