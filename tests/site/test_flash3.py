"""The FlashAttention-3 page's numbers: goal verdicts from synthetic records a wrong verdict would fail, the pipelined
schedule, the exponentials' arithmetic, FP8 errors set side by side, and what the recorded tuning tables say."""

import dataclasses
import itertools
import math

import pytest

from attention_tutorial.results.store import tuning
from attention_tutorial.site import flash3 as page


def _rec(impl, T, causal, ms, grid="fp8", err=None, dtype="float8_e4m3fn", spread=0.001, status="ok", H=128):
    return {
        "grid": grid,
        "impl": impl,
        "batch": 32768 // T,
        "seq_q": T,
        "seq_kv": T,
        "heads": 16,
        "kv_heads": 16,
        "head_dim": H,
        "dtype": dtype,
        "causal": causal,
        "pass": "fwd",
        "mask": None,
        "status": status,
        "median_ms": ms,
        "p10_ms": (1 - spread) * ms,
        "p90_ms": (1 + spread) * ms,
        "rel_error": err,
    }


FP8_GOAL = page.Goal("FP8", ("mosaic_fp8_regs", "mosaic_fp8"), "cudnn_fp8_s448", 0.90, 0, (("grid", "fp8"),))


def _by(results):
    return {(x.impl, x.causal): x for x in results}


def test_goals_are_judged_at_every_t_by_median_range_error_and_failure():
    r = _rec
    fp8 = [
        r("cudnn_fp8_s448", 4096, False, 1.0, err=0.060),
        r("mosaic_fp8_regs", 4096, False, 1 / 0.95, err=0.050),
        r("cudnn_fp8_s448", 8192, False, 4.0, err=0.060),
        r("mosaic_fp8_regs", 8192, False, 4 / 0.93, err=0.055),
        # causal: 120 % of the speed, but a larger error than cuDNN FP8's at T = 4096
        r("cudnn_fp8_s448", 4096, True, 1.0, err=0.050),
        r("mosaic_fp8_regs", 4096, True, 1 / 1.2, err=0.055),
        # shared memory: fast where it ran, failed at T = 8192
        r("mosaic_fp8", 4096, True, 1 / 0.95),
        r("mosaic_fp8", 8192, True, 1.0, status="error"),
    ]
    got = _by(page.goal_results(fp8, goals=(FP8_GOAL,)))
    fast = got["mosaic_fp8_regs", False]
    assert fast.met == "yes" and (fast.speed.low, fast.speed.high) == (pytest.approx(0.93), pytest.approx(0.95))
    assert fast.errors == ((4096, 0.050, 0.060), (8192, 0.055, 0.060))
    worse = got["mosaic_fp8_regs", True]
    assert worse.met == "no" and worse.worse_error == [4096] and worse.below == []
    failed = got["mosaic_fp8", True]
    assert failed.met == "no" and failed.failed == (8192,) and failed.speed.low == pytest.approx(0.95)
    assert ("mosaic_fp8", False) not in got  # never ran: no result
    assert (fast.shortfall, worse.shortfall, failed.shortfall) == ("", "T = 4,096: larger error", "T = 8,192 failed")


def test_speed_counts_from_min_seq_and_error_wherever_it_was_measured():
    r = _rec
    long = dataclasses.replace(FP8_GOAL, min_seq=8192)
    recs = [
        r("cudnn_fp8_s448", 4096, False, 1.0, err=0.050),
        r("mosaic_fp8_regs", 4096, False, 1 / 0.5, err=0.055),
        r("cudnn_fp8_s448", 8192, False, 4.0),
        r("mosaic_fp8_regs", 8192, False, 4 / 0.95),
    ]
    (res,) = page.goal_results(recs, goals=(long,))
    assert res.below == [] and [t for t, _ in res.speed.by_t] == [8192]  # T = 4096's 50 % does not count
    assert res.errors == ((4096, 0.055, 0.050),) and res.met == "no" and res.shortfall == "T = 4,096: larger error"


def test_a_range_reaching_below_the_target_or_a_missing_baseline_is_not_a_clear_yes():
    r = _rec
    wide = [r("cudnn_fp8_s448", 4096, False, 1.0, spread=0.05), r("mosaic_fp8_regs", 4096, False, 1 / 0.92)]
    (res,) = page.goal_results(wide, goals=(FP8_GOAL,))
    assert res.met == "not in every run" and res.shaky == [4096]
    alone = [*wide, r("mosaic_fp8_regs", 8192, False, 1.0)]  # no cuDNN at T = 8192
    (res,) = page.goal_results(alone, goals=(FP8_GOAL,))
    assert res.met == "not judged" and res.unjudged == (8192,)
    close = [r("cudnn_fp8_s448", 4096, False, 1.0), r("mosaic_fp8_regs", 4096, False, 1 / 0.896)]
    (res,) = page.goal_results(close, goals=(FP8_GOAL,))
    assert res.met == "no" and res.below == [4096] and res.shortfall == "T = 4,096 at 89.6 %"  # 89.6 % is not 90 %
    both = [*close, r("cudnn_fp8_s448", 8192, False, 1.0), r("mosaic_fp8_regs", 8192, False, 1 / 0.85)]
    (res,) = page.goal_results(both, goals=(FP8_GOAL,))
    assert res.shortfall == "every T below 90 %: 85.0–89.6 %"
    assert page.MET.index("yes") < page.MET.index("not in every run") < page.MET.index("no")


def test_a_recording_loaded_twice_counts_once_and_each_goal_reads_its_own_grid():
    import copy

    beyond = [
        _rec("cudnn", 8192, False, 1.0, grid="beyond", dtype="bfloat16"),
        _rec("mosaic", 8192, False, 1.0, grid="beyond", dtype="bfloat16"),
    ]
    other = [_rec("cudnn", 8192, False, 2.0, grid="flash", dtype="bfloat16")]  # the same point, another recording
    once = page.goal_results(beyond, beyond + other)
    twice = page.goal_results(beyond, copy.deepcopy(beyond) + other)
    assert once[0].speed.low == twice[0].speed.low == pytest.approx(1.5)  # the median of 1.0 and 2.0 ms
    # the FP8 experiment's own bf16 points do not enter the bf16 goals
    stray = [_rec("mosaic", 8192, False, 9.0, dtype="bfloat16"), _rec("cudnn", 8192, False, 1.0, dtype="bfloat16")]
    (res,) = [x for x in page.goal_results([*beyond, *stray]) if not x.causal]
    assert res.goal.what.startswith("bf16, H = 128") and res.speed.low == pytest.approx(1.0)


def test_closest_takes_the_best_verdict_then_the_highest_lowest_speed():
    r = _rec
    recs = [
        r("cudnn_fp8_s448", 4096, False, 1.0),
        r("mosaic_fp8_regs", 4096, False, 1 / 0.95),
        r("mosaic_fp8", 4096, False, 1 / 0.80),
    ]
    results = page.goal_results(recs, goals=(FP8_GOAL,))
    assert page.closest(results, FP8_GOAL, False).impl == "mosaic_fp8_regs"
    assert page.closest(results, FP8_GOAL, True) is None


def test_standing_rows_take_the_closest_kernel_per_goal_and_mask_and_draw_one_line_each():
    import matplotlib

    matplotlib.use("Agg")
    r = _rec
    recs = [
        r("cudnn_fp8_s448", 4096, False, 1.0),
        r("mosaic_fp8_regs", 4096, False, 1 / 0.95),
        r("cudnn_fp8_s448", 8192, False, 4.0),
        r("mosaic_fp8_regs", 8192, False, 4 / 0.92),
        r("mosaic_fp8", 4096, False, 1 / 0.80),
        r("cudnn_fp8_s448", 4096, True, 1.0),
        r("mosaic_fp8", 4096, True, 1 / 0.85),
    ]
    rows = page.standing_rows(page.goal_results(recs, goals=(FP8_GOAL,)), goals=(FP8_GOAL,))
    assert [(x["impl"], x["causal"], x["met"]) for x in rows] == [
        ("mosaic_fp8_regs", False, "yes"),
        ("mosaic_fp8", True, "no"),
    ]
    assert rows[0]["low"] == pytest.approx(0.92) and rows[0]["high"] == pytest.approx(0.95)
    assert rows[1]["low"] == rows[1]["high"] == pytest.approx(0.85) and rows[1]["target"] == 0.90
    fig = page.standing_figure(rows)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "FP8, no mask\n(p in registers)",
        "FP8, causal\n(p through shared memory)",
    ]
    assert len(ax.lines) == 3 * len(rows) + 1  # range over runs, medians over T, the goal's tick; 100 % dashed


@pytest.mark.parametrize(
    ("words", "text"),
    [
        ({"on par"}, "on par at every T"),
        ({"on par", "faster"}, "faster at some T and on par at others"),
        ({"slower", "faster", "on par"}, "faster at some T, on par at some T and slower at others"),
        (set(), "not measured"),
    ],
)
def test_words_over_t_gather_the_verdicts_best_first(words, text):
    assert page.words_over_t(words) == text


def test_the_committed_goals_read_the_recorded_grids():
    from attention_tutorial.site.report import reference

    everything, _ = reference()
    beyond = [x for x in everything if x.get("grid") == "beyond"]
    results = page.goal_results(beyond, everything)
    assert {(x.goal.what, x.impl, x.causal) for x in results} == {
        (g.what, impl, causal) for g in page.GOALS[:2] for impl in g.impls for causal in (False, True)
    }
    assert all(x.speed is not None and x.speed.ts[0] >= 8192 for x in results)
    backward = [x for x in everything if x.get("grid") == "backward"]
    bwd = page.goal_results(backward, everything, goals=page.GOALS[3:])
    assert {(x.goal.what, x.causal) for x in bwd} == {(g.what, c) for g in page.GOALS[3:] for c in (False, True)}
    assert all(x.speed.ts[0] == 4096 and x.speed.ts[-1] >= 16384 for x in bwd)  # bf16, N = K = 16 only


def _boxes(rows, name, text):
    return next((s, s + n) for s, n, _, t in rows[name] if t == text)


@pytest.mark.parametrize(("matmul", "softmax"), [(1.0, 2.0), (1.0, 1.0), (2.0, 1.0)])
def test_the_pipelined_loop_runs_the_next_softmax_while_p_v_runs(matmul, softmax):
    rows = page.pipeline_schedule(steps=3, matmul=matmul, softmax=softmax)
    plain = page.schedule_length(rows, "plain")
    assert plain == pytest.approx(3 * (2 * matmul + softmax))  # nothing overlaps in the plain loop
    assert page.schedule_length(rows, "pipelined") < plain
    for j in range(2):  # softmax j+1 starts once q·k_{j+1}ᵀ is done and overlaps p·v j
        qk, sm = (
            _boxes(rows, "pipelined: tensor cores", f"q·kᵀ {j + 1}"),
            _boxes(rows, "pipelined: softmax", f"softmax {j + 1}"),
        )
        pv = _boxes(rows, "pipelined: tensor cores", f"p·v {j}")
        assert sm[0] >= qk[1] and sm[0] < pv[1] and pv[0] < sm[1]
    for name in ("plain: tensor cores", "pipelined: tensor cores"):  # one matmul at a time
        spans = sorted((s, s + n) for s, n, *_ in rows[name])
        assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(spans))
    with pytest.raises(ValueError, match="steps >= 2"):
        page.pipeline_schedule(steps=1)


def test_the_exponentials_share_is_the_papers_arithmetic():
    assert page.exp_share(128) == pytest.approx(989.4 / (3.9 * 512))  # about half at H = 128
    assert page.exp_share(64) == pytest.approx(2 * page.exp_share(128))
    assert page.exp_share(128, matmul_tflops=2 * 989.4) == pytest.approx(2 * page.exp_share(128))
    with pytest.raises(ValueError, match="head_dim must be a positive int"):
        page.exp_share(0)


def test_fp8_errors_set_the_output_rounding_apart_and_pool_by_the_median():
    r = _rec
    recs = [
        r("mosaic_fp8_regs", 4096, False, 1.0, err=0.040),
        r("mosaic_fp8_regs", 4096, False, 1.0, err=0.044),
        r("mosaic_fp8_regs", 4096, False, 1.0, err=0.048),
        r("cudnn_fp8_s448", 4096, False, 1.0, err=0.059),
        r("mosaic_fp8_regs", 4096, True, 1.0, err=0.01),
        r("cudnn_fp8_s448", 4096, True, 1.0, err=0.05),
        r("mosaic_fp8_regs", 8192, False, 1.0, err=float("nan")),
        r("cudnn_fp8_s448", 8192, False, 1.0, err=0.05),
    ]
    errs = page.fp8_errors(recs, 0.040)
    assert [(e.causal, e.seq_q) for e in errs] == [(False, 4096), (True, 4096)]  # the NaN point is skipped
    nomask, causal = errs
    assert nomask.ours == pytest.approx(0.044) and nomask.theirs == pytest.approx(0.059)
    assert nomask.ours_rounded == pytest.approx(math.hypot(0.044, 0.040))
    assert nomask.word == "alike"  # 0.0595 against 0.059
    assert causal.word == "smaller"  # √(0.01² + 0.04²) = 0.041 against 0.05
    assert page.fp8_errors(recs, 0.2)[0].word == "larger"


def test_config_speed_divides_by_the_base_at_the_same_h_and_mask():
    rows = [
        {"H": 128, "causal": False, "config": "base", "tflops": 500.0},
        {"H": 128, "causal": False, "config": "small", "tflops": 400.0},
        {"H": 128, "causal": False, "config": "big", "tflops": None},
        {"H": 128, "causal": True, "config": "small", "tflops": 300.0},
    ]  # no base causal
    got = page.config_speed(rows, ("small", "big"), "base")
    assert got == {(128, False, "small"): 0.8, (128, False, "big"): None, (128, True, "small"): None}
    assert page.config_speed(rows, ("small",), "base", causal=True) == {(128, True, "small"): None}
    assert page.ratio_span(got) == (0.8, 0.8) and page.ratio_span({"x": None}) is None
    tiles = page.tile_rows(rows, "base")
    assert [(t["configuration"], t["TFLOP/s"], t["relative speed"]) for t in tiles] == [
        ("base", "500.0", "1.00"),
        ("small", "400.0", "0.80"),
        ("big", "did not fit", "–"),
    ]
    assert [t["relative speed"] for t in page.tile_rows(rows, "base", causal=True)] == ["–"]  # no causal base


def test_the_recorded_tuning_backs_the_page():
    """What the page reads from the committed tables: three or four FP8 stages gain nothing over two, the pipelined
    kernel's 128-key blocks do not fit at three stages, and its 64-key blocks are slower."""
    fp8 = page.config_speed(
        tuning("fp8")["rows"],
        ("FP8 64x128 stages 3 p via registers", "FP8 64x128 stages 4 p via registers"),
        "FP8 64x128 stages 2 p via registers",
    )
    assert all(0.9 < v < 1.02 for v in fp8.values())
    pipe = tuning("pipe")["rows"]
    assert set(page.config_speed(pipe, ("64x128 stages 3 pipelined",), "64x128 stages 2 pipelined").values()) == {None}
    small = page.config_speed(pipe, ("64x64 stages 2 pipelined",), "64x128 stages 2 pipelined", causal=False)
    assert all(v < 1.0 for v in small.values())
    plain = page.config_speed(pipe, ("64x128 stages 2",), "64x128 stages 2 pipelined", causal=False)
    assert 0.95 < plain[(128, False, "64x128 stages 2")] < 1.0  # unmasked, pipelining gains a few percent


def test_dq_schemes_are_read_by_h_and_mask_against_cudnn():
    rows = [
        {"H": 64, "causal": c, "config": cfg, "tflops": tf}
        for c in (False, True)
        for cfg, tf in (
            ("cuDNN", 400.0),
            ("bwd 64x64 stages 2", 340.0),
            ("bwd 64x64 stages 2 dQ atomic", 380.0),
            ("bwd 128x64 stages 2", 500.0),
        )
    ]
    rows += [
        {"H": 128, "causal": False, "config": "cuDNN", "tflops": 500.0},
        {"H": 128, "causal": False, "config": "bwd 64x64 stages 2", "tflops": 450.0},
        {"H": 128, "causal": False, "config": "bwd 64x64 stages 2 dQ atomic", "tflops": 440.0},
        {"H": 128, "causal": True, "config": "cuDNN", "tflops": 500.0},
        {"H": 128, "causal": True, "config": "bwd 64x64 stages 2", "tflops": 430.0},
        {"H": 128, "causal": True, "config": "bwd 64x64 stages 2 dQ atomic", "tflops": 435.0},
    ]
    speeds = page.dq_speeds(rows)
    assert speeds == pytest.approx(
        {
            (64, False, "pass"): 0.85,
            (64, False, "atomic"): 0.95,
            (64, True, "pass"): 0.85,
            (64, True, "atomic"): 0.95,
            (128, False, "pass"): 0.9,
            (128, False, "atomic"): 0.88,
            (128, True, "pass"): 0.86,
            (128, True, "atomic"): 0.87,
        }
    )
    assert (page.dq_verdict(speeds, 64), page.dq_verdict(speeds, 128), page.dq_verdict(speeds, 256)) == (
        "faster",
        "about as fast",
        "",
    )  # H = 128: 0.87–0.88 inside 0.86–0.90
    table = page.dq_rows(speeds)
    assert [(r["H"], r["mask"], r["dQ by a pass of its own"], r["dQ by atomic adds"]) for r in table] == [
        (64, "none", "85 %", "95 %"),
        (64, "causal", "85 %", "95 %"),
        (128, "none", "90 %", "88 %"),
        (128, "causal", "86 %", "87 %"),
    ]
    only_pass = page.dq_rows({k: v for k, v in speeds.items() if k[2] == "pass"})
    assert "dQ by atomic adds" not in only_pass[0]  # a scheme never run gets no column


def test_the_dq_picture_counts_the_products_it_draws():
    import matplotlib

    matplotlib.use("Agg")
    assert (page.products("pass"), page.products("atomic")) == (7, 5)  # S and dP once more for dQ's own pass
    fig = page.dq_figure()
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [
        "dQ by a pass of its own: 7 products per tile pair",
        "dQ by atomic adds: 5 products per tile pair",
    ]
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "pass 2, per query block: dQ: S, dP, dQ" in texts and "dQ (float32)" in [
        t.get_text() for t in fig.axes[1].texts
    ]


def test_the_recorded_backward_tiles_back_the_page():
    """The committed table: atomic adds beat a pass of its own at H = 64 with both masks and lose at H = 128; every
    timed row's gradients were within bf16's threshold of cuDNN's."""
    table = tuning("bwd_tiles")["rows"]
    speeds = page.dq_speeds(table)
    assert (page.dq_verdict(speeds, 64), page.dq_verdict(speeds, 128)) == ("faster", "slower")
    assert all(r["rel_error_vs_cudnn"] < 0.01 for r in table if r["tflops"] and r["config"] != "cuDNN")


def test_ablation_and_fp8_error_rows_read_as_a_table():
    ratios = [
        _ratio("mosaic", "as_is", False, (0.974, 0.986), 0.9, 1.05),
        _ratio("mosaic", "no_exp", True, (1.10,), 1.06, 1.18),
    ]
    rows = page.ablation_rows(ratios)
    assert [(r["speed, each run"], r["range over runs"], r["mask"]) for r in rows] == [
        ("97 %, 99 %", "90–105 %", "none"),
        ("110 %", "106–118 %", "causal"),
    ]
    assert len({tuple(r) for r in rows}) == 1  # every row has the same columns, whatever the baseline
    fp8 = dataclasses.replace(ratios[0], impl="mosaic_fp8_regs", baseline="cudnn_fp8_s448")
    assert page.ablation_rows([fp8])[0]["against"].endswith(", end to end")  # both FP8 calls quantise bf16 inputs
    assert "end to end" not in rows[0]["against"]
    err = page.FP8Error(4096, False, ours=0.0531, ours_rounded=0.0594, theirs=0.0589)
    (row,) = page.fp8_error_rows([err])
    assert (row["ours"], row["ours, output rounded to E4M3"], row["cuDNN FP8's"]) == ("0.053", "0.059", "0.059")
    assert row["ours against cuDNN's"] == "alike" and row["mask"] == "none"


def _ratio(impl, variant, causal, rounds, low, high, H=128):
    from attention_tutorial.measure.ablations import AblationRatio

    return AblationRatio(impl, variant, H, causal, "cudnn", per_round=rounds, low=low, high=high)


def test_exp_bound_says_whether_every_run_without_exponentials_clears_the_goal():
    ratios = [
        _ratio("mosaic", "as_is", False, (0.97, 0.99), 0.9, 1.05),
        _ratio("mosaic", "no_exp", False, (1.10, 1.12), 1.06, 1.18),
        _ratio("mosaic_pipe", "as_is", True, (1.00, 1.02), 0.95, 1.08),
        _ratio("mosaic_pipe", "no_exp", True, (1.08, 1.09), 1.05, 1.12),
        _ratio("mosaic", "no_exp", False, (0.5,), 0.4, 0.6, H=256),
    ]  # another H: left out
    got = page.exp_bound(ratios, 1.05)
    assert got.as_is == (pytest.approx(0.98), pytest.approx(1.01))  # medians of the rounds
    assert got.no_exp == (pytest.approx(1.085), pytest.approx(1.11))
    assert got.clears and got.short
    assert not page.exp_bound(ratios, 1.055).clears  # a run without exponentials reaches only 1.05
    assert not page.exp_bound(ratios, 0.95).short
    assert page.exp_bound([r for r in ratios if r.variant == "as_is"], 1.05) is None
    assert page.exp_bound(ratios, 1.05, head_dim=64) is None


def test_a_goal_is_met_only_when_both_masks_are():
    g1, g2 = object(), object()
    rows = [
        {"goal": g1, "met": "yes"},
        {"goal": g1, "met": "not in every run"},
        {"goal": g2, "met": "yes"},
        {"goal": g2, "met": "yes"},
    ]
    assert page.goal_verdicts(rows) == {g1: "not in every run", g2: "yes"}
    assert page.goal_verdicts([*rows, {"goal": g2, "met": "no"}])[g2] == "no"


def test_dq_table_speeds_and_the_240_register_gain_read_their_labels():
    def row(H, causal, config, tflops):
        return {
            "kernel": "bwd_dq",
            "B": 4,
            "T": 8192,
            "N": 16,
            "H": H,
            "causal": causal,
            "config": config,
            "tflops": tflops,
        }

    rows = [
        row(128, False, "cuDNN", 500.0),
        row(128, False, "dQ pass", 450.0),
        row(128, False, "dQ atomic", 400.0),
        row(128, False, "dQ atomic shared", 425.0),
        row(128, False, "dQ pass, 240 registers", 459.0),
        row(128, False, "dQ atomic, 240 registers", None),
    ]
    assert page.dq_table_speeds(rows) == {
        (128, False, "pass"): 0.9,
        (128, False, "atomic"): 0.8,
        (128, False, "atomic_shared"): 0.85,
    }
    assert page.dq_table_speeds(rows, registers=240) == {(128, False, "pass"): 0.918, (128, False, "atomic"): None}
    assert page.registers_gain(rows) == {(128, False, "dQ pass"): 1.02, (128, False, "dQ atomic"): None}
    forward = [row(256, True, "64x64, 232 registers", 500.0), row(256, True, "64x64, 240 registers", 490.0)]
    assert page.registers_gain(forward) == {(256, True, "64x64, 232 registers"): 0.98}


def _race(case, ours, turns, group="forward", **code):
    rows = [{"contender": "cuDNN", "rounds_ms": [1.0, 1.0]}, {"contender": "ours", "rounds_ms": ours}]
    if turns is not None:
        rows.append({"contender": "ours, turns", "rounds_ms": turns})
    return {"group": group, "case": case, "rows": rows, "created": "2026-12-06T10:00:00+00:00", **code}


def test_schedule_races_read_turns_against_the_rendezvous_with_the_code_each_ran():
    prov = {
        "race": {
            "a": _race("H=128 no mask", [1.0, 1.2], [1.1, 1.0], commit="0123456789abcdef", dirty=True),
            "b": _race("H=128 causal", [1.0, 1.0], None),  # no turns contender: left out
            "c": _race("causal, T=8000", [1.0], [0.5], group="masks"),  # another group: left out
            "d": _race("H=256 no mask", [2.0, 2.0], [2.5, 2.5]),
        }
    }
    got = page.schedule_races(prov)
    assert [r.case for r in got] == ["H=128 no mask", "H=256 no mask"]
    assert got[0].speed == pytest.approx(1.1 / 1.05) and (got[0].low, got[0].high) == (pytest.approx(1 / 1.1), 1.2)
    assert got[1].speed == pytest.approx(0.8) and got[1].commit is None
    rows = page.schedule_rows(got)
    assert rows[0]["turns against rendezvous"] == "104.8 %" and rows[0]["range over rounds"] == "91–120 %"
    assert rows[0]["code"] == "commit 0123456, uncommitted changes" and rows[1]["code"] == "not recorded"
    assert page.schedule_races({}) == page.schedule_races(None) == []
