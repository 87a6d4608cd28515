"""The IO argument: a call's FLOPs and fewest bytes counted from its shape, a roof's ridge and caps by hand, and every
recorded forward call of the T and H sweeps against the roof of its recording run."""

import pytest

from attention_tutorial.measure.flops import attention_bytes, materialised_bytes
from attention_tutorial.measure.roofline import Roof, io_point
from attention_tutorial.results import store
from attention_tutorial.site.report import reference_roof

DATA = store.recorded()
needs_data = pytest.mark.skipif(DATA is None, reason="no recorded results")


def rec(impl, ms, **kw):
    base = {
        "impl": impl,
        "status": "ok",
        "pass": "fwd",
        "batch": 2,
        "seq_q": 1024,
        "seq_kv": 1024,
        "heads": 4,
        "kv_heads": 4,
        "head_dim": 64,
        "dtype": "bfloat16",
        "causal": False,
    }
    return {**base, "median_ms": ms, **kw}


def _recs(**where):
    return store.select(DATA["records"], status="ok", **where)


def test_io_point_counts_materialised_bytes_for_xla_and_the_fused_minimum_for_cudnn():
    x, c = io_point(rec("xla", 1.0)), io_point(rec("cudnn", 1.0))
    assert x.bytes == materialised_bytes(2, 1024, 1024, 4, 4, 64, "bfloat16")
    assert c.bytes == attention_bytes(2, 1024, 1024, 4, 4, 64, "bfloat16")
    assert x.flops == c.flops == 4 * 2 * 4 * 1024 * 1024 * 64
    assert c.intensity == pytest.approx(1024 * 1024 / (1024 + 1024))  # T·S / (T + S) for a fused kernel
    assert x.tflops == pytest.approx(x.flops / 1e-3 / 1e12)
    causal = io_point(rec("xla", 1.0, causal=True))
    assert causal.bytes == x.bytes and causal.flops < x.flops / 2 + 4 * 2 * 4 * 1024 * 64  # kept pairs only
    with pytest.raises(ValueError, match="forward"):
        io_point(rec("xla", 1.0, **{"pass": "fwd+bwd"}))


def test_roof_by_hand():
    r = Roof(700.0, 3500.0)
    assert r.ridge == pytest.approx(200.0)
    assert r.cap(50.0) == pytest.approx(175.0) and r.cap(1e4) == 700.0
    p = io_point(rec("cudnn", 1.0))
    assert r.bytes_ms(p) == pytest.approx(p.bytes / 3.5e12 * 1e3)
    assert r.matmul_ms(p) == pytest.approx(p.flops / 700e12 * 1e3)


@needs_data
def test_io_points_reproduce_the_recorded_tflops():
    for r in _recs(grid=("seq_long", "head_dim")):
        assert io_point(r).tflops == pytest.approx(r["tflops"], rel=1e-6)


@needs_data
def test_the_io_argument_holds_on_every_recorded_forward_call():
    recs = [r for r in _recs(grid=("seq_long", "head_dim"), causal=False) if r["impl"] in ("naive", "xla", "cudnn")]
    the_roof = reference_roof()  # the sequence sweep's recording run
    for r in recs:
        p = io_point(r)
        # the byte count is a floor: no call moved its bytes faster than the measured read ceiling (within 2 %,
        # the gap between the two grids' ceilings), and none beat the roof at its FLOPs per byte
        assert the_roof.bytes_ms(p) <= 1.02 * p.median_ms, (r["impl"], r["seq_q"], r["head_dim"])
        assert p.tflops <= 1.02 * the_roof.cap(p.intensity), (r["impl"], r["seq_q"], r["head_dim"])
        assert (p.intensity < the_roof.ridge) == (r["impl"] != "cudnn")  # memory-bound unless fused
    (xla,) = _recs(grid="seq_long", impl="xla", causal=False, seq_q=4096)
    assert the_roof.bytes_ms(io_point(xla)) > 0.7 * xla["median_ms"]


@needs_data
def test_the_recorded_naive_call_waits_on_memory_and_cudnn_computes():
    """The online-softmax page's recap: at T = 4096 the naive version's bytes fill most of its time at the read
    bandwidth, cuDNN's matmuls most of its own at the matmul peak."""
    r = reference_roof()
    (naive,) = _recs(grid="seq_long", impl="naive", causal=False, seq_q=4096)
    (cudnn,) = _recs(grid="seq_long", impl="cudnn", causal=False, seq_q=4096)
    n, c = io_point(naive), io_point(cudnn)
    assert 0.5 < r.bytes_ms(n) / n.median_ms <= 1.0 and r.matmul_ms(n) < r.bytes_ms(n)
    assert 0.5 < r.matmul_ms(c) / c.median_ms <= 1.0 and r.bytes_ms(c) < 0.1 * c.median_ms


@needs_data
def test_recorded_cudnn_head_dims_share_one_intensity_and_spread_in_speed():
    pts = [io_point(r) for r in _recs(grid="head_dim", impl="cudnn")]
    assert len({round(p.intensity) for p in pts}) == 1 and reference_roof().ridge < pts[0].intensity
    assert max(p.tflops for p in pts) > 2 * min(p.tflops for p in pts)
