"""IPython start-up file of a docs build run with ATTENTION_TUTORIAL_CELL_TIMES=FILE: each executed cell's seconds
and the XLA compilations it caused, one JSON line per cell (``pid`` tells the pages' kernels apart, in build order).
Prints nothing: the pages' outputs are those of a build without it."""

import json
import os
import time

_LOG = os.environ["ATTENTION_TUTORIAL_CELL_TIMES"]
_cell = {"start": 0.0, "compiles": 0, "compile_s": 0.0}


def _on_compile(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        _cell["compiles"] += 1
        _cell["compile_s"] += duration


def _pre_run_cell(info):
    _cell.update(start=time.perf_counter(), compiles=0, compile_s=0.0)


def _post_run_cell(result):
    first = next((line for line in result.info.raw_cell.splitlines() if line.strip()), "")[:80]
    line = {"pid": os.getpid(), "seconds": round(time.perf_counter() - _cell["start"], 3),
            "compiles": _cell["compiles"], "compile_s": round(_cell["compile_s"], 3), "first_line": first}  # fmt: skip
    with open(_LOG, "a") as f:  # one short write per cell: lines of concurrent kernels do not interleave
        f.write(json.dumps(line) + "\n")


try:
    import jax.monitoring

    jax.monitoring.register_event_duration_secs_listener(_on_compile)
except ImportError:  # a kernel without JAX: times only
    pass
get_ipython().events.register("pre_run_cell", _pre_run_cell)  # noqa: F821  (defined in IPython's start-up namespace)
get_ipython().events.register("post_run_cell", _post_run_cell)  # noqa: F821
