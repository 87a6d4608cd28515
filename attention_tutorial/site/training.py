"""The page "Training through our kernels": steady-state speed, MFU on both peaks, and where a step's time goes.

Functions return rows, small summaries and figures from the ``train`` and ``train_profile`` records; the page's
markdown holds the sentences.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt

from ..results.plotting import PALETTE, label

GROUP_ORDER = ("attention", "matmuls", "embedding gradient", "other")
GROUP_COLOURS = {"attention": PALETTE[2], "matmuls": PALETTE[0], "embedding gradient": PALETTE[3], "other": "#BBBBBB"}


@dataclass(frozen=True)
class Steady:
    """One run's steady state: step time and tokens/s (median, p10, p90) and MFU on both peaks (%)."""

    impl: str
    median_ms: float
    p10_ms: float
    p90_ms: float
    tokens_per_s: float
    tokens_p10: float
    tokens_p90: float
    mfu_datasheet: float | None
    mfu_measured: float | None
    steady_from: int


def steady(summaries) -> list[Steady]:
    """The steady state of each ok summary that has one (runs recorded before steady states were kept have none)."""
    out = []
    for s in summaries or []:
        if s.get("status") != "ok" or s.get("steady_median_ms") is None:
            continue
        out.append(Steady(s["impl"], s["steady_median_ms"], s["steady_p10_ms"], s["steady_p90_ms"],
                          s["steady_tokens_per_s"], s["steady_tokens_per_s_p10"], s["steady_tokens_per_s_p90"],
                          s.get("mfu_datasheet_pct"), s.get("mfu_measured_pct"), s["steady_from"]))  # fmt: skip
    return out


def steady_rows(states) -> list[dict]:
    """Table rows of :func:`steady`."""

    def pct(x):
        return f"{x:.1f}" if x is not None else "–"

    return [{"implementation": label(s.impl), "ms per step": f"{s.median_ms:.1f} ({s.p10_ms:.1f}–{s.p90_ms:.1f})",
             "tokens/s": f"{s.tokens_per_s:,.0f} ({s.tokens_p10:,.0f}–{s.tokens_p90:,.0f})",
             "MFU, % of datasheet": pct(s.mfu_datasheet), "MFU, % of measured peak": pct(s.mfu_measured),
             "steady from step": s.steady_from} for s in states]  # fmt: skip


def tokens_ratio(states, impl: str, base: str = "cudnn") -> tuple[float, str] | None:
    """``impl``'s steady tokens/s over ``base``'s, and a verdict from the two p10–p90 ranges ("faster", "slower" or
    "on par" where they overlap); None when either run is missing."""
    by = {s.impl: s for s in states}
    if impl not in by or base not in by:
        return None
    a, b = by[impl], by[base]
    word = "faster" if a.tokens_p10 > b.tokens_p90 else "slower" if a.tokens_p90 < b.tokens_p10 else "on par"
    return a.tokens_per_s / b.tokens_per_s, word


def profile_groups(records) -> list[dict]:
    """One row per profiled step (``train_profile`` records): implementation, embedding gradient, ms per step in each
    group of :data:`GROUP_ORDER`, and the device total."""
    rows = []
    for r in records or []:
        if r.get("status") != "ok":
            continue
        groups = r.get("groups_us") or {}
        rows.append({"impl": r["impl"], "embedding": r["embedding"],
                     **{g: groups.get(g, 0.0) / 1e3 for g in GROUP_ORDER}, "device_ms": r["device_ms"]})  # fmt: skip
    return rows


def profile_figure(rows):
    """Stacked bars: ms per training step in each group, one bar per implementation and embedding gradient."""
    fig, ax = plt.subplots(figsize=(7.5, 0.6 * len(rows) + 1.4))
    names = [f"{label(r['impl'])}\n{'one-hot matmul' if r['embedding'] == 'onehot' else 'scatter-add'}" for r in rows]
    for i, r in enumerate(rows):
        left = 0.0
        for g in GROUP_ORDER:
            ax.barh(i, r[g], left=left, color=GROUP_COLOURS[g], edgecolor="white", label=g if i == 0 else None)
            left += r[g]
    ax.set_yticks(range(len(rows)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms of GPU time per training step")
    ax.legend(frameon=False, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.35), fontsize=8)
    ax.set_title("where a training step's GPU time goes", fontsize=10)
    fig.tight_layout()
    return fig
