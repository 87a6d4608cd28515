"""The FP8 experiments' bookkeeping, on any machine (the measurements themselves need a GPU)."""

import jax

from attention_tutorial import results
from attention_tutorial.inputs import AttentionShape
from attention_tutorial.measure import fp8

SHAPE = AttentionShape(2, 128, 128, 4, 4, 64)


def _raise(err):
    def fn():
        raise err

    return fn


def test_failures_become_schema_valid_records_classified_like_a_sweep():
    cases = {
        "unsupported": ImportError("no transformer_engine"),
        "oom": RuntimeError("RESOURCE_EXHAUSTED: Out of memory"),
        "error": ValueError("boom"),
    }
    for status, err in cases.items():
        (rec,) = fp8._guarded("cudnn_fp8_s1", SHAPE, True, "float8_e4m3fn", _raise(err))
        assert rec["status"] == status and str(err) in rec["reason"]
        assert (rec["batch"], rec["seq_q"], rec["head_dim"], rec["causal"]) == (2, 128, 64, True)
    prov = {"gpu": "g", "driver": "d", "jax": "j", "jaxlib": "j", "cudnn": "c", "transformer_engine": None,
            "python": "p", "created": "t", "command": "c", "matmul_bf16_tflops": 1.0, "copy_gbps": 1.0}  # fmt: skip
    assert results.validate({"provenance": prov, "records": [rec]}) == []


def test_te_records_say_why_without_a_gpu_or_te():
    recs = fp8.te_records()
    if jax.default_backend() != "gpu":
        assert len(recs) == 1 and recs[0]["status"] == "unsupported" and "GPU" in recs[0]["reason"]


def test_rel_error():
    assert fp8.rel_error([3.0, 4.0], [3.0, 4.0]) == 0.0
    assert abs(fp8.rel_error([3.0, 4.0], [0.0, 5.0]) - (10**0.5) / 5) < 1e-12


def test_ok_record_carries_the_timing_and_tflops():
    from attention_tutorial.measure.timing import Timing

    t = Timing(2.0, 1.9, 2.2, 10, 3, 0.5, 2.1)
    rec = fp8._record("cudnn", SHAPE, False, "bfloat16", t, flops=4e12, peak=4000.0, rel_error=0.01)
    assert rec["status"] == "ok" and rec["dtype"] == "bfloat16" and rec["median_ms"] == 2.0
    assert abs(rec["tflops"] - 2000.0) < 1e-9 and abs(rec["pct_peak"] - 50.0) < 1e-9 and rec["rel_error"] == 0.01
