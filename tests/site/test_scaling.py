"""The scaling page's numbers: the live points, the IO argument against the recorded times, and each section's
claims, on synthetic records that a wrong number would fail and on the committed results."""

import matplotlib.pyplot as plt
import pytest

from attention_tutorial.measure.flops import attention_bytes, materialised_bytes
from attention_tutorial.results import store
from attention_tutorial.site import scaling as page

DATA = store.recorded()
needs_data = pytest.mark.skipif(DATA is None, reason="no recorded results")


def rec(impl, ms, lo=None, hi=None, **kw):
    base = {"impl": impl, "status": "ok", "pass": "fwd", "batch": 2, "seq_q": 1024, "seq_kv": 1024, "heads": 4,
            "kv_heads": 4, "head_dim": 64, "dtype": "bfloat16", "causal": False}  # fmt: skip
    return {**base, "median_ms": ms, "p10_ms": lo or ms, "p90_ms": hi or ms, **kw}


def _recs(**where):
    return store.select(DATA["records"], status="ok", **where)


@pytest.mark.parametrize("gpu", [True, False])
@pytest.mark.parametrize("grid", sorted(page.LIVE))
def test_each_live_selection_picks_a_point_or_two(grid, gpu):
    pts = page.live_points(grid, gpu=gpu)
    assert 1 <= len(pts) <= 2
    keep = page.LIVE[grid][0 if gpu else 1]
    assert all(getattr(p, k) in v for p in pts for k, v in keep.items())


def test_live_points_refuse_an_unknown_grid():
    with pytest.raises(ValueError, match="choose from"):
        page.live_points("flash")


def test_io_point_counts_materialised_bytes_for_xla_and_the_fused_minimum_for_cudnn():
    x, c = page.io_point(rec("xla", 1.0)), page.io_point(rec("cudnn", 1.0))
    assert x.bytes == materialised_bytes(2, 1024, 1024, 4, 4, 64, "bfloat16")
    assert c.bytes == attention_bytes(2, 1024, 1024, 4, 4, 64, "bfloat16")
    assert x.flops == c.flops == 4 * 2 * 4 * 1024 * 1024 * 64
    assert c.intensity == pytest.approx(1024 * 1024 / (1024 + 1024))  # T·S / (T + S) for a fused kernel
    assert x.tflops == pytest.approx(x.flops / 1e-3 / 1e12)
    causal = page.io_point(rec("xla", 1.0, causal=True))
    assert causal.bytes == x.bytes and causal.flops < x.flops / 2 + 4 * 2 * 4 * 1024 * 64  # kept pairs only
    with pytest.raises(ValueError, match="forward"):
        page.io_point(rec("xla", 1.0, **{"pass": "fwd+bwd"}))


def test_roof_by_hand():
    r = page.Roof(700.0, 3500.0)
    assert r.ridge == pytest.approx(200.0)
    assert r.cap(50.0) == pytest.approx(175.0) and r.cap(1e4) == 700.0
    p = page.io_point(rec("cudnn", 1.0))
    assert r.bytes_ms(p) == pytest.approx(p.bytes / 3.5e12 * 1e3)
    assert r.matmul_ms(p) == pytest.approx(p.flops / 700e12 * 1e3)


@needs_data
def test_io_points_reproduce_the_recorded_tflops_and_the_roof_is_the_run_s():
    prov = DATA["provenance"]
    long = _recs(grid="seq_long")
    for r in long:
        assert page.io_point(r).tflops == pytest.approx(r["tflops"], rel=1e-6)
    roof = page.roof(long, prov, "seq_long")
    assert roof.peak_tflops == prov["grids"]["seq_long"]["matmul_bf16_tflops"]
    r0 = next(r for r in long if r.get("pct_read"))
    assert roof.gbps == pytest.approx(r0["gbps"] * 100 / r0["pct_read"], rel=1e-3)
    assert (roof.datasheet_tflops, roof.datasheet_gbps) == (989.4, 4800.0)


@needs_data
def test_the_io_argument_holds_on_every_recorded_forward_call():
    prov = DATA["provenance"]
    recs = [r for r in _recs(grid=("seq_long", "head_dim"), causal=False) if r["impl"] in ("naive", "xla", "cudnn")]
    roof = page.roof(recs, prov, "seq_long")
    for r in recs:
        p = page.io_point(r)
        # the byte count is a floor: no call moved its bytes faster than the measured read ceiling (within 2 %,
        # the gap between the two grids' ceilings), and none beat the roof at its FLOPs per byte
        assert roof.bytes_ms(p) <= 1.02 * p.median_ms, (r["impl"], r["seq_q"], r["head_dim"])
        assert p.tflops <= 1.02 * roof.cap(p.intensity), (r["impl"], r["seq_q"], r["head_dim"])
        assert (p.intensity < roof.ridge) == (r["impl"] != "cudnn")  # memory-bound unless fused
    (xla,) = _recs(grid="seq_long", impl="xla", causal=False, seq_q=4096)
    assert page.roof(recs, prov, "seq_long").bytes_ms(page.io_point(xla)) > 0.7 * xla["median_ms"]


@needs_data
def test_the_reference_roof_is_the_sequence_sweep_s_run_and_its_ridge_is_peak_over_bandwidth():
    long, prov = store.select(DATA["records"], grid="seq_long"), DATA["provenance"]
    r = page.reference_roof()
    assert r == page.roof(long, prov, "seq_long")
    assert r.ridge == pytest.approx(r.peak_tflops * 1e12 / (r.gbps * 1e9))
    ok = [x for x in long if x["status"] == "ok" and x.get("pct_peak")]
    # the one peak the pages quote is the one the sweep's % of peak divides by
    assert all(x["tflops"] * 100 / x["pct_peak"] == pytest.approx(r.peak_tflops) for x in ok)
    assert r.gbps > DATA["provenance"]["copy_gbps"]  # the read bandwidth: faster than a copy, so a floor on time


def test_the_reference_roof_without_a_recording(monkeypatch):
    monkeypatch.setattr(page, "reference", lambda grid: (None, None))
    assert page.reference_roof() is None


@needs_data
def test_the_recorded_naive_call_waits_on_memory_and_cudnn_computes():
    """The online-softmax page's recap: at T = 4096 the naive version's bytes fill most of its time at the read
    bandwidth, cuDNN's matmuls most of its own at the matmul peak."""
    r = page.reference_roof()
    (naive,) = _recs(grid="seq_long", impl="naive", causal=False, seq_q=4096)
    (cudnn,) = _recs(grid="seq_long", impl="cudnn", causal=False, seq_q=4096)
    n, c = page.io_point(naive), page.io_point(cudnn)
    assert 0.5 < r.bytes_ms(n) / n.median_ms <= 1.0 and r.matmul_ms(n) < r.bytes_ms(n)
    assert 0.5 < r.matmul_ms(c) / c.median_ms <= 1.0 and r.bytes_ms(c) < 0.1 * c.median_ms


def _profiled(impl, causal, main_us, other_us):
    kernels = [{"name": f"main_{causal}", "us": main_us, "count": 1.0, "kind": "kernel"},
               {"name": "gemm", "us": other_us, "count": 2.0, "kind": "kernel"}]  # fmt: skip
    return rec(impl, 1.0, causal=causal, time_source="device", device_ms=(main_us + other_us) / 1e3, kernels=kernels)


def test_mask_profile_splits_the_longest_kernel_from_the_rest():
    m = page.mask_profile([_profiled("xla", False, 1000.0, 900.0), _profiled("xla", True, 2500.0, 910.0)], "xla")
    assert (m.main_us, m.rest_us, m.seq_q) == ((1000.0, 2500.0), pytest.approx((900.0, 910.0)), 1024)
    assert (m.main_ratio, m.main_names) == (2.5, ("main_False", "main_True"))
    assert m.rest_ratio == pytest.approx(910 / 900)
    assert page.mask_profile([_profiled("xla", False, 1.0, 1.0)], "xla") is None  # no causal call


@needs_data
def test_recorded_xla_causal_time_goes_to_its_softmax_pass():
    m = page.mask_profile(_recs(grid="device_time"), "xla")
    assert m.main_ratio > 1.5 and m.rest_ratio == pytest.approx(1.0, abs=0.05)
    assert all(name.startswith("fusion") for name in m.main_names)  # XLA's own fused kernel, not a cuBLAS matmul


def test_io_figure_draws_the_budget_and_the_roofline():
    points = [page.io_point(rec("xla", 2.0)), page.io_point(rec("cudnn", 0.5))]
    r = page.Roof(700.0, 4500.0, 989.4, 4800.0)
    fig = page.io_figure(points, points, r)
    left, right = fig.axes
    widths = [b.get_width() for b in left.patches]
    assert widths == pytest.approx([2.0, r.bytes_ms(points[0]), r.matmul_ms(points[0]),
                                    0.5, r.bytes_ms(points[1]), r.matmul_ms(points[1])])  # fmt: skip
    marks = {line.get_label(): (line.get_xdata()[0], line.get_ydata()[0]) for line in right.lines
             if line.get_linestyle() == "None"}  # fmt: skip
    assert marks["XLA"] == pytest.approx((points[0].intensity, points[0].tflops))
    assert marks["cuDNN"] == pytest.approx((points[1].intensity, points[1].tflops))
    roofs = [line for line in right.lines if line.get_label().endswith("TB/s")]
    assert max(roofs[0].get_ydata()) == 700.0 and max(roofs[1].get_ydata()) == pytest.approx(989.4)
    (ridge,) = [line for line in right.lines if line.get_label().startswith("ridge")]
    assert list(ridge.get_xdata()) == [r.ridge, r.ridge] and round(r.ridge) == 156
    plt.close(fig)


def test_mask_saving_reads_each_t_from_the_spreads():
    recs = [rec("xla", 2.0, 1.9, 2.1, seq_q=1024), rec("xla", 2.5, 2.4, 2.6, seq_q=1024, causal=True),
            rec("xla", 4.0, 3.9, 4.1, seq_q=2048), rec("xla", 4.05, 3.95, 4.2, seq_q=2048, causal=True)]  # fmt: skip
    m = page.mask_saving(recs, "xla")
    assert m.words == "slower at T = 1024; on par at T = 2048"
    assert (m.low, m.high) == pytest.approx((2.0 / 2.5, 4.0 / 4.05))
    assert page.mask_saving(recs, "cudnn") is None


@needs_data
def test_recorded_causal_masks_save_time_for_cudnn_only():
    long = _recs(grid="seq_long")
    cudnn, xla = page.mask_saving(long, "cudnn"), page.mask_saving(long, "xla")
    assert cudnn.words == "faster" and cudnn.low > 1.3
    assert xla.high < 1.05 and "faster" not in xla.words


def test_bytes_per_score():
    recs = [rec("xla", 1.0, temp_bytes=6 * 2 * 4 * 1024 * 1024), rec("xla", 1.0, seq_q=2048, seq_kv=2048,
            temp_bytes=7 * 2 * 4 * 2048 * 2048), rec("cudnn", 1.0)]  # fmt: skip
    assert page.bytes_per_score(recs, "xla") == (6.0, 7.0) and page.bytes_per_score(recs, "cudnn") is None


@needs_data
def test_recorded_temporaries_are_the_float32_scores_and_bf16_weights():
    per = page.bytes_per_score(_recs(grid="seq_long", causal=False), "xla")
    assert per == pytest.approx((4 + 2, 4 + 2), abs=0.01)  # what materialised_bytes writes once per pair


def test_batch_floor():
    recs = [rec("cudnn", 0.07, 0.06, 0.08, batch=1), rec("cudnn", 0.075, 0.07, 0.09, batch=16),
            rec("xla", 0.04, 0.035, 0.045, batch=8)]  # fmt: skip
    f = page.batch_floor(recs, "cudnn")
    assert (f.work_ratio, f.fastest_ms, f.claim.word) == (16, 0.04, "on par")
    assert f.time_ratio == pytest.approx(0.075 / 0.07)
    assert page.batch_floor(recs[:1], "cudnn") is None
    assert f.floor_us == 40.0  # 0.04 ms exactly: not rounded down below itself
    low = page.batch_floor([*recs, rec("xla", 0.03985, batch=2)], "cudnn")
    assert low.floor_us == 39.8 and low.floor_us <= low.fastest_ms * 1e3


def test_head_dim_change():
    recs = [rec("xla", 3.38, 3.37, 3.39, head_dim=32, tflops=40.0), rec("xla", 4.26, 4.2, 4.36, head_dim=256,
            tflops=258.0), rec("xla", 3.5, head_dim=64, tflops=80.0)]  # fmt: skip
    h = page.head_dim_change(recs, "xla")
    assert (h.first, h.last, h.work_ratio) == (32, 256, 8)
    assert h.tflops_ratio == pytest.approx(258 / 40) and h.time_ratio == pytest.approx(4.26 / 3.38)
    assert h.time_claim.word == "faster"  # H = 32 is faster: the time rises, outside the spreads


def test_race_rows_per_mask():
    recs = [rec("cudnn", 1.0, 0.95, 1.05, seq_q=4096), rec("mosaic", 1.1, 1.08, 1.12, seq_q=4096),
            rec("cudnn", 4.0, 3.9, 4.1, seq_q=8192), rec("mosaic", 4.05, 4.0, 4.1, seq_q=8192),
            rec("mosaic", 0.3, seq_q=1024), rec("cudnn", 0.2, seq_q=1024)]  # fmt: skip
    (row,) = page.race(recs, ("mosaic", "xla"), min_seq=4096)
    assert (row.impl, row.causal, row.words) == ("mosaic", False, "slower at T = 4096; on par at T = 8192")
    assert (row.low, row.high) == pytest.approx((1.0 / 1.1, 4.0 / 4.05))


@needs_data
def test_recorded_backward_race_against_independent_ratios():
    race = _recs(grid="backward", head_dim=128, dtype="bfloat16", heads=16, kv_heads=16)
    rows = {(x.impl, x.causal): x for x in page.race(race, ("mosaic", "xla"), min_seq=4096)}
    for (impl, causal), row in rows.items():
        ratios = []
        for r in store.select(race, impl=impl, causal=causal):
            if r["seq_q"] >= 4096:
                cu = store.select(race, impl="cudnn", causal=causal, seq_q=r["seq_q"], batch=r["batch"])
                ratios += [c["median_ms"] / r["median_ms"] for c in cu]
        assert (row.low, row.high) == pytest.approx((min(ratios), max(ratios)))
    assert rows[("xla", False)].high < 0.5 and rows[("mosaic", False)].low > 0.8


def test_pct_both():
    assert page.pct_both({"tflops": 494.7, "pct_peak": 70.0, "dtype": "bfloat16"}, "NVIDIA H200") == (
        70.0,
        pytest.approx(50.0),
    )
    assert page.pct_both({"tflops": 1.0, "pct_peak": 1.0}, None) == (1.0, None)


def test_best_and_live_table_on_this_build():
    recs = [rec("xla", 1.0, tflops=10.0), rec("xla", 1.0, tflops=20.0, seq_q=2048), rec("xla", 1.0, status="oom")]
    assert page.best(recs, "xla")["tflops"] == 20.0 and page.best(recs, "cudnn") is None
    text = page.live_table(recs[:1], recs, ["impl", "median_ms"])
    assert text.startswith("**Live, this build:**") and text.count("\n|---|---|") == 1  # one table on a CPU


def test_io_figure_labels_each_sweep_s_cluster():
    t = page.io_point(rec("xla", 2.0, grid="seq_long"))
    h = page.io_point(rec("xla", 1.0, grid="head_dim", head_dim=32))
    c = page.io_point(rec("cudnn", 0.5, grid="head_dim", head_dim=32))
    fig = page.io_figure([t], [t, h, c], page.Roof(700.0, 4500.0))
    right = fig.axes[1]
    marks = {line.get_label(): line for line in right.lines if line.get_linestyle() == "None"}
    assert set(marks) == {"XLA, T sweep", "XLA, H sweep", "cuDNN, H sweep"}
    assert (marks["XLA, H sweep"].get_xdata()[0], marks["XLA, H sweep"].get_ydata()[0]) == pytest.approx(
        (h.intensity, h.tflops)
    )
    assert marks["XLA, T sweep"].get_marker() == "o" and marks["XLA, H sweep"].get_marker() == "s"
    assert marks["XLA, H sweep"].get_markerfacecolor() == "none"  # hollow: the H sweep
    assert sorted(a.get_text() for a in right.texts) == ["H=32", "H=32"]  # each H-sweep point named by its H
    sides = {a.get_color(): a.get_horizontalalignment() for a in right.texts}
    assert h.intensity < 156 < c.intensity  # XLA left of the ridge, cuDNN right of it: each label faces away
    assert sides == {marks["XLA, H sweep"].get_color(): "right", marks["cuDNN, H sweep"].get_color(): "left"}
    plt.close(fig)


def test_doubling_is_the_geometric_mean_per_doubling_of_t():
    recs = [rec("xla", 1.0, seq_q=1024, seq_kv=1024, batch=4), rec("xla", 2.5, seq_q=2048, seq_kv=2048, batch=2),
            rec("xla", 4.0, seq_q=4096, seq_kv=4096, batch=1)]  # fmt: skip
    d = page.doubling(recs, "xla")
    assert (d.time_ratio, d.work_ratio, d.steps) == (pytest.approx(2.0), pytest.approx(2.0), 2)  # 4× over two
    assert page.doubling(recs[:1], "xla") is None


@needs_data
def test_recorded_time_roughly_doubles_per_doubling_of_t_with_b_t_fixed():
    long = _recs(grid="seq_long")
    for impl in ("xla", "cudnn"):
        d = page.doubling(long, impl)
        assert d.work_ratio == pytest.approx(2.0) and 1.8 < d.time_ratio < 2.2, impl
    assert page.doubling(long, "cudnn").time_ratio < page.doubling(long, "xla").time_ratio


def test_catches_up_finds_where_the_ratio_stays_close():
    recs = [rec(i, ms, seq_q=t) for t, (a, b) in {1024: (0.7, 1.0), 2048: (1.4, 2.0), 4096: (3.9, 4.0),
            8192: (8.1, 8.0)}.items() for i, ms in (("xla", a), ("naive", b))]  # fmt: skip
    c = page.catches_up(recs, "xla", "naive")
    assert (c.seq_q, c.before, c.after) == (4096, pytest.approx((0.7, 0.7)), pytest.approx((3.9 / 4, 8.1 / 8)))
    assert page.catches_up(recs[:4], "xla", "naive") is None  # never close
    assert page.catches_up(recs[4:], "xla", "naive") is None  # close from the start


@needs_data
def test_recorded_xla_meets_the_naive_time_at_long_t():
    c = page.catches_up(_recs(grid="seq_long"), "xla", "naive")
    assert c.seq_q == 16384 and c.before[1] < 0.75 and c.after[0] > 0.95


def test_causal_pair_credits_the_kept_pairs():
    recs = [rec("cudnn", 2.0, seq_q=4, seq_kv=4, tflops=10.0), rec("cudnn", 1.2, seq_q=4, seq_kv=4, causal=True)]
    p = page.causal_pair(recs, "cudnn", 4)
    assert p.share == pytest.approx(10 / 16) and p.speedup == pytest.approx(2.0 / 1.2)  # 10 of 16 pairs kept
    assert page.causal_pair(recs[:1], "cudnn", 4) is None


@needs_data
def test_recorded_causal_cudnn_is_faster_with_fewer_tflops():
    p = page.causal_pair(_recs(grid="seq_long"), "cudnn", 4096)
    assert p.share == pytest.approx(0.5, abs=0.001)
    assert p.speedup > 1.5 and p.causal["tflops"] < p.full["tflops"]


def test_exp_budget_per_head_dim():
    budget = page.exp_budget([32, 64, 256])
    assert [b.flops_per_score for b in budget] == [128, 256, 1024]
    assert all(b.flops_per_exp == 4096 / 16 for b in budget)
    assert [b.exp_over_matmul for b in budget] == [2.0, 1.0, 0.25]


@needs_data
def test_recorded_cudnn_head_dims_share_one_intensity_and_spread_in_speed():
    pts = [page.io_point(r) for r in _recs(grid="head_dim", impl="cudnn")]
    assert len({round(p.intensity) for p in pts}) == 1 and page.reference_roof().ridge < pts[0].intensity
    assert max(p.tflops for p in pts) > 2 * min(p.tflops for p in pts)


def test_not_run_reads_the_status_and_the_memory_reason():
    reason = "needs about 161.0 GiB (inputs, outputs and score matrices, estimated) and this device lets XLA use 104.9 GiB: not run"
    recs = [rec("xla", None, status="oom", reason=reason, estimated_bytes=161 * 2**30, seq_q=32768),
            rec("xla", 1.0), rec("cudnn", None, status="unsupported", reason="head_dim must be ...", head_dim=100)]  # fmt: skip
    (x,) = page.not_run(recs, "xla")
    assert (x.seq_q, x.status, x.need_gib, x.limit_gib) == (32768, "oom", 161.0, 104.9)
    (c,) = page.not_run(recs, "cudnn")
    assert (c.head_dim, c.status, c.need_gib, c.limit_gib) == (100, "unsupported", None, None)


@needs_data
def test_recorded_xla_backward_at_32k_did_not_fit():
    race = store.select(DATA["records"], grid="backward", head_dim=128, dtype="bfloat16", heads=16, kv_heads=16)
    gone = page.not_run(race, "xla")
    assert {g.seq_q for g in gone} == {32768} and all(g.status == "oom" and g.need_gib > g.limit_gib for g in gone)
    assert page.not_run(race, "cudnn") == []
    assert [s.head_dim for s in page.not_run(store.select(DATA["records"], grid="head_dim"), "cudnn")] == [100]


def test_tokens_per_call_groups_the_points():
    recs = [rec("xla", 1.0, seq_q=1024, batch=16), rec("cudnn", 1.0, seq_q=1024, batch=16),
            rec("xla", 1.0, seq_q=16384, batch=1), rec("xla", 1.0, seq_q=32768, batch=1)]  # fmt: skip
    assert page.tokens_per_call(recs) == {16384: [(1024, 16), (16384, 1)], 32768: [(32768, 1)]}


def test_best_own_is_the_one_whose_worst_showing_is_best():
    rows = [page.RaceRow("mosaic", False, 0.9, 0.95, ""), page.RaceRow("mosaic", True, 0.85, 0.9, ""),
            page.RaceRow("pallas", False, 0.8, 0.99, ""), page.RaceRow("xla", False, 0.99, 1.0, "")]  # fmt: skip
    assert page.best_own(rows) == "mosaic" and page.best_own(rows[3:]) is None


def test_batch_figure_draws_microseconds_from_zero():
    recs = [rec("cudnn", 0.07, 0.06, 0.08, batch=1), rec("cudnn", 0.075, 0.07, 0.09, batch=16),
            rec("xla", 0.05, batch=1), rec("xla", 0.04, batch=16)]  # fmt: skip
    fig = page.batch_figure(recs)
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.lines}
    assert list(lines["cuDNN"].get_xdata()) == [1, 16]
    assert list(lines["cuDNN"].get_ydata()) == pytest.approx([70.0, 75.0])  # µs, not ms
    assert list(lines["XLA"].get_ydata()) == pytest.approx([50.0, 40.0])
    assert ax.get_ylim()[0] == 0 and "µs" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "16"]
    plt.close(fig)


def test_dodge_pushes_close_labels_apart():
    pts = [page.io_point(rec("cudnn", ms, head_dim=h)) for ms, h in ((1.0, 128), (1.9, 256), (1.0, 32))]
    assert pts[0].intensity == pts[1].intensity == pts[2].intensity  # one FLOPs per byte, as in the H sweep
    assert page._dodge(pts) == [-4.0, 4.0, 0.0]  # 128 and 256 within 1.2× of each other; 32 far below
