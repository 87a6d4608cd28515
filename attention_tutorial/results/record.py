"""The recorder: run every named grid on the GPU and write the reference result file the pages show.

``python -m attention_tutorial record`` (or ``nox -s record``) measures the ceilings, then each grid of
:mod:`attention_tutorial.measure.grids` in its GPU size, sized to this GPU's memory (points that cannot fit are
recorded as oom with the estimate, not run), and writes ``attention_tutorial/results/data/<gpu>.json`` after every grid, so an
interrupted run keeps what it measured. Records of grids not re-run are kept from the existing file.
:func:`tuning_writer` keeps the tables of ``tools/tune.py`` in the same file, stamped the same way.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from ..env import environment, timestamp
from ..measure.ceilings import measure_ceilings
from ..measure.grids import GRID_NAMES, device_memory, plan
from ..measure.sweep import run_sweep
from . import store


def provenance(env: dict, ceilings: dict, command: str) -> dict:
    """The result file's provenance block from an environment report and the measured ceilings (null where they
    were not measured); on a CPU, gpu, driver and cudnn are null and ``cpu`` names the processor."""
    return {
        "backend": env.get("backend", "gpu"),
        "cpu": env.get("cpu"),
        "gpu": env["gpu"],
        "driver": env["driver"],
        "jax": env["jax"],
        "jaxlib": env["jaxlib"],
        "cudnn": env["cudnn"],
        "transformer_engine": env["transformer_engine"],
        "python": env["python"],
        "created": env["created"],
        "command": command,
        "matmul_bf16_tflops": ceilings.get("matmul_bf16_tflops"),
        "copy_gbps": ceilings.get("copy_gbps"),
        **ceilings,
        "environment": env,
    }


def record(
    grid_names=GRID_NAMES,
    *,
    out=None,
    repeats: int = 20,
    max_seconds: float = 1.0,
    progress=True,
    extras=("fp8", "kernel_code"),
    command: str | None = None,
    race_groups=None,
) -> Path:
    """Measure ``grid_names`` (and the ``extras`` experiments, see :data:`EXTRAS`) on this GPU and write the
    result file. ``race_groups``: which races the extra ``race`` runs (all of
    :data:`~attention_tutorial.measure.race.GROUPS` by default)."""
    for extra in extras:
        if extra not in EXTRAS:
            raise ValueError(f"unknown extra experiment {extra!r}; choose from {', '.join(EXTRAS)}")
    if not grid_names and not extras:
        raise ValueError(
            "nothing to record: no grids and no extras were named. Name grids (--grids seq_long ...; all by default) "
            "or extras (--extras fp8 kernel_code)."
        )
    if jax.default_backend() != "gpu":
        raise RuntimeError(
            "record measures the reference results on a GPU; this machine runs JAX on "
            f"{jax.default_backend().upper()}. Use `bench` for live numbers here."
        )
    env = environment()
    out = _out(out, env)
    command = command or "python -m attention_tutorial record " + " ".join(sys.argv[2:])
    if out.exists():  # before measuring anything: a file that is not a result file is not merged into
        try:
            store.load(out)
        except store.ResultFileError as err:
            raise store.ResultFileError(f"refusing to record into {out}: {err}") from None
    ceilings = measure_ceilings()
    prov = provenance(env, ceilings, command)
    print(
        f"ceilings: {ceilings['matmul_bf16_tflops']:.0f} TFLOP/s bf16 matmul, "
        f"{ceilings['copy_gbps']:.0f} GB/s copy, {ceilings['read_gbps']:.0f} GB/s read",
        flush=True,
    )
    peak, memory = ceilings["matmul_bf16_tflops"], device_memory()
    steps = [
        (
            name,
            lambda name=name: _sized_sweep(
                name, memory, peak_tflops=peak, progress=progress, repeats=repeats, max_seconds=max_seconds
            ),
        )
        for name in grid_names
    ]
    steps += [
        (name, functools.partial(EXTRAS[name], peak, repeats=repeats, max_seconds=max_seconds))  # type: ignore[arg-type, misc]
        for name in extras
        if EXTRAS[name] is not None
    ]
    for name, measure in steps:
        t0 = time.perf_counter()
        recs = measure()
        seconds = round(time.perf_counter() - t0, 1)
        _tag(recs, name, ceilings)
        prov["grids"] = {name: {**_grid_provenance(env, seconds, command, peak), **GRID_DETAILS.get(name, dict)()}}
        store.save(out, prov, recs, replace_grids=True)  # each grid is measured whole: its old records go
        ok = sum(r["status"] == "ok" for r in recs)
        print(f"{name}: {ok}/{len(recs)} ok in {seconds:.0f} s", flush=True)
    if "kernel_code" in extras:  # instruction counts of the Pallas kernels, kept in the provenance
        t0 = time.perf_counter()
        prov["kernel_code"] = _kernel_code_records()
        prov["grids"] = {"kernel_code": _grid_provenance(env, round(time.perf_counter() - t0, 1), command, peak)}
        store.save(out, prov, [])
        statuses = ", ".join(f"{name}: {rec['status']}" for name, rec in prov["kernel_code"].items())
        print(f"kernel_code: {statuses}", flush=True)
    if "spills" in extras:  # ptxas's spills of each configuration of our kernels, kept in the provenance
        from ..measure.kernel_code import spill_records

        t0 = time.perf_counter()
        prov["spills"] = spill_records()
        prov["grids"] = {"spills": _grid_provenance(env, round(time.perf_counter() - t0, 1), command, peak)}
        store.save(out, prov, [])
        for name, rec in prov["spills"].items():
            worst = max((f["stores"] + f["loads"] for f in rec.get("spills", {}).values()), default=None)
            print(
                f"spills: {name}: {rec['status']}, registers {rec.get('registers')}, most spilled {worst} B", flush=True
            )
    for key in ("timeline", "timeline_backward"):  # the warpgroups from the in-kernel profiler, in the provenance
        if key in extras:
            from ..measure import timeline

            t0 = time.perf_counter()
            prov[key] = (timeline.timeline_records if key == "timeline" else timeline.backward_timeline_records)()
            prov["grids"] = {key: _grid_provenance(env, round(time.perf_counter() - t0, 1), command, peak)}
            store.save(out, prov, [])
            statuses = ", ".join(f"{name}: {rec['status']}" for name, rec in prov[key].items())
            print(f"{key}: {statuses}", flush=True)
    if "lessons" in extras:  # TF32 vs float32, what cuDNN refuses, GQA = MHA: kept in the provenance
        from ..measure.lessons import lesson_records

        t0 = time.perf_counter()
        prov["lessons"] = lesson_records(repeats=repeats, max_seconds=max_seconds)
        prov["grids"] = {"lessons": _grid_provenance(env, round(time.perf_counter() - t0, 1), command, peak)}
        store.save(out, prov, [])
        print(f"lessons: {', '.join(f'{k}: {len(v)} rows' for k, v in prov['lessons'].items())}", flush=True)
    if "timing_lesson" in extras:  # the timing page's five-way timing, kept in the provenance as lessons["timing"]
        from ..measure.timing_lesson import timing_lesson_record

        t0 = time.perf_counter()
        lesson = timing_lesson_record()
        prov["lessons"] = {**prov.get("lessons", {}), "timing": lesson}
        prov["grids"] = {"timing_lesson": _grid_provenance(env, round(time.perf_counter() - t0, 1), command, peak)}
        store.save(out, prov, [])
        print(
            f"timing_lesson: clock without a wait {lesson['no_wait_ms']:.3f} ms, waited calls "
            f"{min(lesson['waited_ms']):.3f}–{max(lesson['waited_ms']):.3f} ms",
            flush=True,
        )
    if "race" in extras:  # our kernels against cuDNN, interleaved: kept in the provenance by case, saved after each
        from ..measure import race

        t0 = time.perf_counter()
        for case in race.cases(race_groups or race.GROUPS):
            rec = race.run_case(case, max_seconds=max_seconds)
            prov["race"] = {f"{case.group}: {case.name}": rec}
            prov["grids"] = {"race": _grid_provenance(env, round(time.perf_counter() - t0, 1), command, peak)}
            store.save(out, prov, [])
            print(race.format_case(rec), flush=True)
    return out


def _out(out, env: dict) -> Path:
    """``out``, or this GPU's shipped result file; refused where that is the shipped file and the tree has
    uncommitted changes (what the site shows must tie to a commit)."""
    out = Path(out or store.RESULTS_DIR / f"{store.slug(env['gpu'])}.json")
    if out.resolve().parent == store.RESULTS_DIR.resolve() and env.get("dirty"):
        raise RuntimeError(
            f"refusing to record into the shipped result file {out} from a tree with uncommitted changes (commit "
            f"{str(env.get('commit'))[:12]}): commit first, or name another file to record into."
        )
    return out


def tuning_writer(kernel: str, out=None, *, command: str | None = None) -> tuple[Path, Callable[[list], dict]]:
    """Where ``tools/tune.py`` keeps a tuning table as it measures: (the result file, ``save``). ``save(rows)``
    writes the rows so far as ``provenance["tuning"][kernel]`` of ``out`` (default: this GPU's shipped file, refused
    from a tree with uncommitted changes), stamped as every record is: the GPU, driver and versions, the commit and
    dirty flag, when the run started and its command, and the SM clock (nvidia-smi) at the start and at this save.
    Each save is atomic (:func:`~attention_tutorial.results.store.save_entry`): a run cut short keeps every row it
    saved, and the rest of the file stays as it was; a later run of ``kernel`` replaces its table whole."""
    from ..measure.race import clocks

    env = environment()
    if env.get("backend", "gpu") != "gpu" or not env.get("gpu"):
        raise RuntimeError("tools/tune.py times kernels on a GPU; this machine has none (jax.devices() lists no GPU).")
    out = _out(out, env)
    if out.exists():  # before measuring anything: a file that is not a result file is not written into
        store.load(out)
    command = command or "python tools/tune.py " + " ".join(sys.argv[1:])
    stamp = {
        **{key: env[key] for key in GRID_VERSIONS},
        "commit": env.get("commit"),
        "dirty": env.get("dirty"),
        "created": env["created"],
        "command": command,
        "clocks_before": clocks(),
    }
    base = provenance(env, {}, command)

    def save(rows: list) -> dict:
        entry = {**stamp, "clocks_after": clocks(), "rows": list(rows)}
        return store.save_entry(out, "tuning", kernel, entry, base)

    return out, save


# The versions each grid was measured with: a later partial run (say, without TransformerEngine installed) replaces
# the top-level provenance, but each grid keeps the environment it was recorded in.
GRID_VERSIONS = ("gpu", "driver", "jax", "jaxlib", "cudnn", "transformer_engine", "python")


def _grid_provenance(env, seconds, command, peak) -> dict:
    return {
        "created": timestamp(),
        "seconds": seconds,
        "command": command,
        "matmul_bf16_tflops": peak,
        **{key: env[key] for key in GRID_VERSIONS},
        "commit": env.get("commit"),
        "dirty": env.get("dirty"),
    }


def _sized_sweep(name, memory, **options) -> list[dict]:
    """Grid ``name`` in its GPU size: the points that fit ``memory`` measured, the others recorded as oom."""
    run, skipped = plan(name, gpu=True, memory=memory)
    return run_sweep(run, **options) + skipped


def _fp8_records(peak, **timing):
    from ..measure.fp8 import fp8_records  # imports TE lazily, only when the FP8 experiments run

    return fp8_records(peak_tflops=peak, **timing)


def _device_time_records(peak, **timing):
    from ..measure.profile import profile_records  # one call per implementation, traced with jax.profiler

    return profile_records(peak_tflops=peak, **timing)


def _context_parallel_records(peak, **timing):
    from ..inputs import AttentionShape
    from ..measure.context_parallel import best_local, cp_records  # the ring on one GPU: overhead, emulated steps

    # the local step: our Mosaic kernel where it runs, else blockwise; a one-device lease: 2 and 4 emulated ring
    # steps (8 steps at T = 16k compiled for minutes on the H200)
    local = best_local(AttentionShape(1, 4096, 4096, 16, 4, 128), "bfloat16")
    return cp_records(seq=(4096, 8192), devices=(2, 4), local=local, peak_tflops=peak, **timing)


def _cp_scaling_records(peak, **timing):
    from ..measure.cp_scaling import scaling_records  # every GPU of this host: strong/weak scaling, ours and TE's

    # one lease (10 min a command): few samples per point, and points past the budget recorded as not measured;
    # the environment may narrow it (tools/cp_multi_gpu.sh): T of strong scaling, the budget, TE off (0)
    env = os.environ.get
    seqs = tuple(int(t) for t in env("ATTENTION_TUTORIAL_CP_SEQS", "65536,131072").split(","))
    timing = {**timing, "repeats": min(timing.get("repeats", 5), 5), "warmup": 1, "min_inner": 1}
    return scaling_records(
        seqs=seqs,
        te=env("ATTENTION_TUTORIAL_CP_TE", "1") != "0",
        peak_tflops=peak,
        budget_s=float(env("ATTENTION_TUTORIAL_CP_BUDGET_S", 400)),
        profiled_calls=2,
        **timing,
    )


def _cp_scaling_provenance():
    from ..measure.cp_scaling import provenance  # the GPU count and how they are connected (nvidia-smi)

    return provenance()


def _ablation_records(peak, **timing):
    from ..measure.ablations import ablation_records  # our kernels as they are and without exponentials, beside cuDNN

    return ablation_records(peak_tflops=peak, progress=True)  # its own timing budget (about 3 minutes on an H200)


def _train_profile_records(peak, **timing):
    from ..train.profile import profile_records  # one training step's kernels: cuDNN and ours, scatter vs one-hot

    return profile_records(("cudnn", "mosaic"), ("gather", "onehot"))


def _train_records(peak, **timing):
    from ..train.grid import train_grid  # each implementation trains in its own process (its own peak memory)

    # ten steps queued before each wait, as a loop that does not read every loss at once (train_dispatch: what
    # waiting after every step costs)
    return train_grid(("cudnn", "xla", "mosaic"), steps=200, peak_tflops=peak, wait_every=10)


def _train_packed_records(peak, **timing):
    from ..train.model import H200
    from ..train.packed import packed_records  # packed documents: ours with segment ids, XLA and cuDNN with a mask

    return packed_records(("xla", "cudnn", "mosaic"), steps=60, config=H200, wait_every=10, peak_tflops=peak)


def _train_dispatch_records(peak, **timing):
    from ..train.dispatch import dispatch_grid  # one child process per command-buffer setting (XLA reads flags once)

    return dispatch_grid(("cudnn", "mosaic"), peak_tflops=peak)


# Experiments beside the grids, by name: each returns records (None: kept in the provenance instead — kernel_code:
# instruction counts; spills: ptxas's spills per configuration of our kernels; lessons: see measure.lessons;
# timeline, timeline_backward: see measure.timeline; timing_lesson: see measure.timing_lesson, kept as
# lessons["timing"]).
EXTRAS: dict[str, Callable[..., Any] | None] = {
    "fp8": _fp8_records,
    "device_time": _device_time_records,
    "context_parallel": _context_parallel_records,
    "cp_scaling": _cp_scaling_records,
    "train": _train_records,
    "ablations": _ablation_records,
    "kernel_code": None,
    "spills": None,
    "lessons": None,
    "timeline": None,
    "timeline_backward": None,
    "timing_lesson": None,
    "race": None,
    "train_profile": _train_profile_records,
    "train_dispatch": _train_dispatch_records,
    "train_packed": _train_packed_records,
}

# What an extra adds to its grid's provenance, by name (called after the extra ran).
GRID_DETAILS = {"cp_scaling": _cp_scaling_provenance}


def _kernel_code_records():
    from ..measure.kernel_code import kernel_code_records  # compiles each kernel in a fresh process with dumps on

    return kernel_code_records()


def _tag(recs, grid_name, ceilings):
    for r in recs:
        r["grid"] = grid_name
        if r.get("gbps") is not None:
            r["pct_read"] = 100 * r["gbps"] / ceilings["read_gbps"]
