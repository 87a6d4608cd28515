"""Execute one page as the notebook a reader downloads (the site's own conversion), top to bottom; save it.

    python tools/run_notebook.py docs/qkv_from_scratch.md OUT_DIR

Used on the GPU machine to check that the downloaded .ipynb runs there (its install cell skips itself when the
package is importable). Prints one line per code cell and exits non-zero if a cell fails.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from notebooks import to_notebook  # noqa: E402  (the converter the site uses)


def main(page: str, out_dir: str) -> int:
    nb = to_notebook(Path(page), "https://github.com/attention-tutorial/attention-tutorial")
    start, rc = time.time(), 0
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    except CellExecutionError as err:
        print(f"FAILED: {str(err)[:2000]}")
        rc = 1
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        print(f"cell {i}: {'error' if errors else 'ok'} ({len(cell.get('outputs', []))} outputs)")
    out = Path(out_dir) / (Path(page).stem + ".executed.ipynb")
    nbformat.write(nb, out)
    print(f"{page}: {len(code)} code cells, rc={rc}, {time.time() - start:.0f} s -> {out}")
    return rc


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
