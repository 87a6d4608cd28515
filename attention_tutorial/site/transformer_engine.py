"""The figures of the page "TransformerEngine and FP8": TE against JAX's cuDNN path, FP8 against bf16, the formats
drawn; the names of TE's attention backends and the table rows of its ratios.

The page reads the records, pairs the points and judges them in its own cells (``docs/transformer_engine.md``); the
rows it draws carry ``ratio`` (the other's time over this one's), ``low`` and ``high`` (its range over runs) and
``word`` (the verdict of :func:`attention_tutorial.site.claims.compare`).
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from ..results.plotting import GREY, PALETTE

# TE's fused-attention backends (``NVTE_Fused_Attn_Backend``) in words
BACKENDS = {
    "NVTE_F16_arbitrary_seqlen": "cuDNN's flash-attention backend",
    "NVTE_F16_max512_seqlen": "cuDNN's backend for sequences up to 512",
    "NVTE_FP8": "cuDNN's FP8 backend",
    "NVTE_No_Backend": "no fused backend (TE falls back to unfused attention)",
}


def te_vs_cudnn_figure(rows):
    """TE's speed over JAX's cuDNN path's (cuDNN time / TE time) against T, one line per pass and head size, the
    range over runs as error bars; 1 = the same speed."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    series = sorted({(r["pass"], r["head_dim"]) for r in rows})
    for i, (p, h) in enumerate(series):
        rs = sorted((r for r in rows if (r["pass"], r["head_dim"]) == (p, h)), key=lambda r: r["seq_q"])
        err = [[r["ratio"] - r["low"] for r in rs], [r["high"] - r["ratio"] for r in rs]]
        ax.errorbar(
            [r["seq_q"] for r in rs],
            [r["ratio"] for r in rs],
            yerr=err,
            marker="o",
            capsize=3,
            color=PALETTE[i % len(PALETTE)],
            linestyle="-" if p == "fwd" else "--",
            label=f"{'forward' if p == 'fwd' else 'forward + backward'}, H = {h}",
        )
    ax.axhline(1.0, color=GREY, linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("T = S (B·T fixed)")
    ax.set_ylabel("TE's speed / cuDNN's")
    ax.set_title("TE against JAX's cuDNN path, causal (above 1: TE faster)", fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def table_rows(rows, fields=("seq_q", "head_dim", "pass")) -> list[dict]:
    """Rows of ratios (TE against cuDNN, or FP8 against bf16) for a table: the point's ``fields``, the ratio to 2
    decimals, its range over runs as one cell, the verdict."""
    return [
        {
            **{f: r[f] for f in fields if f in r},
            "ratio": f"{r['ratio']:.2f}",
            "range over runs": f"{r['low']:.2f}–{r['high']:.2f}",
            "verdict": r["word"],
        }
        for r in rows
    ]


def fp8_speedup_figure(rows):
    """bf16 time / FP8 time against T, one line per mask, the range over runs as error bars; 1 = the same speed. The
    FP8 times are end to end: each call quantises its bf16 inputs."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for causal in (False, True):
        rs = [r for r in rows if r["causal"] == causal]
        if not rs:
            continue
        x = [r["seq_q"] for r in rs]
        y = [r["ratio"] for r in rs]
        err = [[r["ratio"] - r["low"] for r in rs], [r["high"] - r["ratio"] for r in rs]]
        ax.errorbar(
            x,
            y,
            yerr=err,
            marker="o",
            capsize=3,
            color=PALETTE[3 if causal else 0],
            linestyle="--" if causal else "-",
            label="causal" if causal else "no mask",
        )
    ax.axhline(1.0, color=GREY, linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("T = S")
    ax.set_ylabel("bf16 time / FP8 time (end to end)")
    ax.set_title("cuDNN's FP8 attention against its bf16 attention", fontsize=10)
    ax.legend(frameon=False)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


# (sign, exponent, stored mantissa) bits and the largest finite value of each format
FORMATS = {
    "float32": (1, 8, 23, 3.4028235e38),
    "bfloat16": (1, 8, 7, 3.3895314e38),
    "float16": (1, 5, 10, 65504.0),
    "FP8 E4M3": (1, 4, 3, 448.0),
    "FP8 E5M2": (1, 5, 2, 57344.0),
}


def formats_figure(names=("bfloat16", "float16", "FP8 E4M3", "FP8 E5M2")):
    """The bit fields of each format, one row each: sign, exponent (range), stored mantissa (precision)."""
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(names) + 0.6))
    colours = {"sign": "#7F7F7F", "exponent": PALETTE[0], "mantissa": PALETTE[1]}
    for row, name in enumerate(reversed(names)):
        sign, exp, man, largest = FORMATS[name]
        start = 0
        for part, width in (("sign", sign), ("exponent", exp), ("mantissa", man)):
            ax.barh(row, width, left=start, color=colours[part], edgecolor="white")
            start += width
        ax.text(start + 0.3, row, f"max {largest:.4g}", va="center", fontsize=9)
    ax.set_yticks(range(len(names)), list(reversed(names)))
    ax.set_xlabel("bits")
    ax.set_xlim(0, 22)
    ax.set_xticks(range(0, 17, 4))
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(
        handles,
        ["sign", "exponent: range", "stored mantissa: precision"],
        frameon=False,
        ncol=3,
        loc="upper center",
        bbox_to_anchor=(0.5, 1.35),
        fontsize=9,
    )
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig
