"""Race our Mosaic GPU kernels against cuDNN on the GPU, interleaved in one process; print a table, save JSON.

python tools/race.py OUT.json [GROUP...]   groups: forward, schedule, masks, backward (all by default)

Each case times every contender once per round, in turn (so clocks and heat fall on all alike), ``ROUNDS`` rounds;
a contender's number is the median of its rounds' medians, its spread the lowest and highest round. Before timing,
each contender's output is checked against cuDNN's (or, where cuDNN has no such mask, against XLA's attention): a
wrong kernel is reported, not timed. TFLOP/s count the kept scores only (4·N·H per kept score, ×3.5 with the
backward). The file holds the device, JAX's version, the code's commit (``ATTENTION_TUTORIAL_COMMIT``), the SM
clock before and after, and every round; it is rewritten after each case (atomically), so Ctrl-C keeps what ran.
"""

import dataclasses
import functools
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from attention_tutorial import dot_product_attention, make_qkv, time_fn
from attention_tutorial.kernels.mosaic import default_config, mosaic_flash_attention
from attention_tutorial.kernels.mosaic.masks import dense, make_mask
from attention_tutorial.measure.fp8 import rel_error

ROUNDS = 3
TOKENS = 32 * 1024  # B·T of each forward case
N = 16


def clocks() -> str:
    try:
        q = "clocks.sm,clocks.max.sm,temperature.gpu,power.draw"
        return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""


def kept_scores(B, T, S, **mask_args) -> float:
    mask, arrays = make_mask(B, T, S, **mask_args)
    return float(dense(mask, arrays, B).sum())


def ours(head_dim, *, schedule="rendezvous", pipeline=False, **mask):
    cfg = dataclasses.replace(default_config(head_dim, pipeline=pipeline), schedule=schedule)
    return functools.partial(mosaic_flash_attention, config=cfg, **mask)


def cudnn(**mask):
    return functools.partial(dot_product_attention, implementation="cudnn", **mask)


def xla(**mask):
    return functools.partial(dot_product_attention, implementation="xla", **mask)


def with_grad(fn):
    """Forward and backward: the three gradients of sum(out · dO)."""

    def f(q, k, v, d_out):
        out, vjp = jax.vjp(fn, q, k, v)
        return vjp(d_out)

    return f


def cases(groups):
    """(group, name, shape (B, T, S, N, K, H), mask kwargs for ours, {contender: fn}, pass_, checked against)."""
    T = 8192
    B = TOKENS // T
    if "forward" in groups or "schedule" in groups:
        for H in (128, 256):
            for causal in (False, True):
                m = {"is_causal": causal}
                race = {"cuDNN": cudnn(**m), "ours": ours(H, **m), "ours, turns": ours(H, schedule="turns", **m)}
                if "schedule" in groups:
                    race["ours, pipelined"] = ours(H, pipeline=True, **m)
                yield (
                    "forward",
                    f"H={H} {'causal' if causal else 'no mask'}",
                    (B, T, T, N, N, H),
                    m,
                    race,
                    "fwd",
                    "cuDNN",
                )
    if "masks" in groups:
        H = 128
        ragged = 8000
        for name, shape, m, base in [
            ("causal, T=8000 (not a multiple of 128)", (4, ragged, ragged, N, N, H), {"is_causal": True}, "cuDNN"),
            ("sliding window 1024, causal", (B, T, T, N, N, H), {"is_causal": True, "local_window_size": (1023, 0)}, "cuDNN"),
            ("GQA 16/2, causal", (B, T, T, N, 2, H), {"is_causal": True}, "cuDNN"),
        ]:  # fmt: skip
            race = {"cuDNN": cudnn(**m), "ours": ours(H, **m), "ours, turns": ours(H, schedule="turns", **m)}
            yield "masks", name, shape, m, race, "fwd", base
        # four documents of 2048 packed in each row of 8192: ours skips the tiles between documents
        seg = jnp.repeat(jnp.arange(4, dtype=jnp.int32), T // 4)[None].repeat(B, 0)
        m = {"is_causal": True, "segment_ids": seg}
        race = {
            "XLA": xla(is_causal=True, bias=None, mask=(seg[:, None, :, None] == seg[:, None, None, :])),
            "ours": ours(H, **m),
            "ours, causal over the whole row": ours(H, is_causal=True),
        }
        yield "masks", "4 packed documents of 2048, causal", (B, T, T, N, N, H), m, race, "fwd", "XLA"
    if "backward" in groups:
        for H in (64, 128):
            for causal in (False, True):
                m = {"is_causal": causal}
                race = {"cuDNN": with_grad(cudnn(**m)), "ours": with_grad(ours(H, **m))}
                yield (
                    "backward",
                    f"H={H} {'causal' if causal else 'no mask'}",
                    (B, T, T, N, N, H),
                    m,
                    race,
                    "fwd+bwd",
                    "cuDNN",
                )


def save(path, data):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def main(out, groups):
    data = {"provenance": {"device": jax.devices()[0].device_kind, "jax": jax.__version__,
                           "commit": os.environ.get("ATTENTION_TUTORIAL_COMMIT", ""), "rounds": ROUNDS,
                           "clocks_before": clocks(), "started": time.strftime("%Y-%m-%d %H:%M:%S")},
            "cases": []}  # fmt: skip
    for group, name, (B, T, S, n, K, H), m, race, pass_, checked in cases(groups):
        q, k, v = make_qkv(B, T, n, H, seq_kv=S, kv_heads=K, dtype=jnp.bfloat16, seed=T + H)
        args = (q, k, v) if pass_ == "fwd" else (q, k, v, jnp.ones_like(q) * 0.01)
        flops = 4.0 * n * H * kept_scores(B, T, S, **m) * (3.5 if pass_ == "fwd+bwd" else 1.0)
        compiled, errors, rows = {}, {}, []
        want = None
        for label, fn in race.items():
            try:
                compiled[label] = jax.jit(fn).lower(*args).compile()
                got = compiled[label](*args)
                got = got if pass_ == "fwd" else got[0]
                want = got if label == checked else want
                errors[label] = None if want is None or label == checked else rel_error(got, want)
            except Exception as e:  # reported, not timed
                errors[label] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                compiled.pop(label, None)
        per_round = {label: [] for label in compiled}
        for _ in range(ROUNDS):
            for label, c in compiled.items():
                if isinstance(errors[label], str) or (errors[label] or 0) > 0.05:
                    continue
                per_round[label].append(time_fn(None, *args, compiled=c, repeats=10, max_seconds=2.0).median_ms)
        for label in race:
            ms = per_round.get(label) or []
            med = float(np.median(ms)) if ms else None
            rows.append({"contender": label, "rounds_ms": ms, "median_ms": med, "tflops": flops / med / 1e9 if med else None,
                         "error": errors.get(label)})  # fmt: skip
        base = next((r["median_ms"] for r in rows if r["contender"] == checked), None)
        for r in rows:
            r["speed_vs_" + checked] = base / r["median_ms"] if base and r["median_ms"] else None
        data["cases"].append({"group": group, "case": name, "shape": [B, T, S, n, K, H], "pass": pass_,
                              "baseline": checked, "flops": flops, "rows": rows})  # fmt: skip
        data["provenance"]["clocks_after"] = clocks()
        save(out, data)
        print(f"\n{group}: {name}  (B,T,S,N,K,H)={B, T, S, n, K, H}")
        for r in rows:
            ratio = r["speed_vs_" + checked]
            tf = f"{r['tflops']:7.1f}" if r["tflops"] else "      –"
            spread = f"{min(r['rounds_ms']):.3f}-{max(r['rounds_ms']):.3f} ms" if r["rounds_ms"] else ""
            err = r["error"] if isinstance(r["error"], str) else (f"err {r['error']:.1e}" if r["error"] else "")
            print(
                f"  {r['contender']:34} {tf} TFLOP/s  {f'{ratio:.3f}' if ratio else '  –  '} of {checked}  {spread}  {err}"
            )
    print("clocks:", data["provenance"]["clocks_before"], "->", data["provenance"]["clocks_after"])


if __name__ == "__main__":
    main(sys.argv[1], set(sys.argv[2:]) or {"forward", "schedule", "masks", "backward"})
