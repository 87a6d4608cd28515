"""The warpgroup timeline figure and its numbers, from a synthetic recorded timeline."""

import matplotlib
import pytest

matplotlib.use("Agg")

from attention_tutorial.site import kernel_timeline as kt


def _track(cta, wg, regions):
    return {"cta": cta, "sm": 3 + cta, "warpgroup": wg, "regions": regions}


TIMELINE = {
    "mosaic": {"status": "ok", "tracks": [
        _track(0, 0, [["qk", 0, 100, 0], ["wait", 20, 60, 1], ["softmax", 100, 300, 0], ["pv", 300, 400, 0]]),
        _track(0, 1, [["wait", 0, 50, 0], ["qk", 50, 150, 0], ["softmax", 150, 350, 0], ["pv", 350, 400, 0]]),
        _track(0, 2, [["copy", 0, 10, 0], ["wait", 10, 300, 0], ["copy", 300, 320, 0]]),
        _track(1, 0, [["qk", 1000, 1100, 0]]),
    ]},
    "mosaic_pipe": {"status": "ok", "tracks": [
        _track(0, 0, [["qk", 0, 80, 0], ["softmax", 80, 200, 0]]),
        _track(0, 1, [["pv", 0, 200, 0]]),
        _track(0, 2, [["copy", 0, 200, 0]]),
    ]},
    "other": {"status": "error", "reason": "no GPU"},
}  # fmt: skip


def test_rows_go_kernel_by_kernel_warpgroup_by_warpgroup_and_keep_the_first_ctas():
    rows = kt.timeline_rows(TIMELINE)
    assert [(r.kernel, r.cta, r.warpgroup) for r in rows] == [("mosaic", 0, w) for w in range(3)] + [
        ("mosaic_pipe", 0, w) for w in range(3)]  # fmt: skip
    assert [r.compute for r in rows[:3]] == [True, True, False]
    assert rows[0].bars[1] == kt.Bar("wait", 20, 60, 1)
    assert rows[2].label.endswith("copy") and rows[0].label.startswith("plain") and rows[3].label.startswith("pipe")
    assert len(kt.timeline_rows(TIMELINE, ctas=2)) == 7
    assert kt.timeline_rows(TIMELINE, kernels=("mosaic_pipe", "mosaic"))[0].kernel == "mosaic_pipe"
    with pytest.raises(ValueError, match="ctas must be a positive int"):
        kt.timeline_rows(TIMELINE, ctas=0)
    with pytest.raises(TypeError, match="timeline must be the recorded dict"):
        kt.timeline_rows([])


def test_region_shares_count_top_level_time_of_the_compute_warpgroups():
    plain, pipe = kt.region_shares(kt.timeline_rows(TIMELINE))
    assert plain.kernel == "mosaic" and plain.span == 400  # both compute warpgroups span 0..400
    # wg 0: qk 100, softmax 200, pv 100 (its nested wait not counted again); wg 1: wait 50, qk 100, softmax 200, pv 50
    assert plain.shares == pytest.approx({"qk": 200 / 800, "softmax": 400 / 800, "pv": 150 / 800, "wait": 50 / 800})
    assert pipe.span == 200 and pipe.shares == pytest.approx({"qk": 80 / 400, "softmax": 120 / 400, "pv": 200 / 400})


def test_the_figure_draws_one_row_per_warpgroup_each_bar_where_its_region_lies():
    fig = kt.timeline_figure(TIMELINE)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [r.label for r in kt.timeline_rows(TIMELINE)]
    bars = [c for c in ax.collections]  # one broken_barh per region
    assert len(bars) == sum(len(r.bars) for r in kt.timeline_rows(TIMELINE))
    first = bars[0].get_paths()[0].get_extents()  # plain, compute 0, q·kᵀ: 0..100, a full-height row at y = 0
    assert (first.x0, first.x1) == pytest.approx((0, 100)) and first.height == pytest.approx(0.8)
    inner = bars[1].get_paths()[0].get_extents()  # the wait nested inside it: thinner, on top
    assert (inner.x0, inner.x1) == pytest.approx((20, 60)) and inner.height == pytest.approx(0.4)
    colours = {tuple(b.get_facecolor()[0]) for b in bars}
    assert len(colours) == 5  # q·kᵀ, softmax, p·v, wait, copy each their own colour
    assert ax.get_xlim() == (0, 400)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[0].startswith("q·kᵀ") and len(legend) == 5
    with pytest.raises(ValueError, match="no kernel recorded ok"):
        kt.timeline_figure({"mosaic": {"status": "error"}})
    matplotlib.pyplot.close("all")
