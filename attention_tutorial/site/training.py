"""The page "Training through our kernels": loss curves against rounding noise, steady-state speed, MFU on both
peaks, and where a step's time goes.

Functions return rows, small summaries and figures from the ``train`` and ``train_profile`` records; the page's
markdown holds the sentences.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt

from ..results.plotting import PALETTE, impl_style, label
from ..train import TWIN
from .claims import LossYardstick, loss_yardstick

MFU_GOAL = 45.0  # the MFU (% of the datasheet's dense bf16 peak) we aim the recorded training step at, with our kernel
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
    datasheet_tflops: float | None = None  # the peaks the two MFUs divide by
    measured_tflops: float | None = None


def steady(summaries) -> list[Steady]:
    """The steady state of each ok summary that has one (runs recorded before steady states were kept have none).
    The rerun from nudged weights is left out: it belongs to the loss comparison, not to the speeds. The measured
    peak is the one the run's MFU divided by (its TFLOP/s over its MFU)."""
    out = []
    for s in summaries or []:
        if s.get("status") != "ok" or s.get("steady_median_ms") is None or s["impl"].endswith(TWIN):
            continue
        measured = (
            100 * s["steady_tflops"] / s["mfu_measured_pct"]
            if s.get("steady_tflops") and s.get("mfu_measured_pct")
            else None
        )
        out.append(
            Steady(
                s["impl"],
                s["steady_median_ms"],
                s["steady_p10_ms"],
                s["steady_p90_ms"],
                s["steady_tokens_per_s"],
                s["steady_tokens_per_s_p10"],
                s["steady_tokens_per_s_p90"],
                s.get("mfu_datasheet_pct"),
                s.get("mfu_measured_pct"),
                s["steady_from"],
                s.get("datasheet_tflops"),
                measured,
            )
        )
    return out


def steady_rows(states) -> list[dict]:
    """Table rows of :func:`steady`."""

    def pct(x):
        return f"{x:.1f}" if x is not None else "–"

    return [
        {
            "implementation": label(s.impl),
            "ms per step": f"{s.median_ms:.1f} ({s.p10_ms:.1f}–{s.p90_ms:.1f})",
            "tokens/s": f"{s.tokens_per_s:,.0f} ({s.tokens_p10:,.0f}–{s.tokens_p90:,.0f})",
            "MFU, % of datasheet": pct(s.mfu_datasheet),
            "MFU, % of measured matmul": pct(s.mfu_measured),
            "steady from step": s.steady_from,
        }
        for s in states
    ]


def tokens_ratio(states, impl: str, base: str = "cudnn") -> tuple[float, str] | None:
    """``impl``'s steady tokens/s over ``base``'s, and a verdict from the two p10–p90 ranges ("faster", "slower" or
    "on par" where they overlap); None when either run is missing."""
    by = {s.impl: s for s in states}
    if impl not in by or base not in by:
        return None
    a, b = by[impl], by[base]
    word = "faster" if a.tokens_p10 > b.tokens_p90 else "slower" if a.tokens_p90 < b.tokens_p10 else "on par"
    return a.tokens_per_s / b.tokens_per_s, word


def noise_share(y: LossYardstick | None) -> float | None:
    """The noise floor of a training comparison (``y.limit``) as a fraction of how much training moves the loss from
    one logged step to the next (``y.motion``); None without a rerun from nudged weights or without movement. The
    page reads it with ``y.coarse``: at :data:`~attention_tutorial.site.claims.COARSE` or more, the check cannot
    tell small differences apart."""
    if y is None or y.limit is None or not y.motion:
        return None
    return y.limit / y.motion


def loss_gaps(step_records, base: str) -> dict[str, tuple[list[int], list[float]]]:
    """Per run other than ``base`` (in record order, the rerun from nudged weights included): (steps, its loss minus
    ``base``'s) at the steps both logged."""
    by: dict[str, dict[int, float]] = {}
    for r in step_records or []:
        if r.get("status", "ok") == "ok" and r.get("loss") is not None:
            by.setdefault(r["impl"], {})[r["step"]] = r["loss"]
    ref = by.get(base, {})
    out = {}
    for impl, losses in by.items():
        steps = sorted(set(losses) & set(ref))
        if impl != base and steps:
            out[impl] = (steps, [losses[s] - ref[s] for s in steps])
    return out


def loss_gap_figure(step_records, title: str | None = None):
    """Two panels: the first implementation's loss per step, and every other run's loss minus it, with a grey band
    at ± the noise floor (:func:`~attention_tutorial.site.claims.loss_yardstick`'s ``limit``; no band without a
    rerun from nudged weights). Curves that agree within rounding lie on top of each other on a loss axis; their
    differences, drawn against the band, show how close they are."""
    y = loss_yardstick(step_records)
    if y is None:
        raise ValueError("loss_gap_figure: no step records with a loss to draw")
    base = y.first
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(10.0, 3.8), facecolor="white", layout="constrained", gridspec_kw={"width_ratios": (1, 1.4)}
    )
    mine = sorted((r["step"], r["loss"]) for r in step_records if r["impl"] == base and r.get("loss") is not None)
    colour, marker = impl_style(base)
    left.plot([s for s, _ in mine], [v for _, v in mine], color=colour, linewidth=1.8, label=label(base))
    left.set_ylabel("loss (nats per byte)")
    left.set_title(f"loss, {label(base)}", fontsize=10)
    if y.limit is not None:
        steps = [s for s, _ in mine]
        right.fill_between(
            [steps[0], steps[-1]],
            -y.limit,
            y.limit,
            color="#DDDDDD",
            linewidth=0,
            label=f"noise floor (± {y.limit:.1e})",
        )
    right.axhline(0.0, color=colour, linewidth=1.2)
    for i, (impl, (steps, gaps)) in enumerate(loss_gaps(step_records, base).items()):
        c, m = impl_style(impl, i + 1)
        right.plot(steps, gaps, color=c, marker=m, markersize=3.5, linewidth=1.4, label=label(impl))
    right.set_ylabel(f"loss minus {label(base)}'s")
    right.set_title(f"each run's loss minus {label(base)}'s", fontsize=10)
    right.legend(fontsize=8, frameon=True, facecolor="white", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for a in (left, right):
        a.set_facecolor("white")
        a.set_xlabel("training step")
        a.grid(True, color="#dddddd", linewidth=0.8)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def profile_groups(records) -> list[dict]:
    """One row per profiled step (``train_profile`` records): implementation, embedding gradient, ms per step in each
    group of :data:`GROUP_ORDER`, and the device total."""
    rows = []
    for r in records or []:
        if r.get("status") != "ok":
            continue
        groups = r.get("groups_us") or {}
        rows.append(
            {
                "impl": r["impl"],
                "embedding": r["embedding"],
                **{g: groups.get(g, 0.0) / 1e3 for g in GROUP_ORDER},
                "device_ms": r["device_ms"],
            }
        )
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


# --- keeping the GPU fed ----------------------------------------------------------------------------------------------


def dispatch_times(records) -> dict[tuple[str, str, str], dict]:
    """{(impl, command buffers, waiting): the ``train_dispatch`` record} of the ok records (waiting: "every step" or
    "ahead")."""
    return {(r["impl"], r["command_buffers"], r["waiting"]): r for r in records or [] if r.get("status") == "ok"}


def dispatch_rows(records) -> list[dict]:
    """One row per implementation and command-buffer setting of the ``train_dispatch`` records: the step time
    waiting after every step and queued ahead (median, p10–p90), and the host's time to queue one step in each."""
    times = dispatch_times(records)
    rows = []
    for impl, cb in dict.fromkeys((i, c) for i, c, _ in times):
        every, ahead = times.get((impl, cb, "every step")), times.get((impl, cb, "ahead"))
        rows.append(
            {
                "attention": label(impl),
                "command buffers": cb,
                "waiting after each step (ms)": _spread(every, "median_ms", 1),
                f"{ahead['steps_per_wait'] if ahead else 'n'} steps queued, then one wait (ms)": _spread(
                    ahead, "median_ms", 1
                ),
                "host time to queue a step (ms)": f"{ahead['queue_ms']:.1f}" if ahead else "–",
                "MFU waiting / queued (% of datasheet)": " / ".join(
                    f"{r['mfu_datasheet_pct']:.1f}" if r and r.get("mfu_datasheet_pct") else "–" for r in (every, ahead)
                ),
            }
        )
    return rows


def bias_times(rows) -> dict[tuple[str, bool], dict]:
    """{(impl, bias): row} of the ok rows of the training step's tuning table (``tools/tune.py train``: the recorded
    model with and without biases, steps queued ahead; each row's ``step_ms`` with ``p10_ms`` and ``p90_ms``)."""
    return {(r["impl"], r["bias"]): r for r in rows or [] if r.get("status") == "ok" and "bias" in r}


def bias_rows(rows) -> list[dict]:
    """One row per implementation of :func:`bias_times`: the step (ms, p10–p90) and its MFU with and without biases."""
    times = bias_times(rows)
    out = []
    for impl in dict.fromkeys(i for i, _ in times):
        row = {"attention": label(impl)}
        for bias, name in ((True, "with biases"), (False, "without")):
            r = times.get((impl, bias))
            row[f"step {name} (ms)"] = _spread(r, "step_ms", 2)
            row[f"MFU {name} (%)"] = f"{r['mfu_datasheet_pct']:.1f}" if r and r.get("mfu_datasheet_pct") else "–"
        out.append(row)
    return out


def _spread(r: dict | None, key: str, digits: int) -> str:
    """``r[key]`` with its p10–p90 in brackets, in ms to ``digits`` decimals; "–" without a row."""
    if not r:
        return "–"
    return f"{r[key]:.{digits}f} ({r['p10_ms']:.{digits}f}–{r['p90_ms']:.{digits}f})"
