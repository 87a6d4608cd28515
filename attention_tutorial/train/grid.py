"""The "train" grid: the same model, seed and data trained with several attention implementations.

``train_grid(impls, steps=..., config=...)`` returns every run's records (per logged step and a summary), each
implementation in a fresh Python process by default, so that the device's peak memory of each run is its own
(a process's peak only grows) and no run inherits another's compiled programs or allocator state. The children
allocate device memory as they need it (``XLA_PYTHON_CLIENT_PREALLOCATE=false``), so they also run beside a
parent that already holds the GPU (the recorder); the warm-up step absorbs the first allocations. A run that
fails becomes a summary record with status oom / unsupported / error and the reason. Run as a module
(``python -m attention_tutorial.train.grid IMPL STEPS CONFIG SEED LOG_EVERY OUT PEAK_TFLOPS [PERTURB]``, ``--help``
for the rest) it trains one implementation and writes its records to OUT as JSON: that is what each child process
does; bad arguments end it with one line saying which and why (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from ..inputs import check_flag, check_int, check_number
from ..measure.sweep import failure_fields
from .loop import _base, check_args, rounding_step, train_records
from .model import H200, TINY, Config

CONFIGS = {"tiny": TINY, "h200": H200}
DEFAULT_IMPLS = ("cudnn", "xla", "blockwise")


def train_grid(
    impls=DEFAULT_IMPLS,
    *,
    steps: int = 300,
    config: str | Config = "h200",
    seed: int = 0,
    log_every: int = 5,
    isolate: bool = True,
    peak_tflops: float | None = None,
    timeout_s: float = 600,
    twin: bool = True,
    eval_batches: int = 4,
    wait_every: int = 1,
) -> list[dict]:
    """Train ``config`` (a name in ``CONFIGS``, or a :class:`Config` when not ``isolate``) with each of ``impls``;
    all their records, in order. ``twin``: once more with the first implementation that can run here, from weights
    nudged by one rounding step of the config's dtype (records marked ``perturb``), the yardstick for comparing
    loss curves. ``wait_every``: steps dispatched before the host waits (:func:`~.loop.train_records`). Bad arguments raise ``ValueError`` before anything trains; an implementation name the registry
    does not know becomes an error record, as any failing run does."""
    isolate, twin = check_flag("isolate", isolate), check_flag("twin", twin)
    if isinstance(impls, str) or not all(isinstance(i, str) and i for i in impls):
        raise ValueError(f"impls must be a list of implementation names, e.g. ['cudnn', 'xla']; got {impls!r:.80}.")
    if isinstance(config, Config):
        if isolate:
            raise ValueError("isolate=True passes the config to a child by name; give a name from CONFIGS.")
    elif not isinstance(config, str) or config not in CONFIGS:
        raise ValueError(f"unknown config {config!r}; choose from {sorted(CONFIGS)}.")
    cfg = config if isinstance(config, Config) else CONFIGS[config]
    a = check_args(
        "xla",
        steps=steps,
        config=cfg,
        seed=seed,
        log_every=log_every,
        eval_batches=eval_batches,
        peak_tflops=peak_tflops,
        perturb=0.0,
        wait_every=wait_every,
    )
    steps, seed, log_every, eval_batches, peak_tflops, wait_every = (
        a[k] for k in ("steps", "seed", "log_every", "eval_batches", "peak_tflops", "wait_every")
    )
    timeout_s = check_number("timeout_s", timeout_s, positive=True, example="600")
    runs = [(impl, 0.0) for impl in impls] + [
        (first, rounding_step(cfg.dtype)) for first in _runnable(impls, cfg)[:1] if twin
    ]
    records = []
    for impl, perturb in runs:
        if isolate:
            records += _in_child(
                impl, steps, config, seed, log_every, peak_tflops, timeout_s, perturb, eval_batches, wait_every
            )
        else:
            records += _in_process(impl, steps, cfg, seed, log_every, peak_tflops, perturb, eval_batches, wait_every)
    return records


def _runnable(impls, cfg: Config) -> list[str]:
    """The implementations of ``impls`` the registry can run at ``cfg``'s shape here (unknown names left out)."""
    from .. import registry

    shape = cfg.attention_shape()
    return [
        i for i in impls if i in registry.IMPLEMENTATIONS and registry.why_not(i, shape, cfg.dtype, causal=True) is None
    ]


def _in_process(
    impl, steps, cfg: Config, seed, log_every, peak_tflops, perturb=0.0, eval_batches=4, wait_every=1
) -> list[dict]:
    try:
        run = train_records(
            impl,
            steps=steps,
            config=cfg,
            seed=seed,
            log_every=log_every,
            peak_tflops=peak_tflops,
            perturb=perturb,
            eval_batches=eval_batches,
            wait_every=wait_every,
        )
    except Exception as err:  # a failing implementation is a result, not the end of the grid
        return [_failed(impl, cfg, seed, steps, failure_fields(err), perturb)]
    return [*run.records, run.summary]


def _in_child(
    impl, steps, config, seed, log_every, peak_tflops, timeout_s, perturb=0.0, eval_batches=4, wait_every=1
) -> list[dict]:
    cfg = CONFIGS[config]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "records.json"
        cmd = [
            sys.executable,
            "-m",
            __name__,
            impl,
            str(steps),
            config,
            str(seed),
            str(log_every),
            str(out),
            repr(float(peak_tflops or 0)),
            repr(float(perturb)),
            "--eval-batches",
            str(eval_batches),
            "--wait-every",
            str(wait_every),
        ]
        try:
            env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # works beside a parent holding the GPU
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            return [
                _failed(
                    impl, cfg, seed, steps, {"status": "error", "reason": f"timed out after {timeout_s} s"}, perturb
                )
            ]
        if done.returncode != 0 or not out.exists():
            tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:300]
            return [_failed(impl, cfg, seed, steps, {"status": "error", "reason": tail}, perturb)]
        return json.loads(out.read_text())


def _failed(impl, cfg: Config, seed, steps, fields: dict, perturb: float = 0.0) -> dict:
    return {
        **_base(impl, cfg, seed, steps, perturb),
        "kind": "summary",
        **fields,
        "median_ms": None,
        "p10_ms": None,
        "p90_ms": None,
        "tflops": None,
    }


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _arg(convert, check, **kw):
    """An argparse type: the text converted, then checked by an inputs.check_* (its message on failure)."""

    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            kind = "an integer" if convert is int else "a number"
            raise argparse.ArgumentTypeError(f"must be {kind}; got {text!r}") from None
        try:
            return check(value, **kw)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def parse_args(argv) -> argparse.Namespace:
    """The module's command line, checked: every bad argument ends the program with one line (exit status 2)."""
    p = _Parser(
        prog="python -m attention_tutorial.train.grid",
        description="Train one implementation and write its records to OUT as JSON (what each of "
        "train_grid's child processes runs).",
    )
    p.add_argument("impl", help="an implementation name of the registry, e.g. xla")
    p.add_argument("steps", type=_arg(int, lambda x: check_int("STEPS", x, minimum=1)), help="training steps, >= 1")
    p.add_argument("config", choices=sorted(CONFIGS), help="the model's size")
    p.add_argument("seed", type=_arg(int, lambda x: check_int("SEED", x, minimum=0)), help="random seed, >= 0")
    p.add_argument(
        "log_every", type=_arg(int, lambda x: check_int("LOG_EVERY", x, minimum=1)), help="a record every N steps"
    )
    p.add_argument("out", type=Path, help="the JSON file to write (its folder must exist)")
    p.add_argument(
        "peak_tflops",
        type=_arg(float, lambda x: check_number("PEAK_TFLOPS", x, non_negative=True)),
        help="a measured bf16 matmul's TFLOP/s, a reference (0: unknown)",
    )
    p.add_argument(
        "perturb",
        nargs="?",
        default=0.0,
        type=_arg(float, lambda x: check_number("PERTURB", x, non_negative=True)),
        help="nudge the initial weights by this relative amount (a twin run); default 0",
    )
    p.add_argument(
        "--eval-batches",
        type=_arg(int, lambda x: check_int("--eval-batches", x, minimum=0)),
        default=4,
        help="held-out batches evaluated before and after training (default 4)",
    )
    p.add_argument(
        "--wait-every",
        type=_arg(int, lambda x: check_int("--wait-every", x, minimum=1)),
        default=1,
        help="steps dispatched before waiting for the device (default 1: after every step)",
    )
    args = p.parse_args(argv)
    folder = args.out.parent
    if args.out.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        p.error(f"OUT {str(args.out)!r} must be a file in an existing, writable folder")
    try:  # a named pipe would block the write, a device swallow or refuse it: a regular file only
        mode = os.stat(args.out).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG
    except OSError as err:
        p.error(f"OUT {str(args.out)!r}: {err.strerror}; name a file in an existing, writable folder")
    if not stat.S_ISREG(mode):
        kind = (
            "a named pipe"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else ("not a regular file")
        )
        p.error(f"OUT {str(args.out)!r} is {kind}; name a regular file such as r.json")
    return args


def _child(argv) -> None:
    a = parse_args(argv)
    recs = _in_process(
        a.impl,
        a.steps,
        CONFIGS[a.config],
        a.seed,
        a.log_every,
        a.peak_tflops or None,
        a.perturb,
        a.eval_batches,
        a.wait_every,
    )
    try:
        a.out.write_text(json.dumps(recs))
    except OSError as err:
        sys.exit(
            f"python -m attention_tutorial.train.grid: error: OUT {str(a.out)!r}: {err.strerror}; the records "
            "were not written"
        )
    s = recs[-1]
    done = (
        f"{s.get('median_ms') or 0:.1f} ms/step, eval loss {s.get('eval_loss')}" if s["status"] == "ok" else s["reason"]
    )
    print(f"{a.impl}: {s['status']} {done}", file=sys.stderr)


if __name__ == "__main__":
    _child(sys.argv[1:])
