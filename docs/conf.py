"""Sphinx configuration: an executed MyST site, strict (warnings and failing cells break the build)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Notebook kernels inherit this environment: import the package from the checkout, keep XLA's C++ logs quiet.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import attention_tutorial  # noqa: E402

project = "Attention on NVIDIA GPUs with JAX"
author = "attention-tutorial contributors"
copyright = "2026, attention-tutorial contributors"
release = attention_tutorial.__version__

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.viewcode", "sphinx_copybutton"]
exclude_patterns = ["_build", "jupyter_execute", "**.ipynb_checkpoints"]

# --- execution: every page runs at build time; a failing cell fails the build -------------------------------
# "cache" (ATTENTION_TUTORIAL_NB_MODE=cache) re-executes only changed pages, for local work; CI and GPU builds force.
nb_execution_mode = os.environ.get("ATTENTION_TUTORIAL_NB_MODE", "force")
nb_execution_raise_on_error = True
nb_execution_show_tb = True  # the traceback goes to the build log, never into a page
nb_execution_timeout = int(os.environ.get("ATTENTION_TUTORIAL_CELL_TIMEOUT", "900"))  # seconds per cell
nb_output_stderr = "warn"  # anything on stderr (a warning, a log line) is a build warning, hence an error
nb_merge_streams = True
nb_render_markdown_format = "myst"  # Markdown outputs (the results tables) render with MyST, which has tables
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
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
