"""The backward at H = 256: FlashAttention-3's split of the head dim across the two compute warpgroups.

Up to H = 128 each compute warpgroup of a backward kernel owns rows of its own (keys in the dK/dV kernel, queries in
the dQ kernel) and holds their float32 accumulators whole: dK and dV of 64 keys at H = 128 take 2 × 64 × 128 / 128 =
128 registers a thread. At H = 256 that is 256, more than a thread has. Here both warpgroups own the same 64 rows,
and each holds one half of the head dim of every accumulator (64 registers each). A step over a visited tile of 64
rows then goes in two halves::

    warpgroup w:  scores and dP of the tile's w-th 32 visited rows (the whole head dim)
                  -> its weights and dS into shared memory (64 × 32 each)   ── one barrier, both halves landed ──
                  -> its half of the head dim of dV, dK (or dQ) from the whole tile (64 × 64) of weights and dS

so the products are the same as in the kernels up to H = 128 (q·kᵀ and dO·vᵀ once, then dV, dK in the dK/dV kernel
and dQ in the dQ kernel: seven a tile pair with dQ in a pass), each split between the two warpgroups. Tiles move in
32-row, 128-column pieces with the 64-byte swizzle: wgmma contracts the 32-row pieces of the weights, and both of its
shared-memory operands must have the same swizzle. dQ comes in a pass of its own (``bwd_dq="pass"``): a float32 share
of dQ (64 queries × 256) to add by atomics would need another 64 registers and 64 KiB of shared memory. The scores
and dP are issued together (``bwd_together``'s order, always here).

Masks as in :mod:`~attention_tutorial.kernels.mosaic.backward`: both warpgroups walk the same tiles
(``Walk(..., shared=True)``), each building the element mask of its half where a tile is kept in part.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from . import masks as M
from ._common import LOG2E, Walk, call, load_vector, query_cta, regions, slot_of
from ._common import copy_ring as _copy_ring
from ._common import swizzled_tiles as _tiles
from .backward import _list_scratch, _mask_refs, _with_head, recompute_p
from .budget import copy_registers

HALF = 128  # head-dim columns per warpgroup
PIECE = 32  # visited rows per warpgroup in a step (half of a 64-row tile)
SWIZZLE = 64  # bytes: a 32-row piece is wgmma's contraction (32 rows of 16 bits need the 64-byte swizzle)


def _pieces():
    return _tiles(SWIZZLE)


class SplitDqScratch(NamedTuple):
    q: Any  # (2, bq, HALF): the CTA's queries by head-dim half (dQ leaves through them)
    do: Any  # (2, bq, HALF)
    lse: Any  # (bq,) float32
    delta: Any  # (bq,) float32
    k: Any  # (stages, 2, 2, PIECE, HALF) ring: [slot, key half, head-dim half]
    v: Any  # (stages, 2, 2, PIECE, HALF)
    ds: Any  # (2, bq, PIECE): each warpgroup's dS, by key half
    rows_ready: Any  # q, dO, lse, delta (and segment ids) landed
    k_ready: Any  # (stages,) (k and its segment ids)
    v_ready: Any
    k_free: Any  # (stages,), two arrivals
    v_free: Any
    ds_ready: Any  # both warpgroups' dS written (two arrivals)
    ds_free: Any  # both warpgroups done reading dS (two arrivals)
    tiles: Any = None
    tiles_ready: Any = None
    q_segment: Any = None  # (bq,) int32
    kv_segment: Any = None  # (stages, 2, PIECE) int32


def split_dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, plan):
    """dQ: the CTA owns ``plan.own`` query rows, both warpgroups walking the key tiles they see; warpgroup w makes
    dS for the tile's w-th 32 keys and dQ's w-th half of the head dim."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    cfg, mask, stages, bq = plan.cfg, plan.mask, plan.stages, plan.own
    *ins, dq_ref, scratch = refs
    tiles_ref, q_seg_ref, kv_seg_ref = _mask_refs(plan, ins)
    dtype = q_ref.dtype
    batch, head, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
    cta = query_cta(cfg, q_ref.shape[1], bq)
    row0 = cta * bq
    region = regions(plan.probe.profiling)
    c = plan.scale * LOG2E
    walk = Walk(mask, scratch, row0, own=bq, visit=plan.visit, stages=stages, padded=plan.padded, shared=True)
    rows = pl.ds(row0, bq)

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(cfg.bwd_registers, action="increase")
        ready = scratch.rows_ready

        @pl.when(wg == 0)
        def _load():
            for h in (0, 1):
                cols = pl.ds(h * HALF, HALF)
                plgpu.copy_gmem_to_smem(q_ref.at[batch, rows, head, cols], scratch.q.at[h], ready)
                plgpu.copy_gmem_to_smem(do_ref.at[batch, rows, head, cols], scratch.do.at[h], ready)
            plgpu.copy_gmem_to_smem(lse_ref.at[batch, head, rows], scratch.lse, ready)
            plgpu.copy_gmem_to_smem(delta_ref.at[batch, head, rows], scratch.delta, ready)
            if mask.segments:
                plgpu.copy_gmem_to_smem(q_seg_ref.at[batch, rows], scratch.q_segment, ready)

        with region("wait"):
            plgpu.barrier_wait(ready)
        lse = load_vector(scratch.lse, plgpu.Layout.WGMMA.reduce(1))
        delta = load_vector(scratch.delta, plgpu.Layout.WGMMA.reduce(1))
        q_segment = load_vector(scratch.q_segment, plgpu.Layout.WGMMA.reduce(1)) if mask.segments else None
        scalars = walk.scalars()
        dq = plgpu.layout_cast(jnp.full((bq, HALF), 0.0, jnp.float32), plgpu.Layout.WGMMA)
        plgpu.barrier_arrive(scratch.ds_free)  # dS's buffer starts free

        def step(t, dq, masked=False, look_ahead=None):
            slot = slot_of(t, stages)
            with region("wait"):
                plgpu.barrier_wait(scratch.k_ready.at[slot])
                plgpu.barrier_wait(scratch.v_ready.at[slot])

            def scores(s_ref, dp_ref):  # s = q kᵀ, dP = dO vᵀ over this warpgroup's 32 keys, the whole head dim
                for h in (0, 1):
                    plgpu.wgmma(s_ref, scratch.q.at[h], scratch.k.at[slot, wg, h].transpose((1, 0)))
                for h in (0, 1):
                    plgpu.wgmma(dp_ref, scratch.do.at[h], scratch.v.at[slot, wg, h].transpose((1, 0)))
                s = plgpu.wgmma_accumulator_load(s_ref, wait_n=2)  # dP may still be running
                keep = None
                if masked:
                    kv_segment = None
                    if mask.segments:
                        kv_segment = load_vector(scratch.kv_segment.at[slot, wg], plgpu.Layout.WGMMA.reduce(0))
                    col0 = walk.block_of(t) * plan.visit + wg * PIECE
                    keep = M.tile_kept(
                        plan.kept, s.shape, row0, col0, q_segment=q_segment, kv_segment=kv_segment, scalars=scalars
                    )
                p, dcap = recompute_p(s, lse, c, mask.softcap, 0, keep)
                return p, dcap, dp_ref[...]

            with region("qk"):
                p, dcap, dp = pl.run_scoped(scores, plgpu.ACC((bq, PIECE)), plgpu.ACC((bq, PIECE)))
            plgpu.barrier_arrive(scratch.v_free.at[slot])
            with region("softmax"):
                ds = p * (dp - lax.broadcast_in_dim(delta, dp.shape, [0]))
                ds = (ds if dcap is None else ds * dcap).astype(dtype)
            _exchange(scratch, region, wg, ((scratch.ds, ds),))

            def dsk(dq_ref):  # dQ's half += dS k: the whole tile's 64 keys, in two 32-key pieces
                for kh in (0, 1):
                    plgpu.wgmma(dq_ref, scratch.ds.at[kh], scratch.k.at[slot, kh, wg])

            with region("grads"):
                dq = pl.run_state(dsk)(plgpu.ACC.init(dq))
            plgpu.barrier_arrive(scratch.ds_free)
            plgpu.barrier_arrive(scratch.k_free.at[slot])
            return dq

        readies = (scratch.k_ready, scratch.v_ready)
        dq = walk.loops(
            step, dq, row0, frees=(scratch.k_free, scratch.v_free), readies=readies, trailing_readies=readies
        )
        out = scratch.q.at[wg]  # the other warpgroup read our half of q last before the last step's barrier
        out[...] = (dq * plan.scale).astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out, dq_ref.at[batch, rows, head, pl.ds(wg * HALF, HALF)])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _copy():
        plgpu.set_max_registers(copy_registers(cfg.bwd_registers), action="decrease")
        kv_head = lax.div(head, jnp.array(plan.groups, head.dtype))
        steps = walk.copy_steps(tiles_ref, batch, cta)

        def pieces(src, dst, t, slot, ready, segments=False):
            for kh in (0, 1):
                keys = pl.ds(walk.block_of(t) * plan.visit + kh * PIECE, PIECE)
                for h in (0, 1):
                    plgpu.copy_gmem_to_smem(
                        src.at[batch, keys, kv_head, pl.ds(h * HALF, HALF)], dst.at[slot, kh, h], ready
                    )
                if segments:
                    plgpu.copy_gmem_to_smem(kv_seg_ref.at[batch, keys], scratch.kv_segment.at[slot, kh], ready)

        def copy_k(t, slot):
            pieces(k_ref, scratch.k, t, slot, scratch.k_ready.at[slot], segments=mask.segments)

        def copy_v(t, slot):
            pieces(v_ref, scratch.v, t, slot, scratch.v_ready.at[slot])

        _copy_ring(
            ((scratch.k_free, copy_k), (scratch.v_free, copy_v)), stages=stages, steps=steps, region=region, guard=True
        )


class SplitDkvScratch(NamedTuple):
    k: Any  # (2, bkv, HALF): the CTA's keys by head-dim half (dK leaves through them)
    v: Any  # (2, bkv, HALF) (dV leaves through them)
    q: Any  # (stages, 2, 2, PIECE, HALF) ring: [slot, query half, head-dim half]
    do: Any  # (stages, 2, 2, PIECE, HALF)
    lse: Any  # (stages, 2, PIECE) float32
    delta: Any  # (stages, 2, PIECE) float32
    pt: Any  # (2, bkv, PIECE): each warpgroup's Pᵀ, by query half
    ds: Any  # (2, bkv, PIECE): each warpgroup's dSᵀ
    kv_ready: Any  # k, v (and segment ids) landed
    tile_ready: Any  # (stages,): q, dO, lse, delta (and segment ids) of a slot landed
    tile_free: Any  # (stages,), two arrivals
    ds_ready: Any  # both warpgroups' Pᵀ and dSᵀ written (two arrivals)
    ds_free: Any  # both warpgroups done reading them (two arrivals)
    tiles: Any = None
    tiles_ready: Any = None
    q_segment: Any = None  # (stages, 2, PIECE) int32
    kv_segment: Any = None  # (bkv,) int32


def split_dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, plan):
    """dK, dV: the CTA owns ``plan.own`` keys of one kv head, both warpgroups walking, for each query head sharing
    it, the query tiles that see them; warpgroup w makes Pᵀ and dSᵀ for the tile's w-th 32 queries and dK's and
    dV's w-th half of the head dim."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    cfg, stages, bkv, bq = plan.cfg, plan.stages, plan.own, plan.visit
    *ins, dk_ref, dv_ref, scratch = refs
    tiles_ref, q_seg_ref, kv_seg_ref = _mask_refs(plan, ins)
    mask = plan.mask  # for lists: queries are rows, keys columns; for a band: transposed
    dtype = q_ref.dtype
    batch, kv_head, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
    cta = lax.axis_index("kv_seq")
    key0 = cta * bkv
    region = regions(plan.probe.profiling)
    c = plan.scale * LOG2E
    walk = Walk(mask, scratch, key0, own=bkv, visit=bq, stages=stages, padded=plan.padded, shared=True)
    seq_kv = mask.seq_q if not plan.lists else mask.seq_kv  # keys are the band's rows when transposed
    keys = pl.ds(key0, bkv)

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(cfg.bwd_registers, action="increase")

        @pl.when(wg == 0)
        def _load():
            for h in (0, 1):
                cols = pl.ds(h * HALF, HALF)
                plgpu.copy_gmem_to_smem(k_ref.at[batch, keys, kv_head, cols], scratch.k.at[h], scratch.kv_ready)
                plgpu.copy_gmem_to_smem(v_ref.at[batch, keys, kv_head, cols], scratch.v.at[h], scratch.kv_ready)
            if mask.segments:
                plgpu.copy_gmem_to_smem(kv_seg_ref.at[batch, keys], scratch.kv_segment, scratch.kv_ready)

        with region("wait"):
            plgpu.barrier_wait(scratch.kv_ready)
        kv_segment = None
        if mask.segments:
            kv_segment = load_vector(scratch.kv_segment, plgpu.Layout.WGMMA.reduce(1))
        scalars = walk.scalars()  # (waits for the tile list)
        n_visit = walk.n_steps  # query tiles this CTA walks, per query head: read once the list has landed
        zeros = jnp.full((bkv, HALF), 0.0, jnp.float32)
        dk = plgpu.layout_cast(zeros, plgpu.Layout.WGMMA)
        dv = plgpu.layout_cast(zeros, plgpu.Layout.WGMMA)
        plgpu.barrier_arrive(scratch.ds_free)  # Pᵀ's and dSᵀ's buffers start free

        def step(t, carry, masked=False, g=None):
            dk, dv = carry
            slot = slot_of(g * n_visit + t, stages)  # the pipeline step over (query head, query tile)
            with region("wait"):
                plgpu.barrier_wait(scratch.tile_ready.at[slot])

            def scores(s_ref, dpt_ref):  # sᵀ = k qᵀ, dPᵀ = v dOᵀ: (keys, this warpgroup's 32 queries)
                for h in (0, 1):
                    plgpu.wgmma(s_ref, scratch.k.at[h], scratch.q.at[slot, wg, h].transpose((1, 0)))
                for h in (0, 1):
                    plgpu.wgmma(dpt_ref, scratch.v.at[h], scratch.do.at[slot, wg, h].transpose((1, 0)))
                st = plgpu.wgmma_accumulator_load(s_ref, wait_n=2)  # dPᵀ may still be running
                keep = None
                if masked:
                    q_segment = None
                    if mask.segments:
                        q_segment = load_vector(scratch.q_segment.at[slot, wg], plgpu.Layout.WGMMA.reduce(0))
                    row0 = walk.block_of(t) * bq + wg * PIECE
                    keep = M.tile_kept(
                        plan.kept,
                        st.shape,
                        row0,
                        key0,
                        keys_axis=0,
                        q_segment=q_segment,
                        kv_segment=kv_segment,
                        scalars=scalars,
                    )
                lse = load_vector(scratch.lse.at[slot, wg], plgpu.Layout.WGMMA.reduce(0))
                pt, dcap = recompute_p(st, lse, c, mask.softcap, 1, keep)
                return pt, dcap, dpt_ref[...]

            with region("qk"):
                pt, dcap, dpt = pl.run_scoped(scores, plgpu.ACC((bkv, PIECE)), plgpu.ACC((bkv, PIECE)))
            with region("softmax"):
                delta = load_vector(scratch.delta.at[slot, wg], plgpu.Layout.WGMMA.reduce(0))
                dst = pt * (dpt - lax.broadcast_in_dim(delta, dpt.shape, [1]))
                dst = (dst if dcap is None else dst * dcap).astype(dtype)  # dSᵀ
            _exchange(scratch, region, wg, ((scratch.pt, pt.astype(dtype)), (scratch.ds, dst)))

            def grads(refs):  # dK's and dV's halves from the whole tile's 64 queries, in two 32-query pieces
                dk_ref, dv_ref = refs
                for qh in (0, 1):
                    plgpu.wgmma(dv_ref, scratch.pt.at[qh], scratch.do.at[slot, qh, wg])  # dV += Pᵀ dO
                    plgpu.wgmma(dk_ref, scratch.ds.at[qh], scratch.q.at[slot, qh, wg])  # dK += dSᵀ q

            with region("grads"):
                dk, dv = pl.run_state(grads)((plgpu.ACC.init(dk), plgpu.ACC.init(dv)))
            plgpu.barrier_arrive(scratch.ds_free)
            plgpu.barrier_arrive(scratch.tile_free.at[slot])
            return dk, dv

        def one_head(g, carry):
            return walk.loops(
                functools.partial(_with_head, step, g),
                carry,
                key0,
                frees=(scratch.tile_free,),
                readies=(scratch.tile_ready,),
                trailing_readies=(scratch.tile_ready,),
                offset=g * n_visit,
                ragged_owner=seq_kv % bkv != 0,
            )

        dk, dv = lax.fori_loop(0, plan.groups, one_head, (dk, dv))
        # k and v were read last by the scores, before the last step's barrier: both warpgroups are past it
        k_out, v_out = scratch.k.at[wg], scratch.v.at[wg]
        k_out[...] = (dk * plan.scale).astype(dtype)
        v_out[...] = dv.astype(dtype)
        plgpu.commit_smem()
        cols = pl.ds(wg * HALF, HALF)
        plgpu.copy_smem_to_gmem(k_out, dk_ref.at[batch, keys, kv_head, cols])
        plgpu.copy_smem_to_gmem(v_out, dv_ref.at[batch, keys, kv_head, cols])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _copy():
        plgpu.set_max_registers(copy_registers(cfg.bwd_registers), action="decrease")
        steps = walk.copy_steps(tiles_ref, batch, cta)  # per query head

        def copy_tile(t, slot):
            g, i = lax.div(t, jnp.maximum(steps, 1)), lax.rem(t, jnp.maximum(steps, 1))
            head = kv_head * plan.groups + g
            ready = scratch.tile_ready.at[slot]
            for qh in (0, 1):
                rows = pl.ds(walk.block_of(i) * bq + qh * PIECE, PIECE)
                for h in (0, 1):
                    cols = pl.ds(h * HALF, HALF)
                    plgpu.copy_gmem_to_smem(q_ref.at[batch, rows, head, cols], scratch.q.at[slot, qh, h], ready)
                    plgpu.copy_gmem_to_smem(do_ref.at[batch, rows, head, cols], scratch.do.at[slot, qh, h], ready)
                plgpu.copy_gmem_to_smem(lse_ref.at[batch, head, rows], scratch.lse.at[slot, qh], ready)
                plgpu.copy_gmem_to_smem(delta_ref.at[batch, head, rows], scratch.delta.at[slot, qh], ready)
                if mask.segments:
                    plgpu.copy_gmem_to_smem(q_seg_ref.at[batch, rows], scratch.q_segment.at[slot, qh], ready)

        _copy_ring(
            ((scratch.tile_free, copy_tile),), stages=stages, steps=plan.groups * steps, region=region, guard=True
        )


def _exchange(scratch, region, wg, parts):
    """Put this warpgroup's halves (``parts``: (buffer, value) pairs) where both warpgroups read them, once the
    last step's reads are done, and wait until the other warpgroup's halves are there too."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    with region("wait"):
        plgpu.barrier_wait(scratch.ds_free)
    for buffer, value in parts:
        buffer.at[wg][...] = value
    plgpu.commit_smem()
    plgpu.barrier_arrive(scratch.ds_ready)
    with region("wait"):
        plgpu.barrier_wait(scratch.ds_ready)


def backward(args, mask_in, *, mask, plans, groups_shape, dtype, profile):
    """(dq, dk, dv) at H = 256: the dQ kernel, then the dK/dV kernel, each split by the head dim. ``args``: q, k,
    v, dO and the padded lse and D; ``mask_in``: (dQ kernel's, dK/dV kernel's) mask inputs; ``plans``: their
    :class:`~attention_tutorial.kernels.mosaic.backward.Plan`; ``groups_shape``: (B, T, S, N, K, H)."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    B, T, S, N, K, H = groups_shape
    q, k = args[0], args[1]
    segments = mask.segments
    dq_plan, dkv_plan = plans
    bq, bkv = dq_plan.own, dq_plan.visit
    stages = dq_plan.stages
    lists = _list_scratch(dq_plan, segments, q_rows=(bq,), kv_rows=(stages, 2, PIECE))
    scratch = SplitDqScratch(
        q=plgpu.SMEM((2, bq, HALF), dtype, transforms=_pieces()),
        do=plgpu.SMEM((2, bq, HALF), dtype, transforms=_pieces()),
        lse=plgpu.SMEM((bq,), jnp.float32),
        delta=plgpu.SMEM((bq,), jnp.float32),
        k=plgpu.SMEM((stages, 2, 2, PIECE, HALF), dtype, transforms=_pieces()),
        v=plgpu.SMEM((stages, 2, 2, PIECE, HALF), dtype, transforms=_pieces()),
        ds=plgpu.SMEM((2, bq, PIECE), dtype, transforms=_pieces()),
        rows_ready=plgpu.Barrier(num_arrivals=7 if segments else 6),
        k_ready=plgpu.Barrier(num_arrivals=6 if segments else 4, num_barriers=stages),
        v_ready=plgpu.Barrier(num_arrivals=4, num_barriers=stages),
        k_free=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
        v_free=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
        ds_ready=plgpu.Barrier(num_arrivals=2),
        ds_free=plgpu.Barrier(num_arrivals=2),
        **lists,
    )
    dq = call(
        functools.partial(split_dq_kernel, plan=dq_plan),
        jax.ShapeDtypeStruct(q.shape, dtype),
        scratch,
        (N, -(-T // bq), B),
        ("heads", "q_seq", "batch"),
        *args,
        *mask_in[0],
        **profile,
    )
    stages = dkv_plan.stages
    scratch = SplitDkvScratch(
        k=plgpu.SMEM((2, bkv, HALF), dtype, transforms=_pieces()),
        v=plgpu.SMEM((2, bkv, HALF), dtype, transforms=_pieces()),
        q=plgpu.SMEM((stages, 2, 2, PIECE, HALF), dtype, transforms=_pieces()),
        do=plgpu.SMEM((stages, 2, 2, PIECE, HALF), dtype, transforms=_pieces()),
        lse=plgpu.SMEM((stages, 2, PIECE), jnp.float32),
        delta=plgpu.SMEM((stages, 2, PIECE), jnp.float32),
        pt=plgpu.SMEM((2, bkv, PIECE), dtype, transforms=_pieces()),
        ds=plgpu.SMEM((2, bkv, PIECE), dtype, transforms=_pieces()),
        kv_ready=plgpu.Barrier(num_arrivals=5 if segments else 4),
        tile_ready=plgpu.Barrier(num_arrivals=14 if segments else 12, num_barriers=stages),
        tile_free=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
        ds_ready=plgpu.Barrier(num_arrivals=2),
        ds_free=plgpu.Barrier(num_arrivals=2),
        **_list_scratch(dkv_plan, segments, q_rows=(stages, 2, PIECE), kv_rows=(bkv,)),
    )
    out_type = [jax.ShapeDtypeStruct(k.shape, dtype)] * 2
    grid, names = (K, -(-S // bkv), B), ("heads", "kv_seq", "batch")
    kernel = functools.partial(split_dkv_kernel, plan=dkv_plan)
    dk, dv = call(kernel, out_type, scratch, grid, names, *args, *mask_in[1], **profile)
    return dq, dk, dv
