"""The recorder's flow, on the CPU: a GPU is simulated only where record() checks for one; the measuring is real."""

import pytest

from attention_tutorial import results
from attention_tutorial.measure.grids import points
from attention_tutorial.results import record as rec_mod

FAKE_ENV = {
    "gpu": "NVIDIA H200",
    "driver": "580.0",
    "jax": "0.11.2",
    "jaxlib": "0.11.2",
    "cudnn": "9.19.0",
    "transformer_engine": None,
    "python": "3.12.3",
    "created": "2026-12-02T00:00:00+00:00",
}


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(rec_mod.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(rec_mod, "environment", lambda: dict(FAKE_ENV))
    monkeypatch.setattr(
        rec_mod, "measure_ceilings", lambda: {"matmul_bf16_tflops": 2.0, "copy_gbps": 10.0, "read_gbps": 20.0}
    )
    # the first float32 point of each grid in its CPU size, so the measuring itself runs here for real
    monkeypatch.setattr(
        rec_mod,
        "plan",
        lambda name, gpu, memory: ([p for p in points(name, gpu=False) if p.dtype == "float32"][:1], []),
    )
    # EXTRAS holds the experiments by reference: the stand-in goes there, or the real FP8 runs at its GPU sizes
    monkeypatch.setitem(
        rec_mod.EXTRAS,
        "fp8",
        lambda peak, **t: [
            {
                "impl": "cudnn_fp8_s1",
                "batch": 1,
                "seq_q": 8,
                "seq_kv": 8,
                "heads": 1,
                "kv_heads": 1,
                "head_dim": 8,
                "dtype": "float8_e4m3fn",
                "causal": False,
                "pass": "fwd",
                "status": "unsupported",
                "reason": "simulated",
                "median_ms": None,
                "p10_ms": None,
                "p90_ms": None,
                "tflops": None,
            }
        ],
    )
    monkeypatch.setattr(rec_mod, "_kernel_code_records", lambda: {"mosaic bfloat16": {"status": "ok", "run": 1}})


def test_lessons_are_kept_in_the_provenance_and_merged(fake_gpu, tmp_path, monkeypatch):
    from attention_tutorial.measure import lessons

    out = tmp_path / "gpu.json"
    monkeypatch.setattr(lessons, "lesson_records", lambda **t: {"gqa": [{"impl": "xla"}], "inputs": [{"n": 1}]})
    rec_mod.record(["decode"], out=out, repeats=3, max_seconds=0.1, extras=("lessons",), progress=False, command="t")
    data = results.load(out)
    assert data["provenance"]["lessons"] == {"gqa": [{"impl": "xla"}], "inputs": [{"n": 1}]}
    assert set(data["provenance"]["grids"]) == {"decode", "lessons"}
    monkeypatch.setattr(lessons, "lesson_records", lambda **t: {"gqa": [{"impl": "naive"}]})
    rec_mod.record([], out=out, extras=("lessons",), progress=False, command="again")
    assert results.load(out)["provenance"]["lessons"] == {"gqa": [{"impl": "naive"}], "inputs": [{"n": 1}]}


def test_the_timing_lesson_is_kept_beside_the_other_lessons(fake_gpu, tmp_path, monkeypatch):
    from attention_tutorial.measure import lessons, timing_lesson

    out = tmp_path / "gpu.json"
    monkeypatch.setattr(timing_lesson, "GPU_SHAPE", timing_lesson.CPU_SHAPE)  # the simulated GPU times a CPU size
    monkeypatch.setattr(timing_lesson, "GPU_DTYPE", timing_lesson.CPU_DTYPE)
    monkeypatch.setattr(lessons, "lesson_records", lambda **t: {"gqa": [{"impl": "xla"}]})
    rec_mod.record(["decode"], out=out, repeats=3, max_seconds=0.1, extras=("lessons",), progress=False, command="t")
    rec_mod.record([], out=out, extras=("timing_lesson",), progress=False, command="again")  # measured here, for real
    prov = results.load(out)["provenance"]
    assert set(prov["lessons"]) == {"gqa", "timing"} and set(prov["grids"]) == {"decode", "lessons", "timing_lesson"}
    timing = prov["lessons"]["timing"]
    assert (timing["fn"], timing["inner"], len(timing["samples_ms"]), len(timing["waited_ms"])) == (
        "jax.nn.dot_product_attention",
        10,
        20,
        5,
    )
    assert timing["compile_s"] > 0 and timing["no_wait_ms"] > 0 and min(timing["samples_ms"]) > 0


def test_ablations_are_a_grid_and_the_timeline_is_kept_in_the_provenance_and_merged(fake_gpu, tmp_path, monkeypatch):
    from attention_tutorial.measure import ablations, timeline

    out = tmp_path / "gpu.json"
    rec = {
        "impl": "mosaic",
        "batch": 1,
        "seq_q": 8,
        "seq_kv": 8,
        "heads": 1,
        "kv_heads": 1,
        "head_dim": 8,
        "dtype": "bfloat16",
        "causal": False,
        "pass": "fwd",
        "status": "unsupported",
        "reason": "simulated",
        "median_ms": None,
        "p10_ms": None,
        "p90_ms": None,
        "tflops": None,
        "variant": "no_exp",
        "round": 1,
        "pair": "mosaic",
    }
    monkeypatch.setattr(ablations, "ablation_records", lambda **kw: [rec, {**rec, "impl": "cudnn"}])
    monkeypatch.setattr(timeline, "timeline_records", lambda: {"mosaic": {"status": "ok", "tracks": [1]}})
    rec_mod.record([], out=out, extras=("ablations", "timeline"), progress=False, command="t")
    data = results.load(out)
    assert [(r["grid"], r["impl"], r["variant"]) for r in data["records"]] == [
        ("ablations", "mosaic", "no_exp"),
        ("ablations", "cudnn", "no_exp"),
    ]
    assert data["provenance"]["timeline"] == {"mosaic": {"status": "ok", "tracks": [1]}}
    assert set(data["provenance"]["grids"]) == {"ablations", "timeline"}
    monkeypatch.setattr(timeline, "timeline_records", lambda: {"mosaic_pipe": {"status": "error"}})
    monkeypatch.setattr(timeline, "backward_timeline_records", lambda: {"mosaic_atomic": {"status": "ok"}})
    rec_mod.record([], out=out, extras=("timeline", "timeline_backward"), progress=False, command="again")
    prov = results.load(out)["provenance"]
    assert set(prov["timeline"]) == {"mosaic", "mosaic_pipe"}  # merged, not replaced
    assert prov["timeline_backward"] == {"mosaic_atomic": {"status": "ok"}}
    assert set(prov["grids"]) == {"ablations", "timeline", "timeline_backward"}
    monkeypatch.setattr(timeline, "backward_timeline_records", lambda: {"mosaic": {"status": "ok"}})
    rec_mod.record([], out=out, extras=("timeline_backward",), progress=False, command="once more")
    assert set(results.load(out)["provenance"]["timeline_backward"]) == {"mosaic", "mosaic_atomic"}


def test_record_writes_a_valid_file_grid_by_grid_and_merges(fake_gpu, tmp_path, monkeypatch):
    out = tmp_path / "gpu.json"
    monkeypatch.setattr(rec_mod, "environment", lambda: {**FAKE_ENV, "transformer_engine": "2.20.2"})
    rec_mod.record(
        ["seq_short", "decode"],
        out=out,
        repeats=3,
        max_seconds=0.1,
        progress=False,
        extras=("fp8", "kernel_code"),
        command="test",
    )
    data = results.load(out)
    assert {r["grid"] for r in data["records"]} == {"seq_short", "decode", "fp8"}
    assert [r["reason"] for r in data["records"] if r["grid"] == "fp8"] == ["simulated"]
    assert set(data["provenance"]["grids"]) == {"seq_short", "decode", "fp8", "kernel_code"}
    ok = [r for r in data["records"] if r["status"] == "ok"]
    assert ok and all(r["pct_peak"] == pytest.approx(100 * r["tflops"] / 2.0) for r in ok)
    assert all(r["pct_read"] == pytest.approx(100 * r["gbps"] / 20.0) for r in ok)
    # re-recording one grid (here without TransformerEngine installed) replaces its records and keeps the others
    monkeypatch.setattr(rec_mod, "environment", lambda: dict(FAKE_ENV))
    rec_mod.record(["decode"], out=out, repeats=3, max_seconds=0.1, progress=False, extras=(), command="again")
    data = results.load(out)
    assert {r["grid"] for r in data["records"]} == {"seq_short", "decode", "fp8"}
    assert data["provenance"]["grids"]["decode"]["command"] == "again"
    assert data["provenance"]["grids"]["seq_short"]["command"] == "test"
    assert data["provenance"]["kernel_code"] == {"mosaic bfloat16": {"status": "ok", "run": 1}}  # kept, not dropped
    # each grid keeps the versions it was measured with; the top level names the latest run's
    assert "TransformerEngine 2.20.2" in results.describe(data["provenance"], "fp8")
    assert "TransformerEngine" not in results.describe(data["provenance"], "decode")
    assert "TransformerEngine" not in results.describe(data["provenance"])


def test_unknown_extra(fake_gpu, tmp_path):
    with pytest.raises(ValueError, match="unknown extra"):
        rec_mod.record([], out=tmp_path / "x.json", extras=("int4",))


def test_unknown_extra_and_nothing_to_do(fake_gpu, tmp_path):
    with pytest.raises(ValueError, match="nothing to record"):
        rec_mod.record([], out=tmp_path / "x.json", extras=())
    assert not (tmp_path / "x.json").exists()


def test_points_that_do_not_fit_the_gpu_are_recorded_not_run(fake_gpu, tmp_path, monkeypatch):
    from attention_tutorial.measure import grids

    monkeypatch.setattr(rec_mod, "plan", grids.plan)
    monkeypatch.setattr(rec_mod, "device_memory", lambda: 2**20)  # a 1 MiB "GPU"
    monkeypatch.setattr(
        grids, "points", lambda name, gpu: [p for p in points(name, gpu=False) if p.dtype == "float32"][:2]
    )
    out = tmp_path / "small.json"
    rec_mod.record(["seq_long"], out=out, repeats=3, max_seconds=0.1, progress=False, extras=(), command="t")
    recs = results.load(out)["records"]
    assert len(recs) == 2 and {r["status"] for r in recs} == {"oom"}
    assert all("1.0 MiB" not in r["reason"] and "0.0 GiB" in r["reason"] for r in recs)


def test_a_broken_out_file_is_refused_before_measuring(fake_gpu, tmp_path, monkeypatch):
    out = tmp_path / "gpu.json"
    out.write_text('{"records": [')
    monkeypatch.setattr(rec_mod, "measure_ceilings", lambda: pytest.fail("measured before checking --out"))
    with pytest.raises(results.ResultFileError, match="refusing to record into"):
        rec_mod.record(["decode"], out=out, extras=())
    assert out.read_text() == '{"records": ['


def test_the_shipped_file_is_refused_from_a_dirty_tree(fake_gpu, tmp_path, monkeypatch):
    monkeypatch.setattr(rec_mod.store, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(rec_mod, "environment", lambda: {**FAKE_ENV, "commit": "abc", "dirty": True})
    monkeypatch.setattr(rec_mod, "measure_ceilings", lambda: pytest.fail("measured from a dirty tree"))
    with pytest.raises(RuntimeError, match="uncommitted changes"):
        rec_mod.record(["decode"], extras=())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setattr(
        rec_mod, "measure_ceilings", lambda: {"matmul_bf16_tflops": 2.0, "copy_gbps": 10.0, "read_gbps": 20.0}
    )
    assert rec_mod.record(["decode"], out=elsewhere / "x.json", extras=()).exists()


def test_every_grid_recorded_with_a_commit_in_the_shipped_file_is_clean():
    data = results.recorded()
    stamps = [*data["provenance"].get("grids", {}).values(), *data["provenance"].get("race", {}).values()]
    assert all(s.get("dirty") is not True for s in stamps), [s.get("commit") for s in stamps if s.get("dirty")]


def test_every_extra_is_offered_by_the_cli_and_unknown_ones_are_refused():
    from attention_tutorial import cli

    args = cli._parser().parse_args(["record", "--extras", *rec_mod.EXTRAS])
    assert tuple(args.extras) == tuple(rec_mod.EXTRAS)
    with pytest.raises(
        ValueError,
        match="choose from fp8, device_time, context_parallel, cp_scaling, train, ablations, kernel_code, spills, lessons, "
        "timeline",
    ):
        rec_mod.record(["seq_long"], extras=("nope",))


@pytest.fixture
def clocks(monkeypatch):
    from attention_tutorial.measure import race

    ticks = iter(f"{1980 - i} MHz" for i in range(100))
    monkeypatch.setattr(race, "clocks", lambda: next(ticks))


def test_a_tuning_run_records_each_row_as_it_comes_stamped_like_every_record(fake_gpu, clocks, tmp_path, monkeypatch):
    monkeypatch.setattr(rec_mod, "environment", lambda: {**FAKE_ENV, "commit": "0123abc", "dirty": False})
    out = tmp_path / "gpu.json"
    rec_mod.record(["decode"], out=out, extras=())  # a result file with records and the ceilings
    before = results.load(out)
    where, save = rec_mod.tuning_writer("pipe", out, command="python tools/tune.py pipe")
    rows = []
    with pytest.raises(KeyboardInterrupt):  # a run cut short after two rows
        for tflops in (500.0, None, 510.0):
            if len(rows) == 2:
                raise KeyboardInterrupt
            rows.append({"kernel": "pipe", "H": 128, "causal": False, "config": f"c{len(rows)}", "tflops": tflops})
            save(rows)
    data = results.load(where)
    assert where == out and data["records"] == before["records"]
    assert data["provenance"]["matmul_bf16_tflops"] == before["provenance"]["matmul_bf16_tflops"] == 2.0
    table = results.store.tuning("pipe", "gpu", tmp_path)
    assert [r["tflops"] for r in table["rows"]] == [500.0, None]
    assert {k: table[k] for k in ("gpu", "driver", "jax", "cudnn", "commit", "dirty", "created", "command")} == {
        "gpu": "NVIDIA H200",
        "driver": "580.0",
        "jax": "0.11.2",
        "cudnn": "9.19.0",
        "commit": "0123abc",
        "dirty": False,
        "created": FAKE_ENV["created"],
        "command": "python tools/tune.py pipe",
    }
    assert (table["clocks_before"], table["clocks_after"]) == ("1980 MHz", "1978 MHz")  # at the start, at the last save


def test_a_tuning_run_needs_a_gpu_and_a_committed_tree_for_the_shipped_file(fake_gpu, clocks, tmp_path, monkeypatch):
    monkeypatch.setattr(rec_mod.store, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(rec_mod, "environment", lambda: {**FAKE_ENV, "commit": "abc", "dirty": True})
    with pytest.raises(RuntimeError, match="uncommitted changes"):
        rec_mod.tuning_writer("pipe")
    (tmp_path / "mine").mkdir()
    out, save = rec_mod.tuning_writer("pipe", tmp_path / "mine" / "elsewhere.json")
    save([{"config": "cuDNN", "tflops": 1.0}])
    assert results.store.tuning("pipe", "elsewhere", tmp_path / "mine")["dirty"] is True
    monkeypatch.setattr(rec_mod, "environment", lambda: {**FAKE_ENV, "backend": "cpu", "gpu": None})
    with pytest.raises(RuntimeError, match="times kernels on a GPU"):
        rec_mod.tuning_writer("pipe", tmp_path / "x.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    monkeypatch.setattr(rec_mod, "environment", lambda: dict(FAKE_ENV))
    with pytest.raises(results.ResultFileError, match="not valid JSON"):
        rec_mod.tuning_writer("pipe", broken)
