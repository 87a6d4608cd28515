"""The page on shared keys and values: its figures on synthetic records a wrong number would fail, the committed
decode and masks records against the byte and FLOP models, and the numbers the page's cells computed in the last
docs build, set against the committed results read here independently."""

from itertools import pairwise
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from attention_tutorial.kernels.masks import MASK_KINDS
from attention_tutorial.measure.flops import attention_bytes, attention_flops, kv_cache_bytes
from attention_tutorial.measure.grids import points
from attention_tutorial.results import store
from attention_tutorial.results.plotting import label
from attention_tutorial.site import heads
from attention_tutorial.site.claims import TOLERANCES, compare, growth, same_point
from attention_tutorial.site.report import read_ceiling
from tests.built_pages import glued

DATA = store.recorded(store.REFERENCE_GPU)


@pytest.fixture(scope="module")
def built():
    """What the page's cells glued in the last docs build, as Python values (Markdown as its text)."""
    return glued("heads_decode_masks")


def _recs(**where):
    return store.select(DATA["records"], status="ok", **where)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def timed(ms, lo, hi, **kw):
    return {"status": "ok", "median_ms": ms, "p10_ms": lo, "p90_ms": hi, **kw}


# --- GQA


def test_sharing_figure_joins_each_query_head_to_its_kv_head():
    fig = heads.sharing_figure(heads=8, layouts=(("GQA", 2),))
    ax = fig.axes[0]
    lines = [line.get_xydata() for line in ax.get_lines()]
    assert len(lines) == 8
    kv_x = {tuple(line[1]) for line in lines}  # where the lines end: one point per kv head, below its group
    assert kv_x == {(1.5, 0.0), (5.5, 0.0)}
    assert [line[0][0] for line in lines] == list(range(8))
    assert all(line[1][0] == (1.5 if n < 4 else 5.5) for n, line in enumerate(lines))  # heads 0-3 read kv head 0


def test_sharing_figure_gives_every_query_head_its_own_kv_head_in_mha_and_one_in_mqa():
    fig = heads.sharing_figure(heads=4, layouts=(("MHA", 4), ("MQA", 1)))
    mha, mqa = ([tuple(line.get_xydata()[1]) for line in ax.get_lines()] for ax in fig.axes)
    assert mha == [(0.0, 0.0), (1.0, 0.0), (2.0, 0.0), (3.0, 0.0)] and set(mqa) == {(1.5, 0.0)}


# --- decode


# --- masks


def test_mask_weights_spread_evenly_over_the_keys_each_mask_keeps():
    n = 8
    tril = np.tril(np.ones((n, n)))
    uniform = tril / tril.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(heads.mask_weights("none", seq=n), uniform)
    np.testing.assert_allclose(heads.mask_weights("dense", seq=n), uniform)  # the same triangle, given as a matrix
    band = tril * np.triu(np.ones((n, n)), -2)  # a causal window of 2 keys back: j in [i - 2, i]
    np.testing.assert_allclose(heads.mask_weights("window", seq=n, window=2), band / band.sum(axis=1, keepdims=True))
    pad = heads.mask_weights("padding", seq=n)
    kept = int((pad.sum(axis=1) > 0).sum())  # the shorter batch row: its queries past the length see nothing
    assert kept < n and np.allclose(pad[:kept].sum(axis=1), 1) and not pad[kept:].any()
    assert np.all(pad[:, kept:] == 0)
    bias = heads.mask_weights("bias", seq=n)
    np.testing.assert_allclose(bias.sum(axis=1), 1)
    assert np.all(np.triu(bias, 1) == 0)
    assert np.all(np.diff(bias[-1]) > 0)  # ALiBi: the nearer the key, the larger its weight


def test_masks_figure_draws_one_panel_per_kind():
    fig = heads.masks_figure(seq=8, window=2)
    assert len(fig.axes) == len(MASK_KINDS)
    drawn = fig.axes[2].get_images()[0].get_array()
    assert fig.axes[0].get_title() == "causal (is_causal)"
    np.testing.assert_allclose(drawn.filled(0), heads.mask_weights("window", seq=8, window=2))


def msk(impl, mask, causal, ms=None, status="ok", **kw):
    base = {
        "impl": impl,
        "batch": 1,
        "seq_q": 1024,
        "seq_kv": 1024,
        "heads": 2,
        "kv_heads": 2,
        "head_dim": 64,
        "dtype": "bfloat16",
        "causal": causal,
        "pass": "fwd",
        "mask": mask,
        "status": status,
    }
    return {**base, **(timed(ms, ms * 0.99, ms * 1.01) if ms else {"median_ms": None}), **kw}


MASKS = [
    msk("cudnn", "none", True, 0.5),
    msk("cudnn", "dense", False, 1.5),
    msk("cudnn", "dense", True, 0.9),
    msk("cudnn", "window", False, status="unsupported", reason="left only"),
    msk("xla", "none", True, 6.0),
]


def test_masks_cost_figure_bars_are_the_medians_and_a_failure_is_named():
    fig = heads.masks_cost_figure(MASKS)
    causal_ax, plain_ax = fig.axes[0], fig.axes[1]
    assert sorted(round(p.get_height(), 3) for p in causal_ax.patches) == [0.5, 0.9, 6.0]
    assert [round(p.get_height(), 3) for p in plain_ax.patches] == [1.5]
    assert [t.get_text() for t in plain_ax.texts] == ["unsupported"]
    ticks = [t.get_text() for t in plain_ax.get_xticklabels()]
    assert ticks == ["none", "window", "dense\n(causal matrix)"]  # the dense mask is the causal triangle itself


def test_the_page_s_mask_table_lists_every_kind_the_package_builds():
    """The masks table is written in the page: one row per kind of ``MASK_KINDS`` (``"none"`` is the causal row)."""

    from attention_tutorial.kernels.masks import MASK_KINDS

    page = (Path(__file__).resolve().parents[2] / "docs" / "heads_decode_masks.md").read_text(encoding="utf-8")
    table = page.split("| mask | argument |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|")[1].strip() for line in table.strip().splitlines()[1:]]
    assert rows == ["causal" if kind == "none" else kind for kind in MASK_KINDS]


# --- the committed records against the byte and FLOP models


def test_the_recorded_decode_bandwidth_counts_the_fewest_bytes():
    """GB/s × time is the bytes a decode call must move: one kv head moves 32 times fewer at the longest context."""
    at = {r["kv_heads"]: r for r in _recs(grid="decode", impl="cudnn", seq_kv=131072)}
    shape = dict(batch=16, seq_q=1, seq_kv=131072, heads=32, head_dim=128, dtype="bfloat16")
    fewest = attention_bytes(kv_heads=32, **shape) / attention_bytes(kv_heads=1, **shape)
    moved = {k: r["gbps"] * r["median_ms"] for k, r in at.items()}
    assert moved[32] / moved[1] == pytest.approx(fewest, rel=1e-3) and round(fewest) == 32


def test_no_recorded_mask_point_beats_the_peak_when_only_kept_positions_count():
    """A FLOP model that credited work a mask removes would put a point above 100 % of the measured peak."""
    masks = _recs(grid="masks")
    peak = DATA["provenance"]["grids"]["masks"]["matmul_bf16_tflops"]
    assert masks
    for r in masks:
        kept = attention_flops(
            r["batch"], r["seq_q"], r["seq_kv"], r["heads"], r["head_dim"], causal=r["causal"], mask=r["mask"]
        )
        assert r["tflops"] == pytest.approx(kept / (r["median_ms"] * 1e-3) / 1e12, rel=1e-6), (r["impl"], r["mask"])
        assert r["pct_peak"] == pytest.approx(100 * r["tflops"] / peak, rel=1e-6) and r["pct_peak"] < 100


def test_a_gpu_build_s_live_points_are_recorded_points():
    """The page runs its live points from the recorded grids; on a GPU they are set against the recording."""
    recs = DATA["records"]
    for grid in ("decode", "prefill_heads", "masks"):
        for p in points(grid, gpu=True, live=True):
            want = p.as_record()
            assert any(r.get("grid") == grid and all(r.get(f) == v for f, v in want.items()) for r in recs), want


# --- the built page against the committed results: each value as the page shows it


def num(text):  # a number as the page shows it: "4,468", "2.1" -> 4468, 2.1
    return float(str(text).replace(",", ""))


def test_gqa_matches_mha_on_the_h200_and_here(built):
    rows = [r for r in DATA["provenance"]["lessons"]["gqa"] if r["status"] == "ok"]
    exact = [label(r["impl"]) for r in rows if r["max_abs_diff"] == 0]
    close = [r for r in rows if 0 < r["max_abs_diff"] <= TOLERANCES[r["computed_in"]]]
    assert exact and all(name in built["gqa_exact_names"] for name in exact)
    assert close and all(label(r["impl"]) in built["gqa_close_names"] for r in close)
    assert built["gqa_close_largest"] == f"{max(r['max_abs_diff'] for r in close):.1e}"
    assert built["gqa_close_word"].startswith("agree to within") and len(exact) + len(close) == len(rows)
    live, recorded = built["gqa_tables"].split("**Recorded on the GPU:**")
    assert recorded.count("exactly equal") == len(exact) and "differ by more" not in built["gqa_tables"]
    assert live.count("| ok |") >= 2  # naive and XLA run everywhere, cuDNN only on a GPU


def test_the_cache_at_128k_tokens(built):
    memory = DATA["provenance"]["environment"]["gpu_memory_mib"] / 1024
    mha = kv_cache_bytes(32, 128, "bfloat16", layers=32, tokens=131072) / 2**30
    assert (built["kv_mha"], built["kv_gqa"], built["kv_mqa"]) == (f"{mha:.0f}", "4", "32")
    assert (built["kv_mem"], built["kv_pct"]) == (f"{memory:.0f}", f"{100 * mha / memory:.0f}")


def test_decoding_reads_the_cache_near_the_ceiling_and_one_kv_head_is_not_32_times_faster(built):
    cudnn = {(r["kv_heads"], r["seq_kv"]): r for r in _recs(grid="decode", impl="cudnn")}
    assert built["dec_best"] == f"{max(r['gbps'] for r in cudnn.values()):,.0f}" and num(built["dec_best_pct"]) > 95
    mqa, mha = cudnn[1, 131072], cudnn[32, 131072]
    assert (built["dec_s"], built["dec_bytes"]) == ("131,072", "32")
    assert built["dec_speedup"] == f"{mha['median_ms'] / mqa['median_ms']:.0f}"
    assert num(built["dec_speedup"]) < num(built["dec_bytes"]) and compare([mqa], [mha]).word == "faster"
    assert num(built["dec_pct_one"]) < num(built["dec_pct_full"])
    near = min((r for r in cudnn.values() if r["kv_heads"] != 1), key=lambda r: abs(r["median_ms"] - mqa["median_ms"]))
    assert (built["dec_near_k"], built["dec_near_s"]) == (near["kv_heads"], f"{near['seq_kv']:,}")
    assert num(built["dec_near_ms"]) < num(built["dec_one_ms"]) and num(built["dec_near_pct"]) > num(
        built["dec_pct_one"]
    )
    assert (built["dec_streams_one"], built["dec_streams_full"], built["dec_sms"]) == (16, 512, 132)
    for name, k in (("MHA", 32), ("GQA", 8), ("MQA", 1)):
        assert built[f"step_{name}_step"] == f"{32 * cudnn[k, 32768]['median_ms']:.3g}"
    assert built["step_layers"] == 32 and built["step_batch"] == 16  # the 32-layer model of the cache section


def test_short_decode_calls_hit_a_floor_that_xla_does_not(built):
    short = sorted(
        (r for r in _recs(grid="decode", impl="cudnn", kv_heads=1) if r["seq_kv"] < 131072), key=lambda r: r["seq_kv"]
    )
    per_doubling = growth([r["seq_kv"] for r in short], [r["median_ms"] for r in short], var="S")
    assert built["floor_word"] == per_doubling.word == "stays flat"
    assert built["floor_growth"] == f"{per_doubling.value:.2f}"
    assert built["floor_s"] == "2,048, 8,192 and 32,768"
    xla_faster = any(compare(same_point(DATA["records"], r, impl="xla"), [r]).word == "faster" for r in short)
    assert xla_faster and built["floor_owner"].startswith("is cuDNN's own")
    ceiling = read_ceiling(_recs(grid="decode"), DATA["provenance"])
    assert built["floor_ideal"] == f"{max(r['gbps'] * r['median_ms'] for r in short) / ceiling:.3f}"
    assert num(built["floor_ideal"]) < max(r["median_ms"] for r in short) / 1.4  # the time left the bytes behind


def test_the_largest_fall_in_bandwidth(built):
    falls = []
    for impl, k in {(r["impl"], r["kv_heads"]) for r in _recs(grid="decode")}:
        curve = sorted((r["seq_kv"], r["gbps"]) for r in _recs(grid="decode", impl=impl, kv_heads=k))
        falls += [(g0 / g1, impl, k, s0, g0, s1, g1) for (s0, g0), (s1, g1) in pairwise(curve)]
    ratio, impl, k, s0, g0, s1, g1 = max(falls)
    assert ratio >= 1.2 and built["drop_who"] == f"{label(impl)}'s curve with K = {k}"
    assert (built["drop_s_from"], built["drop_s_to"]) == (f"{s0:,}", f"{s1:,}")
    assert (built["drop_from"], built["drop_to"]) == (f"{g0:,.0f}", f"{g1:,.0f}")


def test_prefill_does_the_same_work_whatever_k(built):
    for impl, word in (("cudnn", "on par"), ("xla", "slower")):
        full, one = (_recs(grid="prefill_heads", impl=impl, kv_heads=k) for k in (32, 1))
        assert built[f"pre_{impl}_full"] == f"{full[0]['median_ms']:.2f}"
        assert built[f"pre_{impl}_one"] == f"{one[0]['median_ms']:.2f}"
        assert built[f"pre_{impl}_word"] == compare(one, full).word == word
    assert num(built["ridge"]) < 1000  # thousands of FLOPs per byte either way: right of the ridge


def test_each_mask_against_float64_and_what_it_costs(built):
    assert built["acc_word"].startswith("agree to within") and num(built["acc_worst"]) < 1e-5
    assert all(f"| {kind} |" in built["acc_table"] for kind in MASK_KINDS)
    masks = _recs(grid="masks")

    def one(impl, mask, causal):
        return store.select(masks, impl=impl, mask=mask, causal=causal)

    dense = compare(one("cudnn", "none", True), one("cudnn", "dense", False))
    assert built["dense_word"] == dense.word == "faster" and built["dense_ratio"] == f"{dense.value:.1f}"
    assert built["xla_dense_word"] == compare(one("xla", "none", True), one("xla", "dense", False)).word == "slower"
    assert num(built["win_ms"]) < num(built["causal_ms"]) and num(built["xla_mask_lo"]) <= num(built["xla_causal_ms"])
    assert num(built["xla_none_ms"]) < num(built["xla_mask_lo"])  # XLA skips nothing: every causal call is slower
    failed = [r for r in store.select(DATA["records"], grid="masks") if r["status"] != "ok"]
    assert failed and all(f"the {r['mask']} mask" in built["msk_failed_what"] for r in failed)


def test_each_live_table_runs_two_points(built):
    for key in ("dec_live", "pre_tables", "msk_tables"):
        live = built[key].split("**Live, this build:**")[1].split("\n\nAgainst the recording")[0]
        assert live.split("**Recorded")[0].count("\n| ") - 1 == 2, key  # rows under the header
