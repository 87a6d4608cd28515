"""Result files: records plus the provenance that says where they came from; save, load, validate, find.

A result file is JSON with two keys. ``provenance``: backend ("gpu" when absent, or "cpu"), gpu, driver, jax,
jaxlib, cudnn, transformer_engine, python, created, command, and the ceilings matmul_bf16_tflops and copy_gbps
measured in the same run (null when not measured; gpu, driver and cudnn are null on a CPU), plus per-grid details
under ``grids``, instruction counts of the Pallas kernels under ``kernel_code``, the small lessons of :mod:`~attention_tutorial.measure.lessons` under ``lessons`` and what scripts did to the file
under ``history``. ``records``: one dict per measured point, built and checked by
:mod:`attention_tutorial.measure.sweep` (the one owner of the record schema), each tagged with its ``grid``.

Files are written atomically (a temporary file in the same folder, flushed and fsynced, then ``os.replace``): a
write killed at any moment leaves the previous file whole. An existing file is merged into, never silently
replaced, and one that is not a result file is never merged into (:class:`ResultFileError`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import re
import tempfile
from pathlib import Path

from ..measure.sweep import check_record, point_key

PROVENANCE_FIELDS = {
    "gpu": str, "driver": str, "jax": str, "jaxlib": str, "cudnn": str, "transformer_engine": (str, type(None)),
    "python": str, "created": str, "command": str,
}  # fmt: skip
GPU_ONLY = ("gpu", "driver", "cudnn")  # null on a CPU
CEILINGS = ("matmul_bf16_tflops", "copy_gbps")  # present in every file; null when the run did not measure them
# Provenance entries a later run adds to instead of replacing: per-grid details, kernel instruction counts, history.
MERGED_PROVENANCE = ("grids", "kernel_code", "lessons")
REFERENCE_GPU = "nvidia-h200"
RESULTS_DIR = Path(os.environ.get("ATTENTION_TUTORIAL_RESULTS", Path(__file__).resolve().parent / "data"))


class ResultFileError(ValueError):
    """A file that is not a valid result file (empty, truncated, not JSON, not results, breaking the schema)."""


def slug(gpu_name: str) -> str:
    """A file name for a GPU: 'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def _bad_date(value) -> bool:
    try:
        dt.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return True
    return False


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_provenance(prov: dict) -> list[str]:
    out = []
    backend = prov.get("backend", "gpu")
    if not isinstance(backend, str) or not backend:
        out.append(f"provenance 'backend' must be a name such as 'gpu' or 'cpu'; got {backend!r}")
    for field, types in PROVENANCE_FIELDS.items():
        nullable = backend != "gpu" and field in GPU_ONLY
        if field not in prov:
            out.append(f"provenance lacks {field!r}")
        elif not isinstance(prov[field], types) and not (nullable and prov[field] is None):
            out.append(f"provenance {field!r} has type {type(prov[field]).__name__}")
    if isinstance(prov.get("created"), str) and _bad_date(prov["created"]):
        out.append(f"provenance 'created' is not an ISO date: {prov['created']!r}")
    for field in CEILINGS:
        if field not in prov:
            out.append(f"provenance lacks {field!r} (null when not measured)")
        elif prov[field] is not None and not (_is_number(prov[field]) and prov[field] > 0):
            out.append(f"provenance {field!r} must be a positive number or null; got {prov[field]!r}")
    grids = prov.get("grids", {})
    if not isinstance(grids, dict):
        return [*out, f"provenance 'grids' must be an object of grid name -> details; got {type(grids).__name__}"]
    for name, entry in grids.items():
        if not isinstance(entry, dict):
            out.append(f"provenance grid {name!r} must be an object; got {type(entry).__name__}")
            continue
        if _bad_date(entry.get("created")):
            out.append(f"provenance grid {name!r} has no ISO 'created' date: {entry.get('created')!r}")
        if "seconds" in entry and not (_is_number(entry["seconds"]) and entry["seconds"] >= 0):
            out.append(f"provenance grid {name!r} 'seconds' must be a number >= 0; got {entry['seconds']!r}")
        peak = entry.get("matmul_bf16_tflops")
        if peak is not None and not (_is_number(peak) and peak > 0):
            out.append(f"provenance grid {name!r} 'matmul_bf16_tflops' must be positive; got {peak!r}")
    return out


def validate(data) -> list[str]:
    """Every way ``data`` breaks the result-file schema, as messages; an empty list means it is valid."""
    if not isinstance(data, dict):
        return [f"the top level is a {type(data).__name__}, not an object with 'provenance' and 'records'"]
    prov = data.get("provenance")
    if not isinstance(prov, dict):
        return ["missing top-level 'provenance' object"]
    problems = _check_provenance(prov)
    records = data.get("records")
    if not isinstance(records, list) or not records:
        return [*problems, "'records' must be a non-empty list"]
    grids = prov.get("grids") if isinstance(prov.get("grids"), dict) else None
    for i, rec in enumerate(records):
        problems += [f"record {i} {p}" for p in check_record(rec)]
        if grids is not None and isinstance(rec, dict) and "grid" in rec and rec["grid"] not in grids:
            problems.append(f"record {i} belongs to grid {rec.get('grid')!r}, which the provenance's grids lack")
    return problems


def load(path) -> dict:
    """Read and validate a result file; :class:`ResultFileError` (a ``ValueError``) names the file and what is
    wrong with it (empty, truncated or not JSON, not a result file, or each way it breaks the schema)."""
    path = Path(path)
    raw = path.read_bytes()
    if not raw.strip():
        raise ResultFileError(f"{path} is empty ({len(raw)} bytes), not a result file.") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ResultFileError(
            f"{path} is not UTF-8 text ({err.reason} at byte {err.start}), not a result file."
        ) from None
    except json.JSONDecodeError as err:
        cut = err.msg.startswith("Unterminated") or err.pos >= len(raw.rstrip()) - 1
        end = " (it ends early: truncated?)" if cut else ""
        raise ResultFileError(
            f"{path} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno} of {len(raw)} bytes{end}."
        ) from None
    if not isinstance(data, dict) or not {"provenance", "records"} <= set(data):
        found = sorted(data)[:8] if isinstance(data, dict) else type(data).__name__
        raise ResultFileError(
            f"{path} is JSON but not a result file: it needs 'provenance' and 'records' at the top; found {found}."
        )
    problems = validate(data)
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ResultFileError(f"{path} is not a valid result file: " + "; ".join(problems[:5]) + more)
    return data


def _merge(old: dict, provenance: dict, records: list[dict], replace_grids: bool) -> tuple[dict, list[dict]]:
    """(provenance, records) of ``old`` with the new ones merged in (see :func:`save`)."""
    if replace_grids:
        new_grids = {r.get("grid") for r in records}
        keep = [r for r in old["records"] if r.get("grid") not in new_grids]
    else:
        new_points = {point_key(r) for r in records}
        keep = [r for r in old["records"] if point_key(r) not in new_points]
    prov = {**provenance}
    for key in MERGED_PROVENANCE:
        merged = {**old["provenance"].get(key, {}), **provenance.get(key, {})}
        if merged:
            prov[key] = merged
    history = old["provenance"].get("history", []) + [h for h in provenance.get("history", [])
                                                      if h not in old["provenance"].get("history", [])]  # fmt: skip
    if history:
        prov["history"] = history
    return prov, keep + records


def _device(prov: dict) -> tuple:
    return prov.get("backend", "gpu"), prov.get("gpu")


def save(path, provenance: dict, records: list[dict], *, replace_grids=True, overwrite=False) -> dict:
    """Write a result file atomically and return what was written.

    An existing result file is merged into, never replaced: with ``replace_grids`` (the recorder) the grids in
    ``records`` replace those grids' old records and every other grid is kept; with ``replace_grids=False`` every
    old record is kept except one for the very same point (see ``point_key``), which its new measurement replaces.
    A file that is not a valid result file, or holds another device's results, is refused (``ResultFileError``)
    unless ``overwrite``, which writes ``provenance`` and ``records`` alone. Invalid data is never written.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        try:
            old = load(path)
        except ResultFileError as err:
            raise ResultFileError(f"refusing to merge into {path}: {err}") from None
        if _device(old["provenance"]) != _device(provenance):
            raise ResultFileError(
                f"refusing to merge into {path}: it holds results of {_device(old['provenance'])}, this run is "
                f"{_device(provenance)}; write another file (results of one device per file)."
            )
        provenance, records = _merge(old, provenance, records, replace_grids)
    data = {"provenance": provenance, "records": records}
    problems = validate(data)
    if problems:
        raise ValueError(f"refusing to write an invalid result file to {path}: " + "; ".join(problems[:5]))
    write_atomic(path, json.dumps(data, indent=1) + "\n")
    return data


def write_atomic(path, text: str) -> None:
    """Write ``text`` to ``path`` so that a crash at any moment leaves either the old file or the new one: a
    temporary file in the same folder, flushed and fsynced, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the OS allows it
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def recorded(gpu: str = REFERENCE_GPU, directory=None) -> dict | None:
    """The recorded reference results for ``gpu`` (a slug, e.g. 'nvidia-h200'), or None if none is committed."""
    path = Path(directory or RESULTS_DIR) / f"{slug(gpu)}.json"
    return load(path) if path.exists() else None


def result_files(directory=None) -> list[Path]:
    """Every committed result file, the reference GPU's (the H200) first, then by name."""
    files = sorted(Path(directory or RESULTS_DIR).glob("*.json"))
    return sorted(files, key=lambda p: p.stem != REFERENCE_GPU)


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
    device = f"{p['gpu']} (driver {p['driver']})" if p.get("gpu") else f"{p.get('backend', 'gpu').upper()}"
    if p.get("cpu") and not p.get("gpu"):
        device += f" ({p['cpu']})"
    cudnn = f", cuDNN {p['cudnn']}" if p.get("cudnn") else ""
    return (
        f"{device}, JAX {p['jax']} / jaxlib {p['jaxlib']}{cudnn}{te}, Python {p['python']}, "
        f"recorded {p['created'][:10]}"
    )
