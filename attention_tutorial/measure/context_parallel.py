"""What context parallelism costs on one device: the ring's overhead and the price of splitting the work.

Two experiments, both on a single device (``experiment``: "context_parallel"):

* the ring code on a one-device mesh (``cp_ring_1dev``: ``shard_map``, one step, the merge) against the plain local
  kernel it calls (``cp_local``) — the overhead of the machinery;
* P ring steps emulated on one device (``cp_emulated_P<P>``: every device's local compute and LSE merges, one
  after another, no transfer) against that one call — what splitting the sequence into P·C chunks costs in compute.

Records follow :mod:`attention_tutorial.measure.sweep`'s schema and say what ran: ``gpus`` (the devices it ran on:
1 here), ``ring_steps`` (P for an emulated ring, 1 for the one-device ring, None for the local step alone) and
``devices`` (= ``gpus``). Records written before these fields put the emulated P in ``devices``;
:func:`what_ran` reads both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import numpy as np

from ..inputs import check_flag, check_int, make_qkv
from ..kernels import context_parallel as cp
from .compiled import compile_stats
from .flops import attention_flops
from .sweep import Point, empty_record, failure_fields, timed_record
from .timing import time_fn

EXPERIMENT = "context_parallel"


def cp_records(
    *,
    seq=(4096, 16384),
    batch: int = 1,
    heads: int = 16,
    kv_heads: int = 4,
    head_dim: int = 128,
    dtype: str = "bfloat16",
    causal=(False, True),
    devices=(2, 4, 8),
    layout: str = "zigzag",
    passes=("fwd",),
    block: int = 512,
    local: str = "blockwise",
    peak_tflops: float | None = None,
    one_device_ring: bool = True,
    **timing,
) -> list[dict]:
    """Records for the local kernel, the ring on a one-device mesh (unless ``one_device_ring`` is False), and
    ``devices`` emulated ring steps.

    ``local`` names the local step (:func:`~attention_tutorial.kernels.context_parallel.local_steps`: "blockwise"
    with tiles of ``block``, or "mosaic", our Hopper kernel); each record says which in its ``local`` field.
    ``timing`` goes to :func:`~attention_tutorial.measure.timing.time_fn` (repeats, max_seconds, ...).
    """
    cp.local_steps(local, block=block)  # an unknown name or a bad block fails here, before anything is measured
    seq, devices = _ints("seq", seq, 1), _ints("devices", devices, 1)
    causal = [check_flag("causal", c) for c in _seq("causal", causal)]
    for name, n in (("batch", batch), ("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        check_int(name, n, minimum=1)
    for p in _seq("passes", passes):
        if p not in ("fwd", "fwd+bwd"):
            raise ValueError(f"passes must hold 'fwd' and/or 'fwd+bwd'; got {p!r}.")
    for t, p in ((t, p) for t in seq for p in [1, *devices]):
        cp.layout_permutation(t, p, layout)  # T must split into P · chunks: said here, before anything is measured
    records = []
    mesh = cp.sequence_mesh(1)
    for t, c, pass_ in ((t, c, p) for t in seq for c in causal for p in passes):
        base = functools.partial(
            Point,
            batch=batch,
            seq_q=t,
            seq_kv=t,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            causal=c,
            pass_=pass_,
        )
        step = cp.local_steps(local, block=min(block, t))[0]
        s1, sb1 = cp.local_steps(local, block=min(block, t // cp.chunks_per_device(layout)))  # one device's chunks
        fns: dict[str, tuple[int | None, Callable]] = {
            "cp_local": (None, lambda q, k, v, c=c, step=step: step(q, k, v, is_causal=c, scale=head_dim**-0.5)[0])
        }
        if one_device_ring:
            fns["cp_ring_1dev"] = (
                1,
                lambda q, k, v, c=c, s=s1, sb=sb1: cp.context_parallel_attention(
                    q, k, v, mesh=mesh, is_causal=c, layout=layout, local=s, local_bwd=sb
                ),
            )
        for p in devices:  # the emulated ring's chunks are T / (P · chunks per device): the local step's tile fits
            sp = cp.local_steps(local, block=min(block, t // (p * cp.chunks_per_device(layout))))[0]
            fns[f"cp_emulated_P{p}"] = (
                p,
                lambda q, k, v, c=c, p=p, sp=sp: cp.emulate_ring(
                    q, k, v, devices=p, is_causal=c, layout=layout, local=sp
                ),
            )
        for impl, (p, fn) in fns.items():
            records.append({**_measure(base(impl=impl), fn, p, peak_tflops, timing), "local": local})
    return records


def _seq(name, xs) -> list:
    if isinstance(xs, (str, bytes)) or not hasattr(xs, "__iter__"):
        raise ValueError(f"{name} must be a list or tuple; got {type(xs).__name__} {xs!r:.60}.")
    return list(xs)


def _ints(name, xs, minimum) -> list[int]:
    return [check_int(f"each of {name}", x, minimum=minimum) for x in _seq(name, xs)]


def what_ran(rec: dict) -> dict:
    """``{"gpus": ..., "ring_steps": ...}`` of a context-parallel record, from its own fields, or for a record written
    before them from its name and ``devices`` (which then held an emulated ring's P: one GPU ran it)."""
    if "gpus" in rec:
        return {"gpus": rec["gpus"], "ring_steps": rec.get("ring_steps")}
    impl, devices = rec.get("impl", ""), rec.get("devices", 1)
    if impl.startswith("cp_emulated_P"):
        return {"gpus": 1, "ring_steps": int(impl.removeprefix("cp_emulated_P") or devices)}
    if impl == "cp_ring_1dev":
        return {"gpus": 1, "ring_steps": 1}
    if impl == "cp_local":
        return {"gpus": 1, "ring_steps": None}
    ring = rec.get("strategy") == "ring"  # the multi-GPU records: P devices, P ring steps for a ring
    return {"gpus": devices, "ring_steps": devices if ring else None}


def best_local(shape, dtype, causal: bool = True) -> str:
    """The local step to time here: our Mosaic GPU kernel where it runs (Hopper; bf16/f16; H 64 or 128; it
    returns the log-sum-exp the merges need), else blockwise JAX."""
    from ..kernels.mosaic import why_not

    return "mosaic" if why_not(shape, dtype, causal) is None else "blockwise"


def _measure(point: Point, fn, ring_steps: int | None, peak_tflops, timing) -> dict:
    rec = {**empty_record(point), "experiment": EXPERIMENT, "devices": 1, "gpus": 1, "ring_steps": ring_steps}
    try:
        q, k, v = make_qkv(
            point.batch,
            point.seq_q,
            point.heads,
            point.head_dim,
            seq_kv=point.seq_kv,
            kv_heads=point.kv_heads,
            dtype=point.dtype,
        )
        if point.pass_ == "fwd+bwd":
            d_out = jax.random.normal(jax.random.key(1), q.shape, q.dtype)
            fwd = fn

            def fn(q, k, v, d_out):
                return jax.vjp(fwd, q, k, v)[1](d_out)

            args = (q, k, v, d_out)
        else:
            args = (q, k, v)
        stats = compile_stats(fn, *args)
        t = time_fn(fn, *args, compiled=stats.compiled, **timing)
    except Exception as err:
        return {**rec, **failure_fields(err)}
    finally:
        args = q = k = v = None
    flops = attention_flops(
        point.batch, point.seq_q, point.seq_kv, point.heads, point.head_dim, causal=point.causal, pass_=point.pass_
    )
    return timed_record(
        rec,
        t,
        flops=flops,
        peak_tflops=peak_tflops,
        compile_s=stats.compile_s,
        temp_bytes=stats.temp_bytes,
        repeats=t.repeats,
    )


def overhead_table(records) -> list[dict]:
    """Per (seq, causal, pass, local step): each impl's median time relative to ``cp_local`` (1.0 = no overhead)."""
    ok = [r for r in records if r.get("experiment") == EXPERIMENT and r["status"] == "ok"]
    key = lambda r: (r["seq_q"], r["causal"], r["pass"], r.get("local", "blockwise"))  # noqa: E731
    rows = []
    for k in sorted({key(r) for r in ok}):
        group = {r["impl"]: r["median_ms"] for r in ok if key(r) == k}
        if "cp_local" not in group:
            continue
        for impl, ms in sorted(group.items()):
            rows.append(
                {
                    "seq_q": k[0],
                    "causal": k[1],
                    "pass": k[2],
                    "local": k[3],
                    "impl": impl,
                    "median_ms": ms,
                    "vs_local": float(np.round(ms / group["cp_local"], 3)),
                }
            )
    return rows
