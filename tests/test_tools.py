"""The developer tools in ``tools/`` that the GPU runs rely on: what they print."""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_compile_probe_names_the_host_and_the_seconds():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "compile_probe.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert re.match(r"host: .+, \d+ cores, load [\d.]+, [\d.]+, [\d.]+; ", line), line
    assert float(re.search(r"compile for the CPU: ([\d.]+) s$", line).group(1)) > 0


def test_cell_times_assigns_each_kernels_cells_to_the_page_it_ran():
    sys.path.insert(0, str(ROOT / "tools"))
    from cell_times import cells_by_page, pages_in_order

    log = (
        "reading sources... [ 10%] a\n/x/a.md: Executed notebook in 3.2 seconds [mystnb]\n"
        "reading sources... [ 20%] api\nreading sources... [ 30%] b\n"
        "/x/b.md: Executed notebook in 1.0 seconds [mystnb]\n"
    )
    assert pages_in_order(log) == ["a", "b"]
    cells = [{"pid": 7, "seconds": 1.0}, {"pid": 7, "seconds": 2.0}, {"pid": 3, "seconds": 0.5}]
    assert {p: [c["seconds"] for c in cs] for p, cs in cells_by_page(cells, ["a", "b"]).items()} == {
        "a": [1.0, 2.0],
        "b": [0.5],
    }


def test_cell_times_lists_the_slowest_compilations_by_name(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "tools"))
    from cell_times import main

    log = tmp_path / "build.log"
    log.write_text("reading sources... [ 10%] a\n/x/a.md: Executed notebook in 3.2 seconds [mystnb]\n")
    cells = [
        {
            "pid": 7,
            "seconds": 3.0,
            "compiles": 2,
            "compile_s": 2.5,
            "first_line": "x = f(q)",
            "programs": [["jit_f", 0.6], ["jit_grad", 1.9]],
        },
        {"pid": 7, "seconds": 0.1, "compiles": 0, "compile_s": 0.0, "first_line": "print(x)"},
    ]
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    assert main([str(tmp_path / "cells.jsonl"), str(log), "5"]) == 0
    listed = capsys.readouterr().out.split("compiled function")[1].splitlines()[1:]
    assert [line.split()[0] for line in listed] == ["1.9", "0.6"] and "a: jit_grad (x = f(q))" in listed[0]


def test_tune_tables_try_configurations_that_fit_their_shapes():
    """Each configuration the register and dQ tables time is one the kernel takes at the table's shape, and the
    registers are the only field a register row changes."""
    import dataclasses

    import jax.numpy as jnp

    sys.path.insert(0, str(ROOT / "tools"))
    import tune

    from attention_tutorial.inputs import AttentionShape
    from attention_tutorial.kernels.mosaic.budget import default_config, fp8_problem, problem

    shape = lambda h: AttentionShape(4, 8192, 8192, 16, 16, h)  # noqa: E731
    dq = {h: dict(tune.backward_configs("bwd_dq", h)) for h in (64, 128)}
    assert next(iter(dq[128])) == "dQ pass" and dq[128]["dQ pass"] == default_config(128)
    assert len(dq[128]) == len(dq[64]) == 4
    assert all(problem(shape(h), jnp.bfloat16, cfg) is None for h in dq for cfg in dq[h].values())
    for h in (128, 256):
        fwd = {label: fn.keywords["config"] for label, fn in tune.candidates("registers", False, h)}
        assert sorted(cfg.registers for cfg in fwd.values()) == [232, 232, 240, 240]
        assert all(problem(shape(h), jnp.bfloat16, cfg) is None for cfg in fwd.values())
        assert all(
            dataclasses.replace(cfg, registers=232) == default_config(h, pipeline=cfg.pipeline) for cfg in fwd.values()
        )
    fp8 = {label: fn.keywords for label, fn in tune.candidates("fp8", True)}
    assert len(fp8) == len(tune.FP8)
    assert all(fp8_problem(shape(128), kw["config"], kw["probe"]) is None for kw in fp8.values())
    assert fp8["FP8 64x128 stages 2 p via registers, exp_poly 0.25"]["probe"].exp_poly == 0.25
