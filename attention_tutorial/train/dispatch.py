"""Keeping the GPU fed: training steps timed with the host waiting after each one, and with steps queued ahead.

The GPU runs a step's kernels in order, but the host must first queue them. A loop that waits for every step (to
print its loss, say) leaves the GPU idle while the host queues the next step; queuing several steps before waiting
hides that time behind the GPU's work. XLA can also record a step's kernels as CUDA graphs ("command buffers",
its flag ``--xla_gpu_enable_command_buffer``) and launch each graph at once: less for the host to queue, shorter
gaps between kernels. :func:`dispatch_records` times both ways of waiting in this process, with the XLA flags it
was started with; :func:`dispatch_grid` runs it in a child process per command-buffer setting (grid
"train_dispatch").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from .. import registry
from ..inputs import check_int, check_number
from ..measure.compiled import compile_stats
from ..measure.flops import datasheet_peak
from ..measure.sweep import failure_fields
from ..measure.timing import summarize
from .data import batch_at, load_corpus
from .grid import CONFIGS
from .loop import check_corpus, flops_per_token, init_params, make_step, optimizer, step_fields
from .model import GPT, H200, Config

WAYS = ("every step", "ahead")  # the host waits after each step / after queuing a group of steps
FLAG = "--xla_gpu_enable_command_buffer"
COMMAND_BUFFERS = {"XLA's default": None, "off": f"{FLAG}="}  # label -> what is added to XLA_FLAGS


def command_buffers(flags: str | None = None) -> str:
    """The command-buffer setting ``flags`` (default: this process's ``XLA_FLAGS``) asks of XLA: "XLA's default"
    when it does not set :data:`FLAG`, "off" when it sets it empty, else the kinds of kernels it names."""
    flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    value = None
    for word in flags.split():
        if word.startswith(FLAG + "="):
            value = word.split("=", 1)[1]  # the last one wins, as XLA reads them
    return "XLA's default" if value is None else value or "off"


def dispatch_records(
    impls=("cudnn", "mosaic"),
    *,
    config: Config = H200,
    steps: int = 10,
    rounds: int = 5,
    seed: int = 0,
    peak_tflops: float | None = None,
    corpus=None,
) -> list[dict]:
    """Two records per implementation: the training step of ``config`` timed with the host waiting after every
    step, and with ``steps`` steps queued before waiting once ("ahead", each step given the group's time over
    ``steps``); the two ways alternate, ``rounds`` rounds of ``steps`` steps each, on the same compiled step (its
    parameters and optimizer state donated), its batches already on the device.

    Each record holds the step time (median, p10, p90 over its samples: every step when waiting after each, one per
    round ahead), ``queue_ms`` (the host's time to queue one step: the median of the calls' own times), tokens/s,
    TFLOP/s and the MFU against the datasheet's bf16 peak and ``peak_tflops`` (the measured one), and
    ``command_buffers`` (:func:`command_buffers`). An implementation that cannot run here gives records with status
    "unsupported"; one that fails, records with the error.
    """
    steps = check_int("steps", steps, minimum=1, example="10")
    rounds = check_int("rounds", rounds, minimum=1, example="5")
    seed = check_int("seed", seed, minimum=0)
    if peak_tflops is not None:
        peak_tflops = check_number("peak_tflops", peak_tflops, positive=True)
    if not isinstance(config, Config):
        raise ValueError(f"config must be a train.model.Config (e.g. model.H200); got {type(config).__name__}.")
    if isinstance(impls, str) or not all(isinstance(i, str) and i for i in impls):
        raise ValueError(f"impls must be a list of implementation names, e.g. ['cudnn', 'mosaic']; got {impls!r:.80}.")
    corpus = corpus or load_corpus()
    check_corpus(corpus, config)
    out = []
    for impl in impls:
        base = _base(impl, config, steps, rounds)
        reason = registry.why_not(impl, config.attention_shape(), config.dtype, causal=True)
        if reason:
            out += [_untimed(base, way, {"status": "unsupported", "reason": reason}) for way in WAYS]
            continue
        try:
            out += _timed_ways(impl, base, config, steps, rounds, seed, peak_tflops, corpus)
        except Exception as err:  # a failing implementation is a result, not the end of the others
            out += [_untimed(base, way, failure_fields(err)) for way in WAYS]
    return out


def _timed_ways(impl, base, c: Config, steps, rounds, seed, peak_tflops, corpus) -> list[dict]:
    model, opt = GPT(c, impl), optimizer(c, 2 * steps * rounds + 1)
    params = init_params(c, seed)
    opt_state = jax.jit(opt.init)(params)
    batches = jax.block_until_ready(
        [
            jax.device_put(batch_at(corpus.train, batch=c.batch, seq_len=c.seq_len, seed=seed, step=s))
            for s in range(steps)
        ]
    )
    stats = compile_stats(make_step(model, opt), params, opt_state, batches[0], donate_argnums=(0, 1))
    params, opt_state, _ = jax.block_until_ready(stats.compiled(params, opt_state, batches[0]))  # warm-up
    samples = {way: [] for way in WAYS}
    queued = {way: [] for way in WAYS}
    for r in range(rounds):
        for way in WAYS if r % 2 == 0 else WAYS[::-1]:  # alternate which goes first
            start = time.perf_counter()
            for tokens in batches:
                t0 = time.perf_counter()
                params, opt_state, loss = stats.compiled(params, opt_state, tokens)
                queued[way].append((time.perf_counter() - t0) * 1e3)
                if way == "every step":
                    jax.block_until_ready((params, opt_state, loss))
                    samples[way].append((time.perf_counter() - t0) * 1e3)
            jax.block_until_ready((params, opt_state, loss))
            if way == "ahead":
                samples[way].append((time.perf_counter() - start) * 1e3 / steps)
    per_token = flops_per_token(c)["total"]
    tokens = c.batch * c.seq_len
    sheet, basis = datasheet_peak(jax.devices()[0].device_kind, c.dtype)
    out = []
    for way in WAYS:
        median, p10, p90 = summarize(samples[way])
        tflops = per_token * tokens / (median / 1e3) / 1e12
        out.append(
            {
                **base,
                "waiting": way,
                "steps_per_wait": steps if way == "ahead" else 1,
                "status": "ok",
                "median_ms": median,
                "p10_ms": p10,
                "p90_ms": p90,
                "samples": len(samples[way]),
                "queue_ms": float(np.median(queued[way])),
                "tokens_per_s": tokens / (median / 1e3),
                "tflops": tflops,
                "datasheet_tflops": sheet,
                "datasheet_basis": basis,
                "mfu_datasheet_pct": 100 * tflops / sheet if sheet else None,
                "mfu_measured_pct": 100 * tflops / peak_tflops if peak_tflops else None,
                "attention_kernel": stats.attention_kernel,
                "compile_s": stats.compile_s,
            }
        )
    return out


def _base(impl: str, c: Config, steps: int, rounds: int) -> dict:
    return {"impl": impl, **step_fields(c), "command_buffers": command_buffers(), "rounds": rounds, "steps": steps}


def _untimed(base: dict, way: str, fields: dict) -> dict:
    return {**base, "waiting": way, **fields, "median_ms": None, "p10_ms": None, "p90_ms": None, "tflops": None}


def dispatch_grid(
    impls=("cudnn", "mosaic"),
    *,
    config: str = "h200",
    settings=tuple(COMMAND_BUFFERS),
    steps: int = 10,
    rounds: int = 5,
    peak_tflops: float | None = None,
    timeout_s: float = 600,
) -> list[dict]:
    """:func:`dispatch_records` in one child process per command-buffer setting of ``settings`` (labels of
    :data:`COMMAND_BUFFERS`, its flag added to ``XLA_FLAGS``): XLA reads its flags once per process. A child that
    fails or times out gives error records for each implementation and way."""
    if config not in CONFIGS:
        raise ValueError(f"unknown config {config!r}; choose from {sorted(CONFIGS)}.")
    unknown = [s for s in settings if s not in COMMAND_BUFFERS]
    if isinstance(settings, str) or unknown:
        raise ValueError(f"settings must be labels from {list(COMMAND_BUFFERS)}; got {settings!r:.80}.")
    timeout_s = check_number("timeout_s", timeout_s, positive=True, example="600")
    out = []
    for setting in settings:
        flags = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), COMMAND_BUFFERS[setting]) if f)
        env = {**os.environ, "XLA_FLAGS": flags, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # beside a parent's GPU
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "records.json"
            cmd = [
                sys.executable,
                "-m",
                __name__,
                str(path),
                *impls,
                "--config",
                config,
                "--steps",
                str(steps),
                "--rounds",
                str(rounds),
                "--peak-tflops",
                repr(float(peak_tflops or 0)),
            ]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
                reason = (
                    None
                    if done.returncode == 0 and path.exists()
                    else ((done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:300])
                )
            except subprocess.TimeoutExpired:
                reason = f"timed out after {timeout_s} s"
            if reason is None:
                out += json.loads(path.read_text())
                continue
        failed = {"command_buffers": command_buffers(flags), "status": "error", "reason": reason}
        out += [_untimed(_base(impl, CONFIGS[config], steps, rounds), way, failed) for impl in impls for way in WAYS]
    return out


def _main(argv) -> None:
    p = argparse.ArgumentParser(
        prog=f"python -m {__name__}",
        description="Time the training step waiting after each step and queued ahead; "
        "write the records to OUT as JSON.",
    )
    p.add_argument("out", type=Path, help="the JSON file to write (its folder must exist)")
    p.add_argument("impls", nargs="+", help="implementation names of the registry, e.g. cudnn mosaic")
    p.add_argument("--config", choices=sorted(CONFIGS), default="h200", help="the model's size (default h200)")
    p.add_argument("--steps", type=int, default=10, help="steps per round and way (default 10)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, the two ways alternating (default 5)")
    p.add_argument(
        "--peak-tflops", type=float, default=0.0, help="a measured bf16 matmul's TFLOP/s, a reference (0: unknown)"
    )
    a = p.parse_args(argv)
    try:
        recs = dispatch_records(
            a.impls, config=CONFIGS[a.config], steps=a.steps, rounds=a.rounds, peak_tflops=a.peak_tflops or None
        )
    except ValueError as err:
        p.exit(2, f"{p.prog}: error: {err}\n")
    tmp = a.out.with_name(a.out.name + ".tmp")
    tmp.write_text(json.dumps(recs))
    tmp.replace(a.out)


if __name__ == "__main__":
    _main(sys.argv[1:])
