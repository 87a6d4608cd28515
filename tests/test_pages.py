"""Every built page reads in twenty minutes: open text and open tables within budget, no lab words in the open; and
every page shows the code that makes its results (at most a third of its code cells' lines hidden).

"Open" is what a reader sees without clicking: the page's article less everything inside ``<details>`` (sphinx-design
dropdowns and myst-nb's hidden outputs are ``<details>``). A word is any whitespace-separated token of the text, so code
listings, printed outputs, a listing's ``=`` and a heading's link sign all count.
Run on a built site (``nox -s docs`` first; CI sets ATTENTION_TUTORIAL_REQUIRE_HTML=1 so that a missing build fails),
or as a script on any built pages: ``python tests/test_pages.py docs/_build/html/*.html``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "docs" / "_build" / "html"
MAX_WORDS, MAX_TABLES = 4500, 8
# Pages that are reference lists, not lessons: read by lookup, not start to end.
REFERENCE_PAGES = {"api", "glossary", "genindex", "search", "404", "py-modindex"}
LAB_WORDS = ("by the medians", "twin", "ceiling's spreads", "do not settle", "lease", "probe", "review r")
ISSUE_NUMBER = re.compile(r"\bissue\s*#?\d+|\bissue\d+", re.IGNORECASE)
HEX_ID = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{12,64}\b")  # digests and commit hashes


def open_parts(html: str):
    """(open words, open tables, open text) of one built page."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    article = soup.find("article") or soup.body or soup
    for hidden in article.find_all(["details", "script", "style"]):
        hidden.decompose()
    text = article.get_text(" ")
    return len(text.split()), len(article.find_all("table")), text


MAX_HIDDEN = 1 / 3
HIDING_TAGS = ("remove-cell", "remove-input", "hide-input", "hide-cell")
CODE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.S | re.M)
CELL_OPTIONS = re.compile(r"\A(?:---\n.*?^---\n|(?::[\w-]+:[^\n]*\n)+)", re.S | re.M)  # a --- block or :key: lines


def code_lines(source: str) -> tuple[int, int]:
    """(hidden, shown): the non-blank code lines of a MyST page's code cells, split by whether a tag hides the cell's
    code (:data:`HIDING_TAGS`; hide-output and remove-output leave the code in view). Cell options are not code."""
    hidden = shown = 0
    for cell in CODE_CELL.finditer(source):
        options = CELL_OPTIONS.match(cell.group(1))
        tags = re.search(r"^:?tags:\s*\[(.*?)\]", options.group(0), re.M) if options else None
        code = cell.group(1)[options.end() :] if options else cell.group(1)
        n = sum(1 for line in code.splitlines() if line.strip())
        if tags and any(t in tags.group(1) for t in HIDING_TAGS):
            hidden += n
        else:
            shown += n
    return hidden, shown


def _moved() -> set[str]:
    """The pages docs/conf.py redirects (``redirects``): built as a page that sends the reader on, not a lesson."""
    import ast

    for node in ast.parse((ROOT / "docs" / "conf.py").read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["redirects"]:
            return set(ast.literal_eval(node.value))
    return set()


def _pages():
    if not HTML.exists():
        return []
    return sorted(p for p in HTML.glob("*.html") if p.stem not in REFERENCE_PAGES | _moved())


def _require_html():
    if not _pages():
        if os.environ.get("ATTENTION_TUTORIAL_REQUIRE_HTML"):
            pytest.fail(f"no built site under {HTML}: run `nox -s docs` first")
        pytest.skip("the site is not built (nox -s docs)")


def test_code_lines_split_hidden_from_shown_cells():
    page = (
        "# T\n\n```{code-cell} ipython3\n:tags: [remove-cell]\nx = 1\n\ny = 2\n```\n\n"
        "```{code-cell} ipython3\n:tags: [hide-output]\nprint(x)\n```\n\n"
        "```{code-cell} ipython3\n---\ntags: [hide-input]\nmystnb:\n  image:\n    alt: a figure\n---\nplot(x)\n```\n\n"
        "```{code-cell} ipython3\n---\nmystnb:\n  image:\n    alt: a figure\n---\nplot(x)\nelse:\n```\n\n"
        "```python\nnot_a_cell()\n```\n"
    )
    assert code_lines(page) == (3, 3)


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.stem)
def test_each_page_shows_most_of_its_code(page):
    hidden, shown = code_lines(page.read_text(encoding="utf-8"))
    if hidden + shown:
        share = hidden / (hidden + shown)
        assert share <= MAX_HIDDEN, f"{page.name}: {hidden} of {hidden + shown} code lines hidden ({share:.0%})"


def test_the_counter_skips_what_is_folded():
    html = (
        "<html><body><article><h1>Title<a class='headerlink'>¶</a></h1><p>one two three</p>"
        "<details><summary>More</summary><p>hidden words here</p><table></table></details>"
        "<table><tr><td>4</td></tr></table><script>var x = 1;</script></article></body></html>"
    )
    words, tables, text = open_parts(html)
    assert (words, tables) == (6, 1), text  # Title, ¶, one, two, three, 4


@pytest.mark.parametrize("page", _pages() or [None], ids=lambda p: p.stem if p else "unbuilt")
def test_each_page_fits_its_budget(page):
    _require_html()
    words, tables, _ = open_parts(page.read_text(encoding="utf-8"))
    assert words <= MAX_WORDS, f"{page.name}: {words} open words (budget {MAX_WORDS}): fold evidence or split the page"
    assert tables <= MAX_TABLES, f"{page.name}: {tables} open tables (budget {MAX_TABLES}): fold them into dropdowns"


@pytest.mark.parametrize("page", _pages() or [None], ids=lambda p: p.stem if p else "unbuilt")
def test_no_lab_vocabulary_in_open_text(page):
    _require_html()
    _, _, text = open_parts(page.read_text(encoding="utf-8"))
    lower = " ".join(text.lower().split())
    found = [w for w in LAB_WORDS if re.search(rf"\b{re.escape(w)}", lower)]
    found += HEX_ID.findall(text) + ISSUE_NUMBER.findall(text)
    found += re.findall(r"(?:scripts|tools)/\S+", text)
    assert not found, f"{page.name} says {found} in its open text"


def main(paths: list[str]) -> int:
    worst = 0
    for path in paths:
        words, tables, text = open_parts(Path(path).read_text(encoding="utf-8"))
        lower = " ".join(text.lower().split())
        lab = (
            [w for w in LAB_WORDS if re.search(rf"\b{re.escape(w)}", lower)]
            + HEX_ID.findall(text)
            + ISSUE_NUMBER.findall(text)
        )
        over = words > MAX_WORDS or tables > MAX_TABLES
        worst |= over
        print(
            f"{Path(path).stem:28} {words:6d} words {tables:3d} tables{'  OVER' if over else ''}"
            f"{'  lab words: ' + ', '.join(lab) if lab else ''}"
        )
    return int(worst)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
