import jax.numpy as jnp
import pytest

from attention_tutorial import registry
from attention_tutorial.measure.flops import attention_flops
from attention_tutorial.measure.sweep import Point, check_record, grid, point_key, run_point, run_sweep


def test_grid_is_the_cartesian_product():
    pts = grid(("xla", "naive"), seq_q=(64, 128), heads=(4,), head_dim=(32, 64), causal=(False, True))
    assert len(pts) == 2 * 2 * 2 * 2
    assert {p.seq_kv == p.seq_q and p.kv_heads == p.heads for p in pts} == {True}


def test_grid_tokens_fix_batch_times_length():
    pts = grid(("xla",), seq_q=(256, 1024, 4096), tokens=2048)
    assert [(p.batch, p.seq_q) for p in pts] == [(8, 256), (2, 1024), (1, 4096)]


def test_grid_rejects_unknown_pass():
    with pytest.raises(ValueError, match="pass"):
        grid(("xla",), seq_q=(8,), passes=("bwd",))


def test_ok_record_fields_and_tflops_from_the_flop_model():
    p = Point("xla", 2, 64, 64, 4, 2, 32, "float32", causal=True)
    rec = run_point(p, peak_tflops=1.0, repeats=5)
    assert rec["status"] == "ok" and rec["pass"] == "fwd" and rec["mask"] == "none"
    assert rec["p10_ms"] <= rec["median_ms"] <= rec["p90_ms"]
    flops = attention_flops(2, 64, 64, 4, 32, causal=True)
    assert rec["tflops"] == pytest.approx(flops / (rec["median_ms"] * 1e-3) / 1e12)
    assert rec["pct_peak"] == pytest.approx(100 * rec["tflops"])
    assert rec["temp_bytes"] > 0 and rec["compile_s"] > 0 and rec["kernel"].startswith("XLA")


def test_forward_backward_point_runs():
    rec = run_point(Point("xla", 1, 32, 32, 2, 2, 16, "float32", pass_="fwd+bwd"), repeats=5)
    assert rec["status"] == "ok" and rec["pass"] == "fwd+bwd"


def test_a_mask_point_counts_only_the_positions_its_mask_keeps_and_records_are_schema_valid():
    p = Point("xla", 2, 64, 64, 2, 2, 16, "float32", causal=True, mask="window")
    seen = []
    (rec,) = run_sweep([p], peak_tflops=1.0, repeats=3, on_record=seen.append)
    assert seen == [rec] and rec["status"] == "ok" and check_record(rec) == []
    # window 256 > T = 64 with causal: the causal triangle, 64 * 65 / 2 pairs per (batch, head)
    flops = 4 * 2 * 2 * 16 * (64 * 65 // 2)
    assert rec["tflops"] == pytest.approx(flops / (rec["median_ms"] * 1e-3) / 1e12)
    assert rec["peak_basis"].startswith("bf16") and point_key(rec) != point_key({**rec, "mask": "none"})


def test_mask_point_runs_and_unsupported_mask_is_recorded():
    assert run_point(Point("xla", 2, 32, 32, 2, 2, 16, "float32", mask="padding"), repeats=5)["status"] == "ok"
    rec = run_point(Point("blockwise", 2, 32, 32, 2, 2, 16, "float32", mask="bias"), repeats=5)
    assert rec["status"] == "unsupported" and "bias" in rec["reason"]


def _fake(name, exc):
    def fn(q, k, v, **kwargs):
        raise exc

    return registry.Implementation(name, name, fn, lambda s, d, c: None)


def test_oom_unsupported_and_errors_are_recorded_and_the_sweep_goes_on(monkeypatch):
    fakes = {
        "fake_oom": _fake(
            "fake_oom", RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 64.00GiB")
        ),
        "fake_unsupported": _fake("fake_unsupported", NotImplementedError("Q must be fp16/bf16, got float32")),
        "fake_error": _fake("fake_error", ZeroDivisionError("boom")),
    }
    monkeypatch.setattr(registry, "IMPLEMENTATIONS", {**registry.IMPLEMENTATIONS, **fakes})
    pts = [
        Point(n, 1, 16, 16, 2, 2, 8, "float32") for n in ("fake_oom", "xla", "fake_unsupported", "fake_error", "cudnn")
    ]
    recs = run_sweep(pts, repeats=3)
    assert [r["status"] for r in recs[:4]] == ["oom", "ok", "unsupported", "error"]
    assert "RESOURCE_EXHAUSTED" in recs[0]["reason"] and "boom" in recs[3]["reason"]
    assert recs[4]["status"] in ("unsupported", "ok")  # cuDNN: unsupported on CPU, with its reason
    if recs[4]["status"] == "unsupported":
        assert "GPU" in recs[4]["reason"]


def test_why_not_in_registry():
    assert registry.why_not("xla", Point("xla", 1, 8, 8, 1, 1, 8).shape, jnp.float32) is None
    with pytest.raises(ValueError, match="unknown implementation"):
        registry.get("flash3")


def test_front_end_backend_is_recorded_and_a_failed_query_is_not_fatal(monkeypatch):
    from attention_tutorial.kernels.reference import naive_attention

    asked = []

    def backend(shape, dtype, causal, training):
        asked.append((shape.seq_q, jnp.dtype(dtype).name, causal, training))
        return "NAIVE_BACKEND"

    def broken(shape, dtype, causal, training):
        raise RuntimeError("no such helper")

    fakes = {
        "with_backend": registry.Implementation(
            "with_backend", "w", naive_attention, lambda s, d, c: None, backend=backend
        ),
        "broken_backend": registry.Implementation(
            "broken_backend", "b", naive_attention, lambda s, d, c: None, backend=broken
        ),
    }
    monkeypatch.setattr(registry, "IMPLEMENTATIONS", {**registry.IMPLEMENTATIONS, **fakes})
    ok = run_point(Point("with_backend", 1, 16, 16, 2, 2, 8, "float32", True, "fwd+bwd"), repeats=3)
    assert ok["status"] == "ok" and ok["backend"] == "NAIVE_BACKEND"
    assert asked == [(16, "float32", True, True)]
    rec = run_point(Point("broken_backend", 1, 16, 16, 2, 2, 8, "float32"), repeats=3)
    assert rec["status"] == "ok" and rec["backend"].startswith("unknown (RuntimeError: no such helper")
    assert "backend" not in run_point(Point("xla", 1, 16, 16, 2, 2, 8, "float32"), repeats=3)


def test_our_own_refusal_is_unsupported_and_a_plain_value_error_is_an_error():
    from attention_tutorial.inputs import Unsupported
    from attention_tutorial.measure.sweep import failure_fields

    refused = failure_fields(Unsupported("cuDNN attention cannot run this: its windows look left only"))
    assert refused == {
        "status": "unsupported",
        "reason": "Unsupported: cuDNN attention cannot run this: its windows look left only",
    }
    assert failure_fields(ValueError("bad shape"))["status"] == "error"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"impls": "xla"}, TypeError, "impls must be a list or tuple of values, e.g. \\('xla',\\)"),
        ({"seq_q": 1024}, TypeError, "seq_q must be a list or tuple"),
        ({"impls": ("flash9",)}, ValueError, "unknown implementation 'flash9'"),
        ({"seq_q": (0,)}, ValueError, "seq_q values must be positive integers; got 0"),
        ({"heads": (2.5,)}, ValueError, "heads values must be positive integers; got 2.5"),
        ({"batch": (True,)}, ValueError, "batch values must be positive integers; got True"),
        ({"tokens": -8}, ValueError, "tokens \\(B·T\\) must be a positive integer"),
        ({"dtype": ("bf16",)}, ValueError, "dtype 'bf16' is not a dtype JAX knows"),
        ({"causal": ("yes",)}, TypeError, "causal values must be True or False"),
        ({"masks": ("stripes",)}, ValueError, "mask must be one of"),
    ],
)
def test_grid_names_the_bad_argument_and_the_fix(kwargs, error, message):
    args = {"impls": ("xla",), "seq_q": (64,), **kwargs}
    with pytest.raises(error, match=message):
        grid(args.pop("impls"), **args)


def test_a_malformed_point_or_callback_is_named_before_anything_runs():
    with pytest.raises(ValueError, match=r"Point\.seq_q must be a positive integer; got 0"):
        run_point(Point("xla", 1, 0, 8, 2, 2, 16, "float32"))
    with pytest.raises(TypeError, match="a point must be a Point"):
        run_sweep([("xla", 1, 8)])
    seen = []
    with pytest.raises(TypeError, match="on_record must be a function"):
        run_sweep([Point("xla", 1, 8, 8, 2, 2, 16, "float32")], on_record=seen)
    with pytest.raises(ValueError, match=r"Point\.heads must be a positive integer"):  # checked before the first runs
        run_sweep([Point("xla", 1, 8, 8, 2, 2, 16, "float32"), Point("xla", 1, 8, 8, -2, 2, 16, "float32")])


@pytest.mark.parametrize("median", [float("nan"), 0.0, -1.0])
def test_a_measurement_no_result_file_may_hold_becomes_an_error_record(monkeypatch, median):
    from attention_tutorial.measure import sweep
    from attention_tutorial.measure.timing import Timing

    monkeypatch.setattr(sweep, "time_fn", lambda *a, **k: Timing(median, median, median, 5, 1, 0.1, 1.0))
    rec = run_point(Point("xla", 1, 8, 8, 2, 2, 16, "float32"), repeats=5)
    assert rec["status"] == "error" and "not usable" in rec["reason"] and check_record(rec) == []
