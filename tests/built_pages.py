"""What the last docs build executed, for tests that check a page's numbers against the recorded results."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

EXECUTED = Path(__file__).resolve().parents[1] / "docs" / "_build" / "jupyter_execute"


def executed(name: str) -> Path:
    """The executed file ``name`` (a page's ``.ipynb`` or ``.glue.json``); the test skips when the site is not built,
    and fails under ``ATTENTION_TUTORIAL_REQUIRE_HTML``."""
    path = EXECUTED / name
    if not path.exists():
        if os.environ.get("ATTENTION_TUTORIAL_REQUIRE_HTML"):
            pytest.fail(f"no executed page at {path}: build the docs first")
        pytest.skip("the site is not built (nox -s docs)")
    return path


def glued(page: str) -> dict:
    """What ``page``'s cells glued in the last docs build, as Python values (Markdown as its text; figures left
    out)."""
    out = {}
    for key, output in json.loads(executed(f"{page}.glue.json").read_text()).items():
        data = output["data"]
        if "text/markdown" in data or "image/png" not in data:
            out[key] = data["text/markdown"] if "text/markdown" in data else ast.literal_eval(data["text/plain"])
    return out
