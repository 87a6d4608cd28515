"""The backward: FlashAttention-2's recomputation from the saved log-sum-exp, with FlashAttention-3's Hopper machinery
(after JAX's ``attention_mgpu``), in warp-specialised kernels of two wgmma warpgroups and one TMA warpgroup each.

:func:`dkv_kernel` owns key tiles and accumulates dK, dV over the query tiles (and, for GQA, the query heads) that
see them. dQ comes one of two ways (``MosaicConfig.bwd_dq``). ``"pass"``: :func:`dq_kernel` owns query tiles and
accumulates dQ in a pass of its own — every CTA owns its outputs (deterministic), at the cost of recomputing q·kᵀ
and dO·vᵀ (seven matrix products per tile pair in all). ``"atomic"``: the dK/dV kernel also multiplies each dS by
its keys and adds that share of dQ into a float32 dQ in global memory by TMA reduce-add (five products, float32
traffic, a summation order that varies from run to run; FlashAttention-2's way, which FlashAttention-3 keeps).

Masks as in the forward (:mod:`~attention_tutorial.kernels.mosaic.masks`): tiles a warpgroup keeps in full need no
mask, tiles it keeps in part build the element mask, tiles it keeps nothing of are skipped. Rows past T and keys past S come in as zeros (TMA);
a ragged key tile is always masked, so that no zero key makes a weight that a dQ share would carry.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from . import masks as M
from ._common import (
    LOG2E,
    Walk,
    call,
    call_into,
    load_vector,
    pad_rows,
    padded_rows,
    query_cta,
    regions,
    shared_lowering,
    slot_of,
)
from ._common import copy_ring as _copy_ring
from ._common import swizzled_tiles as _tiles
from .budget import NO_PROBE, MosaicConfig, Probe, copy_registers


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything static about one backward kernel: ``own`` rows per compute warpgroup (queries in the dQ kernel,
    keys in the dK/dV kernel), ``visit`` rows per tile it walks over, the mask as the kernel sees it (the dK/dV
    kernel's band is transposed: keys own, queries visited)."""

    cfg: MosaicConfig
    mask: M.Mask  # how the kernel walks its tiles
    kept: M.Mask  # the mask itself: query rows, key columns (what a partial tile's element mask evaluates)
    own: int
    visit: int
    stages: int
    groups: int
    scale: float
    padded: int = 0
    probe: Probe = NO_PROBE

    @property
    def lists(self) -> bool:
        return self.mask.has_arrays


def recompute_p(s, lse, c, softcap, axis: int, keep=None):
    """The forward's weights P (or Pᵀ) from the raw scores and the saved base-2 log-sum-exp (broadcast along
    ``axis``), 0 where ``keep`` (the tile's element mask, if any) is False; with a softcap also its derivative's
    factor 1 − tanh², else None. The mask comes after the cap: a capped score is finite however small."""
    lse = lax.broadcast_in_dim(lse, s.shape, [axis])
    if softcap is None:
        y, dcap = s * c, None
    else:
        t = jnp.tanh(s * (c / (LOG2E * softcap)))
        y, dcap = t * (softcap * LOG2E), 1.0 - t * t
    if keep is not None:
        y = jnp.where(keep, y, -jnp.inf)
    return jnp.exp2(y - lse), dcap


class DqScratch(NamedTuple):
    q: Any  # (2, bq, H): each warpgroup's queries (its dQ leaves through it)
    do: Any  # (2, bq, H)
    lse: Any  # (2, bq) float32
    delta: Any  # (2, bq) float32
    k: Any  # (stages, bkv, H) ring
    v: Any  # (stages, bkv, H) ring
    rows_ready: Any  # (2,): q, dO, lse, delta (and segment ids) of a warpgroup landed
    k_ready: Any  # (stages,) (k and its segment ids)
    v_ready: Any
    k_free: Any  # (stages,), two arrivals
    v_free: Any
    tiles: Any = None
    tiles_ready: Any = None
    q_segment: Any = None  # (2, bq) int32
    kv_segment: Any = None  # (stages, bkv) int32


def dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, plan: Plan):
    """dQ: each compute warpgroup owns ``plan.own`` query rows and walks the key tiles they see, as the forward
    does. ``refs``: the mask's inputs (tile lists, segment ids), dq, the scratch."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    cfg, mask, stages, bq, bkv = plan.cfg, plan.mask, plan.stages, plan.own, plan.visit
    *ins, dq_ref, scratch = refs
    tiles_ref, q_seg_ref, kv_seg_ref = _mask_refs(plan, ins)
    dtype, head_dim = q_ref.dtype, q_ref.shape[-1]
    batch, head, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
    cta = query_cta(cfg, q_ref.shape[1], 2 * bq)
    cta_rows = cta * (2 * bq)
    region = regions(plan.probe.profiling)
    c = plan.scale * LOG2E
    walk = Walk(plan.mask, scratch, cta_rows, own=plan.own, visit=plan.visit, stages=plan.stages, padded=plan.padded)

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(cfg.bwd_registers, action="increase")
        q_smem, do_smem = scratch.q.at[wg], scratch.do.at[wg]
        row0 = cta_rows + wg * bq
        rows = (batch, pl.ds(row0, bq), head)
        ready = scratch.rows_ready.at[wg]
        plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem, ready)
        plgpu.copy_gmem_to_smem(do_ref.at[rows], do_smem, ready)
        plgpu.copy_gmem_to_smem(lse_ref.at[batch, head, pl.ds(row0, bq)], scratch.lse.at[wg], ready)
        plgpu.copy_gmem_to_smem(delta_ref.at[batch, head, pl.ds(row0, bq)], scratch.delta.at[wg], ready)
        if mask.segments:
            plgpu.copy_gmem_to_smem(q_seg_ref.at[batch, pl.ds(row0, bq)], scratch.q_segment.at[wg], ready)
        with region("wait"):
            plgpu.barrier_wait(ready)
        lse = load_vector(scratch.lse.at[wg], plgpu.Layout.WGMMA.reduce(1))
        delta = load_vector(scratch.delta.at[wg], plgpu.Layout.WGMMA.reduce(1))
        q_segment = load_vector(scratch.q_segment.at[wg], plgpu.Layout.WGMMA.reduce(1)) if mask.segments else None
        scalars = walk.scalars()
        dq = plgpu.layout_cast(jnp.full((bq, head_dim), 0.0, jnp.float32), plgpu.Layout.WGMMA)

        def step(t, dq, masked=False, look_ahead=None):
            slot = slot_of(t, stages)
            with region("wait"):
                plgpu.barrier_wait(scratch.k_ready.at[slot])

            def qk(s_ref):  # s = q kᵀ
                plgpu.wgmma(s_ref, q_smem, scratch.k.at[slot].transpose((1, 0)))
                return s_ref[...]

            def qk_and_dov(s_ref, dp_ref):  # s = q kᵀ and dP = dO vᵀ issued together; s read as soon as it lands
                plgpu.wgmma(s_ref, q_smem, scratch.k.at[slot].transpose((1, 0)))
                plgpu.wgmma(dp_ref, do_smem, scratch.v.at[slot].transpose((1, 0)))
                s = plgpu.wgmma_accumulator_load(s_ref, wait_n=1)  # dP may still be running
                p, dcap = weights(s)
                return p, dcap, dp_ref[...]

            def weights(s):
                keep = None
                if masked:
                    kv_segment = None
                    if mask.segments:
                        kv_segment = load_vector(scratch.kv_segment.at[slot], plgpu.Layout.WGMMA.reduce(0))
                    keep = M.tile_kept(
                        plan.kept,
                        s.shape,
                        row0,
                        walk.block_of(t) * bkv,
                        q_segment=q_segment,
                        kv_segment=kv_segment,
                        scalars=scalars,
                    )
                return recompute_p(s, lse, c, mask.softcap, 0, keep)  # the forward's weights, recomputed

            def dov(dp_ref):  # dP = dO vᵀ
                plgpu.wgmma(dp_ref, do_smem, scratch.v.at[slot].transpose((1, 0)))
                return dp_ref[...]

            if cfg.bwd_together:  # the profiler's "qk" then holds the weights' recomputation too
                with region("wait"):
                    plgpu.barrier_wait(scratch.v_ready.at[slot])
                with region("qk"):
                    p, dcap, dp = pl.run_scoped(qk_and_dov, plgpu.ACC((bq, bkv)), plgpu.ACC((bq, bkv)))
            else:
                with region("qk"):
                    s = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32))
                with region("softmax"):
                    p, dcap = weights(s)
                with region("wait"):
                    plgpu.barrier_wait(scratch.v_ready.at[slot])
                with region("grads"):
                    dp = pl.run_scoped(dov, plgpu.ACC((bq, bkv), jnp.float32))
            plgpu.barrier_arrive(scratch.v_free.at[slot])
            with region("softmax"):
                ds = p * (dp - lax.broadcast_in_dim(delta, dp.shape, [0]))
                ds = (ds if dcap is None else ds * dcap).astype(dtype)

            def dsk(dq_ref):  # dQ += dS k
                plgpu.wgmma(dq_ref, ds, scratch.k.at[slot])

            with region("grads"):
                dq = pl.run_state(dsk)(plgpu.ACC.init(dq))
            plgpu.barrier_arrive(scratch.k_free.at[slot])
            return dq

        readies = (scratch.k_ready, scratch.v_ready)
        dq = walk.loops(
            step, dq, row0, frees=(scratch.k_free, scratch.v_free), readies=readies, trailing_readies=readies
        )
        q_smem[...] = (dq * plan.scale).astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[rows])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _copy():
        plgpu.set_max_registers(copy_registers(cfg.bwd_registers), action="decrease")
        kv_head = lax.div(head, jnp.array(plan.groups, head.dtype))
        steps = walk.copy_steps(tiles_ref, batch, cta)

        def copy_k(t, slot):
            rows = (batch, pl.ds(walk.block_of(t) * bkv, bkv), kv_head)
            plgpu.copy_gmem_to_smem(k_ref.at[rows], scratch.k.at[slot], scratch.k_ready.at[slot])
            if mask.segments:
                plgpu.copy_gmem_to_smem(
                    kv_seg_ref.at[batch, rows[1]], scratch.kv_segment.at[slot], scratch.k_ready.at[slot]
                )

        def copy_v(t, slot):
            rows = (batch, pl.ds(walk.block_of(t) * bkv, bkv), kv_head)
            plgpu.copy_gmem_to_smem(v_ref.at[rows], scratch.v.at[slot], scratch.v_ready.at[slot])

        _copy_ring(
            ((scratch.k_free, copy_k), (scratch.v_free, copy_v)), stages=stages, steps=steps, region=region, guard=True
        )


class DkvScratch(NamedTuple):
    k: Any  # (2, bkv, H): each warpgroup's keys (its dK leaves through it)
    v: Any  # (2, bkv, H) (its dV leaves through it)
    q: Any  # (stages, bq, H) ring of query tiles
    do: Any  # (stages, bq, H)
    lse: Any  # (stages, bq) float32
    delta: Any  # (stages, bq) float32
    kv_ready: Any  # (2,): a warpgroup's k, v (and segment ids) landed
    tile_ready: Any  # (stages,): q, dO, lse, delta (and segment ids) of a slot landed
    tile_free: Any  # (stages,), two arrivals
    ds: Any = None  # (2, bkv, bq): dSᵀ, the left operand of dQ's share (dQ by atomic adds)
    dq: Any = None  # (2, bq, H) float32: dQ's share on its way out; split: (2, 2, bq, H / 2), two buffers each
    ds_ready: Any = None  # split: both warpgroups' dSᵀ written (two arrivals)
    ds_free: Any = None  # split: both warpgroups done reading them (two arrivals)
    dq_staged: Any = None  # split (2,): both halves of a step's share written to a buffer (two arrivals)
    dq_free: Any = None  # split (2,): the copy warpgroup's adds have read a buffer
    tiles: Any = None
    tiles_ready: Any = None
    q_segment: Any = None  # (stages, bq) int32
    kv_segment: Any = None  # (2, bkv) int32


def dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, plan: Plan):
    """dK, dV: each compute warpgroup owns ``plan.own`` keys of one kv head and walks, for each of the N // K
    query heads sharing it (GQA: summed here, in registers), the query tiles that see them. With ``bwd_dq=
    "atomic"`` it also adds each step's share dS·k into a float32 dQ (the first output, zeros coming in).
    ``plan.mask`` is the transposed band (keys own, queries visited) for band masks, the mask itself for lists."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    cfg, stages, bkv, bq = plan.cfg, plan.stages, plan.own, plan.visit
    atomic = cfg.bwd_dq in ("atomic", "split")
    split = cfg.bwd_dq == "split"  # both warpgroups walk every step, each making half the head dim of dQ's share
    *ins, scratch = refs
    if atomic:
        *ins, dq_ref, dk_ref, dv_ref = ins
    else:
        *ins, dk_ref, dv_ref = ins
    tiles_ref, q_seg_ref, kv_seg_ref = _mask_refs(plan, ins)
    mask = plan.mask  # for lists: queries are rows, keys columns; for a band: transposed
    dtype, head_dim = q_ref.dtype, q_ref.shape[-1]
    batch, kv_head, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
    cta = lax.axis_index("kv_seq")
    cta_keys = cta * (2 * bkv)
    region = regions(plan.probe.profiling)
    c = plan.scale * LOG2E
    walk = Walk(
        plan.mask,
        scratch,
        cta_keys,
        own=2 * bkv if split else bkv,  # split: the CTA's keys walked as one
        visit=plan.visit,
        stages=plan.stages,
        padded=plan.padded,
        shared=split,
    )
    seq_kv = mask.seq_q if not plan.lists else mask.seq_kv  # keys are the band's rows when transposed

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(cfg.bwd_registers, action="increase")
        k_smem, v_smem = scratch.k.at[wg], scratch.v.at[wg]
        key0 = cta_keys + wg * bkv
        keys = (batch, pl.ds(key0, bkv), kv_head)
        ready = scratch.kv_ready.at[wg]
        plgpu.copy_gmem_to_smem(k_ref.at[keys], k_smem, ready)
        plgpu.copy_gmem_to_smem(v_ref.at[keys], v_smem, ready)
        if plan.mask.segments:
            plgpu.copy_gmem_to_smem(kv_seg_ref.at[batch, pl.ds(key0, bkv)], scratch.kv_segment.at[wg], ready)
        with region("wait"):
            plgpu.barrier_wait(ready)
        kv_segment = None
        if plan.mask.segments:
            kv_segment = load_vector(scratch.kv_segment.at[wg], plgpu.Layout.WGMMA.reduce(1))
        scalars = walk.scalars()  # (waits for the tile list)
        n_visit = walk.n_steps  # query tiles this CTA walks, per query head: read once the list has landed
        zeros = jnp.full((bkv, head_dim), 0.0, jnp.float32)
        dk = plgpu.layout_cast(zeros, plgpu.Layout.WGMMA)
        dv = plgpu.layout_cast(zeros, plgpu.Layout.WGMMA)
        if split:
            plgpu.barrier_arrive(scratch.ds_free)  # the dSᵀ buffers start free

        def step(t, carry, masked=False, g=None):
            dk, dv = carry
            tt = g * n_visit + t  # the pipeline step over (query head, query tile)
            slot = slot_of(tt, stages)
            with region("wait"):
                plgpu.barrier_wait(scratch.tile_ready.at[slot])
            q_tile, do_tile = scratch.q.at[slot], scratch.do.at[slot]
            jq = walk.block_of(t)

            def kq(s_ref):  # sᵀ = k qᵀ: (keys, queries)
                plgpu.wgmma(s_ref, k_smem, q_tile.transpose((1, 0)))
                return s_ref[...]

            def kq_and_vdo(s_ref, dpt_ref):  # sᵀ and dPᵀ = v dOᵀ issued together; sᵀ read as soon as it lands
                plgpu.wgmma(s_ref, k_smem, q_tile.transpose((1, 0)))
                plgpu.wgmma(dpt_ref, v_smem, do_tile.transpose((1, 0)))
                pt, dcap = weights(plgpu.wgmma_accumulator_load(s_ref, wait_n=1))  # dPᵀ may still be running
                return pt, dcap, dpt_ref[...]

            def weights(st):
                keep = None
                if masked:
                    q_segment = None
                    if plan.mask.segments:
                        q_segment = load_vector(scratch.q_segment.at[slot], plgpu.Layout.WGMMA.reduce(0))
                    keep = M.tile_kept(
                        plan.kept,
                        st.shape,
                        jq * bq,
                        key0,
                        keys_axis=0,
                        q_segment=q_segment,
                        kv_segment=kv_segment,
                        scalars=scalars,
                    )
                lse = load_vector(scratch.lse.at[slot], plgpu.Layout.WGMMA.reduce(0))
                return recompute_p(st, lse, c, plan.mask.softcap, 1, keep)  # Pᵀ

            def dv_and_dpt(refs):  # both matmuls in one group: one wait instead of two
                dv_ref, dpt_ref = refs
                plgpu.wgmma(dv_ref, pt.astype(dtype), do_tile)  # dV += Pᵀ dO
                plgpu.wgmma(dpt_ref, v_smem, do_tile.transpose((1, 0)))  # dPᵀ = v dOᵀ

            if cfg.bwd_together:  # dV goes out with dK (and dQ's share), one wait for all; "qk" holds Pᵀ's making
                with region("qk"):
                    pt, dcap, dpt = pl.run_scoped(kq_and_vdo, plgpu.ACC((bkv, bq)), plgpu.ACC((bkv, bq)))
            else:
                with region("qk"):
                    st = pl.run_scoped(kq, plgpu.ACC((bkv, bq), jnp.float32))
                with region("softmax"):
                    pt, dcap = weights(st)
                dpt0 = plgpu.layout_cast(jnp.full((bkv, bq), 0.0, jnp.float32), plgpu.Layout.WGMMA)
                with region("grads"):
                    dv, dpt = pl.run_state(dv_and_dpt)((plgpu.ACC.init(dv), plgpu.ACC.init(dpt0)))
            with region("softmax"):
                delta = load_vector(scratch.delta.at[slot], plgpu.Layout.WGMMA.reduce(0))
                dst = pt * (dpt - lax.broadcast_in_dim(delta, dpt.shape, [1]))
                dst = (dst if dcap is None else dst * dcap).astype(dtype)  # dSᵀ
            with_dv = cfg.bwd_together  # dV += Pᵀ dO still to issue, in the group below
            if not atomic:

                def dk_step(refs):  # dK += dSᵀ q (and dV += Pᵀ dO)
                    plgpu.wgmma(refs[0], dst, q_tile)
                    if with_dv:
                        plgpu.wgmma(refs[1], pt.astype(dtype), do_tile)

                with region("grads"):
                    accs = (plgpu.ACC.init(dk), plgpu.ACC.init(dv)) if with_dv else (plgpu.ACC.init(dk),)
                    dk, *dvs = pl.run_state(dk_step)(accs)
                plgpu.barrier_arrive(scratch.tile_free.at[slot])
                return dk, (dvs[0] if with_dv else dv)
            if split:
                return split_dq_step(dk, dv, pt, dst, q_tile, do_tile, slot, jq, g, tt)
            ds_smem = scratch.ds.at[wg]

            def dk_and_dq(refs):
                plgpu.wgmma(refs[0], dst, q_tile)  # dK += dSᵀ q
                plgpu.wgmma(refs[1], ds_smem.transpose((1, 0)), k_smem)  # dQ's share: dS k, (queries, H)
                if with_dv:
                    plgpu.wgmma(refs[2], pt.astype(dtype), do_tile)  # dV += Pᵀ dO

            with region("grads"):
                ds_smem[...] = dst  # dS as wgmma's left operand (transposed from shared memory)
                plgpu.commit_smem()
                share0 = plgpu.layout_cast(jnp.full((bq, head_dim), 0.0, jnp.float32), plgpu.Layout.WGMMA)
                accs = (plgpu.ACC.init(dk), plgpu.ACC.init(share0))
                dk, share, *dvs = pl.run_state(dk_and_dq)(accs + ((plgpu.ACC.init(dv),) if with_dv else ()))
                dv = dvs[0] if with_dv else dv
            plgpu.barrier_arrive(scratch.tile_free.at[slot])  # q and dO of this slot are done
            dq_smem = scratch.dq.at[wg]
            with region("dq_add"):  # add this step's float32 share of dQ into dQ in global memory
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last step's share has left dq_smem
                dq_smem[...] = share
                plgpu.commit_smem()
                rows = (batch, pl.ds(jq * bq, bq), kv_head * plan.groups + g)
                plgpu.copy_smem_to_gmem(dq_smem, dq_ref.at[rows], reduction_op="add")
            return dk, dv

        def split_dq_step(dk, dv, pt, dst, q_tile, do_tile, slot, jq, g, tt):
            """dK, dV as ever; dQ's share of this query tile from both warpgroups' keys, this warpgroup's half of the
            head dim: dS (queries × the CTA's 2·bkv keys, both warpgroups' dSᵀ from shared memory) · k[:, half]."""
            half = head_dim // 2
            with region("wait"):
                plgpu.barrier_wait(scratch.ds_free)
            scratch.ds.at[wg][...] = dst
            plgpu.commit_smem()
            plgpu.barrier_arrive(scratch.ds_ready)

            def dk_dv(refs):
                plgpu.wgmma(refs[0], dst, q_tile)  # dK += dSᵀ q
                if cfg.bwd_together:
                    plgpu.wgmma(refs[1], pt.astype(dtype), do_tile)  # dV += Pᵀ dO (issued above otherwise)

            def share_of(ref):
                cols = pl.ds(pl.multiple_of(wg * half, half), half)
                for w in (0, 1):  # dS of each warpgroup's keys times those keys, our half of the head dim
                    plgpu.wgmma(ref, scratch.ds.at[w].transpose((1, 0)), scratch.k.at[w].at[:, cols])
                return ref[...]

            with region("grads"):
                accs = (plgpu.ACC.init(dk), plgpu.ACC.init(dv)) if cfg.bwd_together else (plgpu.ACC.init(dk),)
                dk, *dvs = pl.run_state(dk_dv)(accs)
                dv = dvs[0] if cfg.bwd_together else dv
            plgpu.barrier_arrive(scratch.tile_free.at[slot])  # q and dO of this slot are done
            with region("wait"):
                plgpu.barrier_wait(scratch.ds_ready)
            with region("grads"):
                share = pl.run_scoped(share_of, plgpu.ACC((bq, half), jnp.float32))
            plgpu.barrier_arrive(scratch.ds_free)
            buffer = lax.rem(tt, 2)  # two buffers: the last step's share may still be leaving through the other

            @pl.when(tt >= 2)
            def _():
                with region("wait"):  # the copy warpgroup's add of two steps ago has read this buffer
                    plgpu.barrier_wait(scratch.dq_free.at[buffer])

            with region("dq_add"):
                scratch.dq.at[wg, buffer][...] = share
                plgpu.commit_smem()
            plgpu.barrier_arrive(scratch.dq_staged.at[buffer])  # the copy warpgroup adds it into dQ
            return dk, dv

        def one_head(g, carry):
            return walk.loops(
                functools.partial(_with_head, step, g),
                carry,
                cta_keys if split else key0,  # split: both warpgroups walk the CTA's steps
                frees=(scratch.tile_free,),
                readies=(scratch.tile_ready,),
                trailing_readies=(scratch.tile_ready,),
                offset=g * n_visit,
                ragged_owner=seq_kv % (2 * bkv if split else bkv) != 0,
            )

        dk, dv = lax.fori_loop(0, plan.groups, one_head, (dk, dv))
        if split:  # the other warpgroup's last share read our keys: wait until it is done
            plgpu.barrier_wait(scratch.ds_free)
        k_smem[...] = (dk * plan.scale).astype(dtype)
        v_smem[...] = dv.astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[keys])
        plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[keys])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _copy():
        plgpu.set_max_registers(copy_registers(cfg.bwd_registers), action="decrease")
        steps = walk.copy_steps(tiles_ref, batch, cta)  # per query head

        def head_and_block(t):  # pipeline step t: (query head, query block)
            g, i = lax.div(t, jnp.maximum(steps, 1)), lax.rem(t, jnp.maximum(steps, 1))
            return kv_head * plan.groups + g, walk.block_of(i)

        def copy_tile(t, slot):
            head, jq = head_and_block(t)
            rows = (batch, pl.ds(jq * bq, bq), head)
            ready = scratch.tile_ready.at[slot]
            plgpu.copy_gmem_to_smem(q_ref.at[rows], scratch.q.at[slot], ready)
            plgpu.copy_gmem_to_smem(do_ref.at[rows], scratch.do.at[slot], ready)
            plgpu.copy_gmem_to_smem(lse_ref.at[batch, head, pl.ds(jq * bq, bq)], scratch.lse.at[slot], ready)
            plgpu.copy_gmem_to_smem(delta_ref.at[batch, head, pl.ds(jq * bq, bq)], scratch.delta.at[slot], ready)
            if plan.mask.segments:
                plgpu.copy_gmem_to_smem(q_seg_ref.at[batch, pl.ds(jq * bq, bq)], scratch.q_segment.at[slot], ready)

        def add_share(t):  # split: both halves of step t's share of dQ into dQ in global memory, by TMA reduce-add
            (head, jq), buffer, half = head_and_block(t), lax.rem(t, 2), head_dim // 2
            with region("wait"):
                plgpu.barrier_wait(scratch.dq_staged.at[buffer])
            with region("dq_add"):
                for w in (0, 1):
                    rows = (batch, pl.ds(jq * bq, bq), head, pl.ds(w * half, half))
                    plgpu.copy_smem_to_gmem(scratch.dq.at[w, buffer], dq_ref.at[rows], reduction_op="add")
                plgpu.wait_smem_to_gmem(2, wait_read_only=True)  # step t − 1's adds have read their buffer

            @pl.when(t >= 1)
            def _():
                plgpu.barrier_arrive(scratch.dq_free.at[1 - buffer])

        _copy_ring(
            ((scratch.tile_free, copy_tile),),
            stages=stages,
            steps=plan.groups * steps,
            region=region,
            guard=True,
            after=add_share if split else None,
        )
        if split:
            plgpu.wait_smem_to_gmem(0)


def _with_head(step, g, t, carry, masked=False, look_ahead=None):
    return step(t, carry, masked=masked, g=g)


def _mask_refs(plan: Plan, ins):
    """(tile lists, q segment ids, kv segment ids) among a kernel's inputs (None where the mask has none)."""
    ins = iter(ins)
    tiles = next(ins) if plan.lists else None
    segments = (next(ins), next(ins)) if plan.mask.segments else (None, None)
    return (tiles, *segments)


def _plan(cfg, mask, *, own, visit, n_visit, groups, scale, transposed, probe):
    stages = min(cfg.bwd_stages, groups * n_visit) if transposed else min(cfg.bwd_stages, n_visit)
    kernel_mask = mask.transposed() if transposed and not mask.has_arrays else mask
    return Plan(
        cfg,
        kernel_mask,
        mask,
        own=own,
        visit=visit,
        stages=stages,
        groups=groups,
        scale=scale,
        padded=M.padded_tiles(n_visit) if mask.has_arrays else 0,
        probe=probe,
    )


def _lists(mask, arrays, plan, *, transposed, shared=False, own=None):
    """The mask's inputs to a kernel: the CTAs' tile lists (``own`` rows a warpgroup owns, ``plan.own`` unless
    given; ``shared``: both warpgroups the same ones) and the segment ids."""
    if not mask.has_arrays:
        return ()
    own = own or plan.own
    if transposed:
        grid = M.tile_grid(mask, arrays, block_q=plan.visit, block_kv=own).transpose(0, 2, 1)
    else:
        grid = M.tile_grid(mask, arrays, block_q=own, block_kv=plan.visit)
    out = (M.tile_lists(M.by_cta(grid, shared=shared), arrays, padded=plan.padded),)
    if mask.segments:
        out += (pad_rows(arrays.q_segment, mode="edge"), pad_rows(arrays.kv_segment, mode="edge"))
    return out


@shared_lowering("scale", "cfg", "mask", "probe")
def backward(
    q,
    k,
    v,
    d_out,
    lse2,
    delta,
    arrays: M.MaskArrays,
    *,
    scale: float,
    cfg: MosaicConfig,
    mask: M.Mask,
    probe: Probe = NO_PROBE,
):
    """(dq, dk, dv) from the backward kernels: lse2 (B, N, T) the base-2 log-sum-exp the forward saved (−inf for a
    row that keeps no key), delta (B, N, T) = rowsum(dO ∘ O) (less what a cotangent on the log-sum-exp adds)."""
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    if H > 128:
        _check_split(cfg, H)
    if cfg.bwd_dq == "split" and H != 128:  # each warpgroup's half of dQ's share: whole 64-column tiles of k
        raise ValueError(
            f"MosaicConfig.bwd_dq='split' takes H = 128 (each warpgroup makes a 64-column half of dQ's share); got "
            f"H={H}: use bwd_dq='atomic' or 'pass'."
        )
    lse2 = jnp.where(lse2 == -jnp.inf, 0.0, lse2)  # a row with no key: every weight of it is masked to 0
    pad = [
        (0, 0),
        (0, 0),
        (0, padded_rows(T, 2 * cfg.bwd_block_q) - T),
    ]  # lse and D are loaded a tile of rows at a time
    # rows a multiple of 8 for the copies (zero queries and dO add nothing; the mask stops at S)
    args = (pad_rows(q), pad_rows(k), pad_rows(v), pad_rows(d_out), jnp.pad(lse2, pad), jnp.pad(delta, pad))
    dq, dk, dv = _backward(args, arrays, T, S, N, K, H, cfg=cfg, mask=mask, scale=scale, probe=probe)
    return dq[:, :T], dk[:, :S], dv[:, :S]


def _backward(args, arrays, T, S, N, K, H, *, cfg, mask, scale, probe):
    """The kernels on ``args`` (q, k, v, dO with rows padded, lse and D): (dq, dk, dv) with the padded rows."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    q, k, v = args[:3]
    B = q.shape[0]
    bq, bkv, dt = cfg.bwd_block_q, cfg.bwd_block_kv, q.dtype
    profile = dict(profile_space=probe.profile_space, profile_dir=probe.profile_dir)
    n_q, n_k = -(-T // bq), -(-S // bkv)
    segments = mask.segments

    if H > 128:  # both warpgroups own the same rows, each half the head dim (backward_split)
        from . import backward_split

        common = dict(groups=N // K, scale=scale, probe=probe)
        plans = (
            _plan(cfg, mask, own=bq, visit=bkv, n_visit=n_k, transposed=False, **common),
            _plan(cfg, mask, own=bkv, visit=bq, n_visit=n_q, transposed=True, **common),
        )
        mask_in = tuple(
            _lists(mask, arrays, p, transposed=tr, shared=True) for p, tr in zip(plans, (False, True), strict=True)
        )
        return backward_split.backward(
            args, mask_in, mask=mask, plans=plans, groups_shape=(B, T, S, N, K, H), dtype=dt, profile=profile
        )

    if cfg.bwd_dq == "pass":
        plan = _plan(
            cfg, mask, own=bq, visit=bkv, n_visit=n_k, groups=N // K, scale=scale, transposed=False, probe=probe
        )
        stages = plan.stages
        scratch = DqScratch(
            q=plgpu.SMEM((2, bq, H), dt, transforms=_tiles()),
            do=plgpu.SMEM((2, bq, H), dt, transforms=_tiles()),
            lse=plgpu.SMEM((2, bq), jnp.float32),
            delta=plgpu.SMEM((2, bq), jnp.float32),
            k=plgpu.SMEM((stages, bkv, H), dt, transforms=_tiles()),
            v=plgpu.SMEM((stages, bkv, H), dt, transforms=_tiles()),
            rows_ready=plgpu.Barrier(num_arrivals=5 if segments else 4, num_barriers=2),
            k_ready=plgpu.Barrier(num_arrivals=2 if segments else 1, num_barriers=stages),
            v_ready=plgpu.Barrier(num_barriers=stages),
            k_free=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
            v_free=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
            **_list_scratch(plan, segments, q_rows=(2, bq), kv_rows=(stages, bkv)),
        )
        kernel = functools.partial(dq_kernel, plan=plan)
        dq = call(
            kernel,
            jax.ShapeDtypeStruct(q.shape, dt),
            scratch,
            (N, -(-T // (2 * bq)), B),
            ("heads", "q_seq", "batch"),
            *args,
            *_lists(mask, arrays, plan, transposed=False),
            **profile,
        )

    plan = _plan(cfg, mask, own=bkv, visit=bq, n_visit=n_q, groups=N // K, scale=scale, transposed=True, probe=probe)
    stages = plan.stages
    atomic, split = cfg.bwd_dq in ("atomic", "split"), cfg.bwd_dq == "split"
    f32_tiles = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
    scratch = DkvScratch(
        k=plgpu.SMEM((2, bkv, H), dt, transforms=_tiles()),
        v=plgpu.SMEM((2, bkv, H), dt, transforms=_tiles()),
        q=plgpu.SMEM((stages, bq, H), dt, transforms=_tiles()),
        do=plgpu.SMEM((stages, bq, H), dt, transforms=_tiles()),
        lse=plgpu.SMEM((stages, bq), jnp.float32),
        delta=plgpu.SMEM((stages, bq), jnp.float32),
        kv_ready=plgpu.Barrier(num_arrivals=3 if segments else 2, num_barriers=2),
        tile_ready=plgpu.Barrier(num_arrivals=5 if segments else 4, num_barriers=stages),
        tile_free=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
        ds=plgpu.SMEM((2, bkv, bq), dt, transforms=_tiles()) if atomic else None,
        dq=plgpu.SMEM((2, 2, bq, H // 2) if split else (2, bq, H), jnp.float32, transforms=f32_tiles)
        if atomic
        else None,
        ds_ready=plgpu.Barrier(num_arrivals=2) if split else None,
        ds_free=plgpu.Barrier(num_arrivals=2) if split else None,
        dq_staged=plgpu.Barrier(num_arrivals=2, num_barriers=2) if split else None,
        dq_free=plgpu.Barrier(num_barriers=2) if split else None,
        **_list_scratch(plan, segments, q_rows=(stages, bq), kv_rows=(2, bkv)),
    )
    kernel = functools.partial(dkv_kernel, plan=plan)
    grid, names = (K, -(-S // (2 * bkv)), B), ("heads", "kv_seq", "batch")
    mask_in = _lists(mask, arrays, plan, transposed=True, shared=split, own=2 * bkv if split else None)
    if not atomic:
        out_type = [jax.ShapeDtypeStruct(k.shape, dt)] * 2
        dk, dv = call(kernel, out_type, scratch, grid, names, *args, *mask_in, **profile)
        return dq, dk, dv
    outs = (jnp.zeros(q.shape, jnp.float32), jnp.zeros(k.shape, dt), jnp.zeros(v.shape, dt))  # dQ: the adds land here
    dq_sum, dk, dv = call_into(kernel, (*args, *mask_in), outs, scratch, grid, names, **profile)
    return (dq_sum * scale).astype(dt), dk, dv


def _check_split(cfg: MosaicConfig, H: int) -> None:
    """The config a backward above H = 128 runs with (:mod:`~.backward_split`), or a ValueError naming the fix."""
    if cfg.bwd_dq != "pass":
        raise ValueError(
            f"at H={H} the backward makes dQ in a pass of its own: MosaicConfig.bwd_dq must be 'pass' (a float32 "
            f"share of dQ to add by atomics does not fit beside dK and dV there); got {cfg.bwd_dq!r}."
        )
    if (cfg.bwd_block_q, cfg.bwd_block_kv) != (64, 64):
        raise ValueError(
            f"at H={H} the backward takes bwd_block_q = bwd_block_kv = 64 (each warpgroup makes the weights of 32 "
            f"of a tile's rows and half the head dim of its gradients); got bwd_block_q={cfg.bwd_block_q}, "
            f"bwd_block_kv={cfg.bwd_block_kv}."
        )


def _list_scratch(plan: Plan, segments: bool, *, q_rows, kv_rows) -> dict:
    import jax.experimental.pallas.mosaic_gpu as plgpu

    out = {}
    if plan.lists:
        out.update(
            tiles=plgpu.SMEM((M.list_length(plan.padded),), jnp.int32),
            tiles_ready=plgpu.Barrier(num_arrivals=len(M.list_copies(plan.padded))),
        )
    if segments:
        out.update(q_segment=plgpu.SMEM(q_rows, jnp.int32), kv_segment=plgpu.SMEM(kv_rows, jnp.int32))
    return out
