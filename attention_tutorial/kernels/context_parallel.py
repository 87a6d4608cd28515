"""Context parallelism: one attention call with its sequence sharded over a mesh axis of P devices.

Each device holds T/P tokens of q, k and v (``jax.shard_map`` over a ``jax.sharding.Mesh``). Two strategies:

* **all-gather** — gather the whole K/V on every device (``lax.all_gather``), then attend the local queries to it.
  Simple; K/V memory per device is back to O(T).
* **ring** — K/V blocks travel around the ring of devices with ``lax.ppermute``; at step s a device attends its
  queries to the block it holds (the one of device d − s) and merges the partial result with the log-sum-exp.
  The transfer of the next block is issued before the current block's compute, so the two can overlap.

Merging two partial results over disjoint key sets, each normalised on its own, with lse = log Σ exp(scores)::

    lse = logaddexp(lse₁, lse₂)
    out = exp(lse₁ − lse) · out₁ + exp(lse₂ − lse) · out₂

So the local step must return the log-sum-exp of each row: :func:`~attention_tutorial.kernels.blockwise.
blockwise_attention` with ``return_lse=True`` does (the default here). cuDNN through
``jax.nn.dot_product_attention`` cannot serve: it returns only the normalised output, and a normalised output
alone cannot be re-weighted against another block's. Any ``local(q, k, v, *, is_causal, scale) -> (out, lse)``
with lse (B, N, T) can be plugged in.

Causal masks and load balance: with the natural (``"contiguous"``) layout device d holds chunk d, and at ring step
s it attends to chunk d − s: device 0 has work only at step 0 while device P − 1 works every step. The
``"zigzag"`` layout splits the sequence into 2P chunks and gives device d chunks d and 2P − 1 − d, so every device
does the same work at every step (:func:`causal_work` counts it). Inside, each (query chunk, key chunk) pair is
either wholly visible, causal on the diagonal, or wholly hidden (skipped with ``lax.switch``).

Gradients: the ring has its own backward pass (a custom VJP). It saves only the local q, k, v, the merged output
and lse; K/V go around the ring again, each device adds its queries' share of dK/dV to the block it holds, and
the dK/dV accumulators travel with their blocks, arriving home after P hops, so K/V memory stays O(T/P). The
all-gather strategy (and a ring with a local step given without ``local_bwd``) uses JAX's autodiff: the transpose
of ``all_gather`` is a reduce-scatter, that of ``ppermute`` a ``ppermute`` the other way round.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec

from ..inputs import (
    attention_shape,
    check_block_size,
    check_flag,
    check_int,
    check_number,
    check_scores_fit,
    resolve_scale,
)
from .blockwise import blockwise_attention, blockwise_backward

try:  # jax >= 0.6
    from jax import shard_map as _shard_map

    _UNCHECKED: dict[str, Any] = {"check_vma": False}
except ImportError:  # pragma: no cover - older jax
    from jax.experimental.shard_map import shard_map as _shard_map  # type: ignore[no-redef]

    _UNCHECKED = {"check_rep": False}

STRATEGIES = ("ring", "allgather")
LAYOUTS = ("contiguous", "zigzag")
LOCAL_STEPS = ("blockwise", "mosaic")  # see local_steps
F32 = jnp.float32


def chunks_per_device(layout: str) -> int:
    """How many chunks of the sequence each device holds: 1 (contiguous) or 2 (zig-zag)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}.")
    return 1 if layout == "contiguous" else 2


def device_chunks(device, devices: int, layout: str):
    """Global chunk indices that ``device`` holds, in order (ints, or traced ints inside ``shard_map``)."""
    return [device] if chunks_per_device(layout) == 1 else [device, 2 * devices - 1 - device]


def layout_permutation(seq: int, devices: int, layout: str) -> np.ndarray:
    """Token order along the sharded axis: ``x[:, perm]`` puts device 0's tokens first, then device 1's, ..."""
    seq, devices = check_int("seq", seq, minimum=1), check_int("devices", devices, minimum=1, example="4")
    c = chunks_per_device(layout)
    n = c * devices
    if seq % n:
        raise ValueError(
            f"sequence length {seq} must be a multiple of {n} ({devices} devices × {c} chunks each for "
            f"the {layout} layout); pad the sequence or change the number of devices."
        )
    chunk = seq // n
    order = [i for d in range(devices) for i in device_chunks(d, devices, layout)]
    return np.concatenate([np.arange(i * chunk, (i + 1) * chunk) for i in order])


def causal_work(seq: int, devices: int, layout: str) -> np.ndarray:
    """(P steps, P devices): score positions each device computes at each ring step under a causal mask.

    A pair of chunks of length c costs c² when the key chunk is earlier, c(c+1)/2 on the diagonal, 0 after.
    """
    layout_permutation(seq, devices, layout)  # validates
    c = seq // (devices * chunks_per_device(layout))
    work = np.zeros((devices, devices), np.int64)
    for step in range(devices):
        for d in range(devices):
            src = (d - step) % devices
            for i in device_chunks(d, devices, layout):
                for j in device_chunks(src, devices, layout):
                    work[step, d] += c * c if j < i else c * (c + 1) // 2 if j == i else 0
    return work


def ring_step_bytes(seq: int, devices: int, kv_heads: int, head_dim: int, dtype, *, batch: int = 1) -> int:
    """Bytes each device sends per ring step: its K and V blocks, 2·B·(T/P)·K·H·itemsize."""
    for name, n in (
        ("seq", seq),
        ("devices", devices),
        ("kv_heads", kv_heads),
        ("head_dim", head_dim),
        ("batch", batch),
    ):
        check_int(name, n, minimum=1)
    return 2 * batch * (seq // devices) * kv_heads * head_dim * jnp.dtype(dtype).itemsize


def chunk_to_hide_transfer(heads: int, kv_heads: int, dtype, *, flops_per_s: float, bytes_per_s: float) -> float:
    """T/P above which one ring step's compute (4·N·H·(T/P)² FLOPs, no mask) outlasts its K/V transfer.

    Compute 4·B·N·H·c² / F ≥ transfer 2·B·c·K·H·itemsize / W  ⟺  c ≥ K·itemsize·F / (2·N·W). Causal zig-zag
    steps do half the FLOPs of a full step, so they need twice this chunk.
    """
    check_int("heads", heads, minimum=1), check_int("kv_heads", kv_heads, minimum=1)
    check_number("flops_per_s", flops_per_s, positive=True), check_number("bytes_per_s", bytes_per_s, positive=True)
    return kv_heads * jnp.dtype(dtype).itemsize * flops_per_s / (2 * heads * bytes_per_s)


def collectives(hlo_text: str) -> dict[str, int]:
    """How many all-gather and collective-permute operations a compiled program's HLO text holds."""
    if not isinstance(hlo_text, str):
        raise ValueError(f"hlo_text must be a str (compiled.as_text()); got {type(hlo_text).__name__}.")
    found = re.findall(r"\s(all-gather|collective-permute)(?:-start)?\(", hlo_text)
    return {op: found.count(op) for op in ("all-gather", "collective-permute")}


def blockwise_local(q, k, v, *, is_causal: bool, scale: float, block: int = 512):
    """The default local step: blockwise attention returning (out, lse)."""
    return blockwise_attention(q, k, v, is_causal=is_causal, scale=scale, block_q=block, block_k=block, return_lse=True)


def _describe(got) -> str:
    if isinstance(got, (tuple, list)):
        return f"a {type(got).__name__} of {len(got)}: " + ", ".join(_describe(x) for x in got)
    return f"shape {tuple(got.shape)}" if hasattr(got, "shape") else type(got).__name__


def _call_local(local, q, k, v, *, is_causal, scale):
    """``local(q, k, v, is_causal=, scale=)``, its result checked against the contract: (out, lse)."""
    got = local(q, k, v, is_causal=is_causal, scale=scale)
    B, T, N, _ = q.shape
    if not (
        isinstance(got, (tuple, list))
        and len(got) == 2
        and all(hasattr(x, "shape") for x in got)
        and tuple(got[0].shape) == q.shape
        and tuple(got[1].shape) == (B, N, T)
    ):
        raise ValueError(
            f"local must return (out, lse) for its queries q {q.shape} (B, T, N, H): out of that shape and lse "
            f"{(B, N, T)} (B, N, T), the log-sum-exp of each row's scores, which the merges need "
            f"(blockwise_attention(..., return_lse=True) returns both); it returned {_describe(got)}."
        )
    return got


def _call_local_bwd(local_bwd, q, k, v, out, lse, d_out, *, is_causal, scale):
    """``local_bwd(q, k, v, out, lse, d_out, is_causal=, scale=)``, its result checked: (dq, dk, dv)."""
    got = local_bwd(q, k, v, out, lse, d_out, is_causal=is_causal, scale=scale)
    want = (q.shape, k.shape, v.shape)
    if not (
        isinstance(got, (tuple, list))
        and len(got) == 3
        and all(hasattr(x, "shape") for x in got)
        and tuple(tuple(x.shape) for x in got) == want
    ):
        raise ValueError(
            f"local_bwd must return (dq, dk, dv) of the shapes of q, k, v {want} (blockwise_backward returns them); "
            f"it returned {_describe(got)}."
        )
    return got


def merge(a, b):
    """Merge two partial results (out f32 (B, T, N, H), lse (B, N, T)) over disjoint key sets."""
    for name, part in (("a", a), ("b", b)):
        if not (isinstance(part, (tuple, list)) and len(part) == 2):
            raise ValueError(f"{name} must be a pair (out, lse), as a local step returns; got {_describe(part)}.")
    (o1, l1), (o2, l2) = a, b
    m = lax.stop_gradient(jnp.maximum(l1, l2))
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # both empty: weights exp(-inf) = 0
    w1, w2 = jnp.exp(l1 - m), jnp.exp(l2 - m)
    tot = w1 + w2
    seen = tot > 0
    safe = jnp.where(seen, tot, 1.0)
    lse = jnp.where(seen, m + jnp.log(safe), -jnp.inf)
    rows = lambda x: x.transpose(0, 2, 1)[..., None]  # noqa: E731  (B, N, T) -> (B, T, N, 1)
    out = (rows(w1) * o1 + rows(w2) * o2) / rows(safe)
    return out, lse


def _empty(q):
    B, T, N, _ = q.shape
    acc_t = jnp.promote_types(q.dtype, F32)
    return jnp.zeros(q.shape, acc_t), jnp.full((B, N, T), -jnp.inf, acc_t)


def _pairs(q, q_ids, k, v, kv_ids, causal, scale, local):
    """Local queries (chunks q_ids) against one key block (chunks kv_ids): merged (out f32, lse)."""
    acc_t = jnp.promote_types(q.dtype, F32)

    def call(q, k, v, c):
        return tuple(x.astype(acc_t) for x in _call_local(local, q, k, v, is_causal=c, scale=scale))

    if not causal:
        return call(q, k, v, False)
    qs, ks, vs = jnp.split(q, len(q_ids), axis=1), jnp.split(k, len(kv_ids), axis=1), jnp.split(v, len(kv_ids), axis=1)
    branches = (lambda q, k, v: call(q, k, v, False), lambda q, k, v: call(q, k, v, True), lambda q, k, v: _empty(q))
    outs, lses = [], []
    for qc, i in zip(qs, q_ids):
        acc: Any = None
        for kc, vc, j in zip(ks, vs, kv_ids):
            if isinstance(i, int) and isinstance(j, int):  # known while tracing (emulate_ring): no conditional
                part = branches[0 if j < i else 1 if j == i else 2](qc, kc, vc)
            else:  # earlier: all visible; same chunk: causal; later: nothing
                part = lax.switch(jnp.where(j < i, 0, jnp.where(j == i, 1, 2)), branches, qc, kc, vc)
            acc = part if acc is None else merge(acc, part)
        outs.append(acc[0])
        lses.append(acc[1])
    return jnp.concatenate(outs, axis=1), jnp.concatenate(lses, axis=2)


def _ring(q, k, v, *, axis, devices, layout, causal, scale, local, local_bwd=None):
    if local_bwd is None:  # no backward given for this local step: JAX's autodiff through the ring
        return _ring_forward(q, k, v, axis, devices, layout, causal, scale, local)[0].astype(q.dtype)
    return _ring_vjp(q, k, v, axis, devices, layout, causal, scale, local, local_bwd)


def _ring_forward(q, k, v, axis, devices, layout, causal, scale, local):
    """(out, lse) over all P blocks of keys: P steps, each block passed on before this step's compute."""
    me = lax.axis_index(axis)
    perm = [(d, (d + 1) % devices) for d in range(devices)]
    acc, kv = None, (k, v)
    for step in range(devices):
        nxt = lax.ppermute(kv, axis, perm) if step < devices - 1 else None  # issued before this step's compute
        src = (me - step) % devices  # whose K/V block this device holds now
        part = _pairs(
            q,
            device_chunks(me, devices, layout),
            *kv,
            device_chunks(src, devices, layout),
            causal,
            scale,  # type: ignore[call-arg, misc]
            local,
        )
        acc = part if acc is None else merge(acc, part)
        kv = nxt
    return acc


@functools.partial(jax.custom_vjp, nondiff_argnums=tuple(range(3, 10)))
def _ring_vjp(q, k, v, axis, devices, layout, causal, scale, local, local_bwd):
    return _ring_forward(q, k, v, axis, devices, layout, causal, scale, local)[0].astype(q.dtype)


def _ring_vjp_fwd(q, k, v, axis, devices, layout, causal, scale, local, local_bwd):
    out, lse = _ring_forward(q, k, v, axis, devices, layout, causal, scale, local)
    return out.astype(q.dtype), (q, k, v, out, lse)


def _ring_vjp_bwd(axis, devices, layout, causal, scale, local, local_bwd, res, d_out):
    """The ring backward: K/V go around again, and their dK/dV accumulators travel with them.

    Each device adds its queries' contribution to the block it holds (from the merged out and lse, so no
    partial results are kept); after P steps one more hop brings each dK/dV home. K/V memory stays O(T/P).
    """
    q, k, v, out, lse = res
    me = lax.axis_index(axis)
    perm = [(d, (d + 1) % devices) for d in range(devices)]
    acc_t = out.dtype
    dq = jnp.zeros(q.shape, acc_t)
    kv, dkv = (k, v), (jnp.zeros(k.shape, acc_t), jnp.zeros(v.shape, acc_t))
    for step in range(devices):
        nxt = lax.ppermute(kv, axis, perm) if step < devices - 1 else None
        src = (me - step) % devices
        dq_s, dk_s, dv_s = _pairs_bwd(
            q,
            device_chunks(me, devices, layout),
            *kv,
            device_chunks(src, devices, layout),  # type: ignore[call-arg, misc]
            out,
            lse,
            d_out,
            causal,
            scale,
            local_bwd,
        )
        dq = dq + dq_s
        dkv = lax.ppermute((dkv[0] + dk_s, dkv[1] + dv_s), axis, perm)  # on to the block's next holder; last: home
        kv = nxt
    return dq.astype(q.dtype), dkv[0].astype(k.dtype), dkv[1].astype(v.dtype)


_ring_vjp.defvjp(_ring_vjp_fwd, _ring_vjp_bwd)


def _pairs_bwd(q, q_ids, k, v, kv_ids, out, lse, d_out, causal, scale, local_bwd):
    """(dq, dk, dv) of the local queries against one key block, from the merged out and lse (float32)."""
    acc_t = out.dtype
    call = lambda q, k, v, o, l, do, c: tuple(  # noqa: E731
        x.astype(acc_t) for x in _call_local_bwd(local_bwd, q, k, v, o, l, do, is_causal=c, scale=scale)
    )
    if not causal:
        return call(q, k, v, out, lse, d_out, False)
    n, m = len(q_ids), len(kv_ids)
    qs, os_, dos = jnp.split(q, n, axis=1), jnp.split(out, n, axis=1), jnp.split(d_out, n, axis=1)
    ls = jnp.split(lse, n, axis=2)
    ks, vs = jnp.split(k, m, axis=1), jnp.split(v, m, axis=1)

    def none(q, k, v, o, l, do):
        return jnp.zeros(q.shape, acc_t), jnp.zeros(k.shape, acc_t), jnp.zeros(v.shape, acc_t)

    branches = (lambda *a: call(*a, False), lambda *a: call(*a, True), none)  # type: ignore[call-arg]
    dqs, dks, dvs = [], [jnp.zeros(x.shape, acc_t) for x in ks], [jnp.zeros(x.shape, acc_t) for x in vs]
    for a, i in enumerate(q_ids):
        dq_a = jnp.zeros(qs[a].shape, acc_t)
        for b, j in enumerate(kv_ids):
            which = jnp.where(j < i, 0, jnp.where(j == i, 1, 2))
            g = lax.switch(which, branches, qs[a], ks[b], vs[b], os_[a], ls[a], dos[a])
            dq_a, dks[b], dvs[b] = dq_a + g[0], dks[b] + g[1], dvs[b] + g[2]
        dqs.append(dq_a)
    return jnp.concatenate(dqs, axis=1), jnp.concatenate(dks, axis=1), jnp.concatenate(dvs, axis=1)


def blockwise_local_bwd(q, k, v, out, lse, d_out, *, is_causal: bool, scale: float, block: int = 512):
    """The default local step's backward: blockwise's, from a (merged) output and log-sum-exp."""
    return blockwise_backward(q, k, v, out, lse, d_out, is_causal=is_causal, scale=scale, block_q=block, block_k=block)


def mosaic_local(q, k, v, *, is_causal: bool, scale: float):
    """Our Mosaic GPU kernel as the local step (Hopper; bf16/f16, H 64 or 128): (out, lse)."""
    from .mosaic import mosaic_flash_attention

    return mosaic_flash_attention(q, k, v, is_causal=is_causal, scale=scale, return_lse=True)


def mosaic_local_bwd(q, k, v, out, lse, d_out, *, is_causal: bool, scale: float):
    """Its backward from a (merged) output and log-sum-exp: our Mosaic GPU backward kernels."""
    from .mosaic import mosaic_flash_backward

    return mosaic_flash_backward(q, k, v, out, lse, d_out, is_causal=is_causal, scale=scale)


def local_steps(name: str, *, block: int = 512) -> tuple:
    """(local, local_bwd) by name: "blockwise" (any device; ``block`` its tile) or "mosaic" (our Hopper kernel)."""
    if name == "blockwise":
        b = check_block_size("block", block)
        return functools.partial(blockwise_local, block=b), functools.partial(blockwise_local_bwd, block=b)
    if name == "mosaic":
        return mosaic_local, mosaic_local_bwd
    raise ValueError(f"local step must be one of {LOCAL_STEPS}; got {name!r}.")


def _check_steps(local, local_bwd) -> None:
    for name, fn in (("local", local), ("local_bwd", local_bwd)):
        if fn is not None and not callable(fn):
            raise ValueError(
                f"{name} must be a function or None; got {type(fn).__name__} {fn!r:.60}. See local_steps(name) for "
                "the built-in ones."
            )


def _allgather(q, k, v, *, axis, devices, layout, causal, scale, local):
    k_all = lax.all_gather(k, axis, axis=1, tiled=True)  # (B, S, K, H), device-major layout order
    v_all = lax.all_gather(v, axis, axis=1, tiled=True)
    if not causal:
        return _call_local(local, q, k_all, v_all, is_causal=False, scale=scale)[0]
    me = lax.axis_index(axis)
    blocks = lambda x: x.reshape(x.shape[0], devices, -1, *x.shape[2:]).swapaxes(0, 1)  # noqa: E731

    def step(acc, xs):
        kb, vb, src = xs
        part = _pairs(
            q, device_chunks(me, devices, layout), kb, vb, device_chunks(src, devices, layout), True, scale, local
        )
        return merge(acc, part), None

    (out, _), _ = lax.scan(step, _empty(q), (blocks(k_all), blocks(v_all), jnp.arange(devices)))
    return out.astype(q.dtype)


def context_parallel_attention(
    q,
    k,
    v,
    *,
    mesh: Mesh,
    axis: str = "seq",
    strategy: str = "ring",
    is_causal: bool = False,
    layout: str = "zigzag",
    scale: float | None = None,
    local=None,
    local_bwd=None,
    block: int = 512,
    reorder: bool = True,
) -> jax.Array:
    """Attention with the sequence of q, k, v sharded over ``mesh`` axis ``axis``; q (B, T, N, H) -> (B, T, N, H).

    ``strategy``: "ring" or "allgather". ``layout``: "zigzag" (balanced under a causal mask) or "contiguous".
    ``reorder``: put the tokens into the layout's order (:func:`layout_permutation`) and the output back; a
    training loop keeps its data in that order instead and passes ``reorder=False`` (no extra data movement).
    ``local(q, k, v, *, is_causal, scale) -> (out, lse)``: the per-device step (default blockwise, ``block``);
    ``local_bwd(q, k, v, out, lse, d_out, *, is_causal, scale) -> (dq, dk, dv)`` its backward from a merged out
    and lse, for the ring's own backward pass (default: blockwise's with the default local step; without one,
    JAX's autodiff runs through the ring).
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    scale = resolve_scale(scale, H)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}; got {strategy!r}.")
    is_causal, reorder = check_flag("is_causal", is_causal), check_flag("reorder", reorder)
    _check_steps(local, local_bwd)
    check_scores_fit(q, k, scale, what="the ring's log-sum-exp merges")
    if not isinstance(mesh, Mesh):
        raise ValueError(
            f"mesh must be a jax.sharding.Mesh; got {type(mesh).__name__}. Make one with sequence_mesh(P)."
        )
    if axis not in mesh.axis_names:
        raise ValueError(f"mesh has no axis {axis!r}; its axes are {mesh.axis_names}. Pass axis=<one of them>.")
    if is_causal and T != S:
        raise ValueError(f"causal context parallelism needs T == S (self-attention); got q {q.shape}, k {k.shape}.")
    devices = mesh.shape[axis]
    for name, n in (("T", T), ("S", S)):
        if n % (devices * chunks_per_device(layout)):
            raise ValueError(
                f"sequence length {name}={n} must be a multiple of {devices * chunks_per_device(layout)} "
                f"({devices} devices on axis {axis!r} × {chunks_per_device(layout)} chunk(s) each for the {layout} "
                f"layout); got q {q.shape}, k {k.shape}. Pad the sequence or change the number of devices."
            )
    extra = {"local_bwd": local_bwd} if strategy == "ring" else {}
    if local is None:
        chunk = T // (devices * chunks_per_device(layout))
        local = functools.partial(blockwise_local, block=min(check_block_size("block", block), chunk))
        if strategy == "ring" and local_bwd is None:
            extra["local_bwd"] = functools.partial(blockwise_local_bwd, block=local.keywords["block"])
    body: Callable = functools.partial(
        _ring if strategy == "ring" else _allgather,
        axis=axis,
        devices=devices,
        layout=layout,
        causal=is_causal,
        scale=scale,
        local=local,
        **extra,
    )
    spec = PartitionSpec(None, axis, None, None)
    sharded = _shard_map(body, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, **_UNCHECKED)
    if not reorder:
        return sharded(q, k, v)
    pq, pk = layout_permutation(T, devices, layout), layout_permutation(S, devices, layout)
    out = sharded(q[:, pq], k[:, pk], v[:, pk])
    return out[:, np.argsort(pq)]


def emulate_ring(
    q,
    k,
    v,
    *,
    devices: int,
    is_causal: bool = False,
    layout: str = "zigzag",
    scale: float | None = None,
    local=None,
    block: int = 512,
) -> jax.Array:
    """All P devices' ring steps run one after another on one device (local compute and LSE merges, no transfer).

    What a ring costs in compute alone, to set against one call on the whole sequence. ``devices`` (P) is the number
    of ring steps emulated; ``local`` as in :func:`context_parallel_attention`.
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    scale = resolve_scale(scale, H)
    devices = check_int("devices", devices, minimum=1, example="4")
    is_causal = check_flag("is_causal", is_causal)
    _check_steps(local, None)
    check_scores_fit(q, k, scale, what="the ring's log-sum-exp merges")
    if is_causal and T != S:
        raise ValueError(f"a causal ring needs T == S (self-attention); got q {q.shape}, k {k.shape}.")
    pq, pk = layout_permutation(T, devices, layout), layout_permutation(S, devices, layout)
    if local is None:
        chunk = T // (devices * chunks_per_device(layout))
        local = functools.partial(blockwise_local, block=min(check_block_size("block", block), chunk))
    qs = jnp.split(q[:, pq], devices, axis=1)
    ks, vs = jnp.split(k[:, pk], devices, axis=1), jnp.split(v[:, pk], devices, axis=1)
    outs = []
    for d in range(devices):
        acc: Any = None
        for step in range(devices):
            src = (d - step) % devices
            part = _pairs(
                qs[d],
                device_chunks(d, devices, layout),
                ks[src],
                vs[src],
                device_chunks(src, devices, layout),
                is_causal,
                scale,
                local,
            )
            acc = part if acc is None else merge(acc, part)
        outs.append(acc[0])
    return jnp.concatenate(outs, axis=1)[:, np.argsort(pq)].astype(q.dtype)


def sequence_mesh(devices: int | None = None, axis: str = "seq") -> Mesh:
    """A one-axis mesh over the first ``devices`` devices (all by default)."""
    avail = jax.devices()
    n = len(avail) if devices is None else check_int("devices", devices, minimum=1, example="2")
    if n > len(avail):
        raise ValueError(
            f"asked for {n} devices; this process has {len(avail)} ({avail[0].platform}). On a CPU, set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before importing jax."
        )
    return Mesh(np.array(avail[:n]), (axis,))
