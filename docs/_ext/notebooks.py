"""Each executable page (MyST markdown with a kernelspec) as a Jupyter notebook that reads as the page does and runs
on its own: its first cell installs the package.

The page's MyST becomes plain Jupyter markdown: glued values (``{glue:text}`` and friends) are filled in from the
build's executed notebook, roles become code text or links to the site, ``literalinclude`` becomes the code it
includes, dropdowns become ``<details>``, admonitions become block quotes, and every other directive keeps its
content. Code cells that import ``glue`` from myst-nb get a stand-in, so the notebook needs no myst-nb.

Pure functions (jupytext reads the page, markdown-it finds its blocks, myst-parser reads directive options, Sphinx
reads included code, nbformat validates): the Sphinx extension ``publish`` writes the notebooks into the site with
the build's glued values and links, and ``tests/test_notebooks.py`` checks them.
"""

from __future__ import annotations

import base64
import html
import re
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace

import jupytext
import nbformat
from docutils.parsers.rst import Directive, directives
from markdown_it import MarkdownIt
from mdit_py_plugins.colon_fence import colon_fence_plugin
from mdit_py_plugins.deflist import deflist_plugin
from mdit_py_plugins.dollarmath import dollarmath_plugin
from mdit_py_plugins.myst_blocks import myst_block_plugin
from myst_nb.core.variables import format_plain_text
from myst_parser.parsers.directives import parse_directive_text
from sphinx.directives.code import LiteralInclude, LiteralIncludeReader

# A code cell runs live only on a Hopper GPU (H100/H200) when it calls our Mosaic GPU kernel or carries the tag.
HOPPER_TAG = "hopper"
HOPPER_CALLS = re.compile(r"mosaic_flash_attention\(")
FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.S)

# What a link resolver returns for a role's target: the address on the site and the title Sphinx would show.
Resolver = Callable[[str, str], "tuple[str, str | None] | None"]

_MD = (
    MarkdownIt("commonmark", {"html": True})
    .use(colon_fence_plugin)
    .use(dollarmath_plugin)
    .use(myst_block_plugin)
    .use(deflist_plugin)
    .enable("table")
)
_INLINE = MarkdownIt("commonmark", {"html": False})
# A role, or an inline code span (left alone: the first alternative that starts first wins).
_ROLE = re.compile(r"\{(?P<name>[A-Za-z][\w:.+-]*)\}(?P<tick>`+)(?P<body>.+?)(?P=tick)|(?P<code>`+).+?(?P=code)", re.S)
_LINK = re.compile(
    r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)|(?P<code>`+).+?(?P=code)", re.S
)
_TITLE_TARGET = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$", re.S)
_PY_ROLE = re.compile(r"^(?:py:)?(?P<kind>func|meth|class|mod|data|attr|exc|obj|const|type|property)$")
_GLUE_ROLES = {"glue", "glue:", "glue:any", "glue:text", "glue:md"}
_LITERAL_ROLES = {"code", "samp", "file", "command", "program", "literal", "envvar", "option", "kbd", "dfn"}
_ADMONITIONS = {
    "note": "Note",
    "tip": "Tip",
    "hint": "Hint",
    "important": "Important",
    "warning": "Warning",
    "caution": "Caution",
    "attention": "Attention",
    "danger": "Danger",
    "error": "Error",
    "seealso": "See also",
    "todo": "To do",
    "versionadded": "New in version",
    "versionchanged": "Changed in version",
    "deprecated": "Deprecated since version",
}
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|$])")
GLUE_IMPORT = re.compile(r"^(?P<indent>[ \t]*)from myst_nb import glue[ \t]*(?:#.*)?$", re.M)
GLUE_STANDIN = (
    "from IPython.display import display as _show  # stands in for myst-nb's glue: the text shows the glued values\n"
    "def glue(name, value, display=True):\n"
    "    return _show(value) if display else None"
)


class _AnyOptions(dict):
    """A directive's option spec that accepts every option as text (for directives we only unwrap)."""

    def __missing__(self, key):
        return directives.unchanged


class _Generic(Directive):
    has_content, optional_arguments, final_argument_whitespace = True, 1, True
    option_spec = _AnyOptions(open=directives.flag)


class _NoArguments(_Generic):
    optional_arguments = 0


def is_executable(page: Path) -> bool:
    """Whether a docs page is a notebook: MyST markdown whose front matter names a kernel (or jupytext)."""
    m = FRONT_MATTER.match(page.read_text(encoding="utf-8")) if page.suffix == ".md" else None
    return bool(m and re.search(r"^(kernelspec|jupytext):", m.group(1), re.M))


def executable_pages(docs: Path) -> list[Path]:
    """The docs pages that are notebooks, sorted (``docs/*.md``, leaving out the build folders)."""
    return sorted(p for p in docs.glob("*.md") if is_executable(p))


def _heading_before(nb, index: int) -> str | None:
    for cell in reversed(nb.cells[:index]):
        headings = re.findall(r"^#+\s+(.+)$", cell.source, re.M) if cell.cell_type == "markdown" else []
        if headings:
            return headings[-1].strip()
    return None


def hopper_cells(nb) -> list[str]:
    """Where the code cells that need a Hopper GPU are: 'code cell 9 (under “Kernel 2 …”)', counted from 1."""
    found, n = [], 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        n += 1
        if HOPPER_TAG in cell.metadata.get("tags", []) or HOPPER_CALLS.search(cell.source):
            heading = _heading_before(nb, i)
            found.append(f"code cell {n}" + (f" (under “{heading}”)" if heading else ""))
    return found


def install_cell(repo_url: str, hopper: list[str], *, ref: str = "") -> nbformat.NotebookNode:
    """The first cell: install the package from its repository (at ``ref``, a commit or tag, when given; with CUDA
    JAX on a GPU runtime); name the Hopper cells."""
    if not re.match(r"^https://\S+$", repo_url):
        raise ValueError(f"repo_url must be an https:// address of the repository, got {repo_url!r}")
    if ref and not re.fullmatch(r"[\w./-]+", ref):
        raise ValueError(f"ref must be a commit, tag or branch name (letters, digits, . _ / -), got {ref!r}")
    needs = (
        f"Needs a Hopper GPU (H100/H200) to run live: {'; '.join(hopper)}; elsewhere it says why and shows the "
        "recorded H200 results."
        if hopper
        else "No cell here needs a Hopper GPU: the GPU cells run on any recent NVIDIA GPU."
    )
    needs = "".join(f"# {line}\n" for line in textwrap.wrap(needs, 110))
    source = (
        "# Install the tutorial's package from its repository (a minute or two). Runs on a CPU runtime too: the\n"
        "# GPU-only cells say what they need and show the recorded H200 results instead of failing.\n"
        + needs
        + "import importlib.util, shutil, subprocess, sys\n\n"
        + 'if importlib.util.find_spec("attention_tutorial") is None:  # already there (a checkout, a rerun): skip\n'
        + '    extra = "[cuda12]" if shutil.which("nvidia-smi") else ""  # a GPU runtime: JAX with CUDA 12\n'
        + f'    package = f"attention-tutorial{{extra}} @ git+{repo_url}{"@" + ref if ref else ""}"\n'
        + '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)'
    )
    return nbformat.v4.new_code_cell(source, metadata={"tags": ["install"]})


class _Page:
    """What converting one page's markdown needs: where it is, the site, the glued values, the links."""

    def __init__(self, page: Path, repo_url: str, site_url: str, glued: Mapping, resolve: Resolver | None):
        self.page, self.repo_url, self.glued, self.resolve = page, repo_url.rstrip("/"), glued, resolve
        self.site_url = site_url.rstrip("/") + "/"
        self.docs = page.parent
        self.root = next((p for p in page.resolve().parents if (p / "pyproject.toml").exists()), self.docs)

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{self.page.name}: {what}")

    # --- glued values ------------------------------------------------------------------------------------------
    def glue_data(self, key: str) -> dict:
        try:
            entry = self.glued[key]
        except KeyError:
            raise self.fail(
                f"no glued value {key!r}: convert the page after it has been executed, passing its glued values "
                "(the build's jupyter_execute/<page>.glue.json)"
            ) from None
        return entry.get("data", entry)

    def glue_inline(self, role: str, text: str) -> str:
        doc, sep, rest = text.partition("::")
        prefix, rest = (f"{doc}::", rest) if sep else ("", text)
        key, _, fmt = rest.rpartition(":") if role in ("glue:text", "glue:md") and ":" in rest else (rest, "", "")
        data = self.glue_data(prefix + key)
        if role == "glue:md" or (role != "glue:text" and "text/markdown" in data):
            if "text/markdown" not in data:
                raise self.fail(f"the glued value {key!r} has no markdown (it has {sorted(data)})")
            return data["text/markdown"].strip()
        if role != "glue:text" and (image := _image(data)):
            return f"![{key}]({image})"
        if "text/plain" not in data:
            raise self.fail(f"the glued value {key!r} has no text (it has {sorted(data)})")
        return _MD_SPECIAL.sub(r"\\\1", format_plain_text(data["text/plain"], fmt or "s"))

    def glue_block(self, name: str, key: str, body: str) -> str:
        data = self.glue_data(key)
        if "text/markdown" in data and name in ("glue", "glue:any", "glue:md"):
            out = data["text/markdown"].strip()
        elif image := _image(data):
            out = f"![{key}]({image})"
        elif "text/html" in data:
            out = data["text/html"].strip()
        elif "text/plain" in data:
            out = _fence(format_plain_text(data["text/plain"], "s"), "")
        else:
            raise self.fail(f"the glued value {key!r} has nothing to show (it has {sorted(data)})")
        caption = self.markdown(body).strip() if name == "glue:figure" else ""
        return out + (f"\n\n*{caption}*" if caption else "")

    # --- links ---------------------------------------------------------------------------------------------------
    def link(self, role: str, target: str) -> tuple[str, str | None] | None:
        return self.resolve(role, target) if self.resolve else None

    def url(self, target: str) -> str:
        """A link of the page as an absolute address: pages and anchors on the site, other files in the repository."""
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, data:, …
            return target
        path, _, anchor = target.partition("#")
        anchor = f"#{anchor}" if anchor else ""
        if not path:
            return f"{self.site_url}{self.page.stem}.html{anchor}"
        file = (self.docs / path).resolve()
        if file.suffix in (".md", ".ipynb", ".rst") or file.with_suffix(".md").exists():
            return f"{self.site_url}{file.with_suffix('').relative_to(self.docs.resolve()).as_posix()}.html{anchor}"
        if file.suffix.lower() in (".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp"):
            return f"{self.site_url}_images/{file.name}"
        if file.is_relative_to(self.root):
            return f"{self.repo_url}/blob/HEAD/{file.relative_to(self.root).as_posix()}{anchor}"
        return target

    # --- inline --------------------------------------------------------------------------------------------------
    def role(self, m: re.Match) -> str:
        if m["code"]:
            return m[0]
        name, body = m["name"], m["body"]
        if name in _GLUE_ROLES:
            return self.glue_inline("glue:any" if name in ("glue", "glue:") else name, body.strip())
        if name == "math":
            return f"${body}$"
        if name in ("sub", "subscript", "sup", "superscript"):
            tag = name[:3]
            return f"<{tag}>{html.escape(body)}</{tag}>"
        if name == "abbr":
            t = re.match(r"^(?P<title>.+?)\s*\((?P<target>.+)\)$", body.strip(), re.S)
            return f'<abbr title="{html.escape(t["target"])}">{html.escape(t["title"])}</abbr>' if t else body
        explicit = _TITLE_TARGET.match(body)
        title, target = (explicit["title"], explicit["target"]) if explicit else (None, body.strip())
        if py := _PY_ROLE.match(name):
            target = target.lstrip("!")
            if title is None:
                title = target.lstrip("~.").rsplit(".", 1)[-1] if target.startswith("~") else target.lstrip(".")
                title += "()" if py["kind"] in ("func", "meth") else ""
            found = self.link(f"py:{py['kind']}", target.lstrip("~."))
            return f"[{_code(title)}]({found[0]})" if found else _code(title)
        if name in _LITERAL_ROLES:
            return _code(body)
        if name in ("guilabel", "menuselection"):
            return f"**{body}**"
        found = self.link(name, target)  # term, doc, ref, numref, eq, any, download, …
        text = title or (found[1] if found and found[1] else target.lstrip("~!"))
        if name in ("eq", "numref") and not found:
            return f"({text})"
        return f"[{text}]({found[0]})" if found else text

    def inline(self, text: str) -> str:
        text = _ROLE.sub(self.role, text)
        return _LINK.sub(
            lambda m: m[0] if m["code"] else f"{m['bang']}[{m['text']}]({self.url(m['target'])}{m['title'] or ''})",
            text,
        )

    # --- blocks --------------------------------------------------------------------------------------------------
    def markdown(self, text: str) -> str:
        """MyST markdown as Jupyter markdown."""
        lines = text.split("\n")
        out: list[str | None] = list(lines)  # None: the line is dropped
        plain = [True] * len(lines)  # lines whose roles and links are converted
        for tok in _MD.parse(text):
            if tok.map is None:
                continue
            start, end = tok.map
            if tok.type in ("fence", "colon_fence") and tok.info.strip().startswith("{"):
                opening = lines[start]
                prefix = opening[: len(opening) - len(opening.lstrip(" >"))]
                block = self.directive(tok.info.strip(), tok.content).split("\n")
                out[start:end] = [None] * (end - start)
                out[start] = "\n".join((prefix + b) if b else prefix.rstrip() for b in block)
                plain[start:end] = [False] * (end - start)
            elif tok.type in ("fence", "colon_fence", "code_block", "math_block", "math_block_label", "html_block"):
                plain[start:end] = [False] * (end - start)
            elif tok.type in ("myst_target", "myst_line_comment", "myst_block_break"):
                out[start:end] = [None] * (end - start)
            elif tok.type == "dt_open":
                out[start] = f"**{lines[start].strip()}**  "
            elif tok.type == "dd_open":
                out[start] = re.sub(r"^(\s*)[:~]\s+", r"\1", lines[start])
        result, run = [], []
        for line, is_plain in zip(out, plain):
            if line is not None and is_plain:
                run.append(line)
                continue
            if run:
                result.append(self.inline("\n".join(run)))
                run = []
            if line is not None:
                result.append(line)
        if run:
            result.append(self.inline("\n".join(run)))
        return re.sub(r"\n{3,}", "\n\n", "\n".join(result))

    def directive(self, info: str, content: str) -> str:
        name, _, first = info[1:].partition("}")
        name, first = name.strip(), first.strip()
        if name == "literalinclude":
            return self.literalinclude(first, content)
        cls = _NoArguments if name in _ADMONITIONS and name != "admonition" else _Generic
        parsed = parse_directive_text(cls, first, content, validate_options=True)
        args, opts, body = parsed.arguments, parsed.options, "\n".join(parsed.body)
        title = args[0] if args else ""
        if name in ("code-block", "code", "sourcecode", "code-cell"):
            return _fence(body, title or "python")
        if name == "math":
            return f"$$\n{body.strip()}\n$$"
        if name in ("glue", "glue:any", "glue:figure", "glue:md", "glue:math"):
            return self.glue_block(name, title, body)
        admonition = name in _ADMONITIONS or name == "admonition"
        if name == "dropdown" or (admonition and "dropdown" in opts.get("class", "")):
            summary = _INLINE.renderInline(self.inline(title or _ADMONITIONS.get(name, "Details"))).strip()
            opened = " open" if "open" in opts else ""
            return f"<details{opened}>\n<summary>{summary}</summary>\n\n{self.markdown(body).strip()}\n\n</details>"
        if admonition:
            head = title if name == "admonition" else _ADMONITIONS[name] + (f" {title}" if title else "")
            inner = self.markdown(body).strip()
            return "\n".join(f"> {line}" if line else ">" for line in f"**{self.inline(head)}**\n\n{inner}".split("\n"))
        if name in ("figure", "image"):
            alt = opts.get("alt", "")
            caption = self.markdown(body).strip() if name == "figure" else ""
            return f"![{alt}]({self.url(title)})" + (f"\n\n*{caption}*" if caption else "")
        if name == "toctree":
            return self.toctree(opts, body)
        if name == "raw":
            return body if title.strip() == "html" else ""
        if name == "eval-rst":
            return f"*This part is reStructuredText, shown on the site: {self.url('')}*"
        if name == "glossary":
            return self.glossary(body)
        heading = f"**{self.inline(title)}**\n\n" if title else ""  # tab-set, card, grid, container, rubric, …
        return heading + self.markdown(body).strip()

    def literalinclude(self, first: str, content: str) -> str:
        parsed = parse_directive_text(LiteralInclude, first, content, validate_options=True)
        if parsed.warnings:
            raise self.fail(f"literalinclude {first}: {'; '.join(w.msg for w in parsed.warnings)}")
        arg = parsed.arguments[0]  # like Sphinx: relative to the page, or to the docs folder if it starts with /
        path = (self.docs / arg.lstrip("/") if arg.startswith("/") else self.page.parent / arg).resolve()
        try:
            text, _ = LiteralIncludeReader(path, parsed.options, SimpleNamespace(source_encoding="utf-8-sig")).read()
        except (OSError, ValueError) as error:
            raise self.fail(f"literalinclude {arg}: {error}") from error
        language = parsed.options.get("language") or ("python" if path.suffix == ".py" else "")
        caption = parsed.options.get("caption")
        return (f"*{caption}*\n\n" if caption else "") + _fence(text.rstrip("\n"), language)

    def toctree(self, opts: dict, body: str) -> str:
        items = []
        for entry in filter(None, (line.strip() for line in body.splitlines())):
            explicit = _TITLE_TARGET.match(entry)
            title, target = (explicit["title"], explicit["target"]) if explicit else (None, entry)
            if re.match(r"^https?://", target):
                items.append(f"- [{title or target}]({target})")
                continue
            found = self.link("doc", target)
            items.append(f"- [{title or (found and found[1]) or target}]({self.url(target + '.md')})")
        caption = opts.get("caption")
        return (f"**{caption}**\n\n" if caption else "") + "\n".join(items)

    def glossary(self, body: str) -> str:
        out = []
        for line in textwrap.dedent(body).split("\n"):
            if line and not line[0].isspace():
                out += ["", f"**{self.inline(line.strip())}**  "]
            else:
                out.append(self.inline(line.strip()))
        return "\n".join(out).strip()


def _image(data: Mapping) -> str | None:
    for mime in ("image/png", "image/jpeg", "image/svg+xml", "image/gif"):
        if mime in data:
            value = data[mime]
            if mime == "image/svg+xml":
                value = base64.b64encode(value.encode()).decode()
            return f"data:{mime};base64,{''.join(value.split())}"
    return None


def _code(text: str) -> str:
    ticks = "`" * (max((len(t) for t in re.findall(r"`+", text)), default=0) + 1)
    return f"{ticks} {text} {ticks}" if ticks != "`" else f"`{text}`"


def _fence(text: str, language: str) -> str:
    ticks = "`" * max(3, max((len(t) for t in re.findall(r"^\s*(`{3,})", text, re.M)), default=0) + 1)
    return f"{ticks}{language}\n{text.rstrip()}\n{ticks}"


def code_source(source: str, where: str = "a code cell") -> str:
    """A code cell without myst-nb: ``from myst_nb import glue`` becomes a stand-in that shows what the page shows
    (nothing, for ``display=False``); any other use of myst_nb is refused."""
    source = GLUE_IMPORT.sub(lambda m: textwrap.indent(GLUE_STANDIN, m["indent"]), source)
    if re.search(r"\bmyst_nb\b", source):
        raise ValueError(
            f"{where} uses myst_nb beyond `from myst_nb import glue`, which a notebook without myst-nb cannot run; "
            "import glue exactly so (the notebook gets a stand-in for it)"
        )
    return source


def to_notebook(
    page: Path,
    repo_url: str,
    *,
    site_url: str,
    glued: Mapping[str, Mapping] | None = None,
    resolve: Resolver | None = None,
    ref: str = "",
) -> nbformat.NotebookNode:
    """The page as an nbformat-4 notebook that reads as the page does, the install cell first.

    ``site_url``: where the site is published (links to other pages and to the API go there). ``glued``: the values
    the page's code glued, by key (``doc::key`` for another page's), each an output's ``{"data": {mime: value}}``;
    a page that pastes a glued value needs them. ``resolve(role, target)``: the site address and title of a role's
    target (``"py:func"``, ``"term"``, ``"doc"``, …), or None to show it as text. ``ref``: the commit or tag the
    install cell installs. Raises ``ValueError`` if the page is not a notebook, a glued value is missing, or the
    result is not a valid notebook.
    """
    if not is_executable(page):
        raise ValueError(f"{page} is not an executable page (its front matter names no kernelspec)")
    if not re.match(r"^https?://\S+$", site_url):
        raise ValueError(f"site_url must be the http(s) address the site is published at, got {site_url!r}")
    nb = jupytext.read(page, fmt="md:myst")
    for key in ("file_format", "jupytext"):  # the page's own settings, not the notebook's
        nb.metadata.pop(key, None)
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    nb.metadata.setdefault("language_info", {"name": "python"})
    converter = _Page(page, repo_url, site_url, glued if glued is not None else {}, resolve)
    n = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = converter.markdown(cell.source).strip("\n")
        elif cell.cell_type == "code":
            n += 1
            cell.source = code_source(cell.source, f"{page.name}: code cell {n}")
            tags = set(cell.metadata.get("tags", []))
            if tags & {"remove-input", "hide-input", "remove-cell", "hide-cell"}:  # collapsed, still run
                cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
            if tags & {"remove-output", "hide-output", "remove-cell", "hide-cell"}:
                cell.metadata.setdefault("jupyter", {})["outputs_hidden"] = True
    nb.cells.insert(0, install_cell(repo_url, [], ref=ref))
    nb.cells[0] = install_cell(repo_url, hopper_cells(nb), ref=ref)  # counted with the install cell as code cell 1
    for i, cell in enumerate(nb.cells):  # ids are required from nbformat 4.5; keep them stable and readable
        cell["id"] = f"cell-{i}"
    nb.nbformat, nb.nbformat_minor = 4, 5
    nbformat.validate(nb)
    return nb


def write_notebook(page: Path, repo_url: str, outdir: Path, **options) -> Path:
    """Write ``outdir/<page stem>.ipynb`` (``options``: those of ``to_notebook``) and return its path."""
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / f"{page.stem}.ipynb"
    nbformat.write(to_notebook(page, repo_url, **options), path)
    return path
