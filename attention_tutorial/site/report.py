"""What the pages share to show results: the recorded GPU reference (:func:`reference`, read from
``attention_tutorial/results/data/<gpu>.json``, written by the recorder on the GPU), the live run of this build beside
it (:func:`run_live`, :func:`live_table`), each labelled with the hardware, versions and date it came from, and the
roof (measured peak and read ceiling) of a recording run. No number is typed into a page.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import jax

from ..env import environment
from ..measure.flops import DATASHEET, datasheet_peak
from ..measure.grids import points
from ..measure.roofline import Roof
from ..measure.sweep import run_sweep
from ..results import store
from ..results.plotting import markdown_table
from ..train import TWIN
from .claims import compare, same_point


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
    data = store.recorded(store.REFERENCE_GPU)
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
    if not records:
        return "no points"

    def values(field):
        return sorted({r[field] for r in records if r.get(field) is not None}, key=lambda v: (str(type(v)), v))

    def span(field):
        vs = values(field)
        return (", ".join(map(str, vs)) if len(vs) <= 3 else f"{vs[0]}…{vs[-1]}") or "–"

    same = values("seq_q") == values("seq_kv")
    t = f"T = S = {span('seq_q')}" if same else f"T = {span('seq_q')}, S = {span('seq_kv')}"
    parts = [f"B = {span('batch')}", t, f"N = {span('heads')}"]
    if values("kv_heads") != values("heads"):
        parts.append(f"K = {span('kv_heads')}")
    causal = values("causal")
    masks = "causal and not" if len(causal) > 1 else "causal" if causal == [True] else "no mask"
    return ", ".join([*parts, f"H = {span('head_dim')}", ", ".join(values("dtype")), masks])


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


#: Said under a table of live runs set against the recording with a verdict per point.
VERDICT_NOTE = (
    "Each verdict compares the two runs' p10–p90 ranges, not their medians: the same ratio reads "
    '"slower" where the ranges are apart and "on par" where they overlap.'
)


def live_check(live, recorded) -> list[dict]:
    """For each ok live record that the recording also measured (same implementation, every point field equal):
    the live record with ``recorded_ms``, ``live_over_recorded`` and ``verdict`` (the live call "faster",
    "slower" or "on par" against the recording, from both spreads)."""
    rows = []
    for r in live:
        if r.get("status") == "ok" and (same := same_point(recorded or [], r, impl=r["impl"])):
            c = compare([r], same)
            recorded_ms = statistics.median(s["median_ms"] for s in same)
            rows.append({**r, "recorded_ms": recorded_ms, "live_over_recorded": 1 / c.value, "verdict": c.word})
    return rows


def live_table(live, recorded, columns, *, verdicts: bool = False) -> str:
    """Markdown: this build's live records under the live label; on a GPU build, beside the recorded medians of the
    same points (their ratio says how far this GPU is from the recorded one). ``verdicts``: each point also judged
    from both runs' spreads (:func:`live_check`), with :data:`VERDICT_NOTE` under the table."""
    text = f"{live_label()}. Shapes: {shapes(live)}.\n\n" + markdown_table(live, columns)
    rows = live_check(live, recorded) if jax.default_backend() == "gpu" else []
    if rows:
        measured = ("status", "median_ms", "tflops", "gbps", "reason", "dispatch_ms", "kernel")
        keys = [c for c in columns if c not in measured]
        judged = ["verdict"] if verdicts else []
        text += "\n\nAgainst the recording, the same points:\n\n" + markdown_table(
            rows, [*keys, "median_ms", "recorded_ms", "live_over_recorded", *judged]
        )
        text += f"\n\n{VERDICT_NOTE}" if verdicts else ""
    return text


def with_datasheet(records, gpu: str | None) -> list[dict]:
    """``records`` with ``pct_datasheet`` beside ``pct_peak``: their TFLOP/s as a % of ``gpu``'s datasheet peak for
    their dtype (:func:`~attention_tutorial.measure.flops.datasheet_peak`: dense bf16, dense FP8 for FP8 records),
    where ``pct_peak`` divides by the bf16 matmul measured in the recording run. None where a record has no TFLOP/s
    or the device has no datasheet figure (a CPU)."""
    out = []
    for r in records:
        peak, _ = datasheet_peak(gpu, r.get("dtype") or "bfloat16")
        out.append({**r, "pct_datasheet": 100 * r["tflops"] / peak if peak and r.get("tflops") else None})
    return out


def both_bases(fig, records, plot: dict, gpu: str | None) -> None:
    """Give a figure of ``records`` drawn as ``plot`` describes (``plot_records``' options) in % of the measured
    matmul (``y="pct_peak"``; panels share their y axis) a right-hand axis in % of ``gpu``'s datasheet peak; the
    legend moves right. Nothing for other plots, a device without a datasheet figure (a CPU), or records judged
    against different measured matmuls (several recording runs: no one factor converts them)."""
    dtypes = {r.get("dtype") for r in records if r.get("status") == "ok"}
    peak, _ = datasheet_peak(gpu, dtypes.pop() if len(dtypes) == 1 else "bfloat16")
    factors = {  # measured matmul / datasheet peak, one per recording run
        round(r["pct_datasheet"] / r["pct_peak"], 9)
        for r in with_datasheet(records, gpu)
        if r.get("pct_peak") and r.get("pct_datasheet")
    }
    if plot.get("y") != "pct_peak" or peak is None or len(factors) != 1 or not fig.axes:
        return
    factor = factors.pop()
    ax = fig.axes[-1]
    right = ax.secondary_yaxis("right", functions=(lambda p: p * factor, lambda p: p / factor))
    right.set_ylabel(f"% of datasheet peak ({peak:.0f} TFLOP/s)")
    if (legend := ax.get_legend()) is not None:
        legend.set_bbox_to_anchor((1.16, 1.0))


def train_rows(summaries, *, peak: bool = True) -> list[dict]:
    """One table row per training run (``kind`` "summary" records): time, throughput, memory, losses, kernel.
    ``peak=False`` leaves out the device's peak memory (runs that share one process share one peak); the held-out loss
    column is left out when no run has one."""

    def mib(b):
        return f"{b / 2**20:.1f}" if b is not None else "–"

    left_out = {"peak memory (MiB)"} if not peak else set()
    if all(s.get("eval_loss") is None for s in summaries):
        left_out.add("held-out loss")
    rows = []
    for s in summaries:
        ok = s["status"] == "ok"
        row = {
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
        rows.append({k: v for k, v in row.items() if k not in left_out})
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


def read_ceiling(records, provenance) -> float | None:
    """The read ceiling (GB/s) that ``records``' ``pct_read`` was computed against: the median of gbps · 100 /
    pct_read over them (one recording run gives one ceiling, up to rounding); without pct_read, ``provenance``'s
    read_gbps (the latest recording run's); None without either."""
    ceilings = [r["gbps"] * 100 / r["pct_read"] for r in records if r.get("pct_read") and r.get("gbps")]
    return statistics.median(ceilings) if ceilings else (provenance or {}).get("read_gbps")


def reference_roof(grid_name: str = "seq_long") -> Roof | None:
    """The :class:`~attention_tutorial.measure.roofline.Roof` of the recorded reference's ``grid_name`` run (by
    default the sequence-length sweep's): its measured bf16 matmul and read ceiling, the one peak, bandwidth and
    ridge (``.ridge``) the pages quote, and the datasheet's figures for its GPU; None where no result file is
    installed."""
    records, provenance = reference(grid_name)
    if provenance is None:
        return None
    run = provenance.get("grids", {}).get(grid_name, {})
    peak = run.get("matmul_bf16_tflops") or provenance["matmul_bf16_tflops"]
    gbps = read_ceiling(records, provenance)
    if not gbps:
        raise ValueError(f"no read ceiling recorded for grid {grid_name!r}.")
    sheet = DATASHEET.get(provenance.get("gpu"))
    return Roof(peak, gbps, sheet.bf16_tflops if sheet else None, sheet.hbm_gbps if sheet else None)
