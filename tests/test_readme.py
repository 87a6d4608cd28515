"""The README works as written: its Python example runs on a CPU and prints what the README says it prints, each
command it shows parses and either runs here or says it needs a GPU, and the addresses it gives are pyproject's."""

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from attention_tutorial import cli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
URLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
CPU = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.M | re.S)


def _commands() -> list[tuple[list[str], str]]:
    """Each ``python -m attention_tutorial …`` line of the README's shell blocks: its arguments and its comment."""
    found = []
    for block in _blocks("bash"):
        for line in block.splitlines():
            if line.startswith("python -m attention_tutorial"):
                command, _, comment = line.partition("#")
                found.append((shlex.split(command)[3:], comment))
    return found


def test_the_python_example_runs_on_a_cpu_and_prints_what_the_readme_says(tmp_path):
    (example,) = _blocks("python")
    assert 'implementation="cudnn"' not in example  # cuDNN is named in the prose, for a GPU
    proc = subprocess.run(
        [sys.executable, "-c", example], cwd=tmp_path, env=CPU, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = proc.stdout.strip().splitlines()
    backend, shape = re.match(r"^(\w+) (\([\d, ]+\))", first).groups()
    assert backend == "cpu" and f"`{backend} {shape}`" in README  # the README quotes the line it prints
    assert float(first.rsplit(" ", 1)[1]) < 1e-5  # float32: the fused call and the naive steps agree
    assert second == "library kernels: ()" and "`library kernels: ()`" in README


def test_each_command_parses_and_either_runs_on_a_cpu_or_says_it_needs_a_gpu():
    commands = _commands()
    assert {argv[0] for argv, _ in commands} >= {"env", "bench", "record", "compare"}
    for argv, comment in commands:
        cli._parser().parse_args(argv)  # exits (SystemExit 2) on an option the command does not have
        if argv[0] == "record":  # record measures a GPU's grids: the README must say so on the line
            assert "GPU only" in comment, argv
        if "cudnn" in argv or "mosaic" in argv:
            assert "GPU" in comment, argv


@pytest.mark.slow  # the bench times its points as a user's run would: half a minute on two cores
@pytest.mark.parametrize(
    "argv",
    [a for a, c in _commands() if "GPU" not in c and a[0] in ("env", "bench") and "--grid" not in a],
    ids=lambda a: " ".join(a[:3]),
)
def test_the_quick_commands_run_on_a_cpu(argv, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "attention_tutorial", *argv],
        cwd=tmp_path,
        env=CPU,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [a for a, c in _commands() if "GPU" not in c and ("--grid" in a or a[0] == "compare")],
    ids=lambda a: " ".join(a[:3]),
)
def test_the_grid_commands_run_on_a_cpu_and_write_what_they_name(argv, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "attention_tutorial", *argv],
        cwd=tmp_path,
        env=CPU,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for flag in ("--save", "--plot", "--out"):
        if flag in argv:
            assert (tmp_path / argv[argv.index(flag) + 1]).exists(), flag
    if argv[0] == "compare":
        assert list((tmp_path / "compare").glob("compare-*.png"))


def test_the_readme_gives_the_site_and_the_repository_once_as_pyproject_sets_them():
    for name in ("Documentation", "Repository"):
        url = URLS[name].rstrip("/")
        assert len(re.findall(re.escape(url) + r"/?(?=[>\"\s)])", README)) == 1, name
    assert re.search(r"https://\S+\.github\.io/", README.replace(URLS["Documentation"], "")) is None


def test_the_readme_troubleshoots_the_first_hour():
    section = README.split("## Troubleshooting", 1)[1].split("\n## ", 1)[0]
    for needed in (
        "JAX_PLATFORMS=cpu",
        "nvidia-smi",
        "[cuda12]",
        "[cuda13]",
        "transformer_engine.jax",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
    ):
        assert needed in section, needed
    timings = README.split("Typical timings", 1)[1].split("\n\n", 2)[1]
    rows = [r for r in timings.splitlines() if r.startswith("| `") or r.startswith("| GPU")]
    assert len(rows) == 4, rows
