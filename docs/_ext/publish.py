"""Sphinx extension: every executable page as a notebook (download, Colab) and a "last executed" stamp at its end.

- ``_notebooks/<page>.ipynb`` in the built site, made from the page after it ran (``notebooks.py``): its text as the
  page reads, with the values the build glued and links to the site; its first cell installs the package from
  ``publish_repo_url`` (at ``publish_repo_ref``, from ``ATTENTION_TUTORIAL_REPO_REF``, when set);
- on each executable page: "Open in Colab" and ".ipynb" links (in the header and at the end of the page) and the
  device, versions and date that produced its live outputs (``attention_tutorial.results.stamp``), taken from the
  environment the notebook kernels run in and myst-nb's record of when the page ran;
- ``preview.png``: the first plot of ``publish_preview_page``, the site's OpenGraph image.
Colab opens notebooks from GitHub: CI publishes ``_notebooks/`` to the branch ``publish_notebooks_branch``.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from docutils import nodes
from myst_nb.sphinx_ import NbMetadataCollector
from notebooks import is_executable, write_notebook
from sphinx.errors import ExtensionError
from sphinx.util import docname_join, logging

import attention_tutorial
from attention_tutorial.results.stamp import last_executed

LOG = logging.getLogger(__name__)
NB_DIR = "_notebooks"
COLAB_ICON = "_static/images/logo_colab.png"  # shipped by sphinx-book-theme


def colab_url(repo_url: str, branch: str, docname: str) -> str | None:
    """Colab's address for the page's notebook on the repository's notebooks branch (GitHub only, else None)."""
    m = re.match(r"^https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?$", repo_url)
    return f"https://colab.research.google.com/github/{m[1]}/{m[2]}/blob/{branch}/{docname}.ipynb" if m else None


def source_url(repo_url: str, ref: str, domain: str, info: Mapping) -> str | None:
    """Where an API entry's source lives on the repository (``sphinx.ext.linkcode``): the file at ``ref``, the
    entry's lines marked; None outside Python, for an object that has no source file, or one outside the package."""
    if domain != "py" or not info.get("module"):
        return None
    obj = sys.modules.get(info["module"])
    for part in info.get("fullname", "").split("."):
        obj = getattr(obj, part, None)
    obj = inspect.unwrap(obj) if callable(obj) else obj
    try:
        path = Path(inspect.getsourcefile(obj)).resolve()
        lines, first = inspect.getsourcelines(obj)
    except (TypeError, OSError):  # a constant, a built-in, a generated object
        return None
    root = Path(attention_tutorial.__file__).resolve().parents[1]
    if not path.is_relative_to(root / "attention_tutorial"):
        return None
    return f"{repo_url.rstrip('/')}/blob/{ref}/{path.relative_to(root).as_posix()}#L{first}-L{first + len(lines) - 1}"


def _executable(app, docname: str) -> bool:
    return is_executable(Path(app.env.doc2path(docname)))


def _start_environment_report(app) -> None:
    """Start ``python -m attention_tutorial env`` in the notebook kernels' environment as the build begins: it
    starts a JAX backend of its own, which then overlaps the pages' execution instead of following it."""
    app._publish_env_proc = subprocess.Popen(
        [sys.executable, "-m", "attention_tutorial", "env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )


def _kernel_environment(app) -> dict:
    """The environment report of a fresh Python with the notebook kernels' environment (once per build)."""
    if not hasattr(app, "_publish_env"):
        if getattr(app, "_publish_env_proc", None) is None:
            _start_environment_report(app)
        try:
            out, err = app._publish_env_proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            app._publish_env_proc.kill()
            raise ExtensionError("`python -m attention_tutorial env` did not finish in 300 s.") from None
        if app._publish_env_proc.returncode:
            raise ExtensionError(f"`python -m attention_tutorial env` failed:\n{err[-2000:]}")
        app._publish_env = json.loads(out)
    return app._publish_env


def _stop_environment_report(app, exception) -> None:
    proc = getattr(app, "_publish_env_proc", None)
    if proc is not None and proc.poll() is None:  # a build that failed before it needed the report
        proc.kill()
        proc.communicate()


def _notebook_uri(docname: str) -> str:
    return "../" * docname.count("/") + f"{NB_DIR}/{docname}.ipynb"


def _run_yourself(app, docname: str) -> nodes.Node:
    box = nodes.admonition(classes=["tip", "run-this-page"])
    box += nodes.title(text="Run this page yourself")
    para = nodes.paragraph()
    links = [("Download it as a notebook (.ipynb)", _notebook_uri(docname))]
    if url := colab_url(app.config.publish_repo_url, app.config.publish_notebooks_branch, docname):
        links.insert(0, ("Open it in Colab", url))
    for i, (text, uri) in enumerate(links):
        para += nodes.Text(" · " if i else "")
        para += nodes.reference(text, text, refuri=uri)
    para += nodes.Text(": its first cell installs the package.")
    box += para
    data = NbMetadataCollector.get_exec_data(app.env, docname) if docname in app.env.all_docs else None
    if data and data.get("succeeded"):
        stamp = last_executed(_kernel_environment(app), executed=data["mtime"], runtime_s=data.get("runtime"))
        box += nodes.paragraph(text=f"{stamp} Results recorded on a GPU name that GPU where they appear.")
    return box


def _on_doctree_resolved(app, doctree, docname):
    if app.builder.format != "html":
        return
    describe_figures(doctree)
    if _executable(app, docname):
        doctree += _run_yourself(app, docname)


_FILE_NAME = re.compile(r"(^|/)[^/\s]+\.(png|jpe?g|svg|gif)$", re.IGNORECASE)


def describe_figures(doctree) -> None:
    """Give each image without a real alt text (a cell's figure gets its file name) the sentence that introduces
    it: the last paragraph before it in its section, else the section's title."""
    for image in list(doctree.findall(nodes.image)):
        if image.get("alt") and not _FILE_NAME.search(image["alt"]):
            continue
        block, parent = image, image.parent
        while parent is not None and not isinstance(parent, (nodes.section, nodes.document)):
            block, parent = parent, parent.parent
        if parent is None:
            continue
        before = parent.children[: parent.index(block)]
        text = next((n.astext() for n in reversed(before) if isinstance(n, nodes.paragraph)), "")
        if not text and isinstance(parent, nodes.section) and isinstance(parent[0], nodes.title):
            text = parent[0].astext()
        text = " ".join(text.split())
        if text:
            image["alt"] = f"Figure: {text[:297] + '…' if len(text) > 300 else text}"


def _on_page_context(app, pagename, templatename, context, doctree):
    buttons = context.get("header_buttons")
    if buttons is None or doctree is None or not _executable(app, pagename):
        return
    links = [
        {
            "type": "link",
            "text": ".ipynb",
            "tooltip": "Download this page as a notebook",
            "icon": "fas fa-file-code",
            "url": context["pathto"](f"{NB_DIR}/{pagename}.ipynb", 1),
            "label": "notebook-download-button",
        }
    ]
    if url := colab_url(app.config.publish_repo_url, app.config.publish_notebooks_branch, pagename):
        links.insert(
            0,
            {
                "type": "link",
                "text": "Colab",
                "tooltip": "Open this page in Colab",
                "url": url,
                "icon": context["pathto"](COLAB_ICON, 1),
                "label": "colab-button",
            },
        )
    buttons.append(
        {"type": "group", "tooltip": "Run this page", "icon": "fas fa-rocket", "buttons": links, "label": "run-buttons"}
    )


class _Glued(Mapping):
    """The values a page's cells glued, as myst-nb kept them (``<output folder>/<doc>.glue.json``); a key
    ``other.md::key`` reaches another page's."""

    def __init__(self, folder: Path, docname: str):
        self.folder, self.docname, self._loaded = folder, docname, {}

    def _of(self, docname: str) -> dict:
        if docname not in self._loaded:
            path = self.folder / f"{docname}.glue.json"
            self._loaded[docname] = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        return self._loaded[docname]

    def __getitem__(self, key: str):
        doc, sep, name = key.rpartition("::")
        return self._of(docname_join(self.docname, str(Path(doc).with_suffix(""))) if sep else self.docname)[name]

    def __iter__(self):
        return iter(self._of(self.docname))

    def __len__(self):
        return len(self._of(self.docname))


def _resolver(app, docname: str):
    """``resolve(role, target)`` for the notebook converter: the target's address on the site and its title."""
    base = app.config.html_baseurl.rstrip("/") + "/"
    py, std = app.env.get_domain("py"), app.env.get_domain("std")

    def at(doc: str, anchor: str = "") -> str:
        return base + app.builder.get_target_uri(doc) + (f"#{anchor}" if anchor else "")

    def resolve(role: str, target: str):
        if role.startswith("py:"):
            entry = py.objects.get(target)
            if entry is None:  # a name relative to the page's module: unique by its last parts
                found = [e for name, e in py.objects.items() if name.endswith(f".{target}")]
                entry = found[0] if len(found) == 1 else None
            return (at(entry.docname, entry.node_id), None) if entry else None
        if role == "term":
            entry = getattr(std, "_terms", {}).get(target.lower())  # where the term role itself looks
            return (at(*entry), None) if entry else None
        if role in ("ref", "numref"):
            entry = std.labels.get(target.lower())
            return (at(entry[0], entry[1]), entry[2] or None) if entry else None
        if role == "doc":
            doc = docname_join(docname, target)
            title = app.env.titles.get(doc)
            return (at(doc), title.astext()) if doc in app.env.all_docs else None
        return None

    return resolve


def _on_build_finished(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    pages = [d for d in sorted(app.env.found_docs) if _executable(app, d)]
    glue_folder = Path(app.env.mystnb_config.output_folder)
    for docname in pages:
        try:
            write_notebook(
                Path(app.env.doc2path(docname)),
                app.config.publish_repo_url,
                out / NB_DIR,
                site_url=app.config.html_baseurl,
                glued=_Glued(glue_folder, docname),
                resolve=_resolver(app, docname),
                ref=app.config.publish_repo_ref,
            )
        except ValueError as error:
            raise ExtensionError(f"publish: the notebook of {docname} could not be made: {error}") from error
    LOG.info(f"publish: {len(pages)} notebooks in {out / NB_DIR}")
    page = app.config.publish_preview_page
    img = app.env.get_doctree(page).next_node(nodes.image) if page in app.env.all_docs else None
    if img is not None and (src := out / "_images" / Path(img["uri"]).name).exists():
        shutil.copyfile(src, out / "preview.png")


def setup(app):
    app.add_config_value("publish_repo_url", "", "html", types=[str])
    app.add_config_value("publish_repo_ref", os.environ.get("ATTENTION_TUTORIAL_REPO_REF", ""), "html", types=[str])
    app.add_config_value("publish_notebooks_branch", "notebooks", "html", types=[str])
    app.add_config_value("publish_preview_page", "", "html", types=[str])
    app.connect("doctree-resolved", _on_doctree_resolved)
    app.connect("html-page-context", _on_page_context, priority=600)  # after the theme has made its buttons
    app.connect("builder-inited", _start_environment_report)
    app.connect("build-finished", _on_build_finished)
    app.connect("build-finished", _stop_environment_report)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
