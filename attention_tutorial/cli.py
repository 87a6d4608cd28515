"""Command line: ``python -m attention_tutorial {bench,record,compare,env}``.

Examples::

    python -m attention_tutorial env
    python -m attention_tutorial bench --impl xla cudnn --seq 1024 4096 --heads 16 --head-dim 128 --causal
    python -m attention_tutorial bench --grid seq_long --save seq.json --plot seq.png
    python -m attention_tutorial record            # on a GPU: writes attention_tutorial/results/data/<gpu>.json

``bench --save`` checks both paths before measuring, then saves after every point (an interrupted sweep keeps
what it measured). An existing result file of the same device and versions is merged into (a point measured again
replaces its old record); any other file is left alone unless ``--force``. Ctrl-C at any moment stops the run with
exit status 130: the points measured so far are printed (and saved with ``--save``, plotted with ``--plot``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

# The core grids ``compare`` runs, with the axis each is plotted against and the fields that make its lines.
COMPARE_X = {
    "seq_long": ("seq_q", ("impl", "causal")),
    "batch": ("batch", ("impl",)),
    "decode": ("seq_kv", ("impl", "kv_heads")),
}


# --- Ctrl-C ------------------------------------------------------------------------------------------------------
# Raising KeyboardInterrupt at an arbitrary moment breaks things half done: inside the import of a compiled
# extension (JAX's) it crashes at exit or fails the import, inside a garbage-collection callback it is swallowed,
# inside a save it would lose the point. So the command line holds Ctrl-C (notes it, raises nothing) from its start
# (this module imports the standard library alone: JAX loads later, held) except while it measures, and checks for
# a noted one between points. Importing the package changes no signal handler: only main() does, for its run.


class _Interrupts:
    pending = False  # Ctrl-C arrived and has not been acted on
    holding = 0  # > 0: note Ctrl-C, raise nothing
    previous: Any = None  # the handler ours replaced (None: ours is not installed)


def _on_sigint(signum, frame):
    _Interrupts.pending = True
    if not _Interrupts.holding:
        raise KeyboardInterrupt


def _install() -> bool:
    """Put our SIGINT handler in place of Python's default one (only there: a notebook's or a host program's
    handler is left alone); True if it was installed by this call."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    _Interrupts.previous = signal.signal(signal.SIGINT, _on_sigint)
    return True


def _uninstall() -> None:
    if _Interrupts.previous is not None and signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGINT, _Interrupts.previous)
    _Interrupts.previous = None


@contextlib.contextmanager
def held_interrupts():
    """Inside: Ctrl-C is noted, not raised (see :func:`check_interrupt`)."""
    _Interrupts.holding += 1
    try:
        yield
    finally:
        _Interrupts.holding -= 1


@contextlib.contextmanager
def _interruptible():
    """Inside (while measuring): Ctrl-C raises KeyboardInterrupt at once, as Python's default handler would."""
    saved, _Interrupts.holding = _Interrupts.holding, 0
    try:
        check_interrupt()
        yield
    finally:
        _Interrupts.holding = saved


def check_interrupt() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was noted (while held, or swallowed where it was raised)."""
    if _Interrupts.pending:
        raise KeyboardInterrupt


def _drop_swallowed_interrupts(unraisable, hook):
    """sys.unraisablehook that stays silent about a KeyboardInterrupt raised where Python cannot propagate it (JAX's
    garbage-collection callback): it is noted already, and acted on at the next check."""
    if not issubclass(unraisable.exc_type, KeyboardInterrupt):
        hook(unraisable)


# --- commands ----------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    from .kernels.masks import MASK_KINDS
    from .measure.flops import PASSES
    from .measure.grids import GRID_NAMES
    from .measure.race import GROUPS as RACE_GROUPS
    from .registry import IMPLEMENTATIONS
    from .results.record import EXTRAS

    p = argparse.ArgumentParser(prog="python -m attention_tutorial", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="time implementations over shapes and print a table")
    b.add_argument("--grid", choices=GRID_NAMES, help="run a named grid (its size for this backend) instead")
    b.add_argument("--impl", nargs="+", default=["xla", "cudnn"], choices=sorted(IMPLEMENTATIONS))
    b.add_argument("--batch", "-B", type=int, nargs="+", default=[4], help="batch sizes B")
    b.add_argument("--seq", "-T", type=int, nargs="+", default=[1024], help="query lengths T")
    b.add_argument("--seq-kv", "-S", type=int, default=None, help="key length S (default: T)")
    b.add_argument("--heads", "-N", type=int, nargs="+", default=[8], help="query heads N")
    b.add_argument("--kv-heads", "-K", type=int, default=None, help="kv heads K (default: N)")
    b.add_argument("--head-dim", "-H", type=int, nargs="+", default=[64], help="head dimensions H")
    b.add_argument("--dtype", nargs="+", default=["bfloat16"], choices=["bfloat16", "float16", "float32"])
    b.add_argument("--causal", action="store_true", help="causal mask (top-left aligned)")
    b.add_argument("--both-masks", action="store_true", help="run causal and full")
    b.add_argument("--mask", nargs="+", default=["none"], choices=MASK_KINDS)
    b.add_argument("--pass", dest="passes", nargs="+", default=["fwd"], choices=PASSES)
    b.add_argument("--repeats", type=int, default=30, help="timed calls per point (at least 1)")
    b.add_argument(
        "--ceilings",
        action="store_true",
        help="measure a bf16 matmul first and report %% of its rate (a reference on this card, not a roof)",
    )
    b.add_argument(
        "--save",
        metavar="JSON",
        help="save the records and the environment to this .json file after "
        "every point (merged into an existing result file of this device and versions)",
    )
    b.add_argument("--plot", metavar="PNG", help="plot TFLOP/s against T here (png, pdf, svg, ...)")
    b.add_argument(
        "--force",
        action="store_true",
        help="replace a --save file that is not a result file of this device and versions (its old contents are lost)",
    )
    b.add_argument("--progress", action="store_true", help="show a progress bar")

    r = sub.add_parser(
        "record", help="on a GPU: run the pages' grids and write attention_tutorial/results/data/<gpu>.json"
    )
    r.add_argument("--grids", nargs="*", default=list(GRID_NAMES), choices=GRID_NAMES)
    r.add_argument("--extras", nargs="*", default=["fp8", "kernel_code"], choices=list(EXTRAS))
    r.add_argument(
        "--race",
        nargs="+",
        default=list(RACE_GROUPS),
        choices=RACE_GROUPS,
        metavar="GROUP",
        help=f"with --extras race: which races to run ({', '.join(RACE_GROUPS)}; all by default)",
    )
    r.add_argument("--out", help="result file (default: attention_tutorial/results/data/<gpu>.json)")
    r.add_argument("--repeats", type=int, default=20, help="timed calls per point (at least 1)")
    r.add_argument("--max-seconds", type=float, default=1.0, help="cap on timed seconds per point (above 0)")

    c = sub.add_parser("compare", help="run the core grids here and plot them beside the recorded reference GPU")
    c.add_argument("--grids", nargs="+", default=list(COMPARE_X), choices=GRID_NAMES)
    c.add_argument("--out", default="compare", help="folder for the plots and this machine's result file")
    c.add_argument("--reference", default="nvidia-h200", help="the recorded result file to compare with")
    c.add_argument("--repeats", type=int, default=10, help="timed calls per point (at least 1)")

    sub.add_parser("env", help="print the environment report (devices, versions) as JSON")
    return p


def main(argv=None) -> int:
    """Run one command; returns its exit status (0 ok, 1 nothing measured or a save failed, 2 bad arguments, 130
    interrupted). Run as the command line (``argv`` None), an interrupted run exits at once after flushing its
    output, leaving no device work or thread for the interpreter to finalise."""
    mine = _install()
    previous_hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_drop_swallowed_interrupts, hook=previous_hook)
    try:
        with held_interrupts():
            code = _main(argv)
            if _Interrupts.pending:  # Ctrl-C after the work was done, while printing or plotting
                code = 130
    finally:
        sys.unraisablehook = previous_hook
        _Interrupts.pending = False
        if mine:
            _uninstall()
    if code == 130 and argv is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    return code


def _main(argv) -> int:
    try:
        parser = _parser()  # its choices import JAX and most of the package (Ctrl-C held meanwhile)
        check_interrupt()  # one that arrived while they loaded
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print("interrupted before anything was measured", file=sys.stderr)
        return 130
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.command == "env":
        from .env import environment

        print(json.dumps(environment(), indent=2))
        return 0
    if args.command == "record":
        return _record(args)
    if args.command == "compare":
        return _compare(args)
    return _bench(args)


def _record(args) -> int:
    from .results.record import record

    problems = _count_problems(args, ("--repeats", args.repeats))
    if not (math.isfinite(args.max_seconds) and args.max_seconds > 0):
        problems.append(f"--max-seconds {args.max_seconds}: give a number of seconds above 0, e.g. 1")
    if problems:
        return _refuse(problems)
    try:
        with _interruptible():
            path = record(
                args.grids,
                out=args.out,
                repeats=args.repeats,
                max_seconds=args.max_seconds,
                extras=tuple(args.extras),
                race_groups=tuple(args.race),
            )
    except KeyboardInterrupt:
        print("interrupted: the result file keeps every grid written before", file=sys.stderr)
        return 130
    except (RuntimeError, ValueError) as err:  # no GPU; nothing to record; a broken --out file
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


def _refuse(problems) -> int:
    print("error: " + "\nerror: ".join(problems), file=sys.stderr)
    return 2


GRID_FIXES = (
    "impl",
    "batch",
    "seq",
    "seq_kv",
    "heads",
    "kv_heads",
    "head_dim",
    "dtype",
    "causal",
    "both_masks",
    "mask",
    "passes",
)  # what a named grid sets itself: bench options that cannot go with --grid


def _given(args, names) -> list[str]:
    """Which of the bench options ``names`` differ from their defaults (were given on the command line)."""
    defaults = _parser().parse_args(["bench"])
    return [n for n in names if getattr(args, n) != getattr(defaults, n)]


def _words(args, name: str) -> str:
    """The option ``name`` as given: its flag and value(s)."""
    flag, value = "--" + {"passes": "pass"}.get(name, name).replace("_", "-"), getattr(args, name)
    return (
        flag if isinstance(value, bool) else f"{flag} {' '.join(map(str, value)) if isinstance(value, list) else value}"
    )


def _count_problems(args, *flags) -> list[str]:
    return [f"{flag} {n}: give a whole number of at least 1" for flag, n in flags if n < 1]


def check_outputs(save, plot, *, force=False, provenance=None) -> list[str]:
    """What is wrong with the --save and --plot paths, checked before anything is measured."""
    from .results import store

    problems = []
    if save is not None and plot and _same_file(save, plot):
        return [f"--save and --plot name the same file {save}"]
    if save is not None:
        problems += [f"--save {save!r}: {p}" for p in store.check_target(save)]
    for flag, path in (("--save", save), ("--plot", plot)):
        if not path or not str(path).strip() or (problems and flag == "--save"):
            continue
        path = Path(path)
        folder = Path(os.path.realpath(path)).parent  # through a symlink: its target's folder
        if path.is_dir():
            problems.append(f"{flag} {path} is a folder; name a file")
        elif path.exists() and not path.is_file():
            problems.append(f"{flag} {path} is not a regular file (a device or a pipe); name a file")
        elif not folder.is_dir():
            problems.append(f"{flag} {path}: the folder {folder} does not exist; create it first")
        elif not os.access(folder, os.W_OK):
            problems.append(f"{flag} {path}: the folder {folder} is not writable")
    if plot is not None and not str(plot).strip():
        problems.append("--plot '': name an image file, e.g. --plot sweep.png")
    elif plot and not Path(plot).is_dir():
        formats = _plot_formats()
        if Path(plot).suffix.lstrip(".").lower() not in formats:
            problems.append(f"--plot {plot}: name an image file ending in one of {', '.join(sorted(formats))}")
    if save and not problems and Path(save).is_file() and not force:
        try:
            store.load(save)
        except store.ResultFileError as err:
            problems.append(
                f"--save {save} exists and is not a result file ({err}); refusing to overwrite it: "
                "choose another path, or pass --force to replace it"
            )
        else:
            why = store.check_merge(save, provenance) if provenance else None
            if why:
                problems.append(
                    f"--save {save}: {why.split('; ')[0]}; choose another path, or pass --force to replace it"
                )
    return problems


def _same_file(a, b) -> bool:
    return bool(str(a).strip()) and Path(a).resolve() == Path(b).resolve()


def _plot_formats() -> set[str]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return set(FigureCanvasAgg(Figure()).get_supported_filetypes())


BENCH_COLUMNS = [
    "impl",
    "batch",
    "seq_q",
    "seq_kv",
    "heads",
    "kv_heads",
    "head_dim",
    "dtype",
    "causal",
    "mask",
    "pass",
    "median_ms",
    "p10_ms",
    "p90_ms",
    "tflops",
]


class _SaveFailed(Exception):
    """A save after a point failed (disk full, the file made read-only, ...): the sweep stops, the table is shown."""


def _bench(args) -> int:
    recs, pts, saved, interrupted, failed, peak, device = [], None, 0, False, None, None, None
    try:
        from .env import environment, timestamp
        from .measure.ceilings import measure_ceilings
        from .measure.grids import points
        from .measure.sweep import grid, run_sweep
        from .results import store
        from .results.record import GRID_VERSIONS, provenance

        env = environment()
        device = _device_words(env)
        command = "python -m attention_tutorial " + " ".join(args.argv)
        prov = provenance(env, {}, command)

        def grid_entry(seconds, peak):
            return {
                args.grid: {
                    "created": timestamp(),
                    "seconds": seconds,
                    "command": command,
                    "matmul_bf16_tflops": peak,
                    **{k: env[k] for k in GRID_VERSIONS},
                }
            }

        if args.grid:
            prov["grids"] = grid_entry(0.0, None)
        problems = check_outputs(args.save, args.plot, force=args.force, provenance=prov)
        sizes = {
            "--batch": args.batch,
            "--seq": args.seq,
            "--seq-kv": [args.seq_kv] if args.seq_kv is not None else [],
            "--heads": args.heads,
            "--kv-heads": [args.kv_heads] if args.kv_heads is not None else [],
            "--head-dim": args.head_dim,
        }
        problems += [f"{flag} {n}: sizes must be positive integers" for flag, vs in sizes.items() for n in vs if n < 1]
        problems += _count_problems(args, ("--repeats", args.repeats))
        if args.kv_heads and args.kv_heads > 0 and not args.grid:
            problems += [
                f"--kv-heads {args.kv_heads}: --heads {n} is not a multiple of it; give K dividing every N"
                for n in args.heads
                if n > 0 and n % args.kv_heads
            ]
        if args.grid:
            problems += [
                f"{_words(args, name)}: --grid {args.grid} fixes its own points; drop one of the two"
                for name in _given(args, GRID_FIXES)
            ]
        if problems:
            return _refuse(problems)
        if args.grid:
            pts = points(args.grid)
        else:
            pts = grid(
                args.impl,
                seq_q=args.seq,
                batch=args.batch,
                heads=args.heads,
                head_dim=args.head_dim,
                kv_heads=(args.kv_heads,),
                seq_kv=(args.seq_kv,),
                dtype=args.dtype,
                causal=(False, True) if args.both_masks else (args.causal,),
                passes=args.passes,
                masks=args.mask,
            )
        started, replace = time.perf_counter(), args.force

        def keep(rec):  # save after every point: an interrupted sweep keeps what it measured
            nonlocal replace, saved
            if _Interrupts.pending and rec["status"] != "ok":
                raise KeyboardInterrupt  # a failure the interrupt itself may have caused: not a result
            if args.grid:
                rec["grid"] = args.grid
            recs.append(rec)
            if args.save:
                if args.grid:
                    prov["grids"] = grid_entry(round(time.perf_counter() - started, 1), peak)
                with held_interrupts():
                    try:
                        store.save(args.save, prov, [rec], overwrite=replace)
                    except (OSError, ValueError) as err:
                        raise _SaveFailed(str(err).splitlines()[0]) from None
                saved += 1
                replace = False  # --force replaces the old file once, then this run's points merge
            check_interrupt()

        with _interruptible():
            ceilings = measure_ceilings() if args.ceilings else {}
            peak = ceilings.get("matmul_bf16_tflops")
            prov.update(provenance(env, ceilings, command))
            run_sweep(pts, peak_tflops=peak, progress=args.progress, repeats=args.repeats, on_record=keep)
    except KeyboardInterrupt:
        interrupted = True
    except _SaveFailed as err:
        failed = str(err)
    _bench_report(args, recs, pts, peak, saved=saved, interrupted=interrupted, device=device)
    if failed:
        print(
            f"error: --save {args.save}: {failed}; {saved} of the {len(recs)} points above were saved", file=sys.stderr
        )
        return 1
    if interrupted:
        return 130
    return 0 if any(r["status"] == "ok" for r in recs) else 1


def _bench_report(args, recs, pts, peak, *, saved, interrupted, device) -> None:
    """The table of what was measured (partial or whole), where it was saved, and its plot."""
    if recs:
        from .results.plotting import markdown_table

        print(markdown_table(recs, BENCH_COLUMNS + (["pct_peak"] if peak else []) + ["kernel", "reason"]))
    if interrupted:
        total = f" of {len(pts)}" if pts is not None else ""
        print(f"\ninterrupted: {len(recs)}{total} points measured", file=sys.stderr)
    if peak:
        print(f"\npeak: {peak:.1f} TFLOP/s (bf16 matmul, measured now)")
    if args.save and saved:
        print(f"saved {saved} records to {args.save}")
    if args.plot and any(r["status"] == "ok" for r in recs):
        partial = (len(recs), len(pts)) if pts is not None and len(recs) < len(pts) else None
        _plot(recs, args.plot, peak, device=device, partial=partial)
        print(f"plot: {args.plot}")


def _device_words(env: dict) -> str:
    return env.get("gpu") or f"{str(env.get('backend', 'cpu')).upper()} ({env.get('cpu')})"


def bench_figure(recs, *, peak=None, device=None, partial=None):
    """The figure of ``bench --plot``: TFLOP/s against T, one line per implementation and mask (and per any other
    field that varies); the title names the device, the shape (B, S, N, K, H), dtype and pass, and, for an
    interrupted run (``partial`` = (measured, planned)), that it is partial."""
    from .results.plotting import plot_records, series_fields, shape_words

    ok = [r for r in recs if r.get("status") == "ok"]
    by = series_fields(ok, x="seq_q", by=("impl", "causal"))
    head = f"PARTIAL (interrupted): {partial[0]} of {partial[1]} points. " if partial else ""
    title = _fill(f"{head}TFLOP/s on {device or 'this machine'}; {shape_words(ok, x='seq_q', by=by)}", 80)
    fig = plot_records(
        recs, x="seq_q", y="tflops", by=by, hline=peak, hline_label="bf16 matmul, measured (a reference)"
    )
    fig.suptitle(title, fontsize=9)
    return fig


def _fill(text: str, width: int) -> str:
    """``text`` wrapped to ``width``, never between a name and its value ('N = 8' stays on one line)."""
    import textwrap

    return textwrap.fill(text.replace(" = ", "\u00a0=\u00a0"), width)


def _plot(recs, path, peak, *, device=None, partial=None):
    """Plot TFLOP/s against T into ``path``, written atomically (a temporary file, then ``os.replace``)."""
    path = Path(path)
    fig = bench_figure(recs, peak=peak, device=device, partial=partial)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".").lower())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def compare_figure(name, live, live_prov, recorded, ref_prov, *, x="seq_q", by=("impl",)):
    """Two panels, this machine's records of grid ``name`` beside the recorded reference's, on one x axis; each
    title names its device, versions and shape, and the figure's title names every way the two differ (device,
    dtype, T range, ...) — or says they are like for like."""
    import matplotlib.pyplot as plt

    from .results import store
    from .results.plotting import differences, plot_records, shape_words

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), facecolor="white", layout="constrained", sharex=True)
    for ax, recs, where, prov in (
        (axes[0], live, "this machine", live_prov),
        (axes[1], recorded, "recorded", ref_prov),
    ):
        ok = [r for r in recs if r.get("status") == "ok"]
        if ok:
            plot_records(recs, x=x, y="tflops", by=by, ax=ax)
        else:
            ax.text(0.5, 0.5, "no measured points", ha="center", va="center", transform=ax.transAxes)
        words = f"{name}, {where}: {store.describe(prov, name)}; {shape_words(ok, x=x, by=by)}"
        ax.set_title(_fill(words, 75), fontsize=8)
    diffs = differences(
        live, recorded, fields=("dtype", x, "batch", "seq_kv", "heads", "kv_heads", "head_dim", "mask", "pass")
    )
    here, there = store.describe(live_prov).split(", JAX")[0], store.describe(ref_prov).split(", JAX")[0]
    if here != there:
        diffs.insert(0, f"device {here} vs {there}")
    verdict = (
        ("Not like for like (left vs right): " + "; ".join(diffs) + "; y scales differ")
        if diffs
        else ("Like for like: the same points on both sides")
    )
    fig.suptitle(_fill(verdict, 130), fontsize=10)
    return fig


def _compare(args) -> int:
    """Run ``args.grids`` here (their live size for this backend), save them, and plot each beside the recorded
    reference, both provenances and every difference in the titles."""
    import matplotlib.pyplot as plt

    from .env import environment, timestamp
    from .measure.grids import points
    from .measure.sweep import run_sweep
    from .results import store
    from .results.record import GRID_VERSIONS, provenance

    out = Path(args.out)
    problems = _count_problems(args, ("--repeats", args.repeats))
    if out.exists() and not out.is_dir():
        problems.append(f"--out {out} is a file; name a folder")
    elif not problems:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            problems.append(f"--out {out}: cannot create the folder ({err.strerror}); choose a folder you can write")
    if problems:
        return _refuse(problems)
    ref = store.recorded(args.reference)
    if ref is None:
        print(
            f"error: --reference {args.reference}: no recorded results of that name in {store.RESULTS_DIR}; "
            f"choose one of {[p.stem for p in store.result_files()]}",
            file=sys.stderr,
        )
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
        return _refuse(problems)
    out.mkdir(parents=True, exist_ok=True)
    done = []
    try:
        for name in args.grids:
            x, by = COMPARE_X.get(name, ("seq_q", ("impl",)))
            t0 = time.perf_counter()
            with _interruptible():
                live = run_sweep(points(name, live=True), repeats=args.repeats, max_seconds=0.3)
            for rec in live:
                rec["grid"] = name
            prov["grids"] = {
                name: {
                    "created": timestamp(),
                    "seconds": round(time.perf_counter() - t0, 1),
                    "command": prov["command"],
                    **{k: env[k] for k in GRID_VERSIONS},
                }
            }
            data = store.save(saved, prov, live, replace_grids=True)  # each grid is run whole
            recorded = store.select(ref["records"], grid=name)
            fig = compare_figure(name, live, data["provenance"], recorded, ref["provenance"], x=x, by=by)
            png = out / f"compare-{name}.png"
            fig.savefig(png, dpi=110)
            plt.close(fig)
            done.append(name)
            ok = sum(r["status"] == "ok" for r in live)
            print(f"{name}: {ok}/{len(live)} points ok here, {len(recorded)} recorded; plot: {png}")
            check_interrupt()
    except KeyboardInterrupt:
        print(f"interrupted: {len(done)} of {len(args.grids)} grids compared and saved to {saved}", file=sys.stderr)
        return 130
    except OSError as err:
        print(f"error: --out {out}: {str(err).splitlines()[0]}; the grids above were saved", file=sys.stderr)
        return 1
    print(f"this machine: {store.describe(data['provenance'])}\nrecorded:     {store.describe(ref['provenance'])}")
    print(f"results: {saved}")
    return 0
