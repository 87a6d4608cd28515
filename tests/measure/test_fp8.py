"""The FP8 experiments' bookkeeping, on any machine (the measurements themselves need a GPU)."""

import jax
import jax.numpy as jnp
import pytest

from attention_tutorial.inputs import AttentionShape
from attention_tutorial.measure import fp8
from attention_tutorial.measure.flops import FP8_PEAK
from attention_tutorial.measure.sweep import check_record
from attention_tutorial.measure.timing import Timing

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
        assert check_record(rec) == []


def test_te_records_say_why_without_a_gpu_or_te():
    recs = fp8.te_records()
    if jax.default_backend() != "gpu":
        assert len(recs) == 1 and recs[0]["status"] == "unsupported" and "GPU" in recs[0]["reason"]


def test_rel_error():
    assert fp8.rel_error([3.0, 4.0], [3.0, 4.0]) == 0.0
    assert abs(fp8.rel_error([3.0, 4.0], [0.0, 5.0]) - (10**0.5) / 5) < 1e-12


def test_ok_record_carries_the_timing_and_tflops():
    t = Timing(2.0, 1.9, 2.2, 10, 3, 0.5, 2.1)
    rec = fp8._record("cudnn", SHAPE, False, "bfloat16", t, flops=4e12, peak=4000.0, rel_error=0.01)
    assert rec["status"] == "ok" and rec["dtype"] == "bfloat16" and rec["median_ms"] == 2.0
    assert abs(rec["tflops"] - 2000.0) < 1e-9 and abs(rec["pct_peak"] - 50.0) < 1e-9 and rec["rel_error"] == 0.01


def test_fp8_records_are_judged_against_twice_the_bf16_peak():
    t = Timing(2.0, 1.9, 2.2, 10, 3, 0.5, 2.1)
    rec = fp8._record("cudnn_fp8_s1", SHAPE, False, "float8_e4m3fn", t, flops=4e12, peak=1000.0)
    assert rec["tflops"] == pytest.approx(2000.0) and rec["pct_peak"] == pytest.approx(100.0)
    assert rec["peak_basis"] == FP8_PEAK and check_record(rec) == []


def test_the_gemm_is_a_gemm_record_not_an_attention_shape():
    rec = fp8._gemm("te_dense_fp8", "float8")
    assert (rec["problem"], rec["m"], rec["k"], rec["n"]) == ("gemm", 8 * 4096, 4096, 4096)
    assert not {"batch", "seq_q", "seq_kv", "heads", "head_dim", "causal"} & set(rec)
    assert check_record({**rec, "status": "error", "reason": "simulated"}) == []


def test_cudnn_fp8_records_guard_each_variant_apart(monkeypatch):
    """One variant failing (cuDNN's, ours) leaves the others standing: each gets its own record, ours refused with
    their own reason where they cannot run (here: no Hopper GPU)."""
    monkeypatch.setattr(fp8, "FP8_SHAPES", ((1, 128),))
    if jax.default_backend() == "gpu":
        pytest.skip("on a GPU the variants run; this checks the failure bookkeeping")
    recs = fp8.cudnn_fp8_records()
    for causal in (False, True):
        got = {r["impl"]: r for r in recs if r["causal"] == causal}
        assert set(got) == {"cudnn", "cudnn_fp8_s1", "cudnn_fp8_s448", "mosaic", "mosaic_fp8", "mosaic_fp8_regs"}
        assert got["mosaic"]["status"] == got["mosaic_fp8"]["status"] == "unsupported"
        assert "Hopper" in got["mosaic_fp8"]["reason"] and got["cudnn"]["status"] in ("unsupported", "error")
        assert all(r["experiment"] == "cudnn_fp8" and check_record(r) == [] for r in got.values())


def test_a_wrong_answer_is_recorded_as_an_error_not_timed(monkeypatch):
    """A kernel whose output is far from float32 (a mispaired p·v, say) must not enter the race as a result."""
    if jax.default_backend() == "gpu":
        pytest.skip("checks the bookkeeping with stand-ins on a CPU")
    monkeypatch.setattr(fp8, "FP8_SHAPES", ((1, 128),))
    monkeypatch.setattr(fp8, "OURS_WHY_NOT", {name: (lambda *a: None) for name in fp8.OURS_WHY_NOT})
    monkeypatch.setattr(fp8, "mosaic_flash_attention", lambda q, k, v, is_causal: q)  # a wrong "kernel"
    ways = []  # each FP8 variant names its p path: the recorded name must keep meaning the same path
    monkeypatch.setattr(
        fp8, "mosaic_fp8_attention", lambda q, k, v, is_causal, p_via: ways.append(p_via) or v[:, ::-1] * 3
    )
    timed = []
    monkeypatch.setattr(fp8, "time_fn", lambda fn, *a, **k: timed.append(fn) or Timing(1.0, 1.0, 1.0, 1, 1, 0, 1))
    recs = {r["impl"]: r for r in fp8.cudnn_fp8_records() if not r["causal"]}
    for impl in ("mosaic", "mosaic_fp8", "mosaic_fp8_regs"):
        assert recs[impl]["status"] == "error" and "wrong result: relative error" in recs[impl]["reason"]
    assert not timed and ways[:2] == ["smem", "registers"]  # mosaic_fp8, then mosaic_fp8_regs


@pytest.mark.parametrize("causal", [False, True])
def test_output_rounding_error_is_e4m3_rounding_of_the_float64_output(causal):
    import ml_dtypes
    import numpy as np

    from attention_tutorial.inputs import make_qkv

    q, k, v = make_qkv(1, 256, 2, 64, dtype=jnp.bfloat16, seed=3)
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("btnh,bsnh->bnts", q64, k64) / 8.0
    if causal:
        s = np.where(np.tril(np.ones((256, 256), bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    o = np.einsum("bnts,bsnh->btnh", w / w.sum(-1, keepdims=True), v64)
    dv = np.abs(v64).max() / 448.0  # cuDNN's scale_o = 1 / descale_v
    rounded = (o / dv).astype(ml_dtypes.float8_e4m3fn).astype(np.float64) * dv
    want = np.linalg.norm(rounded - o) / np.linalg.norm(o)
    got = fp8.output_rounding_error(q, k, v, is_causal=causal)
    assert 0.005 < want < 2.0**-4  # E4M3 keeps 3 mantissa bits: half an ulp is at most 2^-4 of a normal value
    assert got == pytest.approx(want, rel=0.02)
