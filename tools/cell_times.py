"""Where a docs build's execution time went, cell by cell: the slowest cells with their page.

    python tools/cell_times.py CELL_TIMES.jsonl BUILD.log [N]

CELL_TIMES.jsonl is what a build run with ATTENTION_TUTORIAL_CELL_TIMES writes (docs/_ext/cell_times.py): one line
per cell, the kernels told apart by ``pid``. The build log names the pages in the order they ran; each kernel's
cells belong to the next page in that order. Prints the N slowest cells (default 30), each page's total, then the
N slowest compilations (named by the function JAX compiled).
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict


def pages_in_order(log_text: str) -> list[str]:
    """The pages the build executed, in order ("reading sources... page" before "Executed notebook")."""
    page, pages = None, []
    for line in re.sub(r"\x1b\[[0-9;]*m", "", log_text).splitlines():
        if "reading sources..." in line:
            page = line.split()[-1]
        elif "Executed notebook in" in line and page is not None:
            pages.append(page)
    return pages


def cells_by_page(lines: list[dict], pages: list[str]) -> dict[str, list[dict]]:
    """Each kernel's cells (kernels in the order their first cell ran) under the page that kernel ran."""
    kernels: dict[int, list[dict]] = defaultdict(list)
    for cell in lines:
        kernels[cell["pid"]].append(cell)
    named = pages + [f"page {i + 1}" for i in range(len(pages), len(kernels))]
    return {name: cells for name, cells in zip(named, kernels.values())}


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__)
        return 2
    with open(argv[0]) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    with open(argv[1], errors="replace") as f:
        by_page = cells_by_page(lines, pages_in_order(f.read()))
    n = int(argv[2]) if len(argv) == 3 else 30
    rows = [
        (c["seconds"], c["compiles"], c["compile_s"], page, c["first_line"])
        for page, cells in by_page.items()
        for c in cells
    ]
    print(f"{'s':>6} {'compiles':>8} {'compile s':>9}  page: first line")
    for s, k, ks, page, first in sorted(rows, reverse=True)[:n]:
        print(f"{s:6.1f} {k:8} {ks:9.1f}  {page}: {first[:70]}")
    print(f"\n{'s':>6} {'compiles':>8} {'compile s':>9}  page (its cells)")
    totals = {
        p: [sum(c[k] for c in cells) for k in ("seconds", "compiles", "compile_s")] for p, cells in by_page.items()
    }
    for page, (s, k, ks) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        print(f"{s:6.1f} {k:8} {ks:9.1f}  {page}")
    programs = [
        (sec, page, name, c["first_line"])
        for page, cells in by_page.items()
        for c in cells
        for name, sec in c.get("programs", [])
    ]
    if programs:
        print(f"\n{'s':>6}  page: compiled function (cell's first line)")
        for sec, page, name, first in sorted(programs, reverse=True)[:n]:
            print(f"{sec:6.1f}  {page}: {name} ({first[:50]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
