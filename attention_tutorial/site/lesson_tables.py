"""Tables and words for the lessons of :mod:`attention_tutorial.measure.lessons`, live rows or recorded ones alike,
:func:`recorded_lesson` to read the ones the recorder kept, and the cuDNN page's tables and numbers (which kernel
each implementation compiled to, the head-size limit of a compute capability)."""

from __future__ import annotations

import re

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


def where_recorded(grid: str, directory=None) -> str | None:
    """One line naming the GPU, driver, JAX and cuDNN that recorded ``grid`` ("lessons" for the lessons) in the
    reference GPU's result file, or None. Libraries the run had installed but ``grid`` does not use
    (TransformerEngine) are left out."""
    data = store.recorded(store.REFERENCE_GPU, directory)
    if data is None:
        return None
    prov = dict(data["provenance"], transformer_engine=None)
    prov["grids"] = {g: dict(e, transformer_engine=None) for g, e in prov.get("grids", {}).items()}
    return store.describe(prov, grid)


def _ms(row) -> str:
    return f"{row['median_ms']:#.3g} ({row['p10_ms']:#.3g}–{row['p90_ms']:#.3g})"


def precision_table(rows, *, times: bool = True) -> list[dict]:
    """Display rows of :func:`~attention_tutorial.measure.lessons.precision_rows`: error with its verdict against the
    tolerance, and the time with its spread where the rows were timed (and ``times``; the times are often taken at
    another shape than the errors: :func:`precision_time_table` shows them alone)."""
    out = []
    for r in rows:
        row = {
            "precision": r["precision"],
            "matmuls in": r["matmuls_in"],
            "max |out − float64|" + (f" at {r['shape']}" if r.get("shape") else ""): f"{r['max_abs_error']:.1e}",
            "verdict": f"{agreement(r['max_abs_error'], r['matmuls_in']).word} "
            f"(tolerance {TOLERANCES[r['matmuls_in']]:.0e})",
        }
        if times and r.get("median_ms") is not None:
            row[f"ms per call at {r['time_shape']} (p10–p90)"] = _ms(r)
        out.append(row)
    return out


def precision_time_table(rows) -> list[dict]:
    """The timed rows of :func:`~attention_tutorial.measure.lessons.precision_rows` alone: precision, what the
    matmuls ran in, and the time per call with its spread, at the shape the times were taken."""
    return [
        {
            "precision": r["precision"],
            "matmuls in": r["matmuls_in"],
            "shape": r["time_shape"],
            "ms per call (p10–p90)": _ms(r),
        }
        for r in rows
        if r.get("median_ms") is not None
    ]


def highest_vs_default(rows):
    """A :class:`~attention_tutorial.site.claims.Claim`: how "highest" runs against the default (value: default
    time / highest time, so below 1 means "highest" is slower; word "faster", "slower" or "on par")."""
    by = {r["precision"]: r for r in rows}
    return compare([by["highest"]], [by["default"]])


def refusal_table(rows) -> list[dict]:
    """Display rows of :func:`~attention_tutorial.measure.lessons.cudnn_refusal_rows`, by head size H (then dtype)."""
    rows = sorted(rows, key=lambda r: (r["head_dim"], r["dtype"]))
    return [
        {
            "H": r["head_dim"],
            "dtype": r["dtype"],
            "`cudnn_why_not` says": r["why_not"] or "runs",
            "JAX with cuDNN forced": r["forced"],
        }
        for r in rows
    ]


def refusals_consistent(rows) -> bool:
    """Whether our check and JAX agree on every row: refused by both, or run by both."""
    return all((r["why_not"] is None) == (r["forced"] == "runs") for r in rows)


# NVIDIA's compute capabilities by generation (major, minor) -> name; the first match from the top wins
GENERATIONS = (
    ((12, 0), "Blackwell"),
    ((10, 0), "Blackwell"),
    ((9, 0), "Hopper"),
    ((8, 9), "Ada Lovelace"),
    ((8, 0), "Ampere"),
    ((7, 5), "Turing"),
    ((7, 0), "Volta"),
)


def _capability(compute_capability) -> tuple[int, int]:
    text = str(compute_capability)
    if not re.fullmatch(r"\d+\.\d+", text):
        raise ValueError(f"compute_capability must look like '9.0' (major.minor); got {compute_capability!r:.40}")
    major, minor = text.split(".")
    return int(major), int(minor)


def generation(compute_capability) -> str | None:
    """The GPU generation of a compute capability such as "9.0" (Hopper) or "8.0" (Ampere); None before Volta."""
    cc = _capability(compute_capability)
    return next((name for first, name in GENERATIONS if cc >= first), None)


def cudnn_head_dim_limit(compute_capability) -> int | None:
    """The largest head size H cuDNN's fused attention takes on a GPU of this compute capability, as
    :func:`~attention_tutorial.kernels.fused.cudnn_why_not` checks it: 256 from Hopper (9.0) on, 128 on Ampere and
    Ada (8.x); None below 8.0, where it does not run at all."""
    cc = _capability(compute_capability)
    return 256 if cc >= (9, 0) else 128 if cc >= (8, 0) else None


IMPL_ORDER = ("default", "xla", "cudnn")
IMPL_CALL = {"default": "`None` (default)", "xla": '`"xla"`', "cudnn": '`"cudnn"`'}  # Markdown: code, not prose
_CALL_NAME = re.compile(r"__[A-Za-z0-9_$.]+")


def kernel_table(rows) -> list[dict]:
    """One display row per (implementation, dtype) of ``rows`` (recorded records with a ``kernel`` description, or
    live rows that also carry ``kernels``, the custom-call targets, and ``reason`` where cuDNN was not tried): what
    computed the attention and the library calls in the compiled program. Float32 first, then by implementation."""
    out = []
    for r in sorted(rows, key=lambda r: (r["dtype"] != "float32", r["dtype"], IMPL_ORDER.index(r["impl"]))):
        row = {"implementation": IMPL_CALL[r["impl"]], "dtype": r["dtype"]}
        if r.get("reason"):
            out.append({**row, "what ran": "not tried", "library calls": r["reason"]})
            continue
        kernel = r.get("kernel") or ""
        calls = r["kernels"] if r.get("kernels") is not None else _CALL_NAME.findall(kernel)
        if kernel.startswith("XLA"):
            ran = "XLA's own kernels" + (" and cuBLAS matmuls" if "cublas" in kernel.lower() else "")
            listed = ", ".join(calls) or ("cuBLAS matmuls" if "cublas" in kernel.lower() else "none")
        else:
            ran, listed = kernel.split(" (")[0], ", ".join(calls) or "none"
        out.append({**row, "what ran": ran, "library calls": listed})
    return out


def picked_cudnn(rows, dtype: str = "bfloat16") -> bool | None:
    """Whether the default (``implementation=None``) compiled to cuDNN's fused attention in ``dtype``, among
    :func:`kernel_table`'s input ``rows``; None when no such row ran."""
    ran = [
        r
        for r in rows
        if r["impl"] == "default" and r["dtype"] == dtype and not r.get("reason") and r.get("status", "ok") == "ok"
    ]
    return "cudnn" in (ran[0].get("kernel") or "").lower() if ran else None


def input_table(rows) -> list[dict]:
    """Display rows of :func:`~attention_tutorial.measure.lessons.input_rows`: TFLOP/s and time with spread per input kind."""
    return [
        {
            "inputs": r["inputs"],
            "matmul": f"{r['n']}×{r['n']} @ {r['n']}×{r['n']}, bf16",
            "TFLOP/s": f"{r['tflops']:.3g}",
            "ms per call (p10–p90)": _ms(r),
        }
        for r in rows
    ]


def inputs_vs_random(rows) -> dict:
    """{kind: Claim} for zeros and ones against random inputs (value: random's time / kind's time; above 1 the
    constant inputs run faster; the word is "faster" only outside the spreads)."""
    by = {r["inputs"]: r for r in rows}
    return {kind: compare([by[kind]], [by["random normal"]]) for kind in INPUT_KINDS if kind != "random normal"}
