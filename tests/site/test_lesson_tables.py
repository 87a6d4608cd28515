"""The lessons' tables and words: synthetic rows a wrong word would fail, and the recorded rows read back."""

import pytest

from attention_tutorial.results import record as rec_mod
from attention_tutorial.results import store
from attention_tutorial.site import lesson_tables as lt


def timed(ms, lo, hi, **kw):
    return {"median_ms": ms, "p10_ms": lo, "p90_ms": hi, **kw}


PREC = [
    timed(1.0, 0.95, 1.05, precision="default", matmuls_in="tf32", max_abs_error=6e-4, time_shape="T=2048"),
    timed(3.0, 2.9, 3.1, precision="highest", matmuls_in="float32", max_abs_error=4e-7, time_shape="T=2048"),
]


def test_precision_table_judges_each_error_against_its_own_precision():
    rows = lt.precision_table(PREC)
    assert rows[0]["verdict"] == "agree to within tf32 rounding (tolerance 2e-03)"
    assert rows[1]["verdict"] == "agree to within float32 rounding (tolerance 1e-05)"
    assert [len(r) for r in rows] == [4, 4]  # errors only: the times are often taken at another shape
    shaped = lt.precision_table([{**PREC[0], "shape": "B=4, T=S=128"}])[0]
    assert shaped["max |out − float64| at B=4, T=S=128"] == rows[0]["max |out − float64|"] == "6.0e-04"
    bad = lt.precision_table([{**PREC[1], "max_abs_error": 1e-3}])
    assert bad[0]["verdict"].startswith("differ by more than float32")


def test_the_time_table_shows_the_timed_rows_at_their_own_shape():
    times = lt.precision_time_table(PREC)
    assert times[0]["ms per call (p10–p90)"] == "1.00 (0.950–1.05)"
    assert times[1] == {
        "precision": "highest",
        "matmuls in": "float32",
        "shape": "T=2048",
        "ms per call (p10–p90)": "3.00 (2.90–3.10)",
    }
    assert lt.precision_time_table([{k: v for k, v in r.items() if "ms" not in k} for r in PREC]) == []


def test_refusal_table_and_consistency():
    rows = [
        {"head_dim": 128, "dtype": "bfloat16", "why_not": None, "forced": "runs"},
        {
            "head_dim": 100,
            "dtype": "bfloat16",
            "why_not": "head_dim must be a multiple of 8",
            "forced": "ValueError: x",
        },
    ]
    table = lt.refusal_table(rows)
    assert [r["H"] for r in table] == [100, 128]  # sorted by head size
    assert table[1]["`cudnn_why_not` says"] == "runs" and table[0]["JAX with cuDNN forced"] == "ValueError: x"
    assert lt.refusals_consistent(rows)
    assert not lt.refusals_consistent([{**rows[0], "forced": "RuntimeError: no"}])  # we say runs, JAX refuses
    assert not lt.refusals_consistent([{**rows[1], "forced": "runs"}])  # we refuse, JAX runs it


def test_generation_and_head_dim_limit_follow_the_compute_capability():
    assert [lt.generation(cc) for cc in ("9.0", "8.0", "8.6", "8.9", "10.0", "7.5")] == [
        "Hopper",
        "Ampere",
        "Ampere",
        "Ada Lovelace",
        "Blackwell",
        "Turing",
    ]
    assert lt.generation("6.1") is None
    assert [lt.cudnn_head_dim_limit(cc) for cc in ("9.0", "10.0", "8.0", "8.9", "7.5")] == [256, 256, 128, 128, None]
    with pytest.raises(ValueError, match=r"like '9\.0'"):
        lt.generation("Hopper")


def test_the_recorded_h200_limit_is_what_its_refusals_show():
    data = store.recorded("nvidia-h200")
    cc = data["provenance"]["environment"]["compute_capability"]
    limit = lt.cudnn_head_dim_limit(cc)
    rows, _ = lt.recorded_lesson("cudnn_refusals")
    bf16 = [r for r in rows if r["dtype"] == "bfloat16"]
    assert bf16 and all((r["forced"] == "runs") == (r["head_dim"] <= limit and r["head_dim"] % 8 == 0) for r in bf16)


SEED = [  # recorded rows as the result file keeps them: the kernel in words, the call names in brackets
    {"impl": "cudnn", "dtype": "bfloat16", "status": "ok", "kernel": "cuDNN fused attention (__cudnn$fmhaSoftmax)"},
    {"impl": "default", "dtype": "bfloat16", "status": "ok", "kernel": "XLA: own fusions, no library kernel"},
    {"impl": "xla", "dtype": "float32", "status": "ok", "kernel": "XLA: cuBLAS matmuls + fusions"},
    {"impl": "default", "dtype": "float32", "status": "ok", "kernel": "XLA: own fusions, no library kernel"},
]


def test_kernel_table_names_what_ran_and_the_library_calls():
    table = lt.kernel_table(SEED)
    assert [(r["implementation"], r["dtype"]) for r in table] == [
        ("`None` (default)", "float32"),
        ('`"xla"`', "float32"),
        ("`None` (default)", "bfloat16"),
        ('`"cudnn"`', "bfloat16"),
    ]
    assert table[3] == {
        "implementation": '`"cudnn"`',
        "dtype": "bfloat16",
        "what ran": "cuDNN fused attention",
        "library calls": "__cudnn$fmhaSoftmax",
    }
    assert table[0]["what ran"] == "XLA's own kernels" and table[0]["library calls"] == "none"
    assert table[1]["what ran"] == "XLA's own kernels and cuBLAS matmuls"
    live = [
        {"impl": "cudnn", "dtype": "float32", "reason": "it takes float16 or bfloat16 inputs"},
        {
            "impl": "xla",
            "dtype": "bfloat16",
            "kernel": "XLA: cuBLAS matmuls + fusions",
            "kernels": ("__cublas$lt$matmul",),
        },
    ]
    table = lt.kernel_table(live)
    assert table[0]["what ran"] == "not tried" and table[0]["library calls"] == "it takes float16 or bfloat16 inputs"
    assert table[1]["library calls"] == "__cublas$lt$matmul"


def test_picked_cudnn_reads_the_default_bfloat16_row():
    assert lt.picked_cudnn(SEED) is False
    assert lt.picked_cudnn([{**SEED[1], "kernel": SEED[0]["kernel"]}]) is True
    assert lt.picked_cudnn(SEED[:1]) is None  # no default row
    assert lt.picked_cudnn([{**SEED[1], "status": "error"}]) is None


def test_each_constant_input_kind_is_compared_with_random_data():
    rows = [
        timed(0.8, 0.78, 0.82, inputs="zeros", n=8192, tflops=1.0),
        timed(0.99, 0.95, 1.05, inputs="ones", n=8192, tflops=1.0),
        timed(1.0, 0.97, 1.03, inputs="random normal", n=8192, tflops=1.0),
    ]
    claims = lt.inputs_vs_random(rows)
    assert claims["zeros"].word == "faster" and claims["zeros"].value == pytest.approx(1.25)
    assert claims["ones"].word == "on par" and claims["ones"].value == pytest.approx(1 / 0.99)
    assert set(claims) == {"zeros", "ones"}  # random data is the yardstick, not compared with itself
    assert lt.input_table(rows)[0]["matmul"] == "8192×8192 @ 8192×8192, bf16"


def test_recorded_lesson_reads_the_provenance_and_says_none_when_absent(tmp_path):
    assert lt.recorded_lesson("gqa", tmp_path) == (None, None)
    with pytest.raises(ValueError, match="unknown lesson 'tf32'; choose from precision"):
        lt.recorded_lesson("tf32", tmp_path)
    env = {
        "gpu": "NVIDIA H200",
        "driver": "580.0",
        "jax": "0.11.2",
        "jaxlib": "0.11.2",
        "cudnn": "9.19.0",
        "transformer_engine": None,
        "python": "3.12.3",
        "created": "2026-12-03T00:00:00+00:00",
    }
    prov = rec_mod.provenance(env, {"matmul_bf16_tflops": 700.0, "copy_gbps": 3000.0}, "test")
    prov["lessons"] = {"gqa": [{"impl": "xla", "status": "ok"}]}
    one = store.recorded("nvidia-h200")["records"][:1]  # any valid record: a result file is never empty
    grid = {"created": "2026-12-03T01:00:00+00:00", **{k: env[k] for k in rec_mod.GRID_VERSIONS}}
    prov["grids"] = {"lessons": grid, one[0]["grid"]: grid}
    store.save(tmp_path / "nvidia-h200.json", prov, one)
    rows, where = lt.recorded_lesson("gqa", tmp_path)
    assert rows == [{"impl": "xla", "status": "ok"}] and "NVIDIA H200" in where and "2026-12-03" in where
    assert lt.recorded_lesson("precision", tmp_path) == (None, None)
