"""The figure of the page on shared keys and values (MHA, GQA, MQA and decoding) that takes more than a few lines:
which kv head each query head reads; and the GPUs' processor counts its sentences use.

The numbers and the sentences are in ``docs/heads_decode.md``, computed there from the records.
Shape legend: B batch, T query length, S key length, N query heads, K kv heads, H head dim.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..results.plotting import PALETTE

#: Streaming multiprocessors per GPU (NVIDIA's datasheets), by the name a result file records.
SMS = {"NVIDIA H200": 132, "NVIDIA H100 80GB HBM3": 132, "NVIDIA A100-SXM4-80GB": 108, "NVIDIA A100-SXM4-40GB": 108}


def sharing_figure(heads: int = 8, layouts=(("MHA", 8), ("GQA", 2), ("MQA", 1))):
    """One panel per (name, K) layout: the N query heads on top, the K kv heads below, a line from each query head
    to the kv head it reads, n // (N / K), coloured by kv head."""
    fig, axes = plt.subplots(1, len(layouts), figsize=(3.2 * len(layouts), 2.4), layout="constrained", squeeze=False)
    for ax, (name, kv) in zip(axes[0], layouts):
        owner = np.arange(heads) // (heads // kv)  # the kv head each query head reads
        kv_x = (np.arange(kv) + 0.5) * heads / kv - 0.5  # each kv head centred under its group
        colours = [PALETTE[j % len(PALETTE)] for j in range(kv)]
        for n, j in enumerate(owner):
            ax.plot([n, kv_x[j]], [1, 0], color=colours[j], linewidth=1.2)
        ax.scatter(range(heads), np.ones(heads), 140, [colours[j] for j in owner], marker="s", edgecolors="k", zorder=3)
        ax.scatter(kv_x, np.zeros(kv), 260, colours, marker="o", edgecolors="k", zorder=3)
        ax.set(title=f"{name}: N = {heads}, K = {kv}", xlim=(-0.8, heads - 0.2), ylim=(-0.45, 1.45), xticks=[])
        ax.set_yticks([0, 1], ["k, v heads", "query heads"])
        ax.tick_params(length=0)
        ax.spines[:].set_visible(False)
    return fig
