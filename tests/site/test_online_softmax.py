"""The online-softmax page's numbers: the running max and sum against direct sums, the tiles a causal loop computes
and how the figure colours them, the tiled version's errors, memory growth words, and the naive version's bytes and
times against bytes and FLOPs counted here by hand."""

import itertools

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_hex

from attention_tutorial.measure.roofline import Roof
from attention_tutorial.site import online_softmax as page


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


ROW = np.random.default_rng(3).normal(size=11) * 4  # 11 keys: the last block is short
VALUES = np.random.default_rng(4).normal(size=11)


@pytest.mark.parametrize("block", [1, 3, 4, 11, 20])
def test_each_step_holds_the_max_and_the_sum_of_the_keys_seen(block):
    steps = page.online_softmax_steps(ROW, VALUES, block)
    assert [st.keys_seen for st in steps] == [min(b + block, 11) for b in range(0, 11, block)]
    for st in steps:
        seen = ROW[: st.keys_seen]
        assert st.m == seen.max()
        assert st.l == pytest.approx(np.exp(seen - seen.max()).sum(), rel=1e-12)
        weights = np.exp(seen - seen.max()) / np.exp(seen - seen.max()).sum()
        assert st.out == pytest.approx(weights @ VALUES[: st.keys_seen], rel=1e-12, abs=1e-14)
    # what was carried is the previous sum moved onto the new max
    for before, after in itertools.pairwise(steps):
        assert after.carried == pytest.approx(before.l * np.exp(before.m - after.m), rel=1e-12)
    assert steps[0].carried == 0.0


def test_the_last_step_is_the_full_softmax_even_for_huge_scores():
    big = np.array([1000.0, 999.0, -1000.0, 1001.0])
    out = page.online_softmax_steps(big, np.array([1.0, 2.0, 3.0, 4.0]), 2)[-1].out
    w = np.exp(big - 1001.0)
    assert np.isfinite(out) and out == pytest.approx((w @ [1, 2, 3, 4]) / w.sum(), rel=1e-12)


@pytest.mark.parametrize(
    ("scores", "values", "block", "match"),
    [(np.zeros((2, 3)), np.zeros((2, 3)), 2, "one row"), (np.zeros(3), np.zeros(4), 2, "one equal length"),
     (np.zeros(0), np.zeros(0), 2, "one row"), (np.zeros(3), np.zeros(3), 0, "block must be a positive int"),
     (np.zeros(3), np.zeros(3), 1.5, "block must be a positive int")],
)  # fmt: skip
def test_bad_rows_and_blocks_are_refused(scores, values, block, match):
    with pytest.raises(ValueError, match=match):
        page.online_softmax_steps(scores, values, block)


def test_the_online_softmax_figure_draws_the_running_max_and_the_sums():
    fig = page.online_softmax_figure(ROW, VALUES, 4)
    top, bottom = fig.axes[:2]
    steps = page.online_softmax_steps(ROW, VALUES, 4)
    maxima = [seg[0][1] for coll in top.collections if hasattr(coll, "get_segments")
              for seg in coll.get_segments() if seg[0][1] == seg[1][1] and seg[0][0] != seg[1][0]]  # fmt: skip
    assert maxima == [st.m for st in steps]  # one horizontal segment per block, at the running max
    added = [c.patches[0] for c in bottom.containers][1::2]  # each block: carried below, added on top
    tops = [b.get_y() + b.get_height() for b in added]
    assert tops == pytest.approx([st.l for st in steps])
    assert [t.get_text() for t in top.texts] == [f"block {i + 1}" for i in range(len(steps))]  # as the text counts


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_a_causal_walk_computes_the_triangle_and_masks_the_diagonal(n):
    walk = page.tile_walk(n, n, causal=True)
    kinds = list(walk.values())
    assert kinds.count("full") + kinds.count("masked") == n * (n + 1) // 2
    assert kinds.count("masked") == n and all(walk[i, i] == "masked" for i in range(n))
    assert all(walk[i, j] == "skipped" for i in range(n) for j in range(i + 1, n))
    assert set(page.tile_walk(n, n, causal=False).values()) == {"full"}
    with pytest.raises(ValueError, match="at least one block"):
        page.tile_walk(0, n, causal=True)


def test_the_tiles_figure_numbers_the_steps_of_one_query_block():
    fig = page.tiles_figure(6, 6, query_block=3)
    plain, causal = ([t.get_text() for t in ax.texts] for ax in fig.axes[:2])
    assert plain == [str(i) for i in range(1, 7)]  # every key block, in order
    assert causal == [str(i) for i in range(1, 5)]  # up to and including the diagonal
    with pytest.raises(ValueError, match="query_block"):
        page.tiles_figure(6, 6, query_block=6)


def test_skipped_tiles_have_the_legends_colour_in_every_row_and_the_followed_row_is_outlined():
    fig = page.tiles_figure(6, 6, query_block=3)
    legend = {h.get_label(): to_hex(h.get_facecolor()) for h in fig.legends[0].legend_handles}
    skipped = legend["skipped: never computed"]
    assert skipped == to_hex(page.TILE_COLOURS["skipped"])
    for ax, causal in zip(fig.axes[:2], (False, True)):
        tiles = [p for p in ax.patches if p.get_fill()]
        walk = page.tile_walk(6, 6, causal=causal)
        by_colour = [to_hex(p.get_facecolor()) for p in tiles]
        assert by_colour.count(skipped) == list(walk.values()).count("skipped")  # 15 with the mask, none without
        outline = [p for p in ax.patches if not p.get_fill()]
        assert len(outline) == 1 and outline[0].get_xy() == (0, 2) and outline[0].get_width() == 6  # row 3 of 6


def test_the_tiled_version_agrees_with_float64_and_the_naive_gradients():
    rows = page.exactness(batch=1, seq=40, heads=4, kv_heads=2, head_dim=8, block=16)  # 40: not a multiple of 16
    assert [r["causal"] for r in rows] == [False, True]
    for r in rows:
        assert 0 < r["out_err"] < 1e-5 and 0 <= r["grad_err"] < 1e-5  # float32 rounding (claims.TOLERANCES)


def _temps(impl, pass_, f):
    return [{"impl": impl, "pass": pass_, "seq_q": t, "temp_bytes": f(t)} for t in (512, 1024, 2048, 4096)]


def test_memory_growth_tells_quadratic_from_linear():
    rows = [*_temps("naive", "fwd", lambda t: 6 * t * t), *_temps("blockwise", "fwd", lambda t: 1e6 + 300 * t)]
    got = page.memory_growth(rows)
    assert got["naive", "fwd"].word == "grows quadratically in T"
    assert got["naive", "fwd"].value == pytest.approx(4.0)  # ×4 per doubling of T
    assert "linear in T" in got["blockwise", "fwd"].word and got["blockwise", "fwd"].high < 2.0
    with pytest.raises(ValueError, match="at least two T"):
        page.memory_growth(rows[:1])


def _fwd(impl, median_ms, **over):
    rec = {"impl": impl, "status": "ok", "pass": "fwd", "batch": 8, "seq_q": 4096, "seq_kv": 4096, "heads": 16,
           "kv_heads": 16, "head_dim": 128, "dtype": "bfloat16", "causal": False, "median_ms": median_ms}  # fmt: skip
    return rec | over


def test_the_io_budget_counts_the_scores_bytes_by_hand():
    roof = Roof(peak_tflops=700.0, gbps=4500.0)
    b = page.io_budget(_fwd("naive", 10.0), _fwd("cudnn", 2.0), roof)
    scores = 8 * 16 * 4096 * 4096
    assert b.scores == scores and b.bytes_per_score == 2 * (4 + 2)  # float32 score and bf16 weight, written + read
    io = 4 * 8 * 4096 * 16 * 128 * 2  # q, k, v and the output, bf16
    assert b.io_bytes == io and b.naive_bytes == scores * 12 + io
    assert b.ratio == pytest.approx((scores * 12 + io) / io)
    assert b.bytes_ms == pytest.approx((scores * 12 + io) / 4500e9 * 1e3)
    flops = 4 * 8 * 16 * 4096 * 4096 * 128  # two matmuls, 2 FLOPs per multiply-add
    assert b.matmul_ms == pytest.approx(flops / 700e12 * 1e3)
    assert b.memory_share == pytest.approx(b.bytes_ms / 10.0)
    assert b.memory_word == "more than half"  # 5.86 ms of 10
    assert b.fused_matmul_share == pytest.approx(b.matmul_ms / 2.0)
    slow = page.io_budget(_fwd("naive", 20.0), _fwd("cudnn", 2.0), roof)
    assert slow.memory_word == f"at least {100 * slow.bytes_ms / 20:.0f} %"


def test_the_io_budget_refuses_two_problems_or_two_fused_paths():
    roof = Roof(peak_tflops=700.0, gbps=4500.0)
    with pytest.raises(ValueError, match="differ in \\['seq_q'\\]"):
        page.io_budget(_fwd("naive", 10.0), _fwd("cudnn", 2.0, seq_q=2048), roof)
    with pytest.raises(ValueError, match="writes the scores"):
        page.io_budget(_fwd("cudnn", 2.0), _fwd("cudnn", 2.0), roof)


def test_on_the_recorded_h200_the_naive_version_spends_more_than_half_its_time_moving_bytes():
    from attention_tutorial.results import store
    from attention_tutorial.site.report import reference, reference_roof

    roof = reference_roof()
    seq, _ = reference("seq_long", status="ok", causal=False, batch=8, seq_q=4096)
    at = {r["impl"]: r for r in store.select(seq or [], impl=("naive", "cudnn"))}
    if not roof or len(at) < 2:
        pytest.skip("no recorded reference installed")
    b = page.io_budget(at["naive"], at["cudnn"], roof)
    assert b.memory_word == "more than half" and b.matmul_ms < b.bytes_ms
    assert b.fused_matmul_share > 0.5  # cuDNN's time is mostly its matmuls
