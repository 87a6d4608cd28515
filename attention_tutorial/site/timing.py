"""The timing page's figure: every call of one :func:`~attention_tutorial.measure.timing_lesson.five_ways` result,
in the order it ran. The page computes its numbers in its own cells."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..measure.timing import summarize
from ..results.plotting import PALETTE

#: The calls :func:`calls_figure` draws, in the order they ran: (field of the result, label, colour).
PHASES = (
    ("warmup_ms", "warm-up calls, each waited for", PALETTE[1]),
    ("no_wait_ms", "clock read without waiting", PALETTE[4]),
    ("waited_ms", "single calls, each waited for", PALETTE[0]),
    ("samples_ms", "pipelined samples (per call)", PALETTE[3]),
)


def calls_figure(times: dict, *, title: str = ""):
    """Two panels of milliseconds per call against the call's place in the run: left, every call from zero; right,
    the waited calls and the pipelined samples zoomed in. Both show the samples' median and p10–p90 band. The
    compilation is not a call: it is left out. Returns the figure."""
    groups = [np.atleast_1d(times[field]) for field, _, _ in PHASES]
    starts = np.cumsum([0, *map(len, groups)])
    median, p10, p90 = summarize(times["samples_ms"])
    fig, (full, zoom) = plt.subplots(
        1, 2, figsize=(9.0, 3.9), layout="constrained", width_ratios=(3, 2), facecolor="white"
    )
    for ax, shown in ((full, range(4)), (zoom, (2, 3))):
        for i in shown:
            xs = np.arange(starts[i], starts[i + 1])
            ax.plot(xs, groups[i], "o", color=PHASES[i][2], label=PHASES[i][1], markersize=5)
        band = (starts[3] - 0.5, starts[4] - 0.5)
        ax.fill_between(band, p10, p90, color=PHASES[3][2], alpha=0.18, linewidth=0, label="p10–p90 of the samples")
        ax.hlines(median, *band, color=PHASES[3][2], linewidth=1.5, label="median of the samples")
        ax.grid(True, color="#dddddd", linewidth=0.8)
        ax.set_xlabel("call, in the order they ran")
    full.set(ylim=(0, 1.08 * max(g.max() for g in groups)), ylabel="milliseconds per call")
    full.set_title("every call, from zero", fontsize=10)
    near = np.concatenate(groups[2:])
    pad = 0.15 * (near.max() - near.min()) or 0.01 * near.max()
    zoom.set(ylim=(near.min() - pad, near.max() + pad), xlim=(starts[2] - 1, starts[4]))
    zoom.set_title("waited and pipelined calls, zoomed in", fontsize=10)
    fig.suptitle(title, fontsize=11)
    fig.legend(*full.get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    return fig
