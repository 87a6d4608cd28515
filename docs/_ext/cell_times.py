"""Each executed cell's seconds and the XLA compilations it caused, one JSON line per cell, from notebook kernels
(``programs``: the name and seconds of each compilation of half a second or more).

:func:`ipython_dir` makes an IPython directory whose start-up runs this file; a kernel started with ``IPYTHONDIR``
set to it and ``ATTENTION_TUTORIAL_CELL_TIMES=FILE`` in its environment appends a line per cell to FILE (``pid``
tells kernels apart). It prints nothing: the pages' outputs are those of a run without it. The docs build
(``docs/conf.py``) and ``tools/run_notebook.py`` use it.
"""

import atexit
import json
import os
import shutil
import tempfile
import time
from pathlib import Path


def ipython_dir() -> str:
    """A temporary IPython directory (removed at exit) whose profile starts every kernel with this file."""
    root = tempfile.mkdtemp(prefix="ipython-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    startup = Path(root, "profile_default", "startup")
    startup.mkdir(parents=True)
    shutil.copy(__file__, startup / "00-cell-times.py")
    return root


def _start() -> None:
    log = os.environ.get("ATTENTION_TUTORIAL_CELL_TIMES")
    if not log:
        return
    cell = {"start": 0.0, "compiles": 0, "compile_s": 0.0, "programs": []}

    def on_compile(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            cell["compiles"] += 1
            cell["compile_s"] += duration
            if duration >= 0.5:
                cell["programs"].append([str(kwargs.get("fun_name", "?"))[:60], round(duration, 2)])

    def pre_run_cell(info):
        cell.update(start=time.perf_counter(), compiles=0, compile_s=0.0, programs=[])

    def post_run_cell(result):
        first = next((line for line in result.info.raw_cell.splitlines() if line.strip()), "")[:80]
        line = {
            "pid": os.getpid(),
            "seconds": round(time.perf_counter() - cell["start"], 3),
            "compiles": cell["compiles"],
            "compile_s": round(cell["compile_s"], 3),
            "first_line": first,
            "programs": cell["programs"],
        }
        with open(log, "a") as f:  # one short write per cell: lines of concurrent kernels do not interleave
            f.write(json.dumps(line) + "\n")

    try:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(on_compile)
    except ImportError:  # a kernel without JAX: times only
        pass
    shell = get_ipython()  # noqa: F821  (IPython's start-up namespace defines it)
    shell.events.register("pre_run_cell", pre_run_cell)
    shell.events.register("post_run_cell", post_run_cell)


if "get_ipython" in globals():  # run as a kernel's start-up file, not imported
    _start()
