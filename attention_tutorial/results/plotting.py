"""Figures and tables from records: TFLOP/s, % of peak, GB/s, milliseconds, memory.

Figures draw on an opaque white card with the Okabe–Ito colour-blind-safe palette, so they read the same in the
site's light and dark modes. Tables come out as Markdown, which the site renders in its own (theme-aware) style.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .. import registry

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.")
YLABELS = {
    "tflops": "TFLOP/s",
    "pct_peak": "% of measured bf16 matmul peak",
    "gbps": "GB/s (fewest bytes / time)",
    "median_ms": "ms per call (median)",
    "temp_bytes": "compiled temporaries (bytes)",
}


def label(impl: str) -> str:
    """The display name of an implementation (the registry's label, or the name itself)."""
    return registry.IMPLEMENTATIONS[impl].label if impl in registry.IMPLEMENTATIONS else impl


def plot_records(records, *, x="seq_q", y="tflops", by=("impl",), ax=None, title=None, logx=True, logy=False,
                 hline=None, hline_label=None):  # fmt: skip
    """One line per distinct ``by`` tuple, ``y`` against ``x``, from ok records; p10–p90 as a band for ms plots.

    ``hline`` draws a ceiling (e.g. the measured peak). Returns the figure.
    """
    ok = [r for r in records if r.get("status") == "ok" and r.get(y) is not None]
    if ax is None:
        fig, ax = plt.subplots(figsize=(7.0, 4.2), facecolor="white", layout="constrained")
    fig = ax.figure
    ax.set_facecolor("white")
    series: dict[tuple, list] = {}
    for r in ok:
        series.setdefault(tuple(r.get(b) for b in by), []).append(r)
    # colour and marker follow the first ``by`` field (the implementation), the line style the rest (e.g. causal)
    firsts = list(dict.fromkeys(key[0] for key in series))
    rests = list(dict.fromkeys(key[1:] for key in series))
    for key, rs in series.items():
        rs.sort(key=lambda r: r[x])
        name = ", ".join(label(k) if b == "impl" else _fmt_key(b, k) for b, k in zip(by, key))
        xs, ys = [r[x] for r in rs], [r[y] for r in rs]
        i, j = firsts.index(key[0]), rests.index(key[1:])
        colour, marker = PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)]
        style = LINESTYLES[j % len(LINESTYLES)]
        ax.plot(xs, ys, marker=marker, color=colour, linestyle=style, label=name, linewidth=1.8, markersize=5)
        if y == "median_ms" and all("p10_ms" in r for r in rs):
            ax.fill_between(
                xs, [r["p10_ms"] for r in rs], [r["p90_ms"] for r in rs], color=colour, alpha=0.2, linewidth=0
            )
    if hline:
        ax.axhline(hline, color="#555555", linestyle="--", linewidth=1.2, label=hline_label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(YLABELS.get(y, y))
    ax.grid(True, which="major", color="#dddddd", linewidth=0.8)
    if title:
        ax.set_title(title, fontsize=11)
    if len(series) > 6:  # a long legend goes beside the axes, not over the lines
        fig.set_size_inches(10.0, 4.6)
        ax.legend(fontsize=8, frameon=True, facecolor="white", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    elif series or hline:
        ax.legend(fontsize=8, frameon=True, facecolor="white")
    return fig


def _fmt_key(field, value):
    if field == "causal":
        return "causal" if value else "full"
    return f"{field}={value}"


COLUMNS = {
    "impl": ("implementation", label),
    "batch": ("B", str),
    "seq_q": ("T", str),
    "seq_kv": ("S", str),
    "heads": ("N", str),
    "kv_heads": ("K", str),
    "head_dim": ("H", str),
    "dtype": ("dtype", str),
    "causal": ("causal", lambda c: "yes" if c else "no"),
    "pass": ("pass", str),
    "status": ("status", str),
    "median_ms": ("ms (median)", lambda v: f"{v:.4g}"),
    "p10_ms": ("p10", lambda v: f"{v:.4g}"),
    "p90_ms": ("p90", lambda v: f"{v:.4g}"),
    "single_call_ms": ("ms, one waited call", lambda v: f"{v:.4g}"),
    "dispatch_ms": ("dispatch ms", lambda v: f"{v:.3g}"),
    "compile_s": ("compile s", lambda v: f"{v:.2f}"),
    "tflops": ("TFLOP/s", lambda v: f"{v:.4g}"),
    "pct_peak": ("% peak", lambda v: f"{v:.1f}"),
    "gbps": ("GB/s", lambda v: f"{v:.4g}"),
    "pct_read": ("% read ceiling", lambda v: f"{v:.1f}"),
    "temp_bytes": ("temp MiB", lambda v: f"{v / 2**20:.1f}"),
    "kernel": ("kernel", str),
    "reason": ("why not", str),
    "backend": ("backend chosen", str),
    "rel_error": ("relative error", lambda v: f"{v:.3g}"),
    "max_abs_diff_vs_bf16": ("max |Δ| vs bf16", lambda v: f"{v:.3g}"),
    "fp8_types_in_hlo": ("FP8 types in HLO", lambda v: ", ".join(v) or "none"),
}


def markdown_table(records, columns) -> str:
    """A Markdown table of ``records`` with the given fields; a status other than ok shows its reason instead."""
    head = [COLUMNS.get(c, (c, str))[0] for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(columns)]
    for r in records:
        cells = []
        for c in columns:
            v = r.get(c)
            if v is None and c in ("median_ms", "tflops", "gbps", "pct_peak") and r.get("status") != "ok":
                cells.append(f"*{r.get('status')}*")
            elif v is None:
                cells.append("–")
            else:
                cells.append(COLUMNS.get(c, (c, str))[1](v).replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def show_table(records, columns):
    """Display ``markdown_table`` in a notebook (the pages' way of showing a table)."""
    from IPython.display import Markdown

    return Markdown(markdown_table(records, columns))
