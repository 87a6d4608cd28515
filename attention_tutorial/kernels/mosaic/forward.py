"""The forward kernel: FlashAttention-3's shape in Pallas's Mosaic GPU lowering, after JAX's ``attention_mgpu``.

One CTA owns ``2 * block_q`` query rows of one (batch, head) and runs three warpgroups: two compute ``block_q`` rows
each (s = q kᵀ, the online softmax in registers, acc += p v), one copies k and v tiles by TMA into a ring of
``stages`` shared-memory slots. A two-party *schedule* barrier makes the compute warpgroups take turns on the tensor
cores: while one runs its softmax, the other's matmuls run (the "ping-pong").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ._common import (
    LOG2E,
    call,
    causal_block_mask,
    causal_steps,
    copy_kv_ring,
    drain,
    regions,
    shared_lowering,
    swizzled_tiles,
)
from .budget import MosaicConfig, copy_registers
from .exp2 import softmax_exp2
from .pipelined import pipelined_steps


def forward_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, scoped, *, causal, cfg, stages, seq_kv, groups, scale):
    """One CTA: warpgroups 0 and 1 compute, warpgroup 2 copies. q (B, T, N, H), k and v (B, S, K, H) in HBM."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    (qo_smem2, k_smem, v_smem, lse_smem2), (k_ready, v_ready, q_ready), (k_free, v_free), schedule = scoped
    bq, bkv, dtype, head_dim = cfg.block_q, cfg.block_kv, q_ref.dtype, q_ref.shape[-1]
    batch, head, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
    cta_rows = lax.axis_index("q_seq") * (2 * bq)  # first query row of this CTA
    n_kv = seq_kv // bkv
    if causal:  # the CTA needs keys up to its last row (top-left alignment), never past S
        cta_steps = jnp.minimum(pl.cdiv(cta_rows + 2 * bq, jnp.array(bkv, jnp.int32)), n_kv)
    else:
        cta_steps = n_kv
    exp2, exp2_tile = softmax_exp2(cfg)  # of alpha, of p (cfg.exp_poly: part of p's on the FMA units)
    region = regions(cfg.profiling)  # named regions for the in-kernel profiler (nothing when it is off)

    def take_turn():  # the two compute warpgroups alternate on the tensor cores
        plgpu.barrier_arrive(schedule)
        plgpu.barrier_wait(schedule)

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(cfg.registers, action="increase")  # from the copy warpgroup's
        qo_smem = qo_smem2.at[wg]  # q tile in, output tile out: (block_q, H)
        row0 = cta_rows + wg * bq
        steps = causal_steps(row0, bq, bkv, n_kv) if causal else n_kv
        plgpu.copy_gmem_to_smem(q_ref.at[batch, pl.ds(row0, bq), head], qo_smem, q_ready.at[wg])
        c = scale * LOG2E  # base-2 logits: exp(scale·s) = 2^(scale·log2e·s), one FMA each
        with region("wait"):
            plgpu.barrier_wait(q_ready.at[wg])
        # Running max (in base-2 logits), running sum, accumulator: registers, in wgmma's layout.
        m = plgpu.layout_cast(jnp.full((bq,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1))  # (block_q,)
        l = plgpu.layout_cast(jnp.full((bq,), 0.0, jnp.float32), plgpu.Layout.WGMMA.reduce(1))  # (block_q,)
        acc = plgpu.layout_cast(jnp.full((bq, head_dim), 0.0, jnp.float32), plgpu.Layout.WGMMA)  # (block_q, H)

        @pl.when(steps > 0)
        def _():
            with region("wait"):
                plgpu.barrier_wait(k_ready.at[0])

        pl.when(wg == 1)(take_turn)  # warpgroup 1 starts half a turn later

        def step(j, carry, masked=False):
            acc, m, l = carry
            slot = lax.rem(j, jnp.array(stages, j.dtype))

            def qk(s_ref):  # s = q kᵀ, float32, issued asynchronously; then hand the tensor cores over
                plgpu.wgmma(s_ref, qo_smem, k_smem.at[slot].transpose((1, 0)))
                with region("wait"):
                    take_turn()
                return s_ref[...]

            with region("qk"):
                s = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32))  # (block_q, block_kv)
            plgpu.barrier_arrive(k_free.at[slot])
            with region("softmax"):
                if masked:  # only blocks that straddle the diagonal build a mask
                    s = causal_block_mask(s, row0, j * bkv)
                # Online softmax in base 2 with the scale folded in (c above).
                m_new = jnp.maximum(m, s.max(axis=1) * c)  # (block_q,)
                alpha = exp2(m - m_new)  # rescales what was summed relative to the old max
                p = exp2_tile(s * c - lax.broadcast_in_dim(m_new, s.shape, [0]))  # (block_q, block_kv)
                acc *= lax.broadcast_in_dim(alpha, acc.shape, [0])
                l = l * alpha + p.sum(axis=1)
                p16 = p.astype(dtype)
                # Keep the compiler from sinking the softmax past the barriers below (it would serialise the turns).
                acc, l, m_new, p16 = lax.optimization_barrier((acc, l, m_new, p16))
            plgpu.barrier_arrive(schedule)  # softmax done
            with region("wait"):
                plgpu.barrier_wait(v_ready.at[slot])
                plgpu.barrier_wait(schedule)  # the other warpgroup has issued its matmul: our turn

            def pv(acc_ref):  # acc += p v, p from registers; meanwhile wait for the next k
                plgpu.wgmma(acc_ref, p16, v_smem.at[slot])

                @pl.when(j + 1 < steps)
                def _():
                    with region("wait"):
                        plgpu.barrier_wait(k_ready.at[lax.rem(j + 1, jnp.array(stages, j.dtype))])

            with region("pv"):
                acc = pl.run_state(pv)(plgpu.ACC.init(acc))
            plgpu.barrier_arrive(v_free.at[slot])
            return acc, m_new, l

        if cfg.pipeline:  # FlashAttention-3's intra-warpgroup overlap on top of the ping-pong
            acc, m, l = pipelined_steps(
                (acc, m, l), qo_smem, k_smem, v_smem, (k_ready, v_ready, k_free, v_free), schedule, take_turn,
                row0=row0, steps=steps, cta_steps=cta_steps, n_kv=n_kv, causal=causal, stages=stages, scale=scale,
                exp2=exp2, exp2_tile=exp2_tile, region=region,
            )  # fmt: skip
        elif not causal:
            acc, m, l = lax.fori_loop(0, n_kv, step, (acc, m, l))
        else:  # blocks wholly at or below the diagonal need no mask; those that straddle it do; the rest are skipped
            unmasked = jnp.minimum(lax.div(row0, jnp.array(bkv, jnp.int32)), steps)
            carry = lax.fori_loop(0, unmasked, step, (acc, m, l))
            acc, m, l = lax.fori_loop(unmasked, steps, functools.partial(step, masked=True), carry)
            drain(steps, cta_steps, stages, (k_free, v_free), take_turn)  # warpgroup 0 ends early

        pl.when(wg == 0)(take_turn)  # balance warpgroup 1's extra half turn
        qo_smem[...] = (acc / lax.broadcast_in_dim(l, acc.shape, [0])).astype(dtype)  # the output over q's tile
        lse_smem2.at[wg][...] = m + jnp.log(l) * LOG2E  # base-2 log-sum-exp: the backward's residual
        plgpu.commit_smem()  # make the stores visible to the TMA engine
        plgpu.copy_smem_to_gmem(qo_smem, o_ref.at[batch, pl.ds(row0, bq), head])
        plgpu.copy_smem_to_gmem(lse_smem2.at[wg], lse_ref.at[batch, head, pl.ds(row0, bq)])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _copy():
        plgpu.set_max_registers(copy_registers(cfg.registers), action="decrease")
        kv_head = lax.div(head, jnp.array(groups, head.dtype))  # GQA: query head n reads kv head n // (N/K)
        tile = lambda j: (batch, pl.ds(j * bkv, bkv), kv_head)  # noqa: E731  key block j: (block_kv, H)
        copy_kv_ring(k_ref, v_ref, k_smem, v_smem, (k_ready, v_ready, k_free, v_free), k_tile=tile, v_tile=tile,
                     stages=stages, steps=cta_steps, region=region)  # fmt: skip


@shared_lowering("causal", "scale", "cfg")
def forward(q, k, v, *, causal: bool, scale: float, cfg: MosaicConfig):
    """The forward kernel on q (B, T, N, H), k and v (B, S, K, H), checked by the caller: (out (B, T, N, H), lse2
    (B, N, T)), lse2 the base-2 log-sum-exp of the scaled scores."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    stages = min(cfg.stages, S // cfg.block_kv)
    smem = (
        plgpu.SMEM((2, cfg.block_q, H), q.dtype, transforms=swizzled_tiles()),  # q / output, one per compute wg
        plgpu.SMEM((stages, cfg.block_kv, H), q.dtype, transforms=swizzled_tiles()),  # k ring
        plgpu.SMEM((stages, cfg.block_kv, H), q.dtype, transforms=swizzled_tiles()),  # v ring
        plgpu.SMEM((2, cfg.block_q), jnp.float32),  # log-sum-exp out, one per compute warpgroup
    )
    barriers = (
        (plgpu.Barrier(num_barriers=stages), plgpu.Barrier(num_barriers=stages), plgpu.Barrier(num_barriers=2)),
        (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 2,  # k_free, v_free: both compute warpgroups
        plgpu.Barrier(num_arrivals=2),  # the schedule barrier
    )
    kernel = functools.partial(forward_kernel, causal=causal, cfg=cfg, stages=stages, seq_kv=S, groups=N // K,
                               scale=scale)  # fmt: skip
    out_type = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, N, T), jnp.float32)]
    grid = (N, T // (2 * cfg.block_q), B)
    return tuple(call(kernel, out_type, (smem, *barriers), grid, ("heads", "q_seq", "batch"), q, k, v,
                      profile_space=cfg.profile_space, profile_dir=cfg.profile_dir))  # fmt: skip
