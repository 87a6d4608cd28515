"""Execute pages as the notebooks a reader downloads (the site's own conversion), top to bottom; save them.

    python tools/run_notebook.py OUT_DIR docs/qkv_from_scratch.md [docs/timing.md ...]

Used on the GPU machine to check that the downloaded .ipynb runs there (its install cell skips itself when the
package is importable) and to see where a page's build time goes: one line per code cell with its seconds, the XLA
compilations it caused (how many, their seconds) and its first line, then the page's total. A GPU compiles every op
run outside jit on its own, so a cell's compilations often outweigh its measurements. Exits non-zero if a cell fails.
"""

from __future__ import annotations

import json
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


# Counts XLA compilations in the page's kernel; each page cell is followed by a probe cell that prints and resets it.
_PROBE = "run_notebook_probe"
_COUNTER = """import json as _json, jax.monitoring as _monitoring
_compiles = [0, 0.0]
def _count(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        _compiles[0] += 1; _compiles[1] += duration
_monitoring.register_event_duration_secs_listener(_count)"""
_REPORT = 'print("@compiles", _json.dumps(_compiles)); _compiles[:] = [0, 0.0]'


def _with_probes(nb):
    cells = [nbformat.v4.new_code_cell(_COUNTER, metadata={_PROBE: True})]
    for cell in nb.cells:
        cells.append(cell)
        if cell.cell_type == "code":
            cells.append(nbformat.v4.new_code_cell(_REPORT, metadata={_PROBE: True}))
    for i, cell in enumerate(cells):
        cell["id"] = f"cell-{i}"
    nb.cells = cells
    return nb


def _compiles(probe) -> tuple[int, float]:
    for out in probe.get("outputs", []):
        for line in out.get("text", "").splitlines():
            if line.startswith("@compiles "):
                n, secs = json.loads(line.split(" ", 1)[1])
                return n, secs
    return 0, 0.0


def _seconds(cell) -> float:
    """The cell's run time from the timestamps nbclient records (0 where it did not run)."""
    t = cell.get("metadata", {}).get("execution", {})
    if "iopub.execute_input" not in t or "shell.execute_reply" not in t:
        return 0.0
    parse = lambda x: datetime.fromisoformat(x.replace("Z", "+00:00"))  # noqa: E731
    return (parse(t["shell.execute_reply"]) - parse(t["iopub.execute_input"])).total_seconds()


def run_page(page: str, out_dir: str) -> int:
    nb = _with_probes(
        to_notebook(Path(page), URLS["Repository"], site_url=URLS["Documentation"], glued=_Placeholders())
    )
    start, rc = time.time(), 0
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    except CellExecutionError as err:
        print(f"FAILED: {str(err)[:2000]}")
        rc = 1
    cells = nb.cells
    code = [
        (c, cells[i + 1]) for i, c in enumerate(cells[1:-1], 1) if c.cell_type == "code" and _PROBE not in c.metadata
    ]
    total = [0, 0.0]
    for i, (cell, probe) in enumerate(code):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        first = next((line for line in cell.source.splitlines() if line.strip()), "")[:60]
        n, secs = _compiles(probe)
        total = [total[0] + n, total[1] + secs]
        print(
            f"cell {i:2}: {'error' if errors else 'ok   '} {_seconds(cell):6.1f} s  {n:4} compiles {secs:5.1f} s  {first}"
        )
    nb.cells = [c for c in cells if _PROBE not in c.metadata]
    out = Path(out_dir) / (Path(page).stem + ".executed.ipynb")
    nbformat.write(nb, out)
    print(
        f"{page}: {len(code)} code cells, rc={rc}, {time.time() - start:.0f} s, {total[0]} compiles "
        f"({total[1]:.0f} s) -> {out}"
    )
    return rc


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not all(Path(p).suffix == ".md" for p in argv[1:]):
        print(__doc__)
        return 2
    return max(run_page(page, argv[0]) for page in argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
