"""The warpgroup timeline figure and its numbers, from a synthetic recorded timeline."""

import matplotlib
import pytest

matplotlib.use("Agg")

from attention_tutorial.site import kernel_timeline as kt


def _track(cta, wg, regions):
    return {"cta": cta, "sm": 3 + cta, "warpgroup": wg, "regions": regions}


TIMELINE = {
    "mosaic": {
        "status": "ok",
        "tracks": [
            _track(0, 0, [["qk", 0, 100, 0], ["wait", 20, 60, 1], ["softmax", 100, 300, 0], ["pv", 300, 400, 0]]),
            _track(0, 1, [["wait", 0, 50, 0], ["qk", 50, 150, 0], ["softmax", 150, 350, 0], ["pv", 350, 400, 0]]),
            _track(0, 2, [["copy", 0, 10, 0], ["wait", 10, 300, 0], ["copy", 300, 320, 0]]),
            _track(1, 0, [["qk", 1000, 1100, 0]]),
        ],
    },
    "mosaic_pipe": {
        "status": "ok",
        "tracks": [
            _track(0, 0, [["qk", 0, 80, 0], ["softmax", 80, 200, 0]]),
            _track(0, 1, [["pv", 0, 200, 0]]),
            _track(0, 2, [["copy", 0, 200, 0]]),
        ],
    },
    "other": {"status": "error", "reason": "no GPU"},
}


def test_rows_go_kernel_by_kernel_warpgroup_by_warpgroup_and_keep_the_first_ctas():
    rows = kt.timeline_rows(TIMELINE)
    assert [(r.kernel, r.cta, r.warpgroup) for r in rows] == [("mosaic", 0, w) for w in range(3)] + [
        ("mosaic_pipe", 0, w) for w in range(3)
    ]
    assert [r.compute for r in rows[:3]] == [True, True, False]
    assert rows[0].bars[1] == kt.Bar("wait", 20, 60, 1)
    assert (
        rows[2].label.endswith("copy warpgroup")
        and rows[0].label.startswith("plain")
        and rows[3].label.startswith("pipe")
    )
    assert len(kt.timeline_rows(TIMELINE, ctas=2)) == 7
    assert kt.timeline_rows(TIMELINE, kernels=("mosaic_pipe", "mosaic"))[0].kernel == "mosaic_pipe"


def test_region_shares_count_top_level_time_of_the_compute_warpgroups():
    plain, pipe = kt.region_shares(kt.timeline_rows(TIMELINE))
    assert plain.kernel == "mosaic" and plain.span == 400  # both compute warpgroups span 0..400
    # wg 0: qk 100, softmax 200, pv 100 (its nested wait not counted again); wg 1: wait 50, qk 100, softmax 200, pv 50
    assert plain.shares == pytest.approx({"qk": 200 / 800, "softmax": 400 / 800, "pv": 150 / 800, "wait": 50 / 800})
    assert pipe.span == 200 and pipe.shares == pytest.approx({"qk": 80 / 400, "softmax": 120 / 400, "pv": 200 / 400})


def test_the_figure_draws_one_row_per_warpgroup_each_bar_where_its_region_lies():
    fig = kt.timeline_figure(TIMELINE)
    ax, pipe = fig.axes  # one panel per kernel recorded ok
    plain = kt.timeline_rows(TIMELINE, kernels=("mosaic",))
    assert [t.get_text() for t in ax.get_yticklabels()] == [r.label for r in plain]
    assert pipe.get_yticklabels()[0].get_text().startswith("pipelined")
    bars = [c for c in ax.collections]  # one broken_barh per region
    assert len(bars) == sum(len(r.bars) for r in plain)
    first = bars[0].get_paths()[0].get_extents()  # plain, compute 0, q·kᵀ: 0..100, a full-height row at y = 0
    assert (first.x0, first.x1) == pytest.approx((0, 100)) and first.height == pytest.approx(0.8)
    inner = bars[1].get_paths()[0].get_extents()  # the wait nested inside it: thinner, on top
    assert (inner.x0, inner.x1) == pytest.approx((20, 60)) and inner.height == pytest.approx(0.4)
    colours = {tuple(b.get_facecolor()[0]) for b in bars}
    assert len(colours) == 5  # q·kᵀ, softmax, p·v, wait, copy each their own colour
    assert ax.get_xlim() == (0, 400) and not ax.texts  # the whole run, its bars unnamed
    assert "cycles" in pipe.get_xlabel()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[0].startswith("q·kᵀ") and len(legend) == 5
    with pytest.raises(ValueError, match="no kernel recorded ok"):
        kt.timeline_figure({"mosaic": {"status": "error"}})
    matplotlib.pyplot.close("all")


def test_times_are_cycles_the_warpgroups_start_offset_converted_from_ns():
    # a track recorded 1000 ns after the first, its regions 0 and 100 cycles after its own start
    assert kt.in_cycles([["qk", 1000, 1100, 0], ["wait", 1020, 1060, 1]], clock_ghz=2.0) == [
        ("qk", 2000, 2100, 0),
        ("wait", 2020, 2060, 1),
    ]
    assert kt.in_cycles([]) == []
    cta1 = next(r for r in kt.timeline_rows(TIMELINE, ctas=2, clock_ghz=1.5) if r.cta == 1)
    assert cta1.bars[0] == kt.Bar("qk", 1500, 1600, 0)


def _pingpong_timeline(wg1_offset=150):
    """Two compute warpgroups, softmax 100 cycles every 300, the second ``wg1_offset`` later; matmuls between."""

    def track(wg, offset):
        regions = [["Init", 0, 10, 0]]
        for j in range(3):
            t = offset + 300 * j
            regions += [["softmax", t, t + 100, 0], ["pv", t + 110, t + 200, 0], ["qk", t + 200, t + 290, 0]]
        return _track(0, wg, regions)

    entry = {
        "status": "ok",
        "tiles": {"block_q": 64, "block_kv": 128, "stages": 2},
        "shape": {"head_dim": 128},
        "tracks": [track(0, 20), track(1, 20 + wg1_offset), _track(0, 2, [["copy", 0, 50, 0]])],
    }
    return {"mosaic": entry}


def test_pingpong_measures_softmax_length_period_and_overlap():
    pp = kt.pingpong(_pingpong_timeline())
    assert (pp.softmax, pp.step) == (100, 300)
    assert pp.matmul == 2 * 2 * 64 * 128 * 128 / 4096  # q·kᵀ and p·v of one 64 × 128 block at H = 128
    assert pp.both == 0  # the two softmaxes take turns
    assert pp.either == pytest.approx(600 / 850)  # six softmaxes of 100 over 20..870
    assert pp.softmax_over_matmul == pytest.approx(100 / 1024) and pp.tensor_busy_max == 1.0
    overlapping = kt.pingpong(_pingpong_timeline(wg1_offset=50))
    assert overlapping.both == pytest.approx(3 * 50 / 750)  # each pair overlaps by 50 over 20..770
    assert kt.pingpong({"mosaic": {"status": "error"}}) is None
    assert kt.pingpong(TIMELINE) is None  # one softmax per warpgroup: no period


def test_the_zoom_shows_a_few_key_blocks_from_the_window_start():
    timeline = _pingpong_timeline()
    rows = kt.timeline_rows(timeline)
    assert kt.zoom_window(rows, blocks=1) == (320, 620)  # the middle softmax of warpgroup 0 to the next
    assert kt.zoom_window(rows, blocks=5) == (20, 620)  # fewer follow: up to the last softmax
    with pytest.raises(ValueError, match="fewer than two softmax"):
        kt.zoom_window(kt.timeline_rows(TIMELINE))
    fig = kt.timeline_figure(timeline, blocks=1, kernels=("mosaic",))
    ax = fig.axes[0]
    assert ax.get_xlim() == (0, 300)
    starts = sorted(c.get_paths()[0].get_extents().x0 for c in ax.collections)
    assert 0 in [round(x) for x in starts]  # the window's softmax starts at 0
    assert {t.get_text() for t in ax.texts} >= {"softmax", "p·v", "q·kᵀ"}
    matplotlib.pyplot.close("all")


def test_a_backward_timeline_draws_its_own_regions_each_in_its_colour():
    backward = {
        "mosaic_atomic": {
            "status": "ok",
            "tracks": [
                _track(
                    0, 0, [["qk", 0, 50, 0], ["softmax", 50, 120, 0], ["grads", 120, 220, 0], ["dq_add", 220, 240, 0]]
                ),
                _track(0, 1, [["wait", 0, 40, 0], ["qk", 40, 90, 0], ["grads", 90, 200, 0]]),
                _track(0, 2, [["copy", 0, 10, 0], ["wait", 10, 240, 0]]),
            ],
        }
    }
    fig = kt.timeline_figure(backward, kernels=("mosaic_atomic",))
    ax = fig.axes[0]
    assert ax.get_yticklabels()[0].get_text() == "dQ by atomic adds, CTA 0: compute warpgroup 0"
    colours = [tuple(c.get_facecolor()[0]) for c in ax.collections]
    assert len(set(colours)) == 6  # qk, softmax, grads, dq_add, wait, copy
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(t.startswith("gradient matmuls") for t in legend) and any(t.startswith("dQ's share") for t in legend)
    assert kt.region_shares(kt.timeline_rows(backward, kernels=("mosaic_atomic",)))[0].shares["grads"] == (
        pytest.approx(210 / 440)  # grads 100 + 110 over spans 240 + 200
    )
    matplotlib.pyplot.close("all")


def test_the_backward_shares_read_both_kernels_of_the_pass_and_the_one_of_atomic_adds():
    import matplotlib

    matplotlib.use("Agg")
    entry = TIMELINE["mosaic"]
    back = {"mosaic": {**entry, "dq_tracks": entry["tracks"]}, "mosaic_atomic": entry}
    shares = kt.backward_shares(back)
    assert [name for name, _ in shares] == [name for name, _, _ in kt.BACKWARD_KERNELS]
    assert shares[0][1].span == shares[1][1].span == shares[2][1].span > 0  # the same tracks, read three times
    assert kt.backward_shares({"mosaic": {**entry, "status": "error"}}) == []
    assert [name for name, _ in kt.backward_shares({"mosaic": entry})] == ["dQ by a pass: the dK/dV kernel"]
    fig = kt.backward_figure(shares)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [name for name, _ in shares]
