"""What the page "Training through our kernels" needs beside its own cells: the loss curves drawn against rounding
noise, and the rows of its tables (steady-state speed and MFU, waiting after each step or queued ahead, the step with
and without biases) from the ``train`` and ``train_dispatch`` records and the ``train`` tuning table.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from ..results.plotting import impl_style, label
from ..train import TWIN
from .claims import loss_yardstick


def loss_gap_figure(step_records, title: str | None = None):
    """Two panels: the first implementation's loss per step, and every other run's loss minus it at the steps both
    logged (the rerun from nudged weights included), with a grey band at ± the noise floor
    (:func:`~attention_tutorial.site.claims.loss_yardstick`'s ``limit``; no band without a rerun from nudged weights).
    Curves that agree within rounding lie on top of each other on a loss axis; their differences, drawn against the
    band, show how close they are."""
    y = loss_yardstick(step_records)
    if y is None:
        raise ValueError("loss_gap_figure: no step records with a loss to draw")
    losses: dict[str, dict[int, float]] = {}
    for r in step_records:
        if r.get("status", "ok") == "ok" and r.get("loss") is not None:
            losses.setdefault(r["impl"], {})[r["step"]] = r["loss"]
    base = losses[y.first]
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(10.0, 3.8), facecolor="white", layout="constrained", gridspec_kw={"width_ratios": (1, 1.4)}
    )
    colour, _ = impl_style(y.first)
    left.plot(sorted(base), [base[s] for s in sorted(base)], color=colour, linewidth=1.8, label=label(y.first))
    left.set(ylabel="loss (nats per byte)", title=f"loss, {label(y.first)}")
    if y.limit is not None:
        band = f"noise floor (± {y.limit:.1e})"
        right.fill_between([min(base), max(base)], -y.limit, y.limit, color="#DDDDDD", linewidth=0, label=band)
    right.axhline(0.0, color=colour, linewidth=1.2)
    for i, (impl, mine) in enumerate((i, m) for i, m in losses.items() if i != y.first):
        steps = sorted(set(mine) & set(base))
        c, m = impl_style(impl, i + 1)
        gaps = [mine[s] - base[s] for s in steps]
        right.plot(steps, gaps, color=c, marker=m, markersize=3.5, linewidth=1.4, label=label(impl))
    right.set(ylabel=f"loss minus {label(y.first)}'s", title=f"each run's loss minus {label(y.first)}'s")
    right.legend(fontsize=8, frameon=True, facecolor="white", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for a in (left, right):
        a.set(facecolor="white", xlabel="training step")
        a.title.set_fontsize(10)
        a.grid(True, color="#dddddd", linewidth=0.8)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def spread(r: dict | None, key: str = "median_ms", digits: int = 1) -> str:
    """``r[key]`` with its p10–p90 in brackets, in ms to ``digits`` decimals; "–" without a record."""
    if not r:
        return "–"
    return f"{r[key]:.{digits}f} ({r['p10_ms']:.{digits}f}–{r['p90_ms']:.{digits}f})"


def steady_rows(summaries) -> list[dict]:
    """One row per ok ``train`` summary with a steady state, the rerun from nudged weights left out (it belongs to
    the loss comparison): step time and tokens/s (median, p10–p90), MFU on both peaks, where the steady state starts."""
    return [
        {
            "implementation": label(s["impl"]),
            "ms per step": f"{s['steady_median_ms']:.1f} ({s['steady_p10_ms']:.1f}–{s['steady_p90_ms']:.1f})",
            "tokens/s": f"{s['steady_tokens_per_s']:,.0f} "
            f"({s['steady_tokens_per_s_p10']:,.0f}–{s['steady_tokens_per_s_p90']:,.0f})",
            "MFU, % of datasheet": f"{s['mfu_datasheet_pct']:.1f}" if s.get("mfu_datasheet_pct") is not None else "–",
            "MFU, % of measured matmul": f"{s['mfu_measured_pct']:.1f}"
            if s.get("mfu_measured_pct") is not None
            else "–",
            "steady from step": s["steady_from"],
        }
        for s in summaries or []
        if s.get("status") == "ok" and s.get("steady_median_ms") is not None and not s["impl"].endswith(TWIN)
    ]


def dispatch_rows(times: dict) -> list[dict]:
    """One row per implementation and command-buffer setting of ``times``, {(impl, command buffers, waiting): its
    ok ``train_dispatch`` record}: the step time waiting after every step and queued ahead (median, p10–p90), the
    host's time to queue one step, and the MFU each way."""
    rows = []
    for impl, cb in dict.fromkeys((i, c) for i, c, _ in times):
        every, ahead = times.get((impl, cb, "every step")), times.get((impl, cb, "ahead"))
        mfu = [f"{r['mfu_datasheet_pct']:.1f}" if r and r.get("mfu_datasheet_pct") else "–" for r in (every, ahead)]
        rows.append(
            {
                "attention": label(impl),
                "command buffers": cb,
                "waiting after each step (ms)": spread(every),
                f"{ahead['steps_per_wait'] if ahead else 'n'} steps queued, then one wait (ms)": spread(ahead),
                "host time to queue a step (ms)": f"{ahead['queue_ms']:.1f}" if ahead else "–",
                "MFU waiting / queued (% of datasheet)": " / ".join(mfu),
            }
        )
    return rows


def bias_rows(times: dict) -> list[dict]:
    """One row per implementation of ``times``, {(impl, bias): its ok row of the ``train`` tuning table}: the step
    (ms, p10–p90) and its MFU with and without biases."""
    out = []
    for impl in dict.fromkeys(i for i, _ in times):
        row = {"attention": label(impl)}
        for bias, name in ((True, "with biases"), (False, "without")):
            r = times.get((impl, bias))
            row[f"step {name} (ms)"] = spread(r, "step_ms", 2)
            row[f"MFU {name} (%)"] = f"{r['mfu_datasheet_pct']:.1f}" if r and r.get("mfu_datasheet_pct") else "–"
        out.append(row)
    return out
