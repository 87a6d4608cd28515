"""The scaling page's figures: the IO argument as a time budget beside a roofline, and the batch sweep's fixed cost
per call (with :func:`batch_floor`, the fastest call of that sweep, which the context-parallel page quotes too).
The numbers and the sentences are in ``docs/scaling.md``; the roof and the IO points are
:mod:`attention_tutorial.measure.roofline`'s.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

from ..measure.roofline import IOPoint, Roof
from ..results.plotting import impl_style, label
from ..results.store import select
from .claims import Claim, compare

#: How the roofline marks each sweep's points: (marker, legend words). Filled for the T sweep, hollow for the H sweep.
SWEEP_STYLE = {"seq_long": ("o", "T sweep"), "head_dim": ("s", "H sweep")}


def _dodge(ps: list[IOPoint], *, close: float = 1.2, step: float = 4.0) -> list[float]:
    """Vertical label offsets (points) for ``ps``: 0, except that of two points at one FLOPs per byte whose TFLOP/s
    lie within a factor ``close``, the upper label moves up and the lower down by ``step``."""
    dy = [0.0] * len(ps)
    for x in {round(p.intensity, 6) for p in ps}:
        same = sorted((i for i, p in enumerate(ps) if round(p.intensity, 6) == x), key=lambda i: ps[i].tflops)
        for lo, hi in itertools.pairwise(same):
            if ps[hi].tflops / ps[lo].tflops < close:
                dy[lo], dy[hi] = dy[lo] - step, dy[hi] + step
    return dy


def io_figure(budget: list[IOPoint], cloud: list[IOPoint], r: Roof, *, title: str = ""):
    """Two panels. Left, a time budget: for each point of ``budget`` (one shape), the measured time beside the time
    its bytes take at the measured read bandwidth and the time its FLOPs take at the measured matmul peak. Right, a
    roofline: every point of ``cloud`` at its FLOPs per byte against its TFLOP/s, under the measured roof (solid)
    and the datasheet's (dashed); colour names the implementation, the marker its sweep (:data:`SWEEP_STYLE`:
    filled for the T sweep, hollow and labelled with its H for the H sweep)."""
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(11.0, 4.2), facecolor="white", layout="constrained", width_ratios=(1, 1.25)
    )
    kinds = (("measured time", 1.0), ("its bytes at the read ceiling", 0.55), ("its FLOPs at the matmul peak", 0.25))
    height = 0.26
    for i, p in enumerate(budget):
        colour = impl_style(p.impl)[0]
        values = (p.median_ms, r.bytes_ms(p), r.matmul_ms(p))
        for j, ((name, alpha), v) in enumerate(zip(kinds, values)):
            y = i + (1 - j) * height
            left.barh(y, v, height=height * 0.9, color=colour, alpha=alpha)
            left.text(v, y, f" {v:.2f} ms" + ("" if i else f"  {name}"), va="center", fontsize=7)
    left.set_yticks(range(len(budget)), [label(p.impl) for p in budget], fontsize=8)
    left.set_xlabel("ms per call")
    left.set_xlim(0, max(p.median_ms for p in budget) * 1.9)
    if budget:
        b = budget[0]
        left.set_title(f"time budget at B = {b.batch}, T = S = {b.seq_q}, H = {b.head_dim}", fontsize=10)
    xs = np.logspace(0, 4.5, 200)
    right.plot(
        xs,
        [r.cap(x) for x in xs],
        color="#333333",
        linewidth=1.6,
        label=f"measured roof: {r.peak_tflops:.0f} TFLOP/s, {r.gbps / 1e3:.2f} TB/s",
    )
    if r.datasheet_tflops and r.datasheet_gbps:
        right.plot(
            xs,
            np.minimum(r.datasheet_tflops, xs * r.datasheet_gbps / 1e3),
            color="#999999",
            linestyle=(0, (4, 3)),
            linewidth=1.2,
            label=f"datasheet roof: {r.datasheet_tflops:.0f} TFLOP/s, {r.datasheet_gbps / 1e3:.1f} TB/s",
        )
    for impl, grid in dict.fromkeys((p.impl, p.grid) for p in cloud):
        colour = impl_style(impl)[0]
        marker, sweep = SWEEP_STYLE.get(grid, (impl_style(impl)[1], grid))
        ps = [p for p in cloud if (p.impl, p.grid) == (impl, grid)]
        right.plot(
            [p.intensity for p in ps],
            [p.tflops for p in ps],
            marker,
            color=colour,
            label=f"{label(impl)}, {sweep}" if sweep else label(impl),
            markersize=6,
            linestyle="none",
            markerfacecolor="none" if grid == "head_dim" else colour,
        )
        if grid == "head_dim":  # the H sweep: each point named by its H, away from the T sweep's points
            for p, dy in zip(ps, _dodge(ps)):
                side = 1 if p.intensity > r.ridge else -1  # right of the ridge to the right, left of it to the left
                right.annotate(
                    f"H={p.head_dim}",
                    (p.intensity, p.tflops),
                    xytext=(6 * side, dy),
                    textcoords="offset points",
                    fontsize=6,
                    color=colour,
                    va="center",
                    ha="left" if side > 0 else "right",
                )
    right.axvline(r.ridge, color="#bbbbbb", linewidth=0.8, label=f"ridge: {r.ridge:.0f} FLOPs per byte")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("FLOPs per byte of HBM traffic (from the shapes)")
    right.set_ylabel("TFLOP/s (recorded)")
    right.set_title("roofline: where each recorded call sits", fontsize=10)
    right.grid(True, which="major", color="#dddddd", linewidth=0.8)
    right.legend(fontsize=7, loc="lower right", frameon=True, facecolor="white")
    for a in (left, right):
        a.set_facecolor("white")
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


@dataclass(frozen=True)
class Floor:
    """The batch sweep of one implementation: its time at the smallest and largest B, the verdict of the largest
    against the smallest (:func:`~attention_tutorial.site.claims.compare`: "slower" means the larger batch takes
    measurably longer), and the fastest call of the whole sweep (every implementation), in ms."""

    impl: str
    small: dict
    large: dict
    claim: Claim
    fastest_ms: float

    @property
    def work_ratio(self) -> float:
        return self.large["batch"] / self.small["batch"]

    @property
    def time_ratio(self) -> float:
        return self.large["median_ms"] / self.small["median_ms"]

    @property
    def floor_us(self) -> float:
        """The fastest call in µs rounded down to 0.1 µs: no call of the sweep took less (39.85 µs -> 39.8)."""
        return math.floor(self.fastest_ms * 1e4 + 1e-6) / 10


def batch_floor(records, impl: str) -> Floor | None:
    """:class:`Floor` of ``impl`` in a batch sweep; None with fewer than two of its points."""
    mine = sorted(select(records, status="ok", impl=impl), key=lambda r: r["batch"])
    if len(mine) < 2:
        return None
    fastest = min(r["median_ms"] for r in select(records, status="ok"))
    return Floor(impl, mine[0], mine[-1], compare([mine[-1]], [mine[0]]), fastest)


def batch_figure(records, *, title: str = ""):
    """The batch sweep in µs per call: one line per implementation (median), its p10–p90 band, the y axis from
    zero (the fixed cost per call is the point)."""
    fig, ax = plt.subplots(figsize=(7.0, 4.2), facecolor="white", layout="constrained")
    for i, impl in enumerate(dict.fromkeys(r["impl"] for r in select(records, status="ok"))):
        rs = sorted(select(records, status="ok", impl=impl), key=lambda r: r["batch"])
        colour, marker = impl_style(impl, i)
        xs = [r["batch"] for r in rs]
        ax.plot(xs, [r["median_ms"] * 1e3 for r in rs], marker=marker, color=colour, label=label(impl))
        if all(r.get("p10_ms") is not None and r.get("p90_ms") is not None for r in rs):
            ax.fill_between(
                xs,
                [r["p10_ms"] * 1e3 for r in rs],
                [r["p90_ms"] * 1e3 for r in rs],
                color=colour,
                alpha=0.2,
                linewidth=0,
            )
    ax.set_xscale("log", base=2)
    batches = sorted({r["batch"] for r in select(records, status="ok")})
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("B (batch)")
    ax.set_ylabel("µs per call (median; band: p10–p90)")
    ax.grid(True, which="major", color="#dddddd", linewidth=0.8)
    ax.set_facecolor("white")
    ax.legend(fontsize=8, frameon=True, facecolor="white", loc="lower right")
    if title:
        ax.set_title(title, fontsize=11)
    return fig
