"""What the pages use to show results: the live run of this build beside the recorded GPU reference.

Every benchmark section of the site calls ``show_live`` (runs a named grid here, now) and ``show_recorded``
(reads ``attention_tutorial/results/data/<gpu>.json``, written by the recorder on the GPU), and each output is labelled with the
hardware, versions and date it came from. No number is typed into a page.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import jax
import matplotlib.pyplot as plt

from ..env import environment
from ..measure.flops import DATASHEET, datasheet_peak
from ..measure.grids import points
from ..measure.roofline import Roof
from ..measure.sweep import run_sweep
from ..results import store
from ..results.plotting import _legend, markdown_table, plot_records
from ..train import TWIN
from .claims import POINT_FIELDS, compare, same_point

REFERENCE_GPU = "nvidia-h200"


def live_label() -> str:
    """One line naming this build's device and versions."""
    env = environment()
    device = env["gpu"] or f"CPU ({env['cpu']})"
    cudnn = f", cuDNN {env['cudnn']}" if env["cudnn"] else ""
    return f"**Live, this build:** {device}, JAX {env['jax']}{cudnn}, {env['created'][:10]}"


def timing_options() -> dict:
    """Repeats and time caps for live page runs: full on a GPU, brief on a CPU build."""
    if jax.default_backend() == "gpu":
        return {"repeats": 10, "max_seconds": 0.3}
    return {"repeats": 5, "max_seconds": 0.3, "min_sample_ms": 5.0}


def run_live(grid_name: str, **where) -> list[dict]:
    """Run the grid ``grid_name`` (its live size for this backend), keeping points that match ``where`` (a field's
    value, or a tuple of the values to keep, e.g. ``impl=("te", "cudnn")``)."""
    keep = {k: v if isinstance(v, tuple) else (v,) for k, v in where.items()}
    pts = [p for p in points(grid_name, live=True) if all(getattr(p, k) in v for k, v in keep.items())]
    return run_sweep(pts, **timing_options())


def reference(grid_name: str | None = None, **where):
    """(records, provenance) of the recorded reference, filtered; (None, None) when no file is committed."""
    data = store.recorded(REFERENCE_GPU)
    if data is None:
        return None, None
    recs = data["records"] if grid_name is None else store.select(data["records"], grid=grid_name)
    return store.select(recs, **where), data["provenance"]


def recorded_facts() -> dict[str, str]:
    """The recording in phrases, for the landing page: ``recorded_gpu``, ``recorded_count`` (its number of
    records), ``recorded_versions`` (JAX and cuDNN) and ``recorded_kernel_speed``: our Mosaic GPU forward's speed
    against cuDNN's at H = 128 and T ≥ 8192, both masks, as the lowest and highest median ratio over T."""
    from .pallas_kernels import pct, pick, race, span

    recs, prov = reference()
    if prov is None:
        return {
            "recorded_gpu": "no GPU yet",
            "recorded_count": "0",
            "recorded_versions": "–",
            "recorded_kernel_speed": "not yet measured",
        }
    beyond = [r for r in recs if r.get("grid") == "beyond"]
    speed = span(pick(race(beyond, recs, ("mosaic",), baseline="cudnn", min_seq=8192), head_dim=128))
    return {
        "recorded_gpu": prov["gpu"],
        "recorded_count": f"{len(recs):,}",
        "recorded_versions": f"JAX {prov['jax']}, cuDNN {prov['cudnn']}",
        "recorded_kernel_speed": pct(speed) if speed else "not yet measured",
    }


def shapes(records) -> str:
    """The shapes of ``records`` in words, e.g. 'B = 4, T = S = 64…1024, N = 8, H = 64, bfloat16, causal and not'."""

    def values(field):
        return sorted({r[field] for r in records if r.get(field) is not None}, key=lambda v: (str(type(v)), v))

    def span(field):
        vs = values(field)
        return (
            "–"
            if not vs
            else str(vs[0])
            if len(vs) == 1
            else ", ".join(map(str, vs))
            if len(vs) <= 3
            else f"{vs[0]}…{vs[-1]}"
        )

    if not records:
        return "no points"
    t = (
        f"T = S = {span('seq_q')}"
        if values("seq_q") == values("seq_kv")
        else f"T = {span('seq_q')}, S = {span('seq_kv')}"
    )
    parts = [f"B = {span('batch')}", t, f"N = {span('heads')}"]
    if values("kv_heads") != values("heads"):
        parts.append(f"K = {span('kv_heads')}")
    parts += [f"H = {span('head_dim')}", ", ".join(values("dtype"))]
    causal = values("causal")
    parts.append("causal and not" if len(causal) > 1 else "causal" if causal == [True] else "no mask")
    return ", ".join(parts)


def result_slugs() -> list[str]:
    """The committed result files to show, the reference GPU first (``store.result_files`` where it exists)."""
    finder = getattr(store, "result_files", None)
    slugs = [store.slug(getattr(f, "stem", str(f))) for f in finder()] if finder else [REFERENCE_GPU]
    return sorted(dict.fromkeys(slugs), key=lambda s: (s != REFERENCE_GPU, s))


#: Said under a table of live runs set against the recording with a verdict per point.
VERDICT_NOTE = (
    "Each verdict compares the two runs' p10–p90 ranges, not their medians: the same ratio reads "
    '"slower" where the ranges are apart and "on par" where they overlap.'
)


def in_words(items) -> str:
    """``items`` as a list in words: "a", "a and b", "a, b and c" ("" for none); numbers with thousands separators
    (``in_words(label(i) for i in impls)`` names implementations)."""
    words = [f"{x:,}" if isinstance(x, int) else str(x) for x in items]
    return " and ".join(words) if len(words) < 3 else ", ".join(words[:-1]) + " and " + words[-1]


#: The column :func:`with_range` adds.
RANGE = "p10–p90 (ms)"


def with_range(records) -> list[dict]:
    """``records`` (copies) with their p10–p90 spread as one column, :data:`RANGE` ('0.1723–0.1730'), for a table;
    "–" where a record has no spread."""
    out = []
    for r in records or ():
        lo, hi = r.get("p10_ms"), r.get("p90_ms")
        out.append({**r, RANGE: f"{lo:.4g}–{hi:.4g}" if lo is not None and hi is not None else "–"})
    return out


def live_vs_recorded(live, recorded) -> list[dict]:
    """One row per live record that the recorded file also measured: both medians and their ratio."""
    rows = []
    for r in live:
        same = same_point(recorded, r, impl=r["impl"])
        if r.get("status") == "ok" and same:
            rows.append(
                {**r, "recorded_ms": same[0]["median_ms"], "live_over_recorded": r["median_ms"] / same[0]["median_ms"]}
            )
    return rows


def live_check(live, recorded) -> list[dict]:
    """For each ok live record that the recording also measured (same implementation, every point field equal):
    the live record with ``recorded_ms``, ``live_over_recorded`` and ``verdict`` (the live call "faster",
    "slower" or "on par" against the recording, from both spreads)."""
    rows = []
    for r in live:
        if r.get("status") == "ok" and (same := same_point(recorded or [], r, impl=r["impl"])):
            c = compare([r], same)
            rows.append(
                {
                    **r,
                    "recorded_ms": statistics.median(s["median_ms"] for s in same),
                    "live_over_recorded": 1 / c.value,
                    "verdict": c.word,
                }
            )
    return rows


def live_table(live, recorded, columns, *, verdicts: bool = False) -> str:
    """Markdown: this build's live records under the live label; on a GPU build, beside the recorded medians of the
    same points (their ratio says how far this GPU is from the recorded one). ``verdicts``: each point also judged
    from both runs' spreads (:func:`live_check`), with :data:`VERDICT_NOTE` under the table."""
    text = f"{live_label()}. Shapes: {shapes(live)}.\n\n" + markdown_table(live, columns)
    if jax.default_backend() != "gpu":
        return text
    rows = (live_check if verdicts else live_vs_recorded)(live, recorded or [])
    if rows:
        measured = ("status", "median_ms", "tflops", "gbps", "reason", "dispatch_ms", "kernel")
        keys = [c for c in columns if c not in measured]
        text += "\n\nAgainst the recording, the same points:\n\n" + markdown_table(
            rows, [*keys, "median_ms", "recorded_ms", "live_over_recorded", *(["verdict"] if verdicts else [])]
        )
        text += f"\n\n{VERDICT_NOTE}" if verdicts else ""
    return text


def recorded_failures(live, recorded) -> list[dict]:
    """The recorded records that did not run (unsupported, oom, error) at points the live run did not also fail at:
    what a compact live/recorded comparison would otherwise hide."""
    live_failed = {(r["impl"], *(r.get(f) for f in POINT_FIELDS)) for r in live if r.get("status") != "ok"}
    return [
        r
        for r in recorded
        if r.get("status") != "ok" and (r["impl"], *(r.get(f) for f in POINT_FIELDS)) not in live_failed
    ]


def live_failures(live, recorded) -> list[dict]:
    """The live records that did not run (oom, error, ...) at points the recording ran: each with the recorded
    median (``recorded_ms``), so the compact comparison does not drop them silently."""
    rows = []
    for r in live:
        same = same_point(recorded, r, impl=r["impl"])
        if r.get("status") != "ok" and same:
            rows.append({**r, "recorded_ms": same[0]["median_ms"]})
    return rows


def with_datasheet(records, gpu: str | None) -> list[dict]:
    """``records`` with ``pct_datasheet`` beside ``pct_peak``: their TFLOP/s as a % of ``gpu``'s datasheet peak for
    their dtype (:func:`~attention_tutorial.measure.flops.datasheet_peak`: dense bf16, dense FP8 for FP8 records), the
    primary basis, where ``pct_peak`` divides by the bf16 matmul measured in the recording run (a reference on that
    card, not a ceiling). None where a record has no TFLOP/s
    or the device has no datasheet figure (a CPU)."""
    out = []
    for r in records:
        peak, _ = datasheet_peak(gpu, r.get("dtype") or "bfloat16")
        out.append({**r, "pct_datasheet": 100 * r["tflops"] / peak if peak and r.get("tflops") else None})
    return out


def datasheet_factor(records, gpu: str | None) -> float | None:
    """The one factor that turns ``records``' % of the measured matmul into % of ``gpu``'s datasheet peak (their
    measured matmul / the datasheet's); None when they were judged against different measured matmuls (several
    recording runs, or bf16 and FP8 mixed), have no % of peak, or the device has no datasheet figure."""
    factors = {
        round(r["pct_datasheet"] / r["pct_peak"], 9)
        for r in with_datasheet(records, gpu)
        if r.get("pct_peak") and r.get("pct_datasheet")
    }
    return factors.pop() if len(factors) == 1 else None


def datasheet_axis(fig, factor: float, peak: float) -> None:
    """Give ``fig`` (drawn in % of the measured matmul; panels share their y axis) a right-hand axis in % of the
    datasheet peak ``peak`` (TFLOP/s), ``factor`` = measured matmul / datasheet peak; the legend moves right."""
    axes = list(fig.axes)
    if not axes:
        return
    sec = axes[-1].secondary_yaxis("right", functions=(lambda p: p * factor, lambda p: p / factor))
    sec.set_ylabel(f"% of datasheet peak ({peak:.0f} TFLOP/s)")
    legend = axes[-1].get_legend() if axes else None
    if legend is not None:
        legend.set_bbox_to_anchor((1.16, 1.0))


def datasheet_line(fig, peak: float, label: str = "datasheet dense bf16 peak") -> None:
    """Draw the datasheet peak ``peak`` (TFLOP/s) on each axes of ``fig`` (a TFLOP/s plot) beside the measured
    matmul's line, and name it in the figure's legend."""
    axes = list(fig.axes)
    for a in axes:
        a.axhline(peak, color="#999999", linestyle=(0, (2, 2)), linewidth=1.2, label=label)
    legend = axes[-1].get_legend() if axes else None
    if legend is not None:
        legend.remove()
    _legend(fig, axes, len(axes) > 1)


def train_rows(summaries, *, peak: bool = True) -> list[dict]:
    """One table row per training run (``kind`` "summary" records): time, throughput, memory, losses, kernel.
    ``peak=False`` leaves out the device's peak memory (runs that share one process share one peak); the held-out loss
    column is left out when no run has one."""

    def mib(b):
        return f"{b / 2**20:.1f}" if b is not None else "–"

    left_out = ([] if peak else ["peak memory (MiB)"]) + (
        [] if any(x.get("eval_loss") is not None for x in summaries) else ["held-out loss"]  # none has one
    )
    rows = []
    for s in summaries:
        ok = s["status"] == "ok"
        rows.append(
            {
                "impl": s["impl"],
                "status": s["status"],
                "median_ms": s["median_ms"],
                "tokens/s": f"{s['tokens_per_s']:,.0f}" if ok else "–",
                "tflops": s["tflops"],
                "step footprint (MiB)": mib(s.get("step_bytes")) if ok else "–",
                "peak memory (MiB)": mib(s.get("peak_bytes")) if ok else "–",
                "final loss": f"{s['final_loss']:.3f}" if ok else "–",
                "held-out loss": f"{s['eval_loss_init']:.3f} → {s['eval_loss']:.3f}"
                if ok and s.get("eval_loss") is not None
                else "–",
                "kernel": s.get("attention_kernel") or s.get("reason", ""),
            }
        )
        for column in left_out:
            del rows[-1][column]
    return rows


@dataclass(frozen=True)
class TwinSpread:
    """The first implementation's median step time beside its twin's (the same program, weights nudged by one
    rounding: how much step times move by themselves), and the spread of every implementation that ran."""

    impl: str
    ms: float
    twin_ms: float
    ratio: float  # slower / faster of the two, >= 1
    span: float | None  # slowest / fastest of the implementations that ran (twins left out); None for one

    @property
    def ranks(self) -> bool:
        """Whether the implementations spread wider than the twins do (else the table ranks nothing)."""
        return self.span is not None and self.span > self.ratio


def twin_spread(summaries) -> TwinSpread | None:
    """:class:`TwinSpread` of training ``summaries``; None without the first implementation and its twin both ok."""
    ok = {s["impl"]: s["median_ms"] for s in summaries if s["status"] == "ok" and s.get("median_ms")}
    first = next((s["impl"] for s in summaries if not s["impl"].endswith(TWIN)), None)
    if first not in ok or first + TWIN not in ok:
        return None
    a, b = ok[first], ok[first + TWIN]
    times = [t for i, t in ok.items() if not i.endswith(TWIN)]
    return TwinSpread(first, a, b, max(a, b) / min(a, b), max(times) / min(times) if len(times) > 1 else None)


def read_ceiling(records, provenance) -> tuple[float | None, str]:
    """(GB/s, where measured) of the read ceiling that ``records``' ``pct_read`` was computed against: the median
    of gbps · 100 / pct_read over them; without pct_read, ``provenance``'s read_gbps (the latest recording run's);
    (None, "") without either."""
    ceilings = sorted(r["gbps"] * 100 / r["pct_read"] for r in records if r.get("pct_read") and r.get("gbps"))
    if ceilings:
        grid = {r.get("grid") for r in records if r.get("pct_read")}
        whose = f"the {grid.pop()} grid's" if len(grid) == 1 and None not in grid else "these records'"
        agree = ceilings[-1] / ceilings[0] <= 1.001  # one recording run gives one ceiling (up to rounding)
        where = f"{whose} recording run" if agree else f"{whose} recording runs (their median)"
        return statistics.median(ceilings), where
    if provenance and provenance.get("read_gbps"):
        return provenance["read_gbps"], "the latest recording run"
    return None, ""


def roof(records, provenance: dict, grid_name: str) -> Roof:
    """The :class:`~attention_tutorial.measure.roofline.Roof` of ``grid_name``'s recording run: its measured bf16
    matmul and read ceiling, and the datasheet's figures for its GPU."""
    run = provenance.get("grids", {}).get(grid_name, {})
    peak = run.get("matmul_bf16_tflops") or provenance["matmul_bf16_tflops"]
    gbps, _ = read_ceiling(store.select(records, grid=grid_name), provenance)
    if not gbps:
        raise ValueError(f"no read ceiling recorded for grid {grid_name!r}.")
    sheet = DATASHEET.get(provenance.get("gpu"))
    return Roof(peak, gbps, sheet.bf16_tflops if sheet else None, sheet.hbm_gbps if sheet else None)


#: The grid whose recording run gives the roof every page quotes (peak, bandwidth, ridge).
IO_GRID = "seq_long"


def reference_roof(grid_name: str = IO_GRID) -> Roof | None:
    """The roof of the recorded reference's ``grid_name`` run: the one matmul peak, read bandwidth and ridge
    (``.ridge``) the pages quote; None where no result file is installed."""
    records, provenance = reference(grid_name)
    return roof(records, provenance, grid_name) if provenance else None


def _show(records, columns, plot, title, gpu=None):
    from IPython.display import Markdown, display

    display(Markdown(markdown_table(records, columns)))
    if plot:
        _plot(records, plot, title, gpu)


def _plot(records, plot, title, gpu=None):
    from IPython.display import display

    fig = plot_records(records, title=title, **plot)
    both_bases(fig, records, plot, gpu)
    display(fig)
    plt.close(fig)


def both_bases(fig, records, plot: dict, gpu: str | None) -> None:
    """Put the datasheet basis on a figure of ``records`` drawn as ``plot`` describes (``plot_records``' options):
    a right-hand axis in % of the datasheet peak on a % of peak plot, and the datasheet line beside the measured
    matmul's line on a TFLOP/s plot. Nothing for a device without a datasheet figure (a CPU) or, on a % plot, records
    judged against different measured matmuls (no one factor converts them)."""
    y = plot.get("y")
    dtypes = {r.get("dtype") for r in records if r.get("status") == "ok"}
    peak = datasheet_peak(gpu, dtypes.pop() if len(dtypes) == 1 else "bfloat16")[0]
    if peak is None:
        return
    if y == "pct_peak" and (factor := datasheet_factor(records, gpu)):
        datasheet_axis(fig, factor, peak)
    elif y == "tflops" and plot.get("hline"):
        datasheet_line(fig, peak)


def show_live(records, columns, *, plot=None, title="") -> None:
    """Display live records (table, then the plot ``plot`` describes), under the live label."""
    from IPython.display import Markdown, display

    display(Markdown(f"{live_label()}. Shapes: {shapes(records)}."))
    _show(records, columns, plot, f"{title} — live, {environment()['gpu'] or 'CPU'}")


def show_recorded(
    grid_name, columns, *, plot=None, title="", peak_line=False, include=None, live=None, **where
) -> list[dict]:
    """Display the recorded results for ``grid_name`` under a label naming its GPU, versions and date; returns the
    reference GPU's records. Every committed result file is shown, the reference GPU (the H200) first.

    ``include`` ({other grid: {field: value}}) adds records of other grids measured at the same shapes (say, the
    naive and XLA baselines of ``seq_long`` to the FlashAttention race), filtered by ``where`` too. ``live``: on a
    GPU build, the live records just shown; then the reference GPU's table is replaced by a compact live/recorded
    comparison (the plot stays).
    """
    from IPython.display import Markdown, display

    shown = []
    for gpu in result_slugs():
        data = store.recorded(gpu)
        if data is None:
            continue
        prov = data["provenance"]
        recs = store.select(store.select(data["records"], grid=grid_name), **where)
        for other, fields in (include or {}).items():
            recs = store.select(store.select(data["records"], grid=other), **{**where, **fields}) + recs
        if not recs:
            continue
        display(Markdown(f"**Recorded on the GPU:** {store.describe(prov, grid_name)}. Shapes: {shapes(recs)}."))
        recs = with_datasheet(recs, prov.get("gpu"))  # % of peak on both bases, the datasheet's first
        cols = [c for col in columns for c in (("pct_datasheet", col) if col == "pct_peak" else (col,))]
        p = plot
        if p and peak_line:
            peak = prov.get("grids", {}).get(grid_name, {}).get("matmul_bf16_tflops", prov["matmul_bf16_tflops"])
            p = {
                **p,
                "hline": peak if p.get("y") == "tflops" else 100.0,
                "hline_label": "bf16 matmul measured in that run (a reference)",
            }
        if live and gpu == result_slugs()[0] and jax.default_backend() == "gpu":
            rows = live_vs_recorded(live, recs)
            keys = [c for c in columns if c in POINT_FIELDS or c == "impl"]
            display(
                Markdown(
                    "Live against recorded, the points both measured:\n\n"
                    + markdown_table(rows, [*keys, "median_ms", "recorded_ms", "live_over_recorded"])
                )
            )
            live_only = live_failures(live, recs)
            if live_only:
                display(
                    Markdown(
                        "Points that failed in this build but ran in the recording (the recorder ran them in its own "
                        "process; this build's process has also run every earlier cell of the page):\n\n"
                        + markdown_table(live_only, [*keys, "status", "reason", "recorded_ms"])
                    )
                )
            failed = recorded_failures(live, recs)
            if failed:
                display(
                    Markdown(
                        "Recorded points that did not run, and why:\n\n"
                        + markdown_table(failed, [*keys, "status", "reason"])
                    )
                )
            if p:
                _plot(recs, p, f"{title} — recorded, {prov['gpu']}", prov.get("gpu"))
        else:
            _show(recs, cols, p, f"{title} — recorded, {prov['gpu']}", prov.get("gpu"))
        shown.append(recs)
    if not shown:
        display(Markdown("*No recorded GPU results are committed yet (`python -m attention_tutorial record`).*"))
        return []
    return shown[0]
