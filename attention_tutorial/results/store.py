"""Result files: records plus the provenance that says where they came from; save, load, validate, find.

A result file is JSON with two keys. ``provenance``: gpu, driver, jax, jaxlib, cudnn, transformer_engine,
python, created, command, and the ceilings matmul_bf16_tflops and copy_gbps measured in the same run (plus
per-grid details under ``grids`` and instruction counts of the Pallas kernels under ``kernel_code``).
``records``: one dict per measured point (see :mod:`attention_tutorial.measure.sweep`), each tagged with its ``grid``. Files are written only by the recorder on a GPU, never by hand.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..measure.sweep import STATUSES

PROVENANCE_FIELDS = {
    "gpu": str, "driver": str, "jax": str, "jaxlib": str, "cudnn": str, "transformer_engine": (str, type(None)),
    "python": str, "created": str, "command": str, "matmul_bf16_tflops": (int, float), "copy_gbps": (int, float),
}  # fmt: skip
RECORD_FIELDS = {
    "impl": str, "batch": int, "seq_q": int, "seq_kv": int, "heads": int, "kv_heads": int, "head_dim": int,
    "dtype": str, "causal": bool, "pass": str, "status": str, "median_ms": (int, float, type(None)),
    "p10_ms": (int, float, type(None)), "p90_ms": (int, float, type(None)), "tflops": (int, float, type(None)),
}  # fmt: skip
# Provenance entries a later partial run adds to instead of replacing: per-grid details, kernel instruction counts.
MERGED_PROVENANCE = ("grids", "kernel_code")
RESULTS_DIR = Path(
    os.environ.get("ATTENTION_TUTORIAL_RESULTS", Path(__file__).resolve().parent / "data")
)


def slug(gpu_name: str) -> str:
    """A file name for a GPU: 'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def validate(data: dict) -> list[str]:
    """Every way ``data`` breaks the result-file schema, as messages; an empty list means it is valid."""
    problems = []
    prov = data.get("provenance")
    if not isinstance(prov, dict):
        return ["missing top-level 'provenance' object"]
    for field, types in PROVENANCE_FIELDS.items():
        if field not in prov:
            problems.append(f"provenance lacks {field!r}")
        elif not isinstance(prov[field], types) or isinstance(prov[field], bool):
            problems.append(f"provenance {field!r} has type {type(prov[field]).__name__}")
    records = data.get("records")
    if not isinstance(records, list) or not records:
        return [*problems, "'records' must be a non-empty list"]
    for i, rec in enumerate(records):
        for field, types in RECORD_FIELDS.items():
            if field not in rec:
                problems.append(f"record {i} lacks {field!r}")
            elif not isinstance(rec[field], types) or (isinstance(rec[field], bool) and types is not bool):
                problems.append(f"record {i} {field!r} has type {type(rec[field]).__name__}")
        status = rec.get("status")
        if status not in STATUSES:
            problems.append(f"record {i} has unknown status {status!r} (known: {STATUSES})")
        elif status == "ok" and not all(isinstance(rec.get(f), (int, float)) for f in ("median_ms", "tflops")):
            problems.append(f"record {i} is ok but has no median_ms/tflops")
        elif status != "ok" and not rec.get("reason"):
            problems.append(f"record {i} has status {status!r} but no reason")
        if rec.get("pass") not in ("fwd", "fwd+bwd"):
            problems.append(f"record {i} has unknown pass {rec.get('pass')!r}")
    return problems


def save(path, provenance: dict, records: list[dict], *, replace_grids=True) -> dict:
    """Write a result file; with ``replace_grids``, records of grids not re-run are kept from an existing file."""
    path = Path(path)
    new_grids = {r.get("grid") for r in records}
    if replace_grids and path.exists():
        old = json.loads(path.read_text())
        keep = [r for r in old["records"] if r.get("grid") not in new_grids]
        merged = {key: {**old["provenance"].get(key, {}), **provenance.get(key, {})} for key in MERGED_PROVENANCE}
        records, provenance = keep + records, {**provenance, **{k: v for k, v in merged.items() if v}}
    data = {"provenance": provenance, "records": records}
    problems = validate(data)
    if problems:
        raise ValueError("refusing to write an invalid result file: " + "; ".join(problems[:5]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return data


def load(path) -> dict:
    """Read and validate a result file; ``ValueError`` lists what is wrong."""
    data = json.loads(Path(path).read_text())
    problems = validate(data)
    if problems:
        raise ValueError(f"{path} is not a valid result file: " + "; ".join(problems[:5]))
    return data


def recorded(gpu: str = "nvidia-h200", directory=None) -> dict | None:
    """The recorded reference results for ``gpu`` (a slug, e.g. 'nvidia-h200'), or None if none is committed."""
    path = Path(directory or RESULTS_DIR) / f"{slug(gpu)}.json"
    return load(path) if path.exists() else None


def select(records, **where) -> list[dict]:
    """Records whose fields equal every ``where`` item (``pass_`` matches 'pass'); a value may be a tuple of choices."""
    where = {("pass" if k == "pass_" else k): v for k, v in where.items()}

    def ok(rec):
        return all(rec.get(k) in (v if isinstance(v, tuple) else (v,)) for k, v in where.items())

    return [r for r in records if ok(r)]


def describe(provenance: dict, grid: str | None = None) -> str:
    """One line naming where results came from: GPU, driver, JAX, cuDNN, TE, date — of ``grid``'s own run where
    the file records it (each grid keeps the versions it was measured with), else of the latest run."""
    entry = provenance.get("grids", {}).get(grid) if grid else None
    # a grid entry written before per-grid versions were kept does not say whether TE was there: name none
    p = {**provenance, "transformer_engine": None, **entry} if entry else provenance
    te = f", TransformerEngine {p['transformer_engine']}" if p.get("transformer_engine") else ""
    return (
        f"{p['gpu']} (driver {p['driver']}), JAX {p['jax']} / jaxlib {p['jaxlib']}, cuDNN {p['cudnn']}{te}, "
        f"Python {p['python']}, recorded {p['created'][:10]}"
    )
