"""Train the H200 model with several attention implementations and save the runs as the result grid "train".

    python scripts/train_h200.py OUT.json [--impl cudnn xla blockwise] [--steps 300] [--config h200] [--log-every 5]

GPU (the "h200" config: 6 layers, d_model 768, 6 heads × 128, T = 2048, batch 8, bf16). Each implementation trains
in its own process (:func:`attention_tutorial.train.grid.train_grid`), one after another, with the same seed and
batches; then this process measures the ceilings (the bf16 matmul peak gives ``pct_peak``) and merges the records,
tagged ``grid: "train"``, into OUT through :func:`attention_tutorial.results.store.save` (atomic; other grids kept),
with the run's provenance under ``grids.train``. ``--config tiny`` runs the CPU-sized model (a dry run anywhere).
"""

from __future__ import annotations

import argparse
import sys
import time

from attention_tutorial.train.grid import CONFIGS, DEFAULT_IMPLS, train_grid


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="result file to merge the 'train' grid into (created if missing)")
    ap.add_argument("--impl", nargs="+", default=list(DEFAULT_IMPLS))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--config", default="h200", choices=sorted(CONFIGS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=5)
    args = ap.parse_args(argv)
    command = "python scripts/train_h200.py " + " ".join(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    # the children train first: this process touches the device only afterwards, leaving them all its memory
    recs = train_grid(args.impl, steps=args.steps, config=args.config, seed=args.seed, log_every=args.log_every)
    seconds = round(time.perf_counter() - t0, 1)

    from attention_tutorial.env import environment, timestamp
    from attention_tutorial.measure.ceilings import measure_ceilings
    from attention_tutorial.results import record, store

    env = environment()
    ceilings = measure_ceilings() if env["backend"] == "gpu" else {}
    peak = ceilings.get("matmul_bf16_tflops")
    for r in recs:
        r["grid"] = "train"
        if peak and r.get("tflops") is not None:
            r["pct_peak"] = 100 * r["tflops"] / peak
    prov = record.provenance(env, ceilings, command)
    prov["grids"] = {"train": {"created": timestamp(), "seconds": seconds, "command": command,
                               "matmul_bf16_tflops": peak, "flax": env.get("flax"), "config": args.config,
                               **{key: env[key] for key in record.GRID_VERSIONS}}}  # fmt: skip
    store.save(args.out, prov, recs, replace_grids=True)  # the "train" grid is measured whole
    for s in (r for r in recs if r["kind"] == "summary"):
        what = (f"{s['median_ms']:.1f} ms/step, {s['tokens_per_s']:.0f} tokens/s, final loss {s['final_loss']:.3f}, "
                f"held-out {s['eval_loss']:.3f}, {s['attention_kernel']}" if s["status"] == "ok" else s["reason"])  # fmt: skip
        print(f"{s['impl']:10} {s['status']:11} {what}")
    print(f"train: {len(recs)} records in {seconds:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
