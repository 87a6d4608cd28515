"""Figures for the page on attention across several devices (context parallelism).

The page computes its numbers in its own cells, from :mod:`~attention_tutorial.kernels.context_parallel` and the
one-GPU records (:mod:`~attention_tutorial.measure.ring_cost`); this module draws what it shows: the two strategies,
the causal work per ring step, compute against transfer per step, and the ring's cost on one GPU, and turns ring
costs into table rows.

Shape legend: B batch, T sequence length, N query heads, K kv heads, H head dim, P devices.
"""

from __future__ import annotations

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..kernels import context_parallel as cp
from ..measure.ring_cost import ring_costs
from ..results.plotting import GREY, PALETTE

#: NVLink bandwidth of an H200 per direction, from NVIDIA's specification (900 GB/s in total): not measured here.
NVLINK_SPEC_GBPS_PER_DIRECTION = 450


def ring_schedule(devices: int) -> np.ndarray:
    """(P steps, P devices): whose K/V block each device holds at each ring step, (d − s) mod P."""
    if devices < 1:
        raise ValueError(f"devices must be at least 1; got {devices}.")
    step, device = np.meshgrid(np.arange(devices), np.arange(devices), indexing="ij")
    return (device - step) % devices


def _block(ax, x, y, j, size=0.64, own=False):
    ax.add_patch(
        Rectangle(
            (x - size / 2, y - size / 2),
            size,
            size,
            facecolor=PALETTE[j % len(PALETTE)],
            edgecolor="black",
            linewidth=2.0 if own else 0.6,
        )
    )
    ax.text(
        x,
        y,
        f"K/V {j}",
        ha="center",
        va="center",
        fontsize=8,
        color="black",
        bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.85},
    )


def _arrow(ax, start, end, **style):
    ax.add_patch(
        FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9, **{"color": GREY, "linewidth": 0.9, **style})
    )


#: The colour of the ring's wrap-around arrow, from the last device back to the first.
WRAP = "#c0392b"


def strategies_figure(devices: int = 4):
    """Both panels: one column per device. Left, all-gather: after one collective each device holds every K/V
    block at once (stacked). Right, ring: at each step (a row) each device holds one block, then passes it to the
    next device (grey arrows); the last device passes its block to the first (the red dashed arrow). A device's
    own block has a thick edge."""
    sched = ring_schedule(devices)
    fig, (ag, ring) = plt.subplots(1, 2, figsize=(10, 0.75 * devices + 1.6), facecolor="white", layout="constrained")
    for d in range(devices):
        for j in range(devices):
            _block(ag, d, j, j, own=j == d)
    ag.set_title("all-gather: every device holds all of K, V", pad=22)
    ag.set(ylabel="held at once, after one all-gather", yticks=[])
    for s in range(devices):
        for d in range(devices):
            _block(ring, d, s, int(sched[s, d]), own=s == 0)
            if s < devices - 1 and d < devices - 1:  # on to the next device, for the next step
                _arrow(ring, (d + 0.36, s + 0.12), (d + 0.64, s + 0.88))
        if s < devices - 1:  # the ring closes: the last device sends to the first
            _arrow(ring, (devices - 1 - 0.1, s + 0.37), (0.1, s + 0.63), color=WRAP, linestyle="--", linewidth=1.1)
    ring.set_title("ring: one block per step, passed on with ppermute", pad=22)
    ring.set(yticks=range(devices), yticklabels=[f"step {s}" for s in range(devices)])
    ring.legend(
        handles=[
            Line2D([], [], color=GREY, marker=">", label="to the next device"),
            Line2D([], [], color=WRAP, linestyle="--", marker=">", label=f"device {devices - 1} to device 0"),
        ],
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.02),
        ncols=2,
        frameon=False,
    )
    for ax in (ag, ring):
        ax.set(
            xlim=(-0.55, devices - 0.45),
            ylim=(devices - 0.45, -0.55),
            xticks=range(devices),
            xticklabels=[f"device {d}" for d in range(devices)],
        )
        ax.xaxis.tick_top()
        ax.set_aspect("equal")
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    return fig


def balance_figure(devices: int = 4, seq: int | None = None):
    """Score positions each device computes at each ring step (causal), one panel per layout, with the numbers."""
    seq = seq or 64 * devices
    fig, axes = plt.subplots(
        1, len(cp.LAYOUTS), figsize=(4.6 * len(cp.LAYOUTS), 3.4), facecolor="white", layout="constrained", sharey=True
    )
    for ax, layout in zip(axes, cp.LAYOUTS):
        work = cp.causal_work(seq, devices, layout)
        ax.imshow(work, cmap="viridis", vmin=0, vmax=cp.causal_work(seq, devices, "contiguous").max())
        for (s, d), w in np.ndenumerate(work):
            ax.text(
                d, s, f"{w:,}", ha="center", va="center", fontsize=8, color="white" if w < work.max() / 2 else "black"
            )
        busy = work.sum() / devices / work.max(axis=1).sum()  # all the work / (P × the busiest device's, per step)
        ax.set(
            title=f"{layout}: {busy:.0%} of devices' time busy",
            xlabel="device",
            xticks=range(devices),
            yticks=range(devices),
        )
    axes[0].set_ylabel("ring step")
    return fig


def overlap_figure(
    *,
    flops_per_s: float,
    bytes_per_s: float,
    heads: int = 32,
    kv_heads=(32, 8, 1),
    head_dim: int = 128,
    dtype="bfloat16",
    chunks=tuple(2**i for i in range(4, 16)),
    shortest_us: float | None = None,
):
    """Time of one ring step against the chunk T/P: compute (4·N·H·c² FLOPs, no mask) and the K/V transfer for
    each kv-head count, with the chunk where the transfer hides marked; ``shortest_us``, where given, the shortest
    attention call measured (a dotted line)."""
    c = np.asarray(chunks, float)
    fig, ax = plt.subplots(figsize=(7, 3.8), facecolor="white", layout="constrained")
    size = jnp.dtype(dtype).itemsize
    ax.plot(
        c, 4 * heads * head_dim * c**2 / flops_per_s * 1e6, color="black", linewidth=2, label=f"compute, N = {heads}"
    )
    for i, k in enumerate(kv_heads):
        ax.plot(
            c,
            2 * c * k * head_dim * size / bytes_per_s * 1e6,
            color=PALETTE[i],
            linestyle="--",
            label=f"K/V transfer, K = {k}",
        )
        hide = cp.chunk_to_hide_transfer(heads, k, dtype, flops_per_s=flops_per_s, bytes_per_s=bytes_per_s)
        ax.plot([hide], [2 * hide * k * head_dim * size / bytes_per_s * 1e6], "o", color=PALETTE[i])
    if shortest_us:
        ax.axhline(shortest_us, color=GREY, linestyle=":", linewidth=1.5, label="shortest attention call measured")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="tokens per device, T / P", ylabel="µs per ring step")
    ax.grid(True, color="#dddddd")
    ax.legend(fontsize=8, loc="upper left")
    return fig


def ring_cost_figure(records, title: str = ""):
    """Per-device time of an emulated ring over one call's, for each T (groups) and P (bars), one panel per mask,
    with the ideal 1 / P marked on each bar."""
    costs = [c for c in ring_costs(records) if c.pass_ == "fwd"]
    masks = sorted({c.causal for c in costs}, reverse=True)
    fig, axes = plt.subplots(
        1,
        max(len(masks), 1),
        figsize=(4.8 * max(len(masks), 1), 3.6),
        facecolor="white",
        layout="constrained",
        sharey=True,
        squeeze=False,
    )
    for ax, causal in zip(axes[0], masks):
        here = [c for c in costs if c.causal == causal]
        seqs = sorted({c.seq for c in here})
        ps = sorted({c.steps for c in here})
        width = 0.8 / len(ps)
        for i, p in enumerate(ps):
            for x, t in enumerate(seqs):
                cs = [c for c in here if c.seq == t and c.steps == p]
                if not cs:
                    continue
                pos = x + (i - (len(ps) - 1) / 2) * width
                ax.bar(
                    pos,
                    cs[0].per_device,
                    width * 0.9,
                    color=PALETTE[i],
                    edgecolor="black",
                    linewidth=0.5,
                    label=f"P = {p}" if x == 0 else None,
                )
                ax.plot([pos - width * 0.45, pos + width * 0.45], [1 / p, 1 / p], color="black", linewidth=1.5)
        ax.axhline(1.0, color=GREY, linestyle="--", linewidth=1)  # one call on one GPU
        ax.set_xticks(range(len(seqs)), [f"T = {t:,}" for t in seqs])
        ax.set_title("causal" if causal else "no mask", fontsize=10)
        ax.grid(True, axis="y", color="#dddddd")
    axes[0][0].set_ylabel("time per device / one call's time")
    handles, _ = axes[0][-1].get_legend_handles_labels()
    handles += [
        Line2D([], [], color="black", linewidth=1.5, label="ideal: 1 / P"),
        Line2D([], [], color=GREY, linestyle="--", linewidth=1, label="one GPU alone: 1"),
    ]
    axes[0][-1].legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def cost_rows(records) -> list[dict]:
    """Table rows of :func:`ring_costs`: T, mask, P, chunk, the three times and the ratios."""
    return [
        {
            "T": c.seq,
            "causal": c.causal,
            "P": c.steps,
            "chunk (tokens)": c.chunk,
            "calls per device": c.calls,
            "one call (ms)": f"{c.local_ms:.3f}",
            "ring, one device (ms)": "–" if c.ring_1dev_ms is None else f"{c.ring_1dev_ms:.3f}",
            "P steps emulated (ms)": f"{c.emulated_ms:.3f}",
            "emulated / one call": f"{c.over_local:.2f}",
            "per device": f"{c.per_device:.2f}",
            "ideal": f"{c.ideal:.2f}",
        }
        for c in ring_costs(records)
    ]
