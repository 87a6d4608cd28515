"""The page "Q, K, V and attention from scratch": the score matrix and what storing it costs.

:func:`head_bytes` counts, from the shapes alone, the bytes one head's T × S score matrix takes beside its q, k, v and
output; :func:`score_matrix_figure` draws the matrix of a small causal example and those bytes as T grows;
:func:`matrices_per_head`, :func:`row_steps` and :func:`recorded_naive_memory` read the measured temporary bytes;
:func:`difference_note` says why two outputs differ (or do not) on the backend that ran them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from ..results.plotting import PALETTE

MASKED_LABEL = "stored, never used"
MASKED_GREY = (0.72, 0.72, 0.72, 1.0)  # the masked triangle: grey, not white like a small weight


@dataclass(frozen=True)
class HeadBytes:
    """Bytes of one head at one length: the T × S matrix against the four (T or S) × H tensors."""

    seq: int
    matrix: int  # T × S scores (the weights are as large again)
    tensors: int  # q, k, v and the output

    @property
    def ratio(self) -> float:
        return self.matrix / self.tensors


def _check_sizes(**sizes) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def head_bytes(seq: int, head_dim: int = 128, itemsize: int = 2) -> HeadBytes:
    """One head with T = S = ``seq``: the score matrix's bytes and q, k, v, o's, in elements of ``itemsize`` bytes."""
    _check_sizes(seq=seq, head_dim=head_dim, itemsize=itemsize)
    return HeadBytes(seq, seq * seq * itemsize, 4 * seq * head_dim * itemsize)


def causal_weights(seq: int = 16, head_dim: int = 8, seed: int = 0) -> np.ndarray:
    """softmax(q kᵀ / √H) of one small causal head (T = S = ``seq``), in float64: what the figure shows."""
    _check_sizes(seq=seq, head_dim=head_dim)
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, seq, head_dim))
    s = q @ k.T / np.sqrt(head_dim)
    s = np.where(np.tril(np.ones((seq, seq), bool)), s, -np.inf)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return w / w.sum(axis=1, keepdims=True)


def score_matrix_figure(seqs=(1024, 2048, 4096, 8192, 16384, 32768, 65536), head_dim: int = 128):
    """Left: the weights of a small causal head. Right: one head's T × S matrix against q, k, v, o, bf16, by T."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [1, 1.3]})
    w = causal_weights()
    cmap = matplotlib.colormaps["Blues"].with_extremes(bad=MASKED_GREY)
    masked = np.triu(np.ones(w.shape, bool), k=1)
    left.imshow(np.ma.masked_array(w, masked), cmap=cmap, vmin=0)
    left.text(
        0.97,
        0.97,
        MASKED_LABEL.replace(", ", ",\n"),
        transform=left.transAxes,
        ha="right",
        va="top",
        fontsize=9,
        color="0.15",
    )
    left.set_title("softmax(q·kᵀ/√H), causal, T = S = 16", fontsize=10)
    left.set_xticks(range(0, len(w), 4))
    left.set_yticks(range(0, len(w), 4))
    left.set_xlabel("key position s")
    left.set_ylabel("query position t")
    rows = [head_bytes(t, head_dim) for t in seqs]
    mib = 2**20
    right.loglog(seqs, [r.matrix / mib for r in rows], "o-", color=PALETTE[3], label="T × S scores (bf16)")
    right.loglog(seqs, [r.tensors / mib for r in rows], "s-", color=PALETTE[0], label=f"q, k, v, o (H = {head_dim})")
    right.set_xscale("log", base=2)
    right.set_xlabel("T = S")
    right.set_ylabel("MiB per head")
    right.set_title("what one head stores: the matrix grows as T²", fontsize=10)
    right.legend(frameon=False)
    right.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def matrices_per_head(temp_bytes: int, seq: int, heads: int, itemsize: int, batch: int = 1) -> float:
    """How many T × T matrices of ``itemsize``-byte elements per head (T = S = ``seq``) ``temp_bytes`` amount to."""
    _check_sizes(seq=seq, heads=heads, itemsize=itemsize, batch=batch)
    return temp_bytes / (batch * heads * seq * seq * itemsize)


def row_steps(xs, ys) -> tuple[list[float], list[float]]:
    """The factors from one row to the next: (x[i+1] / x[i], y[i+1] / y[i]) for each neighbouring pair."""
    if len(xs) != len(ys) or len(xs) < 2 or any(v <= 0 for v in (*xs, *ys)):
        raise ValueError(f"row_steps needs two or more positive (x, y) pairs; got {list(zip(xs, ys))}")
    return [b / a for a, b in itertools.pairwise(xs)], [b / a for a, b in itertools.pairwise(ys)]


ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def recorded_naive_memory(records, grid: str = "seq_short") -> list[dict]:
    """The naive forward's temporary bytes in recorded ``records`` (one grid, no mask, not causal), by T, with the
    count of T × T matrices per head in the run's own dtype."""
    rows = [
        r
        for r in records
        if r.get("impl") == "naive"
        and r.get("grid") == grid
        and r.get("pass") == "fwd"
        and r.get("mask") == "none"
        and not r.get("causal")
        and r.get("status") == "ok"
        and r.get("temp_bytes")
        and r.get("seq_q") == r.get("seq_kv")
    ]
    return [
        {
            "T": r["seq_q"],
            "B": r["batch"],
            "N": r["heads"],
            "H": r["head_dim"],
            "dtype": r["dtype"],
            "temporary MiB": round(r["temp_bytes"] / 2**20, 1),
            "T × T matrices per head": round(
                matrices_per_head(r["temp_bytes"], r["seq_q"], r["heads"], ITEMSIZE[r["dtype"]], r["batch"]), 2
            ),
        }
        for r in sorted(rows, key=lambda r: r["seq_q"])
    ]


def difference_note(diff: float, backend: str) -> str:
    """Why two float32 attentions printed ``diff`` apart on ``backend`` ("cpu", "gpu", ...)."""
    if diff == 0 and backend == "cpu":
        return "exactly 0 here because this page ran on a CPU, where float32 products stay float32"
    if backend == "gpu":
        return f"{diff:.1e} here: on a GPU, float32 products round to TF32 by default"
    return f"{diff:.1e} here, rounding of float32 products on {backend.upper()}"
