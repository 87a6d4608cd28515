"""The figures of "How can softmax run one tile at a time?": the online softmax traced step by step, and the tiles a
query block walks. The page's checks (the tiled version against float64 and the naive gradients, the compiled
memory, the naive version's HBM bytes at one recorded point) run in its own cells.
"""

from __future__ import annotations

import dataclasses
import itertools

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from ..results.plotting import GREY, PALETTE

# --- the online softmax, one row ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OnlineStep:
    """The running state of one query row after a block of keys: keys seen so far, the running max ``m``, the sum
    carried over from earlier blocks rescaled to the new max (``carried``), this block's own sum (``added``),
    ``l = carried + added``, and the output ``acc / l`` so far."""

    keys_seen: int
    m: float
    carried: float
    added: float
    out: float

    @property
    def l(self) -> float:  # noqa: E743  (the name the papers and the kernels use)
        return self.carried + self.added


def online_softmax_steps(scores, values, block: int) -> list[OnlineStep]:
    """Walk one row's ``scores`` (S,) and ``values`` (S,) in blocks of ``block`` keys, as a FlashAttention kernel
    does, in float64: after each block, :class:`OnlineStep`. The last step's ``out`` is softmax(scores) · values."""
    s = np.asarray(scores, np.float64)
    v = np.asarray(values, np.float64)
    if s.ndim != 1 or s.shape != v.shape or not s.size:
        raise ValueError(
            f"online_softmax_steps takes one row: scores and values of one equal length (S,); got "
            f"shapes {s.shape} and {v.shape}."
        )
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int (keys per block); got {block!r}.")
    m, l, acc, steps = -np.inf, 0.0, 0.0, []
    for start in range(0, s.size, block):
        sb, vb = s[start : start + block], v[start : start + block]
        m_new = max(m, float(sb.max()))
        rescale = float(np.exp(m - m_new))  # exp(-inf) = 0 before the first block
        p = np.exp(sb - m_new)
        carried, added = rescale * l, float(p.sum())
        l, acc, m = carried + added, rescale * acc + float(p @ vb), m_new
        steps.append(OnlineStep(start + sb.size, m, carried, added, acc / l))
    return steps


def online_softmax_figure(scores, values, block: int):
    """Two panels for one row walked in blocks: the scores with the running max after each block, and the running
    sum l after each block split into what was carried over (rescaled to the new max) and what the block added."""
    steps = online_softmax_steps(scores, values, block)
    s = np.asarray(scores, np.float64)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.6, 5.2), sharex=True, layout="constrained", facecolor="white")
    edges = [0, *[st.keys_seen for st in steps]]
    for i, (a, b) in enumerate(itertools.pairwise(edges)):
        for ax in (top, bottom):
            ax.axvspan(a - 0.5, b - 0.5, color="#f2f2f2" if i % 2 else "white", zorder=0)
        top.plot(range(a, b), s[a:b], "o", color=PALETTE[0], markersize=5, zorder=3)
        top.hlines(steps[i].m, a - 0.5, b - 0.5, color=PALETTE[3], linewidth=2.2, zorder=2)
        if i:
            top.vlines(a - 0.5, steps[i - 1].m, steps[i].m, color=PALETTE[3], linewidth=1.2, linestyle=":")
        mid = (a + b - 1) / 2
        top.text(
            mid,
            1.02,
            f"block {i + 1}",
            transform=top.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=8,
            color=GREY,
        )
        bottom.bar(mid, steps[i].carried, width=0.8 * (b - a), color=PALETTE[5], zorder=2)
        bottom.bar(mid, steps[i].added, width=0.8 * (b - a), bottom=steps[i].carried, color=PALETTE[1], zorder=2)
    top.set_ylabel("score sⱼ")
    top.legend(
        handles=[
            plt.Line2D([], [], marker="o", linestyle="", color=PALETTE[0], label="scores of the row"),
            plt.Line2D([], [], color=PALETTE[3], linewidth=2.2, label="running max m"),
        ],
        fontsize=8,
        loc="lower right",
    )
    bottom.set_ylabel("running sum l")
    bottom.set_xlabel(f"key j (blocks of {block})")
    bottom.legend(
        handles=[
            Patch(color=PALETTE[5], label="carried over, × exp(m_old − m_new)"),
            Patch(color=PALETTE[1], label="added by this block"),
        ],
        fontsize=8,
        loc="upper left",
    )
    for ax in (top, bottom):
        ax.grid(True, axis="y", color="#dddddd", linewidth=0.8)
    return fig


# --- tiles walking the keys -----------------------------------------------------------------------------------------


def tile_walk(n_q: int, n_k: int, *, causal: bool) -> dict[tuple[int, int], str]:
    """{(query block, key block): 'full', 'masked' or 'skipped'} for square tiles: with a causal mask a key block
    wholly after the query block is skipped and the diagonal one masked; without one every block is 'full'."""
    if n_q < 1 or n_k < 1:
        raise ValueError(f"tile_walk needs at least one block each way; got {n_q} × {n_k}.")
    return {
        (i, j): ("full" if not causal or j < i else "masked" if j == i else "skipped")
        for i in range(n_q)
        for j in range(n_k)
    }


#: Tile colours of :func:`tiles_figure`: the query block the figure follows, by kind, and every other block's tiles.
TILE_COLOURS = {"full": PALETTE[0], "masked": PALETTE[1], "skipped": "#ececec", "other": "#c9d9ea"}


def tiles_figure(n_q: int = 6, n_k: int = 6, *, query_block: int = 3):
    """The T × S score matrix cut into tiles, without a mask and causal side by side: one query block's row of tiles
    outlined and numbered in the order its loop walks them; with the causal mask, the one it masks and the ones it
    skips (skipped tiles have one colour in every row, the legend's)."""
    if not 0 <= query_block < n_q:
        raise ValueError(f"query_block must be one of the {n_q} query blocks (0 to {n_q - 1}); got {query_block}.")
    colours = TILE_COLOURS
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 4.6), layout="constrained", facecolor="white")
    for ax, causal in zip(axes, (False, True)):
        walk = tile_walk(n_q, n_k, causal=causal)
        step = 0
        for (i, j), kind in walk.items():
            active = i == query_block
            face = colours[kind] if active or kind == "skipped" else colours["other"]
            ax.add_patch(Rectangle((j, n_q - 1 - i), 1, 1, facecolor=face, edgecolor="white", linewidth=1.5))
            if active and kind != "skipped":
                step += 1
                ax.text(j + 0.5, n_q - 0.5 - i, str(step), ha="center", va="center", color="white", fontsize=10)
        ax.add_patch(
            Rectangle((0, n_q - 1 - query_block), n_k, 1, fill=False, edgecolor="#333333", linewidth=1.6, zorder=3)
        )
        ax.set_xlim(0, n_k)
        ax.set_ylim(0, n_q)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("keys (S) →")
        ax.set_ylabel("← queries (T)")
        ax.set_title("causal: skip what lies after the diagonal" if causal else "no mask: every tile", fontsize=10)
    fig.legend(
        handles=[
            Patch(color=colours["full"], label="computed (number: order of the loop)"),
            Patch(color=colours["masked"], label="on the diagonal: computed, masked inside"),
            Patch(facecolor=colours["skipped"], edgecolor="#bbbbbb", label="skipped: never computed"),
            Patch(color=colours["other"], label="tiles of the other query blocks"),
        ],
        loc="outside lower center",
        ncol=2,
        fontsize=8,
        frameon=False,
    )
    return fig
