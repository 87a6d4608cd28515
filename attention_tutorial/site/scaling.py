"""The scaling page's IO figure: a time budget (a call's measured time against the time its bytes and its FLOPs take)
beside a roofline. The numbers and the sentences are in ``docs/scaling.md``; the roof and the IO points are
:mod:`attention_tutorial.measure.roofline`'s.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..measure.roofline import IOPoint, Roof
from ..results.plotting import impl_style, label

#: How the roofline marks each sweep's points: (marker, legend words). Filled for the T sweep, hollow for the H sweep.
SWEEP_STYLE = {"seq_long": ("o", "T sweep"), "head_dim": ("s", "H sweep")}


def io_figure(budget: list[IOPoint], cloud: list[IOPoint], r: Roof, *, title: str = ""):
    """Left, a time budget: for each point of ``budget`` (one shape), the measured time, the time its bytes take at
    the read ceiling and the time its FLOPs take at the matmul peak. Right, a roofline: every point of ``cloud`` at
    its FLOPs per byte against its TFLOP/s, under the measured roof (solid) and the datasheet's (dashed); colour
    names the implementation, the marker its sweep (:data:`SWEEP_STYLE`), and each H-sweep point is labelled with
    its H on the side away from the ridge."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.0, 4.2), layout="constrained", width_ratios=(1, 1.25))
    kinds = (("measured time", 1.0), ("its bytes at the read ceiling", 0.55), ("its FLOPs at the matmul peak", 0.25))
    for i, p in enumerate(budget):
        for j, ((name, alpha), ms) in enumerate(zip(kinds, (p.median_ms, r.bytes_ms(p), r.matmul_ms(p)))):
            y = i + (1 - j) * 0.26
            left.barh(y, ms, height=0.23, color=impl_style(p.impl)[0], alpha=alpha)
            left.text(ms, y, f" {ms:.2f} ms" + ("" if i else f"  {name}"), va="center", fontsize=7)
    left.set_yticks(range(len(budget)), [label(p.impl) for p in budget], fontsize=8)
    left.set(xlabel="ms per call", xlim=(0, max(p.median_ms for p in budget) * 1.9))
    b = budget[0]
    left.set_title(f"time budget at B = {b.batch}, T = S = {b.seq_q}, H = {b.head_dim}", fontsize=10)
    xs = np.logspace(0, 4.5, 200)
    measured = f"measured roof: {r.peak_tflops:.0f} TFLOP/s, {r.gbps / 1e3:.2f} TB/s"
    right.plot(xs, [r.cap(x) for x in xs], color="#333333", linewidth=1.6, label=measured)
    if r.datasheet_tflops and r.datasheet_gbps:
        sheet = f"datasheet roof: {r.datasheet_tflops:.0f} TFLOP/s, {r.datasheet_gbps / 1e3:.1f} TB/s"
        right.plot(xs, np.minimum(r.datasheet_tflops, xs * r.datasheet_gbps / 1e3), "--", color="#999999", label=sheet)
    for impl, grid in dict.fromkeys((p.impl, p.grid) for p in cloud):
        colour = impl_style(impl)[0]
        marker, sweep = SWEEP_STYLE.get(grid, (impl_style(impl)[1], None))
        ps = sorted((p for p in cloud if (p.impl, p.grid) == (impl, grid)), key=lambda p: p.tflops)
        face = "none" if grid == "head_dim" else colour
        name = f"{label(impl)}, {sweep}" if sweep else label(impl)
        xy = [p.intensity for p in ps], [p.tflops for p in ps]
        right.plot(*xy, marker, color=colour, markerfacecolor=face, linestyle="none", label=name)
        for k, p in enumerate(ps if grid == "head_dim" else ()):
            side = 1 if p.intensity > r.ridge else -1  # right of the ridge to the right, left of it to the left
            below, above = ps[k - 1].tflops if k else 0, ps[k + 1].tflops if k + 1 < len(ps) else np.inf
            offset = (6 * side, 4 * (p.tflops < 1.2 * below) - 4 * (above < 1.2 * p.tflops))  # apart from a close one
            style = {"fontsize": 6, "color": colour, "va": "center", "ha": "left" if side > 0 else "right"}
            right.annotate(
                f"H={p.head_dim}", (p.intensity, p.tflops), xytext=offset, textcoords="offset points", **style
            )
    right.axvline(r.ridge, color="#bbbbbb", linewidth=0.8, label=f"ridge: {r.ridge:.0f} FLOPs per byte")
    right.set(xscale="log", yscale="log", xlabel="FLOPs per byte of HBM traffic (from the shapes)")
    right.set(ylabel="TFLOP/s (recorded)")
    right.set_title("roofline: where each recorded call sits", fontsize=10)
    right.grid(True, color="#dddddd")
    right.legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=11)
    return fig
