#!/usr/bin/env bash
# What the project runs on the lent GPU machine (no network; see scripts/te-device.md and README).
#   bash scripts/gpu.sh tests            GPU-marked tests (and TE ones, when TE is installed)
#   bash scripts/gpu.sh tune KERNEL      tile sizes of our kernels against cuDNN (pallas, mosaic, pipe, fp8)
#   bash scripts/gpu.sh issue17          issue 17's GPU tests and machine-code probe in one call (~8 min)
#   bash scripts/gpu.sh issue17_h256     the probe at H = 256: plain both masks, pipelined causal, each with its ceiling
#   bash scripts/gpu.sh issue17_pairs    the remaining kernel/ceiling pairs, each pair from one file (~5 min)
#   bash scripts/gpu.sh record NAME...   the recorder for these grids and extras (record.EXTRAS: fp8, train, …),
#                                        merging into /tmp/results
#   bash scripts/gpu.sh notebook PAGE    one page converted to the reader's .ipynb and executed (carry .whl)
#   bash scripts/gpu.sh docs             the whole site, built live on the GPU from carried wheels (.whl)
# Results accumulate in /tmp/results while the machine stays up, and are copied to $OUT after each step.
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"  # environment, $OUT, $RES
step=$1; shift
case "$step" in
  tests)
    python3 -m pytest -q -m "gpu or te" -p no:cacheprovider tests 2>&1 | tail -25 ;;
  tune)
    python3 scripts/tune.py "$1" "$OUT/$1_tuning.json" 2>&1 | tail -40 ;;
  issue17)
    # the GPU tests of the pipelined, H = 256 and FP8 forwards (both p paths), then the machine-code probe with its
    # provenance: the pipelined kernel as it is (scripts/issue17_probe3_h200.json ran it before provenance was kept),
    # the FP8 forward the goal is judged on (p in registers; only the shared-memory path was probed) and its ceiling
    # without exponentials, and the bf16 ceiling causal (probed without a mask only): about 8 minutes
    timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -k "pipelined_and_h256 or fp8" \
      tests/kernels/test_mosaic_flash.py tests/kernels/test_mosaic_fp8.py 2>&1 | tail -8
    timeout 400 python3 scripts/gpu_issue17_probe.py "$OUT/issue17_probe4.json" plain_noexp:causal pipe_noexp:causal \
      pipe:causal fp8_regs fp8_regs_noexp 2>&1 | tail -20 ;;
  issue17_h256)
    # the H = 256 kernels at the probe's shape otherwise (plain both masks, pipelined causal), as they are and without
    # exponentials: what holds them below cuDNN (about 2 minutes)
    PROBE_HEAD_DIM=256 timeout 420 python3 scripts/gpu_issue17_probe.py "$OUT/issue17_probe5_h256.json" plain \
      plain_noexp pipe:causal pipe_noexp:causal 2>&1 | tail -12 ;;
  issue17_pairs)
    # each kernel beside its ceiling in one file: H = 128 plain both masks and pipelined without a mask (probe 4 ran
    # the pipelined causal pair), H = 256 pipelined without a mask (probe 5 ran the rest)
    timeout 300 python3 scripts/gpu_issue17_probe.py "$OUT/issue17_probe6.json" plain plain_noexp pipe:noncausal \
      pipe_noexp:noncausal 2>&1 | grep -v "^{" | tail -12
    PROBE_HEAD_DIM=256 timeout 150 python3 scripts/gpu_issue17_probe.py "$OUT/issue17_probe6_h256.json" \
      pipe:noncausal pipe_noexp:noncausal 2>&1 | tail -6 ;;
  record)
    known=" $(python3 -c 'from attention_tutorial.results.record import EXTRAS; print(*EXTRAS)') "
    extras=(); grids=()
    for g in "$@"; do if [[ "$known" == *" $g "* ]]; then extras+=("$g"); else grids+=("$g"); fi; done
    args=(--grids "${grids[@]}")
    if [ ${#extras[@]} -gt 0 ]; then args+=(--extras "${extras[@]}"); else args+=(--extras); fi
    [ ${#grids[@]} -eq 0 ] && args=(--grids --extras "${extras[@]}")
    python3 -m attention_tutorial record "${args[@]}" 2>&1 | grep -v "it/s\]\|s/pt\]" | tail -30
    cp "$RES" /tmp/results/ && cp "$RES" "$OUT/" ;;
  notebook)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/docsite .whl/*.whl
    export PYTHONPATH=/tmp/docsite${PYTHONPATH:+:$PYTHONPATH}
    python3 scripts/run_notebook.py "$1" "$OUT" 2>&1 | tail -40 ;;
  docs)
    # cache mode: a page executed on this machine is kept (docs/_build/.jupyter_cache), so a build cut off by the
    # time limit (DOCS_TIMEOUT seconds) goes on where it stopped when the same warm machine runs this step again
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/docsite .whl/*.whl
    export PYTHONPATH=/tmp/docsite${PYTHONPATH:+:$PYTHONPATH} ATTENTION_TUTORIAL_NB_MODE=${ATTENTION_TUTORIAL_NB_MODE:-cache}
    start=$(date +%s)
    timeout "${DOCS_TIMEOUT:-560}" python3 -m nox -s docs --no-venv --no-install >> "$OUT/docs-build.log" 2>&1; rc=$?
    echo "docs build rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/docs-build.log"
    grep -h "Executed notebook\|Executing notebook" "$OUT/docs-build.log" | sed 's|.*/docs/||' | sort -u | tail -20
    tail -15 "$OUT/docs-build.log"
    [ -d docs/_build/html ] && tar czf "$OUT/site-gpu.tgz" -C docs/_build html ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
