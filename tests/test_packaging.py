"""What publishing relies on: one version, the recorded results as package data, an sdist that carries the package
and no half of the tests, and CI workflows that do their job on a fresh repository.

Building and installing the wheel is `nox -s package` (run by .ci/run); actionlint checks the workflows' syntax
(`nox -s lint`). These tests read the files themselves; the slow one builds the sdist.
"""

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

import attention_tutorial

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
WORKFLOWS = ROOT / ".github" / "workflows"
yaml = pytest.importorskip("yaml", reason="install the docs group (nox -s tests does)")


def _workflow(name):
    wf = yaml.safe_load((WORKFLOWS / name).read_text())
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as True
    return wf


def _steps(wf):
    return [s for job in wf["jobs"].values() for s in job.get("steps", [])]


def test_the_version_is_set_once_in_the_package():
    assert "version" in PYPROJECT["project"]["dynamic"] and "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "attention_tutorial.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", attention_tutorial.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{attention_tutorial.__version__}]" in changelog


def test_the_recorded_results_are_package_data():
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["attention_tutorial.results"]
    files = [p for pat in patterns for p in (ROOT / "attention_tutorial" / "results").glob(pat)]
    assert any(p.name == "nvidia-h200.json" for p in files), files


def test_ci_tests_both_pythons_builds_the_docs_and_deploys_main_to_pages():
    wf = _workflow("ci.yml")
    assert {"push", "pull_request"} <= set(wf["on"])
    assert wf["jobs"]["tests"]["strategy"]["matrix"]["python"] == ["3.11", "3.12"]
    runs = " ".join(s.get("run", "") for s in _steps(wf))
    for session in ("tests", "lint", "docs", "package"):
        assert f"nox -s {session}" in runs
    uses = [s.get("uses", "") for s in _steps(wf)]
    assert any(u.startswith("actions/upload-pages-artifact@") for u in uses)
    deploy = wf["jobs"]["deploy"]
    assert "refs/heads/main" in deploy["if"] and deploy["environment"]["name"] == "github-pages"
    assert "needs.docs.outputs.pages == 'true'" in deploy["if"]
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert [s["uses"].split("@")[0] for s in deploy["steps"]] == ["actions/deploy-pages"]
    assert wf["permissions"] == {"contents": "read"}  # only the notebooks job may write, to its own branch


def test_on_a_fresh_repository_the_docs_job_skips_the_deploy_until_pages_is_enabled():
    wf = _workflow("ci.yml")
    docs = wf["jobs"]["docs"]
    steps = {s.get("id"): s for s in docs["steps"] if s.get("id")}
    check = steps["pages-enabled"]
    assert "gh api" in check["run"] and "/pages" in check["run"] and "::notice" in check["run"]
    assert "continue-on-error" not in check and docs["permissions"]["pages"] == "read"
    assert 'echo "enabled=true"' in check["run"] and 'echo "enabled=false"' in check["run"]
    # configure-pages fails where Pages is off: it runs only where the check found Pages on
    assert steps["pages"]["uses"].startswith("actions/configure-pages@")
    assert steps["pages"]["if"] == "steps.pages-enabled.outputs.enabled == 'true'"
    assert docs["outputs"]["pages"] == "${{ steps.pages-enabled.outputs.enabled }}"
    # the notebooks branch (Colab's source) does not wait for a deploy that may be skipped
    assert "deploy" not in wf["jobs"]["notebooks"]["needs"] and "docs" in wf["jobs"]["notebooks"]["needs"]


def test_the_deployed_site_leaves_the_build_cache_out():
    steps = _workflow("ci.yml")["jobs"]["docs"]["steps"]
    upload = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    path = steps[upload]["with"]["path"]
    removed = [s for s in steps[:upload] if "rm " in s.get("run", "") and f"{path}/.doctrees" in s["run"]]
    assert removed, "the site artifact would carry Sphinx's .doctrees"
    build = next(i for i, s in enumerate(steps) if "nox -s docs" in s.get("run", ""))
    assert build < steps.index(removed[0]) < upload


def test_the_gpu_workflow_runs_only_where_a_gpu_runner_exists():
    (job,) = _workflow("gpu.yml")["jobs"].values()
    condition = job["if"]
    assert "github.event_name == 'workflow_dispatch'" in condition  # by hand: someone chose to
    (variable,) = re.findall(r"vars\.(\w+) == 'true'", condition)  # weekly: only where the repository says so
    assert variable in (WORKFLOWS / "gpu.yml").read_text().split("\nname:")[0]  # named in the header comment
    assert variable in (ROOT / "README.md").read_text()


def test_the_gpu_workflow_records_only_on_request_and_never_commits():
    wf = _workflow("gpu.yml")
    assert "schedule" in wf["on"] and wf["on"]["workflow_dispatch"]["inputs"]["record"]["type"] == "boolean"
    (job,) = wf["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "gpu"]
    steps = _steps(wf)
    runs = " ".join(s.get("run", "") for s in steps)
    assert "transformer-engine[jax]" in runs and "nox -s docs" in runs
    record = [s for s in steps if "nox -s record" in s.get("run", "")]
    assert record and all(s.get("if") == "inputs.record" for s in record)
    upload = [s for s in steps if s.get("with", {}).get("name") == "recorded-results"]
    assert upload and upload[0]["if"] == "inputs.record" and "results/data" in upload[0]["with"]["path"]
    assert "git commit" not in runs and "git push" not in runs and wf["permissions"] == {"contents": "read"}


def test_every_nox_session_a_workflow_runs_exists():
    sessions = set(re.findall(r"^def (\w+)\(session", (ROOT / "noxfile.py").read_text(), re.M))
    for wf in WORKFLOWS.glob("*.yml"):
        used = set(re.findall(r"nox -s (\w+)", wf.read_text()))
        assert used and used <= sessions, (wf.name, used - sessions)


def test_the_sdist_is_told_to_leave_the_tests_out():
    manifest = (ROOT / "MANIFEST.in").read_text().splitlines()
    assert "prune tests" in manifest


def _sdist_builder(tmp_path) -> Path:
    """A Python that can build the sdist: a fresh venv with the build system pyproject asks for."""
    required = PYPROJECT["build-system"]["requires"]
    venv = tmp_path / "build-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    subprocess.run([str(py), "-m", "pip", "install", "-q", *required], check=True, timeout=600)
    return py


@pytest.mark.slow
def test_the_sdist_carries_the_package_and_its_data_and_none_of_the_tests(tmp_path):
    src = tmp_path / "src"  # a copy of what the repository tracks, so the checkout is left as it is
    ignore = shutil.ignore_patterns(
        ".git",
        ".nox",
        "_build",
        "jupyter_execute",
        "__pycache__",
        "*.egg-info",
        "build",
        "dist",
        ".venv",
        ".pytest_cache",
        ".ruff_cache",
        ".mypy_cache",
        ".hypothesis",
    )
    shutil.copytree(ROOT, src, ignore=ignore)
    py = _sdist_builder(tmp_path)
    build = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    proc = subprocess.run(
        [str(py), "-c", build, str(tmp_path / "dist")], cwd=src, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with tarfile.open(tmp_path / "dist" / proc.stdout.strip().splitlines()[-1]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n or n.startswith("conftest")]
    package = {p.relative_to(ROOT).as_posix() for p in (ROOT / "attention_tutorial").rglob("*.py")}
    assert package <= names, sorted(package - names)
    data = {p.relative_to(ROOT).as_posix() for p in (ROOT / "attention_tutorial" / "results").rglob("*.json")}
    assert data and data <= names, sorted(data - names)
    assert {"pyproject.toml", "README.md", "LICENSE", "PKG-INFO"} <= names
