import copy
import json
from pathlib import Path

import pytest

from attention_tutorial import results

RESULTS = Path(__file__).resolve().parents[2] / "attention_tutorial" / "results" / "data"

GOOD = {
    "provenance": {
        "gpu": "NVIDIA H200", "driver": "580.1", "jax": "0.11.2", "jaxlib": "0.11.2", "cudnn": "9.19.0",
        "transformer_engine": None, "python": "3.12.3", "created": "2026-12-02T00:00:00+00:00",
        "command": "python -m attention_tutorial record", "matmul_bf16_tflops": 780.0, "copy_gbps": 3300.0,
    },
    "records": [
        {"impl": "cudnn", "batch": 1, "seq_q": 8, "seq_kv": 8, "heads": 1, "kv_heads": 1, "head_dim": 64,
         "dtype": "bfloat16", "causal": False, "pass": "fwd", "status": "ok", "median_ms": 1.0, "p10_ms": 0.9,
         "p90_ms": 1.1, "tflops": 1.0},
        {"impl": "naive", "batch": 1, "seq_q": 8, "seq_kv": 8, "heads": 1, "kv_heads": 1, "head_dim": 64,
         "dtype": "bfloat16", "causal": True, "pass": "fwd+bwd", "status": "oom", "reason": "RESOURCE_EXHAUSTED",
         "median_ms": None, "p10_ms": None, "p90_ms": None, "tflops": None},
    ],
}  # fmt: skip


def test_good_file_validates():
    assert results.validate(GOOD) == []


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["provenance"].pop("cudnn"), "lacks 'cudnn'"),
        (lambda d: d["provenance"].update(matmul_bf16_tflops="780"), "matmul_bf16_tflops"),
        (lambda d: d.pop("provenance"), "provenance"),
        (lambda d: d.update(records=[]), "non-empty"),
        (lambda d: d["records"][0].pop("impl"), "lacks 'impl'"),
        (lambda d: d["records"][0].update(status="slow"), "unknown status"),
        (lambda d: d["records"][0].update(batch=1.5), "'batch' has type float"),
        (lambda d: d["records"][0].update(causal=1), "'causal' has type int"),
        (lambda d: d["records"][0].update(tflops=None), "no median_ms/tflops"),
        (lambda d: d["records"][1].pop("reason"), "no reason"),
        (lambda d: d["records"][1].update({"pass": "bwd"}), "unknown pass"),
    ],
)
def test_each_defect_is_reported(mutate, message):
    bad = copy.deepcopy(GOOD)
    mutate(bad)
    assert any(message in p for p in results.validate(bad)), results.validate(bad)


def test_save_keeps_other_grids_and_refuses_invalid(tmp_path):
    path = tmp_path / "gpu.json"
    a = [dict(GOOD["records"][0], grid="a")]
    b = [dict(GOOD["records"][0], grid="b", median_ms=2.0)]
    results.save(path, GOOD["provenance"], a)
    results.save(path, GOOD["provenance"], b)
    assert sorted(r["grid"] for r in results.load(path)["records"]) == ["a", "b"]
    results.save(path, GOOD["provenance"], [dict(b[0], median_ms=3.0)])
    assert [r["median_ms"] for r in results.load(path)["records"] if r["grid"] == "b"] == [3.0]
    with pytest.raises(ValueError, match="invalid result file"):
        results.save(path, {}, a)


def test_select_and_slug_and_describe():
    recs = GOOD["records"]
    assert results.select(recs, impl="cudnn") == [recs[0]]
    assert results.select(recs, pass_="fwd+bwd") == [recs[1]]
    assert results.select(recs, causal=(True, False)) == recs
    assert results.slug("NVIDIA H200") == "nvidia-h200"
    assert "NVIDIA H200" in results.describe(GOOD["provenance"]) and "2026-12-02" in results.describe(
        GOOD["provenance"]
    )


def test_recorded_missing_is_none(tmp_path):
    assert results.recorded("nvidia-b200", directory=tmp_path) is None


def test_the_h200_reference_file_is_committed():
    assert (RESULTS / "nvidia-h200.json").exists(), "run `python -m attention_tutorial record` on the H200"


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_committed_result_files_validate(path):
    data = json.loads(path.read_text())
    assert results.validate(data) == []
    assert data["provenance"]["gpu"] and data["provenance"]["matmul_bf16_tflops"] > 0


def test_describe_names_each_grid_s_own_run():
    prov = {**GOOD["provenance"], "transformer_engine": "2.20.2",
            "grids": {"te": {"created": "2026-12-01T10:00:00+00:00", "transformer_engine": "2.19.0"},
                      "old": {"created": "2026-11-30T10:00:00+00:00"}}}  # fmt: skip
    assert "TransformerEngine 2.20.2" in results.describe(prov)
    assert "TransformerEngine 2.19.0" in results.describe(prov, "te") and "2026-12-01" in results.describe(prov, "te")
    old = results.describe(prov, "old")  # written before grids kept their versions: TE unknown, not claimed
    assert "TransformerEngine" not in old and "2026-11-30" in old
    assert results.describe(prov, "missing") == results.describe(prov)
