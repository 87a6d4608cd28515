"""The "train" grid: the same model, seed and data trained with several attention implementations.

``train_grid(impls, steps=..., config=...)`` returns every run's records (per logged step and a summary), each
implementation in a fresh Python process by default, so that the device's peak memory of each run is its own
(a process's peak only grows) and no run inherits another's compiled programs or allocator state. The children
allocate device memory as they need it (``XLA_PYTHON_CLIENT_PREALLOCATE=false``), so they also run beside a
parent that already holds the GPU (the recorder); the warm-up step absorbs the first allocations. A run that
fails becomes a summary record with status oom / unsupported / error and the reason. Run as a module
(``python -m attention_tutorial.train.grid IMPL STEPS CONFIG SEED LOG_EVERY OUT PEAK_TFLOPS [PERTURB]``) it trains one
implementation and writes its records to OUT as JSON: that is what each child process does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..measure.sweep import failure_fields
from .loop import _base, rounding_step, train_records
from .model import H200, TINY, Config

CONFIGS = {"tiny": TINY, "h200": H200}
DEFAULT_IMPLS = ("cudnn", "xla", "blockwise")


def train_grid(impls=DEFAULT_IMPLS, *, steps: int = 300, config: str | Config = "h200", seed: int = 0,
               log_every: int = 5, isolate: bool = True, peak_tflops: float | None = None,
               timeout_s: float = 600, twin: bool = True) -> list[dict]:  # fmt: skip
    """Train ``config`` (a name in ``CONFIGS``, or a :class:`Config` when not ``isolate``) with each of ``impls``;
    all their records, in order. ``twin``: once more with the first implementation that can run here, from weights
    nudged by one rounding step of the config's dtype (records marked ``perturb``), the yardstick for comparing
    loss curves."""
    if isinstance(config, Config):
        if isolate:
            raise ValueError("isolate=True passes the config to a child by name; give a name from CONFIGS.")
    elif config not in CONFIGS:
        raise ValueError(f"unknown config {config!r}; choose from {sorted(CONFIGS)}.")
    cfg = config if isinstance(config, Config) else CONFIGS[config]
    runs = [(impl, 0.0) for impl in impls] + [(first, rounding_step(cfg.dtype)) for first in _runnable(impls, cfg)[:1]
                                              if twin]  # fmt: skip
    records = []
    for impl, perturb in runs:
        if isolate:
            records += _in_child(impl, steps, config, seed, log_every, peak_tflops, timeout_s, perturb)
        else:
            records += _in_process(impl, steps, cfg, seed, log_every, peak_tflops, perturb)
    return records


def _runnable(impls, cfg: Config) -> list[str]:
    """The implementations of ``impls`` the registry can run at ``cfg``'s shape here (unknown names left out)."""
    from .. import registry

    shape = cfg.attention_shape()
    return [
        i for i in impls if i in registry.IMPLEMENTATIONS and registry.why_not(i, shape, cfg.dtype, causal=True) is None
    ]


def _in_process(impl, steps, cfg: Config, seed, log_every, peak_tflops, perturb=0.0) -> list[dict]:
    try:
        run = train_records(impl, steps=steps, config=cfg, seed=seed, log_every=log_every, peak_tflops=peak_tflops,
                            perturb=perturb)  # fmt: skip
    except Exception as err:  # a failing implementation is a result, not the end of the grid
        return [_failed(impl, cfg, seed, steps, failure_fields(err), perturb)]
    return [*run.records, run.summary]


def _in_child(impl, steps, config, seed, log_every, peak_tflops, timeout_s, perturb=0.0) -> list[dict]:
    cfg = CONFIGS[config]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "records.json"
        cmd = [sys.executable, "-m", __name__, impl, str(steps), config, str(seed), str(log_every), str(out),
               str(peak_tflops or 0), str(perturb)]  # fmt: skip
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
    return {**_base(impl, cfg, seed, steps, perturb), "kind": "summary", **fields, "median_ms": None, "p10_ms": None,
            "p90_ms": None, "tflops": None}  # fmt: skip


def _child(argv) -> None:
    impl, steps, config, seed, log_every, out, peak, *rest = argv
    perturb = float(rest[0]) if rest else 0.0
    recs = _in_process(impl, int(steps), CONFIGS[config], int(seed), int(log_every), float(peak) or None, perturb)
    Path(out).write_text(json.dumps(recs))
    s = recs[-1]
    done = f"{s.get('median_ms') or 0:.1f} ms/step, eval loss {s.get('eval_loss')}" if s["status"] == "ok" else s
    print(f"{impl}: {s['status']} {done}", file=sys.stderr)


if __name__ == "__main__":
    _child(sys.argv[1:])
