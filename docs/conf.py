"""Sphinx configuration: an executed MyST site, strict (warnings and failing cells break the build)."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Notebook kernels inherit this environment: import the package from the checkout, keep XLA's C++ logs quiet.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# ATTENTION_TUTORIAL_CELL_TIMES=FILE: every executed cell's seconds and XLA compilations, one JSON line each
# (docs/_ext/cell_times.py, an IPython start-up file; the pages' outputs are unchanged).
if os.environ.get("ATTENTION_TUTORIAL_CELL_TIMES"):
    sys.path.insert(0, str(Path(__file__).parent / "_ext"))
    from cell_times import ipython_dir

    os.environ["IPYTHONDIR"] = ipython_dir()

# A page's kernel is killed once its last cell has run and its outputs are in hand, rather than asked to exit: a JAX
# process's own teardown (its GPU memory, its CUDA context) took ~0.6 s per page on the H200.
from nbclient import NotebookClient  # noqa: E402

NotebookClient.shutdown_kernel.default_value = "immediate"

import attention_tutorial  # noqa: E402

# The checkout this builds from (also when another conf.py execs this one, as tests/test_docs.py does).
CHECKOUT = Path(attention_tutorial.__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKOUT / "docs" / "_ext"))

project = "Attention on NVIDIA GPUs with JAX"
author = "attention-tutorial contributors"
copyright = "2026, attention-tutorial contributors"
release = attention_tutorial.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.linkcode",  # [source] links to the repository (no copy of the code in the site: a faster build)
    "sphinx_copybutton",
    "sphinx_design",
    "sphinx_sitemap",
    "sphinxext.opengraph",
    "sphinx_reredirects",  # `redirects` below: pages that moved
    "publish",  # docs/_ext: pages as notebooks (download, Colab), a "last executed" stamp on each page
]
exclude_patterns = ["_build", "build", "jupyter_execute", "**.ipynb_checkpoints"]

# --- execution: every page runs at build time; a failing cell fails the build -------------------------------
# "cache" (ATTENTION_TUTORIAL_NB_MODE=cache) re-executes only changed pages, for local work; CI and GPU builds force.
nb_execution_mode = os.environ.get("ATTENTION_TUTORIAL_NB_MODE", "force")
nb_execution_raise_on_error = True
nb_execution_show_tb = True  # the traceback goes to the build log, never into a page
nb_execution_timeout = int(os.environ.get("ATTENTION_TUTORIAL_CELL_TIMEOUT", "900"))  # seconds per cell
nb_output_stderr = "warn"  # anything on stderr (a warning, a log line) is a build warning, hence an error
nb_merge_streams = True
nb_render_markdown_format = "myst"  # Markdown outputs (the results tables) render with MyST, which has tables
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist", "substitution"]
# The landing page's words about the recording ({{ recorded_gpu }}, ...): read from the results file, no kernel to run
from attention_tutorial.site.report import recorded_facts  # noqa: E402

myst_substitutions = recorded_facts()
myst_heading_anchors = 3

# --- API reference -------------------------------------------------------------------------------------------
autodoc_typehints = "none"  # signatures stay readable; types are in the docstrings' shape legend
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}

# --- theme ---------------------------------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = "Attention on NVIDIA GPUs with JAX"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": True,
    "home_page_in_toc": True,
}

# --- publishing: addresses, notebooks, sitemap, OpenGraph, 404 ---------------------------------------------------
# The addresses live in pyproject.toml's [project.urls]; CI overrides them with the real repository's.
_URLS = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]["urls"]
publish_repo_url = os.environ.get("ATTENTION_TUTORIAL_REPO_URL") or _URLS["Repository"]
publish_notebooks_branch = os.environ.get("ATTENTION_TUTORIAL_NOTEBOOKS_BRANCH", "notebooks")
publish_preview_page = "scaling"  # its first plot is the site's preview image (preview.png)
html_baseurl = (os.environ.get("ATTENTION_TUTORIAL_BASEURL") or _URLS["Documentation"]).rstrip("/") + "/"
html_theme_options |= {"repository_url": publish_repo_url, "use_repository_button": True}
sitemap_url_scheme = "{link}"
sitemap_excludes = ["404.html", "search.html", "genindex.html", "py-modindex.html"]
ogp_site_url = html_baseurl
ogp_site_name = project
ogp_description_length = 200
ogp_use_first_image = True  # a page's own plot; pages without one fall back to ogp_image
ogp_image = html_baseurl + "preview.png"
# Addresses of pages that moved: each gets a page that sends the reader on (its #fragment kept) to the page
# that now holds most of it. A moved page has no source of its own left in docs/.
redirects = {
    "benchmarks": "scaling.html",  # split into timing, scaling and how_we_measure
    "flash_from_scratch": "online_softmax.html",  # split into online_softmax, pallas_kernels and flash3
    "heads_decode_masks": "heads_decode.html",  # its masks went to kernel_masks
}
if (Path(__file__).parent / "404.md").exists():  # not when another conf.py execs this one for a test site
    extensions.append("notfound.extension")
    notfound_urls_prefix = urlparse(html_baseurl).path  # 404.html's links work from any missing address


def linkcode_resolve(domain, info):
    """The API page's [source] links: the file on the repository, at the ref the notebooks install (else main)."""
    from publish import source_url

    return source_url(publish_repo_url, os.environ.get("ATTENTION_TUTORIAL_REPO_REF") or "main", domain, info)
