"""Issue 17 probe (one H200 call): why is the pipelined forward slower? For each variant of our Mosaic forward,
in a fresh process: the machine code (registers, local-memory spills STL/LDL, ptxas's wgmma serialisation
warnings) and the forward's TFLOP/s against cuDNN in the same process, B=4 T=8k N=16 H=128 bf16, causal and not.

Each variant and mask in its own process, so each kernel's machine code is read apart. Variants: plain (no pipeline) and pipelined, each with the current register split (232/40) and 240/24; and
'rs': the pipelined step with p·v's accumulator carried by run_state (ACC.init(acc)) instead of copied into a
fresh scoped accumulator.  Usage: python3 scripts/gpu_issue17_probe.py OUT_JSON [variant ...]
"""

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS = ["plain", "pipe", "pipe_rs", "plain_r240", "pipe_r240", "pipe_rs_r240"]


def patch(variant):
    import jax.experimental.pallas.mosaic_gpu as plgpu

    from attention_tutorial.kernels import mosaic_flash as mf

    if "r240" in variant:
        orig = plgpu.set_max_registers

        def regs(n, *, action):
            return orig({232: 240, 40: 24}.get(n, n), action=action)

        plgpu.set_max_registers = regs
    if "rs" in variant:
        mf._pipelined_steps = _pipelined_steps_rs


def _pipelined_steps_rs(
    carry, qo_smem, k_smem, v_smem, kv_barriers, schedule, take_turn, *, row0, steps, cta_steps, causal, stages, scale
):
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu
    import jax.numpy as jnp
    from jax import lax

    from attention_tutorial.kernels.mosaic_flash import LOG2E

    k_ready, v_ready, k_free, v_free = kv_barriers
    acc, m, l = carry
    (bq, _), bkv, dtype = acc.shape, k_smem.shape[1], qo_smem.dtype
    c = scale * LOG2E

    def slot(j):
        return lax.rem(j, jnp.array(stages, jnp.int32))

    def softmax(s, m, l, j, masked):
        if masked:
            rows = plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 0, layout=plgpu.Layout.WGMMA) + row0
            cols = plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 1, layout=plgpu.Layout.WGMMA) + j * bkv
            s = jnp.where(cols <= rows, s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(axis=1) * c)
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s * c - lax.broadcast_in_dim(m_new, s.shape, [0]))
        return lax.optimization_barrier((p.astype(dtype), m_new, l * alpha + p.sum(axis=1), alpha))

    def end_turn(j):
        plgpu.barrier_arrive(schedule)

        @pl.when(j + 1 < steps)
        def _():
            plgpu.barrier_wait(k_ready.at[slot(j + 1)])

        plgpu.barrier_wait(v_ready.at[slot(j)])
        plgpu.barrier_wait(schedule)

    def qk(s_ref):
        plgpu.wgmma(s_ref, qo_smem, k_smem.at[0].transpose((1, 0)))
        take_turn()
        return s_ref[...]

    zero = jnp.array(0, jnp.int32)
    s = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32))
    plgpu.barrier_arrive(k_free.at[0])
    p16, m, l, alpha = softmax(s, m, l, zero, masked=causal)
    end_turn(zero)
    s_zero = plgpu.layout_cast(jnp.full((bq, bkv), 0.0, jnp.float32), plgpu.Layout.WGMMA)

    def step(j, carry, masked=False):
        acc, m, l, p16, alpha = carry

        def both(refs):
            s_ref, o_ref, st_ref = refs
            plgpu.wgmma(s_ref, qo_smem, k_smem.at[slot(j + 1)].transpose((1, 0)))
            plgpu.wgmma(o_ref, p16, v_smem.at[slot(j)])
            take_turn()
            s = plgpu.wgmma_accumulator_load(s_ref, wait_n=1)
            plgpu.barrier_arrive(k_free.at[slot(j + 1)])
            for ref, value in zip(st_ref, softmax(s, m, l, j + 1, masked)):
                ref[...] = value

        _, o, (p16n, mn, ln, alphan) = pl.run_state(both)(
            (plgpu.ACC.init(s_zero), plgpu.ACC.init(acc), (p16, m, l, alpha))
        )
        plgpu.barrier_arrive(v_free.at[slot(j)])
        end_turn(j + 1)
        return o * lax.broadcast_in_dim(alphan, o.shape, [0]), mn, ln, p16n, alphan

    last = jnp.asarray(steps, jnp.int32) - 1
    if not causal:
        acc, m, l, p16, alpha = lax.fori_loop(zero, last, step, (acc, m, l, p16, alpha))
    else:
        split = jnp.maximum(jnp.minimum(lax.div(row0, jnp.array(bkv, jnp.int32)), steps) - 1, 0)
        carry = lax.fori_loop(zero, split, step, (acc, m, l, p16, alpha))
        acc, m, l, p16, alpha = lax.fori_loop(split, last, functools.partial(step, masked=True), carry)

    def pv(acc_ref):
        plgpu.wgmma(acc_ref, p16, v_smem.at[slot(last)])

    acc = pl.run_state(pv)(plgpu.ACC.init(acc))
    plgpu.barrier_arrive(v_free.at[slot(last)])
    if causal:

        @pl.loop(steps, cta_steps)
        def _(j):
            plgpu.barrier_arrive(k_free.at[slot(j)])
            plgpu.barrier_arrive(v_free.at[slot(j)])
            take_turn()
            take_turn()

    return acc, m, l


def child(variant, folder, causal_flags=(False, True)):
    from attention_tutorial.measure.kernel_code import _cuda_tool

    nvdisasm = _cuda_tool("nvdisasm")
    if nvdisasm:  # Mosaic GPU calls nvdisasm for its SASS dump
        os.environ["PATH"] = f"{os.path.dirname(nvdisasm)}:{os.environ['PATH']}"
    os.environ.update(
        {
            "MOSAIC_GPU_DUMP_TO": folder,
            "MOSAIC_GPU_DUMP_PTX": "1",
            "MOSAIC_GPU_DUMP_SASS": "1",
            "MOSAIC_GPU_DUMP_PTXAS": "1",
        }
    )
    import jax
    import jax.numpy as jnp

    from attention_tutorial.inputs import make_qkv
    from attention_tutorial.kernels.mosaic_flash import MosaicConfig, mosaic_flash_attention
    from attention_tutorial.measure.flops import attention_flops
    from attention_tutorial.measure.timing import time_fn

    patch(variant)
    cfg = MosaicConfig(pipeline=variant.startswith("pipe"))
    B, T, N, H = 4, 8192, 16, 128
    q, k, v = make_qkv(B, T, N, H, dtype=jnp.bfloat16, seed=1)
    rows = []
    for causal in causal_flags:
        flops = attention_flops(B, T, T, N, H, causal=causal)
        row = {"variant": variant, "causal": causal}
        try:
            cud = functools.partial(jax.nn.dot_product_attention, implementation="cudnn", is_causal=causal)
            ours = functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg)
            out = jax.jit(ours)(q, k, v).astype(jnp.float32)
            ref = jax.jit(cud)(q, k, v).astype(jnp.float32)
            row["max_abs_diff_vs_cudnn"] = float(jnp.max(jnp.abs(out - ref)))
            for label, fn in (("cudnn", cud), ("ours", ours), ("cudnn2", cud), ("ours2", ours)):
                t = time_fn(fn, q, k, v, repeats=20, max_seconds=1.0)
                row[label] = [flops / t.median_ms / 1e9, flops / t.p90_ms / 1e9, flops / t.p10_ms / 1e9]
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {str(err)[:400]}"
        rows.append(row)
    print("ROWS" + json.dumps(rows))


def code_facts(folder):
    text = "\n".join(p.read_text(errors="replace") for p in sorted(Path(folder).rglob("*")) if p.is_file())
    sass = "\n".join(
        p.read_text(errors="replace")
        for p in sorted(Path(folder).rglob("*"))
        if p.is_file() and re.search(r"/\*[0-9a-f]{4}\*/\s+[A-Z@]", p.read_text(errors="replace"))
    )
    return {
        "registers": sorted(set(map(int, re.findall(r"Used (\d+) registers", text)))),
        "spill_lines": sorted(set(re.findall(r"\d+ bytes spill stores, \d+ bytes spill loads", text))),
        "ptxas_wgmma": sorted(set(l.strip()[:300] for l in text.splitlines() if "wgmma" in l and "erializ" in l)),
        "sass_STL": len(re.findall(r"\bSTL\b", sass)),
        "sass_LDL": len(re.findall(r"\bLDL\b", sass)),
        "sass_HGMMA": len(re.findall(r"\bHGMMA\b", sass)),
        "sass_DEPBAR": len(re.findall(r"WARPGROUP\.DEPBAR|WARPGROUP\.ARRIVE|\bDEPBAR\b", sass)),
        "sass_WARPGROUP_DEPBAR": len(re.findall(r"WARPGROUP\.DEPBAR", sass)),
        "sass_lines": len(sass.splitlines()),
    }


def main():
    out_path = sys.argv[1]
    variants = sys.argv[2:] or VARIANTS
    result = []
    for variant, causal in [(v, c) for v in variants for c in ("noncausal", "causal")]:
        with tempfile.TemporaryDirectory() as folder:
            run = subprocess.run(
                [sys.executable, __file__, "--child", variant, folder, causal],
                capture_output=True,
                text=True,
                timeout=300,
            )
            facts = code_facts(folder)
        rows = [json.loads(l[4:]) for l in run.stdout.splitlines() if l.startswith("ROWS")]
        entry = {
            "variant": variant,
            "mask": causal,
            "rc": run.returncode,
            "code": facts,
            "rows": rows[0] if rows else [],
            "stderr_tail": run.stderr[-1500:] if run.returncode or not rows else "",
        }
        result.append(entry)
        tmp = out_path + ".tmp"
        Path(tmp).write_text(json.dumps(result, indent=1))
        os.replace(tmp, out_path)
        print(variant, causal, json.dumps(facts), flush=True)
        for r in entry["rows"]:
            if "error" in r:
                print("  causal", r["causal"], r["error"][:300])
            else:
                ratio = [r["ours"][0] / r["cudnn"][0], r["ours2"][0] / r["cudnn2"][0]]
                print(
                    f"  causal={r['causal']!s:5} ours {r['ours'][0]:.0f}/{r['ours2'][0]:.0f} cudnn "
                    f"{r['cudnn'][0]:.0f}/{r['cudnn2'][0]:.0f} ratio {ratio[0]:.3f}/{ratio[1]:.3f} "
                    f"diff {r['max_abs_diff_vs_cudnn']:.1e}",
                    flush=True,
                )
        if entry["stderr_tail"]:
            print(entry["stderr_tail"][-800:])


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        child(sys.argv[2], sys.argv[3], (sys.argv[4] == "causal",) if len(sys.argv) > 4 else (False, True))
    else:
        main()
