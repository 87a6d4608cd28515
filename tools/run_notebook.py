"""Execute pages as the notebooks a reader downloads (the site's own conversion), top to bottom; save them.

    python tools/run_notebook.py OUT_DIR docs/qkv_from_scratch.md [docs/timing.md ...]

Used on the GPU machine to check that the downloaded .ipynb runs there (its install cell skips itself when the
package is importable) and to see where a page's build time goes: one line per code cell with its seconds and its
first line, then the page's total. Exits non-zero if a cell fails.
"""

from __future__ import annotations

import sys
import time
import tomllib
from datetime import datetime
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from notebooks import to_notebook  # noqa: E402  (the converter the site uses)

with open(ROOT / "pyproject.toml", "rb") as f:
    URLS = tomllib.load(f)["project"]["urls"]


class _Placeholders(dict):
    """The values a page's text pastes from its own run: only the code runs here, so each stands as its name."""

    def __missing__(self, key):
        return {"data": {"text/plain": repr(key), "text/markdown": key}}


def _seconds(cell) -> float:
    """The cell's run time from the timestamps nbclient records (0 where it did not run)."""
    t = cell.get("metadata", {}).get("execution", {})
    if "iopub.execute_input" not in t or "shell.execute_reply" not in t:
        return 0.0
    parse = lambda x: datetime.fromisoformat(x.replace("Z", "+00:00"))  # noqa: E731
    return (parse(t["shell.execute_reply"]) - parse(t["iopub.execute_input"])).total_seconds()


def run_page(page: str, out_dir: str) -> int:
    nb = to_notebook(Path(page), URLS["Repository"], site_url=URLS["Documentation"], glued=_Placeholders())
    start, rc = time.time(), 0
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    except CellExecutionError as err:
        print(f"FAILED: {str(err)[:2000]}")
        rc = 1
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        first = next((line for line in cell.source.splitlines() if line.strip()), "")[:70]
        print(f"cell {i:2}: {'error' if errors else 'ok   '} {_seconds(cell):6.1f} s  {first}")
    out = Path(out_dir) / (Path(page).stem + ".executed.ipynb")
    nbformat.write(nb, out)
    print(f"{page}: {len(code)} code cells, rc={rc}, {time.time() - start:.0f} s -> {out}")
    return rc


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not all(Path(p).suffix == ".md" for p in argv[1:]):
        print(__doc__)
        return 2
    return max(run_page(page, argv[0]) for page in argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
