"""What publishing relies on: one version, the recorded results as package data, and CI workflows that do their job.

Building and installing the wheel is `nox -s package` (run by .ci/run); actionlint checks the workflows' syntax
(`nox -s lint`). These tests read the files themselves.
"""

import re
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
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert [s["uses"].split("@")[0] for s in deploy["steps"]] == ["actions/deploy-pages"]
    assert wf["permissions"] == {"contents": "read"}  # only the notebooks job may write, to its own branch


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
