"""The measured timeline of our Mosaic GPU kernels' warpgroups, drawn from the recorded ``timeline`` (its format:
:mod:`attention_tutorial.measure.timeline`), so a CPU build draws it too: rows of regions, each region's share of the
compute warpgroups' time, how the two compute warpgroups take turns (:func:`pingpong`), and the backward's kernels.

Time is in SM clock cycles. The profiler stamps each region with its SM's cycle counter, counted from the moment the
warpgroup started, and places that start by the GPU's global timer (ns): :func:`in_cycles` turns those starts into
cycles at :data:`SM_CLOCK_GHZ`.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from typing import NamedTuple

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ..measure.timeline import KERNELS, WARPGROUPS
from ..results.plotting import PALETTE

#: The H200's (and H100 SXM's) boost SM clock, GHz: turns the nanoseconds between warpgroups' starts into cycles.
SM_CLOCK_GHZ = 1.98
#: Dense bf16 tensor-core FLOPs per SM per cycle on Hopper: 989.4 TFLOP/s = 132 SMs × 1.83 GHz × 4096.
TENSOR_FLOPS_PER_CYCLE = 4096

REGIONS = {  # region: (colour, legend label, name on a wide bar)
    "qk": (PALETTE[0], "q·kᵀ (issue, wait for it)", "q·kᵀ"),
    "softmax": (PALETTE[3], "softmax (exp2)", "softmax"),
    "pv": (PALETTE[2], "p·v (issue, wait for it)", "p·v"),
    "wait": ("#BBBBBB", "waiting at a barrier", ""),
    "copy": (PALETTE[1], "TMA copies (k, v)", "copy"),
    "grads": (PALETTE[4], "gradient matmuls (dV, dP, dK; dQ's share)", "grads"),  # the backward's
    "dq_add": (PALETTE[5], "dQ's share out (TMA reduce-add)", "dQ+"),
    "Init": ("#DDDDDD", "setup", ""),  # the profiler's own region around the kernel's start
}
KERNEL_NAMES = {"mosaic": "plain", "mosaic_pipe": "pipelined", "mosaic_atomic": "dQ by atomic adds"}


class Bar(NamedTuple):
    """One region of one warpgroup, in cycles; ``depth`` 1 for a region inside another (a wait inside q·kᵀ)."""

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
        role = f"compute warpgroup {self.warpgroup}" if self.compute else "copy warpgroup"
        return f"{KERNEL_NAMES.get(self.kernel, self.kernel)}, CTA {self.cta}: {role}"


def in_cycles(regions, clock_ghz: float = SM_CLOCK_GHZ) -> list[Bar]:
    """One recorded track's regions with every time in cycles: the track's first start is the warpgroup's start in
    ns (the global timer), the rest that start plus cycles (the SM clock), so only the offset is converted."""
    if not regions:
        return []
    first = min(start for _, start, _, _ in regions)
    shift = round(first * clock_ghz) - first
    return [Bar(name, start + shift, end + shift, depth) for name, start, end, depth in regions]


def timeline_rows(timeline: dict, *, kernels=tuple(KERNELS), ctas: int = 1, clock_ghz=SM_CLOCK_GHZ) -> list[Row]:
    """The rows of ``timeline``, kernel by kernel in the order of ``kernels`` (those recorded ok), its first ``ctas``
    CTAs, warpgroup by warpgroup; times in cycles (:func:`in_cycles`)."""
    rows = []
    for kernel in kernels:
        entry = timeline.get(kernel, {})
        if entry.get("status") != "ok":
            continue
        for track in sorted(entry["tracks"], key=lambda t: (t["cta"], t["warpgroup"])):
            if track["cta"] < ctas:
                bars = tuple(in_cycles(track["regions"], clock_ghz))
                rows.append(Row(kernel, track["cta"], track["warpgroup"], bars))
    return rows


@dataclasses.dataclass(frozen=True)
class Shares:
    """How one kernel's compute warpgroups spend their time, from their first region's start to their last region's
    end: the fraction of it in each top-level region (``shares``; the rest is between regions), and ``span`` that
    time in cycles, averaged over the warpgroups."""

    kernel: str
    span: float
    shares: dict


def region_shares(rows) -> list[Shares]:
    """:class:`Shares` for each kernel among ``rows`` (compute warpgroups only), in the rows' order."""
    out = []
    for kernel in dict.fromkeys(r.kernel for r in rows):
        compute = [r for r in rows if r.kernel == kernel and r.compute and r.bars]
        spans = [max(b.end for b in r.bars) - min(b.start for b in r.bars) for r in compute]
        totals: dict[str, int] = {}
        for b in (b for r in compute for b in r.bars if b.depth == 0):
            totals[b.region] = totals.get(b.region, 0) + b.end - b.start
        if compute:
            out.append(Shares(kernel, sum(spans) / len(spans), {k: v / sum(spans) for k, v in totals.items()}))
    return out


def softmax_blocks(row: Row) -> list[Bar]:
    """The softmax regions of one compute warpgroup, in time order: one per key block."""
    return sorted((b for b in row.bars if b.region == "softmax" and b.depth == 0), key=lambda b: b.start)


def zoom_window(rows, kernel: str = "mosaic", *, blocks: int = 4) -> tuple[int, int]:
    """(start, end) in cycles of ``blocks`` key blocks in the middle of ``kernel``'s loop (its first CTA): from the
    start of one of compute warpgroup 0's softmaxes to the start of the one ``blocks`` later (its last when fewer
    follow)."""
    first_row = next(r for r in rows if r.kernel == kernel and r.cta == 0 and r.compute)
    soft = softmax_blocks(first_row)
    if len(soft) < 2:
        raise ValueError(f"{kernel}'s first CTA has fewer than two softmax regions: no loop to zoom on.")
    first = max(0, min((len(soft) - blocks) // 2, len(soft) - 2))
    return soft[first].start, soft[min(first + blocks, len(soft) - 1)].start


def timeline_figure(timeline: dict, *, kernels=tuple(KERNELS), blocks: int | None = None, clock_ghz=SM_CLOCK_GHZ):
    """One panel per kernel recorded ok, one row per warpgroup of its first CTA, each region a bar coloured by what
    it does (a region inside another thinner, on top of it): the whole run, or with ``blocks`` that many key blocks
    in the middle of the loop (:func:`zoom_window`), each wide bar named. The axis counts SM clock cycles."""
    rows = timeline_rows(timeline, kernels=kernels, clock_ghz=clock_ghz)
    shown = list(dict.fromkeys(r.kernel for r in rows))
    if not shown:
        raise ValueError("timeline holds no kernel recorded ok: nothing to draw.")
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 1.9 * len(shown) + 1.2), squeeze=False, layout="constrained")
    for ax, kernel in zip(axes[:, 0], shown):
        mine = [r for r in rows if r.kernel == kernel]
        lo, hi = zoom_window(rows, kernel, blocks=blocks) if blocks else (0, max(b.end for r in mine for b in r.bars))
        for y, row in enumerate(mine):
            for bar in row.bars:
                colour, _, name = REGIONS.get(bar.region, ("#000000", bar.region, ""))
                height = 0.8 if bar.depth == 0 else 0.4
                ax.broken_barh([(bar.start - lo, max(bar.end - bar.start, 1))], (y - height / 2, height), color=colour)
                inside = lo <= bar.start and bar.end <= hi and bar.end - bar.start > 0.045 * (hi - lo)
                if blocks and name and bar.depth == 0 and inside:
                    ax.text((bar.start + bar.end) / 2 - lo, y, name, ha="center", va="center", fontsize=7.5)
        ax.set(xlim=(0, hi - lo), ylim=(len(mine) - 0.5, -0.5))
        ax.set_yticks(range(len(mine)), [r.label for r in mine])
        what = f"{blocks} key blocks in the middle of the loop" if blocks else "the whole run"
        ax.set_title(f"{KERNEL_NAMES.get(kernel, kernel)}: {what}", fontsize=10)
    axes[-1, 0].set_xlabel("SM clock cycles" + (" from the window's start" if blocks else " since the CTA started"))
    seen = {b.region for r in rows for b in r.bars}
    handles = [Patch(color=colour, label=text) for k, (colour, text, _) in REGIONS.items() if k in seen]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False)
    return fig


@dataclasses.dataclass(frozen=True)
class PingPong:
    """How one kernel's two compute warpgroups share the loop (its first CTA), in cycles per key block: a softmax's
    length (``softmax``, the median over both warpgroups), the loop's period (``step``, the median time between one
    warpgroup's successive softmaxes), and the tensor-core time one warpgroup's q·kᵀ and p·v need at the full
    dense rate (``matmul``). ``either`` and ``both``: the fractions of the loop (first softmax to last) in which at
    least one, or both, warpgroups are in their softmax."""

    kernel: str
    softmax: float
    step: float
    matmul: float
    either: float
    both: float

    @property
    def softmax_over_matmul(self) -> float:
        """A softmax over one warpgroup's matmul time: above 1, the softmax is the longer leg of the ping-pong."""
        return self.softmax / self.matmul

    @property
    def tensor_busy_max(self) -> float:
        """The most the tensor cores can be busy: both warpgroups' matmul time in one period."""
        return min(1.0, 2 * self.matmul / self.step)


def pingpong(timeline: dict, kernel: str = "mosaic", *, clock_ghz: float = SM_CLOCK_GHZ) -> PingPong | None:
    """:class:`PingPong` of ``kernel``'s first CTA; None where it is not recorded ok or has fewer than two key
    blocks. The matmul time: 2 · (2 · block_q · block_kv · H) FLOPs at :data:`TENSOR_FLOPS_PER_CYCLE`."""
    rows = timeline_rows(timeline or {}, kernels=(kernel,), clock_ghz=clock_ghz)
    soft = [softmax_blocks(r) for r in rows if r.compute]
    if len(soft) < 2 or min(map(len, soft)) < 2:
        return None
    lengths = [b.end - b.start for s in soft for b in s]
    steps = [b.start - a.start for s in soft for a, b in itertools.pairwise(s)]
    loop = max(b.end for s in soft for b in s) - min(b.start for s in soft for b in s)
    # one warpgroup's softmaxes follow each other, so the time both run one is what the two rows' softmaxes share
    both = sum(max(0, min(a.end, b.end) - max(a.start, b.start)) for a in soft[0] for b in soft[1])
    entry = timeline[kernel]
    matmul = 2 * (2 * entry["tiles"]["block_q"] * entry["tiles"]["block_kv"] * entry["shape"]["head_dim"])
    med = statistics.median
    return PingPong(
        kernel, med(lengths), med(steps), matmul / TENSOR_FLOPS_PER_CYCLE, (sum(lengths) - both) / loop, both / loop
    )


# --- the backward: dQ by a pass of its own against atomic adds -----------------------------------------------------

#: The backward's kernels as the recorded ``timeline_backward`` holds them: (label, entry, tracks field).
BACKWARD_KERNELS = (
    ("dQ by a pass: the dK/dV kernel", "mosaic", "tracks"),
    ("dQ by a pass: the dQ kernel", "mosaic", "dq_tracks"),
    ("dQ by atomic adds: one kernel", "mosaic_atomic", "tracks"),
)


def backward_shares(timeline: dict, *, clock_ghz: float = SM_CLOCK_GHZ) -> list[tuple[str, Shares]]:
    """(label, :class:`Shares`) for each kernel of :data:`BACKWARD_KERNELS` recorded ok in ``timeline`` (the
    ``timeline_backward`` entry): one CTA's compute warpgroups, cycles and the share of each region."""
    out = []
    for name, kernel, field in BACKWARD_KERNELS:
        entry = (timeline or {}).get(kernel, {})
        if entry.get("status") == "ok" and entry.get(field):
            rows = timeline_rows({kernel: {**entry, "tracks": entry[field]}}, kernels=(kernel,), clock_ghz=clock_ghz)
            out += [(name, s) for s in region_shares(rows)]
    return out


def backward_figure(shares, *, title: str = ""):
    """One stacked bar per backward kernel (:func:`backward_shares`): the cycles a compute warpgroup of one CTA
    spends in each region, the rest (between regions) hatched, with the total beside each bar."""
    fig, ax = plt.subplots(figsize=(8.6, 0.55 * len(shares) + 1.9), layout="constrained", facecolor="white")
    for y, (_, s) in enumerate(shares):
        left = 0.0
        for region, (colour, text, _) in REGIONS.items():
            width = s.shares.get(region, 0.0) * s.span
            if width > 0 and region != "Init":  # the profiler's own start-up: a sliver, left in the hatched rest
                ax.barh(y, width, left=left, color=colour, edgecolor="white", label=text)
                left += width
        ax.barh(y, s.span - left, left=left, color="white", edgecolor="#BBBBBB", hatch="//", label="between regions")
        ax.text(s.span, y, f"  {s.span:,.0f}", va="center", fontsize=8)
    ax.set_yticks(range(len(shares)), [name for name, _ in shares], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("SM clock cycles of a compute warpgroup in one block of threads")
    ax.set_title(title, fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    by_label = dict(zip(labels, handles))  # each region once
    fig.legend(by_label.values(), by_label.keys(), fontsize=8, loc="outside lower center", ncol=3, frameon=False)
    return fig
