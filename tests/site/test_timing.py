"""The timing page: its figure and tables, and the numbers its cells computed in the last docs build."""

import ast

import matplotlib.pyplot as plt
import numpy as np
import pytest

from attention_tutorial.measure import profile
from attention_tutorial.measure.timing import summarize
from attention_tutorial.results import store
from attention_tutorial.site import timing
from tests.built_pages import glued

TIMES = {
    "compile_s": 0.25,
    "warmup_ms": (9.0, 1.1, 1.0),
    "no_wait_ms": 0.05,
    "waited_ms": (1.2, 1.3, 1.25),
    "samples_ms": (1.0, 1.02, 0.98, 1.01, 0.99, 1.5, 1.0, 1.0, 1.03, 0.97),
    "inner": 10,
}
DATA = store.recorded()


@pytest.fixture(scope="module")
def built():
    """What the page's cells glued in the last docs build, as Python values (Markdown as its text)."""
    out = glued("timing")
    if DATA is None:
        pytest.skip("no recorded results")
    return out


def test_the_figure_draws_every_call_in_order_from_zero_and_zooms_on_waited_and_pipelined():
    fig = timing.calls_figure(TIMES)
    full, zoom = fig.axes
    mid, p10, p90 = summarize(TIMES["samples_ms"])

    def points(ax):
        return [line for line in ax.lines if line.get_linestyle() == "None"]

    assert [len(line.get_xdata()) for line in points(full)] == [3, 1, 3, 10]  # warm-up, unwaited, waited, samples
    xs = np.concatenate([line.get_xdata() for line in points(full)])
    assert list(xs) == list(range(17))  # one x per call, in the order they ran; the compilation is not a call
    assert max(np.concatenate([line.get_ydata() for line in points(full)])) == pytest.approx(9.0)  # not 250 ms
    assert full.get_yscale() == zoom.get_yscale() == "linear" and full.get_ylim()[0] == 0
    assert list(points(full)[3].get_ydata()) == list(TIMES["samples_ms"])
    waited, samples = points(zoom)  # the zoom holds the waited calls and the samples only, at the same xs
    assert list(waited.get_xdata()) == [4, 5, 6] and list(samples.get_xdata()) == list(range(7, 17))
    low, high = zoom.get_ylim()
    assert 0 < low < min(TIMES["samples_ms"]) and max(TIMES["samples_ms"] + TIMES["waited_ms"]) < high < 9.0
    for ax in (full, zoom):
        (median,) = [c for c in ax.collections if c.get_label().startswith("median")]
        assert median.get_segments()[0][0][1] == pytest.approx(mid)
        (band,) = [c for c in ax.collections if c.get_label().startswith("p10")]
        ys = band.get_paths()[0].vertices[:, 1]
        assert (ys.min(), ys.max()) == pytest.approx((p10, p90))
    plt.close(fig)


def test_the_listing_keeps_the_five_steps_and_drops_the_argument_checks():

    text = timing.five_ways_listing()
    ast.parse(text)
    assert "check_int" not in text and text.startswith("def five_ways(")
    steps = [text.index(f"# {i}.") for i in range(1, 6)]
    assert steps == sorted(steps)  # numbered in the order they run
    assert ".lower(*args).compile()" in text and "block_until_ready" in text and text.rstrip().endswith("}")


def _rec(impl, ratio, dev_ms, source="device", causal=False, **kw):
    return {
        "impl": impl,
        "causal": causal,
        "status": "ok",
        "device_ratio": ratio,
        "device_ms": dev_ms,
        "time_source": source,
        **kw,
    }


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
    recs = [
        _rec("xla", 1.02, 3.0, traced_wall_ms=3.03, device_span_ms=3.0),
        _rec("blockwise", 1.08, 6.0, causal=True, traced_wall_ms=6.6, device_span_ms=6.6),
        _rec("cudnn", 1.1, 0.5, traced_wall_ms=0.52, device_span_ms=0.51),  # shorter than a millisecond
        _rec("te", 1.0, 2.0),  # no host time of the traced calls
        _rec("naive", 1.0, 4.0, source="host", traced_wall_ms=4.0),
    ]  # a CPU's ops, not GPU kernels
    rows = timing.host_kernel_rows(recs)
    assert [(r["mask"], r["kernels summed (ms)"]) for r in rows] == [("causal", "6.000"), ("none", "3.000")]
    assert rows[0]["host / kernels"] == "1.100" and rows[0]["GPU busy"] == "91 %"
    assert rows[1]["host clock (ms)"] == "3.030" and rows[1]["GPU busy"] == "100 %"
    assert all(tuple(r) == timing.HOST_KERNEL_COLUMNS for r in rows)


# --- the built page: its numbers are the recorded ones


def test_the_five_steps_quote_the_recorded_calls(built):
    rec = DATA["provenance"]["lessons"]["timing"]
    assert rec["backend"] == "gpu"
    median, p10, p90 = summarize(rec["samples_ms"])
    waited = summarize(rec["waited_ms"])[0]
    assert rec["no_wait_ms"] < 0.5 * waited  # asynchronous dispatch: the page's first lesson holds
    assert built["t_wait"].startswith("**3. Wait for the result.** Without a wait")
    assert f"{100 * rec['no_wait_ms'] / waited:.1f} %" in built["t_wait"]
    assert built["t_compile"] == f"{rec['compile_s']:.2f} s"
    assert built["t_compile_calls"] == f"{rec['compile_s'] * 1e3 / median:,.0f}"
    assert built["t_first"] == f"{rec['warmup_ms'][0] / median:.1f}×"
    assert (built["t_median"], built["t_p10"], built["t_p90"]) == (f"{median:.3g} ms", f"{p10:.3g}", f"{p90:.3g} ms")
    assert built["t_spread"] == f"{100 * (p90 - p10) / median:.1f} %"
    assert built["t_dispatch"] == f"{max(waited - median, 0) * 1e3:.0f} µs" and waited > median
    assert built["t_samples"] == str(len(rec["samples_ms"]))
    assert built["t_source"].startswith(f"Measured on an {rec['device'].removeprefix('NVIDIA ')}")


def test_one_stall_drags_the_mean_not_the_median(built):
    samples = np.asarray(DATA["provenance"]["lessons"]["timing"]["samples_ms"])
    stalled = np.append(samples[:-1], 10 * np.median(samples))
    assert built["t_stall"] == "10" and built["t_mean_ms"] == f"{samples.mean():.4g} ms"
    assert built["t_stall_mean"] == f"{100 * (stalled.mean() / samples.mean() - 1):.0f} %"
    assert built["t_stall_median"] == f"{100 * (np.median(stalled) / np.median(samples) - 1):.1f} %"
    assert float(built["t_stall_mean"].split()[0]) > 10 * abs(float(built["t_stall_median"].split()[0]))


def test_the_codelab_shape_names_the_calls_dispatch_outlasts(built):
    recs = store.select(DATA["records"], grid="seed_shape", status="ok")
    slow = [r for r in recs if r["dispatch_ms"] > r["median_ms"]]
    assert len(recs) == 7 and slow, "the page names the calls dispatch outlasts"
    assert f"for {len(slow)} of the {len(recs)} implementations" in built["t_seed"]
    for r in slow:
        assert f"dispatch {1e3 * r['dispatch_ms']:.0f} µs, call {1e3 * r['median_ms']:.0f} µs" in built["t_seed"]
    (c,), (x,) = (store.select(recs, impl=i, dtype="bfloat16") for i in ("cudnn", "xla"))
    word = "slower" if c["p10_ms"] > x["p90_ms"] else "faster" if c["p90_ms"] < x["p10_ms"] else "on par"
    assert f"cuDNN is {word}" in built["t_seed"]
    assert f"({1e3 * c['median_ms']:.0f} µs against {1e3 * x['median_ms']:.0f} µs" in built["t_seed"]


def test_the_recorded_device_time_agrees_within_three_percent_but_one(built):
    recs = store.select(DATA["records"], grid="device_time")
    long = [r for r in recs if r.get("status") == "ok" and r["device_ms"] >= timing.MIN_MS]
    gaps = [100 * abs(r["traced_wall_ms"] / r["device_ms"] - 1) for r in long]
    assert gaps == pytest.approx([profile.agreement_pct(r) for r in long])
    inside = [g for g in gaps if g <= 3.0]
    assert f"the {len(long)}, the two clocks agree within {max(inside):.1f} %" in built["t_dev_agree"]
    out = max((r for r in long if profile.agreement_pct(r) > 3.0), key=profile.agreement_pct)
    idle = 1 - out["device_ms"] / out["device_span_ms"]
    assert f"idle for {100 * idle:.0f} %" in built["t_dev_agree"]
    assert f"reads {profile.agreement_pct(out):.1f} % more" in built["t_dev_agree"]
    assert len(inside) + 1 == len(long)  # one exception, which the page names
    rows = timing.host_kernel_rows(recs)
    assert len(rows) == len(long)
    shown = sorted(abs(float(r["host / kernels"]) - 1) * 100 for r in rows)
    assert shown[len(inside) - 1] == pytest.approx(max(inside), abs=0.06)  # the open table shows what the text says
    separate = [1 / r["device_ratio"] for r in long]
    assert built["t_dev_separate"] == f"{100 * min(separate):.0f}–{100 * max(separate):.0f} %"
