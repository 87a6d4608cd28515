"""The timing page's numbers: calls summarised, the figure's points, dispatch against the call, host against device."""

import matplotlib.pyplot as plt
import numpy as np
import pytest

from attention_tutorial.results import store
from attention_tutorial.site import timing

TIMES = timing.CallTimes(
    compile_s=0.25,
    warmup_ms=(9.0, 1.1, 1.0),
    no_wait_ms=0.05,
    waited_ms=(1.2, 1.3, 1.25),
    samples_ms=(1.0, 1.02, 0.98, 1.01, 0.99, 1.5, 1.0, 1.0, 1.03, 0.97),
    inner=10,
)


def test_summary_of_the_calls():
    s = timing.summarize_calls(TIMES)
    p10, median, p90 = np.percentile(TIMES.samples_ms, [10, 50, 90])
    assert (s.median_ms, s.p10_ms, s.p90_ms) == pytest.approx((median, p10, p90))
    assert s.spread_pct == pytest.approx(100 * (p90 - p10) / median)
    assert s.mean_over_median == pytest.approx(np.mean(TIMES.samples_ms) / median)  # the one 1.5 ms sample pulls it
    assert s.mean_over_median > 1.04 and s.slowest_over_median == pytest.approx(1.5 / median)
    assert s.no_wait_pct == pytest.approx(100 * 0.05 / 1.25)
    assert s.compile_calls == pytest.approx(250 / median)
    assert s.first_over_median == pytest.approx(9.0 / median)
    assert s.dispatch_ms == pytest.approx(1.25 - median) and s.samples == 10
    assert s.returned_early  # 0.05 ms of a 1.25 ms waited call: the call returned before its result was ready


def test_an_unwaited_clock_near_a_waited_call_is_synchronous_dispatch():
    sync = timing.CallTimes(0.1, (1.5,), 1.48, (1.41, 1.40, 1.45), (1.4, 1.42), inner=10)
    s = timing.summarize_calls(sync)
    assert s.no_wait_pct == pytest.approx(100 * 1.48 / 1.41) and not s.returned_early
    half = timing.CallTimes(0.1, (1.0,), 0.5, (1.0,), (1.0,), inner=1)  # exactly half: not early
    assert not timing.summarize_calls(half).returned_early


def test_call_times_from_a_five_ways_result_and_from_the_recording():
    rec = {"compile_s": 0.25, "warmup_ms": [9.0, 1.1, 1.0], "no_wait_ms": 0.05, "waited_ms": [1.2, 1.3, 1.25],
           "samples_ms": list(TIMES.samples_ms), "inner": 10, "device": "NVIDIA H200"}  # fmt: skip
    assert timing.CallTimes.from_record(rec) == TIMES
    with pytest.raises(ValueError, match="no_wait_ms"):
        timing.CallTimes.from_record({k: v for k, v in rec.items() if k != "no_wait_ms"})
    times, kept = timing.recorded_calls({"lessons": {"gqa": [], "timing": rec}})
    assert times == TIMES and kept["device"] == "NVIDIA H200"
    assert timing.recorded_calls({"lessons": {"gqa": []}}) is None and timing.recorded_calls(None) is None


def test_the_recorded_timing_lesson_returns_early_on_the_gpu():
    data = store.recorded()
    found = timing.recorded_calls(data and data["provenance"])
    if found is None:
        pytest.skip("the timing lesson is not recorded yet")
    times, rec = found
    assert rec["backend"] == "gpu"
    assert timing.summarize_calls(times).returned_early  # asynchronous dispatch: the page's first lesson holds


def test_a_waited_call_faster_than_the_pipelined_one_has_no_negative_dispatch():
    fast = timing.CallTimes(0.1, (1.0,), 0.01, (0.5,), (1.0, 1.0), inner=2)
    assert timing.summarize_calls(fast).dispatch_ms == 0.0


@pytest.mark.parametrize("bad", [{"samples_ms": ()}, {"waited_ms": (1.0, float("nan"))}, {"warmup_ms": (-1.0,)}])
def test_call_times_refuse_missing_or_bad_times(bad):
    fields = {**TIMES.__dict__, **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        timing.CallTimes(**fields)
    with pytest.raises(ValueError, match="inner"):
        timing.CallTimes(**{**TIMES.__dict__, "inner": 0})


def test_the_figure_draws_every_call_in_order_from_zero_and_zooms_on_waited_and_pipelined():
    fig = timing.calls_figure(TIMES)
    full, zoom = fig.axes
    s = timing.summarize_calls(TIMES)

    def points(ax):
        return [line for line in ax.lines if line.get_linestyle() == "None"]

    assert [len(line.get_xdata()) for line in points(full)] == [3, 1, 3, 10]  # warm-up, unwaited, waited, samples
    xs = np.concatenate([line.get_xdata() for line in points(full)])
    assert list(xs) == list(range(17))  # one x per call, in the order they ran; the compilation is not a call
    assert max(np.concatenate([line.get_ydata() for line in points(full)])) == pytest.approx(9.0)  # not 250 ms
    assert full.get_yscale() == zoom.get_yscale() == "linear" and full.get_ylim()[0] == 0
    assert list(points(full)[3].get_ydata()) == list(TIMES.samples_ms)
    waited, samples = points(zoom)  # the zoom holds the waited calls and the samples only, at the same xs
    assert list(waited.get_xdata()) == [4, 5, 6] and list(samples.get_xdata()) == list(range(7, 17))
    low, high = zoom.get_ylim()
    assert 0 < low < min(TIMES.samples_ms) and max(TIMES.samples_ms + TIMES.waited_ms) < high < 9.0
    for ax in (full, zoom):
        (median,) = [c for c in ax.collections if c.get_label().startswith("median")]
        assert median.get_segments()[0][0][1] == pytest.approx(s.median_ms)
        (band,) = [c for c in ax.collections if c.get_label().startswith("p10")]
        ys = band.get_paths()[0].vertices[:, 1]
        assert (ys.min(), ys.max()) == pytest.approx((s.p10_ms, s.p90_ms))
    plt.close(fig)


def test_one_stall_drags_the_mean_not_the_median():
    st = timing.one_stall(TIMES, factor=10.0)
    median = float(np.median(TIMES.samples_ms))
    stalled = [*TIMES.samples_ms[:-1], 10 * median]
    assert st.mean_ms == pytest.approx(np.mean(TIMES.samples_ms)) and st.median_ms == pytest.approx(median)
    assert st.stalled_mean_ms == pytest.approx(np.mean(stalled)) and st.stalled_median_ms == pytest.approx(
        np.median(stalled)
    )
    assert st.mean_rise_pct > 80 and abs(st.median_rise_pct) < 2  # 9 × the median over 10 samples moves the mean
    with pytest.raises(ValueError, match="factor"):
        timing.one_stall(TIMES, factor=0)


def test_the_listing_keeps_the_five_steps_and_drops_the_argument_checks():
    import ast

    text = timing.five_ways_listing()
    ast.parse(text)
    assert "check_int" not in text and text.startswith("def five_ways(")
    steps = [text.index(f"# {i}.") for i in range(1, 6)]
    assert steps == sorted(steps)  # numbered in the order they run
    assert ".lower(*args).compile()" in text and "block_until_ready" in text and text.rstrip().endswith("}")


def test_dispatch_share_counts_calls_whose_dispatch_outlasts_them():
    recs = [{"status": "ok", "median_ms": 0.05, "dispatch_ms": 0.08}, {"status": "ok", "median_ms": 1.0,
            "dispatch_ms": 0.1}, {"status": "unsupported"}]  # fmt: skip
    d = timing.dispatch_share(recs)
    assert (d.over, d.ok) == (1, 2) and d.largest_ratio == pytest.approx(1.6)
    assert timing.dispatch_share([]) == timing.DispatchShare(0, 0, None)
    named = [{"status": "ok", "impl": "cudnn", "dtype": "bfloat16", "median_ms": 0.08, "dispatch_ms": 0.14},
             {"status": "ok", "impl": "default", "dtype": "bfloat16", "median_ms": 0.05, "dispatch_ms": 0.1}, *recs]  # fmt: skip
    d = timing.dispatch_share(named)
    assert [(x.impl, x.dispatch_ms, x.call_ms) for x in d.slow] == [("default", 0.1, 0.05), ("cudnn", 0.14, 0.08),
                                                                   (None, 0.08, 0.05)]  # largest ratio first  # fmt: skip
    assert d.over == len(d.slow) == 3 and d.slow[0].ratio == pytest.approx(d.largest_ratio)


def test_dispatch_share_of_the_recorded_codelab_shape():
    data = store.recorded()
    if data is None:
        pytest.skip("no recorded results")
    recs = store.select(data["records"], grid="seed_shape", status="ok")
    d = timing.dispatch_share(recs)
    assert d.ok == len(recs) == 7
    assert d.over == sum(r["single_call_ms"] - r["median_ms"] > r["median_ms"] for r in recs)
    assert all(x.dispatch_ms > x.call_ms for x in d.slow) and d.slow, "the page names the calls dispatch outlasts"


def test_versus_uses_the_spreads():
    recs = [{"impl": "cudnn", "status": "ok", "dtype": "bfloat16", "median_ms": 0.08, "p10_ms": 0.075, "p90_ms": 0.09},
            {"impl": "xla", "status": "ok", "dtype": "bfloat16", "median_ms": 0.05, "p10_ms": 0.04, "p90_ms": 0.056},
            {"impl": "xla", "status": "ok", "dtype": "float32", "median_ms": 0.5, "p10_ms": 0.4, "p90_ms": 0.6}]  # fmt: skip
    assert timing.versus(recs, dtype="bfloat16") == timing.Versus(0.08, 0.05, "slower")
    close = [{**recs[0], "p10_ms": 0.05}, recs[1]]  # the ranges overlap: on par
    assert timing.versus(close, dtype="bfloat16").word == "on par"
    assert timing.versus(recs, dtype="float16") is None and timing.versus(recs, a="te") is None


def test_cudnn_against_xla_at_the_recorded_codelab_shape():
    data = store.recorded()
    if data is None:
        pytest.skip("no recorded results")
    recs = store.select(data["records"], grid="seed_shape", status="ok", dtype="bfloat16")
    v = timing.versus(recs)
    (c,), (x,) = ([r for r in recs if r["impl"] == i] for i in ("cudnn", "xla"))
    assert (v.a_ms, v.b_ms) == pytest.approx((c["median_ms"], x["median_ms"]))
    assert v.word == ("slower" if c["p10_ms"] > x["p90_ms"] else "faster" if c["p90_ms"] < x["p10_ms"] else "on par")


@pytest.mark.parametrize("n, word", [(3, "a few"), (40, "dozens"), (553, "hundreds"), (999, "hundreds"),
                                     (1000, "thousands")])  # fmt: skip
def test_count_word(n, word):
    assert timing.count_word(n) == word


def _rec(impl, ratio, dev_ms, source="device", causal=False, **kw):
    return {"impl": impl, "causal": causal, "status": "ok", "device_ratio": ratio, "device_ms": dev_ms,
            "time_source": source, **kw}  # fmt: skip


def test_agreement_from_the_separate_timing_run():
    recs = [_rec("cudnn", 1.012, 2.0), _rec("xla", 0.975, 5.0, causal=True), _rec("te", 1.5, 0.2)]
    a = timing.agreement(recs)
    assert (a.long, a.worst_impl, a.worst_causal, a.within, a.same_calls) == (2, "xla", True, True, False)
    assert a.worst_pct == pytest.approx(2.5) and a.short == 1 and a.short_ratio == (1.5, 1.5)
    assert a.separate == pytest.approx((1 / 1.012, 1 / 0.975)) and a.busy is None
    assert (a.inside, a.outliers) == (2, ()) and a.inside_pct == pytest.approx(2.5)
    kernels = [{"name": "k", "us": 2900.0, "count": 3.0, "kind": "kernel"}, {"name": "g", "us": 1.0, "count": 1.0,
               "kind": "graph"}, {"name": "Memset", "us": 100.0, "count": 2.0, "kind": "memset"}]  # fmt: skip
    worse = timing.agreement([*recs, _rec("mosaic", 1.04, 3.0, kernels=kernels, device_span_ms=3.2)])
    assert worse.worst_impl == "mosaic" and worse.worst_pct == pytest.approx(4.0) and not worse.within
    (out,) = worse.outliers
    assert (out.impl, out.launches, out.at_least) == ("mosaic", 5.0, False)  # kernels and memsets, not the graph
    assert out.idle == pytest.approx(1 - 3.0 / 3.2) and out.gap_pct == pytest.approx(4.0)


def test_agreement_prefers_the_same_profiled_calls():
    recs = [_rec("cudnn", 1.08, 2.0, traced_wall_ms=2.02, device_span_ms=2.01),
            _rec("xla", 0.95, 4.0, traced_wall_ms=4.08, device_span_ms=4.4)]  # fmt: skip
    a = timing.agreement(recs)
    assert a.same_calls and a.worst_impl == "xla" and a.worst_pct == pytest.approx(2.0) and a.within
    assert a.busy == pytest.approx((4.0 / 4.4, 2.0 / 2.01)) and a.separate == pytest.approx((1 / 1.08, 1 / 0.95))


def test_agreement_on_a_cpu_tests_nothing_long():
    a = timing.agreement([_rec("xla", 1.2, 3.0, "host"), _rec("blockwise", 0.9, 0.5, "host")])
    assert (a.long, a.source, a.short, a.short_ratio, a.within) == (0, "host", 2, (0.9, 1.2), False)
    assert timing.agreement([{"status": "unsupported"}]).source is None


def test_the_recorded_device_time_agrees_within_the_target_on_the_same_calls():
    data = store.recorded()
    if data is None:
        pytest.skip("no recorded results")
    recs = store.select(data["records"], grid="device_time")
    a = timing.agreement(recs)
    long = [r for r in recs if r.get("status") == "ok" and r["device_ms"] >= timing.MIN_MS]
    gaps = [100 * abs(r["traced_wall_ms"] / r["device_ms"] - 1) for r in long]
    assert a.long == len(long) and a.same_calls and a.worst_pct == pytest.approx(max(gaps))
    assert a.within == (max(gaps) <= timing.AGREE_PCT)
    assert a.inside == sum(g <= timing.AGREE_PCT for g in gaps) and a.inside + len(a.outliers) == a.long
    assert a.outliers, "the timing page names the exception to the target: reword it for a recording without one"
    for out in a.outliers:  # a call outside the target left the GPU idle between many kernels
        (r,) = [r for r in long if (r["impl"], r["causal"]) == (out.impl, out.causal)]
        assert out.idle == pytest.approx(1 - r["device_ms"] / r["device_span_ms"]) and out.launches > 10


def test_device_row_formats_a_record():
    rec = _rec("cudnn", 1.0123, 2.5, median_ms=2.53, p10_ms=2.5, p90_ms=2.6, dispatch_ms=0.012)
    row = timing.device_row(rec)
    assert row["pipelined / kernels"] == "1.012" and row["pipelined ms (p10–p90)"] == "2.53 (2.5–2.6)"
    assert row["host clock / kernels (ms)"] == "–" and row["dispatch (ms)"] == "0.012"
    same = timing.device_row({**rec, "traced_wall_ms": 2.55, "device_span_ms": 2.6})
    assert same["host clock / kernels (ms)"] == "2.55 / 2.5 = 1.020" and same["GPU busy"] == "96 %"
    skipped = timing.device_row({"impl": "te", "causal": True, "status": "unsupported", "reason": "no TE"})
    assert skipped["pipelined ms (p10–p90)"] == "–" and skipped["reason"] == "no TE"
    assert set(row) == set(timing.DEVICE_COLUMNS)


def test_host_kernel_rows_keep_the_long_traced_calls_longest_first():
    recs = [_rec("xla", 1.02, 3.0, traced_wall_ms=3.03, device_span_ms=3.0),
            _rec("blockwise", 1.08, 6.0, causal=True, traced_wall_ms=6.6, device_span_ms=6.6),
            _rec("cudnn", 1.1, 0.5, traced_wall_ms=0.52, device_span_ms=0.51),  # shorter than a millisecond
            _rec("te", 1.0, 2.0),  # no host time of the traced calls
            _rec("naive", 1.0, 4.0, source="host", traced_wall_ms=4.0)]  # a CPU's ops, not GPU kernels  # fmt: skip
    rows = timing.host_kernel_rows(recs)
    assert [(r["mask"], r["kernels summed (ms)"]) for r in rows] == [("causal", "6.000"), ("none", "3.000")]
    assert rows[0]["host / kernels"] == "1.100" and rows[0]["GPU busy"] == "91 %"
    assert rows[1]["host clock (ms)"] == "3.030" and rows[1]["GPU busy"] == "100 %"
    assert all(tuple(r) == timing.HOST_KERNEL_COLUMNS for r in rows)


def test_the_recorded_host_kernel_rows_are_the_calls_the_agreement_counts():
    data = store.recorded()
    if data is None:
        pytest.skip("no recorded results")
    recs = store.select(data["records"], grid="device_time")
    rows, a = timing.host_kernel_rows(recs), timing.agreement(recs)
    assert len(rows) == a.long
    gaps = sorted(abs(float(r["host / kernels"]) - 1) * 100 for r in rows)
    assert gaps[a.inside - 1] == pytest.approx(a.inside_pct, abs=0.06)  # the open table shows what the text says
