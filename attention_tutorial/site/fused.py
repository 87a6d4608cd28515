"""The page "Fused attention": the two causal alignments when T ≠ S (drawn from the package's own masks), how far
TF32 rounding moves a float32 array, and how much a mask changes the outputs. Numbers and verdicts only: the
sentences are in ``docs/fused_attention.md``."""

from __future__ import annotations

from typing import NamedTuple

import jax
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from ..kernels.masks import causal_mask
from ..results.plotting import GREY, PALETTE
from .claims import TOLERANCES

TITLES = {"top_left": "top-left (is_causal=True)", "bottom_right": "bottom-right (what decoding needs)"}


def query_labels(seq_q: int, seq_kv: int) -> list[str]:
    """Row labels of the T new queries: 'query i (position S - T + i)', their places in a sequence of S tokens."""
    return [f"query {i} (position {seq_kv - seq_q + i})" for i in range(seq_q)]


def alignment_figure(seq_q: int = 3, seq_kv: int = 6):
    """The top-left and bottom-right causal masks of ``seq_q`` new queries against ``seq_kv`` keys, side by side.

    Each panel is :func:`~attention_tutorial.kernels.masks.causal_mask`'s matrix: filled where a query may attend.
    Rows are labelled by the queries' positions in the sequence (the last ``seq_q`` of ``seq_kv``), and a dashed line
    marks the key at each query's own position, which a correct causal mask must still include.
    """
    if seq_q > seq_kv:
        raise ValueError(
            f"the figure shows T new queries at the end of S positions: need T <= S; got {seq_q} > {seq_kv}"
        )
    fig, axes = plt.subplots(1, 2, figsize=(9, 1.6 + 0.45 * seq_q), sharey=True)
    cmap = ListedColormap(["#F2F2F2", PALETTE[0]])
    first = seq_kv - seq_q  # the position of query 0
    for ax, alignment in zip(axes, ("top_left", "bottom_right")):
        mask = np.asarray(causal_mask(seq_q, seq_kv, alignment=alignment), dtype=int)
        ax.imshow(mask, cmap=cmap, vmin=0, vmax=1)
        ax.set_xticks(range(seq_kv), [str(j) for j in range(seq_kv)])
        ax.set_yticks(range(seq_q), query_labels(seq_q, seq_kv))
        ax.set_xticks(np.arange(-0.5, seq_kv), minor=True)
        ax.set_yticks(np.arange(-0.5, seq_q), minor=True)
        ax.grid(which="minor", color="white", linewidth=2)
        ax.tick_params(which="minor", length=0)
        # the diagonal: query i sits at position first + i
        ax.plot(
            [first - 0.5, seq_kv - 0.5],
            [-0.5, seq_q - 0.5],
            color=PALETTE[3],
            linestyle="--",
            linewidth=2,
            label="the query's own position",
        )
        ax.set_xlabel("key position")
        ax.set_title(TITLES[alignment], fontsize=10)
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", frameon=False, fontsize=9, labelcolor=GREY)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def tf32_rounding(x) -> float:
    """The largest change rounding ``x`` (float32) to TF32 makes: 10 stored mantissa bits instead of 23, the rounding
    a tensor core applies to float32 inputs at JAX's default precision."""
    x = jax.numpy.asarray(x, jax.numpy.float32)
    return float(jax.numpy.max(jax.numpy.abs(x - jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10))))


def both_within(errors: dict[str, float], dtype: str) -> bool:
    """Whether every error in ``errors`` ({name: largest absolute difference from float64}) is within ``dtype``'s rounding tolerance
    (:data:`~attention_tutorial.site.claims.TOLERANCES`): then none of them adds error of its own."""
    if dtype not in TOLERANCES:
        raise ValueError(f"no tolerance for dtype {dtype!r}; choose from {sorted(TOLERANCES)}")
    if not errors:
        raise ValueError("errors must name at least one result")
    return all(0 <= e <= TOLERANCES[dtype] for e in errors.values())


MASK_CLEAR = 0.1  # a change of at least a tenth of the outputs' size is the mask's doing, not rounding


class MaskEffect(NamedTuple):
    """How much a mask changed some outputs: the largest difference, the largest output, their ratio, and a word."""

    diff: float
    size: float
    ratio: float
    word: str


def mask_effect(masked, unmasked) -> MaskEffect:
    """How much a mask changes outputs against their size: ratio = the largest absolute difference between masked and
    unmasked outputs over the largest absolute output of either. Word "of the same order as the outputs themselves" (ratio >= :data:`MASK_CLEAR`), else "small beside the
    outputs"."""
    a, b = np.asarray(masked, np.float64), np.asarray(unmasked, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"masked and unmasked outputs must have one shape; got {a.shape} and {b.shape}")
    diff, size = float(np.max(np.abs(a - b))), float(max(np.max(np.abs(a)), np.max(np.abs(b))))
    ratio = diff / size if size else 0.0
    word = "of the same order as the outputs themselves" if ratio >= MASK_CLEAR else "small beside the outputs"
    return MaskEffect(diff, size, ratio, word)
