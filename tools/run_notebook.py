"""Execute pages as the notebooks a reader downloads (the site's own conversion), top to bottom; save them.

    python tools/run_notebook.py OUT_DIR docs/qkv_from_scratch.md [docs/timing.md ...]

Used on the GPU machine to check that the downloaded .ipynb runs there (its install cell skips itself when the
package is importable) and to see where a page's build time goes: one line per code cell with its seconds, the XLA
compilations it caused (how many, their seconds) and its first line, then the page's total. A GPU compiles every op
run outside jit on its own, so a cell's compilations often outweigh its measurements. Exits non-zero if a cell fails.
"""

from __future__ import annotations

import json
import os
import sys
import time
import tomllib
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from cell_times import ipython_dir  # noqa: E402  (what a docs build uses to time its cells)
from notebooks import to_notebook  # noqa: E402  (the converter the site uses)

with open(ROOT / "pyproject.toml", "rb") as f:
    URLS = tomllib.load(f)["project"]["urls"]


class _Placeholders(dict):
    """The values a page's text pastes from its own run: only the code runs here, so each stands as its name."""

    def __missing__(self, key):
        return {"data": {"text/plain": repr(key), "text/markdown": key}}


def run_page(page: str, out_dir: str) -> int:
    nb = to_notebook(Path(page), URLS["Repository"], site_url=URLS["Documentation"], glued=_Placeholders())
    out = Path(out_dir) / (Path(page).stem + ".executed.ipynb")
    log = out.with_suffix(".cells.jsonl")  # the kernel's line per cell (docs/_ext/cell_times.py)
    log.unlink(missing_ok=True)
    os.environ["ATTENTION_TUTORIAL_CELL_TIMES"] = str(log)
    start, rc = time.time(), 0
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    except CellExecutionError as err:
        print(f"FAILED: {str(err)[:2000]}")
        rc = 1
    ran = [json.loads(x) for x in log.read_text().splitlines() if x.strip()] if log.exists() else []
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, (cell, t) in enumerate(zip(code, ran)):  # the cells ran in order; after a failure, no more lines
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        first = next((line for line in cell.source.splitlines() if line.strip()), "")[:60]
        print(
            f"cell {i:2}: {'error' if errors else 'ok   '} {t['seconds']:6.1f} s  {t['compiles']:4} compiles "
            f"{t['compile_s']:5.1f} s  {first}"
        )
    nbformat.write(nb, out)
    n, secs = sum(t["compiles"] for t in ran), sum(t["compile_s"] for t in ran)
    print(f"{page}: {len(code)} code cells, rc={rc}, {time.time() - start:.0f} s, {n} compiles ({secs:.0f} s) -> {out}")
    return rc


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not all(Path(p).suffix == ".md" for p in argv[1:]):
        print(__doc__)
        return 2
    os.environ["IPYTHONDIR"] = ipython_dir()  # every kernel logs its cells' times and compilations
    return max(run_page(page, argv[0]) for page in argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
