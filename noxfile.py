"""Sessions: tests, docs, lint, record. `nox` alone runs tests and lint."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.needs_version = ">=2024.10"
nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True

PYPROJECT = nox.project.load_toml("pyproject.toml")
ROOT = Path(__file__).parent
HTML = ROOT / "docs" / "_build" / "html"


def _install(session: nox.Session, *groups: str, extras: str = "") -> None:
    """Install the package (with extras) and dependency groups; skipped under --no-venv --no-install."""
    deps = [d for g in groups for d in nox.project.dependency_groups(PYPROJECT, g)]
    session.install("-e", f".{extras}", *deps)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (GPU tests skip themselves without a GPU)."""
    _install(session, "test", "docs")  # docs: the tests build a page with a failing cell
    session.run("pytest", *session.posargs)


@nox.session(default=False, reuse_venv=True)
def docs(session: nox.Session) -> None:
    """Build the site strictly (warnings and cell errors fail; -T prints a failing cell's traceback)."""
    _install(session, "docs")
    if "--clean" in session.posargs:
        shutil.rmtree(ROOT / "docs" / "_build", ignore_errors=True)
    session.run(
        "python", "-m", "sphinx", "-T", "-W", "--keep-going", "-b", "html", "docs", str(HTML),
        env={"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )  # fmt: skip
    session.log(f"site: {HTML / 'index.html'}")


@nox.session
def lint(session: nox.Session) -> None:
    """Check style and common bugs with ruff."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(default=False, venv_backend="none")
def record(session: nox.Session) -> None:
    """On a GPU: measure every page's grid and write attention_tutorial/results/data/<gpu>.json (uses the current Python)."""
    session.run("python", "-m", "attention_tutorial", "record", *session.posargs)
