"""Try block sizes, warps and pipeline stages for our Pallas kernel against cuDNN on the GPU; print and save a table.

python scripts/tune_pallas.py OUT.json   (GPU only; about a minute)
"""

import functools
import json
import sys

import jax.numpy as jnp

from attention_tutorial import dot_product_attention, make_qkv, time_fn
from attention_tutorial.flops import attention_flops
from attention_tutorial.pallas_flash import flash_attention

CONFIGS = [(128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 4), (64, 128, 4, 2),
           (128, 128, 8, 3), (128, 64, 8, 4)]  # fmt: skip
rows = []
for H in (128, 64):
    B, T, N = 8, 4096, 16
    q, k, v = make_qkv(B, T, N, H, dtype=jnp.bfloat16)
    for causal in (False, True):
        flops = attention_flops(B, T, T, N, H, causal=causal)
        ref = time_fn(lambda q, k, v, causal=causal: dot_product_attention(q, k, v, implementation="cudnn", is_causal=causal), q, k, v,
                      repeats=10, max_seconds=0.5)  # fmt: skip
        rows.append({"H": H, "causal": causal, "config": "cuDNN", "tflops": flops / ref.median_ms / 1e9})
        for bq, bk, warps, stages in CONFIGS:
            fn = functools.partial(flash_attention, is_causal=causal, block_q=bq, block_k=bk, num_warps=warps,
                                   num_stages=stages)  # fmt: skip
            try:
                t = time_fn(fn, q, k, v, repeats=10, max_seconds=0.5)
                tf = flops / t.median_ms / 1e9
            except Exception as err:
                tf = None
                print(f"H={H} {bq}x{bk} w{warps} s{stages}: {type(err).__name__}: {str(err)[:120]}")
            rows.append({"H": H, "causal": causal, "config": f"{bq}x{bk} w{warps} s{stages}", "tflops": tf})
for r in rows:
    print(f"H={r['H']:3d} causal={r['causal']!s:5} {r['config']:18s} {r['tflops'] and round(r['tflops'])}")
json.dump(rows, open(sys.argv[1], "w"), indent=1)
