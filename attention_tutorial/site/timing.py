"""Figures and tables for the timing page. The page computes its numbers in its own cells, from
:func:`~attention_tutorial.measure.timing_lesson.five_ways`, :func:`~attention_tutorial.measure.timing.summarize`
and :mod:`~attention_tutorial.measure.profile`; the sentences are in ``docs/timing.md``.

:func:`five_ways_listing` is the timing code as the page prints it; :func:`calls_figure` draws every call of one
``five_ways`` result (live, or recorded on the GPU in a result file's provenance, ``lessons["timing"]``);
:func:`host_kernel_rows` and :func:`device_row` put ``device_time`` records
(:func:`~attention_tutorial.measure.profile.profile_records`) into table cells.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..measure import profile
from ..measure.timing import summarize
from ..measure.timing_lesson import five_ways
from ..results.plotting import PALETTE, label
from .pallas_kernels import listing

#: Where the page draws the line: calls with this much GPU work or more (ms) are compared clock against clock.
MIN_MS = 1.0


def five_ways_listing() -> str:
    """The source of :func:`~attention_tutorial.measure.timing_lesson.five_ways` as the page prints it: without the
    statements that only check its arguments (those calling ``check_int``), so the five numbered steps stand out."""
    import ast

    source = listing(five_ways)
    (fn,) = ast.parse(source).body
    checks = [
        stmt
        for stmt in fn.body
        if any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "check_int" for n in ast.walk(stmt))
    ]
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


def calls_figure(times: dict, *, title: str = ""):
    """Every timed call in the order it ran, on linear axes, in two panels: left, every call from zero (the warm-up
    calls, the unwaited clock, the single waited calls, the pipelined samples: one point per call, per sample for
    the pipelined ones); right, the same waited calls and samples zoomed in, with the samples' median and p10–p90
    band, so the gap between a waited and a pipelined call and the samples' spread can be read. ``times``: one
    :func:`~attention_tutorial.measure.timing_lesson.five_ways` result. Returns the figure."""
    median, p10, p90 = summarize(times["samples_ms"])
    groups = [times["warmup_ms"], (times["no_wait_ms"],), times["waited_ms"], times["samples_ms"]]
    fig, (full, zoom) = plt.subplots(
        1, 2, figsize=(9.0, 3.9), facecolor="white", layout="constrained", gridspec_kw={"width_ratios": (3, 2)}
    )
    starts = np.cumsum([0, *map(len, groups)])
    for ax, shown in ((full, range(4)), (zoom, (2, 3))):
        ax.set_facecolor("white")
        for i in shown:
            name, colour = PHASES[i]
            ax.plot(np.arange(starts[i], starts[i + 1]), groups[i], "o", color=colour, label=name, markersize=5)
        first, end = starts[3], starts[4]
        ax.fill_between(
            [first - 0.5, end - 0.5],
            p10,
            p90,
            color=PHASES[3][1],
            alpha=0.18,
            linewidth=0,
            label="p10–p90 of the samples",
        )
        ax.hlines(median, first - 0.5, end - 0.5, color=PHASES[3][1], linewidth=1.5, label="median of the samples")
        ax.grid(True, color="#dddddd", linewidth=0.8)
        ax.set_xlabel("call, in the order they ran")
    full.set_ylim(0, 1.08 * max(max(g) for g in groups))
    full.set_ylabel("milliseconds per call")
    full.set_title("every call, from zero", fontsize=10)
    shown = [*times["waited_ms"], *times["samples_ms"]]
    pad = 0.15 * (max(shown) - min(shown)) or 0.01 * max(shown)
    zoom.set_ylim(min(shown) - pad, max(shown) + pad)
    zoom.set_xlim(starts[2] - 1, starts[4])
    zoom.set_title("waited and pipelined calls, zoomed in", fontsize=10)
    if title:
        fig.suptitle(title, fontsize=11)
    handles, labels = full.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    return fig


def device_row(rec: dict) -> dict:
    """A profiled record as table cells: the pipelined median and its p10–p90, the kernels summed, their ratio,
    the host / kernel time of the same profiled calls, the GPU's busy share, the dispatch ('–' where not
    measured)."""

    def fmt(v, spec):
        return "–" if v is None else format(v, spec)

    ratio, busy = profile.same_calls_ratio(rec), profile.occupancy(rec)
    return {
        "impl": rec["impl"],
        "causal": rec["causal"],
        "status": rec["status"],
        "pipelined ms (p10–p90)": "–"
        if rec.get("median_ms") is None
        else f"{rec['median_ms']:.4g} ({rec['p10_ms']:.4g}–{rec['p90_ms']:.4g})",
        "kernels summed (ms)": fmt(rec.get("device_ms"), ".4g"),
        "pipelined / kernels": fmt(rec.get("device_ratio"), ".3f"),
        "host clock / kernels (ms)": "–"
        if ratio is None
        else f"{rec['traced_wall_ms']:.4g} / {rec['device_ms']:.4g} = {ratio:.3f}",
        "GPU busy": "–" if busy is None else f"{100 * busy:.0f} %",
        "dispatch (ms)": fmt(rec.get("dispatch_ms"), ".3g"),
        "reason": rec.get("reason"),
    }


DEVICE_COLUMNS = (
    "impl",
    "causal",
    "status",
    "pipelined ms (p10–p90)",
    "kernels summed (ms)",
    "pipelined / kernels",
    "host clock / kernels (ms)",
    "GPU busy",
    "dispatch (ms)",
    "reason",
)


#: The columns of :func:`host_kernel_rows`, as the page's open table shows them.
HOST_KERNEL_COLUMNS = ("implementation", "mask", "host clock (ms)", "kernels summed (ms)", "host / kernels", "GPU busy")


def host_kernel_rows(records, *, min_ms: float = MIN_MS) -> list[dict]:
    """The profiled calls with ``min_ms`` or more of GPU work, as table cells (:data:`HOST_KERNEL_COLUMNS`): the host
    time per call of the calls inside the trace, the kernels' summed time per call, their ratio and the GPU's busy
    share, longest call first. Records without the traced calls' host time are left out."""
    long = [
        r
        for r in records
        if r.get("status") == "ok"
        and r.get("time_source") == "device"
        and (r.get("device_ms") or 0) >= min_ms
        and profile.same_calls_ratio(r) is not None
    ]
    rows = []
    for r in sorted(long, key=lambda r: -r["device_ms"]):
        busy = profile.occupancy(r)
        rows.append(
            {
                "implementation": label(r["impl"]),
                "mask": "causal" if r["causal"] else "none",
                "host clock (ms)": f"{r['traced_wall_ms']:.3f}",
                "kernels summed (ms)": f"{r['device_ms']:.3f}",
                "host / kernels": f"{profile.same_calls_ratio(r):.3f}",
                "GPU busy": "–" if busy is None else f"{100 * busy:.0f} %",
            }
        )
    return rows
