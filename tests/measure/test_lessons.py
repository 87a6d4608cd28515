"""The small lessons on this machine: errors against float64, JAX's own answer for cuDNN, GQA against MHA."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.measure import lessons
from attention_tutorial.measure.timing import summarize

QUICK = {"repeats": 3, "max_seconds": 0.1, "min_sample_ms": 1.0}


def test_matmul_kind_names_what_float32_runs_in():
    assert lessons.matmul_kind("bfloat16") == "bfloat16"
    assert lessons.matmul_kind(jnp.float32) == ("tf32" if jax.default_backend() == "gpu" else "float32")


def test_precision_rows_report_the_error_against_float64_and_a_time_with_spread():
    from attention_tutorial import make_qkv

    rows = lessons.precision_rows(2, 32, 2, 16, time_seq=64, timing=QUICK)
    assert [r["precision"] for r in rows] == ["default", "highest"]
    # the error recomputed here: jax.nn's XLA path against a float64 NumPy softmax of the same inputs
    q, k, v = make_qkv(2, 32, 2, 16, dtype=jnp.float32, seed=0)
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("btnh,bsnh->bnts", q64, k64) / np.sqrt(16)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = np.einsum("bnts,bsnh->btnh", p / p.sum(-1, keepdims=True), v64)
    with jax.default_matmul_precision("highest"):
        out = np.asarray(jax.nn.dot_product_attention(q, k, v, implementation="xla"), np.float64)
    assert rows[1]["max_abs_error"] == pytest.approx(np.max(np.abs(out - ref)), rel=1e-3, abs=1e-9)
    assert rows[1]["max_abs_error"] < 1e-5
    for r in rows:
        assert r["p10_ms"] <= r["median_ms"] <= r["p90_ms"]
        assert r["time_shape"] == "B=2, T=S=64, N=2, H=16"
    assert rows[1]["matmuls_in"] == "float32"


def test_untimed_precision_rows_carry_the_errors_only():
    timed = lessons.precision_rows(2, 32, 2, 16, time_seq=64, timing=QUICK)
    rows = lessons.precision_rows(2, 32, 2, 16, timed=False)
    assert [r["max_abs_error"] for r in rows] == [r["max_abs_error"] for r in timed]
    assert not {"median_ms", "p10_ms", "p90_ms", "time_shape"} & {key for r in rows for key in r}


def test_refusals_on_a_machine_without_cudnn_are_refused_by_both():
    if jax.default_backend() == "gpu":
        pytest.skip("on a GPU cuDNN accepts some of the cases; see the gpu test")
    rows = lessons.cudnn_refusal_rows()
    assert len(rows) == len(lessons.REFUSAL_CASES)
    for r in rows:
        assert "NVIDIA GPU" in r["why_not"]
        assert r["forced"] != "runs" and ":" in r["forced"]  # "ExceptionType: message"


def test_first_line_keeps_the_type_and_the_first_line_only():
    line = lessons._first_line(ValueError("head_dim 100 is not supported\nmore detail"))
    assert line == "ValueError: head_dim 100 is not supported"
    assert len(lessons._first_line(RuntimeError("x" * 500))) == 160


def test_gqa_rows_agree_with_mha_where_they_run_and_say_why_not_elsewhere():
    rows = lessons.gqa_rows(1, 64, 4, 2, 16, dtype=jnp.float32, impls=("naive", "xla", "blockwise", "cudnn"))
    by = {r["impl"]: r for r in rows}
    for name in ("naive", "xla", "blockwise"):
        assert by[name]["status"] == "ok" and by[name]["max_abs_diff"] <= 2e-3, by[name]
    if jax.default_backend() != "gpu":
        assert by["cudnn"]["status"] == "unsupported" and by["cudnn"]["reason"]


def test_gqa_rows_see_a_broken_grouping(monkeypatch):
    # a kernel that pairs query head n with kv head n % K (JAX groups n // (N/K)) must differ from MHA
    import dataclasses

    from attention_tutorial import registry

    def wrong(q, k, v):
        idx = jnp.arange(q.shape[2]) % k.shape[2]
        return registry.IMPLEMENTATIONS["xla"].fn(q, k[:, :, idx], v[:, :, idx])

    wrong_impl = dataclasses.replace(registry.IMPLEMENTATIONS["naive"], name="wrong", fn=wrong)
    monkeypatch.setattr(registry, "IMPLEMENTATIONS", {**registry.IMPLEMENTATIONS, "wrong": wrong_impl})
    rows = lessons.gqa_rows(1, 32, 4, 2, 16, dtype=jnp.float32, impls=("wrong",))
    assert rows[0]["status"] == "ok" and rows[0]["max_abs_diff"] > 1e-2


def test_gqa_rows_refuse_heads_not_divisible():
    with pytest.raises(ValueError, match=r"heads \(6\) must be a multiple of kv_heads \(4\)"):
        lessons.gqa_rows(1, 32, 6, 4, 16)


def test_input_rows_time_the_same_matmul_on_three_kinds_of_data():
    rows = lessons.input_rows(64, timing=QUICK)
    assert [r["inputs"] for r in rows] == list(lessons.INPUT_KINDS)
    for r in rows:
        assert r["n"] == 64
        assert r["tflops"] == pytest.approx(2 * 64**3 / (r["median_ms"] * 1e-3) / 1e12)
        assert summarize([r["p10_ms"], r["median_ms"], r["p90_ms"]])[0] == r["median_ms"]


@pytest.mark.gpu
def test_on_the_gpu_float32_runs_in_tf32_and_highest_is_closer():
    rows = lessons.precision_rows(timing=QUICK)
    by = {r["precision"]: r for r in rows}
    assert by["default"]["matmuls_in"] == "tf32"
    assert by["highest"]["max_abs_error"] < 1e-5 < by["default"]["max_abs_error"] < 2e-3


@pytest.mark.gpu
def test_on_the_gpu_our_cudnn_check_matches_jax():
    rows = lessons.cudnn_refusal_rows()
    by = {(r["head_dim"], r["dtype"]): r for r in rows}
    assert by[(128, "bfloat16")]["why_not"] is None and by[(128, "bfloat16")]["forced"] == "runs"
    assert by[(64, "float32")]["forced"] != "runs" and "float16 or bfloat16" in by[(64, "float32")]["why_not"]
    for r in rows:
        assert (r["why_not"] is None) == (r["forced"] == "runs"), r
