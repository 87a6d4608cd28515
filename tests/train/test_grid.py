"""The train grid: failures become records with their reason; a child process hands its records back."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from attention_tutorial.measure.sweep import check_record
from attention_tutorial.train import grid
from attention_tutorial.train.grid import train_grid
from attention_tutorial.train.model import TINY


def test_a_failing_implementation_becomes_an_error_record():
    (rec,) = train_grid(("no_such_attention",), steps=1, config="tiny", isolate=False, twin=False)
    assert rec["status"] == "error" and "no_such_attention" in rec["reason"]
    assert rec["kind"] == "summary" and rec["median_ms"] is None
    assert check_record(rec) == []


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU's answer for cuDNN")
def test_a_child_process_returns_its_records():
    (rec,) = train_grid(("cudnn",), steps=1, config="tiny", isolate=True, twin=False)
    assert rec["status"] == "unsupported" and "GPU" in rec["reason"]
    assert rec["impl"] == "cudnn" and rec["seq_q"] == 64 and check_record(rec) == []


def test_the_twin_runs_last_with_the_first_implementation_nudged_by_one_rounding_step(monkeypatch):
    runs = []

    def fake(impl, steps, cfg, seed, log_every, peak_tflops, perturb=0.0, eval_batches=4, wait_every=1):
        runs.append((impl, perturb, steps, eval_batches, wait_every))
        return [{"impl": impl, "kind": "summary", "status": "ok"}]

    monkeypatch.setattr(grid, "_in_process", fake)
    for dtype, step in (("bfloat16", 2.0**-7), ("float32", 2.0**-23)):
        runs.clear()
        train_grid(
            ("xla", "naive"),
            steps=3,
            config=dataclasses.replace(TINY, dtype=dtype),
            isolate=False,
            eval_batches=2,
            wait_every=5,
        )
        assert runs == [("xla", 0.0, 3, 2, 5), ("naive", 0.0, 3, 2, 5), ("xla", step, 3, 2, 5)]
    runs.clear()
    train_grid(("xla",), steps=1, config=TINY, isolate=False, twin=False)
    assert runs == [("xla", 0.0, 1, 4, 1)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"impls": "xla"}, "impls must be a list of implementation names"),
        ({"impls": ("xla", None)}, "impls must be a list of implementation names"),
        ({"twin": "no"}, "twin must be True or False"),
        ({"isolate": 1}, "isolate must be True or False"),
        ({"steps": 0}, "steps must be an integer >= 1"),
        ({"steps": 2.5}, "steps must be an integer >= 1"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"log_every": 0}, "log_every must be an integer >= 1"),
        ({"eval_batches": -1}, "eval_batches must be an integer >= 0"),
        ({"timeout_s": -1}, "timeout_s must be a finite number > 0"),
        ({"peak_tflops": float("nan")}, "peak_tflops must be a finite number > 0"),
        ({"config": 3}, "unknown config"),
        ({"wait_every": 0}, "wait_every must be an integer >= 1"),
    ],
)
def test_bad_arguments_are_refused_before_anything_trains(kwargs, match):
    args = {"impls": ("xla",), "steps": 1, "config": "tiny", **kwargs}
    with pytest.raises(ValueError, match=match):
        train_grid(args.pop("impls"), **args)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], "required"),
        (["xla", "2.5", "tiny", "0", "1", "{out}", "0"], "steps: must be an integer; got '2.5'"),
        (["xla", "1", "tiny", "-1", "1", "{out}", "0"], "SEED must be an integer >= 0; got -1"),
        (["xla", "1", "huge", "0", "1", "{out}", "0"], "invalid choice: 'huge'"),
        (["xla", "1", "tiny", "0", "0", "{out}", "0"], "LOG_EVERY must be an integer >= 1"),
        (["xla", "1", "tiny", "0", "1", "{out}", "nan"], "PEAK_TFLOPS must be a finite number >= 0"),
        (["xla", "1", "tiny", "0", "1", "{out}", "0", "-1"], "PERTURB must be a finite number >= 0"),
        (["xla", "1", "tiny", "0", "1", "/no/such/folder/r.json", "0"], "existing, writable folder"),
        (["xla", "1", "tiny", "0", "1", "{out}", "0", "--eval-batches", "-1"], "--eval-batches must be an integer"),
        (["xla", "1", "tiny", "0", "1", "{out}", "0", "--wait-every", "0"], "--wait-every must be an integer >= 1"),
    ],
)
def test_the_command_line_refuses_bad_arguments_in_one_line(argv, words, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        grid.parse_args([a.format(out=tmp_path / "r.json") for a in argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and words in err, err


def test_out_must_be_a_regular_file_and_a_failed_write_is_one_line(tmp_path, capsys, monkeypatch):
    import os
    from pathlib import Path

    os.mkfifo(tmp_path / "p.json")
    outs = [(tmp_path / "p.json", "named pipe")] + [(Path("/dev/full"), "a device")] * Path("/dev/full").exists()
    for out, words in outs:
        with pytest.raises(SystemExit) as exit_:  # refused at once: opening a pipe with no reader would block
            grid.parse_args(["xla", "1", "tiny", "0", "1", str(out), "0"])
        assert exit_.value.code == 2 and words in capsys.readouterr().err
    monkeypatch.setattr(grid, "_in_process", lambda *a: [{"status": "ok"}])

    def full(self, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(SystemExit) as exit_:
        grid._child(["xla", "1", "tiny", "0", "1", str(tmp_path / "r.json"), "0"])
    assert "No space left" in str(exit_.value.code) and "r.json" in str(exit_.value.code)


def test_the_module_run_with_bad_arguments_prints_no_traceback(tmp_path):
    import subprocess
    import sys

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "attention_tutorial.train.grid",
            "xla",
            "2.5",
            "tiny",
            "0",
            "1",
            str(tmp_path / "r.json"),
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr and run.stderr.strip().count("\n") == 0
    assert "steps" in run.stderr and not (tmp_path / "r.json").exists()


def test_unknown_config_lists_the_known_ones():
    with pytest.raises(ValueError, match="h200"):
        train_grid(("xla",), config="huge")


@pytest.mark.slow  # three trainings, each compiled: the run order and the nudge alone are checked fast below
def test_the_twin_trains_the_first_implementation_from_nudged_weights():
    # bfloat16: one rounding step is large enough to show
    cfg = dataclasses.replace(TINY, layers=1, d_model=32, heads=2, head_dim=16, seq_len=32, batch=2, dtype="bfloat16")
    recs = train_grid(("xla", "naive"), steps=3, config=cfg, isolate=False, log_every=1, eval_batches=1)
    impls = [r["impl"] for r in recs if r["kind"] == "summary"]
    assert impls == ["xla", "naive", "xla_twin"]
    twin = [r for r in recs if r["impl"] == "xla_twin"]
    assert all(r["perturb"] == 2.0**-7 for r in twin) and all(check_record(r) == [] for r in recs)
    loss = {(r["impl"], r["step"]): r["loss"] for r in recs if r["kind"] == "step"}
    # the nudge moves the curve, by bfloat16 rounding's order, not more
    diffs = [abs(loss[("xla_twin", s)] - loss[("xla", s)]) for s in range(3)]
    assert 0 < max(diffs) < 0.1, diffs


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="cuDNN runs on a GPU: the first runnable is cuDNN there")
def test_the_twin_is_of_the_first_implementation_that_can_run(monkeypatch):
    runs = []
    monkeypatch.setattr(grid, "_in_process", lambda impl, *a, **k: runs.append((impl, a[5])) or [])
    train_grid(("cudnn", "xla"), steps=1, config="tiny", isolate=False, log_every=1)
    assert runs == [("cudnn", 0.0), ("xla", 0.0), ("xla", 2.0**-23)]  # the registry says cuDNN cannot run here
