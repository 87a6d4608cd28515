"""Bring a committed result file up to the current schema and FLOP model without touching what was measured.

    python scripts/migrate_results.py [attention_tutorial/results/data/nvidia-h200.json ...]

1. GEMM records (the FP8 experiment's TE DenseGeneral, once stored as an attention shape with seq_kv = K) become
   ``problem: "gemm"`` records with m, k, n (from their ``gemm_mkn``).
2. Derived fields of ok records are recomputed from their measured ``median_ms`` with the current FLOP model
   (:mod:`attention_tutorial.measure.flops`: only the score positions a mask keeps; FP8 against 2 × the bf16 peak):
   ``tflops``, ``pct_peak`` and ``peak_basis``. The bf16 peak each record was judged against is read back from its
   old tflops / pct_peak (the ceiling measured in the run that recorded it) and kept in its grid's provenance.
Measured fields (median_ms, p10_ms, p90_ms, single_call_ms, compile_s, gbps, ...) are never changed. What was done
is appended to the provenance's ``history``. Running it again changes nothing.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from attention_tutorial.env import timestamp
from attention_tutorial.measure.flops import attention_flops, gemm_flops, peak_for
from attention_tutorial.measure.sweep import SIZE_FIELDS, gemm_record
from attention_tutorial.results import store

ATTENTION_ONLY = (*SIZE_FIELDS["attention"], "causal", "mask", "gemm_mkn")


def to_gemm(rec: dict) -> dict:
    """A GEMM stored as an attention shape -> a GEMM record; every other field kept as measured."""
    m, k, n = rec["gemm_mkn"]
    rest = {key: v for key, v in rec.items() if key not in ATTENTION_ONLY}
    return {**gemm_record(rec["impl"], m=m, k=k, n=n, dtype=rec["dtype"]), **rest}


def flops_of(rec: dict) -> float:
    if rec.get("problem") == "gemm":
        return gemm_flops(rec["m"], rec["k"], rec["n"])
    return attention_flops(rec["batch"], rec["seq_q"], rec["seq_kv"], rec["heads"], rec["head_dim"],
                           causal=rec["causal"], pass_=rec["pass"], mask=rec.get("mask", "none"))  # fmt: skip


def judged_peak(rec: dict, grid_peak: float | None) -> float | None:
    """The bf16 peak ``rec`` was judged against: its grid's, else read back from the old tflops / pct_peak."""
    if grid_peak:
        return grid_peak
    if rec.get("pct_peak") and rec.get("peak_basis") is None:
        return 100 * rec["tflops"] / rec["pct_peak"]
    return None


def migrate(data: dict) -> tuple[dict, list[str]]:
    """(migrated data, what changed, in words)."""
    prov, records, notes = dict(data["provenance"]), [], []
    grids = {name: dict(entry) for name, entry in prov.get("grids", {}).items()}
    gemms = recomputed = 0
    for rec in data["records"]:
        rec = dict(rec)
        if rec.get("problem") is None and "gemm_mkn" in rec:
            rec, gemms = to_gemm(rec), gemms + 1
        if rec["status"] == "ok":
            entry = grids.get(rec.get("grid"), {})
            bf16 = judged_peak(rec, entry.get("matmul_bf16_tflops"))
            if bf16 and rec.get("grid") in grids and not entry.get("matmul_bf16_tflops"):
                entry["matmul_bf16_tflops"] = bf16
            tflops = flops_of(rec) / (rec["median_ms"] * 1e-3) / 1e12
            peak, basis = peak_for(rec["dtype"], bf16)
            new = {"tflops": tflops, "pct_peak": 100 * tflops / peak if peak else None}
            new |= {"peak_basis": basis} if peak else {}
            if any(not _same(rec.get(k), v) for k, v in new.items()):
                recomputed += 1
            rec |= new
        records.append(rec)
    if grids:
        prov["grids"] = grids
    if gemms:
        notes.append(f"{gemms} GEMM records: attention-shaped fields -> problem 'gemm' with m, k, n")
    if recomputed:
        notes.append(f"{recomputed} ok records: tflops, pct_peak, peak_basis recomputed from their measured median_ms "
                     "with the per-mask FLOP model (kept score positions only) and the FP8 peak = 2 x bf16; "
                     "the bf16 peak of grids that lacked one read back from the old tflops / pct_peak")  # fmt: skip
    if notes:
        entry = {"created": timestamp(), "script": "scripts/migrate_results.py", "what": "; ".join(notes)}
        prov["history"] = [*prov.get("history", []), entry]
    return {"provenance": prov, "records": records}, notes


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12)
    return a == b


def main(paths) -> int:
    for path in paths or [store.RESULTS_DIR / f"{store.REFERENCE_GPU}.json"]:
        data = store.load(path)
        new, notes = migrate(data)
        if not notes:
            print(f"{path}: already current")
            continue
        assert [r.get("median_ms") for r in new["records"]] == [r.get("median_ms") for r in data["records"]]
        store.save(path, new["provenance"], new["records"], overwrite=True)
        print(f"{path}: " + "; ".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main([Path(p) for p in sys.argv[1:]]))
