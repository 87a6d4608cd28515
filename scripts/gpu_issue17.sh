#!/usr/bin/env bash
# Issue 17 on one H200 (under 8 minutes, no network), from the repository root:  bash scripts/gpu_issue17.sh
# 1. the GPU tests of our Mosaic forward with MosaicConfig(pipeline=True) (FlashAttention-3's intra-warpgroup
#    pipelining) and with H = 256 (block_kv=64), against float64 (tests/kernels/test_mosaic_flash.py);
# 2. forward TFLOP/s of pipeline off/on at H = 128 and of H = 256 (block_kv=64, pipeline off/on) against cuDNN at
#    B·T = 32k tokens, N = 16, T = 4k and 16k, causal and not, bf16: one line a point, and $OUT/issue17_timings.json
#    (rewritten after each point, atomically; each point also records its largest difference from cuDNN's output).
set -uo pipefail
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout "${T17_TEST_S:-200}" python3 -m pytest -q -p no:cacheprovider -m gpu -k pipelined_and_h256 tests/kernels/test_mosaic_flash.py \
  2>&1 | tail -15
timeout "${T17_TIME_S:-220}" python3 - "$OUT/issue17_timings.json" <<'EOF'
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp

from attention_tutorial.inputs import make_qkv
from attention_tutorial.kernels.mosaic_flash import MosaicConfig, mosaic_flash_attention
from attention_tutorial.measure.flops import attention_flops
from attention_tutorial.measure.timing import time_fn

path = sys.argv[1]
if os.path.exists(path):  # never overwrite a measurement
    path = path.replace(".json", f"-{int(time.time())}.json")
OURS = {128: [("ours", MosaicConfig()), ("ours pipelined", MosaicConfig(pipeline=True))],
        256: [("ours bkv64", MosaicConfig(block_kv=64)), ("ours bkv64 pipelined", MosaicConfig(block_kv=64, pipeline=True))]}
rows, N = [], 16


def save():
    doc = {"issue": 17, "device": jax.devices()[0].device_kind, "jax": jax.__version__, "rows": rows}
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)


for T in (4096, 16384):
    B = 32768 // T
    for H in (128, 256):
        q, k, v = make_qkv(B, T, N, H, dtype=jnp.bfloat16, seed=T + H)
        for causal in (False, True):
            flops = attention_flops(B, T, T, N, H, causal=causal)
            cudnn = functools.partial(jax.nn.dot_product_attention, implementation="cudnn", is_causal=causal)
            fns = [("cuDNN", cudnn)] + [
                (label, functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg)) for label, cfg in OURS[H]
            ]
            base = ref = None
            for label, fn in fns:
                row = dict(B=B, T=T, N=N, H=H, causal=causal, dtype="bfloat16", kernel=label, tflops=None)
                try:
                    t = time_fn(fn, q, k, v, repeats=10, max_seconds=0.5)
                    out = jax.jit(fn)(q, k, v).astype(jnp.float32)
                    row.update(tflops=flops / t.median_ms / 1e9, median_ms=t.median_ms, p10_ms=t.p10_ms, p90_ms=t.p90_ms)
                    if label == "cuDNN":
                        base, ref = row["tflops"], out
                    elif ref is not None:
                        row["max_abs_diff_vs_cudnn"] = float(jnp.max(jnp.abs(out - ref)))
                except Exception as err:  # a point that does not compile or run is recorded, not fatal
                    row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
                row["ratio_to_cudnn"] = row["tflops"] / base if row["tflops"] and base else None
                rows.append(row)
                save()
                tf, ratio = row["tflops"], row["ratio_to_cudnn"]
                print(f"T={T:5d} B={B} H={H} causal={causal!s:5} {label:21s} "
                      + (f"{tf:6.1f} TFLOP/s" if tf else "   n/a") + (f"  x{ratio:.3f} cuDNN" if ratio else "")
                      + (f"  maxdiff {row['max_abs_diff_vs_cudnn']:.1e}" if "max_abs_diff_vs_cudnn" in row else "")
                      + (f"  {row['error'][:150]}" if "error" in row else ""), flush=True)
print("wrote", path)
EOF
