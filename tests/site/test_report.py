"""What the pages show from the recorded file: filtering, merging grids, and the label naming each grid's run."""

import pytest

from attention_tutorial.results import store
from attention_tutorial.site import report

PROV = {
    "gpu": "NVIDIA H200",
    "driver": "580",
    "jax": "0.11.2",
    "jaxlib": "0.11.2",
    "cudnn": "9.19.0",
    "transformer_engine": None,
    "python": "3.12.3",
    "created": "2026-12-02T18:00:00+00:00",
    "command": "record",
    "matmul_bf16_tflops": 700.0,
    "copy_gbps": 3300.0,
    "grids": {
        "te": {"created": "2026-12-02T17:00:00+00:00", "transformer_engine": "2.20.2", "matmul_bf16_tflops": 680.0}
    },
}


def _rec(grid, impl, seq_q, head_dim=128):
    return {
        "grid": grid,
        "impl": impl,
        "batch": 1,
        "seq_q": seq_q,
        "seq_kv": seq_q,
        "heads": 1,
        "kv_heads": 1,
        "head_dim": head_dim,
        "dtype": "bfloat16",
        "causal": False,
        "pass": "fwd",
        "status": "ok",
        "median_ms": 1.0,
        "p10_ms": 0.9,
        "p90_ms": 1.1,
        "tflops": 100.0,
    }


RECORDS = [
    _rec("flash", "mosaic", 4096),
    _rec("flash", "mosaic", 4096, 64),
    _rec("seq_long", "xla", 4096),
    _rec("seq_long", "xla", 2048),
    _rec("seq_long", "cudnn", 4096),
    _rec("te", "te", 4096),
]


@pytest.fixture
def recorded(monkeypatch):
    monkeypatch.setattr(store, "recorded", lambda gpu: {"provenance": PROV, "records": RECORDS})


def test_reference_filters_by_grid_and_fields(recorded):
    recs, prov = report.reference("seq_long", impl="xla")
    assert [r["seq_q"] for r in recs] == [4096, 2048] and prov is PROV


def test_recorded_facts_name_the_gpu_the_count_and_the_versions(recorded, monkeypatch):
    assert report.recorded_facts() == {
        "recorded_gpu": "NVIDIA H200",
        "recorded_count": "6",
        "recorded_versions": "JAX 0.11.2, cuDNN 9.19.0",
        "recorded_kernel_speed": "not yet measured",
    }
    monkeypatch.setattr(store, "recorded", lambda gpu: None)
    assert report.recorded_facts()["recorded_gpu"] == "no GPU yet"


def test_recorded_facts_give_our_forwards_speed_against_cudnn_at_long_sequences(monkeypatch):
    def rec(impl, t, ms, causal=False, h=128):
        return {**_rec("beyond", impl, t, h), "causal": causal, "median_ms": ms, "p10_ms": ms, "p90_ms": ms}

    # cuDNN over ours: 0.97 and 1.01 at T >= 8192; T = 4096 and H = 64 are left out
    records = [
        rec("cudnn", 8192, 0.97),
        rec("mosaic", 8192, 1.0),
        rec("cudnn", 16384, 1.01, True),
        rec("mosaic", 16384, 1.0, True),
        rec("cudnn", 4096, 0.5),
        rec("mosaic", 4096, 1.0),
        rec("cudnn", 8192, 2.0, h=64),
        rec("mosaic", 8192, 1.0, h=64),
    ]
    monkeypatch.setattr(store, "recorded", lambda gpu: {"provenance": PROV, "records": records})
    assert report.recorded_facts()["recorded_kernel_speed"] == "97–101 %"


def test_with_datasheet_divides_by_the_dtype_s_datasheet_peak():
    bf16 = {"dtype": "bfloat16", "tflops": 494.7, "pct_peak": 70.65}
    fp8 = {"dtype": "float8_e4m3fn", "tflops": 989.45, "pct_peak": 70.65}
    out = report.with_datasheet([bf16, fp8, {"dtype": "bfloat16", "status": "oom"}], "NVIDIA H200")
    assert [r["pct_datasheet"] for r in out] == [pytest.approx(50.0), pytest.approx(50.0), None]
    assert report.with_datasheet([bf16], None)[0]["pct_datasheet"] is None  # a CPU: no datasheet peak


def test_both_bases_puts_the_datasheet_axis_on_a_percent_plot_of_one_recording_run():
    import matplotlib.pyplot as plt

    from attention_tutorial.results.plotting import plot_records

    recs = [{**_rec("seq_long", "cudnn", t), "tflops": 600.0, "pct_peak": 100 * 600.0 / 700.0} for t in (1024, 4096)]
    plot = {"x": "seq_q", "y": "pct_peak", "by": ("impl",)}
    fig = plot_records(recs, **plot)
    report.both_bases(fig, recs, plot, "NVIDIA H200")
    (right,) = fig.axes[0].child_axes  # the secondary axis: % of the datasheet peak
    assert right.get_ylabel().startswith("% of datasheet peak (989")
    fig.canvas.draw()  # the secondary axis takes its limits from the main one, converted
    low, high = fig.axes[0].get_ylim()
    assert right.get_ylim() == pytest.approx((low * 700.0 / 989.4, high * 700.0 / 989.4))
    plt.close(fig)
    two_runs = [*recs, {**recs[0], "seq_q": 2048, "pct_peak": 100 * 600.0 / 680.0}]  # no one factor converts them
    for records, gpu, y in (
        (recs, None, "pct_peak"),
        (two_runs, "NVIDIA H200", "pct_peak"),
        (recs, "NVIDIA H200", "tflops"),
    ):
        fig = plot_records(records, **{**plot, "y": y})
        report.both_bases(fig, records, {**plot, "y": y}, gpu)
        assert not fig.axes[0].child_axes  # a CPU, two recording runs, a TFLOP/s plot: nothing added
        plt.close(fig)


def test_shapes_in_words():
    assert report.shapes(RECORDS[:2]) == "B = 1, T = S = 4096, N = 1, H = 64, 128, bfloat16, no mask"
    assert report.shapes([_rec("x", "xla", t) for t in (64, 128, 256, 512)]).startswith("B = 1, T = S = 64…512")


def test_train_rows_format_ok_and_failed_runs():
    ok = {
        "impl": "mosaic",
        "status": "ok",
        "median_ms": 52.4,
        "tokens_per_s": 312797.1,
        "tflops": 100.7,
        "step_bytes": 3 * 2**20,
        "peak_bytes": 4 * 2**30,
        "final_loss": 2.4442,
        "eval_loss_init": 5.61,
        "eval_loss": 2.5,
        "attention_kernel": "mosaic_gpu",
    }
    failed = {"impl": "pallas", "status": "error", "median_ms": None, "tflops": None, "reason": "no kernel"}
    rows = report.train_rows([ok, failed])
    assert rows[0]["tokens/s"] == "312,797" and rows[0]["peak memory (MiB)"] == "4096.0"
    assert rows[0]["final loss"] == "2.444" and rows[0]["held-out loss"] == "5.610 → 2.500"
    assert rows[0]["kernel"] == "mosaic_gpu"
    assert rows[1]["tokens/s"] == rows[1]["final loss"] == "–" and rows[1]["kernel"] == "no kernel"
    unevaluated = {**ok, "eval_loss_init": None, "eval_loss": None}  # trained with eval_batches=0
    assert report.train_rows([unevaluated, ok])[0]["held-out loss"] == "–"
    assert "held-out loss" not in report.train_rows([unevaluated])[0]  # no run has one: no column
    shared = report.train_rows([ok, failed], peak=False)  # runs of one process share one peak: no column
    assert all("peak memory (MiB)" not in r for r in shared) and shared[0]["final loss"] == "2.444"


def _summary(impl, ms, status="ok"):
    return {"impl": impl, "status": status, "median_ms": ms if status == "ok" else None}


def test_twin_spread_sets_the_twins_gap_against_the_implementations_spread():
    """XLA 7.224 ms and its twin 6.641 ms (the same program, ×1.088) against kernels at 6.546–7.315 ms (×1.117)."""
    runs = [_summary("xla", 7.224), _summary("cudnn", 6.546), _summary("mosaic", 7.315), _summary("xla_twin", 6.641)]
    t = report.twin_spread(runs)
    assert (t.impl, t.ms, t.twin_ms) == ("xla", 7.224, 6.641)
    assert t.ratio == pytest.approx(7.224 / 6.641) and t.span == pytest.approx(7.315 / 6.546) and t.ranks
    close = [*runs[:1], _summary("cudnn", 7.0), runs[3]]  # 7.224 / 7.0 = ×1.03, within the twins' ×1.09
    assert report.twin_spread(close).span == pytest.approx(7.224 / 7.0) and not report.twin_spread(close).ranks
    assert report.twin_spread(runs[:3]) is None  # no twin
    assert report.twin_spread([*runs[:3], _summary("xla_twin", None, "error")]) is None  # the twin failed
    alone = report.twin_spread([runs[0], runs[3]])
    assert alone.span is None and not alone.ranks  # one implementation: nothing to rank


def test_twin_spread_leaves_out_failed_runs():
    """A failed run has no time: the spread covers only the ok ones (7.0–7.1 ms)."""
    runs = [_summary("xla", 7.0), _summary("cudnn", 7.1), _summary("mosaic", None, "error"), _summary("xla_twin", 7.7)]
    assert report.twin_spread(runs).span == pytest.approx(7.1 / 7.0)


def test_read_ceiling_is_the_one_the_records_percentages_were_computed_against():
    """Records tagged against 4508 GB/s (gbps · 100 / pct_read), while the latest run measured 4502 GB/s."""
    recs = [{"grid": "decode", "gbps": g, "pct_read": 100 * g / 4508.0} for g in (900.0, 2000.0, 3100.0)]
    assert report.read_ceiling(recs, {"read_gbps": 4502.0}) == pytest.approx(4508.0)
    mixed = [*recs, {"grid": "decode", "gbps": 1000.0, "pct_read": 100 * 1000.0 / 4400.0}]  # re-recorded in part
    assert report.read_ceiling(mixed, {"read_gbps": 4502.0}) == pytest.approx(4508.0)  # the median
    untagged = [{"grid": "decode", "gbps": 900.0}]  # recorded before pct_read existed: the latest run's ceiling
    assert report.read_ceiling(untagged, {"read_gbps": 4502.0}) == 4502.0
    assert report.read_ceiling([], None) is None


def test_run_live_keeps_the_points_matching_a_value_or_one_of_several(monkeypatch):
    ran = []
    monkeypatch.setattr(report, "run_sweep", lambda pts, **timing: ran.append(pts) or [])
    report.run_live("te", seq_q=128, impl=("te", "cudnn"))
    report.run_live("te", impl="xla")
    one_of, one = ran
    assert one_of and {p.impl for p in one_of} == {"te", "cudnn"} and {p.seq_q for p in one_of} == {128}
    assert one and {p.impl for p in one} == {"xla"} and len({p.seq_q for p in one}) > 1


def test_in_words_lists_items_with_commas_and_and():
    from attention_tutorial.results.plotting import label

    assert report.in_words(()) == ""
    assert report.in_words(label(i) for i in ["cudnn"]) == "cuDNN"
    assert report.in_words(label(i) for i in ["naive", "xla"]) == "naive (from scratch) and XLA"
    assert report.in_words(label(i) for i in ["xla", "cudnn", "te"]) == "XLA, cuDNN and TransformerEngine"
    assert report.in_words([1024, 4096, 16384]) == "1,024, 4,096 and 16,384"  # numbers with thousands separators


def _timed(ms, lo, hi, **kw):
    return {**_rec("decode", "cudnn", 1), "median_ms": ms, "p10_ms": lo, "p90_ms": hi, **kw}


def test_with_range_puts_the_spread_in_one_column():
    first = _timed(0.13, 0.129, 0.131)
    rows = report.with_range([first, {"impl": "cudnn", "status": "unsupported"}])
    assert rows[0][report.RANGE] == "0.129–0.131" and rows[1][report.RANGE] == "–"
    assert report.RANGE not in first  # copies: the records stay as they were


def test_live_check_pairs_exact_points_and_judges_from_both_spreads():
    recorded = [_timed(0.30, 0.29, 0.31, kv_heads=1), _timed(0.13, 0.129, 0.131, kv_heads=32)]
    live = [
        _timed(0.33, 0.329, 0.331, kv_heads=1),
        _timed(0.2, 0.2, 0.2, kv_heads=1, batch=4),
        _timed(0.1305, 0.1295, 0.1315, kv_heads=32),
        _timed(1, 1, 1, kv_heads=8),
    ]
    rows = report.live_check(live, recorded)
    assert [(r["kv_heads"], r["verdict"]) for r in rows] == [(1, "slower"), (32, "on par")]
    assert rows[0]["recorded_ms"] == 0.30 and rows[0]["live_over_recorded"] == pytest.approx(0.33 / 0.30)


def test_live_table_on_a_cpu_build_shows_the_live_run_alone(monkeypatch):
    live = [_rec("seq_long", "xla", 4096)]
    text = report.live_table(live, RECORDS, ["impl", "median_ms"])
    assert text.startswith("**Live, this build:**") and text.count("\n|---|---|") == 1  # one table on a CPU
    monkeypatch.setattr(report.jax, "default_backend", lambda: "gpu")
    text = report.live_table(live, RECORDS, ["impl", "seq_q", "median_ms", "tflops"])
    assert text.count("\n|---|") == 2 and "recorded median" in text.split("Against the recording")[1]
    judged = report.live_table(live, RECORDS, ["impl", "seq_q", "median_ms"], verdicts=True)
    assert "on par" in judged and judged.endswith(report.VERDICT_NOTE)


def test_the_reference_roof_is_the_sequence_sweep_s_run_and_its_ridge_is_peak_over_bandwidth():
    data = store.recorded()
    if data is None:
        pytest.skip("no recorded results")
    long, prov = store.select(data["records"], grid="seq_long"), data["provenance"]
    r = report.reference_roof()
    assert r.peak_tflops == prov["grids"]["seq_long"]["matmul_bf16_tflops"]
    r0 = next(x for x in long if x.get("pct_read"))
    assert r.gbps == pytest.approx(r0["gbps"] * 100 / r0["pct_read"], rel=1e-3)
    assert (r.datasheet_tflops, r.datasheet_gbps) == (989.4, 4800.0)
    assert r.ridge == pytest.approx(r.peak_tflops * 1e12 / (r.gbps * 1e9))
    ok = [x for x in long if x["status"] == "ok" and x.get("pct_peak")]
    # the one peak the pages quote is the one the sweep's % of peak divides by
    assert all(x["tflops"] * 100 / x["pct_peak"] == pytest.approx(r.peak_tflops) for x in ok)
    assert r.gbps > prov["copy_gbps"]  # the read bandwidth: faster than a copy, so a floor on time


def test_the_reference_roof_without_a_recording(monkeypatch):
    monkeypatch.setattr(report, "reference", lambda grid: (None, None))
    assert report.reference_roof() is None
