"""The measured timeline of our Mosaic GPU forward's warpgroups: rows of regions, each region's share of the compute
warpgroups' time, and the figure (plain above pipelined), drawn from the recorded ``timeline`` (see
:mod:`attention_tutorial.measure.timeline` for its format), so a CPU build draws it too.
"""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ..measure.timeline import KERNELS, WARPGROUPS
from ..results import store
from ..results.plotting import PALETTE

REGION_STYLE = {  # region: (colour, legend label)
    "qk": (PALETTE[0], "q·kᵀ (issue, wait for it)"),
    "softmax": (PALETTE[3], "softmax (exp2)"),
    "pv": (PALETTE[2], "p·v (issue, wait for it)"),
    "wait": ("#BBBBBB", "waiting at a barrier"),
    "copy": (PALETTE[1], "TMA copies (k, v)"),
}
KERNEL_NAMES = {"mosaic": "plain", "mosaic_pipe": "pipelined"}


@dataclasses.dataclass(frozen=True)
class Bar:
    """One region of one warpgroup: ``start``/``end`` in the trace's unit (ns-scale ticks); ``depth`` 1 for a region
    inside another (a wait inside q·kᵀ or p·v)."""

    region: str
    start: int
    end: int
    depth: int


@dataclasses.dataclass(frozen=True)
class Row:
    """One warpgroup of one CTA of one kernel, its regions in time order."""

    kernel: str
    cta: int
    warpgroup: int
    bars: tuple[Bar, ...]

    @property
    def compute(self) -> bool:
        """Warpgroups 0 and 1 compute; the last one copies."""
        return self.warpgroup < WARPGROUPS - 1

    @property
    def label(self) -> str:
        role = f"compute {self.warpgroup}" if self.compute else "copy"
        return f"{KERNEL_NAMES.get(self.kernel, self.kernel)}, CTA {self.cta}, {role}"


def recorded_timeline(gpu: str = store.REFERENCE_GPU) -> dict | None:
    """The ``timeline`` entry of the recorded result file of ``gpu``, or None where none is recorded."""
    data = store.recorded(gpu)
    return None if data is None else data["provenance"].get("timeline")


def timeline_rows(timeline: dict, *, kernels=tuple(KERNELS), ctas: int = 1) -> list[Row]:
    """The rows of ``timeline`` (the recorded format), kernel by kernel in the order of ``kernels`` (those recorded
    ok), its first ``ctas`` CTAs, warpgroup by warpgroup."""
    if not isinstance(timeline, dict):
        raise TypeError(f"timeline must be the recorded dict of kernel -> entry; got {type(timeline).__name__}.")
    if isinstance(ctas, bool) or not isinstance(ctas, int) or ctas < 1:
        raise ValueError(f"ctas must be a positive int; got {ctas!r}.")
    rows = []
    for kernel in kernels:
        entry = timeline.get(kernel, {})
        if entry.get("status") != "ok":
            continue
        for track in sorted(entry["tracks"], key=lambda t: (t["cta"], t["warpgroup"])):
            if track["cta"] < ctas:
                bars = tuple(Bar(name, start, end, depth) for name, start, end, depth in track["regions"])
                rows.append(Row(kernel, track["cta"], track["warpgroup"], bars))
    return rows


@dataclasses.dataclass(frozen=True)
class Shares:
    """How one kernel's compute warpgroups spend their time, from their first region's start to their last region's
    end: the fraction of it in each top-level region (``shares``, region -> fraction; the rest is between regions),
    and ``span`` that time in the trace's unit, averaged over the warpgroups."""

    kernel: str
    span: float
    shares: dict


def region_shares(rows) -> list[Shares]:
    """:class:`Shares` for each kernel among ``rows`` (compute warpgroups only), in the rows' order."""
    out = []
    for kernel in dict.fromkeys(r.kernel for r in rows):
        compute = [r for r in rows if r.kernel == kernel and r.compute and r.bars]
        if not compute:
            continue
        spans, totals = [], {}
        for row in compute:
            spans.append(max(b.end for b in row.bars) - min(b.start for b in row.bars))
            for b in row.bars:
                if b.depth == 0:
                    totals[b.region] = totals.get(b.region, 0) + (b.end - b.start)
        whole = sum(spans)
        out.append(Shares(kernel, whole / len(spans), {k: v / whole for k, v in totals.items()}))
    return out


def timeline_figure(timeline: dict, *, ctas: int = 1, kernels=tuple(KERNELS)):
    """One row per warpgroup (plain above pipelined), each region a bar coloured by what it does; a region inside
    another is drawn thinner on top of it. Returns the matplotlib Figure."""
    rows = timeline_rows(timeline, kernels=kernels, ctas=ctas)
    if not rows:
        raise ValueError("timeline holds no kernel recorded ok: nothing to draw.")
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.6))
    for y, row in enumerate(rows):
        for bar in row.bars:
            colour = REGION_STYLE.get(bar.region, ("#000000", bar.region))[0]
            height = 0.8 if bar.depth == 0 else 0.4
            ax.broken_barh([(bar.start, max(bar.end - bar.start, 1))], (y - height / 2, height), facecolors=colour,
                           edgecolor="none")  # fmt: skip
    ax.set_yticks(range(len(rows)), [r.label for r in rows])
    ax.invert_yaxis()  # the first kernel on top
    for y in range(1, len(rows)):
        if rows[y].kernel != rows[y - 1].kernel:
            ax.axhline(y - 0.5, color="black", linewidth=0.8)
    ax.set_xlabel("time since the first region (profiler ticks: ns between warpgroups, SM cycles within one)")
    seen = dict.fromkeys(b.region for r in rows for b in r.bars)
    ax.legend(handles=[Patch(color=REGION_STYLE[k][0], label=REGION_STYLE[k][1]) for k in REGION_STYLE if k in seen],
              loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.5 / len(rows)), ncol=3, frameon=False)  # fmt: skip
    ax.set_xlim(0, max(b.end for r in rows for b in r.bars))
    fig.tight_layout()
    return fig
