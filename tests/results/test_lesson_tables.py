"""The lessons' tables and words: synthetic rows a wrong word would fail, and the recorded rows read back."""

import pytest

from attention_tutorial.results import lesson_tables as lt
from attention_tutorial.results import record as rec_mod
from attention_tutorial.results import store


def timed(ms, lo, hi, **kw):
    return {"median_ms": ms, "p10_ms": lo, "p90_ms": hi, **kw}


PREC = [
    timed(1.0, 0.95, 1.05, precision="default", matmuls_in="tf32", max_abs_error=6e-4, time_shape="T=2048"),
    timed(3.0, 2.9, 3.1, precision="highest", matmuls_in="float32", max_abs_error=4e-7, time_shape="T=2048"),
]


def test_precision_table_judges_each_error_against_its_own_precision():
    rows = lt.precision_table(PREC)
    assert rows[0]["verdict"] == "agree to within tf32 rounding (tolerance 2e-03)"
    assert rows[1]["verdict"] == "agree to within float32 rounding (tolerance 1e-05)"
    assert rows[0]["ms per call at T=2048 (p10–p90)"] == "1.00 (0.950–1.05)"
    bad = lt.precision_table([{**PREC[1], "max_abs_error": 1e-3}])
    assert bad[0]["verdict"].startswith("differ by more than float32")


def test_highest_vs_default_says_slower_only_outside_the_spread():
    c = lt.highest_vs_default(PREC)
    assert c.word == "slower" and c.value == pytest.approx(1 / 3)
    close = [PREC[0], timed(1.02, 0.97, 1.1, precision="highest", matmuls_in="float32", max_abs_error=0.0)]
    assert lt.highest_vs_default(close).word == "on par"


def test_refusal_table_and_consistency():
    rows = [{"head_dim": 128, "dtype": "bfloat16", "why_not": None, "forced": "runs"},
            {"head_dim": 100, "dtype": "bfloat16", "why_not": "head_dim must be a multiple of 8", "forced": "ValueError: x"}]  # fmt: skip
    table = lt.refusal_table(rows)
    assert table[0]["our check (cudnn_why_not)"] == "runs" and table[1]["JAX when cuDNN is forced"] == "ValueError: x"
    assert lt.refusals_consistent(rows)
    assert not lt.refusals_consistent([{**rows[0], "forced": "RuntimeError: no"}])  # we say runs, JAX refuses
    assert not lt.refusals_consistent([{**rows[1], "forced": "runs"}])  # we refuse, JAX runs it


def test_inputs_words_compare_each_constant_kind_with_random_data():
    rows = [timed(0.8, 0.78, 0.82, inputs="zeros", n=8192, tflops=1.0),
            timed(0.99, 0.95, 1.05, inputs="ones", n=8192, tflops=1.0),
            timed(1.0, 0.97, 1.03, inputs="random normal", n=8192, tflops=1.0)]  # fmt: skip
    claims = lt.inputs_vs_random(rows)
    assert claims["zeros"].word == "faster" and claims["zeros"].value == pytest.approx(1.25)
    assert claims["ones"].word == "on par"
    assert (
        lt.inputs_words(rows) == "zeros ran faster than random data (1.25×); ones ran on par with random data (1.01×)"
    )
    assert lt.input_table(rows)[0]["matmul"] == "8192×8192 @ 8192×8192, bf16"


def test_recorded_lesson_reads_the_provenance_and_says_none_when_absent(tmp_path):
    assert lt.recorded_lesson("gqa", tmp_path) == (None, None)
    with pytest.raises(ValueError, match="unknown lesson 'tf32'; choose from precision"):
        lt.recorded_lesson("tf32", tmp_path)
    env = {"gpu": "NVIDIA H200", "driver": "580.0", "jax": "0.11.2", "jaxlib": "0.11.2", "cudnn": "9.19.0",
           "transformer_engine": None, "python": "3.12.3", "created": "2026-12-03T00:00:00+00:00"}  # fmt: skip
    prov = rec_mod.provenance(env, {"matmul_bf16_tflops": 700.0, "copy_gbps": 3000.0}, "test")
    prov["lessons"] = {"gqa": [{"impl": "xla", "status": "ok"}]}
    one = store.recorded("nvidia-h200")["records"][:1]  # any valid record: a result file is never empty
    grid = {"created": "2026-12-03T01:00:00+00:00", **{k: env[k] for k in rec_mod.GRID_VERSIONS}}
    prov["grids"] = {"lessons": grid, one[0]["grid"]: grid}
    store.save(tmp_path / "nvidia-h200.json", prov, one)
    rows, where = lt.recorded_lesson("gqa", tmp_path)
    assert rows == [{"impl": "xla", "status": "ok"}] and "NVIDIA H200" in where and "2026-12-03" in where
    assert lt.recorded_lesson("precision", tmp_path) == (None, None)


def test_race_rows_judge_each_kernel_against_every_cudnn_recording_of_the_point():
    def r(impl, T, H, causal, ms, lo, hi, grid="beyond"):
        return {"grid": grid, "impl": impl, "batch": 65536 // T, "seq_q": T, "seq_kv": T, "heads": 16,
                "kv_heads": 16, "head_dim": H, "dtype": "bfloat16", "causal": causal, "pass": "fwd", "mask": None,
                "status": "ok", "median_ms": ms, "p10_ms": lo, "p90_ms": hi}  # fmt: skip

    beyond = [r("cudnn", 8192, 128, False, 1.00, 0.99, 1.01), r("mosaic_pipe", 8192, 128, False, 0.90, 0.89, 0.91),
              r("cudnn", 16384, 128, False, 2.00, 1.98, 2.02), r("mosaic_pipe", 16384, 128, False, 2.01, 1.99, 2.03),
              r("mosaic_pipe", 2048, 128, False, 0.1, 0.1, 0.1), r("cudnn", 2048, 128, False, 0.2, 0.2, 0.2),
              r("mosaic_pipe", 8192, 256, True, 3.0, 2.9, 3.1)]  # no cuDNN at H = 256 causal: left out  # fmt: skip
    other_run = [r("cudnn", 8192, 128, False, 0.88, 0.87, 0.89, grid="flash")]  # cuDNN faster in another run
    rows = lt.race_rows(beyond, beyond + other_run, ("mosaic_pipe",))
    assert len(rows) == 1
    row = rows[0]
    assert (
        row["H"] == 128
        and row["mask"] == "none"
        and row["implementation"] == "our Pallas kernel (Mosaic GPU), pipelined"
    )
    # T = 8192: cuDNN's median over its two recordings is 0.94 ms (104 % of ours) but its spread reaches 0.87 ms
    assert row["speed vs cuDNN, medians"] == "100–104 %"  # 2.00 / 2.01 at T = 16384 prints as 100
    assert row["verdict"] == "on par"  # 0.89–0.91 lies inside cuDNN's pooled 0.87–1.01; T = 2048 is below min_seq
    alone = lt.race_rows(beyond, beyond, ("mosaic_pipe",))[0]
    assert alone["verdict"] == "faster at T = 8192; on par at T = 16384"
    # a second recording of ours at a point is pooled, whatever the order, never silently dropped
    slow = r("mosaic_pipe", 8192, 128, False, 1.20, 1.19, 1.21, grid="flash")
    for recs in ([*beyond, slow], [slow, *beyond]):
        assert lt.race_rows(recs, recs, ("mosaic_pipe",))[0]["verdict"] == "on par"
    f16 = {**r("mosaic_pipe", 8192, 128, False, 0.9, 0.9, 0.9), "dtype": "float16"}
    with pytest.raises(
        ValueError, match=r"records at T = 8192 differ in dtype; race_rows: add it to by= \(now \('head"
    ):
        lt.race_rows([*beyond, f16], beyond, ("mosaic_pipe",))
    with pytest.raises(ValueError, match="tuple of implementation names"):
        lt.race_rows(beyond, beyond, "mosaic_pipe")


def _rec(impl, T, causal, ms, grid="fp8", err=None, dtype="float8_e4m3fn", spread=0.001, status="ok"):
    return {"grid": grid, "impl": impl, "batch": 32768 // T, "seq_q": T, "seq_kv": T, "heads": 16, "kv_heads": 16,
            "head_dim": 128, "dtype": dtype, "causal": causal, "pass": "fwd", "mask": None, "status": status,
            "median_ms": ms, "p10_ms": (1 - spread) * ms, "p90_ms": (1 + spread) * ms, "rel_error": err}  # fmt: skip


FP8_GOAL = (lt.Goal("FP8", ("mosaic_fp8_regs", "mosaic_fp8"), "cudnn_fp8_s448", 0.90, 0, (("grid", "fp8"),)),)


def test_goal_rows_judge_every_t_by_median_spread_error_and_failure():
    r = _rec
    fp8 = [r("cudnn_fp8_s448", 4096, False, 1.0, err=0.060), r("mosaic_fp8_regs", 4096, False, 1.0 / 0.95, err=0.050),
           r("cudnn_fp8_s448", 8192, False, 4.0, err=0.060), r("mosaic_fp8_regs", 8192, False, 4.0 / 0.93, err=0.055),
           # causal: 120 % of the speed, but a larger error than cuDNN FP8's at T = 4096
           r("cudnn_fp8_s448", 4096, True, 1.0, err=0.050), r("mosaic_fp8_regs", 4096, True, 1.0 / 1.2, err=0.055),
           # shared memory: fast where it ran, failed at T = 8192 (a wrong answer is recorded as an error)
           r("mosaic_fp8", 4096, True, 1.0 / 0.95), r("mosaic_fp8", 8192, True, 1.0, status="error")]  # fmt: skip
    rows = {(x["implementation"], x["mask"]): x for x in lt.goal_rows(fp8, goals=FP8_GOAL)}
    fast = rows["our Pallas kernel (Mosaic GPU), FP8, p in registers", "none"]
    assert fast["reached (medians)"] == "93–95 %" and fast["met"] == "yes" and fast["why"] == "–"
    # the worst pair is the T where ours is worst against theirs (0.055 / 0.060), not each side's largest
    assert fast["error vs float32 (ours / theirs)"] == "0.055 / 0.060" and fast["against"] == "cuDNN FP8 (P scale 448)"
    worse = rows["our Pallas kernel (Mosaic GPU), FP8, p in registers", "causal"]
    assert worse["met"] == "no" and worse["why"] == "a larger error than cuDNN FP8 (P scale 448)'s at T = 4096"
    failed = rows["our Pallas kernel (Mosaic GPU), FP8, p via shared memory", "causal"]
    assert failed["met"] == "no" and failed["why"] == "failed at T = 8192" and failed["reached (medians)"] == "95 %"
    assert ("our Pallas kernel (Mosaic GPU), FP8, p via shared memory", "none") not in rows  # never ran: no row
    # a wide spread under a median above the target: met by the medians only
    wide = [r("cudnn_fp8_s448", 4096, False, 1.0, spread=0.05), r("mosaic_fp8_regs", 4096, False, 1 / 0.92)]
    (row,) = lt.goal_rows(wide, goals=FP8_GOAL)
    assert row["met"] == "by the medians" and row["why"] == "the spread reaches below the target at T = 4096"
    # no baseline at a T: not judged there; whole percents never round a miss onto the target
    alone = [*wide[:1], wide[1], r("mosaic_fp8_regs", 8192, False, 1.0)]
    (row,) = lt.goal_rows(alone, goals=FP8_GOAL)
    assert row["met"] == "not judged" and row["why"] == (
        "no cuDNN FP8 (P scale 448) recorded at T = 8192; the spread reaches below the target at T = 4096"
    )
    close = [r("cudnn_fp8_s448", 4096, False, 1.0), r("mosaic_fp8_regs", 4096, False, 1 / 0.896)]
    (row,) = lt.goal_rows(close, goals=FP8_GOAL)
    assert row["reached (medians)"] == "89.6 %" and row["met"] == "no"


def test_goal_rows_count_a_recording_once_however_often_it_is_loaded():
    """The page reads the same result file twice (its grid, and everything): a baseline recorded in this grid and
    another must weigh the same, not the twice-loaded one double."""
    import copy

    beyond = [_rec("cudnn", 8192, False, 1.0, grid="beyond", dtype="bfloat16"),
              _rec("mosaic", 8192, False, 1.0, grid="beyond", dtype="bfloat16")]  # fmt: skip
    other = [_rec("cudnn", 8192, False, 2.0, grid="flash", dtype="bfloat16")]  # the same point, another recording
    once = lt.goal_rows(beyond, beyond + other)
    twice = lt.goal_rows(beyond, copy.deepcopy(beyond) + other)
    assert once[0]["reached (medians)"] == twice[0]["reached (medians)"] == "150 %"  # median of 1.0 and 2.0 ms


def test_goal_words_say_met_only_for_what_was_judged():
    r = _rec
    met_none = [r("cudnn_fp8_s448", 4096, False, 1.0), r("mosaic_fp8_regs", 4096, False, 1 / 0.95)]
    words = lt.goal_words(lt.goal_rows(met_none, goals=FP8_GOAL), goals=FP8_GOAL)
    assert words == ("- **FP8** (target ≥ 90 %): met only with no mask. Closest: with no mask: our Pallas kernel "
                     "(Mosaic GPU), FP8, p in registers, 95 % of the speed of cuDNN FP8 (P scale 448); causal: not judged, "
                     "nothing recorded.")  # fmt: skip
    both = [*met_none, r("cudnn_fp8_s448", 4096, True, 1.0), r("mosaic_fp8", 4096, True, 1 / 0.91)]
    words = lt.goal_words(lt.goal_rows(both, goals=FP8_GOAL), goals=FP8_GOAL)
    assert words.startswith("- **FP8** (target ≥ 90 %): met (by different kernels for the two masks). Closest:")
    slow = [*met_none, r("cudnn_fp8_s448", 4096, True, 1.0), r("mosaic_fp8", 4096, True, 1 / 0.5)]
    words = lt.goal_words(lt.goal_rows(slow, goals=FP8_GOAL), goals=FP8_GOAL)
    assert (
        "met only with no mask" in words
        and "causal: our Pallas kernel (Mosaic GPU), FP8, p via shared memory, 50 %" in words
    )
    assert "(below the target at T = 4096)" in words
    assert lt.goal_words([], goals=FP8_GOAL) == "- **FP8**: not judged, nothing recorded."
    # the bf16 goals read the beyond grid only: the FP8 experiment's own bf16 points do not enter them
    bf16 = [r("cudnn", 8192, False, 1.0, grid="beyond", dtype="bfloat16"),
            r("mosaic", 8192, False, 0.9, grid="beyond", dtype="bfloat16"),
            r("mosaic", 8192, False, 2.0, dtype="bfloat16"), r("cudnn", 8192, False, 1.0, dtype="bfloat16")]  # fmt: skip
    (row,) = [x for x in lt.goal_rows(bf16) if x["mask"] == "none"]
    assert row["goal"].startswith("bf16, H = 128") and row["reached (medians)"] == "111 %" and row["met"] == "yes"
    assert lt.goal_targets_words(FP8_GOAL) == "FP8: 90 % of the speed of cuDNN FP8 (P scale 448)"


def test_serialised_words_name_the_kernels_ptxas_serialised_and_skip_unknown_ones():
    at = {"batch": 4, "seq_q": 4096, "heads": 16, "head_dim": 128}
    code = {"mosaic bfloat16": {**at, "wgmma_serialised": [], "registers": [168]},
            "mosaic_pipe bfloat16 causal": {**at, "wgmma_serialised": ["C7513: non wgmma instructions defining …"],
                                            "registers": [168]},
            "pallas bfloat16": {**at, "wgmma_serialised": [], "registers": []},  # compiled in XLA: not read
            "old bfloat16": {**at, "registers": [40]}}  # recorded before the warnings were kept  # fmt: skip
    assert lt.serialised_words(code) == (
        "Of the 2 recorded kernels whose `ptxas` output was read (all at B = 4, T = 4096, N = 16, H = 128), `ptxas` "
        "serialised the warpgroup matmuls of 1: our Mosaic GPU, pipelined, causal (warning C7513)."
    )
    assert lt.serialised_words({"mosaic bfloat16": {"wgmma_serialised": [], "registers": [168]}}) == (
        "The 1 recorded kernel whose `ptxas` output was read got no serialisation warning from `ptxas`."
    )
    two = {"mosaic bfloat16": {**at, "wgmma_serialised": [], "registers": [168]},
           "mosaic bfloat16 causal": {**at, "wgmma_serialised": [], "registers": [168]}}  # fmt: skip
    assert lt.serialised_words(two) == (
        "None of the 2 recorded kernels whose `ptxas` output was read (all at B = 4, T = 4096, N = 16, H = 128) got a "
        "serialisation warning from `ptxas`."
    )
    wide = {"mosaic_pipe bfloat16 causal H=256": {**at, "head_dim": 256, "wgmma_serialised": ["C7513: …"],
                                                  "registers": [168]}}  # fmt: skip
    assert lt.serialised_words({**two, **wide}) == (
        "Of the 3 recorded kernels whose `ptxas` output was read (all at B = 4, T = 4096, N = 16, H = 128 or 256), "
        "`ptxas` serialised the warpgroup matmuls of 1: our Mosaic GPU, pipelined, causal, H = 256 (warning C7513)."
    )
    assert lt.serialised_words({"pallas bfloat16": {"wgmma_serialised": [], "registers": []}}).startswith(
        "No recorded kernel says"
    )


def test_ratio_by_t_words_gives_each_t_its_median_ratio_against_every_baseline_recording():
    r = _rec
    fp8 = [r("cudnn_fp8_s448", 4096, False, 1.0), r("mosaic_fp8_regs", 4096, False, 1.0 / 0.96),
           r("cudnn_fp8_s448", 8192, False, 4.0), r("mosaic_fp8_regs", 8192, False, 4.0 / 0.90),
           r("mosaic_fp8_regs", 16384, False, 9.0),  # no baseline at T = 16384: left out
           r("cudnn_fp8_s448", 4096, True, 1.0), r("mosaic_fp8_regs", 4096, True, 0.5)]  # fmt: skip
    words = lt.ratio_by_t_words(fp8, fp8, "mosaic_fp8_regs", "cudnn_fp8_s448", causal=False)
    assert words == "96.0 % at T = 4096, 90.0 % at T = 8192"
    assert lt.ratio_by_t_words(fp8, fp8, "mosaic_fp8_regs", "cudnn_fp8_s448", causal=True) == "200.0 % at T = 4096"
    assert lt.ratio_by_t_words(fp8, fp8, "mosaic_fp8", "cudnn_fp8_s448", causal=False) == "not recorded"
    assert lt.ratio_by_t_words(fp8, fp8, "mosaic_fp8_regs", "cudnn_fp8_s448", causal=False,
                               where=(("grid", "beyond"),)) == "not recorded"  # fmt: skip
    # against another dtype only when asked: FP8 over bf16 at the same point
    fp8.append(r("mosaic", 4096, False, 2.0, dtype="bfloat16"))
    assert lt.ratio_by_t_words(fp8, fp8, "mosaic_fp8_regs", "mosaic", causal=False) == "not recorded"
    assert lt.ratio_by_t_words(fp8, fp8, "mosaic_fp8_regs", "mosaic", causal=False,
                               baseline_where=(("dtype", "bfloat16"),)) == "192.0 % at T = 4096"  # fmt: skip
    # records of two batch sizes at one T: the error names this function and its own way out, not race_rows' by=
    fp8.append({**r("mosaic_fp8_regs", 4096, False, 1.0), "batch": 2})
    with pytest.raises(ValueError, match="differ in batch; ratio_by_t_words: narrow where= to one value of it"):
        lt.ratio_by_t_words(fp8, fp8, "mosaic_fp8_regs", "cudnn_fp8_s448", causal=False)
    assert lt.ratio_by_t_words(fp8, fp8, "mosaic_fp8_regs", "cudnn_fp8_s448", causal=False,
                               where=(("batch", 2),)) == "not recorded"  # cuDNN has no batch-2 point  # fmt: skip


def test_slower_words_names_the_rows_whose_verdict_finds_the_kernel_slower():
    rows = [{"H": 64, "mask": "none", "verdict": "slower"}, {"H": 64, "mask": "causal", "verdict": "on par"},
            {"H": 128, "mask": "causal", "verdict": "slower at T = 4096; on par at T = 8192"},
            {"H": 256, "mask": "none", "verdict": "faster at T = 4096; on par at T = 8192"}]  # fmt: skip
    assert lt.slower_words(rows) == "H = 64 with no mask, H = 128 causal"
    assert lt.slower_words(rows[1:2]) == "none"
    assert lt.slower_words(rows, word="faster") == "H = 256 with no mask"


def test_code_shape_words_names_the_one_shape_or_nothing():
    at = {"batch": 4, "seq_q": 4096, "heads": 16, "head_dim": 128}
    assert lt.code_shape_words({"a": at, "b": dict(at)}) == "B = 4, T = 4096, N = 16, H = 128"
    assert lt.code_shape_words({"a": at, "b": {**at, "seq_q": 8192}}) == ""
    assert lt.code_shape_words({"a": {**at, "heads": None}}) == ""
    assert lt.code_shape_words({"a": at, "b": {**at, "head_dim": 256}}) == "B = 4, T = 4096, N = 16, H = 128 or 256"
    assert lt.code_shape_words({"a": at, "b": {**at, "head_dim": None}}) == ""


def test_code_name_words_a_kernel_code_key():
    from attention_tutorial.measure.kernel_code import INSPECTED, code_key

    assert lt.code_name("mosaic_pipe bfloat16 causal H=256") == "our Mosaic GPU, pipelined, causal, H = 256"
    assert lt.code_name("mosaic bfloat16") == "our Mosaic GPU"
    assert lt.code_name("jax_mosaic float16") == "JAX's Mosaic GPU, float16"  # bf16 goes unsaid, other dtypes not
    assert lt.code_name("mosaic_fp8_regs bfloat16 causal") == "our Mosaic GPU, FP8, p in registers, causal"
    assert lt.code_name("future_impl bfloat16") == "future_impl"
    names = [lt.code_name(code_key(*spec)) for spec in INSPECTED]  # every inspected kernel has its own words
    assert len(set(names)) == len(INSPECTED) and not any("_" in n for n in names)


def test_fp8_error_words_set_the_output_rounding_apart_before_comparing():
    r = _rec
    where = "made-up inputs"
    alike = [r("mosaic_fp8_regs", 4096, False, 1.0, err=0.04), r("cudnn_fp8_s448", 4096, False, 1.0, err=0.05),
             r("mosaic_fp8_regs", 4096, True, 1.0, err=0.04), r("cudnn_fp8_s448", 4096, True, 1.0, err=0.052),
             r("mosaic_fp8_regs", 8192, False, 1.0)]  # no error at T = 8192: left out  # fmt: skip
    words = lt.fp8_error_words(alike, 0.03, where)
    assert words.startswith("cuDNN's FP8 path writes its output in E4M3, ours in bf16. Rounding the exact output to "
                            "E4M3 as cuDNN's path does, and nothing else, costs a relative error of 0.030 (computed "
                            "by this build on made-up inputs). Ours with that rounding added")  # fmt: skip
    # hypot(0.04, 0.03) = 0.05: 0.050 against 0.050 and 0.052, within 10 %
    assert ": 0.050 against 0.050 with no mask (T = 4096); 0.050 against 0.052 causal (T = 4096) — " in words
    assert words.endswith("so ours is smaller because it writes bf16: with the same output rounding the two errors "
                          "are alike.")  # fmt: skip
    smaller = [r("mosaic_fp8_regs", 4096, False, 1.0, err=0.01), r("cudnn_fp8_s448", 4096, False, 1.0, err=0.06)]
    assert lt.fp8_error_words(smaller, 0.01, where).endswith("so ours is smaller even with the same output rounding.")
    larger = [r("mosaic_fp8_regs", 4096, False, 1.0, err=0.08), r("cudnn_fp8_s448", 4096, False, 1.0, err=0.05)]
    assert lt.fp8_error_words(larger, 0.03, where).endswith("with the same output rounding ours would be the larger.")
    mixed = [*smaller, *[{**x, "causal": True} for x in larger]]
    assert lt.fp8_error_words(mixed, 0.01, where).endswith(
        "so with the same output rounding ours is smaller than cuDNN's with no mask (T = 4096); larger than cuDNN's "
        "causal (T = 4096).")  # fmt: skip
    assert lt.fp8_error_words(alike[:1], 0.03, where).endswith("no recorded point has both kernels' errors to set it "
                                                              "beside.")  # fmt: skip


def test_fp8_error_words_claim_ours_smaller_only_where_it_is_and_skip_nan():
    r = _rec
    larger = [r("mosaic_fp8_regs", 4096, False, 1.0, err=0.052), r("cudnn_fp8_s448", 4096, False, 1.0, err=0.050)]
    words = lt.fp8_error_words(larger, 0.01, "x")
    assert "ours is smaller" not in words and words.endswith("with the same output rounding the two errors are alike.")
    nan = [r("mosaic_fp8_regs", 4096, False, 1.0, err=float("nan")), r("cudnn_fp8_s448", 4096, False, 1.0, err=0.05)]
    assert "nan" not in lt.fp8_error_words(nan, 0.01, "x") and "no recorded point" in lt.fp8_error_words(nan, 0.01, "x")


def test_fp8_error_words_pool_several_recordings_of_a_point_by_their_median():
    r = _rec
    # ours recorded three times at one point (median 0.030, one NaN skipped), cuDNN twice (0.050 and 0.030: median
    # 0.040, not its worst 0.050); hypot(0.03, 0.02) = 0.036: 0.036 against 0.040, one line for the point
    recs = [r("mosaic_fp8_regs", 4096, False, 1.0, err=e) for e in (0.029, 0.030, 0.031, float("nan"))]
    recs += [r("cudnn_fp8_s448", 4096, False, 1.0, err=e) for e in (0.050, 0.030)]
    words = lt.fp8_error_words(recs, 0.02, "x")
    assert words.count(" against 0.") == 1 and ": 0.036 against 0.040 with no mask (T = 4096) — " in words
    assert words.endswith("so ours is smaller because it writes bf16: with the same output rounding the two errors "
                          "are alike.")  # fmt: skip
    # three points that disagree are named by word
    recs += [
        r("mosaic_fp8_regs", 8192, False, 1.0, err=0.010),
        r("cudnn_fp8_s448", 8192, False, 1.0, err=0.050),
        r("mosaic_fp8_regs", 4096, True, 1.0, err=0.010),
        r("cudnn_fp8_s448", 4096, True, 1.0, err=0.050),
    ]
    assert lt.fp8_error_words(recs, 0.02, "x").endswith(
        "ours is about as large as cuDNN's with no mask (T = 4096); smaller than cuDNN's with no mask (T = 8192), "
        "causal (T = 4096).")  # fmt: skip
    # two batch sizes at one T: each point named by what sets it apart; a cuDNN error of 0 is no crash
    two = [r("mosaic_fp8_regs", 4096, False, 1.0, err=0.01), r("cudnn_fp8_s448", 4096, False, 1.0, err=0.05),
           {**r("mosaic_fp8_regs", 4096, False, 1.0, err=0.08), "batch": 2},
           {**r("cudnn_fp8_s448", 4096, False, 1.0, err=0.0), "batch": 2}]  # fmt: skip
    words = lt.fp8_error_words(two, 0.0, "x")
    assert "with no mask (T = 4096, B = 8)" in words and "with no mask (T = 4096, B = 2)" in words, words
    assert words.endswith("larger than cuDNN's with no mask (T = 4096, B = 2).")
