"""The measured timeline of our Mosaic GPU forward's warpgroups: rows of regions, each region's share of the compute
warpgroups' time, how the two compute warpgroups take turns (:func:`pingpong`), the whole run (plain above
pipelined) and a zoom on a few key blocks, drawn from the recorded ``timeline`` (see
:mod:`attention_tutorial.measure.timeline` for its format), so a CPU build draws it too.

Time is in SM clock cycles. The profiler stamps each region with its SM's cycle counter, counted from the moment
the warpgroup started, and places that start by the GPU's global timer (ns). Within a warpgroup the recorded numbers
are therefore cycles; the starts of different warpgroups are nanoseconds apart (tens of them within one CTA).
:func:`timeline_rows` turns those offsets into cycles at :data:`SM_CLOCK_GHZ`, so every time on an axis is a cycle.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ..measure.timeline import KERNELS, WARPGROUPS
from ..results import store
from ..results.plotting import PALETTE

#: The H200's (and H100 SXM's) boost SM clock, GHz: turns the nanoseconds between warpgroups' starts into cycles,
#: and cycles into an approximate µs axis.
SM_CLOCK_GHZ = 1.98
#: Dense bf16 tensor-core FLOPs per SM per cycle on Hopper: 989.4 TFLOP/s = 132 SMs × 1.83 GHz × 4096.
TENSOR_FLOPS_PER_CYCLE = 4096

REGION_STYLE = {  # region: (colour, legend label)
    "qk": (PALETTE[0], "q·kᵀ (issue, wait for it)"),
    "softmax": (PALETTE[3], "softmax (exp2)"),
    "pv": (PALETTE[2], "p·v (issue, wait for it)"),
    "wait": ("#BBBBBB", "waiting at a barrier"),
    "copy": (PALETTE[1], "TMA copies (k, v)"),
    "grads": (PALETTE[4], "gradient matmuls (dV, dP, dK; dQ's share)"),  # the backward's
    "dq_add": (PALETTE[5], "dQ's share out (TMA reduce-add)"),
    "Init": ("#DDDDDD", "setup"),  # the profiler's own region around the kernel's start
}
SHORT_NAMES = {
    "qk": "q·kᵀ",
    "softmax": "softmax",
    "pv": "p·v",
    "copy": "copy",
    "wait": "",
    "grads": "grads",
    "dq_add": "dQ+",
}
KERNEL_NAMES = {"mosaic": "plain", "mosaic_pipe": "pipelined", "mosaic_atomic": "dQ by atomic adds"}


@dataclasses.dataclass(frozen=True)
class Bar:
    """One region of one warpgroup: ``start``/``end`` in SM clock cycles since the first warpgroup kept started;
    ``depth`` 1 for a region inside another (a wait inside q·kᵀ or p·v)."""

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


def recorded_timeline(gpu: str = store.REFERENCE_GPU) -> dict | None:
    """The ``timeline`` entry of the recorded result file of ``gpu``, or None where none is recorded."""
    data = store.recorded(gpu)
    return None if data is None else data["provenance"].get("timeline")


def in_cycles(regions, clock_ghz: float = SM_CLOCK_GHZ) -> list[tuple[str, int, int, int]]:
    """One recorded track's regions with every time in cycles: the track's first start is the warpgroup's start in
    ns (the global timer), the rest that start plus cycles (the SM clock), so only the offset is converted."""
    if not clock_ghz > 0:
        raise ValueError(f"clock_ghz must be a positive clock rate in GHz, e.g. {SM_CLOCK_GHZ}; got {clock_ghz!r}.")
    if not regions:
        return []
    first = min(start for _, start, _, _ in regions)
    shift = round(first * clock_ghz) - first
    return [(name, start + shift, end + shift, depth) for name, start, end, depth in regions]


def timeline_rows(
    timeline: dict, *, kernels=tuple(KERNELS), ctas: int = 1, clock_ghz: float = SM_CLOCK_GHZ
) -> list[Row]:
    """The rows of ``timeline`` (the recorded format), kernel by kernel in the order of ``kernels`` (those recorded
    ok), its first ``ctas`` CTAs, warpgroup by warpgroup; times in cycles (:func:`in_cycles`)."""
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
                bars = tuple(Bar(*region) for region in in_cycles(track["regions"], clock_ghz))
                rows.append(Row(kernel, track["cta"], track["warpgroup"], bars))
    return rows


@dataclasses.dataclass(frozen=True)
class Shares:
    """How one kernel's compute warpgroups spend their time, from their first region's start to their last region's
    end: the fraction of it in each top-level region (``shares``, region -> fraction; the rest is between regions),
    and ``span`` that time in cycles, averaged over the warpgroups."""

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


def _draw(ax, rows, *, origin: int = 0, labels: bool = False):
    """Each row's regions as bars on ``ax`` (row 0 on top), times shifted by ``origin``; a region inside another
    thinner, on top of it; with ``labels``, each wide enough top-level bar named."""
    lo, hi = ax.get_xlim() if labels else (None, None)
    for y, row in enumerate(rows):
        for bar in row.bars:
            colour = REGION_STYLE.get(bar.region, ("#000000", bar.region))[0]
            height = 0.8 if bar.depth == 0 else 0.4
            ax.broken_barh(
                [(bar.start - origin, max(bar.end - bar.start, 1))],
                (y - height / 2, height),
                facecolors=colour,
                edgecolor="none",
            )
            wide = labels and bar.depth == 0 and (bar.end - bar.start) > 0.045 * (hi - lo)
            if wide and lo <= bar.start - origin and bar.end - origin <= hi and SHORT_NAMES.get(bar.region):
                ax.text(
                    (bar.start + bar.end) / 2 - origin,
                    y,
                    SHORT_NAMES[bar.region],
                    ha="center",
                    va="center",
                    fontsize=7.5,
                    color="black",
                )
    ax.set_yticks(range(len(rows)), [r.label for r in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top


def _legend(ax, rows, y: float):
    seen = dict.fromkeys(b.region for r in rows for b in r.bars)
    ax.legend(
        handles=[Patch(color=REGION_STYLE[k][0], label=REGION_STYLE[k][1]) for k in REGION_STYLE if k in seen],
        loc="upper center",
        bbox_to_anchor=(0.5, y),
        ncol=3,
        frameon=False,
    )


def timeline_figure(timeline: dict, *, ctas: int = 1, kernels=tuple(KERNELS), clock_ghz: float = SM_CLOCK_GHZ):
    """One row per warpgroup (plain above pipelined), each region a bar coloured by what it does; a region inside
    another is drawn thinner on top of it. The axis counts SM clock cycles; a second axis on top reads them as µs
    at ``clock_ghz``. Returns the matplotlib Figure."""
    rows = timeline_rows(timeline, kernels=kernels, ctas=ctas, clock_ghz=clock_ghz)
    if not rows:
        raise ValueError("timeline holds no kernel recorded ok: nothing to draw.")
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 2.0))
    _draw(ax, rows)
    for y in range(1, len(rows)):
        if rows[y].kernel != rows[y - 1].kernel:
            ax.axhline(y - 0.5, color="black", linewidth=0.8)
    ax.set_xlabel("SM clock cycles since the block of threads started")
    ax.set_xlim(0, max(b.end for r in rows for b in r.bars))
    top = ax.secondary_xaxis("top", functions=(lambda c: c / (1e3 * clock_ghz), lambda us: us * 1e3 * clock_ghz))
    top.set_xlabel(f"µs, if the SM ran at {clock_ghz:g} GHz", fontsize=9)
    _legend(ax, rows, -0.3 - 0.5 / len(rows))
    fig.tight_layout()
    return fig


def _compute_rows(rows, kernel: str, cta: int = 0) -> list[Row]:
    return [r for r in rows if r.kernel == kernel and r.cta == cta and r.compute and r.bars]


def softmax_blocks(row: Row) -> list[Bar]:
    """The softmax regions of one compute warpgroup, in time order: one per key block."""
    return sorted((b for b in row.bars if b.region == "softmax" and b.depth == 0), key=lambda b: b.start)


def zoom_window(rows, kernel: str = "mosaic", *, blocks: int = 4, cta: int = 0) -> tuple[int, int]:
    """(start, end) in cycles of ``blocks`` key blocks in the middle of ``kernel``'s loop: from the start of one of
    compute warpgroup 0's softmaxes to the start of the one ``blocks`` later (its last when fewer follow)."""
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise ValueError(f"blocks must be a positive int; got {blocks!r}.")
    compute = _compute_rows(rows, kernel, cta)
    soft = softmax_blocks(compute[0]) if compute else []
    if len(soft) < 2:
        raise ValueError(f"{kernel}'s CTA {cta} has fewer than two softmax regions: no loop to zoom on.")
    first = max(0, min((len(soft) - blocks) // 2, len(soft) - 2))
    last = min(first + blocks, len(soft) - 1)
    return soft[first].start, soft[last].start


def zoom_figure(timeline: dict, *, blocks: int = 4, kernels=tuple(KERNELS), clock_ghz: float = SM_CLOCK_GHZ):
    """One panel per kernel: the three warpgroups of its first CTA over ``blocks`` key blocks in the middle of the
    loop (:func:`zoom_window`), each wide bar named, the axis in cycles from the window's start."""
    rows = timeline_rows(timeline, kernels=kernels, clock_ghz=clock_ghz)
    shown = [k for k in kernels if _compute_rows(rows, k)]
    if not shown:
        raise ValueError("timeline holds no kernel recorded ok: nothing to draw.")
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 1.9 * len(shown) + 1.2), squeeze=False)
    for ax, kernel in zip(axes[:, 0], shown):
        lo, hi = zoom_window(rows, kernel, blocks=blocks)
        ax.set_xlim(0, hi - lo)
        _draw(ax, [r for r in rows if r.kernel == kernel and r.cta == 0], origin=lo, labels=True)
        ax.set_title(f"{KERNEL_NAMES.get(kernel, kernel)}: {blocks} key blocks in the middle of the loop", fontsize=10)
    axes[-1, 0].set_xlabel("SM clock cycles from the window's start")
    _legend(axes[-1, 0], rows, -0.45)
    fig.tight_layout()
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


def _covered(intervals, lo: int, hi: int, at_least: int) -> float:
    """The fraction of [lo, hi) covered by at least ``at_least`` of ``intervals`` at once."""
    edges = sorted({lo, hi, *(min(max(t, lo), hi) for s, e in intervals for t in (s, e))})
    total = 0
    for a, b in itertools.pairwise(edges):
        if sum(s <= a and b <= e for s, e in intervals) >= at_least:
            total += b - a
    return total / (hi - lo)


def pingpong(timeline: dict, kernel: str = "mosaic", *, clock_ghz: float = SM_CLOCK_GHZ) -> PingPong | None:
    """:class:`PingPong` of ``kernel``'s first CTA; None where it is not recorded ok or has fewer than two key
    blocks. The matmul time: 2 · (2 · block_q · block_kv · H) FLOPs at :data:`TENSOR_FLOPS_PER_CYCLE`."""
    entry = (timeline or {}).get(kernel, {})
    if entry.get("status") != "ok":
        return None
    compute = _compute_rows(timeline_rows(timeline, kernels=(kernel,), clock_ghz=clock_ghz), kernel)
    soft = [softmax_blocks(r) for r in compute]
    if len(compute) < 2 or min(len(s) for s in soft) < 2:
        return None
    lengths = [b.end - b.start for s in soft for b in s]
    steps = [b.start - a.start for s in soft for a, b in itertools.pairwise(s)]
    intervals = [(b.start, b.end) for s in soft for b in s]
    lo, hi = min(s for s, _ in intervals), max(e for _, e in intervals)
    tiles, head_dim = entry["tiles"], entry["shape"]["head_dim"]
    matmul = 2 * (2 * tiles["block_q"] * tiles["block_kv"] * head_dim) / TENSOR_FLOPS_PER_CYCLE
    return PingPong(
        kernel,
        statistics.median(lengths),
        statistics.median(steps),
        matmul,
        _covered(intervals, lo, hi, 1),
        _covered(intervals, lo, hi, 2),
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
        if entry.get("status") != "ok" or not entry.get(field):
            continue
        rows = timeline_rows({kernel: {**entry, "tracks": entry[field]}}, kernels=(kernel,), clock_ghz=clock_ghz)
        out += [(name, s) for s in region_shares(rows)]
    return out


def backward_figure(shares, *, title: str = ""):
    """One stacked bar per backward kernel (:func:`backward_shares`): the cycles a compute warpgroup of one CTA
    spends in each region, the two kernels of dQ by a pass one above the other, with their sum beside them."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.6, 0.55 * len(shares) + 1.9), layout="constrained", facecolor="white")
    seen = set()
    for y, (_, s) in enumerate(shares):
        left = 0.0
        for region in REGION_STYLE:
            width = s.shares.get(region, 0.0) * s.span
            if width <= 0 or region == "Init":  # the profiler's own start-up: a sliver, left in the hatched rest
                continue
            colour, text = REGION_STYLE[region]
            ax.barh(y, width, left=left, color=colour, edgecolor="white", label=None if region in seen else text)
            seen.add(region)
            left += width
        rest = s.span - left  # between regions
        if rest > 0:
            ax.barh(
                y,
                rest,
                left=left,
                color="white",
                edgecolor="#BBBBBB",
                hatch="//",
                label=None if "between" in seen else "between regions",
            )
            seen.add("between")
        ax.text(s.span, y, f"  {s.span:,.0f}", va="center", fontsize=8)
    ax.set_yticks(range(len(shares)), [name for name, _ in shares], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("SM clock cycles of a compute warpgroup in one block of threads")
    fig.legend(fontsize=8, loc="outside lower center", ncol=3, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return fig
