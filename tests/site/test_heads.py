import matplotlib.pyplot as plt
import numpy as np
import pytest

from attention_tutorial.kernels.masks import MASK_KINDS
from attention_tutorial.measure.flops import attention_bytes
from attention_tutorial.results import store
from attention_tutorial.site import heads


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def timed(ms, lo, hi, **kw):
    return {"status": "ok", "median_ms": ms, "p10_ms": lo, "p90_ms": hi, **kw}


def dec(impl, k, s, ms, lo, hi, gbps, pct=None, **kw):
    point = {"impl": impl, "batch": 16, "seq_q": 1, "seq_kv": s, "heads": 32, "kv_heads": k, "head_dim": 128,
             "dtype": "bfloat16", "causal": False, "pass": "fwd", "mask": "none", "gbps": gbps}  # fmt: skip
    if pct is not None:
        point["pct_read"] = pct
    return {**point, **timed(ms, lo, hi), **kw}


# --- GQA


def test_kv_head_of_groups_consecutive_query_heads():
    np.testing.assert_array_equal(heads.kv_head_of(8, 2), [0, 0, 0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(heads.kv_head_of(8, 8), np.arange(8))
    np.testing.assert_array_equal(heads.kv_head_of(8, 1), np.zeros(8))


@pytest.mark.parametrize("n, k", [(8, 3), (8, 0), (4, 8)])
def test_kv_head_of_names_a_bad_split(n, k):
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        heads.kv_head_of(n, k)


def test_sharing_figure_joins_each_query_head_to_its_kv_head():
    fig = heads.sharing_figure(heads=8, layouts=(("GQA", 2),))
    ax = fig.axes[0]
    lines = [line.get_xydata() for line in ax.get_lines()]
    assert len(lines) == 8
    kv_x = {tuple(line[1]) for line in lines}  # where the lines end: one point per kv head, below its group
    assert kv_x == {(1.5, 0.0), (5.5, 0.0)}
    assert [line[0][0] for line in lines] == list(range(8))
    assert all(line[1][0] == (1.5 if n < 4 else 5.5) for n, line in enumerate(lines))


def test_gqa_table_and_check_judge_each_difference_against_its_own_precision():
    rows = [{"impl": "xla", "status": "ok", "computed_in": "bfloat16", "max_abs_diff": 4.9e-4, "reason": None},
            {"impl": "naive", "status": "ok", "computed_in": "float32", "max_abs_diff": 4.9e-4, "reason": None},
            {"impl": "cudnn", "status": "ok", "computed_in": "bfloat16", "max_abs_diff": 0.0, "reason": None},
            {"impl": "te", "status": "unsupported", "computed_in": "bfloat16", "max_abs_diff": None, "reason": "no TE"}]  # fmt: skip
    table = heads.gqa_table(rows)
    assert table[0]["implementation"] == "XLA" and table[0]["verdict"].startswith("agree to within bfloat16")
    assert table[1]["verdict"].startswith("differ by more than float32")
    assert table[3]["max |GQA − MHA|"] == "—" and table[3]["verdict"] == "no TE"
    check = heads.gqa_check(rows)
    assert (check.ran, check.agree, check.exact, check.largest) == (3, 2, 1, 4.9e-4)
    assert check.word == "differ"
    assert (check.exact_impls, check.close_impls, check.differ_impls) == (("cudnn",), ("xla",), ("naive",))
    assert check.largest_close == 4.9e-4
    assert heads.gqa_check(rows[:1] + rows[2:]).word == "agree"
    assert heads.gqa_check(rows[2:3]).largest_close == 0.0
    assert heads.gqa_check(rows[3:]) is None


def test_names_lists_implementations_in_words():
    assert heads.names(()) == ""
    assert heads.names(["cudnn"]) == "cuDNN"
    assert heads.names(["naive", "xla"]) == "naive (from scratch) and XLA"
    assert heads.names(["xla", "cudnn", "te"]) == "XLA, cuDNN and TransformerEngine"


# --- KV cache


def test_kv_cache_counts_kv_heads_only():
    prov = {"gpu": "NVIDIA H200", "environment": {"gpu_memory_mib": 143771}}
    c = heads.kv_cache(prov, tokens=131072)
    assert c.mha_gib == 2 * 32 * 32 * 128 * 2 * 131072 / 2**30 == 64  # k and v, layers, K, H, bf16 bytes, tokens
    assert (c.gqa_factor, c.mqa_factor) == (4, 32)
    assert c.pct_of_memory == pytest.approx(100 * 64 / (143771 / 1024))
    assert heads.kv_cache(None).pct_of_memory is None and heads.kv_cache({}).gpu is None


def test_kv_cache_figure_plots_the_counted_bytes_and_the_memory_line():
    prov = {"gpu": "G", "environment": {"gpu_memory_mib": 2048}}
    fig = heads.kv_cache_figure(prov, kv_heads=(32, 1), contexts=(1024, 4096))
    lines = fig.axes[0].get_lines()
    np.testing.assert_allclose(lines[0].get_ydata(), [0.5, 2.0])  # 512 KiB per token
    np.testing.assert_allclose(lines[1].get_ydata(), [1 / 64, 1 / 16])  # 16 KiB per token
    assert list(lines[2].get_ydata()) == [2.0, 2.0]  # 2048 MiB of memory, dashed
    assert len(heads.kv_cache_figure(None, kv_heads=(1,), contexts=(1024,)).axes[0].get_lines()) == 1


# --- decode


DECODE = [
    dec("cudnn", 32, 2048, 0.13, 0.129, 0.131, 4000, 90.0),
    dec("cudnn", 32, 131072, 8.0, 7.9, 8.1, 4300, 96.0),
    dec("cudnn", 1, 2048, 0.060, 0.059, 0.061, 290, 6.5),
    dec("cudnn", 1, 8192, 0.062, 0.061, 0.063, 1080, 24.0),
    dec("cudnn", 1, 131072, 0.30, 0.29, 0.31, 3600, 80.0),
    dec("xla", 1, 2048, 0.058, 0.050, 0.064, 300),
    dec("xla", 1, 8192, 0.047, 0.046, 0.048, 1400),
]


def test_best_bandwidth_picks_the_highest_gbps_of_one_implementation():
    b = heads.best_bandwidth(DECODE, "cudnn")
    assert (b.seq_kv, b.kv_heads, b.gbps, b.pct_read) == (131072, 32, 4300, 96.0)
    assert heads.best_bandwidth(DECODE, "te") is None


def test_with_range_puts_the_spread_in_one_column():
    rows = heads.with_range([DECODE[0], {"impl": "cudnn", "status": "unsupported"}])
    assert rows[0][heads.RANGE] == "0.129–0.131" and rows[1][heads.RANGE] == "–"
    assert heads.RANGE not in DECODE[0]  # copies: the records stay as they were


def test_shared_cache_sets_one_kv_head_against_mha_at_the_longest_common_context():
    c = heads.shared_cache(DECODE)
    assert (c.seq_kv, c.kv_full) == (131072, 32)
    assert c.bytes_ratio == pytest.approx(4300 * 8.0 / (3600 * 0.30))  # bytes = GB/s × time
    assert c.speedup.value == pytest.approx(8.0 / 0.30) and c.speedup.word == "faster"
    assert (c.one.pct_read, c.full.pct_read) == (80.0, 96.0)
    # the call of another K closest in time to K = 1's 0.30 ms is K = 32 at S = 2048 (0.13 ms)
    assert (c.near.kv_heads, c.near.seq_kv) == (32, 2048) and c.near_vs_one.value == pytest.approx(0.30 / 0.13)
    assert (c.streams_one, c.streams_full) == (16, 16 * 32)  # B × K separate k/v streams
    assert heads.shared_cache([r for r in DECODE if r["kv_heads"] == 1]) is None
    assert heads.shared_cache([]) is None


def test_decode_floor_reads_the_shorter_calls_and_the_other_path_at_the_same_points():
    f = heads.decode_floor(DECODE, 4500.0)
    assert f.seq_kv == (2048, 8192) and (f.ms_low, f.ms_high) == (0.060, 0.062)
    assert f.per_doubling.word == "stays flat"
    assert f.ideal_ms == pytest.approx(1080 * 0.062 / 4500)
    assert [(s, a, b, c.word) for s, a, b, c in f.other_vs] == [(2048, 0.060, 0.058, "on par"),
                                                                 (8192, 0.062, 0.047, "faster")]  # fmt: skip
    assert f.own  # XLA is faster outside both spreads at S = 8192
    slow_xla = [r for r in DECODE if r["impl"] != "xla"] + [dec("xla", 1, 8192, 0.07, 0.069, 0.071, 900)]
    assert not heads.decode_floor(slow_xla, 4500.0).own
    assert heads.decode_floor(DECODE, None) is None
    assert heads.decode_floor(DECODE[:3], 4500.0) is None  # one shorter call: no floor to read


def test_decode_figure_draws_each_series_a_marker_per_k_and_the_read_ceiling_only():
    recs = [*DECODE, dec("cudnn", 8, 2048, 0.08, 0.079, 0.081, 1600)]
    fig = heads.decode_figure(recs, read_gbps=4500)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    np.testing.assert_array_equal(lines["cuDNN, K = 1"].get_xydata(), [[2048, 290], [8192, 1080], [131072, 3600]])
    ceiling = lines["read ceiling (4500 GB/s)"]
    assert list(ceiling.get_ydata()) == [4500, 4500] and ceiling.get_marker() in ("None", "", None)
    assert ceiling.get_linestyle() == "--"
    assert len(lines) == 5 and "XLA, K = 32" not in lines  # four curves and one ceiling: no copy ceiling
    markers = {k: lines[f"cuDNN, K = {k}"].get_marker() for k in (32, 8, 1)}
    assert len(set(markers.values())) == 3 and lines["XLA, K = 1"].get_marker() == markers[1]  # a marker per K
    assert {line.get_linestyle() for name, line in lines.items() if "ceiling" not in name} == {"-"}
    assert lines["cuDNN, K = 1"].get_color() != lines["XLA, K = 1"].get_color()  # a colour per implementation


def test_largest_drop_names_the_curve_that_falls_most_between_neighbouring_contexts():
    recs = [*DECODE, dec("xla", 32, 32768, 2.15, 2.14, 2.16, 3995), dec("xla", 32, 131072, 27.7, 27.6, 27.8, 1240)]
    d = heads.largest_drop(recs)
    assert (d.impl, d.kv_heads, d.seq_from, d.gbps_from, d.seq_to, d.gbps_to) == ("xla", 32, 32768, 3995, 131072, 1240)
    assert d.ratio == pytest.approx(3995 / 1240)
    assert heads.largest_drop(DECODE) is None  # every curve rises with S
    dip = [*DECODE, dec("cudnn", 1, 262144, 0.62, 0.61, 0.63, 3400)]  # 3600 -> 3400: within at_least
    assert heads.largest_drop(dip) is None and heads.largest_drop(dip, at_least=1.05).seq_to == 262144


def test_decode_steps_give_each_kv_head_count_its_time_per_layer_and_per_step():
    recs = [*DECODE, dec("cudnn", 8, 131072, 1.9, 1.89, 1.91, 4450)]
    steps = heads.decode_steps(recs, 131072, layers=32)
    assert [(s.name, s.kv_heads, s.layer_ms, s.batch) for s in steps] == [("MHA", 32, 8.0, 16), ("GQA", 8, 1.9, 16),
                                                                         ("MQA", 1, 0.30, 16)]  # fmt: skip
    assert steps[1].step_ms == pytest.approx(1.9 * 32)
    assert [s.name for s in heads.decode_steps(DECODE, 8192)] == ["MQA"]  # only K = 1 ran there
    assert heads.decode_steps(DECODE, 4096) == [] and heads.decode_steps(DECODE, 131072, impl="te") == []


def test_live_check_pairs_exact_points_and_judges_from_both_spreads():
    live = [dec("cudnn", 1, 131072, 0.33, 0.329, 0.331, 3300), dec("cudnn", 1, 131072, 0.2, 0.2, 0.2, 3, batch=4),
            dec("cudnn", 32, 2048, 0.1305, 0.1295, 0.1315, 4000), dec("cudnn", 8, 2048, 1, 1, 1, 1)]  # fmt: skip
    rows = heads.live_check(live, DECODE)
    assert [(r["kv_heads"], r["verdict"]) for r in rows] == [(1, "slower"), (32, "on par")]
    assert rows[0]["recorded_ms"] == 0.30 and rows[0]["live_over_recorded"] == pytest.approx(0.33 / 0.30)


def test_live_points_match_the_recorded_grids_on_a_gpu():
    recs = store.recorded(store.REFERENCE_GPU)["records"]
    for section, grid in (("decode", "decode"), ("prefill", "prefill_heads"), ("masks", "masks")):
        for p in heads.live_points(section, gpu=True):
            want = p.as_record()
            assert any(r.get("grid") == grid and all(r.get(f) == v for f, v in want.items()) for r in recs), want
        assert len(heads.live_points(section, gpu=False)) == 2
    with pytest.raises(ValueError, match="section"):
        heads.live_points("train", gpu=False)


# --- prefill


PREFILL = [timed(1.87, 1.85, 1.88, impl="cudnn", kv_heads=32), timed(1.86, 1.84, 1.88, impl="cudnn", kv_heads=1),
           timed(7.3, 7.29, 7.4, impl="xla", kv_heads=32), timed(9.4, 9.35, 9.41, impl="xla", kv_heads=1)]  # fmt: skip


def test_prefill_heads_compares_one_kv_head_with_mha_from_the_spreads():
    c = heads.prefill_heads(PREFILL, "cudnn")
    assert (c.kv_full, c.ms_full, c.ms_one, c.change.word) == (32, 1.87, 1.86, "on par")
    x = heads.prefill_heads(PREFILL, "xla")
    assert x.change.word == "slower" and x.change.value == pytest.approx(7.3 / 9.4)
    assert heads.prefill_heads(PREFILL[:1], "cudnn") is None and heads.prefill_heads(PREFILL, "te") is None


def test_prefill_figure_bars_are_the_medians():
    fig = heads.prefill_figure(PREFILL)
    heights = sorted(round(p.get_height(), 3) for p in fig.axes[0].patches)
    assert heights == [1.86, 1.87, 7.3, 9.4]


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


def test_mask_accuracy_checks_every_kind_against_the_float64_reference():
    rows = heads.mask_accuracy("xla", seq=32, window=4)
    assert [r["mask"] for r in rows] == list(MASK_KINDS)
    assert all(r["max_abs_error"] < 1e-5 and r["verdict"].startswith("agree to within") for r in rows)


def msk(impl, mask, causal, ms=None, status="ok", **kw):
    base = {"impl": impl, "batch": 1, "seq_q": 1024, "seq_kv": 1024, "heads": 2, "kv_heads": 2, "head_dim": 64,
            "dtype": "bfloat16", "causal": causal, "pass": "fwd", "mask": mask, "status": status}  # fmt: skip
    return {**base, **(timed(ms, ms * 0.99, ms * 1.01) if ms else {"median_ms": None}), **kw}


MASKS = [msk("cudnn", "none", True, 0.5), msk("cudnn", "dense", False, 1.5), msk("cudnn", "dense", True, 0.9),
         msk("cudnn", "window", False, status="unsupported", reason="left only"), msk("xla", "none", True, 6.0)]  # fmt: skip


def test_kept_tflops_counts_only_the_positions_the_mask_keeps():
    prov = {"matmul_bf16_tflops": 1000.0, "grids": {"masks": {"matmul_bf16_tflops": 500.0}}}
    out = heads.kept_tflops(MASKS, prov)
    causal_flops = 4 * 2 * 64 * (1024 * 1025 // 2)  # B · N · 4H per kept position, the causal triangle
    assert out[0]["tflops"] == pytest.approx(causal_flops / 0.5e-3 / 1e12)
    assert out[0]["pct_peak"] == pytest.approx(100 * out[0]["tflops"] / 500)  # the masks grid's own peak
    assert out[1]["tflops"] == pytest.approx(causal_flops / 1.5e-3 / 1e12)  # the dense mask is the triangle
    assert out[3] == MASKS[3] and MASKS[0].get("tflops") is None  # failures unchanged, inputs untouched
    assert heads.kept_tflops(MASKS[:1], {})[0]["pct_peak"] is None


def test_mask_costs_read_one_implementations_times():
    recs = [*MASKS, msk("xla", "none", False, 3.7), msk("xla", "dense", False, 4.5), msk("xla", "bias", True, 5.8)]
    x = heads.mask_costs(recs, "xla")
    assert (x.plain_ms, x.causal_ms, x.masked_low, x.masked_high, x.dense_ms) == (3.7, 6.0, 5.8, 6.0, 4.5)
    assert x.dense_vs_causal.word == "slower"  # through XLA, is_causal is slower than the same triangle as a matrix
    c = heads.mask_costs(MASKS, "cudnn")
    assert (c.causal_ms, c.masked_low, c.masked_high, c.dense_ms, c.window_ms) == (0.5, 0.5, 0.9, 1.5, None)
    assert c.dense_vs_causal.word == "faster" and c.plain_ms is None
    assert heads.mask_costs(MASKS, "te") == heads.MaskCosts("te", None, None, None, None, None, None, None)


def test_dense_vs_causal_failed_and_over_peak():
    c = heads.dense_vs_causal(MASKS)
    assert c.value == pytest.approx(3.0) and c.word == "faster"
    assert heads.dense_vs_causal(MASKS[1:]) is None
    assert [r["mask"] for r in heads.failed(MASKS)] == ["window"]
    assert heads.over_peak([{**MASKS[0], "pct_peak": 101.0}, {**MASKS[1], "pct_peak": 99.0}]) == [
        {**MASKS[0], "pct_peak": 101.0}
    ]


def test_masks_cost_figure_bars_are_the_medians_and_a_failure_is_named():
    fig = heads.masks_cost_figure(MASKS)
    causal_ax, plain_ax = fig.axes[0], fig.axes[1]
    assert sorted(round(p.get_height(), 3) for p in causal_ax.patches) == [0.5, 0.9, 6.0]
    assert [round(p.get_height(), 3) for p in plain_ax.patches] == [1.5]
    assert [t.get_text() for t in plain_ax.texts] == ["unsupported"]
    ticks = [t.get_text() for t in plain_ax.get_xticklabels()]
    assert ticks == ["none", "window", "dense\n(causal matrix)"]  # the dense mask is the causal triangle itself


# --- the recorded file


def test_the_recorded_decode_grid_moves_32_times_fewer_bytes_with_one_kv_head():
    data = store.recorded(store.REFERENCE_GPU)
    decode = store.select(data["records"], grid="decode")
    c = heads.shared_cache(decode)
    shape = dict(batch=16, seq_q=1, seq_kv=c.seq_kv, heads=32, head_dim=128, dtype="bfloat16")
    fewest = attention_bytes(kv_heads=32, **shape) / attention_bytes(kv_heads=1, **shape)
    assert c.bytes_ratio == pytest.approx(fewest, rel=1e-3)


def test_no_recorded_mask_point_beats_the_peak_when_only_kept_positions_count():
    """A FLOP model that credited work a mask removes would put a point above 100 % of the measured peak."""
    data = store.recorded(store.REFERENCE_GPU)
    masks = heads.kept_tflops(store.select(data["records"], grid="masks"), data["provenance"])
    assert [r for r in masks if r.get("status") == "ok"] and heads.over_peak(masks) == []


def test_the_page_s_mask_table_lists_every_kind_the_package_builds():
    """The masks table is written in the page: one row per kind of ``MASK_KINDS`` (``"none"`` is the causal row)."""
    from pathlib import Path

    from attention_tutorial.kernels.masks import MASK_KINDS

    page = (Path(__file__).resolve().parents[2] / "docs" / "heads_decode_masks.md").read_text(encoding="utf-8")
    table = page.split("| mask | argument |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|")[1].strip() for line in table.strip().splitlines()[1:]]
    assert rows == ["causal" if kind == "none" else kind for kind in MASK_KINDS]
