"""The FlashAttention-3 page: goal verdicts from synthetic records a wrong verdict would fail, the pipelined schedule,
what the recorded tuning tables say, and the numbers its cells computed in the last docs build."""

import dataclasses
import itertools
import math
import re

import pytest

from attention_tutorial.results.store import recorded, tuning
from attention_tutorial.site import flash3 as page
from tests.built_pages import glued


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


FP8_GOAL = page.Goal("FP8", ("mosaic_fp8_regs", "mosaic_fp8"), "cudnn_fp8_s448", 0.90, 0, {"grid": "fp8"})


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
    got = _by(page.goal_results(fp8, (), (FP8_GOAL,)))
    fast = got["mosaic_fp8_regs", False]
    assert fast.met == "yes" and (fast.speed.low, fast.speed.high) == (pytest.approx(0.93), pytest.approx(0.95))
    assert fast.errors == ((4096, 0.050, 0.060), (8192, 0.055, 0.060))
    worse = got["mosaic_fp8_regs", True]
    assert worse.met == "no" and worse.speed.low == pytest.approx(1.2)  # fast enough: no for its error alone
    failed = got["mosaic_fp8", True]
    assert failed.met == "no" and failed.failed == (8192,) and failed.speed.low == pytest.approx(0.95)
    assert ("mosaic_fp8", False) not in got  # never ran: no result
    assert (fast.shortfall, worse.shortfall, failed.shortfall) == (
        "",
        "larger error at T = 4,096",
        "failed at T = 8,192",
    )


def test_speed_counts_from_min_seq_and_error_wherever_it_was_measured():
    r = _rec
    long = dataclasses.replace(FP8_GOAL, min_seq=8192)
    recs = [
        r("cudnn_fp8_s448", 4096, False, 1.0, err=0.050),
        r("mosaic_fp8_regs", 4096, False, 1 / 0.5, err=0.055),
        r("cudnn_fp8_s448", 8192, False, 4.0),
        r("mosaic_fp8_regs", 8192, False, 4 / 0.95),
    ]
    (res,) = page.goal_results(recs, (), (long,))
    assert [t for t, _ in res.speed.by_t] == [8192]  # T = 4096's 50 % does not count
    assert res.errors == ((4096, 0.055, 0.050),) and res.met == "no" and res.shortfall == "larger error at T = 4,096"


def test_a_range_reaching_below_the_target_or_a_missing_baseline_is_not_a_clear_yes():
    r = _rec
    wide = [r("cudnn_fp8_s448", 4096, False, 1.0, spread=0.05), r("mosaic_fp8_regs", 4096, False, 1 / 0.92)]
    (res,) = page.goal_results(wide, (), (FP8_GOAL,))
    assert res.met == "not in every run" and res.shortfall == ""
    alone = [*wide, r("mosaic_fp8_regs", 8192, False, 1.0)]  # no cuDNN at T = 8192
    (res,) = page.goal_results(alone, (), (FP8_GOAL,))
    assert res.met == "not judged" and res.unjudged == (8192,)
    close = [r("cudnn_fp8_s448", 4096, False, 1.0), r("mosaic_fp8_regs", 4096, False, 1 / 0.896)]
    (res,) = page.goal_results(close, (), (FP8_GOAL,))
    assert res.met == "no" and res.shortfall == "every T below 90 %: 89.6 %"  # 89.6 % is not 90 %
    both = [*close, r("cudnn_fp8_s448", 8192, False, 1.0), r("mosaic_fp8_regs", 8192, False, 1 / 0.85)]
    (res,) = page.goal_results(both, (), (FP8_GOAL,))
    assert res.shortfall == "every T below 90 %: 85.0–89.6 %"
    some = [*close, r("cudnn_fp8_s448", 8192, False, 1.0), r("mosaic_fp8_regs", 8192, False, 1 / 0.95)]
    (res,) = page.goal_results(some, (), (FP8_GOAL,))
    assert res.shortfall == "1 of 2 T below 90 %: 89.6 %"
    assert page.MET.index("yes") < page.MET.index("not in every run") < page.MET.index("no")


def test_a_recording_loaded_twice_counts_once_and_each_goal_reads_its_own_grid():
    import copy

    bf16 = page.Goal("bf16, H = 128", ("mosaic",), "cudnn", 1.05, 8192, {"grid": "beyond", "head_dim": 128})
    beyond = [
        _rec("cudnn", 8192, False, 1.0, grid="beyond", dtype="bfloat16"),
        _rec("mosaic", 8192, False, 1.0, grid="beyond", dtype="bfloat16"),
    ]
    other = [_rec("cudnn", 8192, False, 2.0, grid="flash", dtype="bfloat16")]  # the same point, another recording
    once = page.goal_results(beyond, beyond + other, (bf16,))
    twice = page.goal_results(beyond, copy.deepcopy(beyond) + other, (bf16,))
    assert once[0].speed.low == twice[0].speed.low == pytest.approx(1.5)  # the median of 1.0 and 2.0 ms
    # the FP8 experiment's own bf16 points do not enter the bf16 goals
    stray = [_rec("mosaic", 8192, False, 9.0, dtype="bfloat16"), _rec("cudnn", 8192, False, 1.0, dtype="bfloat16")]
    (res,) = page.goal_results([*beyond, *stray], (), (bf16,))
    assert res.speed.low == pytest.approx(1.0)
    both_h = [
        *beyond,
        *(_rec(i, 8192, False, 1.0, grid="beyond", dtype="bfloat16", H=256) for i in ("cudnn", "mosaic")),
    ]
    with pytest.raises(ValueError, match="span several H or dtypes"):
        page.goal_results(both_h, (), (dataclasses.replace(bf16, where={"grid": "beyond"}),))


def test_standing_takes_the_best_verdict_then_the_highest_lowest_speed():
    r = _rec
    recs = [
        r("cudnn_fp8_s448", 4096, False, 1.0),
        r("mosaic_fp8", 4096, False, 1 / 0.96),  # faster, but less exact
        r("mosaic_fp8_regs", 4096, False, 1 / 0.91),
        r("cudnn_fp8_s448", 4096, True, 1.0),
        r("mosaic_fp8", 4096, True, 1 / 0.80),
        r("mosaic_fp8_regs", 4096, True, 1 / 0.85),
    ]
    recs[0]["rel_error"], recs[1]["rel_error"] = 0.05, 0.06
    got = page.standing(page.goal_results(recs, (), (FP8_GOAL,)))
    assert [(x.impl, x.causal, x.met) for x in got] == [
        ("mosaic_fp8_regs", False, "yes"),
        ("mosaic_fp8_regs", True, "no"),
    ]


def test_the_standing_figure_draws_one_line_per_goal_and_mask():
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
    rows = page.standing(page.goal_results(recs, (), (FP8_GOAL,)))
    assert [(x.impl, x.causal, x.met) for x in rows] == [("mosaic_fp8_regs", False, "yes"), ("mosaic_fp8", True, "no")]
    assert (rows[0].speed.low, rows[0].speed.high) == (pytest.approx(0.92), pytest.approx(0.95))
    assert rows[1].speed.low == rows[1].speed.high == pytest.approx(0.85)
    fig = page.standing_figure(rows)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "FP8, no mask\n(p in registers)",
        "FP8, causal\n(p through shared memory)",
    ]
    assert len(ax.lines) == 3 * len(rows) + 1  # range over runs, medians over T, the goal's tick; 100 % dashed
    assert ax.get_xlabel() == "% of cuDNN's speed (FP8: of cuDNN FP8's, end to end)"
    bf16 = page.Goal("bf16", ("mosaic",), "cudnn", 1.0, 4096, {})
    recs = [r("cudnn", 4096, False, 1.0), r("mosaic", 4096, False, 1 / 0.9)]
    fig = page.standing_figure(page.standing(page.goal_results(recs, (), (bf16,))))
    assert fig.axes[0].get_xlabel() == "% of cuDNN's speed"  # no FP8 goal: no note on FP8's baseline


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


def _boxes(rows, name, text):
    return next((s, s + n) for s, n, _, t in rows[name] if t == text)


@pytest.mark.parametrize(("matmul", "softmax"), [(1.0, 2.0), (1.0, 1.0), (2.0, 1.0)])
def test_the_pipelined_loop_runs_the_next_softmax_while_p_v_runs(matmul, softmax):
    rows = page.pipeline_schedule(steps=3, matmul=matmul, softmax=softmax)

    def length(prefix):
        return max(s + n for name, row in rows.items() if name.startswith(prefix) for s, n, *_ in row)

    assert length("plain") == pytest.approx(3 * (2 * matmul + softmax))  # nothing overlaps in the plain loop
    assert length("pipelined") == pytest.approx(matmul + softmax + 2 * (matmul + max(matmul, softmax)) + matmul)
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


def test_config_speed_takes_a_base_per_configuration():
    rows = [
        {"H": 64, "causal": True, "config": "a, 232 registers", "tflops": 400.0},
        {"H": 64, "causal": True, "config": "a, 240 registers", "tflops": 420.0},
        {"H": 64, "causal": True, "config": "b", "tflops": 300.0},
        {"H": 64, "causal": True, "config": "b, 240 registers", "tflops": 270.0},
    ]
    got = page.config_speed(rows, ("b, 240 registers",), lambda cfg: cfg.removesuffix(", 240 registers"))
    assert got == {(64, True, "b, 240 registers"): 0.9}
    assert page.registers_gain(rows) == {(64, True, "a, 232 registers"): 1.05, (64, True, "b"): 0.9}


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
    """The recorded table: atomic adds beat a pass of its own at H = 64 with both masks and lose at H = 128; every
    timed row's gradients were within bf16's threshold of cuDNN's."""
    table = tuning("bwd_tiles")["rows"]
    speeds = page.config_speed(table, ("bwd 64x64 stages 2", "bwd 64x64 stages 2 dQ atomic"), "cuDNN")
    for H, faster in ((64, True), (128, False)):
        way = {cfg: [v for (h, _, c), v in speeds.items() if h == H and c == cfg] for _, _, cfg in speeds}
        atomic, own = way["bwd 64x64 stages 2 dQ atomic"], way["bwd 64x64 stages 2"]
        assert len(atomic) == len(own) == 2  # both masks
        assert (min(atomic) > max(own)) if faster else (max(atomic) < min(own))
    assert all(r["rel_error_vs_cudnn"] < 0.01 for r in table if r["tflops"] and r["config"] != "cuDNN")


def test_ablation_rows_read_as_a_table():
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


def _ratio(impl, variant, causal, rounds, low, high, H=128):
    from attention_tutorial.measure.ablations import AblationRatio

    return AblationRatio(impl, variant, H, causal, "cudnn", per_round=rounds, low=low, high=high)


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
    assert [r["case"] for r in got] == ["H=128 no mask", "H=256 no mask"]
    assert got[0]["speed"] == pytest.approx(1.1 / 1.05)
    assert (got[0]["low"], got[0]["high"]) == (pytest.approx(1 / 1.1), 1.2) and got[1]["speed"] == pytest.approx(0.8)
    assert got[0]["code"] == "commit 0123456, uncommitted changes" and got[1]["code"] == "not recorded"
    assert got[0]["ran"] == "2026-12-06T10:00"
    assert page.schedule_races({}) == page.schedule_races(None) == []
    vs_cudnn = page.versus_races(prov, group="masks", base="cuDNN", other="ours")  # any two contenders of a group
    assert [(r["case"], r["speed"]) for r in vs_cudnn] == [("causal, T=8000", 1.0)]


# --- the built page: what its cells computed from the recording -------------------------------------------------------


@pytest.fixture(scope="module")
def built():
    """What the forward page's cells glued in the last docs build, as Python values (Markdown as its text)."""
    return glued("flash3")


@pytest.fixture(scope="module")
def built_next():
    """What the page on FP8 and the backward glued in the last docs build."""
    return glued("flash3_fp8_backward")


def _pct(x):
    return f"{100 * x:.0f} %"


@pytest.mark.parametrize(("which", "names"), [("built", ("h128", "h256")), ("built_next", ("fp8", "bwd128", "bwd64"))])
def test_each_page_judges_its_goals_on_the_recording(which, names, request):
    built = request.getfixturevalue(which)
    words = ("none", "one", "two", "three", "four", "five")
    assert sum(words.index(built[k]) for k in ("n_yes", "n_shaky", "n_no")) == int(built["goals_all"]) == len(names)
    for name in names:
        for mask in ("none", "causal"):
            assert re.fullmatch(r"\d+(–\d+)? %", built[f"stand_{name}_{mask}"]), (name, mask)
    assert built["goal_table"].count("\n| ") == 4 * len(names)  # below the header, each goal × 2 kernels × 2 masks


def test_the_exponentials_share_is_the_papers_arithmetic(built):
    """One exponential at 3.9 TFLOP/s against 4·H matmul FLOPs at the datasheet's dense bf16 (FP8: twice that)."""
    assert (built["exp_tflops"], built["mm_tflops"]) == ("3.9", "989")
    for H in (64, 128, 256):
        assert built[f"exp_h{H}"] == _pct(989.4 / (3.9 * 4 * H))
    assert built["exp_fp8"] == _pct(2 * 989.4 / (3.9 * 4 * 128))


def test_the_fp8_errors_count_the_output_rounding_alike(built_next):
    """The page's errors at T = 4096 without a mask are the recorded ones; ours rounded is ours with the rounding
    error of E4M3 in quadrature, which lies between the two (a rounding error alone is below both)."""
    fp8 = [r for r in recorded()["records"] if r.get("grid") == "fp8" and r.get("experiment") == "cudnn_fp8"]

    def error(impl):
        (r,) = [r for r in fp8 if r["impl"] == impl and not r["causal"] and r["seq_q"] == 4096]
        return r["rel_error"]

    ours, theirs = error("mosaic_fp8_regs"), error("cudnn_fp8_s448")
    assert built_next["fp8_err_t"] == "4096"
    assert (built_next["fp8_err_ours"], built_next["fp8_err_theirs"]) == (f"{ours:.3f}", f"{theirs:.3f}")
    rounded = float(built_next["fp8_err_rounded"])
    assert ours < rounded < math.hypot(ours, ours)  # the output's rounding is smaller than the kernel's error
    word = "alike" if abs(rounded / theirs - 1) <= 0.1 else "smaller" if rounded < theirs else "larger"
    assert (
        built_next["fp8_err_word"]
        == {"alike": "about as large as", "smaller": "smaller than", "larger": "larger than"}[word]
    )


def test_the_dq_verdicts_follow_the_recorded_table(built_next):
    rows = {(r["H"], r["causal"], r["config"]): r["tflops"] for r in tuning("bwd_dq")["rows"]}

    def span(H, cfg):
        got = [rows[H, c, cfg] / rows[H, c, "cuDNN"] for c in (False, True)]
        return min(got), max(got)

    for H in (64, 128):
        own, atomic = span(H, "dQ pass"), span(H, "dQ atomic")
        want = "ahead of" if atomic[0] > own[1] else "behind" if atomic[1] < own[0] else "level with"
        assert built_next[f"dq{H}_verdict"] == want
        assert built_next[f"dq{H}_atomic"].startswith(f"{100 * atomic[0]:.0f}")
    assert (built_next["dq64_verdict"], built_next["dq128_verdict"]) == ("ahead of", "behind")
    assert built_next["tune_dq"] == "NVIDIA H200, commit unknown"  # tables measured before they carried a commit


def test_the_runs_without_exponentials_are_read_from_the_ablations(built):
    from attention_tutorial.measure.ablations import ablation_ratios

    ratios = [a for a in ablation_ratios(recorded()["records"]) if a.impl in ("mosaic", "mosaic_pipe")]
    for variant, key in (("as_is", "asis_h128"), ("no_exp", "noexp_h128")):
        medians = [a.median for a in ratios if a.head_dim == 128 and a.variant == variant]
        assert built[key] == (
            _pct(min(medians))
            if _pct(min(medians)) == _pct(max(medians))
            else f"{100 * min(medians):.0f}–{100 * max(medians):.0f} %"
        )
