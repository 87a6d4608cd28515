"""The online-softmax page: the running max and sum against direct sums, the tiles a causal loop computes and how
the figures draw them; and the numbers its cells computed in the last docs build (the tiled version's errors, the
memory growth, the naive version's bytes and times) against bytes and FLOPs counted here by hand from the committed
results."""

import itertools
import re

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_hex

from attention_tutorial.results import store
from attention_tutorial.site import online_softmax as page
from tests.built_pages import glued

DATA = store.recorded()


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
    [
        (np.zeros((2, 3)), np.zeros((2, 3)), 2, "one row"),
        (np.zeros(3), np.zeros(4), 2, "one equal length"),
        (np.zeros(0), np.zeros(0), 2, "one row"),
        (np.zeros(3), np.zeros(3), 0, "block must be a positive int"),
        (np.zeros(3), np.zeros(3), 1.5, "block must be a positive int"),
    ],
)
def test_bad_rows_and_blocks_are_refused(scores, values, block, match):
    with pytest.raises(ValueError, match=match):
        page.online_softmax_steps(scores, values, block)


def test_the_online_softmax_figure_draws_the_running_max_and_the_sums():
    fig = page.online_softmax_figure(ROW, VALUES, 4)
    top, bottom = fig.axes[:2]
    steps = page.online_softmax_steps(ROW, VALUES, 4)
    maxima = [
        seg[0][1]
        for coll in top.collections
        if hasattr(coll, "get_segments")
        for seg in coll.get_segments()
        if seg[0][1] == seg[1][1] and seg[0][0] != seg[1][0]
    ]
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


# --- the built page against hand counts


@pytest.fixture(scope="module")
def built():
    """What the page's cells glued in the last docs build, as Python values (Markdown as its text)."""
    return glued("online_softmax")


def test_the_walk_and_the_tiles_as_the_page_counts_them(built):
    s = np.random.default_rng(0).normal(size=12) * 3  # the page's row
    m = [s[: 4 * (i + 1)].max() for i in range(3)]
    jump = next(i for i in range(1, 3) if m[i] > m[i - 1])
    assert built["jump_block"] == str(jump + 1)
    assert built["carried_share"] == f"{100 * np.exp(m[jump - 1] - m[jump]):.0f} %"  # l, moved onto the new max
    assert built["causal_share"] == f"{100 * 21 / 36:.0f} %"  # 6 × 6 tiles: the lower triangle and the diagonal
    assert float(built["online_diff"]) < 1e-15


def test_the_tiled_version_agrees_with_float64_and_the_naive_gradients(built):
    assert built["exact_shape"].startswith("B = 2, T = S = 300, N = 8 query heads sharing K = 2 kv heads, H = 64")
    worst = float(re.match(r"[\d.e+-]+", built["exact_worst"]).group())
    assert 0 < worst < 1e-5  # float32 rounding (claims.TOLERANCES), also for tf32 matmuls on a GPU build
    assert built["exact_word"] == "agree to within float32 rounding"


def test_the_naive_memory_grows_quadratically_and_the_blockwise_linearly(built):
    assert built["mem_naive_fwd"].startswith("grows quadratically in T, ×4.0")
    assert "linear in T" in built["mem_blockwise_fwd"] and "quadratic" not in built["mem_blockwise_fwd"]


def test_the_io_numbers_against_bytes_and_flops_counted_by_hand(built):
    from attention_tutorial.site.report import reference_roof

    if DATA is None:
        pytest.skip("no recorded results")
    at = store.select(DATA["records"], grid="seq_long", status="ok", causal=False, batch=8, seq_q=4096)
    (naive,), (cudnn,) = (store.select(at, impl=i) for i in ("naive", "cudnn"))
    B, T, N, H = naive["batch"], naive["seq_q"], naive["heads"], naive["head_dim"]
    scores = B * N * T * T
    io = 4 * B * T * N * H * 2  # q, k, v and the output, bf16
    moved = scores * (4 + 2) * 2 + io  # a float32 score and a bf16 weight, each written and read once
    roof = reference_roof()
    assert built["io_shape"] == f"B = {B}, T = S = {T}, N = {N}, H = {H}, bf16"
    assert built["io_arith"] == (
        f"{B} · {N} · {T} · {T} scores × 12 bytes = {scores * 12 / 1e9:.1f} GB, plus "
        f"{io / 1e9:.2f} GB for q, k, v and the output"
    )
    assert built["io_naive_gb"] == f"{moved / 1e9:.1f} GB" and built["io_ratio"] == f"{moved / io:.0f}×"
    bytes_ms = moved / (roof.gbps * 1e9) * 1e3
    flops = 4 * B * N * T * T * H  # two matmuls, 2 FLOPs per multiply-add
    matmul_ms = flops / (roof.peak_tflops * 1e12) * 1e3
    assert built["io_naive_bytes_ms"] == f"{bytes_ms:.1f} ms" and built["io_naive_ms"] == f"{naive['median_ms']:.1f} ms"
    assert built["io_memory_word"] == "more than half" and bytes_ms > naive["median_ms"] / 2 > matmul_ms
    assert built["io_matmul_ms"] == f"{matmul_ms:.2f} ms" and built["io_cudnn_ms"] == f"{cudnn['median_ms']:.2f} ms"
    assert (
        built["io_cudnn_share"] == f"{100 * matmul_ms / cudnn['median_ms']:.0f} %"
        and matmul_ms > cudnn["median_ms"] / 2
    )
    assert built["io_read"] == f"{roof.gbps / 1e3:.2f} TB/s" and built["io_peak"] == f"{roof.peak_tflops:.0f} TFLOP/s"
