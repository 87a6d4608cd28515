"""The scaling pages, sequence length (``scaling``) and batch, head dimension and backward pass
(``batch_heads_backward``): the IO figure (the time budget beside the roofline) on synthetic records a wrong number
would fail; and the numbers each page's cells computed in the last docs build, set against the committed results read
here independently."""

import itertools
import math
import re

import matplotlib.pyplot as plt
import pytest

from attention_tutorial.measure.flops import attention_flops
from attention_tutorial.measure.profile import main_kernel
from attention_tutorial.measure.roofline import Roof, io_point
from attention_tutorial.results import store
from attention_tutorial.results.plotting import label
from attention_tutorial.site import scaling as page
from attention_tutorial.site.claims import compare
from tests.built_pages import glued
from tests.measure.test_roofline import rec as roofline_rec

DATA = store.recorded()


def rec(impl, ms, lo=None, hi=None, **kw):
    """The roofline tests' record, with its spread (p10, p90: the median where not given)."""
    return roofline_rec(impl, ms, p10_ms=lo or ms, p90_ms=hi or ms, **kw)


def _recs(**where):
    return store.select(DATA["records"], status="ok", **where)


def _built(page):
    """What ``page``'s cells glued in the last docs build, as Python values (Markdown as its text)."""
    out = glued(page)
    if DATA is None:
        pytest.skip("no recorded results")
    return out


@pytest.fixture(scope="module")
def built():
    """The sequence-length page's glued values."""
    return _built("scaling")


@pytest.fixture(scope="module")
def built_bhb():
    """The batch, head dimension and backward page's glued values."""
    return _built("batch_heads_backward")


def _pct_range(text):  # "96–99 %" or "90 %" -> (0.96, 0.99)
    lo, hi = re.fullmatch(r"(\d+)(?:–(\d+))? %", text).groups()
    return int(lo) / 100, int(hi or lo) / 100


# --- the IO figure, on synthetic records


def test_io_figure_draws_the_budget_and_the_roofline():
    points = [io_point(rec("xla", 2.0)), io_point(rec("cudnn", 0.5))]
    r = Roof(700.0, 4500.0, 989.4, 4800.0)
    fig = page.io_figure(points, points, r)
    left, right = fig.axes
    widths = [b.get_width() for b in left.patches]
    assert widths == pytest.approx(
        [2.0, r.bytes_ms(points[0]), r.matmul_ms(points[0]), 0.5, r.bytes_ms(points[1]), r.matmul_ms(points[1])]
    )
    marks = {
        line.get_label(): (line.get_xdata()[0], line.get_ydata()[0])
        for line in right.lines
        if line.get_linestyle() == "None"
    }
    assert marks["XLA"] == pytest.approx((points[0].intensity, points[0].tflops))
    assert marks["cuDNN"] == pytest.approx((points[1].intensity, points[1].tflops))
    roofs = [line for line in right.lines if line.get_label().endswith("TB/s")]
    assert max(roofs[0].get_ydata()) == 700.0 and max(roofs[1].get_ydata()) == pytest.approx(989.4)
    (ridge,) = [line for line in right.lines if line.get_label().startswith("ridge")]
    assert list(ridge.get_xdata()) == [r.ridge, r.ridge] and round(r.ridge) == 156
    plt.close(fig)


def test_io_figure_labels_each_sweep_s_cluster():
    t = io_point(rec("xla", 2.0, grid="seq_long"))
    h = io_point(rec("xla", 1.0, grid="head_dim", head_dim=32))
    c = io_point(rec("cudnn", 0.5, grid="head_dim", head_dim=32))
    fig = page.io_figure([t], [t, h, c], Roof(700.0, 4500.0))
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


def test_io_figure_pushes_close_h_labels_apart():
    pts = [io_point(rec("cudnn", ms, grid="head_dim", head_dim=h)) for ms, h in ((1.0, 128), (1.9, 256), (1.0, 32))]
    assert pts[0].intensity == pts[1].intensity == pts[2].intensity  # one FLOPs per byte, as in the H sweep
    fig = page.io_figure(pts[:1], pts, Roof(700.0, 4500.0))
    offsets = {a.get_text(): a.xyann[1] for a in fig.axes[1].texts}
    assert offsets == {"H=128": -4, "H=256": 4, "H=32": 0}  # 128 and 256 within 1.2× of each other; 32 far below
    plt.close(fig)


# --- the built page against the committed results: each value as the page shows it


def num(text):  # a number as the page shows it: "4,468", "2.1×", "80 %" -> 4468, 2.1, 80
    return float(text.replace(",", "").rstrip("×% "))


def test_the_io_numbers_are_the_recorded_calls_against_the_reference_roof(built):
    from attention_tutorial.site.report import reference_roof

    roof = reference_roof()
    x, c = (io_point(_recs(grid="seq_long", impl=i, causal=False, seq_q=4096)[0]) for i in ("xla", "cudnn"))
    assert built["io_ratio"] == f"{x.bytes / c.bytes:.0f}" == "49"
    assert (built["io_xla_bytes_ms"], built["io_xla_ms"]) == (f"{roof.bytes_ms(x):.1f}", f"{x.median_ms:.1f}")
    assert num(built["io_xla_bytes_ms"]) > 0.7 * num(built["io_xla_ms"]) > num(built["io_xla_matmul_ms"])  # memory
    assert built["io_ridge"] == f"{roof.peak_tflops * 1e3 / roof.gbps:.0f}"
    assert num(built["io_xla_ai"]) < num(built["io_ridge"]) < num(built["io_cudnn_ai"]) == 2048
    cap = x.intensity * roof.gbps / 1e3  # left of the ridge: memory's cap
    assert built["io_xla_cap_pct"] == f"{100 * cap / roof.peak_tflops:.0f}" and x.tflops <= cap
    assert num(built["io_xla_tflops"]) < num(built["io_cudnn_tflops"]) <= num(built["io_peak"])
    assert built["io_cudnn_pct_ds"] == f"{100 * c.tflops / 989.4:.0f}"


def test_time_grows_with_the_work_and_cudnn_climbs_with_t(built):
    for impl in ("xla", "cudnn"):
        rs = sorted(_recs(grid="seq_long", impl=impl, causal=False), key=lambda r: r["seq_q"])
        steps = [
            (b["median_ms"] / a["median_ms"], math.log2(b["seq_q"] / a["seq_q"])) for a, b in itertools.pairwise(rs)
        ]
        mean = math.exp(sum(math.log(t) for t, _ in steps) / sum(o for _, o in steps))  # per doubling, step by step
        assert built[f"t_double_{impl}"] == f"{mean:.1f}" and 1.8 < mean < 2.2, impl
        work = [attention_flops(r["batch"], r["seq_q"], r["seq_kv"], r["heads"], r["head_dim"]) for r in rs]
        assert work[-1] / work[0] == pytest.approx(rs[-1]["seq_q"] / rs[0]["seq_q"])  # B·T fixed: work ∝ T
    assert num(built["t_double_cudnn"]) < num(built["t_double_xla"])
    assert num(built["t_cudnn_first"]) < num(built["t_cudnn_last"])
    assert (built["t_first_t"], built["t_last_t"]) == ("1,024", "32,768")
    best = {i: max(r["tflops"] for r in _recs(grid="seq_long", impl=i, causal=False)) for i in ("xla", "naive")}
    assert (built["t_xla_full"], built["t_naive_full"]) == (f"{best['xla']:.0f}", f"{best['naive']:.0f}")


def test_xla_meets_the_naive_time_at_long_t(built):
    assert built["t_catch_t"] == "16,384"
    assert _pct_range(built["t_catch_before"])[1] < 0.75 and _pct_range(built["t_catch_after"])[0] > 0.95


def test_causal_masks_save_time_for_cudnn_only(built):
    assert built["t_mask_cudnn"] == "faster" and "faster" not in built["t_mask_xla"]
    cudnn_lo, _ = map(float, built["t_mask_cudnn_range"].split("–"))
    _, xla_hi = map(float, built["t_mask_xla_range"].split("–"))
    assert cudnn_lo > 1.3 and xla_hi < 1.05
    for impl in ("xla", "cudnn"):  # every causal call against the unmasked one, from the ranges over runs
        words = {
            compare([r], _recs(grid="seq_long", impl=impl, causal=False, seq_q=r["seq_q"])).word
            for r in _recs(grid="seq_long", impl=impl, causal=True)
        }
        assert (words == {"faster"}) == (built[f"t_mask_{impl}"] == "faster")
    full, causal = (_recs(grid="seq_long", impl="cudnn", seq_q=4096, causal=c)[0] for c in (False, True))
    assert built["t_credit"] == "50"  # the kept pairs: T·(T+1)/2 of T²
    assert causal["median_ms"] < full["median_ms"] / 1.5 and causal["tflops"] < full["tflops"]


def test_xla_s_causal_time_goes_to_its_softmax_pass(built):
    plain, masked = (_recs(grid="device_time", impl="xla", causal=c, time_source="device")[0] for c in (False, True))
    mains = [main_kernel(r) for r in (plain, masked)]
    assert all(m["name"].startswith("fusion") for m in mains)  # XLA's own fused kernel, not a cuBLAS matmul
    assert built["t_xla_softmax"] == f"{mains[1]['us'] / mains[0]['us']:.1f}" and num(built["t_xla_softmax"]) > 1.5
    assert num(built["t_xla_rest"]) == pytest.approx(1.0, abs=0.05) and built["t_prof_t"] == f"{plain['seq_q']:,}"


def test_the_temporaries_are_the_float32_scores_and_bf16_weights(built):
    assert built["mem_naive"] == built["mem_xla"] == f"{4 + 2:.2f}"  # what materialised_bytes writes once per pair
    assert re.fullmatch(r"[\d,]+ bytes( or [\d,]+ bytes)*", built["mem_cudnn"])


def test_small_batches_cost_a_fixed_time_per_call(built_bhb):
    sweep = _recs(grid="batch")
    small, large = (_recs(grid="batch", impl="cudnn", batch=b) for b in (1, 16))
    assert (built_bhb["b_small_b"], built_bhb["b_large_b"], built_bhb["b_work"]) == (1, 16, 16)
    assert built_bhb["b_fastest"] == f"{1e3 * min(r['median_ms'] for r in sweep):.1f}"
    assert built_bhb["b_large"] == f"{large[0]['median_ms'] * 1e3:.0f}"
    assert compare(large, small).word == "on par" and built_bhb["b_costs"] == "about what B = 1 costs"
    assert built_bhb["b_one_words"] == "on par with both"


def test_wider_heads_and_the_exponential_budget(built_bhb):
    hd = _recs(grid="head_dim")
    for impl in ("xla", "cudnn"):
        rs = sorted(store.select(hd, impl=impl), key=lambda r: r["head_dim"])
        assert built_bhb[f"h_{impl}_tflops"] == f"{rs[-1]['tflops'] / rs[0]['tflops']:.1f}"
        assert built_bhb[f"h_{impl}_time"] == f"{rs[-1]['median_ms'] / rs[0]['median_ms']:.2f}"
        assert built_bhb[f"h_{impl}_work"] == "8"
    assert num(built_bhb["h_xla_time"]) < 1.5 < num(built_bhb["h_xla_tflops"])  # XLA climbs the bandwidth line
    assert built_bhb["h_refused"] == "100" and built_bhb["h_cudnn_ai"] == "2,048"
    assert built_bhb["h_per_exp"] == f"{4096 / 16:.0f}" and built_bhb["h_per_score"] == "128, 256, 512 and 1,024"
    assert (built_bhb["h_exp_first"], built_bhb["h_exp_last"]) == ("2×", "0.25×")


def test_the_backward_race_against_independent_ratios(built_bhb):
    race = _recs(grid="backward", head_dim=128, dtype="bfloat16", heads=16, kv_heads=16)
    speeds = {}
    for impl in ("xla", "mosaic", "pallas"):
        ratios = []
        for r in (r for r in store.select(race, impl=impl) if r["seq_q"] >= 4096):
            cu = store.select(race, impl="cudnn", causal=r["causal"], seq_q=r["seq_q"], batch=r["batch"])
            ratios += [c["median_ms"] / r["median_ms"] for c in cu]
        speeds[impl] = (min(ratios), max(ratios))
    own = max(("mosaic", "pallas"), key=lambda i: speeds[i][0])  # our kernel whose slowest showing is fastest
    assert built_bhb["bw_own"] == label(own)
    for key, impl in (("bw_xla_speed", "xla"), ("bw_own_speed", own)):
        assert _pct_range(built_bhb[key]) == pytest.approx(tuple(round(s, 2) for s in speeds[impl]), abs=0.006)
    assert _pct_range(built_bhb["bw_xla_speed"])[1] < 0.5 and _pct_range(built_bhb["bw_own_speed"])[0] > 0.8
    assert (built_bhb["bw_main_ts"], built_bhb["bw_main_bs"], built_bhb["bw_main_tokens"]) == (
        "1,024, 4,096 and 16,384",
        "16, 4 and 1",
        "16k",
    )
    assert (built_bhb["bw_last_t"], built_bhb["bw_last_b"], built_bhb["bw_last_tokens"]) == ("32,768", "1", "32k")
    best = max(store.select(race, impl="cudnn", causal=False), key=lambda r: r["tflops"])
    assert (built_bhb["bw_cudnn_pct"], built_bhb["bw_cudnn_t"]) == (f"{best['pct_peak']:.0f}", f"{best['seq_q']:,}")


def test_xla_s_backward_at_32k_did_not_fit(built_bhb):
    race = store.select(DATA["records"], grid="backward", head_dim=128, dtype="bfloat16", heads=16, kv_heads=16)
    gone = [r for r in race if r["impl"] == "xla" and r["status"] != "ok"]
    assert {r["seq_q"] for r in gone} == {32768} and all(r["status"] == "oom" for r in gone)
    assert [r for r in race if r["impl"] == "cudnn" and r["status"] != "ok"] == []
    assert built_bhb["bw_xla_gone_t"] == "32,768" and num(built_bhb["bw_xla_need"]) > num(built_bhb["bw_xla_limit"])
    assert built_bhb["bw_xla_need"] == f"{max(r['estimated_bytes'] for r in gone) / 2**30:.0f}"


@pytest.mark.parametrize(
    "fixture, key",
    [("built", "t_live")] + [("built_bhb", key) for key in ("b_live", "h_live", "bw_live")],
)
def test_each_live_table_runs_a_point_or_two(fixture, key, request):
    first = request.getfixturevalue(fixture)[key].split("\n\nAgainst the recording")[0]  # this build's table, first
    assert first.startswith("**Live, this build:**")
    assert 1 <= first.count("\n| ") - 1 <= 2  # rows under the header
