"""The page "Fused attention": the two causal alignments when T ≠ S, drawn from the package's own masks."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from ..kernels.masks import causal_mask
from ..results.plotting import PALETTE


def alignment_figure(seq_q: int = 3, seq_kv: int = 6):
    """The top-left and bottom-right causal masks of ``seq_q`` queries against ``seq_kv`` keys, side by side.

    Each panel is :func:`~attention_tutorial.kernels.masks.causal_mask`'s matrix: filled where a query may attend.
    """
    fig, axes = plt.subplots(1, 2, figsize=(8, 2.4 + 0.25 * seq_q))
    cmap = ListedColormap(["#F2F2F2", PALETTE[0]])
    for ax, alignment in zip(axes, ("top_left", "bottom_right")):
        mask = np.asarray(causal_mask(seq_q, seq_kv, alignment=alignment), dtype=int)
        ax.imshow(mask, cmap=cmap, vmin=0, vmax=1)
        ax.set_xticks(range(seq_kv), [str(j) for j in range(seq_kv)])
        ax.set_yticks(range(seq_q), [str(i) for i in range(seq_q)])
        ax.set_xticks(np.arange(-0.5, seq_kv), minor=True)
        ax.set_yticks(np.arange(-0.5, seq_q), minor=True)
        ax.grid(which="minor", color="white", linewidth=2)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel("key position")
        ax.set_ylabel("new query")
        ax.set_title(alignment.replace("_", "-"), fontsize=10)
    fig.tight_layout()
    return fig
