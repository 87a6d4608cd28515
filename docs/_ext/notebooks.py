"""Each executable page (MyST markdown with a kernelspec) as a Jupyter notebook whose first cell installs the package.

Pure functions (jupytext reads the page, nbformat validates): the Sphinx extension ``publish`` writes the notebooks
into the site, and ``tests/test_notebooks.py`` checks them.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import jupytext
import nbformat

# A code cell runs live only on a Hopper GPU (H100/H200) when it calls our Mosaic GPU kernel or carries the tag.
HOPPER_TAG = "hopper"
HOPPER_CALLS = re.compile(r"mosaic_flash_attention\(")
FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.S)


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


def install_cell(repo_url: str, hopper: list[str]) -> nbformat.NotebookNode:
    """The first cell: install the package from its repository (with CUDA JAX on a GPU runtime); name the Hopper cells."""
    if not re.match(r"^https://\S+$", repo_url):
        raise ValueError(f"repo_url must be an https:// address of the repository, got {repo_url!r}")
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
        + f'    package = f"attention-tutorial{{extra}} @ git+{repo_url}"\n'
        + '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)'
    )
    return nbformat.v4.new_code_cell(source, metadata={"tags": ["install"]})


def to_notebook(page: Path, repo_url: str) -> nbformat.NotebookNode:
    """The page as an nbformat-4 notebook, the install cell first; raises if the result is not a valid notebook."""
    if not is_executable(page):
        raise ValueError(f"{page} is not an executable page (its front matter names no kernelspec)")
    nb = jupytext.read(page, fmt="md:myst")
    for key in ("file_format", "jupytext"):  # the page's own settings, not the notebook's
        nb.metadata.pop(key, None)
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    nb.cells.insert(0, install_cell(repo_url, []))
    nb.cells[0] = install_cell(repo_url, hopper_cells(nb))  # counted with the install cell as code cell 1
    for i, cell in enumerate(nb.cells):  # ids are required from nbformat 4.5; keep them stable and readable
        cell["id"] = f"cell-{i}"
    nb.nbformat, nb.nbformat_minor = 4, 5
    nbformat.validate(nb)
    return nb


def write_notebook(page: Path, repo_url: str, outdir: Path) -> Path:
    """Write ``outdir/<page stem>.ipynb`` and return its path."""
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / f"{page.stem}.ipynb"
    nbformat.write(to_notebook(page, repo_url), path)
    return path
