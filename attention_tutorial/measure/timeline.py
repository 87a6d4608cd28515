"""A measured timeline of our Mosaic GPU kernels' warpgroups, from Pallas Mosaic GPU's in-kernel profiler.

With ``Probe(profile_space=..., profile_dir=...)`` the forward names its regions (``jax.named_scope``) and
Pallas stamps the SM clock where each starts and ends, per warpgroup, in a buffer in shared memory; after the call
a host callback writes the buffer as a Chrome trace (JSON) into ``profile_dir``. :func:`profile_forward` runs one
profiled call; :func:`parse_trace` turns its trace into compact tracks; :func:`timeline_records` does both for the
plain and the pipelined forward at one modest shape (:data:`SHAPE`), keeping a few CTAs.

The regions (:data:`attention_tutorial.kernels.mosaic._common.REGIONS`): ``qk`` issuing q·kᵀ and waiting for its
result, ``softmax`` (the mask, the online softmax with its exp2, the rescaling), ``pv`` issuing p·v and waiting for
it, ``wait`` barrier waits (for a tile to land, a slot to be freed, or the other warpgroup's turn), ``copy`` the copy
warpgroup issuing TMA copies. A region may hold another (``depth`` 1: the turn taken inside ``qk``, the next k
waited for inside ``pv``).

What the recorder stores (provenance key ``"timeline"``, one entry per kernel, ``"mosaic"`` and ``"mosaic_pipe"``)::

    {"status": "ok", "shape": {"batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim"}, "causal": false,
     "dtype": "bfloat16", "tiles": {"block_q", "block_kv", "stages"}, "profile_space": n, "unit": "ns",
     "ctas": how many CTAs the trace held, "tracks": [
        {"cta": 0, "sm": 17, "warpgroup": 0, "regions": [["wait", start, end, depth], ...]}, ...]}

or ``{"status": "error", "reason": ...}``.

The backward (:func:`backward_timeline_records`, provenance key ``"timeline_backward"``) is recorded the same way for
each way of making dQ (:data:`BACKWARD_KERNELS`), with the backward kernels called alone: ``"tracks"`` are the dK/dV
kernel's, and with dQ by a pass of its own ``"dq_tracks"`` the dQ kernel's; ``"tiles"`` holds the backward's. Its
regions: ``qk`` recomputing the scores, ``softmax`` the elementwise work (the mask, exp2 for P, dS from dP),
``grads`` the gradient matmuls (dV and dP, then dK, and with atomic adds dQ's share), ``dq_add`` sending dQ's share
out (a TMA reduce-add), ``wait`` and ``copy`` as in the forward. Times are integers relative to the earliest region kept. The profiler
places each warpgroup's first region at the global timer (ns) and the later ones by the SM clock (cycles; at the
H200's 1.98 GHz a cycle is about 0.5 ns), so within one track the differences count cycles: compare regions with each
other, not with wall-clock times. Profiling adds two shared-memory stores per region, so the profiled kernel is a
little slower than the plain one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from ..inputs import AttentionShape, make_qkv
from ..kernels.mosaic.budget import Probe

SHAPE = AttentionShape(1, 2048, 2048, 8, 8, 128)  # 8 heads × 16 CTAs of 128 rows: one wave on an H200's 132 SMs
KERNELS: dict[str, dict[str, Any]] = {
    "mosaic": {},
    "mosaic_turns": {"schedule": "turns"},
    "mosaic_pipe": {"pipeline": True},
}  # impl: config
CTAS = 2  # CTAs kept per kernel: the first to start
WARPGROUPS = 3  # per CTA: two compute, one copy
REGIONS_PER_STEP = 8  # the pipelined step's regions (the plain one has 6), for sizing the event buffer
BACKWARD_SHAPE = AttentionShape(1, 2048, 2048, 8, 8, 64)  # H = 64: where the two ways of making dQ differ most
BACKWARD_KERNELS = {"mosaic": "pass", "mosaic_atomic": "atomic"}  # impl: bwd_dq
BACKWARD_REGIONS_PER_STEP = 10  # the dK/dV kernel's step with atomic adds (wait, qk, softmax, grads twice, ...)


def profile_space(shape: AttentionShape, block_kv: int) -> int:
    """Regions per warpgroup the event buffer must hold: ``REGIONS_PER_STEP`` for each key block and a few for the
    prologue and epilogue (a warpgroup that records more than it holds corrupts its trace)."""
    return REGIONS_PER_STEP * (shape.seq_kv // block_kv) + 16


def backward_profile_space(shape: AttentionShape, cfg) -> int:
    """Regions per warpgroup the backward's event buffer must hold: :data:`BACKWARD_REGIONS_PER_STEP` for each step
    of the longer of its two walks (the dK/dV kernel's over query blocks and heads sharing a kv head, the dQ
    kernel's over key blocks) and a few for the prologue and epilogue."""
    steps = max(shape.heads // shape.kv_heads * shape.seq_q // cfg.bwd_block_q, shape.seq_kv // cfg.bwd_block_kv)
    return BACKWARD_REGIONS_PER_STEP * steps + 16


def _written(folder: Path, before: set, expected: int, what: str) -> list[Path]:
    """The traces written into ``folder`` since ``before``, in the order the kernels ran (the profiler names each
    ``<kernel>-<time in ns>-trace.json``)."""
    jax.effects_barrier()  # the traces are written by host callbacks
    written = sorted(set(folder.glob("*.json")) - before, key=lambda p: int(p.name.rsplit("-", 2)[-2]))
    if len(written) != expected:
        raise RuntimeError(f"the profiled {what} wrote {len(written)} traces into {folder}, not {expected}: {written}")
    return written


def profile_backward(dq: str, folder, *, shape: AttentionShape = BACKWARD_SHAPE, causal: bool = False) -> list[Path]:
    """Run our backward kernels alone (dQ made as ``dq`` says: see ``MosaicConfig.bwd_dq``) once with the in-kernel
    profiler on and return the traces they wrote into ``folder``, in the order they ran: with a pass of its own the
    dQ kernel's, then the dK/dV kernel's; with atomic adds the dK/dV kernel's alone. Needs a Hopper GPU."""
    from ..kernels.mosaic.attention import mosaic_flash_attention, mosaic_flash_backward
    from ..kernels.mosaic.budget import default_config

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    plain = dataclasses.replace(default_config(shape.head_dim), bwd_dq=dq)
    probe = Probe(profile_space=backward_profile_space(shape, plain), profile_dir=str(folder))
    q, k, v = make_qkv(
        shape.batch,
        shape.seq_q,
        shape.heads,
        shape.head_dim,
        seq_kv=shape.seq_kv,
        kv_heads=shape.kv_heads,
        dtype=jnp.bfloat16,
        seed=0,
    )
    out, lse = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, config=plain, return_lse=True))(
        q, k, v
    )
    d_out = jax.random.normal(jax.random.key(1), q.shape, jnp.float32).astype(q.dtype)
    before = set(folder.glob("*.json"))
    fn = jax.jit(functools.partial(mosaic_flash_backward, is_causal=causal, config=plain, probe=probe))
    jax.block_until_ready(fn(q, k, v, out, lse, d_out))
    return _written(folder, before, 2 if dq == "pass" else 1, "backward")


def kernel_config(impl: str, head_dim: int):
    """The MosaicConfig of :data:`KERNELS`' ``impl`` at ``head_dim``."""
    from ..kernels.mosaic.budget import default_config

    return dataclasses.replace(default_config(head_dim), **KERNELS[impl])


def profile_forward(config, folder, *, shape: AttentionShape = SHAPE, causal: bool = False) -> Path:
    """Run our forward with ``config`` (a MosaicConfig) once with the in-kernel profiler on and return the trace it
    wrote into ``folder``. Needs a Hopper GPU."""
    from ..kernels.mosaic.attention import mosaic_flash_attention

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    before = set(folder.glob("*.json"))
    probe = Probe(profile_space=profile_space(shape, config.block_kv), profile_dir=str(folder))
    q, k, v = make_qkv(
        shape.batch,
        shape.seq_q,
        shape.heads,
        shape.head_dim,
        seq_kv=shape.seq_kv,
        kv_heads=shape.kv_heads,
        dtype=jnp.bfloat16,
        seed=0,
    )
    fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, config=config, probe=probe))
    jax.block_until_ready(fn(q, k, v))
    return _written(folder, before, 1, "forward")[0]


def parse_trace(trace: dict, *, ctas: int = CTAS, warpgroups: int = WARPGROUPS) -> list[dict]:
    """The tracks of the first ``ctas`` CTAs to start in a Chrome trace from Pallas's profiler (``traceEvents`` of
    "B"/"E" events; ``tid`` 1 + warpgroup + ``warpgroups`` · CTA, ``pid`` 1 + SM, ``ts`` in µs): one track per
    warpgroup, ``{"cta", "sm", "warpgroup", "regions": [[name, start, end, depth], ...]}``, times in integer ns
    from the earliest region kept, CTAs renumbered 0, 1, ... in the order they started. ``ValueError`` where the
    events do not nest (an end without its start, or a track left open)."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("trace must be a Chrome trace: a dict with a 'traceEvents' list.")
    if isinstance(ctas, bool) or not isinstance(ctas, int) or ctas < 1:
        raise ValueError(f"ctas must be a positive int; got {ctas!r}.")
    tracks: dict[int, dict] = {}
    for event in trace["traceEvents"]:
        tid, phase = event["tid"], event["ph"]
        track = tracks.setdefault(tid, {"sm": event["pid"] - 1, "open": [], "regions": []})
        t = float(event["ts"]) * 1e3
        if phase == "B":
            track["open"].append((event["name"], t))
        elif phase == "E":
            if not track["open"] or track["open"][-1][0] != event["name"]:
                raise ValueError(f"trace track {tid}: region {event['name']!r} ends without its start")
            name, start = track["open"].pop()
            track["regions"].append([name, start, t, len(track["open"])])
    for tid, track in tracks.items():
        if track["open"]:
            raise ValueError(f"trace track {tid}: regions {[n for n, _ in track['open']]} never end")
    by_cta: dict[int, list] = {}
    for tid, track in tracks.items():
        if track["regions"]:
            by_cta.setdefault((tid - 1) // warpgroups, []).append((tid, track))
    first = sorted(by_cta, key=lambda c: min(r[1] for _, tr in by_cta[c] for r in tr["regions"]))[:ctas]
    kept = [(n, tid, track) for n, cta in enumerate(first) for tid, track in sorted(by_cta[cta])]
    origin = min((r[1] for _, _, track in kept for r in track["regions"]), default=0.0)
    return [
        {
            "cta": n,
            "sm": track["sm"],
            "warpgroup": (tid - 1) % warpgroups,
            "regions": [
                [name, round(s - origin), round(e - origin), depth]
                for name, s, e, depth in sorted(track["regions"], key=lambda r: (r[1], r[3]))
            ],
        }
        for n, tid, track in kept
    ]


def timeline_records(*, shape: AttentionShape = SHAPE, ctas: int = CTAS, causal: bool = False) -> dict[str, dict]:
    """For each of :data:`KERNELS`: one profiled call at ``shape``, its first ``ctas`` CTAs as tracks (the format of
    the module docstring), or its status and reason where it could not run."""
    from ..kernels.mosaic._common import on_hopper
    from ..kernels.mosaic.budget import problem

    out = {}
    for impl in KERNELS:
        config = kernel_config(impl, shape.head_dim)
        meta = {
            "shape": shape._asdict(),
            "causal": causal,
            "dtype": "bfloat16",
            "tiles": {f: getattr(config, f) for f in ("block_q", "block_kv", "stages")},
            "schedule": config.schedule,
            "pipeline": config.pipeline,
            "profile_space": profile_space(shape, config.block_kv),
            "unit": "ns",
        }
        reason = on_hopper() or problem(shape, jnp.bfloat16, config)
        if reason:
            out[impl] = {"status": "unsupported", "reason": reason, **meta}
            continue
        try:
            with tempfile.TemporaryDirectory() as folder:
                trace = json.loads(profile_forward(config, folder, shape=shape, causal=causal).read_text())
            n_ctas = len({(e["tid"] - 1) // WARPGROUPS for e in trace["traceEvents"]})
            out[impl] = {"status": "ok", **meta, "ctas": n_ctas, "tracks": parse_trace(trace, ctas=ctas)}
        except Exception as err:  # one kernel failing leaves the other's timeline
            out[impl] = {"status": "error", "reason": f"{type(err).__name__}: {str(err)[:300]}", **meta}
    return out


def backward_timeline_records(
    *, shape: AttentionShape = BACKWARD_SHAPE, ctas: int = CTAS, causal: bool = False
) -> dict[str, dict]:
    """For each of :data:`BACKWARD_KERNELS`: one profiled call of the backward kernels alone at ``shape``, the
    first ``ctas`` CTAs of each kernel as tracks (see the module docstring), or its status and reason."""
    from ..kernels.mosaic.attention import why_not
    from ..kernels.mosaic.budget import default_config, problem

    out = {}
    for impl, dq in BACKWARD_KERNELS.items():
        config = dataclasses.replace(default_config(shape.head_dim), bwd_dq=dq)
        meta = {
            "shape": shape._asdict(),
            "causal": causal,
            "dtype": "bfloat16",
            "bwd_dq": dq,
            "tiles": {f: getattr(config, f) for f in ("bwd_block_q", "bwd_block_kv", "bwd_stages")},
            "profile_space": backward_profile_space(shape, config),
            "unit": "ns",
        }
        reason = why_not(shape, jnp.bfloat16, causal) or problem(shape, jnp.bfloat16, config)
        if reason:
            out[impl] = {"status": "unsupported", "reason": reason, **meta}
            continue
        try:
            with tempfile.TemporaryDirectory() as folder:
                traces = [json.loads(p.read_text()) for p in profile_backward(dq, folder, shape=shape, causal=causal)]
            *dq_trace, dkv_trace = traces
            n_ctas = len({(e["tid"] - 1) // WARPGROUPS for e in dkv_trace["traceEvents"]})
            out[impl] = {"status": "ok", **meta, "ctas": n_ctas, "tracks": parse_trace(dkv_trace, ctas=ctas)}
            if dq_trace:
                out[impl]["dq_tracks"] = parse_trace(dq_trace[0], ctas=ctas)
        except Exception as err:  # one way failing leaves the other's timeline
            out[impl] = {"status": "error", "reason": f"{type(err).__name__}: {str(err)[:300]}", **meta}
    return out
