"""Tables and words for the lessons of :mod:`attention_tutorial.measure.lessons`, live rows or recorded ones alike,
and :func:`recorded_lesson` to read the ones the recorder kept."""

from __future__ import annotations

from ..measure.lessons import INPUT_KINDS
from ..results import store
from .claims import TOLERANCES, agreement, compare

LESSONS = ("precision", "cudnn_refusals", "gqa", "inputs")


def recorded_lesson(name: str, directory=None) -> tuple[list[dict] | None, str | None]:
    """(rows, where they came from) of lesson ``name`` ("precision", "cudnn_refusals", "gqa", "inputs") in the
    reference GPU's result file (in ``directory``, default the committed ones); (None, None) when not recorded."""
    if name not in LESSONS:
        raise ValueError(f"unknown lesson {name!r}; choose from {', '.join(LESSONS)}")
    data = store.recorded(store.REFERENCE_GPU, directory)
    rows = (data or {}).get("provenance", {}).get("lessons", {}).get(name)
    if not rows:
        return None, None
    return rows, store.describe(data["provenance"], "lessons")


def _ms(row) -> str:
    return f"{row['median_ms']:#.3g} ({row['p10_ms']:#.3g}–{row['p90_ms']:#.3g})"


def precision_table(rows) -> list[dict]:
    """Display rows of :func:`~attention_tutorial.measure.lessons.precision_rows`: error with its verdict against the
    tolerance, and the time with its spread where the rows were timed."""
    out = []
    for r in rows:
        row = {"precision": r["precision"], "matmuls in": r["matmuls_in"],
               "max |out − float64|" + (f" at {r['shape']}" if r.get("shape") else ""): f"{r['max_abs_error']:.1e}",
               "verdict": f"{agreement(r['max_abs_error'], r['matmuls_in']).word} "
                          f"(tolerance {TOLERANCES[r['matmuls_in']]:.0e})"}  # fmt: skip
        if r.get("median_ms") is not None:
            row[f"ms per call at {r['time_shape']} (p10–p90)"] = _ms(r)
        out.append(row)
    return out


def highest_vs_default(rows):
    """A :class:`~attention_tutorial.site.claims.Claim`: how "highest" runs against the default (value: default
    time / highest time, so below 1 means "highest" is slower; word "faster", "slower" or "on par")."""
    by = {r["precision"]: r for r in rows}
    return compare([by["highest"]], [by["default"]])


def refusal_table(rows) -> list[dict]:
    """Display rows of :func:`~attention_tutorial.measure.lessons.cudnn_refusal_rows`."""
    return [{"H": r["head_dim"], "dtype": r["dtype"], "our check (cudnn_why_not)": r["why_not"] or "runs",
             "JAX when cuDNN is forced": r["forced"]} for r in rows]  # fmt: skip


def refusals_consistent(rows) -> bool:
    """Whether our check and JAX agree on every row: refused by both, or run by both."""
    return all((r["why_not"] is None) == (r["forced"] == "runs") for r in rows)


def input_table(rows) -> list[dict]:
    """Display rows of :func:`~attention_tutorial.measure.lessons.input_rows`: TFLOP/s and time with spread per input kind."""
    return [{"inputs": r["inputs"], "matmul": f"{r['n']}×{r['n']} @ {r['n']}×{r['n']}, bf16", "TFLOP/s": f"{r['tflops']:.3g}",
             "ms per call (p10–p90)": _ms(r)} for r in rows]  # fmt: skip


def inputs_vs_random(rows) -> dict:
    """{kind: Claim} for zeros and ones against random inputs (value: random's time / kind's time; above 1 the
    constant inputs run faster; the word is "faster" only outside the spreads)."""
    by = {r["inputs"]: r for r in rows}
    return {kind: compare([by[kind]], [by["random normal"]]) for kind in INPUT_KINDS if kind != "random normal"}
