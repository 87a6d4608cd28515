"""Figures for the page on attention across several devices (context parallelism): the two strategies, the causal
work per ring step, compute against transfer per step, and the ring's cost on one GPU.

The page computes its numbers in its own cells, from :mod:`~attention_tutorial.kernels.context_parallel` and the
one-GPU records (:mod:`~attention_tutorial.measure.ring_cost`). Shape legend: N query heads, K kv heads, H head dim,
P devices.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.lines import Line2D

from ..kernels import context_parallel as cp
from ..results.plotting import GREY, PALETTE

#: NVLink bandwidth of an H200 per direction, from NVIDIA's specification (900 GB/s in total): not measured here.
NVLINK_SPEC_GBPS_PER_DIRECTION = 450
#: The colour of the ring's wrap-around arrow, from the last device back to the first.
WRAP = "#c0392b"


def strategies_figure(devices: int = 4):
    """One column per device, each cell a K/V block coloured by the device it belongs to. Left, all-gather: after one
    collective every device holds every block at once. Right, ring: at step s (a row) device d holds the block of
    device d − s, then passes it to the next device (grey arrows; the last device's goes to the first, red)."""
    P = devices
    held = {
        "all-gather: every device holds all of K, V": np.repeat(np.arange(P)[:, None], P, axis=1),
        "ring: one block per step, passed on with ppermute": (np.arange(P)[None, :] - np.arange(P)[:, None]) % P,
    }
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.75 * P + 1.6), layout="constrained")
    for ax, (title, blocks) in zip(axes, held.items()):
        ax.imshow(blocks, cmap=ListedColormap(PALETTE[:P]), vmin=-0.5, vmax=P - 0.5)
        for (row, d), j in np.ndenumerate(blocks):
            ax.text(d, row, f"K/V {j}", ha="center", va="center", fontsize=8, backgroundcolor="white")
        ax.set_title(title, pad=22)
        ax.set_xticks(range(P), [f"device {d}" for d in range(P)])
        ax.set_xticks(np.arange(P + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(P + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="white", linewidth=8)  # white gaps between the blocks
        ax.xaxis.tick_top()
        ax.tick_params(which="both", length=0)
    axes[0].set(yticks=[], ylabel="held at once, after one all-gather")
    axes[1].set_yticks(range(P), [f"step {s}" for s in range(P)])
    for s in range(P - 1):  # each block on to the next device, for the next step
        for d in range(P):
            wrap = d == P - 1  # the last device's block goes back to the first, across the row
            start = (d - 0.1, s + 0.35) if wrap else (d + 0.3, s + 0.3)
            style = {
                "arrowstyle": "-|>",
                "color": WRAP if wrap else "black",
                "linestyle": "--" if wrap else "-",
                "lw": 1.3,
            }
            axes[1].annotate("", (0.1 if wrap else d + 0.7, s + 0.65), start, arrowprops=style)
    handles = [
        Line2D([], [], color="black", label="to the next device"),
        Line2D([], [], color=WRAP, linestyle="--", label=f"device {P - 1} to device 0"),
    ]
    axes[1].legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncols=2, frameon=False)
    return fig


def balance_figure(devices: int = 4, seq: int | None = None):
    """Score positions each device computes at each ring step (causal), one panel per layout, with the numbers."""
    seq = seq or 64 * devices
    fig, axes = plt.subplots(1, len(cp.LAYOUTS), figsize=(9.2, 3.4), layout="constrained", sharey=True)
    for ax, layout in zip(axes, cp.LAYOUTS):
        work = cp.causal_work(seq, devices, layout)
        ax.imshow(work, vmin=0, vmax=cp.causal_work(seq, devices, "contiguous").max())
        for (s, d), w in np.ndenumerate(work):
            ax.text(d, s, f"{w:,}", ha="center", va="center", fontsize=8, color="white" if w < work.max() / 2 else "k")
        busy = work.sum() / devices / work.max(axis=1).sum()  # all the work / (P × the busiest device's, per step)
        ax.set(title=f"{layout}: {busy:.0%} of devices' time busy", xlabel="device", xticks=range(devices))
    axes[0].set(ylabel="ring step", yticks=range(devices))
    return fig


def overlap_figure(*, flops_per_s, bytes_per_s, heads=32, kv_heads=(32, 8, 1), head_dim=128, shortest_us=None):
    """Time of one ring step against the chunk c = T/P, in bf16: compute (4·N·H·c² FLOPs, no mask) and the K/V
    transfer (2·c·K·H·2 bytes) for each kv-head count K, a dot where the transfer hides; ``shortest_us``, where given,
    the shortest attention call measured (dotted)."""
    c = 2.0 ** np.arange(4, 16)
    fig, ax = plt.subplots(figsize=(7, 3.8), layout="constrained")
    ax.plot(c, 4 * heads * head_dim * c**2 / flops_per_s * 1e6, color="black", lw=2, label=f"compute, N = {heads}")
    for i, k in enumerate(kv_heads):
        send_us = 2 * c * k * head_dim * 2 / bytes_per_s * 1e6
        ax.plot(c, send_us, "--", color=PALETTE[i], label=f"K/V transfer, K = {k}")
        hide = cp.chunk_to_hide_transfer(heads, k, "bfloat16", flops_per_s=flops_per_s, bytes_per_s=bytes_per_s)
        ax.plot([hide], [2 * hide * k * head_dim * 2 / bytes_per_s * 1e6], "o", color=PALETTE[i])
    if shortest_us:
        ax.axhline(shortest_us, color=GREY, linestyle=":", linewidth=1.5, label="shortest attention call measured")
    ax.set(xscale="log", yscale="log", xlabel="tokens per device, T / P", ylabel="µs per ring step")
    ax.set_xscale("log", base=2)
    ax.grid(True, color="#dddddd")
    ax.legend(fontsize=8, loc="upper left")
    return fig


def ring_cost_figure(costs, title: str = ""):
    """Each device's share of an emulated ring's time over one call's (:class:`~attention_tutorial.measure.ring_cost.
    RingCost`), against P: one line per T, one panel per mask; the ideal 1 / P dotted, one GPU alone (1) dashed."""
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6), layout="constrained", sharey=True)
    ps = sorted({c.steps for c in costs})
    for ax, causal in zip(axes, (True, False)):
        for i, t in enumerate(sorted({c.seq for c in costs})):
            cs = sorted((c for c in costs if c.seq == t and c.causal == causal), key=lambda c: c.steps)
            ax.plot([c.steps for c in cs], [c.per_device for c in cs], "o-", color=PALETTE[i], label=f"T = {t:,}")
        ax.plot(ps, [1 / p for p in ps], ":", color="black", label="ideal: 1 / P")
        ax.axhline(1.0, color=GREY, linestyle="--", linewidth=1, label="one GPU alone: 1")
        ax.set(title="causal" if causal else "no mask", xlabel="P (devices)", xticks=ps, ylim=(0, 1.1))
        ax.grid(True, axis="y", color="#dddddd")
    axes[0].set_ylabel("time per device / one call's time")
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title, fontsize=11)
    return fig
