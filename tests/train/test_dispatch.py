"""Training steps timed waiting after each step and queued ahead; the command-buffer setting read from XLA_FLAGS."""

from __future__ import annotations

import subprocess

import jax
import pytest

from attention_tutorial.measure.sweep import check_record
from attention_tutorial.train import dispatch
from attention_tutorial.train.model import TINY


@pytest.mark.parametrize(
    ("flags", "setting"),
    [
        ("", "XLA's default"),
        ("--xla_gpu_autotune_level=0", "XLA's default"),
        ("--xla_gpu_enable_command_buffer=", "off"),
        ("--xla_gpu_enable_command_buffer=FUSION,CUBLAS --xla_dump_to=/tmp/x", "FUSION,CUBLAS"),
        ("--xla_gpu_enable_command_buffer=FUSION --xla_gpu_enable_command_buffer=", "off"),  # the last one wins
    ],
)
def test_the_command_buffer_setting_is_read_from_the_flags(flags, setting):
    assert dispatch.command_buffers(flags) == setting


def test_both_ways_of_waiting_are_timed_on_one_compiled_step():
    recs = dispatch.dispatch_records(("xla", "cudnn"), config=TINY, steps=3, rounds=2)
    assert [(r["impl"], r["waiting"]) for r in recs] == [(i, w) for i in ("xla", "cudnn") for w in dispatch.WAYS]
    assert all(check_record(r) == [] for r in recs)
    every, ahead = recs[:2]
    assert every["status"] == ahead["status"] == "ok"
    assert every["samples"] == 6 and every["steps_per_wait"] == 1  # each step of each round
    assert ahead["samples"] == 2 and ahead["steps_per_wait"] == 3  # one per round: the group's time over 3
    for r in (every, ahead):
        assert 0 < r["queue_ms"] and r["tokens_per_s"] == pytest.approx(
            TINY.batch * TINY.seq_len / r["median_ms"] * 1e3
        )
        assert r["command_buffers"] == dispatch.command_buffers()
    if jax.default_backend() != "gpu":  # cuDNN cannot run here: said, not failed
        assert recs[2]["status"] == recs[3]["status"] == "unsupported" and recs[2]["reason"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": 0}, "steps must be an integer >= 1"),
        ({"rounds": 1.5}, "rounds must be an integer >= 1"),
        ({"impls": "xla"}, "impls must be a list of implementation names"),
        ({"config": "tiny"}, "config must be a train.model.Config"),
        ({"peak_tflops": -1.0}, "peak_tflops must be a finite number > 0"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    args = {"impls": ("xla",), "config": TINY, **kwargs}
    with pytest.raises(ValueError, match=match):
        dispatch.dispatch_records(args.pop("impls"), **args)


def test_the_grid_refuses_unknown_settings_and_records_a_failed_child(monkeypatch):
    with pytest.raises(ValueError, match="settings must be labels from"):
        dispatch.dispatch_grid(("xla",), config="tiny", settings=("on",))
    with pytest.raises(ValueError, match="unknown config"):
        dispatch.dispatch_grid(("xla",), config="huge")
    seen = []

    def failing(cmd, **kw):
        seen.append(kw["env"]["XLA_FLAGS"])
        return subprocess.CompletedProcess(cmd, 1, "", "Traceback ...\nRuntimeError: no GPU left")

    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=0")
    monkeypatch.setattr(dispatch.subprocess, "run", failing)
    recs = dispatch.dispatch_grid(("xla",), config="tiny")
    assert seen == ["--xla_gpu_autotune_level=0", "--xla_gpu_autotune_level=0 --xla_gpu_enable_command_buffer="]
    assert [(r["command_buffers"], r["waiting"], r["status"]) for r in recs] == [
        (s, w, "error") for s in dispatch.COMMAND_BUFFERS for w in dispatch.WAYS
    ]
    assert all(r["reason"] == "RuntimeError: no GPU left" and check_record(r) == [] for r in recs)


def test_a_child_process_times_the_step_with_command_buffers_off():
    recs = dispatch.dispatch_grid(("xla",), config="tiny", settings=("off",), steps=1, rounds=1)
    assert [(r["command_buffers"], r["waiting"], r["status"]) for r in recs] == [
        ("off", "every step", "ok"),
        ("off", "ahead", "ok"),
    ]
