"""The page "Q, K, V and attention from scratch": the score matrix and what storing it costs.

:func:`head_bytes` counts, from the shapes alone, the bytes one head's T × S score matrix takes beside its q, k, v and
output; :func:`score_matrix_figure` draws the matrix of a small causal example and those bytes as T grows.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

from ..results.plotting import PALETTE


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
    left.imshow(np.where(w > 0, w, np.nan), cmap="Blues", vmin=0)
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
