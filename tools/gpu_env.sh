# Sourced by the scripts that run on the lent GPU machine (gpu.sh, cp_multi_gpu.sh): the environment, TE where it
# was installed (/tmp/site), $OUT, and the result file $RES, refreshed from /tmp/results, where earlier calls on the
# same warm machine left it.
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -f /tmp/site/te_env.sh ] && . /tmp/site/te_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/results attention_tutorial/results/data
RES=attention_tutorial/results/data/nvidia-h200.json
if [ -f /tmp/results/nvidia-h200.json ]; then cp /tmp/results/nvidia-h200.json "$RES"; fi
