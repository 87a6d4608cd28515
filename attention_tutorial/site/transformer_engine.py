"""The figures of the page "TransformerEngine and FP8": a speed ratio against T with its range over runs (TE against
JAX's cuDNN path, FP8 against bf16), the formats' bit fields, and the names of TE's attention backends.

The page reads the records, pairs the points and judges them in its own cells (``docs/transformer_engine.md``); the
rows it draws carry ``series`` (the line's name), ``seq_q``, ``ratio`` (the other's time over this one's) and
``low``/``high`` (its range over runs, from :func:`attention_tutorial.site.claims.compare`).
"""

from __future__ import annotations

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

from ..results.plotting import GREY, LINESTYLES, PALETTE

# TE's fused-attention backends (``NVTE_Fused_Attn_Backend``) in words
BACKENDS = {
    "NVTE_F16_arbitrary_seqlen": "cuDNN's flash-attention backend",
    "NVTE_F16_max512_seqlen": "cuDNN's backend for sequences up to 512",
    "NVTE_FP8": "cuDNN's FP8 backend",
    "NVTE_No_Backend": "no fused backend (TE falls back to unfused attention)",
}


def ratio_figure(rows, *, ylabel: str, title: str):
    """One line per ``series`` of ``rows``: ``ratio`` against T, the range over runs as error bars; 1 (the same
    speed) as a grey line."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
    for i, name in enumerate(dict.fromkeys(r["series"] for r in rows)):
        rs = sorted((r for r in rows if r["series"] == name), key=lambda r: r["seq_q"])
        ratio = np.array([r["ratio"] for r in rs])
        err = [ratio - [r["low"] for r in rs], [r["high"] for r in rs] - ratio]
        style = {"color": PALETTE[i % len(PALETTE)], "linestyle": LINESTYLES[i % len(LINESTYLES)]}
        ax.errorbar([r["seq_q"] for r in rs], ratio, yerr=err, marker="o", capsize=3, label=name, **style)
    ax.axhline(1.0, color=GREY, linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="T = S", ylabel=ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig


def table_rows(rows, fields=("seq_q", "head_dim", "pass")) -> list[dict]:
    """Rows of ratios for a table: the point's ``fields``, the ratio to 2 decimals, its range over runs as one
    cell, the verdict (``word``)."""
    return [
        {
            **{f: r[f] for f in fields if f in r},
            "ratio": f"{r['ratio']:.2f}",
            "range over runs": f"{r['low']:.2f}–{r['high']:.2f}",
            "verdict": r["word"],
        }
        for r in rows
    ]


FORMATS = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "FP8 E4M3": jnp.float8_e4m3fn, "FP8 E5M2": jnp.float8_e5m2}


def formats_figure(formats=FORMATS):
    """The bit fields of each format (``jnp.finfo``'s), one row each: sign, exponent (range), stored mantissa
    (precision), and its largest finite value."""
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(formats) + 0.9), layout="constrained")
    colours = {"sign": GREY, "exponent: range": PALETTE[0], "stored mantissa: precision": PALETTE[1]}
    for row, dtype in enumerate(reversed(formats.values())):
        info = jnp.finfo(dtype)
        widths = [1, info.nexp, info.nmant]
        ax.barh(row, widths, left=np.cumsum([0, *widths[:-1]]), color=list(colours.values()), edgecolor="white")
        ax.text(sum(widths) + 0.3, row, f"max {float(info.max):.4g}", va="center", fontsize=9)
    ax.set_yticks(range(len(formats)), list(reversed(formats)))
    ax.set(xlabel="bits", xlim=(0, 22), xticks=range(0, 17, 4))
    handles = [Patch(color=c, label=name) for name, c in colours.items()]
    ax.legend(handles=handles, frameon=False, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=9)
    return fig
