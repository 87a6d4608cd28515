"""What the timing page needs: the calls it timed, summarised; dispatch against the call; host time against the
profiler's device time. Numbers and verdicts only: the sentences are in ``docs/timing.md``.

Shapes of the data: :class:`CallTimes` holds every timed call of one function in the order
:func:`~attention_tutorial.measure.timing_lesson.five_ways` ran them (live, or recorded on the GPU:
:func:`recorded_calls`); :func:`summarize_calls` reduces it to the numbers the page quotes and :func:`calls_figure`
draws it. The profiler part reads ``device_time`` records
(:func:`attention_tutorial.measure.profile.profile_records`).
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

from ..measure import profile
from ..measure.timing import summarize
from ..results.plotting import PALETTE

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

    ``spread_pct``: the p10–p90 range as a % of the median; ``slowest_over_median``: the slowest sample against the
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


#: The phases of :func:`calls_figure`, in the order they run: (label, colour).
PHASES = (
    ("compile (once)", PALETTE[7]),
    ("warm-up calls, each waited for", PALETTE[1]),
    ("clock read without waiting", PALETTE[4]),
    ("single calls, each waited for", PALETTE[0]),
    ("pipelined samples (per call)", PALETTE[3]),
)


def calls_figure(times: CallTimes, *, title: str = ""):
    """Every timed call in the order it ran, on a log scale: the compilation, the warm-up calls, the unwaited clock,
    single waited calls and the pipelined samples, with the samples' median and p10–p90 band. One point per call
    (per sample for the pipelined ones); returns the figure."""
    s = summarize_calls(times)
    groups = [(times.compile_s * 1e3,), times.warmup_ms, (times.no_wait_ms,), times.waited_ms, times.samples_ms]
    fig, ax = plt.subplots(figsize=(7.0, 3.8), facecolor="white", layout="constrained")
    ax.set_facecolor("white")
    start = 0
    for (name, colour), ys in zip(PHASES, groups):
        xs = np.arange(start, start + len(ys))
        ax.plot(xs, np.maximum(ys, 1e-4), "o", color=colour, label=name, markersize=5)
        start += len(ys)
    first = start - len(times.samples_ms)
    ax.fill_between([first - 0.5, start - 0.5], s.p10_ms, s.p90_ms, color=PHASES[4][1], alpha=0.15, linewidth=0,
                    label=f"p10–p90 of the samples ({s.p10_ms:.3g}–{s.p90_ms:.3g} ms)")  # fmt: skip
    ax.hlines(s.median_ms, first, start - 1, color=PHASES[4][1], linewidth=1.5,
              label=f"median of the samples ({s.median_ms:.3g} ms)")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("call (in the order they ran)")
    ax.set_ylabel("milliseconds (log scale)")
    ax.grid(True, which="major", color="#dddddd", linewidth=0.8)
    if title:
        ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=True, facecolor="white")
    return fig


@dataclass(frozen=True)
class DispatchShare:
    """Of ``ok`` timed records, in how many the host's dispatch (a waited call minus a pipelined one) took longer
    than the pipelined call itself (``over``), and the largest dispatch / call ratio among them."""

    over: int
    ok: int
    largest_ratio: float | None


def dispatch_share(records) -> DispatchShare:
    """:class:`DispatchShare` of ``records`` (records with ``dispatch_ms`` and ``median_ms``)."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("dispatch_ms") is not None and r.get("median_ms")]
    ratios = [r["dispatch_ms"] / r["median_ms"] for r in ok]
    return DispatchShare(sum(x > 1 for x in ratios), len(ok), max(ratios) if ratios else None)


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
    """A profiled record as table cells: the pipelined median and its p10–p90, the summed profile, their ratio,
    the host / kernel time of the same profiled calls, the GPU's busy share, the dispatch ('–' where not
    measured)."""

    def fmt(v, spec):
        return "–" if v is None else format(v, spec)

    ratio, busy = profile.same_calls_ratio(rec), profile.occupancy(rec)
    return {
        "impl": rec["impl"], "causal": rec["causal"], "status": rec["status"],
        "pipelined ms (p10–p90)": "–" if rec.get("median_ms") is None else
        f"{rec['median_ms']:.4g} ({rec['p10_ms']:.4g}–{rec['p90_ms']:.4g})",
        "summed profile (ms)": fmt(rec.get("device_ms"), ".4g"),
        "pipelined / summed": fmt(rec.get("device_ratio"), ".3f"),
        "profiled calls: host / kernels (ms)":
            "–" if ratio is None else f"{rec['traced_wall_ms']:.4g} / {rec['device_ms']:.4g} = {ratio:.3f}",
        "GPU busy": "–" if busy is None else f"{100 * busy:.0f} %",
        "dispatch (ms)": fmt(rec.get("dispatch_ms"), ".3g"), "reason": rec.get("reason"),
    }  # fmt: skip


DEVICE_COLUMNS = ("impl", "causal", "status", "pipelined ms (p10–p90)", "summed profile (ms)", "pipelined / summed",
                  "profiled calls: host / kernels (ms)", "GPU busy", "dispatch (ms)", "reason")  # fmt: skip
