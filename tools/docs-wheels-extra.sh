#!/bin/bash
# The extra wheels the docs build needs on the GPU machine (Python 3.12, no network there), beyond what
# ../shared/gpu/docs-wheels.sh fetches: the publishing extensions of docs/conf.py. All pure Python:
# fetched with --no-deps (their own dependencies — nbformat, markdown-it-py, mdit-py-plugins, pyyaml, packaging —
# already come with myst-nb).
#   bash ../shared/gpu/docs-wheels.sh && bash tools/docs-wheels-extra.sh   -> ./.whl/
# On the GPU machine, install .whl/*.whl as docs-wheels.sh's header says (--no-deps --target, PYTHONPATH).
set -eu
OUTDIR=${OUTDIR:-.whl}; mkdir -p "$OUTDIR"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$OUTDIR" \
  jupytext sphinx-sitemap sphinx-last-updated-by-git sphinxext-opengraph sphinx-notfound-page
ls "$OUTDIR" | grep -Ei 'jupytext|sitemap|opengraph|notfound|last.updated'
