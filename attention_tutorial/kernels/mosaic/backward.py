"""The backward: FlashAttention-2's recomputation from the saved log-sum-exp, with FlashAttention-3's Hopper machinery
(after JAX's ``attention_mgpu``), in warp-specialised kernels of two wgmma warpgroups and one TMA warpgroup each.

:func:`dkv_kernel` owns key blocks and accumulates dK, dV over the query blocks (and, for GQA, the query heads) that
see them. dQ comes one of two ways. By default :func:`dq_kernel` owns query blocks and accumulates dQ in a pass of
its own: every CTA owns its outputs (deterministic), at the cost of recomputing q·kᵀ and dO·vᵀ (seven matrix
products per tile pair in all). With ``MosaicConfig.bwd_dq="atomic"`` the dK/dV kernel also multiplies each dS by its
keys and adds that share of dQ into a float32 dQ in global memory by TMA reduce-add (FlashAttention-3's choice: five
products, float32 traffic, a summation order that varies from run to run); ``"atomic_shared"`` lets the two
warpgroups meet in shared memory so that each adds half of dQ's columns.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ._common import (
    LOG2E,
    call,
    call_into,
    causal_block_mask,
    causal_steps,
    drain,
    load_vector,
    regions,
    shared_lowering,
    swizzled_tiles,
)
from .budget import MosaicConfig, copy_registers


def dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, scoped, *, causal, bq, bkv, stages, seq_kv,
              groups, scale, registers, region):  # fmt: skip
    """dQ: each compute warpgroup owns ``bq`` query rows and walks the key blocks they see, as the forward does.
    ``region(name)`` names a stretch for the in-kernel profiler (a no-op unless profiling)."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    (q_smem2, do_smem2, lse_smem2, delta_smem2, k_smem, v_smem), ready, (k_free, v_free) = scoped
    q_ready, do_ready, lse_ready, delta_ready, k_ready, v_ready = ready
    dtype, head_dim = q_ref.dtype, q_ref.shape[-1]
    batch, head, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
    cta_rows = lax.axis_index("q_seq") * (2 * bq)
    n_kv = seq_kv // bkv
    cta_steps = jnp.minimum(pl.cdiv(cta_rows + 2 * bq, jnp.array(bkv, jnp.int32)), n_kv) if causal else n_kv
    c = scale * LOG2E

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(registers, action="increase")
        q_smem, do_smem, lse_smem, delta_smem = q_smem2.at[wg], do_smem2.at[wg], lse_smem2.at[wg], delta_smem2.at[wg]
        row0 = cta_rows + wg * bq
        steps = causal_steps(row0, bq, bkv, n_kv) if causal else n_kv
        rows = (batch, pl.ds(row0, bq), head)
        plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem, q_ready.at[wg])
        plgpu.copy_gmem_to_smem(do_ref.at[rows], do_smem, do_ready.at[wg])
        plgpu.copy_gmem_to_smem(lse_ref.at[batch, head, pl.ds(row0, bq)], lse_smem, lse_ready.at[wg])
        plgpu.copy_gmem_to_smem(delta_ref.at[batch, head, pl.ds(row0, bq)], delta_smem, delta_ready.at[wg])
        with region("wait"):
            for barrier in (q_ready, do_ready, lse_ready, delta_ready):
                plgpu.barrier_wait(barrier.at[wg])
        lse = load_vector(lse_smem, plgpu.Layout.WGMMA.reduce(1))
        delta = load_vector(delta_smem, plgpu.Layout.WGMMA.reduce(1))
        dq = plgpu.layout_cast(jnp.full((bq, head_dim), 0.0, jnp.float32), plgpu.Layout.WGMMA)

        def step(j, dq, masked=False):
            slot = lax.rem(j, jnp.array(stages, j.dtype))
            with region("wait"):
                plgpu.barrier_wait(k_ready.at[slot])

            def qk(s_ref):  # s = q kᵀ
                plgpu.wgmma(s_ref, q_smem, k_smem.at[slot].transpose((1, 0)))
                return s_ref[...]

            with region("qk"):
                s = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32))
            with region("softmax"):
                if masked:
                    s = causal_block_mask(s, row0, j * bkv)
                p = jnp.exp2(s * c - lax.broadcast_in_dim(lse, s.shape, [0]))  # the forward's weights, recomputed
            with region("wait"):
                plgpu.barrier_wait(v_ready.at[slot])

            def dov(dp_ref):  # dP = dO vᵀ
                plgpu.wgmma(dp_ref, do_smem, v_smem.at[slot].transpose((1, 0)))
                return dp_ref[...]

            with region("grads"):
                dp = pl.run_scoped(dov, plgpu.ACC((bq, bkv), jnp.float32))
            plgpu.barrier_arrive(v_free.at[slot])
            with region("softmax"):
                ds = (p * (dp - lax.broadcast_in_dim(delta, dp.shape, [0]))).astype(dtype)

            def dsk(dq_ref):  # dQ += dS k
                plgpu.wgmma(dq_ref, ds, k_smem.at[slot])

            with region("grads"):
                dq = pl.run_state(dsk)(plgpu.ACC.init(dq))
            plgpu.barrier_arrive(k_free.at[slot])
            return dq

        if not causal:
            dq = lax.fori_loop(0, n_kv, step, dq)
        else:
            unmasked = jnp.minimum(lax.div(row0, jnp.array(bkv, jnp.int32)), steps)
            dq = lax.fori_loop(0, unmasked, step, dq)
            dq = lax.fori_loop(unmasked, steps, functools.partial(step, masked=True), dq)
            drain(steps, cta_steps, stages, (k_free, v_free))  # warpgroup 0 ends early

        q_smem[...] = (dq * scale).astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[rows])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _copy():
        plgpu.set_max_registers(copy_registers(registers), action="decrease")
        kv_head = lax.div(head, jnp.array(groups, head.dtype))

        def fetch(j, slot):
            rows = (batch, pl.ds(j * bkv, bkv), kv_head)
            with region("copy"):
                plgpu.copy_gmem_to_smem(k_ref.at[rows], k_smem.at[slot], k_ready.at[slot])
                plgpu.copy_gmem_to_smem(v_ref.at[rows], v_smem.at[slot], v_ready.at[slot])

        for i in range(stages):
            pl.when(i < cta_steps)(functools.partial(fetch, i, i))

        @pl.loop(0, cta_steps - stages)
        def _(j):
            slot = lax.rem(j, jnp.array(stages, j.dtype))
            with region("wait"):
                plgpu.barrier_wait(k_free.at[slot])
                plgpu.barrier_wait(v_free.at[slot])
            fetch(j + stages, slot)


def dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, causal, bq, bkv, stages, seq_q, groups, scale,
               registers, region, dq="pass"):  # fmt: skip
    """dK, dV: each compute warpgroup owns ``bkv`` keys of one kv head and walks, for each of the N // K query
    heads sharing it (GQA: summed here, in registers), the query blocks that see them.

    With ``dq="atomic"`` or ``"atomic_shared"`` the first of ``refs`` is a float32 dQ (zeros coming in) that each step
    adds its share dS·k into by TMA reduce-add: each warpgroup its own (queries × H), or, shared, the two warpgroups'
    dS meet in shared memory and each adds half of H's columns for all 2·bkv keys (half the registers and traffic).
    ``region(name)`` names a stretch for the in-kernel profiler (a no-op unless profiling)."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    dq_ref, (dk_ref, dv_ref, scoped) = (None, refs) if dq == "pass" else (refs[0], refs[1:])
    smem, ready, tile_free = scoped
    k_smem2, v_smem2, q_smem, do_smem, lse_smem, delta_smem = smem[:6]
    k_ready, v_ready, q_ready, do_ready, lse_ready, delta_ready = ready[:6]
    dtype, head_dim = q_ref.dtype, q_ref.shape[-1]
    batch, kv_head, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
    cta_keys = lax.axis_index("kv_seq") * (2 * bkv)
    n_q = jnp.array(seq_q // bq, jnp.int32)
    # causal: query blocks wholly above the diagonal never see these keys; the CTA starts at the first that does
    first = jnp.minimum(lax.div(cta_keys, jnp.array(bq, jnp.int32)), n_q) if causal else jnp.array(0, jnp.int32)
    per_head = n_q - first
    total = groups * per_head  # pipeline steps: (query head of the group, query block)
    c = scale * LOG2E
    half = head_dim // 2

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(registers, action="increase")
        k_smem, v_smem = k_smem2.at[wg], v_smem2.at[wg]
        key0 = cta_keys + wg * bkv
        keys = (batch, pl.ds(key0, bkv), kv_head)
        plgpu.copy_gmem_to_smem(k_ref.at[keys], k_smem, k_ready.at[wg])
        plgpu.copy_gmem_to_smem(v_ref.at[keys], v_smem, v_ready.at[wg])
        with region("wait"):
            plgpu.barrier_wait(k_ready.at[wg])
            plgpu.barrier_wait(v_ready.at[wg])
        zeros = jnp.full((bkv, head_dim), 0.0, jnp.float32)
        dk = plgpu.layout_cast(zeros, plgpu.Layout.WGMMA)
        dv = plgpu.layout_cast(zeros, plgpu.Layout.WGMMA)

        def wait_tile(slot):
            with region("wait"):
                for barrier in (q_ready, do_ready, lse_ready, delta_ready):
                    plgpu.barrier_wait(barrier.at[slot])

        def skip(jq, carry, base):  # a block the CTA loads but this warpgroup's keys never see: pass it on
            slot = lax.rem(base + jq, jnp.array(stages, jnp.int32))
            wait_tile(slot)
            plgpu.barrier_arrive(tile_free.at[slot])
            return carry

        def ds_of(jq, slot, dv, masked):
            """dSᵀ (keys, queries) of one step, dV += Pᵀ dO on the way."""
            q_tile, do_tile = q_smem.at[slot], do_smem.at[slot]

            def kq(s_ref):  # sᵀ = k qᵀ: (keys, queries)
                plgpu.wgmma(s_ref, k_smem, q_tile.transpose((1, 0)))
                return s_ref[...]

            with region("qk"):
                st = pl.run_scoped(kq, plgpu.ACC((bkv, bq), jnp.float32))
            with region("softmax"):
                if masked:
                    st = causal_block_mask(st, jq * bq, key0, keys_axis=0)
                lse = load_vector(lse_smem.at[slot], plgpu.Layout.WGMMA.reduce(0))
                pt = jnp.exp2(st * c - lax.broadcast_in_dim(lse, st.shape, [1]))  # Pᵀ

            def dv_and_dpt(refs):  # both matmuls in one group: one wait instead of two
                dv_ref, dpt_ref = refs
                plgpu.wgmma(dv_ref, pt.astype(dtype), do_tile)  # dV += Pᵀ dO
                plgpu.wgmma(dpt_ref, v_smem, do_tile.transpose((1, 0)))  # dPᵀ = v dOᵀ

            dpt0 = plgpu.layout_cast(jnp.full((bkv, bq), 0.0, jnp.float32), plgpu.Layout.WGMMA)
            with region("grads"):
                dv, dpt = pl.run_state(dv_and_dpt)((plgpu.ACC.init(dv), plgpu.ACC.init(dpt0)))
            with region("softmax"):
                delta = load_vector(delta_smem.at[slot], plgpu.Layout.WGMMA.reduce(0))
                dst = (pt * (dpt - lax.broadcast_in_dim(delta, dpt.shape, [1]))).astype(dtype)
            return dst, dv  # dSᵀ

        def add_dq(share, jq, g, cols):
            """Add this step's float32 share of dQ (queries × ``cols`` of H) into dQ in global memory."""
            dq_smem = smem[7].at[wg]
            with region("dq_add"):
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last step's share has left dq_smem
                dq_smem[...] = share
                plgpu.commit_smem()
                rows = (batch, pl.ds(jq * bq, bq), kv_head * groups + g)
                plgpu.copy_smem_to_gmem(dq_smem, dq_ref.at[(*rows, cols)], reduction_op="add")

        def step(jq, carry, base, masked, g):
            dk, dv = carry
            slot = lax.rem(base + jq, jnp.array(stages, jnp.int32))
            wait_tile(slot)
            dst, dv = ds_of(jq, slot, dv, masked)
            q_tile = q_smem.at[slot]
            if dq == "pass":

                def dk_step(dk_ref):  # dK += dSᵀ q
                    plgpu.wgmma(dk_ref, dst, q_tile)

                with region("grads"):
                    dk = pl.run_state(dk_step)(plgpu.ACC.init(dk))
                plgpu.barrier_arrive(tile_free.at[slot])
                return dk, dv
            ds_smem = smem[6].at[wg]

            def dk_and_dq(refs):
                dk_ref, share_ref = refs
                plgpu.wgmma(dk_ref, dst, q_tile)  # dK += dSᵀ q
                plgpu.wgmma(share_ref, ds_smem.transpose((1, 0)), k_smem)  # dQ's share: dS k, (queries, H)

            with region("grads"):
                ds_smem[...] = dst  # dS as wgmma's left operand (transposed from shared memory)
                plgpu.commit_smem()
                share0 = plgpu.layout_cast(jnp.full((bq, head_dim), 0.0, jnp.float32), plgpu.Layout.WGMMA)
                dk, share = pl.run_state(dk_and_dq)((plgpu.ACC.init(dk), plgpu.ACC.init(share0)))
            plgpu.barrier_arrive(tile_free.at[slot])  # q and dO of this slot are done
            add_dq(share, jq, g, slice(None))
            return dk, dv

        def shared_step(jq, carry, base, masked, g, active=True):
            """dQ by both warpgroups at once: each puts its dS (zeros where its keys see none of the block) in shared
            memory, waits for the other's, and adds dQ's share for its half of H over both warpgroups' keys."""
            dk, dv = carry
            t = base + jq
            slot, parity = lax.rem(t, jnp.array(stages, jnp.int32)), lax.rem(t, jnp.array(2, jnp.int32))
            wait_tile(slot)
            ds_smem = smem[6].at[parity, wg]
            if active:
                dst, dv = ds_of(jq, slot, dv, masked)
            with region("grads"):
                if active:
                    ds_smem[...] = dst
                else:
                    ds_smem[...] = plgpu.layout_cast(jnp.full((bkv, bq), 0.0, dtype), plgpu.Layout.WGMMA)
                plgpu.commit_smem()
            ds_ready = ready[6].at[parity]
            plgpu.barrier_arrive(ds_ready)
            with region("wait"):
                plgpu.barrier_wait(ds_ready)  # both warpgroups' dS are in (and the last use of this parity's is over)
            cols = pl.ds(wg * half, half)

            def dk_and_dq(refs):
                dk_ref, share_ref = refs
                if active:
                    plgpu.wgmma(dk_ref, dst, q_smem.at[slot])  # dK += dSᵀ q
                for w in range(2):  # dQ's share, my half of H: Σ over both warpgroups' keys of dS k
                    plgpu.wgmma(share_ref, smem[6].at[parity, w].transpose((1, 0)), k_smem2.at[w].at[:, cols])

            with region("grads"):
                share0 = plgpu.layout_cast(jnp.full((bq, half), 0.0, jnp.float32), plgpu.Layout.WGMMA)
                dk, share = pl.run_state(dk_and_dq)((plgpu.ACC.init(dk), plgpu.ACC.init(share0)))
            plgpu.barrier_arrive(tile_free.at[slot])
            add_dq(share, jq, g, cols)
            return dk, dv

        n_q_ = n_q
        if causal:
            mine = jnp.minimum(lax.div(key0, jnp.array(bq, jnp.int32)), n_q_)  # first block that sees our keys
            unmasked = jnp.minimum(pl.cdiv(key0 + bkv, jnp.array(bq, jnp.int32)), n_q_)  # ... wholly below them
        else:
            mine = unmasked = first

        def one_head(g, carry):
            base = g * per_head - first  # pipeline step of (g, query block jq) is base + jq
            walk = functools.partial(shared_step if dq == "atomic_shared" else step, base=base, g=g)
            if dq == "atomic_shared":  # every step takes part: the other warpgroup waits for our dS
                carry = lax.fori_loop(first, mine, functools.partial(walk, masked=False, active=False), carry)
            else:
                lax.fori_loop(first, mine, functools.partial(skip, base=base), None)
            carry = lax.fori_loop(mine, unmasked, functools.partial(walk, masked=True), carry)
            return lax.fori_loop(unmasked, n_q_, functools.partial(walk, masked=False), carry)

        dk, dv = lax.fori_loop(0, groups, one_head, (dk, dv))
        if dq == "atomic_shared":  # the other warpgroup's last dQ share has read our k: both arrive before we write
            plgpu.barrier_arrive(ready[7].at[0])
            with region("wait"):
                plgpu.barrier_wait(ready[7].at[0])
        k_smem[...] = (dk * scale).astype(dtype)
        v_smem[...] = dv.astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[keys])
        plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[keys])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _copy():
        plgpu.set_max_registers(copy_registers(registers), action="decrease")

        def fetch(t, slot):
            g, jq = lax.div(t, jnp.maximum(per_head, 1)), first + lax.rem(t, jnp.maximum(per_head, 1))
            head = kv_head * groups + g
            rows = (batch, pl.ds(jq * bq, bq), head)
            with region("copy"):
                plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem.at[slot], q_ready.at[slot])
                plgpu.copy_gmem_to_smem(do_ref.at[rows], do_smem.at[slot], do_ready.at[slot])
                for ref, tile, ready_ in ((lse_ref, lse_smem, lse_ready), (delta_ref, delta_smem, delta_ready)):
                    plgpu.copy_gmem_to_smem(ref.at[batch, head, pl.ds(jq * bq, bq)], tile.at[slot], ready_.at[slot])

        for i in range(stages):
            pl.when(i < total)(functools.partial(fetch, jnp.array(i, jnp.int32), i))

        @pl.loop(0, total - stages)
        def _(t):
            slot = lax.rem(t, jnp.array(stages, t.dtype))
            with region("wait"):
                plgpu.barrier_wait(tile_free.at[slot])
            fetch(t + stages, slot)


@shared_lowering("causal", "scale", "cfg")
def backward(q, k, v, d_out, lse2, delta, *, causal: bool, scale: float, cfg: MosaicConfig):
    """(dq, dk, dv) from the two backward kernels: lse2 (B, N, T) the base-2 log-sum-exp the forward saved, delta
    (B, N, T) = rowsum(dO ∘ O) (less what a cotangent on the log-sum-exp adds)."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    if H > 128:  # dK and dV at H = 256 would take 2 × 128 registers per thread alone
        raise ValueError(f"the backward kernels take H = 64 or 128; got H={H} (H = 256 is forward-only here).")
    bq, bkv, dt = cfg.bwd_block_q, cfg.bwd_block_kv, q.dtype
    common = dict(causal=causal, bq=bq, bkv=bkv, groups=N // K, scale=scale, registers=cfg.bwd_registers,
                  region=regions(cfg.profiling))  # fmt: skip
    profile = dict(profile_space=cfg.profile_space, profile_dir=cfg.profile_dir)
    args = (q, k, v, d_out, lse2, delta)
    tiles = swizzled_tiles()

    def two(shape, dtype, **kw):
        return plgpu.SMEM((2, *shape), dtype, **kw)

    if cfg.bwd_dq == "pass":
        stages = min(cfg.bwd_stages, S // bkv)
        smem = (two((bq, H), dt, transforms=tiles), two((bq, H), dt, transforms=tiles), two((bq,), jnp.float32),
                two((bq,), jnp.float32), plgpu.SMEM((stages, bkv, H), dt, transforms=tiles),
                plgpu.SMEM((stages, bkv, H), dt, transforms=tiles))  # fmt: skip
        ready = (*(plgpu.Barrier(num_barriers=2),) * 4, *(plgpu.Barrier(num_barriers=stages),) * 2)
        free = (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 2
        kernel = functools.partial(dq_kernel, stages=stages, seq_kv=S, **common)
        grid = (N, T // (2 * bq), B)
        dq = call(kernel, jax.ShapeDtypeStruct(q.shape, dt), (smem, ready, free), grid, ("heads", "q_seq", "batch"),
                  *args, **profile)  # fmt: skip

    stages = min(cfg.bwd_stages, (N // K) * (T // bq))
    smem = (two((bkv, H), dt, transforms=tiles), two((bkv, H), dt, transforms=tiles),
            plgpu.SMEM((stages, bq, H), dt, transforms=tiles), plgpu.SMEM((stages, bq, H), dt, transforms=tiles),
            plgpu.SMEM((stages, bq), jnp.float32), plgpu.SMEM((stages, bq), jnp.float32))  # fmt: skip
    ready = (*(plgpu.Barrier(num_barriers=2),) * 2, *(plgpu.Barrier(num_barriers=stages),) * 4)
    if cfg.bwd_dq != "pass":  # each warpgroup's dS (two steps' when shared) and its float32 share of dQ on the way out
        f32_tiles = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
        shared = cfg.bwd_dq == "atomic_shared"
        ds = plgpu.SMEM((2, 2, bkv, bq) if shared else (2, bkv, bq), dt, transforms=tiles)
        smem += (ds, two((bq, H // 2 if shared else H), jnp.float32, transforms=f32_tiles))
        if shared:  # both warpgroups' dS are in, per step parity; both are done with each other's k
            ready += (plgpu.Barrier(num_arrivals=2, num_barriers=2), plgpu.Barrier(num_arrivals=2, num_barriers=1))
    free = plgpu.Barrier(num_arrivals=2, num_barriers=stages)
    kernel = functools.partial(dkv_kernel, stages=stages, seq_q=T, dq=cfg.bwd_dq, **common)
    grid = (K, S // (2 * bkv), B)
    if cfg.bwd_dq == "pass":
        out_type = [jax.ShapeDtypeStruct(k.shape, dt)] * 2
        dk, dv = call(kernel, out_type, (smem, ready, free), grid, ("heads", "kv_seq", "batch"), *args, **profile)
        return dq, dk, dv
    outs = (jnp.zeros(q.shape, jnp.float32), jnp.zeros(k.shape, dt), jnp.zeros(v.shape, dt))  # dQ: the adds land here
    dq_sum, dk, dv = call_into(kernel, args, outs, (smem, ready, free), grid, ("heads", "kv_seq", "batch"), **profile)
    return (dq_sum * scale).astype(dt), dk, dv
