"""The timing page: its figure and tables, and the numbers its cells computed in the last docs build."""

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


# --- the built page: its numbers are the recorded ones


def test_the_five_steps_quote_the_recorded_calls(built):
    rec = DATA["provenance"]["lessons"]["timing"]
    assert rec["backend"] == "gpu"
    median, p10, p90 = summarize(rec["samples_ms"])
    waited = summarize(rec["waited_ms"])[0]
    assert rec["no_wait_ms"] < 0.5 * waited  # asynchronous dispatch: the page's first lesson holds
    assert built["returned"] == "once its work was queued"
    assert built["no_wait_pct"] == f"{100 * rec['no_wait_ms'] / waited:.1f} %"
    assert built["no_wait"] == f"{rec['no_wait_ms'] * 1e3:.0f} µs" and built["waited"] == f"{waited:.3g} ms"
    assert built["compile"] == f"{rec['compile_s']:.2f} s"
    assert built["compile_calls"] == f"{rec['compile_s'] * 1e3 / median:,.0f}"
    assert built["first_call"] == f"{rec['warmup_ms'][0] / median:.1f}×"
    assert (built["median"], built["spread"]) == (f"{median:.4g} ms", f"{p10:.3g}–{p90:.3g} ms")
    assert built["spread_pct"] == f"{100 * (p90 - p10) / median:.1f} %"
    assert built["dispatch"] == f"{max(waited - median, 0) * 1e3:.0f} µs" and waited > median
    assert built["sample_count"] == str(len(rec["samples_ms"]))


def test_one_stall_drags_the_mean_not_the_median(built):
    samples = np.asarray(DATA["provenance"]["lessons"]["timing"]["samples_ms"])
    stalled = np.append(samples[:-1], 10 * np.median(samples))
    assert built["mean"] == f"{samples.mean():.4g} ms"
    assert built["stall_mean"] == f"{100 * (stalled.mean() / samples.mean() - 1):.0f} %"
    assert built["stall_median"] == f"{100 * (np.median(stalled) / np.median(samples) - 1):.1f} %"
    assert float(built["stall_mean"].split()[0]) > 10 * abs(float(built["stall_median"].split()[0]))


def test_the_codelab_shape_names_the_calls_dispatch_outlasts(built):
    recs = store.select(DATA["records"], grid="seed_shape", status="ok")
    slow = [r for r in recs if r["dispatch_ms"] > r["median_ms"]]
    assert len(recs) == 7 and slow, "the page names the calls dispatch outlasts"
    assert built["slow_n"] == f"{len(slow)} of the {len(recs)}"
    for r in slow:
        assert f"dispatch {1e3 * r['dispatch_ms']:.0f} µs, call {1e3 * r['median_ms']:.0f} µs" in built["slow"]
    (c,), (x,) = (store.select(recs, impl=i, dtype="bfloat16") for i in ("cudnn", "xla"))
    word = "slower" if c["p10_ms"] > x["p90_ms"] else "faster" if c["p90_ms"] < x["p10_ms"] else "on par"
    assert built["cudnn_vs_xla"] == ("on par with XLA" if word == "on par" else f"{word} than XLA")
    assert (built["cudnn_us"], built["xla_us"]) == (f"{1e3 * c['median_ms']:.0f} µs", f"{1e3 * x['median_ms']:.0f} µs")
    assert all(f"| {r['dispatch_ms']:.3g} |" in built["seed_table"] for r in recs)


def test_the_recorded_device_time_agrees_within_three_percent_but_one(built):
    recs = store.select(DATA["records"], grid="device_time")
    long = [r for r in recs if r.get("status") == "ok" and r["device_ms"] >= 1.0]
    gaps = [100 * abs(r["traced_wall_ms"] / r["device_ms"] - 1) for r in long]
    assert gaps == pytest.approx([profile.agreement_pct(r) for r in long])
    inside = [g for g in gaps if g <= 3.0]
    assert len(inside) + 1 == len(long)  # one exception, which the page names
    assert built["dev_inside"] == f"{len(inside)} of the {len(long)}"
    assert built["dev_within"] == f"{max(inside):.1f} %"
    far = long[gaps.index(max(gaps))]
    assert (far["impl"], far["causal"]) == ("blockwise", True)
    assert built["far"] == "blockwise JAX (online softmax), with a causal mask"
    assert built["far_idle"] == f"{100 * (1 - far['device_ms'] / far['device_span_ms']):.0f} %"
    assert built["far_pct"] == f"{max(gaps):.1f} %"
    for r in recs:  # the folded table: each call's host clock over its kernels, of the same calls
        assert f"| {r['traced_wall_ms'] / r['device_ms']:.3f} |" in built["dev_table"]
    separate = [1 / r["device_ratio"] for r in long]
    assert built["dev_separate"] == f"{100 * min(separate):.0f}–{100 * max(separate):.0f} %"
