"""Issue 17 probe (one H200 call): why is the pipelined forward slower? For each variant of our Mosaic forward,
in a fresh process: the machine code (registers, local-memory spills STL/LDL, ptxas's wgmma serialisation
warnings) and the forward's TFLOP/s against cuDNN in the same process, B=4 T=8k N=16 H=128 bf16, causal and not.

Each variant and mask in its own process, so each kernel's machine code is read apart. Variants: plain (no
pipeline) and pipelined, each with the current register split (232/40) and 240/24. (A run_state variant of the
pipelined step, measured in scripts/issue17_probe_h200.json as "pipe_rs", gained nothing and was dropped.)
pipe_nowhere: the pipelined forward with every mask dropped (jnp.where returns the scores; wrong numbers, reported
as such): whether the causal kernel's C7513 comes from the mask's code. (pipe_onemask, one loop masking every block,
was measured slower in scripts/issue17_probe_onemask_h200.json and dropped.)
pipe_dyn: the unmasked pipelined forward with its loop bound made dynamic (the same value, which the compiler cannot
see: min(steps, row0 + steps)), as every causal kernel's bound is: whether a dynamic trip count alone brings C7513
(the causal kernel keeps it with one loop, scripts/issue17_probe_onemask_h200.json, and with no mask at all,
scripts/issue17_probe_nomask_h200.json; the dynamic bound is what every causal variant still shares).
pipe_unroll2: a possible fix for the causal kernel, its loops unrolled by two (p alternates between two register sets).
plain_noexp, pipe_noexp: diagnostic, wrong numbers: exp2 dropped from the softmax, a ceiling for the kernel with the
exponentials' cost removed: if it is no faster, the exponentials are not what holds the no-mask kernel at cuDNN's pace.
fp8: our FP8 forward (kernels/mosaic_fp8.py) against cuDNN's FP8 (P scale 448), with each one's relative error
against float32 ("highest" precision); fp8_regs the same with p kept in registers (p_via="registers").
Usage: [PROBE_HEAD_DIM=256] python3 scripts/gpu_issue17_probe.py OUT_JSON [variant[:causal|:noncausal] ...]
"""

import functools
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# B, T = S, N, H; bfloat16 (attention_tutorial.results.probes.PROBE_SHAPE words it); PROBE_HEAD_DIM=256 probes the
# H = 256 kernels (their own tiles, default_config(256)), the provenance's shape saying so
SHAPE = (4, 8192, 16, int(os.environ.get("PROBE_HEAD_DIM", "128")))
VARIANTS = [
    "plain", "pipe", "plain_r240", "pipe_r240", "pipe_nowhere", "pipe_dyn", "pipe_unroll2", "pipe_static", "plain_noexp", "pipe_noexp",
    "fp8", "fp8_regs", "fp8_regs_noexp",
]  # fmt: skip


def patch(variant):
    import jax.experimental.pallas.mosaic_gpu as plgpu

    from attention_tutorial.kernels import mosaic_flash

    if "nowhere" in variant:  # diagnostic, wrong numbers: no mask at all; does the mask's code bring C7513 back?
        import types

        real = mosaic_flash.jnp
        names = {n: getattr(real, n) for n in dir(real) if not n.startswith("__")}
        mosaic_flash.jnp = types.SimpleNamespace(**{**names, "where": lambda cond, x, y: x})

    if "dyn" in variant:  # diagnostic, right numbers: the loop bound as a value the compiler cannot fold
        real_steps = mosaic_flash._pipelined_steps

        def dynamic(*args, row0, steps, **kwargs):
            return real_steps(*args, row0=row0, steps=mosaic_flash.jnp.minimum(steps, row0 + steps), **kwargs)

        mosaic_flash._pipelined_steps = dynamic

    if "unroll2" in variant:  # a possible fix, right numbers: the pipelined loops unrolled by two (a pair loop and a
        # 0-or-1-trip remainder), so the p carried from one step to the next alternates between two register sets
        real_fori = mosaic_flash.lax.fori_loop

        def fori2(lo, hi, body, carry):
            lo, hi = mosaic_flash.jnp.asarray(lo, "int32"), mosaic_flash.jnp.asarray(hi, "int32")
            pairs = mosaic_flash.lax.div(mosaic_flash.jnp.maximum(hi - lo, 0), mosaic_flash.jnp.array(2, "int32"))
            carry = real_fori(0, pairs, lambda i, c: body(lo + 2 * i + 1, body(lo + 2 * i, c)), carry)
            return real_fori(lo + 2 * pairs, hi, body, carry)

        import types

        real_lax = mosaic_flash.lax
        names = {n: getattr(real_lax, n) for n in dir(real_lax) if not n.startswith("__")}
        mosaic_flash.lax = types.SimpleNamespace(**{**names, "fori_loop": fori2})

    if "static" in variant:  # a possible fix, right numbers: each loop with a dynamic bound becomes one of the probe's
        # greatest trip count (T/block_kv), its steps past the bound skipped by lax.cond
        real_fori, real_lax = mosaic_flash.lax.fori_loop, mosaic_flash.lax
        most = SHAPE[1] // MosaicConfig_block_kv()

        def fori_static(lo, hi, body, carry):
            if isinstance(lo, int) and isinstance(hi, int):
                return real_fori(lo, hi, body, carry)

            def guarded(i, c):
                j = lo + i
                return real_lax.cond(j < hi, lambda c: body(j, c), lambda c: c, c)

            return real_fori(0, most, guarded, carry)

        import types

        names = {n: getattr(real_lax, n) for n in dir(real_lax) if not n.startswith("__")}
        mosaic_flash.lax = types.SimpleNamespace(**{**names, "fori_loop": fori_static})

    if "noexp" in variant:  # diagnostic, wrong numbers: exp2 dropped, a ceiling with the exponentials' cost removed
        import types

        real = mosaic_flash.jnp
        names = {n: getattr(real, n) for n in dir(real) if not n.startswith("__")}
        mosaic_flash.jnp = types.SimpleNamespace(**{**names, "exp2": lambda x: x})

    if "r240" in variant:
        orig = plgpu.set_max_registers

        def regs(n, *, action):
            return orig({232: 240, 40: 24}.get(n, n), action=action)

        plgpu.set_max_registers = regs


def MosaicConfig_block_kv():
    from attention_tutorial.kernels.mosaic_flash import default_config

    return default_config(SHAPE[3], pipeline=True).block_kv


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
    from attention_tutorial.kernels.mosaic_flash import default_config, mosaic_flash_attention
    from attention_tutorial.measure.flops import attention_flops
    from attention_tutorial.measure.timing import time_fn

    patch(variant)
    B, T, N, H = SHAPE
    cfg = default_config(H, pipeline=variant.startswith("pipe"))  # at H = 128, MosaicConfig(pipeline=...)
    q, k, v = make_qkv(B, T, N, H, dtype=jnp.bfloat16, seed=1)
    rows = []
    for causal in causal_flags:
        flops = attention_flops(B, T, T, N, H, causal=causal)
        row = {"variant": variant, "causal": causal}
        try:
            cud = functools.partial(jax.nn.dot_product_attention, implementation="cudnn", is_causal=causal)
            ours = functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg)
            if variant.startswith("fp8"):  # our FP8 forward against cuDNN's (P scale 448), both from bf16 inputs
                from attention_tutorial.kernels.mosaic_fp8 import mosaic_fp8_attention
                from attention_tutorial.measure.fp8 import cudnn_fp8_attention, rel_error

                p_via = "registers" if variant.startswith("fp8_regs") else "smem"
                ours = functools.partial(mosaic_fp8_attention, is_causal=causal, p_via=p_via)
                cud = functools.partial(cudnn_fp8_attention, is_causal=causal, scale_s=448.0)
                f32 = [x.astype(jnp.float32) for x in (q, k, v)]
                with jax.default_matmul_precision("highest"):
                    exact = jax.nn.dot_product_attention(*f32, is_causal=causal)
                row["rel_error_ours"] = rel_error(jax.jit(ours)(q, k, v), exact)
                row["rel_error_cudnn_fp8"] = rel_error(jax.jit(cud)(q, k, v), exact)
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


def provenance(variants):
    """Where the entries come from: the digest of the code run (git-free: the GPU machine's git can be older than
    its tree), the commit its git reports (and whether tracked files differ from it), the machine's versions, the
    probe's shape and the variants asked for."""
    root = Path(__file__).resolve().parents[1]

    def git(*args):
        run = subprocess.run(["git", *args], capture_output=True, text=True, cwd=root)
        return run.stdout.strip() if run.returncode == 0 else None

    # in a process of its own: JAX in this one would take the GPU's memory from the variants' processes
    code = "import json; from attention_tutorial.env import environment; print(json.dumps(environment()))"
    env = {
        **os.environ,
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "PYTHONPATH": f"{root}:{os.environ.get('PYTHONPATH', '')}",
    }
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    machine = json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else {"error": run.stderr[-300:]}
    sys.path.insert(0, str(root))  # the package beside this script, as the variants' processes import it
    try:
        from attention_tutorial.kernels.mosaic_flash import default_config  # imports JAX, but starts no backend
        from attention_tutorial.results.probes import sources_digest

        digest = sources_digest(root)
        tiles = {kind: {f: getattr(default_config(SHAPE[3], pipeline=kind == "pipe"), f)
                        for f in ("block_q", "block_kv", "stages")} for kind in ("plain", "pipe")}  # fmt: skip
    except Exception as err:  # a broken package still lets the variants run and report their own errors
        digest, tiles = f"unread: {type(err).__name__}", None
    return {**machine, "sources_sha256": digest, "tiles": tiles, "commit": git("rev-parse", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "shape": dict(zip(("batch", "seq", "heads", "head_dim"), SHAPE)), "dtype": "bfloat16",
            "variants": list(variants)}  # fmt: skip


def main():
    out_path = sys.argv[1]
    if os.path.exists(out_path):  # a measurement is never overwritten: the time goes into the new name
        stem, ext = os.path.splitext(out_path)
        out_path = f"{stem}-{int(time.time())}{ext}"
    variants = sys.argv[2:] or VARIANTS  # NAME runs both masks, NAME:causal or NAME:noncausal one
    prov = provenance(variants)
    result = []
    runs = [v.split(":") if ":" in v else (v, c) for v in variants for c in ("noncausal", "causal")]
    for variant, causal in dict.fromkeys(map(tuple, runs)):
        with tempfile.TemporaryDirectory() as folder:
            run = subprocess.run(
                [sys.executable, __file__, "--child", variant, folder, causal],
                capture_output=True,
                text=True,
                timeout=300,
            )
            facts = code_facts(folder)
            for n, ptx in enumerate(
                sorted(q for q in Path(folder).rglob("*") if q.is_file() and "ptx" in q.name.lower())
            ):  # kept for reading on another machine
                with gzip.open(f"{out_path}.{variant}.{causal}.{n}.ptx.gz", "wb") as f:
                    f.write(ptx.read_bytes())
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
        Path(tmp).write_text(json.dumps({"provenance": prov, "entries": result}, indent=1))
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
                    f"diff {r['max_abs_diff_vs_cudnn']:.1e}"
                    + (
                        f" rel err ours {r['rel_error_ours']:.4f} cuDNN {r['rel_error_cudnn_fp8']:.4f}"
                        if "rel_error_ours" in r
                        else ""
                    ),
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
