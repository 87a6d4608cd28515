"""FlashAttention-3's intra-warpgroup pipelining (its §3.2): the forward's loop over key blocks, software pipelined by
one block so that a warpgroup's own softmax overlaps its own p·v matmul (``MosaicConfig(pipeline=True)``)."""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from ._common import skip_steps
from .masks import band_steps


def pipelined_steps(carry, qo_smem, scratch, schedule, plan, walk, row0, c, exp2s, wait_k, region):
    """One compute warpgroup's loop over its key blocks: ``(acc, m, l)`` in, ``(acc, m, l)`` out.

    Step j issues s = q kᵀ of block j+1 and acc += p v of block j back to back, hands the tensor cores to the other
    warpgroup, waits for the q·kᵀ only (``wait_n=1``: p·v may still run) and computes block j+1's softmax while
    p·v runs; then waits for p·v and rescales acc by block j+1's correction. A prologue computes block 0's s and
    softmax, an epilogue issues the last p·v. The ping-pong stays: each block still takes two turns of the schedule
    barrier (after the matmuls are issued and after the softmax), so the two warpgroups keep alternating on the
    tensor cores; with ``schedule="turns"`` a warpgroup issues both matmuls in its turn and passes it on
    (FlashAttention-3's own arrangement). The price: block j's p (16-bit) stays in registers, read by the running p·v,
    while block j+1's s and p are made. ``plan``: the forward's (its mask, tiles and stages); ``walk``: the CTA's
    (:class:`~._common.Walk`); ``c``: base-2 logits per unit of q·kᵀ; ``exp2s``: what exponentiates the row factors
    (alpha) and the score tile (p) (:func:`~attention_tutorial.kernels.mosaic.exp2.softmax_exp2`); ``wait_k(t)``
    waits for step t's k.

    Causal: a warpgroup's number of key blocks depends on its rows, but every loop here runs a trip count fixed when
    the kernel is built (:func:`static_trip_loop`), its steps past the bound skipped: with a trip count it cannot
    see, ``ptxas`` serialises the warpgroup matmuls (its warning C7513) and the overlap is lost.
    """
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    k_smem, v_smem = scratch.k, scratch.v
    k_ready, v_ready, k_free, v_free = scratch.k_ready, scratch.v_ready, scratch.k_free, scratch.v_free
    acc, m, l = carry
    (bq, head_dim), bkv, dtype = acc.shape, k_smem.shape[1], qo_smem.dtype
    n_kv, causal, stages = plan.mask.seq_kv // bkv, plan.mask.causal, plan.stages
    exp2, exp2_tile = exp2s
    steps, cta_steps = band_steps(plan.mask, row0, bq, bkv).hi, walk.n_steps  # this warpgroup's, the CTA's
    pl.when(steps > 0)(functools.partial(wait_k, 0))

    def slot(j):
        return lax.rem(j, jnp.array(stages, jnp.int32))

    def softmax(s, m, l, j, masked):  # block j's online softmax in base 2: (p in 16 bits, new max, new sum, alpha)
        with region("softmax"):
            if masked:
                rows, cols = _iotas(s.shape, row0, j * bkv)
                s = jnp.where(cols <= rows, s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(axis=1) * c)
            alpha = exp2(m - m_new)
            p = exp2_tile(s * c - lax.broadcast_in_dim(m_new, s.shape, [0]))
            # Keep the compiler from sinking the softmax past the waits and barriers that follow it.
            return lax.optimization_barrier((p.astype(dtype), m_new, l * alpha + p.sum(axis=1), alpha))

    def end_turn(j):  # block j's softmax is done: wait for block j+1's k and block j's v, then for our turn
        schedule.softmax_done()

        @pl.when(j + 1 < steps)
        def _():
            with region("wait"):
                plgpu.barrier_wait(k_ready.at[slot(j + 1)])

        with region("wait"):
            plgpu.barrier_wait(v_ready.at[slot(j)])
            schedule.before_pv()

    def qk(s_ref):  # prologue: block 0's s = q kᵀ
        schedule.before_qk()
        plgpu.wgmma(s_ref, qo_smem, k_smem.at[0].transpose((1, 0)))
        with region("wait"):
            schedule.after_qk()
        return s_ref[...]

    zero = jnp.array(0, jnp.int32)
    with region("qk"):
        s = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32))
    plgpu.barrier_arrive(k_free.at[0])
    p16, m, l, _ = softmax(s, m, l, zero, masked=causal)  # a mask on a block below the diagonal changes nothing
    end_turn(zero)

    def step(j, carry, masked=False):  # issue q·k_{j+1}ᵀ and p_j·v_j; block j+1's softmax while p_j·v_j runs
        acc, m, l, p16 = carry

        def both(s_ref, o_ref):
            o_ref[...] = acc
            schedule.before_qk()
            with region("qk"):
                plgpu.wgmma(s_ref, qo_smem, k_smem.at[slot(j + 1)].transpose((1, 0)))
            with region("pv"):
                plgpu.wgmma(o_ref, p16, v_smem.at[slot(j)])
            with region("wait"):
                schedule.after_qk()
            with region("qk"):  # q·kᵀ done; p·v may still run.
                s = plgpu.wgmma_accumulator_load(s_ref, wait_n=1)
            plgpu.barrier_arrive(k_free.at[slot(j + 1)])
            block = softmax(s, m, l, j + 1, masked)
            with region("pv"):
                return o_ref[...], block  # reading o_ref waits for p·v

        o, (p16_next, m, l, alpha) = pl.run_scoped(
            both, plgpu.ACC((bq, bkv), jnp.float32), plgpu.ACC((bq, head_dim), jnp.float32)
        )
        # The running p·v reads block j's p from registers, but the compiler sees p as dead once the wgmma is
        # issued and would give its registers to block j+1's softmax; ptxas then serialises every wgmma (its
        # warning C7513). Using p again here, after p·v has completed, keeps its registers untouched until then.
        o, _ = lax.optimization_barrier((o, p16))
        p16 = p16_next
        plgpu.barrier_arrive(v_free.at[slot(j)])
        end_turn(j + 1)
        return o * lax.broadcast_in_dim(alpha, o.shape, [0]), m, l, p16

    last = jnp.asarray(steps, jnp.int32) - 1
    if not causal:  # steps = n_kv: a trip count known when the kernel is built
        acc, m, l, p16 = lax.fori_loop(0, n_kv - 1, step, (acc, m, l, p16))
    else:  # step j makes block j+1's p: unmasked while j+1 lies wholly below the diagonal (one loop masking every
        # block was slower on the H200)
        split, last = pipelined_causal_bounds(row0, steps, bkv)
        carry = static_trip_loop(zero, split, n_kv - 1, step, (acc, m, l, p16))
        acc, m, l, p16 = static_trip_loop(
            split, last, most_masked_steps(bq, bkv, n_kv), functools.partial(step, masked=True), carry
        )

    def pv(acc_ref):  # epilogue: the last block's p·v
        plgpu.wgmma(acc_ref, p16, v_smem.at[slot(last)])

    with region("pv"):
        acc = pl.run_state(pv)(plgpu.ACC.init(acc))
    plgpu.barrier_arrive(v_free.at[slot(last)])
    if causal and bkv % (2 * bq):  # else both warpgroups end on the same key block: no loop to emit
        skip_steps(steps, cta_steps, stages, (k_free, v_free), schedule)  # warpgroup 0 ends early
    return acc, m, l


def _iotas(shape, row0, key0):
    import jax.experimental.pallas.mosaic_gpu as plgpu

    rows = plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=plgpu.Layout.WGMMA) + row0
    cols = plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=plgpu.Layout.WGMMA) + key0
    return rows, cols


def static_trip_loop(lo, hi, most, body, carry):
    """``lax.fori_loop(lo, hi, body, carry)`` with ``most`` iterations (a Python int), those past ``hi`` skipped by
    ``lax.cond``: a trip count the compiler can see. The caller must know that ``hi - lo <= most``: steps beyond
    ``most`` would be dropped. In every variant measured on the H200 (one shape, H = 128), a trip count known only
    at run time made ``ptxas`` serialise the pipelined kernel's warpgroup matmuls (C7513), even the unmasked
    kernel's with its bound merely hidden from the compiler."""

    def guarded(i, carry):
        j = lo + i
        return lax.cond(j < hi, functools.partial(body, j), lambda c: c, carry)

    return lax.fori_loop(0, most, guarded, carry)


def pipelined_causal_bounds(row0, steps, block_kv: int):
    """The causal pipelined loops' bounds for a warpgroup whose rows start at ``row0`` and see ``steps`` key blocks:
    ``(split, last)``. Step j makes key block j + 1 (block 0 comes from the prologue); steps ``[0, split)`` make
    blocks wholly at or below the warpgroup's first row, which need no mask, and steps ``[split, last)`` the rest."""
    last = jnp.asarray(steps, jnp.int32) - 1
    split = jnp.maximum(
        jnp.minimum(lax.div(jnp.asarray(row0, jnp.int32), jnp.array(block_kv, jnp.int32)), steps) - 1, 0
    )
    return split, last


def most_masked_steps(block_q: int, block_kv: int, n_kv: int) -> int:
    """The most steps of the causal pipelined kernel's masked loop, ``[split, last)`` of
    :func:`pipelined_causal_bounds`, for any warpgroup: its ``block_q`` rows starting r = row0 mod block_kv into a key
    block straddle ``cdiv(r + block_q, block_kv) <= cdiv(block_q, block_kv) + 1`` key blocks, and no warpgroup has
    more than ``n_kv - 1`` steps. The static trip count of that loop."""
    return max(min(-(-block_q // block_kv) + 1, n_kv - 1), 0)
