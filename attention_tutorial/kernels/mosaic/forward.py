"""The forward kernel: FlashAttention-3's shape in Pallas's Mosaic GPU lowering, after JAX's ``attention_mgpu``.

One CTA owns ``2 * block_q`` query rows of one (batch, head) and runs three warpgroups: two compute ``block_q`` rows
each (s = q kᵀ, the online softmax in registers, acc += p v), one copies k and v tiles by TMA into a ring of
``stages`` shared-memory slots. The compute warpgroups take turns on the tensor cores (:class:`~._common.Schedule`):
while one runs its softmax, the other's matmuls run (the "ping-pong").

Masks (:mod:`~attention_tutorial.kernels.mosaic.masks`): each warpgroup computes the key tiles it keeps in full (no
mask built), builds the element mask of the tiles it keeps in part, and skips the rest (no matmul, no exponential; it still releases the slot and
takes its turns). A band (causal, a sliding window) is classified by arithmetic in the kernel; masks with per-row
arrays (documents, prefix, lengths) walk a per-CTA list of tiles made outside. Any T and S: TMA fills the rows and
keys past the arrays' ends with zeros, the last tile masks its keys past S, and stores drop the rows past T.

The FP8 forward (:mod:`~attention_tutorial.kernels.mosaic.fp8`) is this kernel with other operands:
:class:`Operands` says what differs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from . import masks as M
from ._common import (
    LOG2E,
    Items,
    Schedule,
    Walk,
    call,
    i32,
    load_vector,
    pad_rows,
    padded_rows,
    regions,
    rows_swizzle,
    schedule_barriers,
    shared_lowering,
    slot_of,
    sm_count,
)
from ._common import copy_ring as _copy_ring
from ._common import swizzled_tiles as _swizzled
from .budget import NO_PROBE, MosaicConfig, Probe, copy_registers, profile_bytes, q_tiles, smem_bytes
from .exp2 import softmax_exp2
from .pipelined import pipelined_steps


class Scratch(NamedTuple):
    """The forward's shared memory and barriers (fields None where a call does not need them)."""

    q: Any  # (2 · q_buffers, block_q, H): each compute warpgroup's q tile(s), warpgroup w's at w, w + 2 (16-bit: its
    # output goes out through it too)
    k: Any  # (stages, block_kv, H): the k ring
    v: Any  # (stages, block_kv, H): the v ring (FP8: vᵀ, (stages, H, block_kv))
    lse: Any  # (2, block_q) float32: each warpgroup's log-sum-exp on its way out
    q_ready: Any  # (2 · q_buffers,): q (and its segment ids) landed in a tile
    k_ready: Any  # (stages,): k (and its segment ids) landed in a slot
    v_ready: Any  # (stages,)
    k_free: Any  # (stages,), two arrivals: both compute warpgroups are done with a slot's k
    v_free: Any  # (stages,)
    turns: Any  # the schedule's barrier(s)
    tiles: Any = None  # (HEADER + 3 · padded,) int32: this CTA's tile list (masks with per-row arrays)
    tiles_ready: Any = None
    q_segment: Any = None  # (2, block_q) int32: each warpgroup's rows' segment ids
    kv_segment: Any = None  # (stages, block_kv) int32: each slot's keys' segment ids
    extra: Any = None  # what the operands add (FP8: the output tile, p, the logit factors)


class Operands(NamedTuple):
    """What the kernel's step does with its operands: the 16-bit defaults, or FP8's
    (:mod:`~attention_tutorial.kernels.mosaic.fp8`).

    ``setup(refs, scratch, wg)`` -> (c, out_factor): base-2 logits per unit of q·kᵀ and the output's factor per unit of
    acc/l (called once, before the loop); ``to_operand(p, scratch, wg)``: p (float32) as the p·v matmul's left
    operand (a value in registers, or a shared-memory ref written here); ``v_operand(v_slot)``: the v tile as its
    right operand; ``out_tile(scratch, wg, q_smem)``: the shared-memory tile the output leaves through (q's, done
    with, or one of its own); ``v_tile(batch, kv_head, block, block_kv)``: the index of key tile ``block`` in the v
    array."""

    setup: Callable
    to_operand: Callable
    v_operand: Callable
    out_tile: Callable
    v_tile: Callable


def _setup16(scale):
    return lambda refs, scratch, wg: (scale * LOG2E, 1.0)  # base-2 logits: exp(scale·s) = 2^(scale·log2e·s)


def sixteen_bit(scale: float) -> Operands:
    """The 16-bit kernel's operands: p cast to q's dtype in registers, v as it lies, the output through q's tile."""
    import jax.experimental.pallas as pl

    return Operands(
        setup=_setup16(scale),
        to_operand=lambda p, scratch, wg: p.astype(scratch.q.dtype),
        v_operand=lambda v: v,
        out_tile=lambda scratch, wg, q_smem: q_smem,
        v_tile=lambda batch, kv_head, block, bkv: (batch, pl.ds(block * bkv, bkv), kv_head),
    )


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything static about one forward call."""

    cfg: MosaicConfig
    mask: M.Mask
    stages: int
    groups: int  # query heads per kv head
    operands: Operands
    items: Items  # the query blocks, and the CTAs that compute them
    q_buffers: int = 1  # q tiles per compute warpgroup: 2 when the next block's q loads while this one runs
    padded: int = 0  # tile-list length (masks with per-row arrays)
    probe: Probe = NO_PROBE

    @property
    def lists(self) -> bool:
        return self.mask.has_arrays


def forward_kernel(q_ref, k_ref, v_ref, *refs, plan: Plan):
    """One CTA: warpgroups 0 and 1 compute, warpgroup 2 copies. q (B, T, N, H), k and v (B, S, K, H) in HBM;
    ``refs``: the tile lists (B, CTAs, ·) and segment ids (B, T), (B, S) when the mask has them, the FP8 factors,
    then the outputs (out, lse) and the scratch."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    cfg, mask, stages = plan.cfg, plan.mask, plan.stages
    *ins, o_ref, lse_ref, scratch = refs
    ins = iter(ins)
    tiles_ref = next(ins) if plan.lists else None
    q_seg_ref, kv_seg_ref = (next(ins), next(ins)) if mask.segments else (None, None)
    extra_refs = tuple(ins)  # the operands' own inputs (FP8: the factors)
    bq, bkv, head_dim = cfg.block_q, cfg.block_kv, q_ref.shape[-1]
    wg = lax.axis_index("wg")
    region = regions(plan.probe.profiling)  # named regions for the in-kernel profiler (nothing when it is off)
    exp2, exp2_tile = softmax_exp2(plan.probe, bkv)  # of alpha, of p

    def walk_of(cta):  # the key tiles of query block ``cta`` (its 2·block_q rows)
        again = plan.items.ctas > 0  # a persistent CTA walks the ring again for its next block
        return Walk(mask, scratch, cta * (2 * bq), own=bq, visit=bkv, stages=stages, padded=plan.padded, again=again)

    schedule = Schedule(cfg.schedule, scratch.turns, wg)  # turns pass on from block to block (persistent CTAs)

    def load_q(batch, head, cta, buffer):  # this warpgroup's q rows of query block ``cta`` (and their segment ids)
        rows = pl.ds(cta * (2 * bq) + wg * bq, bq)
        plgpu.copy_gmem_to_smem(q_ref.at[batch, rows, head], scratch.q.at[buffer], scratch.q_ready.at[buffer])
        if mask.segments:
            plgpu.copy_gmem_to_smem(q_seg_ref.at[batch, rows], scratch.q_segment.at[wg], scratch.q_ready.at[buffer])

    def compute_block(batch, head, cta, count, then):  # one compute warpgroup's block_q rows of query block ``cta``
        walk = walk_of(cta)
        turn = lax.rem(count, i32(plan.q_buffers))  # which of this warpgroup's q tiles holds this block's q
        buffer = wg + 2 * turn
        q_smem = scratch.q.at[buffer]
        row0 = cta * (2 * bq) + wg * bq
        if plan.q_buffers == 1:
            load_q(batch, head, cta, buffer)
        else:  # the block before loaded this one's q; load the next one's in the other tile
            pl.when(count == 0)(lambda: load_q(batch, head, cta, buffer))
            pl.when(then[0])(lambda: load_q(*then[1:], wg + 2 * (1 - turn)))
        c, out_factor = plan.operands.setup(extra_refs, scratch, wg)
        with region("wait"):
            plgpu.barrier_wait(scratch.q_ready.at[buffer])
        q_segment = None
        if mask.segments:
            q_segment = load_vector(scratch.q_segment.at[wg], plgpu.Layout.WGMMA.reduce(1))
        # Running max (in base-2 logits), running sum, accumulator: registers, in wgmma's layout.
        m = plgpu.layout_cast(jnp.full((bq,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1))  # (block_q,)
        l = plgpu.layout_cast(jnp.full((bq,), 0.0, jnp.float32), plgpu.Layout.WGMMA.reduce(1))  # (block_q,)
        acc = plgpu.layout_cast(jnp.full((bq, head_dim), 0.0, jnp.float32), plgpu.Layout.WGMMA)  # (block_q, H)
        scalars = walk.scalars()
        guard = mask.rows_can_be_empty

        def wait_k(t):
            with region("wait"):
                plgpu.barrier_wait(scratch.k_ready.at[slot_of(t, stages)])

        def step(t, carry, masked=False, look_ahead=None):
            """Pipeline step t (key tile ``block_of(t)``): s = q kᵀ, the online softmax, acc += p v. The step's k
            has been waited for; ``look_ahead``: wait for step t + 1's k while p·v runs, if t + 1 < look_ahead."""
            acc, m, l = carry
            slot = slot_of(t, stages)

            def qk(s_ref):  # s = q kᵀ, float32, issued asynchronously; then hand the tensor cores over
                schedule.before_qk()
                plgpu.wgmma(s_ref, q_smem, scratch.k.at[slot].transpose((1, 0)))
                with region("wait"):
                    schedule.after_qk()
                return s_ref[...]

            with region("qk"):
                s = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32))  # (block_q, block_kv)
            kv_segment = None  # the keys' segment ids ride in k's slot: read them before the slot is released
            if masked and mask.segments:
                kv_segment = load_vector(scratch.kv_segment.at[slot], plgpu.Layout.WGMMA.reduce(0))
            plgpu.barrier_arrive(scratch.k_free.at[slot])
            with region("softmax"):
                s, cs = capped(s, c, mask.softcap)
                if masked:  # only tiles the mask cuts build the element mask
                    keep = M.tile_kept(
                        mask,
                        s.shape,
                        row0,
                        walk.block_of(t) * bkv,
                        q_segment=q_segment,
                        kv_segment=kv_segment,
                        scalars=scalars,
                        ends=mask.seq_kv % bkv != 0,
                    )
                    s = jnp.where(keep, s, -jnp.inf)
                # Online softmax in base 2 with the scale folded in (cs).
                m_new = jnp.maximum(m, s.max(axis=1) * cs)  # (block_q,)
                m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) if masked and guard else m_new  # a row with no key
                alpha = exp2(m - m_use)  # rescales what was summed relative to the old max
                p = exp2_tile(s * cs - lax.broadcast_in_dim(m_use, s.shape, [0]))  # (block_q, block_kv)
                acc *= lax.broadcast_in_dim(alpha, acc.shape, [0])
                l = l * alpha + p.sum(axis=1)
                p_op = plan.operands.to_operand(p, scratch, wg)
                # Keep the compiler from sinking the softmax past the barriers below (it would serialise the turns).
                if isinstance(p_op, jax.Array):
                    acc, l, m_new, p_op = lax.optimization_barrier((acc, l, m_new, p_op))
                else:
                    acc, l, m_new = lax.optimization_barrier((acc, l, m_new))
            schedule.softmax_done()
            with region("wait"):
                plgpu.barrier_wait(scratch.v_ready.at[slot])
                schedule.before_pv()

            def pv(acc_ref):  # acc += p v; meanwhile wait for the next k
                plgpu.wgmma(acc_ref, p_op, plan.operands.v_operand(scratch.v.at[slot]))
                if look_ahead is not None:
                    pl.when(t + 1 < look_ahead)(functools.partial(wait_k, t + 1))

            with region("pv"):
                acc = pl.run_state(pv)(plgpu.ACC.init(acc))
            plgpu.barrier_arrive(scratch.v_free.at[slot])
            return acc, m_new, l

        frees, readies = (scratch.k_free, scratch.v_free), (scratch.k_ready, scratch.v_ready)
        carry = (acc, m, l)
        if cfg.pipeline:  # FlashAttention-3's intra-warpgroup overlap on top of the ping-pong (plain masks only)
            exp2s = (exp2, exp2_tile)
            carry = pipelined_steps(carry, q_smem, scratch, schedule, plan, walk, row0, c, exp2s, wait_k, region)
        else:
            carry = walk.loops(step, carry, row0, frees=frees, readies=readies, schedule=schedule, wait_own=wait_k)
        acc, m, l = carry
        inv_l = out_factor / l
        if guard:  # a row that kept no key: output 0, log-sum-exp -inf
            inv_l = jnp.where(l == 0.0, 0.0, inv_l)
        out_smem = plan.operands.out_tile(scratch, wg, q_smem)
        out_smem[...] = (acc * lax.broadcast_in_dim(inv_l, acc.shape, [0])).astype(out_smem.dtype)
        scratch.lse.at[wg][...] = m + jnp.log(l) * LOG2E  # base-2 log-sum-exp: the backward's residual
        plgpu.commit_smem()  # make the stores visible to the TMA engine
        plgpu.copy_smem_to_gmem(out_smem, o_ref.at[batch, pl.ds(row0, bq), head])
        plgpu.copy_smem_to_gmem(scratch.lse.at[wg], lse_ref.at[batch, head, pl.ds(row0, bq)])
        plgpu.wait_smem_to_gmem(0)  # (a persistent CTA's later block loads its q into the tile the output left by)
        return count + 1

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(cfg.registers, action="increase")  # from the copy warpgroup's
        schedule.start()
        plan.items.each(compute_block, i32(0))
        schedule.finish()

    @pl.when(wg == 2)
    def _copy():
        plgpu.set_max_registers(copy_registers(cfg.registers), action="decrease")

        def copy_block(batch, head, cta, pending, then):
            refs = (k_ref, v_ref, tiles_ref, kv_seg_ref)
            return copy_warpgroup(plan, walk_of(cta), scratch, *refs, batch, head, cta, region, pending)

        plan.items.each(copy_block, i32(0) if plan.items.ctas else None)


def copy_warpgroup(
    plan: Plan, walk: Walk, scratch: Scratch, k_ref, v_ref, tiles_ref, kv_seg_ref, batch, head, cta, region, pending
):
    """The copy warpgroup: query block ``cta``'s k and v tiles (and their keys' segment ids) by TMA into the ring of
    slots. ``pending``: persistent CTAs' (see :func:`~._common.copy_ring`), returned for the next block; else None."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    bkv = plan.cfg.block_kv
    kv_head = lax.div(head, jnp.array(plan.groups, head.dtype))  # GQA: query head n reads kv head n // (N/K)
    steps = walk.copy_steps(tiles_ref, batch, cta)

    def copy_k(t, slot):
        keys = pl.ds(walk.block_of(t) * bkv, bkv)
        plgpu.copy_gmem_to_smem(k_ref.at[batch, keys, kv_head], scratch.k.at[slot], scratch.k_ready.at[slot])
        if plan.mask.segments:
            plgpu.copy_gmem_to_smem(kv_seg_ref.at[batch, keys], scratch.kv_segment.at[slot], scratch.k_ready.at[slot])

    def copy_v(t, slot):
        index = plan.operands.v_tile(batch, kv_head, walk.block_of(t), bkv)
        plgpu.copy_gmem_to_smem(v_ref.at[index], scratch.v.at[slot], scratch.v_ready.at[slot])

    return _copy_ring(
        ((scratch.k_free, copy_k), (scratch.v_free, copy_v)),
        stages=plan.stages,
        steps=steps,
        region=region,
        guard=True,  # a block may have fewer steps than slots (under a causal mask): fill only what it walks
        pending=pending,
    )


def capped(s, c, softcap):
    """Scores and their base-2 factor after the softcap: ``softcap · tanh(scale · s / softcap)`` in base 2 is
    ``tanh(s · scale/softcap) · (softcap · log2e)``; without it, ``(s, c)`` as they are."""
    if softcap is None:
        return s, c
    return jnp.tanh(s * (c / (LOG2E * softcap))), softcap * LOG2E


def scratch_types(
    plan: Plan, head_dim: int, dtype, *, v_shape=None, transforms=None, v_transforms=None, extra=None
) -> Scratch:
    """The :class:`Scratch` a forward call allocates (``v_shape``: the v ring's (rows, cols) when not (block_kv,
    H); ``transforms``: the tiles' layout in shared memory when not the 16-bit one, ``v_transforms`` the v ring's
    when not those; ``extra``: the operands' own buffers)."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    cfg, stages = plan.cfg, plan.stages
    _tiles = (lambda: transforms) if transforms is not None else _swizzled
    bq, bkv = cfg.block_q, cfg.block_kv
    kv_copies = 2 if plan.mask.segments else 1  # k and its segment ids land on one barrier
    return Scratch(
        q=plgpu.SMEM((2 * plan.q_buffers, bq, head_dim), dtype, transforms=_tiles()),
        k=plgpu.SMEM((stages, bkv, head_dim), dtype, transforms=_tiles()),
        v=plgpu.SMEM(
            (stages, *(v_shape or (bkv, head_dim))),
            dtype,
            transforms=v_transforms or transforms or _swizzled(rows_swizzle(bkv)),
        ),
        lse=plgpu.SMEM((2, bq), jnp.float32),
        q_ready=plgpu.Barrier(num_arrivals=kv_copies, num_barriers=2 * plan.q_buffers),
        k_ready=plgpu.Barrier(num_arrivals=kv_copies, num_barriers=stages),
        v_ready=plgpu.Barrier(num_barriers=stages),
        k_free=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
        v_free=plgpu.Barrier(num_arrivals=2, num_barriers=stages),
        turns=schedule_barriers(cfg.schedule),
        tiles=plgpu.SMEM((M.list_length(plan.padded),), jnp.int32) if plan.lists else None,
        tiles_ready=plgpu.Barrier(num_arrivals=len(M.list_copies(plan.padded))) if plan.lists else None,
        q_segment=plgpu.SMEM((2, bq), jnp.int32) if plan.mask.segments else None,
        kv_segment=plgpu.SMEM((stages, bkv), jnp.int32) if plan.mask.segments else None,
        extra=extra,
    )


def mask_inputs(plan: Plan, arrays: M.MaskArrays) -> tuple:
    """The kernel's mask inputs for ``arrays``: the per-CTA tile lists, then the segment ids (when the mask has
    them)."""
    if not plan.lists:
        return ()
    grid = M.tile_grid(plan.mask, arrays, block_q=plan.cfg.block_q, block_kv=plan.cfg.block_kv)
    out = (M.tile_lists(M.by_cta(grid), arrays, padded=plan.padded),)
    if plan.mask.segments:
        out += (pad_rows(arrays.q_segment, mode="edge"), pad_rows(arrays.kv_segment, mode="edge"))
    return out


def why_not_persistent(cfg: MosaicConfig, mask: M.Mask) -> str | None:
    """Why persistent CTAs (``cfg.persistent``) cannot take ``mask``, or None."""
    if cfg.persistent and mask.has_arrays:
        return (
            "persistent CTAs (config.persistent=True) take masks computed from positions alone (causal, a sliding "
            "window, a softcap, none); this one has per-row arrays (segment ids, a prefix or sequence lengths), "
            "whose tile lists are made per query block: pass persistent=False for it."
        )
    return None


def make_plan(
    cfg: MosaicConfig,
    mask: M.Mask,
    q_shape: tuple,
    groups: int,
    operands: Operands,
    probe: Probe = NO_PROBE,
    *,
    smem: int = 0,
    itemsize: int = 2,
) -> Plan:
    """The static plan of a forward call on q of ``q_shape`` (B, T, N, H), whose tiles take ``smem`` bytes of shared
    memory with one q tile per warpgroup (q's elements ``itemsize`` bytes): a second where it fits (:func:`q_tiles`)."""
    B, T, N, _ = q_shape
    n_kv = -(-mask.seq_kv // cfg.block_kv)
    blocks = padded_rows(T, 2 * cfg.block_q) // (2 * cfg.block_q)
    items = Items(N, blocks, B, heavy_first=cfg.heavy_first)
    if cfg.persistent:  # one CTA per SM, or fewer when there are fewer blocks
        items = dataclasses.replace(items, ctas=min(sm_count(), N * blocks * B))
    return Plan(
        cfg,
        mask,
        stages=min(cfg.stages, n_kv),
        groups=groups,
        operands=operands,
        items=items,
        q_buffers=q_tiles(cfg, smem, q_shape[-1], itemsize),
        padded=M.padded_tiles(n_kv) if mask.has_arrays else 0,
        probe=probe,
    )


@shared_lowering("scale", "cfg", "mask", "probe")
def forward(q, k, v, arrays: M.MaskArrays, *, scale: float, cfg: MosaicConfig, mask: M.Mask, probe: Probe = NO_PROBE):
    """The forward kernel on q (B, T, N, H), k and v (B, S, K, H), checked by the caller: (out (B, T, N, H), lse2
    (B, N, T)), lse2 the base-2 log-sum-exp of the scaled scores (−inf for a row that keeps no key)."""
    B, T, N, H = q.shape
    K = k.shape[2]
    q, k, v = pad_rows(q), pad_rows(k), pad_rows(v)  # rows a multiple of 8 for the copies; the mask stops at T, S
    smem = smem_bytes(cfg, H, q.dtype) + profile_bytes(probe)
    plan = make_plan(cfg, mask, (B, T, N, H), N // K, sixteen_bit(scale), probe, smem=smem, itemsize=q.dtype.itemsize)
    kernel = functools.partial(forward_kernel, plan=plan)
    rows = padded_rows(T, 2 * cfg.block_q)  # lse is stored a CTA's rows at a time
    out_type = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, N, rows), jnp.float32)]
    out, lse2 = call(
        kernel,
        out_type,
        scratch_types(plan, H, q.dtype),
        *plan.items.grid,
        q,
        k,
        v,
        *mask_inputs(plan, arrays),
        profile_space=probe.profile_space,
        profile_dir=probe.profile_dir,
    )
    return out[:, :T], lse2[..., :T]
