"""Tables and words for the small lessons of :mod:`attention_tutorial.measure.lessons`, live rows or the recorded
ones (:func:`recorded_lesson`), and the cuDNN page's tables: which kernel each implementation compiled to, and the
head-size limit of a compute capability."""

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
    return (rows, store.describe(data["provenance"], "lessons")) if rows else (None, None)


def _ms(row) -> str:
    return f"{row['median_ms']:#.3g} ({row['p10_ms']:#.3g}–{row['p90_ms']:#.3g})"


def precision_table(rows) -> list[dict]:
    """Display rows of :func:`~attention_tutorial.measure.lessons.precision_rows`: each error with its verdict
    against the tolerance of what the matmuls ran in (:func:`precision_time_table` shows the times)."""
    return [
        {
            "precision": r["precision"],
            "matmuls in": r["matmuls_in"],
            "max |out − float64|" + (f" at {r['shape']}" if r.get("shape") else ""): f"{r['max_abs_error']:.1e}",
            "verdict": f"{agreement(r['max_abs_error'], r['matmuls_in']).word} "
            f"(tolerance {TOLERANCES[r['matmuls_in']]:.0e})",
        }
        for r in rows
    ]


def precision_time_table(rows) -> list[dict]:
    """The timed rows of :func:`~attention_tutorial.measure.lessons.precision_rows`: precision, what the matmuls ran
    in, and the time per call with its spread, at the shape the times were taken."""
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


def refusal_table(rows) -> list[dict]:
    """Display rows of :func:`~attention_tutorial.measure.lessons.cudnn_refusal_rows`, by head size H (then dtype)."""
    return [
        {
            "H": r["head_dim"],
            "dtype": r["dtype"],
            "`cudnn_why_not` says": r["why_not"] or "runs",
            "JAX with cuDNN forced": r["forced"],
        }
        for r in sorted(rows, key=lambda r: (r["head_dim"], r["dtype"]))
    ]


def refusals_consistent(rows) -> bool:
    """Whether our check and JAX agree on every row: refused by both, or run by both."""
    return all((r["why_not"] is None) == (r["forced"] == "runs") for r in rows)


#: The first compute capability of each NVIDIA generation, newest first: the first one at or below a GPU's names it
GENERATIONS = {
    (10, 0): "Blackwell",
    (9, 0): "Hopper",
    (8, 9): "Ada Lovelace",
    (8, 0): "Ampere",
    (7, 5): "Turing",
    (7, 0): "Volta",
}


def _capability(compute_capability) -> tuple[int, int]:
    text = str(compute_capability)
    if not re.fullmatch(r"\d+\.\d+", text):
        raise ValueError(f"compute_capability must look like '9.0' (major.minor); got {compute_capability!r:.40}")
    major, minor = text.split(".")
    return int(major), int(minor)


def generation(compute_capability) -> str | None:
    """The GPU generation of a compute capability such as "9.0" (Hopper) or "8.0" (Ampere); None before Volta."""
    cc = _capability(compute_capability)
    return next((name for first, name in GENERATIONS.items() if cc >= first), None)


def cudnn_head_dim_limit(compute_capability) -> int | None:
    """The largest head size H cuDNN's fused attention takes on a GPU of this compute capability, as
    :func:`~attention_tutorial.kernels.fused.cudnn_why_not` checks it: 256 from Hopper (9.0) on, 128 on Ampere and
    Ada (8.x); None below 8.0, where it does not run at all."""
    cc = _capability(compute_capability)
    return 256 if cc >= (9, 0) else 128 if cc >= (8, 0) else None


IMPL_ORDER = ("default", "xla", "cudnn")
IMPL_CALL = {"default": "`None` (default)", "xla": '`"xla"`', "cudnn": '`"cudnn"`'}  # Markdown: code, not prose


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
        calls = r["kernels"] if r.get("kernels") is not None else re.findall(r"__[A-Za-z0-9_$.]+", kernel)
        cublas = "cublas" in kernel.lower()
        if kernel.startswith("XLA"):
            ran = "XLA's own kernels" + (" and cuBLAS matmuls" if cublas else "")
            listed = ", ".join(calls) or ("cuBLAS matmuls" if cublas else "none")
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
    """Display rows of :func:`~attention_tutorial.measure.lessons.input_rows`: TFLOP/s and time per input kind."""
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
