"""Try tile sizes and pipelining for one of our kernels against cuDNN on the GPU; print and record a table.

python tools/tune.py pallas [OUT.json]   block_q, block_k, warps, stages of the Triton-lowered kernel
python tools/tune.py mosaic [OUT.json]   block_kv and stages of the Mosaic GPU kernel
(GPU only; a minute or two each). B=8, T=4096, N=16, bf16; H = 128 and 64, causal and not.
python tools/tune.py pipe [OUT.json]     block_kv and stages of the pipelined Mosaic forward (B=4, T=8192, N=16,
H=128, bf16), the plain kernel's default beside it.
python tools/tune.py fp8 [OUT.json]      stages, registers and exp_poly of our FP8 forward against cuDNN's FP8 (P
scale 448), same shape.
python tools/tune.py bwd [OUT.json]      forward+backward (jax.vjp) of our two kernels against cuDNN's:
B·T = 16k, T = 4096 and 8192, N=16, H=128, bf16, causal and not; each row is saved as soon as it is measured.
python tools/tune.py bwd_tiles [OUT.json]  forward+backward of our Mosaic GPU kernel with other backward tiles
(bwd_block_q × bwd_block_kv, stages) and with dQ added by atomics, against cuDNN's: B=4, T=8192, N=16, H = 64 and 128, bf16, causal and not.
python tools/tune.py bwd_dq [OUT.json]     the same shapes, the default tiles, each way of making dQ (a pass, atomic
adds) at the backward's default 232 registers and at 240.
python tools/tune.py registers [OUT.json]  the plain and pipelined forwards at 232 and 240 registers per compute
thread: B=4, T=8192, N=16, H = 128 and 256, bf16, causal and not.
python tools/tune.py train [OUT.json]      the recorded model's training step (train.model.H200) with cuDNN's
attention and ours, with and without biases, ten steps queued before each wait (train.dispatch; about 2 minutes).

Each table is recorded in a result file, OUT.json or by default this GPU's shipped one
(attention_tutorial/results/data/nvidia-h200.json, where the pages read it with results.store.tuning), under
provenance["tuning"][KERNEL], stamped with the GPU, versions, commit, dirty flag, date and SM clock
(results.record.tuning_writer). It is saved atomically after every row, so a run cut short keeps what it measured;
the rest of the file stays as it is, and a new run of a kernel replaces that kernel's table.
"""

import dataclasses
import functools
import sys

import jax
import jax.numpy as jnp

from attention_tutorial import dot_product_attention, make_qkv, time_fn
from attention_tutorial.kernels.mosaic import MosaicConfig, Probe, default_config, mosaic_flash_attention
from attention_tutorial.kernels.pallas_flash import flash_attention
from attention_tutorial.measure.flops import attention_flops
from attention_tutorial.measure.fp8 import WRONG_ABOVE, rel_error
from attention_tutorial.results.record import tuning_writer

PALLAS = [
    (128, 64, 8, 3),
    (128, 128, 8, 2),
    (128, 64, 4, 3),
    (64, 64, 4, 3),
    (128, 32, 4, 4),
    (64, 128, 4, 2),
    (128, 128, 8, 3),
    (128, 64, 8, 4),
]
MOSAIC = [(128, 2), (128, 3), (64, 2), (64, 4)]
# (bwd_block_q, bwd_block_kv, bwd_stages, bwd_dq): the default first; 128 query rows per warpgroup fit the registers at
# H = 64 only (dQ's accumulator is 128 × H float32), 128 keys neither (dK and dV together: 2 × 128 × H); dQ by
# atomics takes 3 stages at H = 64 only (shared memory)
BWD_TILES = [
    (64, 64, 2, "pass"),
    (64, 64, 2, "atomic"),
    (64, 64, 3, "atomic"),
    (64, 64, 3, "pass"),
    (128, 64, 2, "pass"),
    (128, 64, 3, "pass"),
    (64, 128, 2, "pass"),
]
# (label, MosaicConfig fields) of each way of making dQ, at the default registers and at 240; the default first
BWD_DQ_CONFIGS = [
    (f"dQ {dq.replace('_', ' ')}" + (", 240 registers" if regs == 240 else ""), {"bwd_dq": dq, "bwd_registers": regs})
    for dq in ("pass", "atomic")
    for regs in (232, 240)
]
PIPE = [(128, 2, False), (128, 2, True), (64, 2, True), (64, 3, True), (64, 4, True)]  # 128 × 3 stages: no room
# (p_via, MosaicConfig fields other than the default's, the fraction of p's exponentials on the FMA units);
# block_kv = 192 puts vᵀ and p in 64-byte swizzled tiles; 256 needs more registers than the kernel budgets
FP8 = [
    ("registers", {}, 0),
    ("registers", {"block_kv": 192}, 0),
    ("registers", {"block_kv": 192, "registers": 240}, 0),
    ("smem", {"block_kv": 192}, 0),
    ("registers", {"stages": 3}, 0),
    ("registers", {"stages": 4}, 0),
    ("smem", {}, 0),
    ("registers", {"registers": 240}, 0),
    ("registers", {}, 0.25),
    ("registers", {}, 0.5),
]


def candidates(kernel, causal, head_dim=128):
    """(label, function) for each configuration of ``kernel``."""
    if kernel == "registers":  # the plain and pipelined forwards (block_kv = 64 at H = 256) at 232 and 240
        for pipeline in (False, True):
            base = default_config(head_dim, pipeline=pipeline)
            for regs in (232, 240):
                cfg = dataclasses.replace(base, registers=regs)
                label = f"64x{cfg.block_kv}{' pipelined' if pipeline else ''}, {regs} registers"
                yield label, functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg)
    elif kernel == "pallas":
        for bq, bk, warps, stages in PALLAS:
            yield (
                f"{bq}x{bk} w{warps} s{stages}",
                functools.partial(
                    flash_attention, is_causal=causal, block_q=bq, block_k=bk, num_warps=warps, num_stages=stages
                ),
            )
    elif kernel == "fp8":
        from attention_tutorial.kernels.mosaic.fp8 import mosaic_fp8_attention

        for p_via, fields, poly in FP8:
            cfg, probe = MosaicConfig(**fields), Probe(exp_poly=poly)
            fn = functools.partial(mosaic_fp8_attention, is_causal=causal, config=cfg, p_via=p_via, probe=probe)
            label = f"FP8 64x{cfg.block_kv} stages {cfg.stages} p via {p_via}"
            label += f", {cfg.registers} registers" if "registers" in fields else ""
            yield label + (f", exp_poly {poly}" if poly else ""), fn
    elif kernel == "pipe":
        for bkv, stages, pipeline in PIPE:
            cfg = MosaicConfig(block_kv=bkv, stages=stages, pipeline=pipeline)
            label = f"64x{bkv} stages {stages}" + (" pipelined" if pipeline else "")
            yield label, functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg)
    else:
        for bkv, stages in MOSAIC:
            cfg = MosaicConfig(block_kv=bkv, stages=stages)
            yield f"64x{bkv} stages {stages}", functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg)


def main(kernel, save):
    rows = []
    for H in {"pipe": (128,), "fp8": (128,), "registers": (128, 256)}.get(kernel, (128, 64)):
        B, T, N = (4, 8192, 16) if kernel in ("pipe", "fp8", "registers") else (8, 4096, 16)
        q, k, v = make_qkv(B, T, N, H, dtype=jnp.bfloat16)
        for causal in (False, True):
            flops = attention_flops(B, T, T, N, H, causal=causal)
            cudnn = functools.partial(dot_product_attention, implementation="cudnn", is_causal=causal)
            if kernel == "fp8":  # the race's FP8 baseline: cuDNN's FP8 attention, P scale 448
                from attention_tutorial.measure.fp8 import cudnn_fp8_attention

                cudnn = functools.partial(cudnn_fp8_attention, is_causal=causal, scale_s=448.0)
            exact = jax.jit(functools.partial(dot_product_attention, implementation="cudnn", is_causal=causal))(q, k, v)
            for label, fn in [("cuDNN FP8" if kernel == "fp8" else "cuDNN", cudnn), *candidates(kernel, causal, H)]:
                try:
                    err = rel_error(jax.jit(fn)(q, k, v), exact)  # against bf16 cuDNN: a wrong kernel is not timed
                    if err > WRONG_ABOVE["float8_e4m3fn" if kernel == "fp8" else "bfloat16"]:
                        raise ArithmeticError(f"wrong result: relative error {err:.3g} against bf16 cuDNN")
                    tf = flops / time_fn(fn, q, k, v, repeats=10, max_seconds=0.5).median_ms / 1e9
                except Exception as err:  # a configuration that does not compile or fit is reported, not fatal
                    tf = None
                    print(f"H={H} {label}: {type(err).__name__}: {str(err)[:160]}")
                rows.append(
                    {"kernel": kernel, "B": B, "T": T, "N": N, "H": H, "causal": causal, "config": label, "tflops": tf}
                )
                print(f"H={H:3d} causal={causal!s:5} {label:28s} {tf and round(tf)}", flush=True)
                save(rows)


def fwd_bwd(fn):
    """q, k, v, dO -> (dq, dk, dv) through jax.vjp: what a training step pays for attention."""

    def run(q, k, v, d_out):
        return jax.vjp(fn, q, k, v)[1](d_out)

    return run


def backward(save):
    """Time forward+backward of cuDNN, our Pallas (Triton) and our Mosaic GPU kernel; save rows as they come."""
    rows = []
    for T in (4096, 8192):
        B, N, H = 16384 // T, 16, 128
        q, k, v = make_qkv(B, T, N, H, dtype=jnp.bfloat16)
        d_out = jax.random.normal(jax.random.key(1), q.shape, jnp.float32).astype(q.dtype)
        for causal in (False, True):
            flops = attention_flops(B, T, T, N, H, causal=causal, pass_="fwd+bwd")
            impls = {
                "cudnn": functools.partial(dot_product_attention, implementation="cudnn", is_causal=causal),
                "pallas": functools.partial(flash_attention, is_causal=causal),
                "mosaic": functools.partial(mosaic_flash_attention, is_causal=causal),
            }
            for name, fn in impls.items():
                try:
                    ms = time_fn(fwd_bwd(fn), q, k, v, d_out, repeats=10, max_seconds=0.5).median_ms
                except Exception as err:  # reported, not fatal
                    ms = None
                    print(f"T={T} {name}: {type(err).__name__}: {str(err)[:300]}", flush=True)
                rows.append(
                    {
                        "impl": name,
                        "B": B,
                        "T": T,
                        "N": N,
                        "H": H,
                        "causal": causal,
                        "pass": "fwd+bwd",
                        "median_ms": ms,
                        "tflops": ms and flops / ms / 1e9,
                    }
                )
                print(rows[-1], flush=True)
                save(rows)


def backward_configs(kernel, head_dim):
    """(label, MosaicConfig) of each backward configuration of ``kernel`` (bwd_tiles, bwd_dq) at ``head_dim``."""
    if kernel == "bwd_tiles":
        for bq, bkv, st, dq in BWD_TILES:
            label = f"bwd {bq}x{bkv} stages {st}" + ("" if dq == "pass" else f" dQ {dq}")
            yield label, MosaicConfig(bwd_block_q=bq, bwd_block_kv=bkv, bwd_stages=st, bwd_dq=dq)
    else:
        for label, fields in BWD_DQ_CONFIGS:
            yield label, MosaicConfig(**fields)


def backward_tiles(save, kernel="bwd_tiles"):
    """Time forward+backward of our Mosaic GPU kernel at each backward configuration of ``kernel`` beside cuDNN's;
    a configuration whose gradients are off (against cuDNN's) is reported, not timed; rows are saved as they come."""
    rows = []
    B, T, N = 4, 8192, 16
    for H in (64, 128):
        q, k, v = make_qkv(B, T, N, H, dtype=jnp.bfloat16)
        d_out = jax.random.normal(jax.random.key(1), q.shape, jnp.float32).astype(q.dtype)
        for causal in (False, True):
            flops = attention_flops(B, T, T, N, H, causal=causal, pass_="fwd+bwd")
            cudnn = functools.partial(dot_product_attention, implementation="cudnn", is_causal=causal)
            exact = jax.jit(fwd_bwd(cudnn))(q, k, v, d_out)
            impls = [("cuDNN", cudnn)] + [
                (label, functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg))
                for label, cfg in backward_configs(kernel, H)
            ]
            for label, fn in impls:
                try:
                    grads = jax.jit(fwd_bwd(fn))(q, k, v, d_out)
                    err = max(rel_error(g, e) for g, e in zip(grads, exact))
                    if err > WRONG_ABOVE["bfloat16"]:
                        raise ArithmeticError(f"wrong gradients: relative error {err:.3g} against cuDNN's")
                    tf = flops / time_fn(fwd_bwd(fn), q, k, v, d_out, repeats=10, max_seconds=0.5).median_ms / 1e9
                except Exception as exc:  # a configuration that does not compile or fit is reported, not fatal
                    tf = err = None
                    print(f"H={H} {label}: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
                rows.append(
                    {
                        "kernel": kernel,
                        "B": B,
                        "T": T,
                        "N": N,
                        "H": H,
                        "causal": causal,
                        "config": label,
                        "pass": "fwd+bwd",
                        "tflops": tf,
                        "rel_error_vs_cudnn": err,
                    }
                )
                print(
                    f"H={H:3d} causal={causal!s:5} {label:34s} {tf and round(tf)}  err {err and f'{err:.2g}'}",
                    flush=True,
                )
                save(rows)


def training(save):
    """The training step of the recorded model with and without biases, queued ahead: rows as they come."""
    from attention_tutorial.train.dispatch import dispatch_records
    from attention_tutorial.train.model import H200

    rows = []
    for bias in (True, False):
        config = dataclasses.replace(H200, bias=bias)
        for r in dispatch_records(("cudnn", "mosaic"), config=config, steps=10, rounds=3):
            if r["waiting"] != "ahead":
                continue
            rows.append(
                {
                    "kernel": "train",
                    "B": config.batch,
                    "T": config.seq_len,
                    "N": config.heads,
                    "H": config.head_dim,
                    "causal": True,
                    "config": f"{r['impl']}, bias={bias}",
                    "impl": r["impl"],
                    "bias": bias,
                    "tflops": r["tflops"],
                    "step_ms": r["median_ms"],
                    "p10_ms": r["p10_ms"],
                    "p90_ms": r["p90_ms"],
                    "rounds": r["rounds"],
                    "mfu_datasheet_pct": r.get("mfu_datasheet_pct"),
                    "status": r["status"],
                    "reason": r.get("reason"),
                }
            )
            print(
                f"{r['impl']:7} bias={bias!s:5} {r['status']:5} {r['median_ms'] or 0:7.2f} ms/step "
                f"MFU {r.get('mfu_datasheet_pct') or 0:.1f} %",
                flush=True,
            )
            save(rows)


if __name__ == "__main__":
    kernels = ("pallas", "mosaic", "pipe", "fp8", "registers", "bwd", "bwd_tiles", "bwd_dq", "train")
    if len(sys.argv) not in (2, 3) or sys.argv[1] not in kernels:
        raise SystemExit(f"usage: python tools/tune.py {{{'|'.join(kernels)}}} [OUT.json]")
    kernel = sys.argv[1]
    out, save = tuning_writer(kernel, sys.argv[2] if len(sys.argv) == 3 else None)
    print(f"recording the {kernel} table into {out}", flush=True)
    if kernel == "bwd":
        backward(save)
    elif kernel in ("bwd_tiles", "bwd_dq"):
        backward_tiles(save, kernel)
    elif kernel == "train":
        training(save)
    else:
        main(kernel, save)
