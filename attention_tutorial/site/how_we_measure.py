"""What the "how we measure" page needs: the verdict rule drawn on recorded examples, the datasheet peak a percentage
divides by and the matmul measured on the card beside it, and what a result file records. Numbers and verdicts only: the sentences are in ``docs/how_we_measure.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt

from ..measure.flops import BF16_PEAK, datasheet_peak
from ..results.plotting import PALETTE, impl_style, label
from .claims import Claim, compare, spread_ms

#: The provenance fields the page lists, in its order (a result file's top level; each grid keeps its own copy): the
#: commit and dirty flag of the code that ran where the run kept them.
PROVENANCE_FIELDS = (
    "gpu",
    "driver",
    "jax",
    "jaxlib",
    "cudnn",
    "transformer_engine",
    "python",
    "created",
    "command",
    "commit",
    "dirty",
    "matmul_bf16_tflops",
    "matmul_shape",
    "copy_gbps",
    "read_gbps",
)
#: FlashAttention-3's best bf16 forward on an H100 SXM5 in its paper (arXiv 2407.08608), TFLOP/s: attention running
#: faster than the 8192³ matmul measured on an H200, so that matmul is a reference, not a ceiling.
FA3_BF16_TFLOPS = 740
#: The fields of one timed record the page lists, in its order.
RECORD_FIELDS = (
    "grid",
    "impl",
    "batch",
    "seq_q",
    "seq_kv",
    "heads",
    "kv_heads",
    "head_dim",
    "dtype",
    "causal",
    "pass",
    "status",
    "median_ms",
    "p10_ms",
    "p90_ms",
    "repeats",
    "single_call_ms",
    "dispatch_ms",
    "compile_s",
    "tflops",
    "pct_peak",
    "peak_basis",
    "temp_bytes",
    "kernel",
)


def run_peaks(records, provenance) -> list[float]:
    """The bf16 matmul peaks that the bf16/f16 ``records``' % of peak divides by: one per recording run (each run
    measures its own, stored in the provenance of its grids), sorted, unrounded."""
    grids = provenance.get("grids", {})
    return sorted(
        {
            grids.get(r["grid"], provenance).get("matmul_bf16_tflops", provenance["matmul_bf16_tflops"])
            for r in records
            if r.get("pct_peak") and r.get("peak_basis") == BF16_PEAK
        }
    )


@dataclass(frozen=True)
class Peaks:
    """The two bases of a % of peak on one GPU: the datasheet's dense bf16 figure, the peak (None for a device
    without one, such as a CPU), and the bf16 matmul on random data measured in each recording run, a reference on the
    card (lowest, highest, how many runs), with the same matmul on zeros, ones and random numbers (``by_input``,
    TFLOP/s) where recorded."""

    gpu: str | None
    datasheet: float | None
    measured: tuple[float, float]
    runs: int
    by_input: dict

    @property
    def share(self) -> tuple[float, float] | None:
        """The measured matmul as a fraction of the datasheet peak (lowest, highest); None without a datasheet peak."""
        if not self.datasheet:
            return None
        return self.measured[0] / self.datasheet, self.measured[1] / self.datasheet


def peaks(provenance: dict, records=None) -> Peaks:
    """:class:`Peaks` of a result file's ``provenance``: the measured matmuls of the runs its ``records`` (every
    grid's run when None) were set against."""
    if records is None:
        grids = provenance.get("grids", {})
        measured = sorted(
            {g["matmul_bf16_tflops"] for g in grids.values() if g.get("matmul_bf16_tflops")}
            | {provenance["matmul_bf16_tflops"]}
        )
    else:
        measured = run_peaks(records, provenance)
    if not measured:
        raise ValueError("peaks needs a provenance with matmul_bf16_tflops (or records judged against one).")
    inputs = {r["inputs"]: r["tflops"] for r in provenance.get("lessons", {}).get("inputs", [])}
    gpu = provenance.get("gpu")
    return Peaks(gpu, datasheet_peak(gpu, "bfloat16")[0], (measured[0], measured[-1]), len(measured), inputs)


def to_datasheet(pct_measured: float, measured_peak: float, datasheet: float) -> float:
    """A % of the measured matmul, as a % of the datasheet peak: the same TFLOP/s over the other basis."""
    if measured_peak <= 0 or datasheet <= 0:
        raise ValueError(f"both peaks must be positive; got measured {measured_peak}, datasheet {datasheet}.")
    return pct_measured * measured_peak / datasheet


def peaks_figure(p: Peaks, attention: tuple[str, float] | None = None):
    """Bars of TFLOP/s: the datasheet peak, the same bf16 matmul on zeros, ones and random data (with the range
    over the recording runs on the random one, the reference on the card), and optionally one attention result
    (``(name, TFLOP/s)``). Each bar is labelled with its TFLOP/s and its % of the datasheet peak."""
    bars = []  # (name, TFLOP/s, colour, (low, high) or None)
    if p.datasheet:
        bars.append(("datasheet: dense bf16", p.datasheet, "#999999", None))
    for kind, colour in (("zeros", PALETTE[5]), ("ones", PALETTE[5])):
        if kind in p.by_input:
            bars.append((f"8192³ bf16 matmul on {kind}", p.by_input[kind], colour, None))
    random = p.by_input.get("random normal", (p.measured[0] + p.measured[1]) / 2)
    bars.append(("8192³ bf16 matmul on random data\n(the reference on this card)", random, PALETTE[0], p.measured))
    if attention:
        bars.append((attention[0], attention[1], PALETTE[3], None))
    fig, ax = plt.subplots(figsize=(7.0, 0.55 * len(bars) + 1.2), facecolor="white", layout="constrained")
    ax.set_facecolor("white")
    ys = list(range(len(bars)))[::-1]
    for y, (_, value, colour, span) in zip(ys, bars):
        ax.barh(y, value, color=colour, height=0.6)
        if span:
            ax.errorbar(
                value,
                y,
                xerr=[[value - span[0]], [span[1] - value]],
                color="black",
                capsize=4,
                linewidth=1.2,
                label=f"range over {p.runs} recording runs",
            )
        share = f" ({100 * value / p.datasheet:.0f} % of datasheet)" if p.datasheet else ""
        ax.text(value + 10, y, f"{value:.0f}{share}", va="center", fontsize=8)
    ax.set_yticks(ys, [b[0] for b in bars], fontsize=8)
    ax.set_xlabel("TFLOP/s")
    ax.set_xlim(0, max(b[1] for b in bars) * 1.35)
    ax.grid(True, axis="x", color="#dddddd", linewidth=0.8)
    ax.set_title(f"{p.gpu or 'this device'}: what a % of peak can divide by", fontsize=11)
    if p.runs > 1:
        ax.legend(fontsize=8, loc="lower right")
    return fig


@dataclass(frozen=True)
class Example:
    """Two sets of records of one point compared: each side's (median, low, high) time in ms and the claim."""

    a: str
    b: str
    a_ms: tuple[float, float, float]
    b_ms: tuple[float, float, float]
    claim: Claim

    @property
    def gap_pct(self) -> float:
        """How much longer A's median time is than B's, in % (negative: shorter)."""
        return 100 * (self.a_ms[0] / self.b_ms[0] - 1)


def example(records, a: str, b: str, **where) -> Example:
    """:class:`Example` of implementation ``a`` against ``b`` over the ok ``records`` matching ``where``."""
    from ..results.store import select

    ra, rb = select(records, impl=a, status="ok", **where), select(records, impl=b, status="ok", **where)
    if not ra or not rb:
        raise ValueError(
            f"example needs ok records of both {a!r} and {b!r} where {where}; got {len(ra)} and {len(rb)}."
        )
    return Example(a, b, spread_ms(ra), spread_ms(rb), compare(ra, rb))


def verdict_figure(examples):
    """One row per :class:`Example`, on one shared time axis: each side's p10–p90 range as a bar and its median as
    a tick, titled with the verdict :func:`~attention_tutorial.site.claims.compare` gave."""
    fig, axes = plt.subplots(
        len(examples),
        1,
        figsize=(7.0, 1.35 * len(examples) + 0.6),
        facecolor="white",
        layout="constrained",
        squeeze=False,
        sharex=True,
    )
    for ax, ex in zip(axes[:, 0], examples):
        ax.set_facecolor("white")
        for y, (impl, (med, lo, hi)) in enumerate(((ex.b, ex.b_ms), (ex.a, ex.a_ms))):
            colour = impl_style(impl)[0]
            ax.barh(y, hi - lo, left=lo, height=0.5, color=colour, alpha=0.35)
            ax.plot([med, med], [y - 0.3, y + 0.3], color=colour, linewidth=2.5)
        ax.set_yticks([0, 1], [label(ex.b), label(ex.a)], fontsize=8)
        ax.set_ylim(-0.6, 1.6)
        ax.set_title(f"{label(ex.a)} against {label(ex.b)}: {ex.claim.word}", fontsize=10, loc="left")
        ax.grid(True, axis="x", color="#dddddd", linewidth=0.8)
        ax.margins(x=0.08)
    axes[-1, 0].set_xlabel("ms per call: the p10–p90 range (bar) and the median (tick)")
    return fig


def provenance_rows(provenance: dict, fields=PROVENANCE_FIELDS) -> list[dict]:
    """(field, value) rows of a result file's top-level provenance, values as text ('–' where absent; the command
    as inline code)."""

    def text(v):
        if v is None:
            return "–"
        if isinstance(v, bool):  # the dirty flag
            return "yes (uncommitted changes)" if v else "no"
        if isinstance(v, float):
            return f"{v:.4g}"
        if isinstance(v, list):
            return " × ".join(map(str, v))
        return str(v)

    rows = [{"field": f, "value": text(provenance.get(f))} for f in fields]
    for row in rows:  # a command as code: its "--" must not render as a dash
        if row["field"] == "command" and row["value"] != "–":
            row["value"] = f"`{row['value']}`"
    return rows


def record_rows(record: dict, fields=RECORD_FIELDS) -> list[dict]:
    """(field, value) rows of one record, for the fields it has."""
    return [
        {"field": f, "value": f"{record[f]:.4g}" if isinstance(record[f], float) else str(record[f])}
        for f in fields
        if f in record
    ]
