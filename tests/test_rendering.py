"""The built site renders what the pages mean: no raw Markdown tables, no reStructuredText literals, no stray escapes."""

import os
import re
from pathlib import Path

import pytest

HTML = Path(os.environ.get("ATTENTION_TUTORIAL_HTML", Path(__file__).resolve().parents[1] / "docs" / "_build" / "html"))
SKIP = ("genindex.html", "search.html", "py-modindex.html")


def visible_text(html: str) -> str:
    """The page's HTML without code blocks, inline code, math and scripts: what a reader reads as prose/tables."""
    html = re.sub(r"<(pre|script|style)\b.*?</\1>", " ", html, flags=re.S)
    html = re.sub(r'<span class="math[^"]*">.*?</span>', " ", html, flags=re.S)
    html = re.sub(r'<div class="math[^"]*">.*?</div>', " ", html, flags=re.S)
    return re.sub(r"<code\b.*?</code>", " ", html, flags=re.S)


def problems(html: str) -> list[str]:
    """Every rendering defect found in one page's HTML."""
    text = visible_text(html)
    found = []
    plain_blocks = re.findall(r'highlight-text[^"]*"><div class="highlight"><pre>(.*?)</pre>', html, flags=re.S)
    if re.search(r"<p>\s*\|[^<\n]*\|", text) or re.search(r"\|\s*-{3,}\s*\|", text):
        found.append("a Markdown table printed as raw pipe text")
    if "``" in text or any("``" in block for block in plain_blocks):
        found.append("literal double backticks (reStructuredText shown raw)")
    if re.search(r"\\[()]", text):
        found.append(r"a stray \( or \) escape (a $…$ pair read as math)")
    return found


def test_the_scanner_catches_each_defect():
    assert problems("<p>| a | b |\n|---|---|</p>") == ["a Markdown table printed as raw pipe text"]
    assert problems("<p>see ``masks``</p>") == ["literal double backticks (reStructuredText shown raw)"]
    legend = (
        '<div class="highlight-text notranslate"><div class="highlight"><pre>``none``  every query</pre></div></div>'
    )
    assert problems(legend) == ["literal double backticks (reStructuredText shown raw)"]
    assert problems(r"<td>__cublas\(lt\)matmul</td>") == [r"a stray \( or \) escape (a $…$ pair read as math)"]
    clean = (
        r'<p>fine <span class="math notranslate nohighlight">\(x\)</span> <code>``ok``</code></p>'
        "<pre>| not | a table |</pre><table><tr><td>a</td></tr></table>"
    )
    assert problems(clean) == []


def test_built_pages_render_cleanly():
    if not (HTML / "index.html").exists():  # not built, or a build that stopped before writing pages
        if os.environ.get("ATTENTION_TUTORIAL_REQUIRE_HTML"):
            pytest.fail(f"{HTML} is missing: build the docs first (nox -s docs)")
        pytest.skip("the site is not built here (nox -s docs builds it)")
    pages = [p for p in sorted(HTML.glob("*.html")) if p.name not in SKIP]
    assert pages
    bad = {p.name: problems(p.read_text()) for p in pages}
    assert not {name: found for name, found in bad.items() if found}


def test_float64_cells_pin_the_cpu_device():
    # a GPU build runs every page on the GPU, where cuBLASLt has no float64 GEMM ("GEMM is not supported by
    # cublasLt"): every float64 block in a page must put its arrays on the CPU device
    pages = sorted((Path(__file__).resolve().parents[1] / "docs").glob("*.md"))
    bad = [
        f"{p.name}:{i}"
        for p in pages
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "jax.enable_x64(" in line and "default_device(" not in line
    ]
    assert pages and not bad, f"float64 blocks without jax.default_device(jax.devices('cpu')[0]): {bad}"
