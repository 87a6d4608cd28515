"""Every executable page converts to a notebook that reads as the page does (no MyST markup left, glued values filled
in, included code inlined, dropdowns as <details>) and runs on its own: its first cell installs the package, and
two of them run top to bottom in a fresh virtual environment that has only the package's wheel and a kernel."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
pytest.importorskip("jupytext", reason="install the docs group (nox -s tests does)")
nbformat = pytest.importorskip("nbformat", reason="install the docs group (nox -s tests does)")
sys.path.insert(0, str(DOCS / "_ext"))
import notebooks  # noqa: E402  (docs/_ext/notebooks.py)

URLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
REPO, SITE = URLS["Repository"], URLS["Documentation"]
PAGES = notebooks.executable_pages(DOCS)
FRONT = "---\nfile_format: mystnb\nkernelspec:\n  name: python3\n  display_name: Python 3\n---\n\n"

# MyST that Jupyter does not render, looked for outside code: roles, directives (backtick or colon fences), targets,
# comments and block breaks.
LEFTOVERS = {
    "role": re.compile(r"\{[A-Za-z][\w:.+-]*\}`"),
    "directive": re.compile(r"^[ >]*(`{3,}|~{3,}|:{3,})\s*\{", re.M),
    "colon fence": re.compile(r"^[ >]*:{3,}", re.M),
    "target": re.compile(r"^\([\w.:-]+\)=\s*$", re.M),
    "comment": re.compile(r"^%", re.M),
    "block break": re.compile(r"^\+\+\+", re.M),
}


def _outside_code(markdown: str) -> str:
    """The markdown without fenced code blocks and inline code spans."""
    text = re.sub(r"^(`{3,})[^\n]*\n.*?^\1\s*$", "", markdown, flags=re.M | re.S)
    return re.sub(r"(`+).+?\1", "", text, flags=re.S)


def _leftovers(markdown: str) -> list[str]:
    text = _outside_code(markdown)
    return [f"{what}: {m.group(0)!r}" for what, rx in LEFTOVERS.items() for m in rx.finditer(text)]


class _AnyGlued(dict):
    """Stands in for a build's glued values: every key gets a value that names it; the keys asked for are kept."""

    def __missing__(self, key):
        self.setdefault("_asked", set()).add(key)
        return {"data": {"text/plain": repr(f"glued-{key}"), "text/markdown": f"glued-{key}"}}


def _markdown(nb) -> str:
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def _page(tmp_path, body: str, name: str = "page.md") -> Path:
    (page := tmp_path / name).write_text(FRONT + textwrap.dedent(body))
    return page


def test_the_executable_pages_are_found():
    names = {p.name for p in PAGES}
    assert {"qkv_from_scratch.md", "scaling.md", "pallas_kernels.md"} <= names
    assert not {"index.md", "api.md", "404.md"} & names  # no kernelspec: not notebooks


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_page_is_a_valid_notebook_that_installs_the_package_first(page, tmp_path):
    glued = _AnyGlued()
    path = notebooks.write_notebook(page, REPO, tmp_path, site_url=SITE, glued=glued)
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)  # raises on an invalid notebook
    first = nb.cells[0]
    assert first.cell_type == "code"
    assert "pip" in first.source and "install" in first.source and f"git+{REPO}" in first.source
    assert "Hopper GPU" in first.source
    # every code cell of the page comes through, in order, after the install cell, none needing myst-nb
    text = page.read_text()
    code = [c.source for c in nb.cells[1:] if c.cell_type == "code"]
    assert len(code) == text.count("```{code-cell}")
    assert all(c.strip().splitlines()[-1] in text for c in code if c.strip())
    assert not any(re.search(r"\bmyst_nb\b", c) for c in code)
    for c in code:
        compile(c, page.name, "exec")
    # the text holds no MyST markup, and each value the page pastes is there
    markdown = _markdown(nb)
    assert _leftovers(markdown) == []
    pasted = set(re.findall(r"\{glue(?::\w*)?\}`([^`:]+)", text))
    pasted |= set(re.findall(r"^(?:`{3,}|:{3,})\{glue(?::\w*)?\}\s+(\S+)", text, re.M))  # the directive forms
    assert pasted == glued.get("_asked", set())
    for key in pasted:
        assert f"glued-{key}".replace("_", r"\_") in markdown or f"glued-{key}" in markdown, key
    # included code is inlined: the object or the first line each literalinclude names
    for opts in re.findall(r"```\{literalinclude\}[^\n]*\n((?::[^\n]*\n)*)", text):
        if m := re.search(r"^:pyobject: (\S+)", opts, re.M):
            assert re.search(rf"^\s*(def|class) {m[1].rsplit('.', 1)[-1]}\b", markdown, re.M), m[1]
        if m := re.search(r"^:start-at: (.+)$", opts, re.M):
            assert m[1].strip().strip("\"'") in markdown, m[1]
    # API roles become the name as code: `make_qkv()`
    for name in re.findall(r"\{py:func\}`~[\w.]+\.(\w+)`", text):
        assert f"`{name}()`" in markdown, name


def test_the_install_cell_runs_as_python_and_names_the_hopper_cells():
    nb = notebooks.to_notebook(DOCS / "pallas_kernels.md", REPO, site_url=SITE, glued=_AnyGlued())
    compile(nb.cells[0].source, "install", "exec")
    hopper = notebooks.hopper_cells(nb)
    assert hopper and all(h.startswith("code cell ") for h in hopper)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for h in hopper:  # the numbers point at cells that really run the Mosaic GPU kernel
        n = int(h.split()[2])
        assert "mosaic_flash_attention(" in code[n - 1].source
    assert "; ".join(hopper) in " ".join(line.lstrip("# ") for line in nb.cells[0].source.splitlines())


def test_the_install_cell_installs_the_commit_it_was_built_from():
    cell = notebooks.install_cell(REPO, [], ref="0123abc")
    assert f"git+{REPO}@0123abc" in cell.source
    assert f'git+{REPO}"' in notebooks.install_cell(REPO, []).source  # unpinned without a ref
    with pytest.raises(ValueError, match="ref must be"):
        notebooks.install_cell(REPO, [], ref="main; rm -rf /")


def test_bad_addresses_and_pages_are_refused():
    with pytest.raises(ValueError, match="https:// address"):
        notebooks.install_cell("git@github.com:x/y.git", [])
    with pytest.raises(ValueError, match="no kernelspec"):
        notebooks.to_notebook(DOCS / "api.md", REPO, site_url=SITE)
    with pytest.raises(ValueError, match="site_url"):
        notebooks.to_notebook(DOCS / "timing.md", REPO, site_url="docs/_build/html")


def test_myst_markup_becomes_jupyter_markdown(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n")
    page = _page(
        tmp_path,
        f"""\
        (top)=
        # A page
        % a comment nobody sees

        See [the other page](other.md#a-section), [above](#a-page) and {{py:func}}`~pkg.mod.fn`, {{py:mod}}`pkg.mod`,
        {{term}}`GQA`, {{math}}`x^2`; not `{{py:func}}` in code. Error {{glue:text}}`err:.2f`, {{glue:md}}`table`.

        :::{{dropdown}} Why {{py:func}}`~pkg.mod.fn`?
        :open:

        Because.

        ```{{note}}
        Nested, with {{glue:text}}`err`.
        ```
        :::

        ````{{dropdown}}
        Untitled.
        ````

        ```{{warning}} Careful
        ```

        ```{{literalinclude}} {os.path.relpath(ROOT / "attention_tutorial" / "inputs.py", tmp_path)}
        :pyobject: make_qkv
        ```

        ```{{glue}} fig
        ```

        ```{{code-cell}} ipython3
        :tags: [remove-input]
        if True:
            from myst_nb import glue
        ```
        """,
    )
    glued = {
        "err": {"data": {"text/plain": "0.12345"}},
        "table": {"data": {"text/markdown": "| a |\n|---|\n| 1 |", "text/plain": "<Markdown>"}},
        "fig": {"data": {"image/png": "iVBORw0KGgo=\n", "text/plain": "<Figure>"}},
    }

    def resolve(role, target):
        return (f"{SITE}api.html#{target}", None) if role.startswith("py:") else None

    nb = notebooks.to_notebook(page, REPO, site_url=SITE, glued=glued, resolve=resolve)
    md = _markdown(nb)
    assert _leftovers(md) == []
    assert "top)=" not in md and "a comment" not in md
    assert f"({SITE}other.html#a-section)" in md and f"({SITE}page.html#a-page)" in md
    assert f"[`fn()`]({SITE}api.html#pkg.mod.fn)" in md and f"[`pkg.mod`]({SITE}api.html#pkg.mod)" in md
    assert "GQA" in md and "$x^2$" in md and "`{py:func}`" in md  # inline code is left as it is
    assert "Error 0.12," in md and "| 1 |" in md  # the format spec applies, as the site's glue:text does
    assert md.count("<details") == 2 and md.count("</details>") == 2 and "<details open>" in md
    assert f'<summary>Why <a href="{SITE}api.html#pkg.mod.fn"><code>fn()</code></a>?</summary>' in md
    assert "<summary>Details</summary>" in md  # a dropdown without a title
    assert re.search(r"^> \*\*Note\*\*$", md, re.M) and re.search(r"^> Nested, with 0\.12345\.$", md, re.M)
    assert re.search(r"^> \*\*Warning\*\*\n>\n> Careful$", md, re.M)
    assert re.search(r"^```python\ndef make_qkv\(", md, re.M)  # the function itself, from the package's source
    assert "![fig](data:image/png;base64,iVBORw0KGgo=)" in md
    (code,) = [c for c in nb.cells[1:] if c.cell_type == "code"]
    assert code.metadata["tags"] == ["remove-input"] and code.metadata["jupyter"]["source_hidden"] is True
    assert "myst_nb" not in code.source
    namespace = {}
    exec(code.source, namespace)  # the stand-in, indented where the import was
    assert namespace["glue"]("k", 1.5, display=False) is None


def test_the_glue_stand_in_shows_what_the_page_shows(capsys):
    namespace = {}
    exec(notebooks.code_source("from myst_nb import glue"), namespace)
    namespace["glue"]("hidden", 41, display=False)
    assert capsys.readouterr().out == ""
    namespace["glue"]("shown", 42)  # display=True shows the value, as it does on the page
    assert capsys.readouterr().out.strip() == "42"


def test_what_cannot_be_converted_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="myst_nb beyond"):
        notebooks.code_source("import myst_nb\nmyst_nb.glue('x', 1)", "cell 3")
    page = _page(tmp_path, "Value {glue:text}`missing`.\n")
    with pytest.raises(ValueError, match=r"page\.md: no glued value 'missing'"):
        notebooks.to_notebook(page, REPO, site_url=SITE, glued={})
    page = _page(tmp_path, "```{literalinclude} ../nowhere.py\n```\n", "bad.md")
    with pytest.raises(ValueError, match=r"bad\.md: literalinclude \.\./nowhere\.py"):
        notebooks.to_notebook(page, REPO, site_url=SITE)


def _plain(text: str) -> str:
    """A glued text/plain value as the page shows it: a Python literal's value, else the text itself."""
    try:
        return str(ast.literal_eval(text))
    except (ValueError, SyntaxError):
        return text


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


def test_the_built_notebooks_carry_the_values_the_build_glued():
    html = _built_site()
    executed = html.parent / "jupyter_execute"
    for page in PAGES:
        md = _markdown(nbformat.read(html / "_notebooks" / f"{page.stem}.ipynb", as_version=4))
        assert _leftovers(md) == [], page.name
        glue_file = executed / f"{page.stem}.glue.json"
        keys = set(re.findall(r"\{glue:text\}`([^`:]+)`", page.read_text()))
        if not keys:
            continue
        glued = json.loads(glue_file.read_text())
        for key in keys:  # the plain value, as the page shows it (markdown escapes aside)
            value = _plain(glued[key]["data"]["text/plain"])
            assert value in md.replace("\\", ""), (page.name, key, value)


@pytest.mark.slow
def test_a_built_page_gives_its_notebook_the_glued_values_and_site_links(tmp_path):
    """A small site built with the real configuration: its notebook reads the values myst-nb glued."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(f"exec(open({str(DOCS / 'conf.py')!r}).read())\nhtml_static_path = []\n")
    (src / "api.md").write_text("# API\n\n```{eval-rst}\n.. autofunction:: attention_tutorial.make_qkv\n```\n")
    (src / "index.md").write_text(
        FRONT + "# Glue\n\n```{toctree}\napi\n```\n\n```{code-cell} ipython3\nfrom myst_nb import glue\n"
        "glue('ratio', 2 / 3, display=False)\nglue('words', 'forty-two', display=False)\n```\n\n"
        "Ratio {glue:text}`ratio:.3f`, words {glue:text}`words`, see {py:func}`~attention_tutorial.make_qkv`.\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTENTION_TUTORIAL_REPO_REF": "abc123"}
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", str(src), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    nb = nbformat.read(tmp_path / "out" / "_notebooks" / "index.ipynb", as_version=4)
    md = _markdown(nb)
    assert "Ratio 0.667, words forty-two" in md
    assert f"[`make_qkv()`]({SITE}api.html#attention_tutorial.make_qkv)" in md
    assert f"- [API]({SITE}api.html)" in md
    assert f"git+{REPO}@abc123" in nb.cells[0].source


def _wheel(tmp_path) -> Path:
    """The package's wheel, built from a copy of the checkout's package files (the checkout stays untouched)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "attention_tutorial", src / "attention_tutorial", ignore=ignore)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(src)],
        check=True,
        timeout=600,
    )
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    return wheel


RUNNER = """
import sys, nbformat
from nbclient import NotebookClient
for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=900, resources={"metadata": {"path": "."}}).execute()
    nbformat.write(nb, path)
    print("ran", path)
"""


def _run_fresh(tmp_path, names, extra_cells=None):
    """Run the pages ``names`` as notebooks in a fresh venv holding only the wheel, nbclient and ipykernel (each
    with ``extra_cells[name]`` appended); return {name: executed notebook}, the venv and its outputs checked."""
    venv = tmp_path / "venv"
    system_site = ["--system-site-packages"] if os.environ.get("ATTENTION_TUTORIAL_NB_SYSTEM_SITE") == "1" else []
    subprocess.run([sys.executable, "-m", "venv", *system_site, str(venv)], check=True, timeout=300)
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(_wheel(tmp_path)), "nbclient", "ipykernel"], check=True, timeout=900
    )
    work = tmp_path / "work"  # away from the checkout: the kernel imports the installed wheel
    work.mkdir()
    paths = {}
    for name in names:
        nb = notebooks.to_notebook(DOCS / f"{name}.md", REPO, site_url=SITE, glued=_AnyGlued())
        for source in (extra_cells or {}).get(name, []):
            nb.cells.append(nbformat.v4.new_code_cell(source))
        paths[name] = work / f"{name}.ipynb"
        nbformat.write(nb, paths[name])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {
        "JUPYTER_PATH": str(venv / "share" / "jupyter"),
        "JUPYTER_DATA_DIR": str(tmp_path / "jupyter"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter"),
    }
    proc = subprocess.run(
        [str(py), "-c", RUNNER, *map(str, paths.values())],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    done = {}
    for name, path in paths.items():
        nb = nbformat.read(path, as_version=4)
        errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
        assert errors == [], name
        done[name] = nb
    return done, venv


def _text(cell) -> str:
    return "".join(o.get("text", "") or "".join(o.get("data", {}).get("text/plain", "")) for o in cell.outputs)


@pytest.mark.slow
def test_two_notebooks_run_top_to_bottom_in_a_fresh_environment_with_only_the_wheel(tmp_path):
    """A venv with the wheel, nbclient and ipykernel, nothing of the checkout and no myst-nb. On a machine without
    an index (a GPU builder) set PIP_NO_INDEX=1 and PIP_FIND_LINKS to a folder of wheels, and
    ATTENTION_TUTORIAL_NB_SYSTEM_SITE=1 to build the venv on the system's packages (its CUDA JAX)."""
    import jax

    where = (
        "import importlib.util, sys, jax, attention_tutorial\n"
        "print('PREFIX', sys.prefix)\nprint('PACKAGE', attention_tutorial.__file__)\n"
        "print('MYST_NB', importlib.util.find_spec('myst_nb') is not None)\nprint('BACKEND', jax.default_backend())"
    )
    names = ("qkv_from_scratch", "fused_attention")
    done, venv = _run_fresh(tmp_path, names, {name: [where] for name in names})
    for nb in done.values():
        last = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
        assert f"PREFIX {venv}" in last and f"PACKAGE {venv}" in last and "MYST_NB False" in last, last
        assert f"BACKEND {jax.default_backend()}" in last, last  # a GPU where the tests see one
        assert "install" in nb.cells[0].metadata["tags"] and not nb.cells[0].outputs  # the wheel was there already


@pytest.mark.slow
def test_the_measured_timeline_and_the_ablations_show_in_notebooks_run_from_the_wheel(tmp_path):
    """The recorded warpgroup timeline and the runs without exp2 ship in the wheel: the kernel pages' notebooks,
    run in a fresh venv with only the wheel, draw the timeline and read the ablations."""
    check = (
        "from attention_tutorial.measure.ablations import ablation_ratios\n"
        "from attention_tutorial.results import recorded\n"
        "data = recorded('nvidia-h200')\n"
        "print('ABLATIONS', len(ablation_ratios(data['records'])))\n"
        "print('TIMELINE', *sorted(data['provenance'].get('timeline', {})))"
    )
    done, _ = _run_fresh(tmp_path, ["pallas_kernels", "flash3"], {"pallas_kernels": [check], "flash3": [check]})
    for name, nb in done.items():
        last = _text(nb.cells[-1])
        assert int(last.split("ABLATIONS ")[1].split()[0]) > 0 and "TIMELINE mosaic mosaic_pipe" in last, (name, last)
    timeline_cells = [
        c for c in done["pallas_kernels"].cells if c.cell_type == "code" and "timeline_figure(trace" in c.source
    ]
    assert timeline_cells, "the page no longer draws the measured timeline"
    for cell in timeline_cells:
        assert any("image/png" in o.get("data", {}) for o in cell.outputs), "the measured timeline was not drawn"
        assert "No measured warpgroup timeline" not in _text(cell)
