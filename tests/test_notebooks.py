"""Every executable page converts to a valid notebook whose first cell installs the package from the repository."""

import os
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
pytest.importorskip("jupytext", reason="install the docs group (nox -s tests does)")
nbformat = pytest.importorskip("nbformat", reason="install the docs group (nox -s tests does)")
sys.path.insert(0, str(DOCS / "_ext"))
import notebooks  # noqa: E402  (docs/_ext/notebooks.py)

REPO = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
PAGES = notebooks.executable_pages(DOCS)


def test_the_executable_pages_are_found():
    names = {p.name for p in PAGES}
    assert {"index.md", "qkv_from_scratch.md", "benchmarks.md", "flash_from_scratch.md"} <= names
    assert "api.md" not in names and "404.md" not in names  # no kernelspec: not notebooks


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_page_is_a_valid_notebook_that_installs_the_package_first(page, tmp_path):
    path = notebooks.write_notebook(page, REPO, tmp_path)
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)  # raises on an invalid notebook
    first = nb.cells[0]
    assert first.cell_type == "code"
    assert "pip" in first.source and "install" in first.source and f"git+{REPO}" in first.source
    assert "Hopper GPU" in first.source
    # every code cell of the page comes through, in order, after the install cell
    text = page.read_text()
    code = [c.source for c in nb.cells[1:] if c.cell_type == "code"]
    assert len(code) == text.count("```{code-cell}")
    assert all(c.strip().splitlines()[-1] in text for c in code if c.strip())


def test_the_install_cell_runs_as_python_and_names_the_hopper_cells():
    nb = notebooks.to_notebook(DOCS / "flash_from_scratch.md", REPO)
    compile(nb.cells[0].source, "install", "exec")
    hopper = notebooks.hopper_cells(nb)
    assert hopper and all(h.startswith("code cell ") for h in hopper)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for h in hopper:  # the numbers point at cells that really run the Mosaic GPU kernel
        n = int(h.split()[2])
        assert "mosaic_flash_attention(" in code[n - 1].source
    assert "; ".join(hopper) in " ".join(line.lstrip("# ") for line in nb.cells[0].source.splitlines())


def test_the_repository_address_must_be_an_https_url():
    with pytest.raises(ValueError, match="https:// address"):
        notebooks.install_cell("git@github.com:x/y.git", [])
    with pytest.raises(ValueError, match="no kernelspec"):
        notebooks.to_notebook(DOCS / "api.md", REPO)


def _built_site():
    html = DOCS / "_build" / "html"
    if not (html / "index.html").exists():
        if os.environ.get("ATTENTION_TUTORIAL_REQUIRE_HTML"):
            pytest.fail(f"{html} is missing: build the docs first (nox -s docs)")
        pytest.skip("the site is not built here (nox -s docs builds it)")
    return html


def test_the_built_site_links_each_page_to_its_notebook_and_stamps_it():
    html = _built_site()
    for page in PAGES:
        text = (html / f"{page.stem}.html").read_text()
        assert f"_notebooks/{page.stem}.ipynb" in text and "colab.research.google.com/github/" in text, page.name
        assert "Last executed " in text, f"{page.name} has no stamp: were its cells executed?"
        nbformat.validate(nbformat.read(html / "_notebooks" / f"{page.stem}.ipynb", as_version=4))
    sitemap = (html / "sitemap.xml").read_text()
    assert "index.html</loc>" in sitemap and "404.html" not in sitemap
    assert 'property="og:title"' in (html / "index.html").read_text()
    assert (html / "404.html").exists()
