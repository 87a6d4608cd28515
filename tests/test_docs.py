"""The docs build is strict: a failing cell fails it, and no built page shows an error or traceback."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HTML = DOCS / "_build" / "html"
pytest.importorskip("myst_nb", reason="install the docs group (nox -s tests does)")


def redirects() -> dict[str, str]:
    """docs/conf.py's ``redirects`` (sphinx-reredirects): a moved page's name -> the address it sends readers to."""
    for node in ast.parse((DOCS / "conf.py").read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["redirects"]:
            return ast.literal_eval(node.value)
    raise AssertionError("docs/conf.py sets no `redirects`")


@pytest.mark.slow
def test_a_failing_cell_fails_the_build(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(f"exec(open({str(ROOT / 'docs' / 'conf.py')!r}).read())\nhtml_static_path = []\n")
    (src / "index.md").write_text(
        "---\nfile_format: mystnb\nkernelspec:\n  name: python3\n  display_name: Python 3\n---\n\n# Broken\n\n"
        "```{code-cell} ipython3\nraise RuntimeError('this cell fails on purpose')\n```\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-T", "-W", "-b", "html", str(src), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode != 0
    log = proc.stdout + proc.stderr
    assert "ExecutionError" in log and "index.md" in log  # the build names the failing page
    assert "this cell fails on purpose" in log  # and, with -T (as nox -s docs runs it), the cell's own error
    assert not (tmp_path / "out" / "index.html").exists()


def _pages():
    if not (HTML / "index.html").exists():  # not built, or a build under way
        if os.environ.get("ATTENTION_TUTORIAL_REQUIRE_HTML"):
            pytest.fail(f"{HTML} is missing: build the docs first (nox -s docs)")
        pytest.skip("the site is not built here (nox -s docs builds it)")
    return sorted(HTML.glob("*.html"))


def test_built_pages_hold_no_errors_or_tracebacks():
    pages = _pages()
    assert {p.name for p in pages} >= {"index.html", "qkv_from_scratch.html", "scaling.html", "api.html"}
    for page in pages:
        text = page.read_text()
        assert "Traceback (most recent call last)" not in text, page.name
        assert not re.search(r'class="[^"]*output (traceback|error)', text), page.name
        assert "stderr" not in re.findall(r'class="output (\w+)', text), page.name


def test_a_moved_page_is_a_redirect_in_the_configuration_not_a_page():
    moved = redirects()
    assert moved and "sphinx_reredirects" in (DOCS / "conf.py").read_text()
    for page, target in moved.items():
        assert not (DOCS / f"{page}.md").exists(), f"{page}.md is redirected: its built page would be replaced"
        assert re.fullmatch(r"[a-z0-9_]+\.html", target) and (DOCS / target).with_suffix(".md").exists(), target
    stubs = [p.name for p in DOCS.glob("*.md") if re.search(r"http-equiv.{0,3}refresh", p.read_text(), re.I)]
    assert not stubs, f"{stubs} send readers on by themselves: add them to `redirects` in docs/conf.py instead"


def test_a_built_redirect_sends_the_reader_to_its_page():
    built = {p.stem: p for p in _pages()}
    for page, target in redirects().items():
        html = built[page].read_text()
        assert f'url={target}"' in html and f'var target = "{target}"' in html, html
        assert target.removesuffix(".html") in built


def test_every_executed_page_shows_real_output():
    # the executable pages (a kernelspec in their front matter) but the landing page, whose outputs are glued text
    executable = {p.stem for p in (ROOT / "docs").glob("*.md") if "kernelspec:" in p.read_text()} - {"index"}
    checked = [page for page in _pages() if page.stem in executable]
    assert {page.stem for page in checked} == executable and len(executable) >= 9, sorted(executable)
    for page in checked:
        assert "cell_output" in page.read_text(), f"{page.name} has no executed output"


def test_a_figure_without_alt_text_gets_the_sentence_before_it():
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document
    from publish import describe_figures

    doc = new_document("page", get_default_settings(Parser))
    section = nodes.section("", nodes.title("", "Memory"), nodes.paragraph("", "Compiling is\nenough:"))
    cell = nodes.container("", nodes.container("", nodes.image(uri="x.png", alt="_images/3f9a.png")))
    described = nodes.image(uri="logo.png", alt="Colab logo")
    alone = nodes.section("", nodes.title("", "Alone"), nodes.image(uri="y.png"))
    section += [cell, described]
    doc += [section, alone]
    describe_figures(doc)
    assert cell[0][0]["alt"] == "Figure: Compiling is enough:"  # the paragraph before its cell, on one line
    assert described["alt"] == "Colab logo"  # a real alt text stays
    assert alone[1]["alt"] == "Figure: Alone"  # no paragraph before it: the section's title


def test_no_built_figure_is_described_by_its_file_name():
    named = {
        p.name: re.findall(r'<img alt="([^"]*\.(?:png|svg|jpe?g))"', p.read_text(encoding="utf-8")) for p in _pages()
    }
    assert not {k: v for k, v in named.items() if v}


def test_source_links_point_at_the_entrys_lines_in_the_repository():
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    import inspect

    from publish import source_url

    import attention_tutorial.kernels.reference as reference

    url = source_url(
        "https://github.com/o/r/", "abc123", "py", {"module": reference.__name__, "fullname": "naive_attention"}
    )
    lines, first = inspect.getsourcelines(reference.naive_attention)
    assert url == (
        f"https://github.com/o/r/blob/abc123/attention_tutorial/kernels/reference.py#L{first}-L{first + len(lines) - 1}"
    )
    assert "def naive_attention(" in lines[0]
    method = source_url(
        "https://github.com/o/r",
        "main",
        "py",
        {"module": "attention_tutorial.inputs", "fullname": "AttentionShape.flops"},
    )
    assert method is None or "/blob/main/attention_tutorial/inputs.py#L" in method
    assert (
        source_url("https://github.com/o/r", "main", "py", {"module": reference.__name__, "fullname": "F32_MAX"})
        is None
    )
    assert source_url("https://github.com/o/r", "main", "py", {"module": "numpy", "fullname": "zeros"}) is None
    assert source_url("https://github.com/o/r", "main", "c", {"module": reference.__name__, "fullname": "x"}) is None


def test_the_build_kills_each_kernel_once_its_cells_have_run():
    """A JAX kernel's own exit (its GPU memory, its CUDA context) is not waited for: the outputs are already in."""
    code = (
        f"import runpy; runpy.run_path({str(ROOT / 'docs' / 'conf.py')!r}); import nbformat; "
        "from nbclient import NotebookClient; print(NotebookClient(nbformat.v4.new_notebook()).shutdown_kernel)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "immediate"
