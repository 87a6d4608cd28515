"""The online-softmax page: the running max and sum against direct sums, the tiles a causal loop computes and how
the figures draw them; and the numbers its cells computed in the last docs build (the tiled version's errors, the
memory growth, the naive version's bytes and times) against bytes and FLOPs counted here by hand from the committed
results."""

import re

import numpy as np
import pytest
from matplotlib.colors import to_hex

from attention_tutorial.results import store
from attention_tutorial.site import online_softmax as page
from tests.built_pages import glued

DATA = store.recorded()


ROW = np.random.default_rng(3).normal(size=11) * 4  # 11 keys: the last block is short


def direct_steps(row, block):
    """After each block, from direct sums over the keys seen: (running max, the earlier sum moved onto it, the
    block's own sum)."""
    out, before = [], None
    for end in range(block, len(row) + block, block):
        seen = row[: min(end, len(row))]
        m, l = seen.max(), np.exp(seen - seen.max()).sum()
        carried = 0.0 if before is None else before[1] * np.exp(before[0] - m)
        out.append((m, carried, l - carried))
        before = (m, l)
    return out


def test_the_online_softmax_figure_draws_the_running_max_and_the_sums():
    steps = direct_steps(ROW, 4)
    fig = page.online_softmax_figure(ROW, steps, 4)
    top, bottom = fig.axes[:2]
    maxima = [
        seg[0][1]
        for coll in top.collections
        if hasattr(coll, "get_segments")
        for seg in coll.get_segments()
        if seg[0][1] == seg[1][1] and seg[0][0] != seg[1][0]
    ]
    assert maxima == [m for m, _, _ in steps]  # one horizontal segment per block, at the running max
    added = [c.patches[0] for c in bottom.containers][1::2]  # each block: carried below, added on top
    tops = [b.get_y() + b.get_height() for b in added]
    assert tops == pytest.approx([np.exp(ROW[:k] - ROW[:k].max()).sum() for k in (4, 8, 11)])  # l after each block
    assert [t.get_text() for t in top.texts] == ["block 1", "block 2", "block 3"]
    dots = np.concatenate([line.get_ydata() for line in top.get_lines()])
    np.testing.assert_array_equal(dots, ROW)  # every score, the short last block's too


def test_the_tiles_figure_numbers_the_steps_of_one_query_block():
    fig = page.tiles_figure(6, query_block=3)
    plain, causal = ([t.get_text() for t in ax.texts] for ax in fig.axes[:2])
    assert plain == [str(i) for i in range(1, 7)]  # every key block, in order
    assert causal == [str(i) for i in range(1, 5)]  # up to and including the diagonal


@pytest.mark.parametrize("n", [1, 4, 6])
def test_skipped_tiles_are_the_upper_triangle_in_the_legend_s_colour_and_the_followed_row_is_outlined(n):
    fig = page.tiles_figure(n, query_block=n - 1)
    legend = {h.get_label(): to_hex(h.get_facecolor()) for h in fig.legends[0].legend_handles}
    skipped = legend["skipped: never computed"]
    assert skipped == to_hex(page.TILE_COLOURS["skipped"])
    for ax, want in zip(fig.axes[:2], (0, n * (n - 1) // 2)):  # none without the mask; the upper triangle with it
        tiles = [to_hex(p.get_facecolor()) for p in ax.patches if p.get_fill()]
        assert len(tiles) == n * n and tiles.count(skipped) == want
        outline = [p for p in ax.patches if not p.get_fill()]
        assert len(outline) == 1 and outline[0].get_xy() == (0, 0) and outline[0].get_width() == n  # the last row


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
