"""Command line: ``python -m attention_tutorial {bench,record,env}``.

Examples::

    python -m attention_tutorial env
    python -m attention_tutorial bench --impl xla cudnn --seq 1024 4096 --heads 16 --head-dim 128 --causal
    python -m attention_tutorial bench --grid seq_long --save seq.json --plot seq.png
    python -m attention_tutorial record            # on a GPU: writes attention_tutorial/results/data/<gpu>.json

``bench --save`` checks both paths before measuring, then saves after every point (an interrupted sweep keeps
what it measured; Ctrl-C prints the partial table). An existing result file of the same device is merged into
(a point measured again replaces its old record); any other file is left alone unless ``--force``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .kernels.masks import MASK_KINDS
from .measure.flops import PASSES

# The core grids ``compare`` runs, with the axis each is plotted against and the fields that make its lines.
COMPARE_X = {"seq_long": ("seq_q", ("impl", "causal")), "batch": ("batch", ("impl",)),
             "decode": ("seq_kv", ("impl", "kv_heads"))}  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    from .measure.grids import GRID_NAMES
    from .registry import IMPLEMENTATIONS
    from .results.record import EXTRAS

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
    b.add_argument("--save", metavar="JSON", help="save the records and the environment here (merged into an "
                   "existing result file of this device), after every point")  # fmt: skip
    b.add_argument("--plot", metavar="PNG", help="plot TFLOP/s against T here (png, pdf, svg, ...)")
    b.add_argument("--force", action="store_true", help="replace a --save file that is not a result file of this "
                   "device (it is lost)")  # fmt: skip
    b.add_argument("--progress", action="store_true", help="show a progress bar")

    r = sub.add_parser(
        "record", help="on a GPU: run the pages' grids and write attention_tutorial/results/data/<gpu>.json"
    )
    r.add_argument("--grids", nargs="*", default=list(GRID_NAMES), choices=GRID_NAMES)
    r.add_argument(
        "--extras",
        nargs="*",
        default=["fp8", "kernel_code"],
        choices=list(EXTRAS),
    )
    r.add_argument("--out", help="result file (default: attention_tutorial/results/data/<gpu>.json)")
    r.add_argument("--repeats", type=int, default=20)
    r.add_argument("--max-seconds", type=float, default=1.0, help="cap on timed seconds per point")

    c = sub.add_parser("compare", help="run the core grids here and plot them beside the recorded reference GPU")
    c.add_argument("--grids", nargs="+", default=list(COMPARE_X), choices=GRID_NAMES)
    c.add_argument("--out", default="compare", help="folder for the plots and this machine's result file")
    c.add_argument("--reference", default="nvidia-h200", help="the recorded result file to compare with")
    c.add_argument("--repeats", type=int, default=10)

    sub.add_parser("env", help="print the environment report (devices, versions) as JSON")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.command == "env":
        from .env import environment

        print(json.dumps(environment(), indent=2))
        return 0
    if args.command == "record":
        from .results.record import record

        try:
            path = record(args.grids, out=args.out, repeats=args.repeats, max_seconds=args.max_seconds,
                          extras=tuple(args.extras))  # fmt: skip
        except (RuntimeError, ValueError) as err:  # no GPU; nothing to record; a broken --out file
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"wrote {path}")
        return 0
    if args.command == "compare":
        return _compare(args)
    return _bench(args)


def check_outputs(save, plot, *, force=False, provenance=None) -> list[str]:
    """What is wrong with the --save and --plot paths, checked before anything is measured."""
    from .results import store

    problems = []
    if save and plot and Path(save).resolve() == Path(plot).resolve():
        return [f"--save and --plot name the same file {save}"]
    for flag, path in (("--save", save), ("--plot", plot)):
        if not path:
            continue
        path = Path(path)
        folder = path.parent.resolve()
        if path.is_dir():
            problems.append(f"{flag} {path} is a folder; name a file")
        elif path.exists() and not path.is_file():
            problems.append(f"{flag} {path} is not a regular file (a device or a pipe); name a file")
        elif not folder.is_dir():
            problems.append(f"{flag} {path}: the folder {folder} does not exist")
        elif not os.access(folder, os.W_OK):
            problems.append(f"{flag} {path}: the folder {folder} is not writable")
    if plot and not Path(plot).is_dir():
        formats = _plot_formats()
        if Path(plot).suffix.lstrip(".").lower() not in formats:
            problems.append(f"--plot {plot}: name an image file ending in one of {', '.join(sorted(formats))}")
    if save and Path(save).is_file() and not force:
        try:
            old = store.load(save)
        except store.ResultFileError as err:
            problems.append(f"--save {save} exists and is not a result file ({err}); refusing to overwrite it: "
                            "choose another path, or pass --force to replace it")  # fmt: skip
        else:
            here = provenance or {}
            theirs = (old["provenance"].get("backend", "gpu"), old["provenance"].get("gpu"))
            if provenance and theirs != (here.get("backend", "gpu"), here.get("gpu")):
                problems.append(f"--save {save} holds results of {theirs[1] or theirs[0]}, not of this device: "
                                "choose another path, or pass --force to replace it")  # fmt: skip
    return problems


def _plot_formats() -> set[str]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return set(FigureCanvasAgg(Figure()).get_supported_filetypes())


def _bench(args) -> int:
    from .env import environment, timestamp
    from .measure.ceilings import measure_ceilings
    from .measure.grids import points
    from .measure.sweep import grid, run_sweep
    from .results import store
    from .results.plotting import markdown_table
    from .results.record import GRID_VERSIONS, provenance

    env = environment()
    command = "python -m attention_tutorial " + " ".join(args.argv)
    prov = provenance(env, {}, command)
    problems = check_outputs(args.save, args.plot, force=args.force, provenance=prov)
    sizes = {"--batch": args.batch, "--seq": args.seq, "--seq-kv": [args.seq_kv] if args.seq_kv is not None else [],
             "--heads": args.heads, "--kv-heads": [args.kv_heads] if args.kv_heads is not None else [],
             "--head-dim": args.head_dim}  # fmt: skip
    problems += [f"{flag} {n}: sizes must be positive integers" for flag, vs in sizes.items() for n in vs if n < 1]
    if problems:
        print("error: " + "\nerror: ".join(problems), file=sys.stderr)
        return 2
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
    prov = provenance(env, ceilings, command)
    started, recs, replace = time.perf_counter(), [], args.force

    def keep(rec):  # save after every point: an interrupted sweep keeps what it measured
        nonlocal replace
        if args.grid:
            rec["grid"] = args.grid
        recs.append(rec)
        if args.save:
            if args.grid:
                seconds = round(time.perf_counter() - started, 1)
                prov["grids"] = {args.grid: {"created": timestamp(), "seconds": seconds, "command": command,
                                             "matmul_bf16_tflops": peak, **{k: env[k] for k in GRID_VERSIONS}}}  # fmt: skip
            store.save(args.save, prov, [rec], replace_grids=False, overwrite=replace)
            replace = False  # --force replaces the old file once, then this run's points merge

    interrupted = False
    try:
        run_sweep(pts, peak_tflops=peak, progress=args.progress, repeats=args.repeats, on_record=keep)
    except KeyboardInterrupt:
        interrupted = True
    cols = ["impl", "batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim", "dtype", "causal", "mask", "pass",
            "median_ms", "p10_ms", "p90_ms", "tflops"] + (["pct_peak"] if peak else []) + ["kernel", "reason"]  # fmt: skip
    if recs:
        print(markdown_table(recs, cols))
    if interrupted:
        print(f"\ninterrupted: {len(recs)} of {len(pts)} points measured", file=sys.stderr)
    if peak:
        print(f"\npeak: {peak:.1f} TFLOP/s (bf16 matmul, measured now)")
    if args.save and recs:
        print(f"saved {len(recs)} records to {args.save}")
    if args.plot and any(r["status"] == "ok" for r in recs):
        _plot(recs, args.plot, peak)
        print(f"plot: {args.plot}")
    if interrupted:
        return 130
    return 0 if any(r["status"] == "ok" for r in recs) else 1


def _plot(recs, path, peak):
    """Plot TFLOP/s against T into ``path``, written atomically (a temporary file, then ``os.replace``)."""
    from .results.plotting import plot_records

    path = Path(path)
    fig = plot_records(recs, x="seq_q", y="tflops", by=("impl", "causal"), hline=peak,
                       hline_label="bf16 matmul peak")  # fmt: skip
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".").lower())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _compare(args) -> int:
    """Run ``args.grids`` here (their live size for this backend), save them, and plot each beside the recorded
    reference, both provenances in the titles."""
    import textwrap

    import matplotlib.pyplot as plt

    from .env import environment, timestamp
    from .measure.grids import points
    from .measure.sweep import run_sweep
    from .results import store
    from .results.plotting import plot_records
    from .results.record import GRID_VERSIONS, provenance

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"error: --out {out} is a file; name a folder", file=sys.stderr)
        return 2
    ref = store.recorded(args.reference)
    if ref is None:
        print(f"error: no recorded results for {args.reference} in {store.RESULTS_DIR}", file=sys.stderr)
        return 2
    env = environment()
    here = store.slug(env["gpu"]) if env["gpu"] else env["backend"]
    saved = out / f"{here}.json"
    prov = provenance(env, {}, "python -m attention_tutorial " + " ".join(args.argv))
    problems = check_outputs(str(saved), None, provenance=prov) if out.is_dir() else []
    problems = [
        p.replace("--save ", "--out holds ").replace(", or pass --force to replace it", " (another --out)")
        for p in problems
    ]  # compare has no --force: a file it did not write is never replaced
    if problems:
        print("error: " + "\n".join(problems), file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for name in args.grids:
        x, by = COMPARE_X.get(name, ("seq_q", ("impl",)))
        t0 = time.perf_counter()
        live = run_sweep(points(name, live=True), repeats=args.repeats, max_seconds=0.3)
        for rec in live:
            rec["grid"] = name
        prov["grids"] = {name: {"created": timestamp(), "seconds": round(time.perf_counter() - t0, 1),
                                "command": prov["command"], **{k: env[k] for k in GRID_VERSIONS}}}  # fmt: skip
        data = store.save(saved, prov, live)
        recorded = store.select(ref["records"], grid=name)
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), facecolor="white", layout="constrained")
        for ax, recs, where, p in ((axes[0], live, "this machine", data["provenance"]),
                                   (axes[1], recorded, "recorded", ref["provenance"])):  # fmt: skip
            if any(r["status"] == "ok" for r in recs):
                plot_records(recs, x=x, y="tflops", by=by, ax=ax)
            else:
                ax.text(0.5, 0.5, "no measured points", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(textwrap.fill(f"{name}, {where}: {store.describe(p, name)}", 70), fontsize=9)
        png = out / f"compare-{name}.png"
        fig.savefig(png, dpi=110)
        plt.close(fig)
        ok = sum(r["status"] == "ok" for r in live)
        print(f"{name}: {ok}/{len(live)} points ok here, {len(recorded)} recorded; plot: {png}")
    print(f"this machine: {store.describe(data['provenance'])}\nrecorded:     {store.describe(ref['provenance'])}")
    print(f"results: {saved}")
    return 0
