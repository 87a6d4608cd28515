#!/usr/bin/env bash
# Context parallelism measured on every GPU of one host (2 or 4 H200s), through the recorder.
#
# On the multi-GPU machine (device tool kind nvidia-h200-x2, or nvidia-h200-x4), from the repository root:
#   bash tools/cp_multi_gpu.sh            the measurement (below)
#   bash tools/cp_multi_gpu.sh tests      first, optionally: the multi-GPU checks of tests/measure/test_cp_scaling.py
#                                           (NCCL work found in the trace; TE's context parallelism against the
#                                           float64 reference), about a minute
# which runs, merging into attention_tutorial/results/data/<gpu>.json (copied from/to $OUT as tools/gpu.sh does):
#   python -m attention_tutorial record --grids --extras cp_scaling
# It writes the grid "cp_scaling" (records: experiment "context_parallel"; strong scaling at T = 64k and 128k,
# weak scaling at T = 16k·P; ring and all-gather, zig-zag and contiguous; fwd and fwd+bwd; causal and not; TE's
# context parallelism where TE runs), and in provenance.grids.cp_scaling the GPU count and the interconnect
# (nvidia-smi topo -m, nvidia-smi nvlink -s). Points past the time budget (ATTENTION_TUTORIAL_CP_BUDGET_S, 400 s by
# default, so the command fits a 10-minute lease call) are recorded as "unsupported" with the reason; points run in
# the order strong scaling at the first T, weak scaling, strong scaling at the next T. The environment narrows it:
#   ATTENTION_TUTORIAL_CP_SEQS=65536      T of strong scaling (comma-separated; default 65536,131072)
#   ATTENTION_TUTORIAL_CP_TE=0            leave TransformerEngine's context parallelism out
# A later run of the extra replaces the whole cp_scaling grid in the result file (the recorder's rule).
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"  # environment, $OUT, $RES
if [ "${1:-}" = tests ]; then
  python3 -m pytest -q -m "gpu or te" -p no:cacheprovider tests/measure/test_cp_scaling.py 2>&1 | tail -25
  exit
fi
nvidia-smi -L 2>&1 | tee "$OUT/cp_gpus.txt"
python3 -m attention_tutorial record --grids --extras cp_scaling 2>&1 | tail -30
cp "$RES" /tmp/results/ && cp "$RES" "$OUT/"
