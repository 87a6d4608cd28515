import json

import jax
import pytest

from attention_tutorial import cli, results
from attention_tutorial.cli import main
from attention_tutorial.measure import sweep

SMALL = ["bench", "--impl", "xla", "naive", "--seq", "32", "64", "-B", "1", "-N", "2", "-H", "16", "--dtype", "float32",
         "--repeats", "3"]  # fmt: skip


def test_env_prints_json(capsys):
    assert main(["env"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["backend"] == jax.default_backend() and env["jax"] == jax.__version__


def test_bench_prints_table_and_saves_a_valid_file_and_merges_into_it(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    assert main([*SMALL, "--save", str(out), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "| XLA |" in text and "TFLOP/s" in text
    data = results.load(out)  # validates: on a CPU too (backend cpu, no GPU, no ceilings measured)
    assert len(data["records"]) == 4 and all(r["status"] == "ok" for r in data["records"])
    assert data["provenance"]["backend"] == jax.default_backend() and "--save" in data["provenance"]["command"]
    assert png.stat().st_size > 1000
    # a second run merges: the same points are replaced, a new one is added, nothing else is lost
    assert main(["bench", "--impl", "xla", "--seq", "32", "128", "-B", "1", "-N", "2", "-H", "16", "--dtype", "float32",
                 "--repeats", "3", "--save", str(out)]) == 0  # fmt: skip
    recs = results.load(out)["records"]
    assert sorted((r["impl"], r["seq_q"]) for r in recs) == [
        ("naive", 32), ("naive", 64), ("xla", 32), ("xla", 64), ("xla", 128)]  # fmt: skip


def test_bench_checks_both_paths_before_measuring(tmp_path, capsys, monkeypatch):
    def never(*a, **k):
        raise AssertionError("measured before checking the paths")

    monkeypatch.setattr(sweep, "run_point", never)
    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "notes"}')
    cases = [
        (["--save", str(notes)], "not a result file"),
        (["--save", str(tmp_path / "missing" / "r.json")], "does not exist"),
        (["--save", str(tmp_path)], "is a folder"),
        (["--plot", str(tmp_path / "r.json")], "image file ending"),
        (["--plot", str(tmp_path / "nowhere" / "r.png")], "does not exist"),
        (["--save", str(tmp_path / "same.png"), "--plot", str(tmp_path / "same.png")], "same file"),
    ]
    for extra, message in cases:
        assert main([*SMALL, *extra]) == 2, extra
        assert message in capsys.readouterr().err, extra
    assert notes.read_text() == '{"my": "notes"}'  # untouched


def test_force_replaces_a_file_that_is_not_a_result_file(tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_text("not json at all")
    assert main([*SMALL[:3], "--seq", "32", *SMALL[7:], "--save", str(notes), "--force"]) == 0
    assert len(results.load(notes)["records"]) == 1


def test_an_interrupted_sweep_keeps_what_it_measured(tmp_path, capsys, monkeypatch):
    out = tmp_path / "r.json"
    real, calls = sweep.run_point, []

    def interrupt_on_the_third(point, **kw):
        calls.append(point)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(point, **kw)

    monkeypatch.setattr(sweep, "run_point", interrupt_on_the_third)
    assert main([*SMALL, "--save", str(out)]) == 130
    captured = capsys.readouterr()
    assert "interrupted: 2 of 4 points" in captured.err and "| XLA |" in captured.out
    assert [r["seq_q"] for r in results.load(out)["records"]] == [32, 64]


def test_a_failing_write_mid_sweep_leaves_the_previous_file(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    assert main([*SMALL[:3], "--seq", "32", *SMALL[7:], "--save", str(out)]) == 0
    before = out.read_bytes()
    monkeypatch.setattr(results.store.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        main([*SMALL, "--save", str(out)])
    assert out.read_bytes() == before


def test_check_outputs_refuses_another_device_s_results(tmp_path):
    h200 = tmp_path / "h200.json"
    h200.write_text((results.RESULTS_DIR / "nvidia-h200.json").read_text())
    here = {"backend": "cpu", "gpu": None}
    assert "holds results of NVIDIA H200" in cli.check_outputs(str(h200), None, provenance=here)[0]
    assert cli.check_outputs(str(h200), None, provenance=here, force=True) == []


def test_record_refuses_without_gpu(capsys):
    if jax.default_backend() == "gpu":
        pytest.skip("on a GPU record would run")
    assert main(["record", "--grids", "seed_shape", "--out", "/nonexistent/x.json"]) == 2
    assert "GPU" in capsys.readouterr().err


def test_bad_arguments_exit_with_usage():
    with pytest.raises(SystemExit):
        main(["bench", "--impl", "flash9"])


def test_compare_runs_a_tiny_grid_here_and_plots_it_beside_the_recorded_h200(tmp_path, capsys, monkeypatch):
    from attention_tutorial.measure import grids
    from attention_tutorial.measure.sweep import Point

    tiny = [Point("xla", 1, t, t, 2, 2, 16, "float32") for t in (16, 32)]
    monkeypatch.setattr(grids, "points", lambda name, live=False: tiny)
    assert main(["compare", "--grids", "seq_long", "--out", str(tmp_path), "--repeats", "3"]) == 0
    text = capsys.readouterr().out
    assert "seq_long: 2/2 points ok here" in text and "recorded:     NVIDIA H200" in text
    assert (tmp_path / "compare-seq_long.png").stat().st_size > 5000
    saved = results.load(tmp_path / f"{jax.default_backend()}.json" if jax.default_backend() != "gpu" else
                         next(tmp_path.glob("*.json")))  # fmt: skip
    assert [r["seq_q"] for r in saved["records"]] == [16, 32] and "seq_long" in saved["provenance"]["grids"]


def test_record_with_nothing_to_do_says_so(capsys):
    assert main(["record", "--grids", "--extras"]) == 2
    assert "nothing to record" in capsys.readouterr().err


def test_bench_refuses_a_device_file_and_bad_sizes_before_measuring(tmp_path, capsys):
    assert main(["bench", "--impl", "xla", "--seq", "64", "-B", "1", "-N", "2", "-H", "16", "--save", "/dev/null"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    out = tmp_path / "r.json"
    assert main(["bench", "--impl", "xla", "--seq", "0", "-B", "1", "-N", "2", "-H", "16", "--save", str(out)]) == 2
    assert "--seq 0: sizes must be positive integers" in capsys.readouterr().err
    assert not out.exists()
