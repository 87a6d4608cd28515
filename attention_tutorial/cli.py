"""Command line: ``python -m attention_tutorial {bench,record,env}``.

Examples::

    python -m attention_tutorial env
    python -m attention_tutorial bench --impl xla cudnn --seq 1024 4096 --heads 16 --head-dim 128 --causal
    python -m attention_tutorial bench --grid seq_long --save seq.json --plot seq.png
    python -m attention_tutorial record            # on a GPU: writes attention_tutorial/results/data/<gpu>.json
"""

from __future__ import annotations

import argparse
import json
import sys

from .kernels.masks import MASK_KINDS
from .measure.flops import PASSES


def _parser() -> argparse.ArgumentParser:
    from .measure.grids import GRID_NAMES
    from .registry import IMPLEMENTATIONS

    p = argparse.ArgumentParser(prog="python -m attention_tutorial", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="time implementations over shapes and print a table")
    b.add_argument("--grid", choices=GRID_NAMES, help="run a named grid (its size for this backend) instead")
    b.add_argument("--impl", nargs="+", default=["xla", "cudnn"], choices=sorted(IMPLEMENTATIONS))
    b.add_argument("--batch", "-B", type=int, nargs="+", default=[4])
    b.add_argument("--seq", "-T", type=int, nargs="+", default=[1024], help="query lengths T")
    b.add_argument("--seq-kv", "-S", type=int, default=None, help="key length S (default: T)")
    b.add_argument("--heads", "-N", type=int, nargs="+", default=[8])
    b.add_argument("--kv-heads", "-K", type=int, default=None, help="kv heads K (default: N)")
    b.add_argument("--head-dim", "-H", type=int, nargs="+", default=[64])
    b.add_argument("--dtype", nargs="+", default=["bfloat16"], choices=["bfloat16", "float16", "float32"])
    b.add_argument("--causal", action="store_true", help="causal mask (top-left aligned)")
    b.add_argument("--both-masks", action="store_true", help="run causal and full")
    b.add_argument("--mask", nargs="+", default=["none"], choices=MASK_KINDS)
    b.add_argument("--pass", dest="passes", nargs="+", default=["fwd"], choices=PASSES)
    b.add_argument("--repeats", type=int, default=30)
    b.add_argument("--ceilings", action="store_true", help="measure the matmul peak first and report % of it")
    b.add_argument("--save", metavar="JSON", help="write the records and the environment here")
    b.add_argument("--plot", metavar="PNG", help="plot TFLOP/s against T here")
    b.add_argument("--progress", action="store_true", help="show a progress bar")

    r = sub.add_parser("record", help="on a GPU: run the pages' grids and write attention_tutorial/results/data/<gpu>.json")
    r.add_argument("--grids", nargs="*", default=list(GRID_NAMES), choices=GRID_NAMES)
    r.add_argument("--extras", nargs="*", default=["fp8", "kernel_code"], choices=["fp8", "kernel_code"])
    r.add_argument("--out", help="result file (default: attention_tutorial/results/data/<gpu>.json)")
    r.add_argument("--repeats", type=int, default=20)
    r.add_argument("--max-seconds", type=float, default=1.0, help="cap on timed seconds per point")

    sub.add_parser("env", help="print the environment report (devices, versions) as JSON")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "env":
        from .env import environment

        print(json.dumps(environment(), indent=2))
        return 0
    if args.command == "record":
        from .results.record import record

        try:
            path = record(args.grids, out=args.out, repeats=args.repeats, max_seconds=args.max_seconds,
                          extras=tuple(args.extras))  # fmt: skip
        except RuntimeError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"wrote {path}")
        return 0
    return _bench(args)


def _bench(args) -> int:
    from .env import environment
    from .measure.ceilings import measure_ceilings
    from .measure.grids import points
    from .measure.sweep import grid, run_sweep
    from .results.plotting import markdown_table, plot_records

    if args.grid:
        pts = points(args.grid)
    else:
        pts = grid(
            args.impl, seq_q=args.seq, batch=args.batch, heads=args.heads, head_dim=args.head_dim,
            kv_heads=(args.kv_heads,), seq_kv=(args.seq_kv,), dtype=args.dtype,
            causal=(False, True) if args.both_masks else (args.causal,), passes=args.passes, masks=args.mask,
        )  # fmt: skip
    ceilings = measure_ceilings() if args.ceilings else {}
    peak = ceilings.get("matmul_bf16_tflops")
    recs = run_sweep(pts, peak_tflops=peak, progress=args.progress, repeats=args.repeats)
    cols = ["impl", "batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim", "dtype", "causal", "mask", "pass",
            "median_ms", "p10_ms", "p90_ms", "tflops"] + (["pct_peak"] if peak else []) + ["kernel", "reason"]  # fmt: skip
    print(markdown_table(recs, cols))
    if peak:
        print(f"\npeak: {peak:.1f} TFLOP/s (bf16 matmul, measured now)")
    if args.save:
        with open(args.save, "w") as f:
            json.dump({"provenance": {**environment(), **ceilings, "command": " ".join(sys.argv)}, "records": recs}, f,
                      indent=1)  # fmt: skip
        print(f"saved {len(recs)} records to {args.save}")
    if args.plot:
        plot_records(recs, x="seq_q", y="tflops", by=("impl", "causal"), hline=peak,
                     hline_label="bf16 matmul peak").savefig(args.plot, dpi=120)  # fmt: skip
        print(f"plot: {args.plot}")
    return 0 if any(r["status"] == "ok" for r in recs) else 1
