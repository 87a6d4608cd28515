import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

from attention_tutorial import cli, results
from attention_tutorial.cli import main
from attention_tutorial.measure import sweep

SMALL = [
    "bench",
    "--impl",
    "xla",
    "naive",
    "--seq",
    "32",
    "64",
    "-B",
    "1",
    "-N",
    "2",
    "-H",
    "16",
    "--dtype",
    "float32",
    "--repeats",
    "3",
]


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
    assert (
        main(
            [
                "bench",
                "--impl",
                "xla",
                "--seq",
                "32",
                "128",
                "-B",
                "1",
                "-N",
                "2",
                "-H",
                "16",
                "--dtype",
                "float32",
                "--repeats",
                "3",
                "--save",
                str(out),
            ]
        )
        == 0
    )
    recs = results.load(out)["records"]
    assert sorted((r["impl"], r["seq_q"]) for r in recs) == [
        ("naive", 32),
        ("naive", 64),
        ("xla", 32),
        ("xla", 64),
        ("xla", 128),
    ]


def test_bench_checks_both_paths_before_measuring(tmp_path, capsys, monkeypatch):
    def never(*a, **k):
        raise AssertionError("measured before checking the paths")

    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "notes"}')
    readonly = tmp_path / "kept.json"
    assert main([*SMALL[:3], "--seq", "32", *SMALL[7:], "--save", str(readonly)]) == 0  # measures (run_point is
    readonly.chmod(0o444)  # replaced below only), then made read-only
    kept = readonly.read_bytes()
    monkeypatch.setattr(sweep, "run_point", never)
    cases = [
        (["--save", str(notes)], "not a result file"),
        (["--save", str(tmp_path / "missing" / "r.json")], "does not exist"),
        (["--save", str(tmp_path)], "is a folder"),
        (["--plot", str(tmp_path / "r.json")], "image file ending"),
        (["--plot", str(tmp_path / "nowhere" / "r.png")], "does not exist"),
        (["--save", str(tmp_path / "same.png"), "--plot", str(tmp_path / "same.png")], "same file"),
        (["--save", ""], "the path is empty"),
        (["--save", str(tmp_path / "x.png")], "x.json"),
        (["--save", str(tmp_path / ("n" * 251 + ".json"))], "too long"),
        (["--save", f"{tmp_path}/x.json/"], "slash"),
        (["--save", str(readonly)], "read-only"),
        (["--plot", ""], "name an image file"),
        (["--repeats", "0"], "--repeats 0: give a whole number"),
        (["--kv-heads", "3"], "--heads 2 is not a multiple of it"),
    ]
    for extra, message in cases:
        assert main([*SMALL, *extra]) == 2, extra
        assert message in capsys.readouterr().err, extra
    assert notes.read_text() == '{"my": "notes"}' and readonly.read_bytes() == kept  # untouched
    assert not (tmp_path / "x.png").exists()


def test_a_grid_with_sizes_of_its_own_is_refused_naming_each(capsys, monkeypatch):
    monkeypatch.setattr(sweep, "run_point", lambda *a, **k: pytest.fail("measured"))
    assert main(["bench", "--grid", "beyond", "--seq", "16", "-N", "2", "--causal", "--pass", "fwd+bwd"]) == 2
    err = capsys.readouterr().err
    assert all(f"{flag}: --grid beyond" in err for flag in ("--seq 16", "--heads 2", "--causal", "--pass fwd+bwd"))
    assert "--batch" not in err and "--impl" not in err


def test_compare_refuses_an_out_folder_it_cannot_create(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["compare", "--out", str(blocker / "sub"), "--grids", "beyond"]) == 2
    assert "--out" in capsys.readouterr().err and blocker.read_text() == ""


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


def test_a_failing_write_mid_sweep_leaves_the_previous_file_and_shows_the_table(tmp_path, capsys, monkeypatch):
    out = tmp_path / "r.json"
    assert main([*SMALL[:3], "--seq", "32", *SMALL[7:], "--save", str(out)]) == 0
    before = out.read_bytes()
    capsys.readouterr()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results.store.os, "fsync", full)
    assert main([*SMALL, "--save", str(out)]) == 1
    captured = capsys.readouterr()
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    assert captured.out.count("| XLA |") == 1  # the sweep stops at the failed save; what it measured is shown
    (line,) = captured.err.splitlines()  # one line, no traceback
    assert "no space left" in line and "0 of the 1 points above were saved" in line


def test_check_outputs_refuses_another_device_s_results(tmp_path):
    h200 = tmp_path / "h200.json"
    h200.write_text((results.RESULTS_DIR / "nvidia-h200.json").read_text())
    here = {"backend": "cpu", "gpu": None}
    assert "holds results of NVIDIA H200" in cli.check_outputs(str(h200), None, provenance=here)[0]
    older = {**results.load(h200)["provenance"], "jax": "0.9.0"}  # the same GPU, other versions: no relabelling
    assert "relabelled" in cli.check_outputs(str(h200), None, provenance=older)[0]
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
    saved = results.load(
        tmp_path / f"{jax.default_backend()}.json" if jax.default_backend() != "gpu" else next(tmp_path.glob("*.json"))
    )
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


def test_every_command_s_help_works(capsys):
    parser = cli._parser()
    (commands,) = [a.choices for a in parser._subparsers._group_actions]  # every subcommand the parser has
    assert set(commands) == {"bench", "record", "compare", "env"}
    for argv in ([], *([name] for name in commands)):
        with pytest.raises(SystemExit) as done:
            main([*argv, "--help"])
        assert done.value.code == 0, argv
        assert "usage: python -m attention_tutorial" in capsys.readouterr().out, argv


def _command(*args, **kw):
    """``python -m attention_tutorial ARGS`` as a child process, on the CPU, run from a clean folder."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(
        [sys.executable, "-m", "attention_tutorial", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,
    )


def test_bench_help_from_the_command_line():
    proc = _command("bench", "--help")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "--ceilings" in out and "% of it" in out


@pytest.mark.slow  # two processes measure 4 points each: about 10 s on two cores
def test_two_benches_saving_to_one_file_keep_every_point(tmp_path):
    out = tmp_path / "same.json"
    common = [
        "bench",
        "--impl",
        "xla",
        "naive",
        "-B",
        "1",
        "-N",
        "2",
        "-H",
        "16",
        "--dtype",
        "float32",
        "--repeats",
        "3",
        "--save",
        str(out),
    ]
    procs = [_command(*common, "--seq", *seqs, cwd=tmp_path) for seqs in (("32", "64"), ("48", "96"))]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    recs = results.load(out)["records"]
    assert sorted((r["impl"], r["seq_q"]) for r in recs) == [(i, t) for i in ("naive", "xla") for t in (32, 48, 64, 96)]


SWEEP = [
    "bench",
    "--impl",
    "xla",
    "naive",
    "--seq",
    "32",
    "64",
    "128",
    "256",
    "512",
    "1024",
    "-B",
    "1",
    "-N",
    "2",
    "-H",
    "16",
    "--dtype",
    "float32",
    "--repeats",
    "20",
]


def _table_rows(text):
    return [line for line in text.splitlines() if line.startswith(("| XLA |", "| naive"))]


@pytest.mark.slow  # JAX's import, interrupted at two moments: about 5 s
@pytest.mark.parametrize("delay", [0.3, 1.0])
def test_ctrl_c_while_jax_loads_exits_130_at_once(tmp_path, delay):
    out = tmp_path / "r.json"
    proc = _command(*SWEEP, "--save", str(out), "--plot", str(tmp_path / "r.png"))
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    rows = _table_rows(stdout)  # none at 0.3 s (JAX still loads); a fast machine may have measured one by 1 s
    assert len(rows) == (len(results.load(out)["records"]) if out.exists() else 0)
    assert rows == [] or delay > 0.3


@pytest.mark.slow  # three runs to the first saved point: about 15 s
@pytest.mark.parametrize("wait", [0.0, 0.05, 0.2])
def test_ctrl_c_after_the_first_point_prints_and_keeps_what_was_measured(tmp_path, wait):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    proc = _command(*SWEEP, "--save", str(out), "--plot", str(png))
    deadline = time.monotonic() + 120
    while not out.exists() and time.monotonic() < deadline:  # the first point is saved
        time.sleep(0.005)
    time.sleep(wait)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr  # not -11: no crash at shutdown
    rows, saved = _table_rows(stdout), results.load(out)["records"]
    assert 1 <= len(rows) < 12 and len(saved) == len(rows)
    assert f"interrupted: {len(rows)} of 12 points measured" in stderr and "Traceback" not in stderr
    assert png.stat().st_size > 1000


def test_an_interrupted_run_s_plot_says_it_is_partial_and_names_device_dtype_and_shape():
    recs = [
        {
            "impl": "xla",
            "batch": 8192 // t,
            "seq_q": t,
            "seq_kv": t,
            "heads": 16,
            "kv_heads": 4,
            "head_dim": 128,
            "dtype": "bfloat16",
            "causal": False,
            "mask": "none",
            "pass": "fwd",
            "status": "ok",
            "tflops": t / 100,
        }
        for t in (1024, 2048, 4096)
    ]
    fig = cli.bench_figure(recs, device="NVIDIA H200", partial=(3, 8))
    title = fig._suptitle.get_text().replace("\xa0", " ").replace("\n", " ")
    assert title.startswith("PARTIAL (interrupted): 3 of 8 points")
    for words in ("NVIDIA H200", "bfloat16", "B·T = 8192 fixed (B 8–2 as T grows)", "N = 16", "K = 4", "H = 128"):
        assert words in title, words
    whole = cli.bench_figure(recs, device="NVIDIA H200")._suptitle.get_text()
    assert "PARTIAL" not in whole
    # a field that varies without being asked for gets its own lines, never one line through both
    mixed = recs + [{**r, "dtype": "float32", "tflops": r["tflops"] / 10} for r in recs]
    names = cli.bench_figure(mixed).axes[0].get_legend_handles_labels()[1]
    assert len(names) == 2 and all("dtype" in n for n in names)


def test_compare_labels_every_difference_and_says_when_like_is_set_against_like():
    ref = results.recorded()
    recorded = results.select(ref["records"], grid="seq_long", impl="xla", causal=False)
    live = [{**r, "dtype": "float32", "seq_q": r["seq_q"] // 16, "seq_kv": r["seq_kv"] // 16} for r in recorded]
    cpu = {
        **ref["provenance"],
        "backend": "cpu",
        "gpu": None,
        "driver": None,
        "cudnn": None,
        "cpu": "x86_64",
        "grids": {},
    }
    fig = cli.compare_figure("seq_long", live, cpu, recorded, ref["provenance"], by=("impl", "causal"))
    verdict = fig._suptitle.get_text().replace("\xa0", " ").replace("\n", " ")
    assert verdict.startswith("Not like for like")
    assert "device CPU (x86_64) vs NVIDIA H200" in verdict and "dtype float32 vs bfloat16" in verdict
    lo, hi = min(r["seq_q"] for r in recorded), max(r["seq_q"] for r in recorded)
    assert f"T {lo // 16}–{hi // 16} vs {lo}–{hi}" in verdict
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim()  # one T axis for both
    same = cli.compare_figure("seq_long", recorded, ref["provenance"], recorded, ref["provenance"])
    assert same._suptitle.get_text().startswith("Like for like")
