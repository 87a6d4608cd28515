"""The product speaks of itself only: no issue numbers or bookkeeping words in the package, pages, tools, tests or
the README and changelog; no page cites a file outside the package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLACES = ["attention_tutorial", "docs", "tools", "scripts", "tests", ".github", ".ci"]
FILES = ["README.md", "CHANGELOG.md", "noxfile.py", "pyproject.toml"]
SUFFIXES = {".py", ".md", ".sh", ".toml", ".yml", ".yaml", ".txt", ".cfg", ""}
BOOKKEEPING = re.compile(r"(?i:\bissue\s*#?\d+|\bissue\d+|\bsession\s+\d+)|\b[Rr]eview\s+R\d+|\(R\d+\)")


def product_files():
    files = [ROOT / f for f in FILES if (ROOT / f).exists()]
    for place in PLACES:
        for path in sorted((ROOT / place).rglob("*")) if (ROOT / place).exists() else []:
            parts = set(path.relative_to(ROOT).parts)
            if path.is_file() and path.suffix in SUFFIXES and not parts & {"_build", "__pycache__", "jupyter_execute"}:
                files.append(path)
    return files


def test_the_pattern_catches_bookkeeping():
    for text in ("see issue 17", "issue17_probe.json", "Issue #3", "(R6)", "review R12"):
        assert BOOKKEEPING.search(text), text
    for text in ("the warpgroup issues a wgmma", "issue the next load", "R6 register", "extent(r2)"):
        assert not BOOKKEEPING.search(text), text


@pytest.mark.parametrize("path", product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_bookkeeping_in_the_product(path):
    if path == Path(__file__):
        return
    hits = [
        f"{n}: {line.strip()[:100]}"
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if BOOKKEEPING.search(line) or BOOKKEEPING.search(path.name)
    ]
    assert not hits, f"{path.relative_to(ROOT)} speaks of its history:\n" + "\n".join(hits)


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_pages_cite_no_file_outside_the_package(page):
    text = page.read_text()
    outside = re.findall(r"(?<![\w/])(?:scripts|tools|tests)/[\w./-]+", text)
    assert not outside, f"{page.name} cites {outside}: the wheel and the notebooks don't have them"
