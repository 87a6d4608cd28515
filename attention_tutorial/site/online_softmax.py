"""The figures of "How can softmax run one tile at a time?": the running max and sum of the online softmax, and the
tiles a query block walks. The page runs both walks in its own cells; these functions only draw them.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ..results.plotting import GREY, PALETTE


def online_softmax_figure(scores, steps, block: int):
    """One row of ``scores`` walked in blocks of ``block`` keys; ``steps`` holds, after each block, the running max
    m, the sum carried over from earlier blocks (rescaled to m) and the block's own sum. Top: the scores and the
    running max. Bottom: the running sum l, the carried part below and the added part on top."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.6, 5.2), sharex=True, layout="constrained")
    for i, (m, carried, added) in enumerate(steps):
        a, b = i * block, min((i + 1) * block, len(scores))
        first = i == 0  # label each kind of mark once
        for ax in (top, bottom):
            ax.axvspan(a - 0.5, b - 0.5, color="#f2f2f2" if i % 2 else "white", zorder=0)
        top.plot(range(a, b), scores[a:b], "o", color=PALETTE[0], label="scores of the row" if first else None)
        top.hlines(m, a - 0.5, b - 0.5, color=PALETTE[3], linewidth=2.2, label="running max m" if first else None)
        top.text((a + b - 1) / 2, 1.02, f"block {i + 1}", transform=top.get_xaxis_transform(), ha="center", color=GREY)
        carried_label = "carried over, × exp(m_old − m_new)" if first else None
        bottom.bar((a + b - 1) / 2, carried, 0.8 * (b - a), color=PALETTE[5], label=carried_label)
        added_label = "added by this block" if first else None
        bottom.bar((a + b - 1) / 2, added, 0.8 * (b - a), bottom=carried, color=PALETTE[1], label=added_label)
    top.set_ylabel("score sⱼ")
    top.legend(fontsize=8, loc="lower right")
    bottom.set(ylabel="running sum l", xlabel=f"key j (blocks of {block})")
    bottom.legend(fontsize=8, loc="upper left")
    return fig


#: Tile colours of :func:`tiles_figure`: the followed query block's tiles by kind, and every other block's tiles.
TILE_COLOURS = {"full": PALETTE[0], "masked": PALETTE[1], "skipped": "#ececec", "other": "#c9d9ea"}


def tiles_figure(n: int = 6, *, query_block: int = 3):
    """The T × S score matrix in n × n tiles, without a mask and causal side by side: the tiles of ``query_block``
    numbered in the order its loop walks them; with the causal mask the diagonal tile is masked inside and every
    tile after the diagonal (in every row) is skipped."""
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 4.6), layout="constrained")
    for ax, causal in zip(axes, (False, True)):
        for i in range(n):
            for j in range(n):
                kind = "full" if not causal or j < i else "masked" if j == i else "skipped"
                face = TILE_COLOURS[kind if i == query_block or kind == "skipped" else "other"]
                ax.add_patch(Rectangle((j, n - 1 - i), 1, 1, facecolor=face, edgecolor="white", linewidth=1.5))
                if i == query_block and kind != "skipped":
                    ax.text(j + 0.5, n - 0.5 - i, str(j + 1), ha="center", va="center", color="white")
        ax.add_patch(Rectangle((0, n - 1 - query_block), n, 1, fill=False, edgecolor="#333333", linewidth=1.6))
        title = "causal: skip what lies after the diagonal" if causal else "no mask: every tile"
        ax.set(xlim=(0, n), ylim=(0, n), aspect="equal", xticks=[], yticks=[], title=title)
        ax.set(xlabel="keys (S) →", ylabel="← queries (T)")
    names = {
        "full": "computed (number: order of the loop)",
        "masked": "on the diagonal: computed, masked inside",
        "skipped": "skipped: never computed",
        "other": "tiles of the other query blocks",
    }
    handles = [Patch(facecolor=TILE_COLOURS[k], edgecolor="#bbbbbb", label=name) for k, name in names.items()]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    return fig
