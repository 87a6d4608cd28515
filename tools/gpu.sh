#!/usr/bin/env bash
# What the project runs on the lent GPU machine (no network; see tools/te-device.md and README).
#   bash tools/gpu.sh tests            GPU-marked tests (and TE ones, when TE is installed; carry .whl with cramjam)
#   bash tools/gpu.sh tune KERNEL      tile sizes of our kernels against cuDNN (tools/tune.py: pallas, mosaic, pipe, fp8,
#                                        registers, bwd, bwd_tiles, bwd_dq), or the training step with and without
#                                        biases (train), recorded into the result file as provenance["tuning"][KERNEL]
#   bash tools/gpu.sh kernels          the Mosaic kernels' GPU tests, then the ablations and the warpgroup timeline
#                                        recorded into the result file (about 8 minutes; a summary last)
#   bash tools/gpu.sh backward         the backward kernels' GPU tests (dQ by a pass, by atomic adds, shared; 232 and
#                                        240 registers), then the dQ table (tools/tune.py bwd_dq) (under 10 minutes);
#                                        the backward's race and its warpgroups for each way of making dQ:
#                                        bash tools/gpu.sh record backward timeline_backward
#   bash tools/gpu.sh registers        the forwards' GPU tests at 240 registers (plain, pipelined, FP8), then the
#                                        forwards at 232 and 240 beside cuDNN (tools/tune.py registers) (under 9
#                                        minutes); the FP8 forward's: bash tools/gpu.sh tune fp8
#   bash tools/gpu.sh exp_poly         part of p's exponentials on the FMA units: its GPU tests, then the plain and
#                                        pipelined forwards (H = 128, both masks) at exp_poly 0, 0.25, 0.5 beside cuDNN,
#                                        two rounds, as a table (about 2 minutes; records in $OUT/exp_poly.json)
#   bash tools/gpu.sh masks            the GPU tests of any length, the masks, head dims and packed documents (each
#                                        name as it finishes: a run cut short still says what failed), then the
#                                        packed training and the masks races into the result file (under 10 minutes)
#   bash tools/gpu.sh record NAME...   the recorder for these grids and extras (record.EXTRAS: fp8, train, race, …),
#                                        merging into /tmp/results; RACE="masks masks_backward" picks the races of
#                                        the extra race (measure/race.py: all by default). Set ATTENTION_TUTORIAL_COMMIT
#                                        and ATTENTION_TUTORIAL_DIRTY (0/1) where the tree has no .git: records keep them
#   bash tools/gpu.sh notebook PAGE... pages converted to the reader's .ipynb and executed (carry .whl)
#   bash tools/gpu.sh docs             the whole site, built live on the GPU from carried wheels (.whl), strictly,
#                                        from an empty build folder; the host's compile speed first
#                                        (tools/compile_probe.py), each page's execution time last
# Results accumulate in /tmp/results while the machine stays up, and are copied to $OUT after each step.
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"  # environment, $OUT, $RES
step=$1; shift
case "$step" in
  tests)
    # four workers share the GPU: each must allocate as it goes (XLA's default takes 75 % of the memory up front)
    workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
    XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -q -m "gpu or te" -p no:cacheprovider -p no:benchmark \
      "${workers[@]}" tests 2>&1 | tail -25 ;;
  tune)
    python3 tools/tune.py "$1" "$RES" 2>&1 | tail -40
    cp "$RES" /tmp/results/ && cp "$RES" "$OUT/" ;;
  kernels)
    # the GPU tests of kernels/mosaic (values and gradients against float64, the profiled forward) and of the timeline,
    # then the two extras into $RES: each kernel as it is and without exp2 beside cuDNN, and the profiled warpgroups
    workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 4)  # compiling dominates: 4 processes share it
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 270 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -m gpu "${workers[@]}" \
      tests/kernels/mosaic tests/measure/test_timeline.py 2>&1 | tail -12
    timeout 300 python3 -m attention_tutorial record --grids --extras ablations timeline 2>&1 \
      | grep -v "it/s\]\|s/pt\]" | tail -50 > "$OUT/kernels-record.log"
    cp "$RES" /tmp/results/ && cp "$RES" "$OUT/"
    tail -4 "$OUT/kernels-record.log"
    python3 - "$RES" <<'PY'
import sys
from attention_tutorial.measure.ablations import ablation_ratios
from attention_tutorial.results import store
from attention_tutorial.site.kernel_timeline import region_shares, timeline_rows

data = store.load(sys.argv[1])
for r in ablation_ratios(data["records"]):
    rounds = " ".join(f"{100 * x:.1f}" for x in r.per_round)
    print(f"{r.impl:16} H={r.head_dim} {'causal' if r.causal else 'no mask':7} {r.variant:6} % of {r.baseline}: "
          f"{rounds} (range {100 * r.low:.0f}-{100 * r.high:.0f})")
timeline = data["provenance"].get("timeline", {})
print("timeline:", {k: v["status"] for k, v in timeline.items()})
for s in region_shares(timeline_rows(timeline)):
    print(f"  {s.kernel}: span {s.span:.0f} ticks;", ", ".join(f"{k} {100 * v:.0f} %" for k, v in s.shares.items()))
PY
    ;;
  backward)
    workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -m gpu \
      "${workers[@]}" tests/kernels/mosaic/test_backward.py 2>&1 | tail -8
    timeout 330 python3 tools/tune.py bwd_dq "$RES" 2>&1 | tail -30
    cp "$RES" /tmp/results/ && cp "$RES" "$OUT/" ;;
  registers)
    workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -m gpu \
      "${workers[@]}" -k 240 tests/kernels/mosaic/test_pipelined.py tests/kernels/mosaic/test_fp8.py \
      2>&1 | tail -8
    timeout 330 python3 tools/tune.py registers "$RES" 2>&1 | tail -30
    cp "$RES" /tmp/results/ && cp "$RES" "$OUT/" ;;
  exp_poly)
    workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 4)
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 90 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -m gpu \
      "${workers[@]}" -k exp_poly tests/kernels/mosaic 2>&1 | tail -8
    timeout 90 python3 - "$OUT/exp_poly.json" <<'PY'
import json, sys
from attention_tutorial.measure.ablations import EXP_POLY, KERNELS, ablation_ratios, ablation_records

kernels = [k for k in KERNELS if k.impl in ("mosaic", "mosaic_pipe") and k.head_dim == 128]
variants = ("as_is", *EXP_POLY)
recs = ablation_records(kernels=kernels, variants=variants, rounds=2)
json.dump(recs, open(sys.argv[1], "w"), indent=1, default=str)
bad = [r for r in recs if r["status"] != "ok"]
for r in bad[:4]:
    print("not ok:", r["impl"], r["variant"], r["causal"], r["status"], str(r.get("reason"))[:200])
ratios = {(a.impl, a.causal, a.variant): a for a in ablation_ratios(recs)}
print("% of cuDNN, B=4 T=S=8192 N=16 H=128 bf16, each round (median of rounds)")
print(f"{'kernel':12} {'mask':8}" + "".join(f"{'exp_poly=' + str(EXP_POLY.get(v, 0.0)):>22}" for v in variants))
for k in kernels:
    cells = []
    for v in variants:
        a = ratios.get((k.impl, k.causal, v))
        cells.append(" ".join(f"{100 * x:.1f}" for x in a.per_round) + f" ({100 * a.median:.1f})" if a else "-")
    print(f"{k.impl:12} {'causal' if k.causal else 'none':8}" + "".join(f"{c:>22}" for c in cells))
PY
    ;;
  masks)
    workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 8)
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 300 python3 -m pytest -v --tb=line -rf -p no:cacheprovider \
      -p no:benchmark -m gpu "${workers[@]}" tests/kernels/mosaic tests/train/test_packed.py tests/kernels/test_fused.py \
      tests/kernels/test_pallas_flash.py > "$OUT/masks-tests.log" 2>&1
    grep -E "FAILED|ERROR|passed|failed" "$OUT/masks-tests.log" | grep -v PASSED | tail -25
    timeout -s INT 260 python3 -m attention_tutorial record --grids --extras train_packed race --race masks \
      masks_backward 2>&1 | grep -v "it/s\]\|s/pt\]" | tail -30
    cp "$RES" /tmp/results/ && cp "$RES" "$OUT/" ;;
  record)
    known=" $(python3 -c 'from attention_tutorial.results.record import EXTRAS; print(*EXTRAS)') "
    extras=(); grids=()
    for g in "$@"; do if [[ "$known" == *" $g "* ]]; then extras+=("$g"); else grids+=("$g"); fi; done
    args=(--grids "${grids[@]}")
    if [ ${#extras[@]} -gt 0 ]; then args+=(--extras "${extras[@]}"); else args+=(--extras); fi
    [ ${#grids[@]} -eq 0 ] && args=(--grids --extras "${extras[@]}")
    [ -n "${RACE:-}" ] && args+=(--race $RACE)
    python3 -m attention_tutorial record "${args[@]}" 2>&1 | grep -v "it/s\]\|s/pt\]" | tail -30
    cp "$RES" /tmp/results/ && cp "$RES" "$OUT/" ;;
  notebook)
    python3 tools/run_notebook.py "$OUT" "$@" 2>&1 | tail -300 ;;
  docs)
    # The whole site, strict, every page executed (DOCS_CLEAN=1: from an empty build folder, as a new builder
    # would). ATTENTION_TUTORIAL_NB_MODE=cache DOCS_CLEAN=0 instead keeps pages executed on this machine, so a build cut off by the
    # time limit (DOCS_TIMEOUT seconds) goes on where it stopped when the same warm machine runs this step again.
    # Prints each page's execution time from the build log, slowest first.
    export ATTENTION_TUTORIAL_NB_MODE=${ATTENTION_TUTORIAL_NB_MODE:-force}
    [ "${DOCS_CLEAN:-1}" = 1 ] && rm -rf docs/_build
    # how fast this host compiles (the build is mostly compilation): set this build's times against another host's
    python3 tools/compile_probe.py 2>&1 | tail -1 | tee "$OUT/host.txt"
    start=$(date +%s)
    export ATTENTION_TUTORIAL_CELL_TIMES=$OUT/cell-times.jsonl  # each cell's seconds and compilations (docs/conf.py)
    timeout "${DOCS_TIMEOUT:-560}" python3 -m nox -s docs --no-venv --no-install >> "$OUT/docs-build.log" 2>&1; rc=$?
    echo "docs build rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/docs-build.log"
    # "reading sources... [ 40%] page" comes before that page's "Executed notebook in N seconds"
    sed 's/\x1b\[[0-9;]*m//g' "$OUT/docs-build.log" | awk '
      /reading sources\.\.\./ { page = $NF }
      /Executed notebook in/ { for (i = 1; i <= NF; i++) if ($i == "in") s = $(i + 1); printf "%8.1f s  %s\n", s, page; t += s }
      END { printf "%8.1f s  all pages\n", t }' | sort -rn | tee "$OUT/page-times.txt"
    python3 tools/cell_times.py "$OUT/cell-times.jsonl" "$OUT/docs-build.log" 30 | tee "$OUT/cell-times.txt"
    grep -i "warning\|error" "$OUT/docs-build.log" | grep -v "Kernel is running over TCP" | tail -15
    tail -4 "$OUT/docs-build.log"
    [ -d docs/_build/html ] && tar czf "$OUT/site-gpu.tgz" -C docs/_build html ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
