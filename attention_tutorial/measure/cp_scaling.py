"""Context parallelism on several GPUs of one host: strong and weak scaling, ring against all-gather (and TE).

:func:`scaling_records` measures :func:`~attention_tutorial.kernels.context_parallel.context_parallel_attention`
on P = 1, 2, 4, ... devices of this process, with q, k, v already sharded over the mesh in the layout's token order
(``reorder=False``, as a training loop keeps them: no resharding inside the timed call):

* **strong scaling** — a fixed T (``seqs``) on P devices against the local step on one device at the same T;
* **weak scaling** — T = ``weak_base`` · P. Attention's work grows as T², so the work per device grows as P;

and for both, ``efficiency`` = TFLOP/s per device on P devices / TFLOP/s of the one-device local step at the
baseline T (the same T for strong, ``weak_base`` for weak). For strong scaling that is t₁ / (P · t_P); 1 is linear.

TransformerEngine's own context parallelism (``transformer_engine.jax.attention.fused_attn`` with
``context_parallel_strategy`` RING / ALL_GATHER over the mesh axis named as TE's ``cp_resource``) runs the same
problems beside ours where TE is installed; where it is not, or its API differs from what this code calls, the
record says "unsupported"/"error" with the reason. On a GPU each multi-device point is also traced
(:func:`overlap_fields`): per GPU, how much of the NCCL kernels' time ran while a compute kernel ran.

Records follow :mod:`attention_tutorial.measure.sweep`'s schema (``experiment`` "context_parallel", ``devices`` and
``gpus`` (P, the GPUs it ran on), ``ring_steps`` (P for a ring, None for all-gather and the one-device step),
``strategy``, ``layout``, ``scaling``, ``family`` ("ours" or "te"), ``efficiency``, ``tflops_per_gpu``;
``pct_peak`` is per device).
:func:`interconnect` says how the GPUs are connected, as ``nvidia-smi`` reports it.
"""

from __future__ import annotations

import functools
import inspect
import shutil
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ..inputs import AttentionShape, check_flag, check_int, make_qkv
from ..kernels import context_parallel as cp
from .compiled import compile_stats
from .flops import attention_flops, peak_for
from .sweep import Point, empty_record, failure_fields, timed_record
from .timing import time_fn

EXPERIMENT = "context_parallel"
SEQS = (65536, 131072)  # strong scaling: fixed T
WEAK_BASE = 16384  # weak scaling: T = WEAK_BASE · P
SHAPE = {"batch": 1, "heads": 32, "kv_heads": 8, "head_dim": 128}
TE_STRATEGIES = {"ring": "RING", "allgather": "ALL_GATHER"}
AXIS = "seq"
COMM_MARKERS = ("nccl", "ptop", "peer")  # device events that are transfers: NCCL kernels, peer-to-peer copies


def device_counts(devices=None) -> tuple[int, ...]:
    """The P to measure, 1 first: all powers of two up to this process's device count (and the count itself) for
    ``None``; 1 to ``devices`` in powers of two for an int; the given ones (plus 1) for a sequence."""
    avail = jax.device_count()
    if devices is None or not isinstance(devices, (list, tuple, range)):
        top = avail if devices is None else check_int("devices", devices, minimum=1, example="4")
        if top > avail:
            raise ValueError(f"asked for {top} devices; this process has {avail} ({jax.devices()[0].platform}).")
        counts = {1, top} | {2**i for i in range(top.bit_length()) if 2**i <= top}
    else:
        counts = {1, *(check_int("each of devices", p, minimum=1) for p in devices)}
        if max(counts) > avail:
            raise ValueError(f"device counts {sorted(counts)} must lie in 1..{avail} (this process's devices).")
    return tuple(sorted(counts))


def scaling_records(
    devices=None,
    *,
    seqs=SEQS,
    weak_base: int | None = WEAK_BASE,
    strategies=cp.STRATEGIES,
    layouts=cp.LAYOUTS,
    passes=("fwd", "fwd+bwd"),
    causal=(False, True),
    dtype: str = "bfloat16",
    batch: int = SHAPE["batch"],
    heads: int = SHAPE["heads"],
    kv_heads: int = SHAPE["kv_heads"],
    head_dim: int = SHAPE["head_dim"],
    local=None,
    block: int = 512,
    te: bool = True,
    peak_tflops: float | None = None,
    profile: bool = True,
    profiled_calls: int = 3,
    budget_s: float | None = None,
    **timing,
) -> list[dict]:
    """Strong-scaling (``seqs``) and weak-scaling (T = ``weak_base`` · P; None: none) records on ``devices``
    (see :func:`device_counts`), for each strategy and layout, pass and mask, beside the one-device local step
    (``local``, default blockwise with ``block``) and TE's context parallelism (``te``).

    Without a causal mask the layouts do the same work, so only the first of ``layouts`` runs there. ``profile``
    traces each multi-device point on a GPU (:func:`overlap_fields`). ``budget_s`` caps the whole run: points not
    reached are recorded as "unsupported" with the reason. ``timing`` goes to ``time_fn``.
    """
    counts = device_counts(devices)
    te, profile = check_flag("te", te), check_flag("profile", profile)
    shape = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": dtype}
    strong = [[("strong", t, p) for p in counts] for t in seqs]
    weak = [[("weak", weak_base * p, p) for p in counts]] if weak_base else []
    groups = strong[:1] + weak + strong[1:]  # the first T, then weak scaling, then larger T: the order of value
    done: dict[tuple, dict]  # a measurement, by what it measured
    start, done, records = time.perf_counter(), {}, []
    order = ((x, a, b) for g in groups for a in passes for b in causal for x in g)
    for (scaling, t, p), pass_, c in order:
        for kind, strategy, layout in _variants(p, strategies, layouts if c else layouts[:1], te, c):
            name = {"local": "local", "te_local": "te_local", "cp": f"cp_{strategy}_{layout}"}.get(
                kind, f"te_{strategy}"
            )
            point = Point(f"{name}_P{p}_{scaling}", batch, t, t, heads, kv_heads, head_dim, dtype, c, pass_)
            rec = {
                **empty_record(point),
                "experiment": EXPERIMENT,
                "devices": p,
                "gpus": p,
                "ring_steps": p if strategy == "ring" else None,
                "strategy": strategy,
                "layout": layout,
                "scaling": scaling,
                "family": "te" if kind.startswith("te") else "ours",
            }
            key = (kind, strategy, layout, t, c, pass_, p)
            if key in done:  # the same measurement serves strong and weak scaling
                records.append({**rec, **_timed(done[key])})
                continue
            if budget_s is not None and time.perf_counter() - start > budget_s:
                reason = f"not measured: the run's time budget of {budget_s:.0f} s was spent (measure fewer points)"
                records.append({**rec, "status": "unsupported", "reason": reason})
                continue
            fn = functools.partial(
                _measure,
                kind,
                strategy,
                layout,
                local=local,
                block=block,
                profile=profile,
                profiled_calls=profiled_calls,
                timing=timing,
            )
            done[key] = fn(rec, shape, t, c, pass_, p, peak_tflops)
            records.append(done[key])
    return add_efficiency(records)


def _variants(p, strategies, layouts, te, causal):
    """(kind, strategy, layout) measured on p devices: the local step (and TE's attention) alone on one, ours and
    TE's context parallelism on several."""
    if p == 1:
        return [("local", "none", "contiguous")] + ([("te_local", "none", "contiguous")] if te else [])
    ours = [("cp", s, lay) for s in strategies for lay in layouts]
    theirs = [("te", s, "zigzag" if causal else "contiguous") for s in strategies if s in TE_STRATEGIES] if te else []
    return ours + theirs


TIMED = (
    "status",
    "reason",
    "median_ms",
    "p10_ms",
    "p90_ms",
    "tflops",
    "pct_peak",
    "peak_basis",
    "compile_s",
    "temp_bytes",
    "repeats",
    "tflops_per_gpu",
    "single_call_ms",
    "dispatch_ms",
    "te_version",
)


def _timed(rec: dict) -> dict:
    """The measurement fields of a record (to reuse one measurement under another point)."""
    return {k: v for k, v in rec.items() if k in TIMED or k.startswith(("comm_", "compute_", "overlap_"))}


def _measure(
    kind,
    strategy,
    layout,
    rec,
    shape,
    t,
    causal,
    pass_,
    p,
    peak_tflops,
    *,
    local,
    block,
    profile,
    profiled_calls,
    timing,
) -> dict:
    args = None
    try:
        fn, args, context = _problem(kind, strategy, layout, shape, t, causal, pass_, p, local=local, block=block)
        with context():
            stats = compile_stats(fn, *args)
        timed = time_fn(fn, *args, compiled=stats.compiled, **timing)
        extra = overlap_fields(stats.compiled, args, calls=profiled_calls) if profile and p > 1 else {}
    except Exception as err:
        return {**rec, **failure_fields(err)}
    finally:
        args = None  # free device memory before the next point
    flops = attention_flops(shape["batch"], t, t, shape["heads"], shape["head_dim"], causal=causal, pass_=pass_)
    out = timed_record(
        rec,
        timed,
        flops=flops,
        peak_tflops=peak_tflops,
        compile_s=stats.compile_s,
        temp_bytes=stats.temp_bytes,
        repeats=timed.repeats,
        single_call_ms=timed.single_call_ms,
        dispatch_ms=timed.dispatch_ms,
        **extra,
    )
    per_gpu = out["tflops"] / p
    peak, _ = peak_for(shape["dtype"], peak_tflops)
    return {
        **out,
        "tflops_per_gpu": per_gpu,
        "pct_peak": 100 * per_gpu / peak if peak else None,
        **({"te_version": _te_version()} if kind.startswith("te") else {}),
    }


def _problem(kind, strategy, layout, shape, t, causal, pass_, p, *, local, block):
    """(fn, args, context): the call to time, its inputs sharded over p devices in the layout's token order, and
    the context its compilation needs (TE's mesh resource)."""
    B, N, K, H, dtype = shape["batch"], shape["heads"], shape["kv_heads"], shape["head_dim"], shape["dtype"]
    q, k, v = make_qkv(B, t, N, H, kv_heads=K, dtype=dtype)
    args = (q, k, v)
    if pass_ == "fwd+bwd":
        args += (jax.random.normal(jax.random.key(1), q.shape, q.dtype),)
    if kind == "local":  # one device, the whole sequence
        step = local or functools.partial(cp.blockwise_local, block=min(block, t))
        fwd = lambda q, k, v: step(q, k, v, is_causal=causal, scale=H**-0.5)[0]  # noqa: E731
        return _with_pass(fwd, pass_), args, _nothing
    if kind == "te_local":  # TE's fused attention on one device: the baseline of TE's context parallelism
        from ..kernels import te as te_kernel

        if reason := te_kernel.why_not(AttentionShape(B, t, t, N, K, H), jnp.dtype(dtype), causal):
            raise NotImplementedError(reason)
        fwd = functools.partial(te_kernel.te_attention, is_causal=causal)
        return _with_pass(fwd, pass_), args, _nothing
    mesh = cp.sequence_mesh(p, AXIS)
    perm = cp.layout_permutation(t, p, layout)
    sharding = NamedSharding(mesh, PartitionSpec(None, AXIS, None, None))
    args = tuple(jax.device_put(x[:, perm], sharding) for x in args)
    if kind == "cp":
        fwd = functools.partial(
            cp.context_parallel_attention,
            mesh=mesh,
            axis=AXIS,
            strategy=strategy,
            is_causal=causal,
            layout=layout,
            local=local,
            block=block,
            reorder=False,
        )
        return _with_pass(fwd, pass_), args, _nothing
    fwd, context = te_context_parallel(mesh, strategy, causal=causal, head_dim=H)
    return _with_pass(fwd, pass_), args, context


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def _with_pass(fwd, pass_):
    if pass_ == "fwd":
        return fwd
    return lambda q, k, v, d_out: jax.vjp(fwd, q, k, v)[1](d_out)


def te_context_parallel(mesh, strategy: str, *, causal: bool, head_dim: int, axis: str = AXIS):
    """(fn(q, k, v) -> out, context): TE's fused attention with its context parallelism over ``axis`` of ``mesh``
    (inputs bshd, sharded on the sequence; causal ones in TE's dual-chunk-swap order, which is our zig-zag).

    Raises ``NotImplementedError`` where TE is absent or lacks the context-parallel arguments (an "unsupported"
    record). Written against ``transformer_engine.jax.attention.fused_attn``'s keyword arguments
    ``context_parallel_strategy``, ``context_parallel_causal_load_balanced``, ``context_parallel_axis``.
    """
    from ..kernels.te import import_te, installed

    if jax.default_backend() != "gpu" or not installed():
        raise NotImplementedError("TransformerEngine context parallelism needs TE on an NVIDIA GPU; not here.")
    te_jax = import_te()
    from transformer_engine.jax import attention as te_attn
    from transformer_engine.jax.sharding import MeshResource

    params = inspect.signature(te_attn.fused_attn).parameters
    missing = [a for a in ("context_parallel_strategy", "context_parallel_axis") if a not in params]
    if missing or not hasattr(te_attn, "CPStrategy"):
        raise NotImplementedError(f"this TE's fused_attn lacks {missing or ['CPStrategy']}: no context parallelism")
    options = {
        "attn_bias_type": te_attn.AttnBiasType.NO_BIAS,
        "attn_mask_type": te_attn.AttnMaskType.CAUSAL_MASK if causal else te_attn.AttnMaskType.NO_MASK,
        "qkv_layout": te_attn.QKVLayout.BSHD_BSHD_BSHD,
        "scaling_factor": head_dim**-0.5,
        "dropout_probability": 0.0,
        "is_training": True,
        "context_parallel_strategy": getattr(te_attn.CPStrategy, TE_STRATEGIES[strategy]),
        "context_parallel_causal_load_balanced": bool(causal),
        "context_parallel_axis": axis,
    }
    if "softmax_type" in params and hasattr(te_attn, "AttnSoftmaxType"):
        options["softmax_type"] = te_attn.AttnSoftmaxType.VANILLA_SOFTMAX
    positional = list(params)[:4]  # qkv, bias, mask / sequence_descriptor, seed

    def fn(q, k, v):
        import warnings

        with warnings.catch_warnings():  # no mask and no sequence descriptor: TE's (deprecated) bshd path
            warnings.filterwarnings(
                "ignore", message="Pass mask to fused_attn is deprecated", category=DeprecationWarning
            )
            return te_attn.fused_attn((q, k, v), *(None,) * (len(positional) - 1), **options)

    scope = getattr(te_jax, "autocast", None) or te_jax.fp8_autocast
    set_mesh = getattr(jax, "set_mesh", None)

    def context():
        import contextlib

        stack = contextlib.ExitStack()
        stack.enter_context(set_mesh(mesh) if set_mesh else mesh)
        stack.enter_context(scope(enabled=False, mesh_resource=MeshResource(cp_resource=axis)))
        return stack

    return fn, context


def _te_version():
    from importlib.metadata import PackageNotFoundError, version

    for name in ("transformer_engine", "transformer-engine", "transformer_engine_jax"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def add_efficiency(records) -> list[dict]:
    """Each record with ``efficiency``: its TFLOP/s per device over the one-device local step's TFLOP/s at the
    baseline T (strong: the same T; weak: T / P), same mask, pass, shape and ``family`` (ours against the local
    step, TE's against TE's one-device attention); None where either is not ok."""
    same = ("batch", "heads", "kv_heads", "head_dim", "dtype", "causal", "pass", "family")
    base = {
        (r["seq_q"], *(r.get(f) for f in same)): r for r in records if r.get("devices") == 1 and r["status"] == "ok"
    }
    out = []
    for r in records:
        t = r["seq_q"] if r.get("scaling") == "strong" else r["seq_q"] // r["devices"]
        b = base.get((t, *(r.get(f) for f in same)))
        ok = r["status"] == "ok" and b is not None
        out.append({**r, "efficiency": r["tflops"] / r["devices"] / b["tflops"] if ok else None})  # type: ignore[index]
    return out


def overlap(timelines) -> dict:
    """How much transfer time hid behind compute, from per-device timelines {device: [(name, start ns, dur ns)]}.

    Per device: transfer events (NCCL kernels, peer copies: names holding ``COMM_MARKERS``), the rest compute; the
    union of each kind's intervals, and the share of the transfers' union that a compute interval covers.
    Returns ``comm_ms``, ``compute_ms`` (totals per device, lists) and ``overlap_pct`` (per device; None without
    transfers) over the whole trace.
    """
    comm_ms, compute_ms, pct = [], [], []
    for _, evts in sorted(timelines.items()):
        is_comm = [any(m in n.lower() for m in COMM_MARKERS) for n, _, _ in evts]
        comm = _union([(s, s + d) for (_, s, d), c in zip(evts, is_comm) if c])
        work = _union([(s, s + d) for (_, s, d), c in zip(evts, is_comm) if not c])
        c_ns = sum(b - a for a, b in comm)
        comm_ms.append(c_ns / 1e6)
        compute_ms.append(sum(b - a for a, b in work) / 1e6)
        pct.append(100 * _covered(comm, work) / c_ns if c_ns else None)
    return {"comm_ms": comm_ms, "compute_ms": compute_ms, "overlap_pct": pct}


def _union(intervals):
    out: list[list] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _covered(xs, ys) -> float:
    """Length of the intersection of two sorted disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def device_timelines(path) -> dict[str, list[tuple[str, float, float]]]:
    """{GPU plane name: [(event name, start ns, duration ns)]} of a trace's device streams ({} without GPU planes).

    Event stats are not read (reading them aborted the process on the H200; see :mod:`attention_tutorial.measure.profile`)."""
    from .profile import profile_data_class

    data = profile_data_class().from_file(str(path))
    out = {}
    for plane in data.planes:
        if plane.name.startswith("/device:GPU"):
            out[plane.name] = [
                (e.name, float(e.start_ns), float(e.duration_ns))
                for line in plane.lines
                if line.name.startswith("Stream")
                for e in line.events
            ]
    return out


def overlap_fields(compiled, args, *, calls: int = 3) -> dict:
    """Record fields from a profiler trace of ``calls`` calls (plus the untimed one :func:`~.profile.trace` runs
    first; all of them are counted in the per-call averages): per GPU ``comm_ms`` and ``compute_ms`` per call and
    ``overlap_pct`` (see :func:`overlap`), their mean ``overlap_mean_pct``; off a GPU, None with ``overlap_reason``."""
    from .profile import TRACED_EXTRA, trace

    none = {"overlap_pct": None, "overlap_mean_pct": None, "comm_ms": None, "compute_ms": None}
    if jax.default_backend() != "gpu":
        return {**none, "overlap_reason": f"no GPU device timeline on {jax.default_backend().upper()}"}
    try:
        with tempfile.TemporaryDirectory(prefix="attention-cp-trace-") as tmp:
            timelines = device_timelines(trace(compiled, args, repeats=calls, log_dir=tmp))
    except Exception as err:
        return {**none, "overlap_reason": f"trace failed: {type(err).__name__}: {str(err)[:200]}"}
    if not timelines:
        return {**none, "overlap_reason": "the trace holds no /device:GPU plane (CUPTI unavailable?)"}
    res = overlap(timelines)
    pcts = [x for x in res["overlap_pct"] if x is not None]
    traced = calls + TRACED_EXTRA  # trace() runs one untimed call inside the profiler before the timed ones
    return {
        "comm_ms": [x / traced for x in res["comm_ms"]],
        "compute_ms": [x / traced for x in res["compute_ms"]],
        "overlap_pct": res["overlap_pct"],
        "overlap_mean_pct": float(np.mean(pcts)) if pcts else None,
        "overlap_reason": None if pcts else "no NCCL or peer-copy events in the device timelines",
    }


def interconnect(timeout_s: float = 30.0) -> dict:
    """How this host's GPUs are connected: ``nvidia-smi topo -m`` and ``nvidia-smi nvlink -s`` as text, or None
    for each with ``reason`` saying why not."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"topology": None, "nvlink": None, "reason": "nvidia-smi is not on PATH (no NVIDIA driver here)"}
    out: dict[str, str | None]
    out, reasons = {}, []
    for key, argv in (("topology", ["topo", "-m"]), ("nvlink", ["nvlink", "-s"])):
        try:
            run = subprocess.run([smi, *argv], capture_output=True, text=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            out[key] = None
            reasons.append(f"nvidia-smi {' '.join(argv)}: {type(err).__name__}: {err}")
            continue
        text = run.stdout.strip()
        out[key] = text if run.returncode == 0 and text else None
        if out[key] is None:
            reasons.append(f"nvidia-smi {' '.join(argv)} exited {run.returncode}: {run.stderr.strip()[:200]}")
    return {**out, "reason": "; ".join(reasons) or None}


def provenance() -> dict:
    """What the ``cp_scaling`` grid adds to its provenance: the device count and kind, and :func:`interconnect`."""
    devs = jax.devices()
    return {"devices": len(devs), "device_kind": devs[0].device_kind, "interconnect": interconnect()}
