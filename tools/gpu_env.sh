# Sourced by the scripts that run on the lent GPU machine (gpu.sh, cp_multi_gpu.sh): the environment, TE where it
# was installed (/tmp/site), $OUT, and the result file $RES, refreshed from /tmp/results, where earlier calls on the
# same warm machine left it.
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -f /tmp/site/te_env.sh ] && . /tmp/site/te_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/results attention_tutorial/results/data
RES=attention_tutorial/results/data/nvidia-h200.json
if [ -f /tmp/results/nvidia-h200.json ]; then cp /tmp/results/nvidia-h200.json "$RES"; fi
# Wheels carried in .whl (the machine has no network; the image lacks the docs tools and cramjam, which the kernel-code
# tests import): installed without their dependencies into /tmp/docsite, first on PYTHONPATH for this step and the
# notebook kernels it starts. Fetch them here with ../shared/gpu/docs-wheels.sh cramjam pyelftools.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/docsite .whl/*.whl 2>&1 | grep -v "^WARNING: Target directory" | tail -2
  export PYTHONPATH=/tmp/docsite:$PYTHONPATH
fi
