"""Our FlashAttention for Hopper (forward and backward), in Pallas's Mosaic GPU lowering: it races cuDNN.

Why a second kernel: the Triton-lowered one (:mod:`attention_tutorial.kernels.pallas_flash`) runs anywhere but leaves
Hopper's three big features to a compiler's heuristics. Mosaic GPU hands them to us:

* **wgmma** — a *warpgroup* (4 warps, 128 threads) issues one asynchronous 64×N×16 matrix product that reads its
  operands from shared memory (or A from registers) and accumulates in registers;
* **TMA** — one thread starts a bulk copy of a whole tile from global to shared memory; it completes on a
  barrier that the consumers wait on;
* **warp specialisation** — different warpgroups of one CTA do different jobs, each with its own register
  budget (``set_max_registers``).

The shape of the kernel is FlashAttention-3's, as in JAX's example ``jax.experimental.pallas.ops.gpu.
attention_mgpu`` which it follows; ours adds bfloat16 (JAX's allocates float16 buffers), the softmax scale
(JAX's applies none), and top-left causal masking for T != S. One CTA owns ``2 * block_q`` query rows of one
(batch, head) and runs three warpgroups:

* warpgroups 0 and 1 **compute**, ``block_q`` rows each: s = q kᵀ (wgmma, q and k from shared memory), the
  online softmax in registers, then acc += p v (wgmma with p from registers);
* warpgroup 2 only **copies**: it streams k and v tiles by TMA into a ring of ``stages`` shared-memory slots,
  refilling a slot as soon as both compute warpgroups have said they are done with it.

Barriers connect them: ``k_ready[slot]``/``v_ready[slot]`` complete when a TMA copy lands; ``k_free[slot]``/
``v_free[slot]`` when both compute warpgroups have consumed it; and a two-party *schedule* barrier makes the two
compute warpgroups take turns on the tensor cores — while one runs its softmax (exp2 on the multi-function units)
the other's matmuls run, so neither unit waits (FlashAttention-3's "ping-pong"). The forward also writes each
row's log-sum-exp; the backward (:func:`mosaic_flash_attention`'s custom VJP) has the same three-warpgroup shape
in two kernels, :func:`_dq_kernel` and :func:`_dkv_kernel`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from ..inputs import AttentionShape, attention_shape, check_block_size, check_flag, resolve_scale

LOG2E = math.log2(math.e)


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
    """Tile sizes: ``block_q`` rows per compute warpgroup (wgmma's M is 64), ``block_kv`` keys per step, and
    ``stages`` k/v slots in flight; ``bwd_*`` the same for the backward kernels (both blocks 64: each compute
    warpgroup there holds two float32 accumulators, dK and dV or dQ, plus two score-sized tiles).
    ``pipeline=True`` adds FlashAttention-3's intra-warpgroup pipelining to the forward (see
    :func:`_pipelined_steps`). H = 256 needs ``block_kv=64`` (see :func:`smem_bytes`)."""

    block_q: int = 64
    block_kv: int = 128
    stages: int = 2
    bwd_block_q: int = 64
    bwd_block_kv: int = 64
    bwd_stages: int = 2
    pipeline: bool = False

    def __post_init__(self):
        check_flag("MosaicConfig.pipeline", self.pipeline)
        for name in ("block_q", "block_kv", "stages", "bwd_block_q", "bwd_block_kv", "bwd_stages"):
            check_block_size(f"MosaicConfig.{name}", getattr(self, name))
        for name in ("block_q", "block_kv", "bwd_block_q", "bwd_block_kv"):
            if getattr(self, name) % 64:
                raise ValueError(
                    f"MosaicConfig.{name} must be a multiple of 64 (wgmma's tile); got {getattr(self, name)}."
                )


def _kernel(q_ref, k_ref, v_ref, *refs, causal, cfg, stages, seq_kv, groups, scale, p_scale=None, p_operand=None):
    """The forward. With ``p_scale`` it is the FP8 one (:mod:`attention_tutorial.kernels.mosaic_fp8`): E4M3 q, k and
    v, v transposed (B, K, H, S) since FP8 wgmma reads B K-major only, the two logit factors from ``c_ref``; p is
    E4M3 · ``p_scale``, through shared memory, or with ``p_operand`` (a function: f32 p -> the 8-bit operand
    layout) straight from registers; the output is bfloat16."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    fp8 = p_scale is not None
    c_ref, o_ref, lse_ref, scoped = refs if fp8 else (None, *refs)
    (qo_smem2, k_smem, v_smem, lse_smem2, *fp8_smem), (k_ready, v_ready, q_ready, *c_ready), frees, schedule = scoped
    k_free, v_free = frees
    bq, bkv, dtype = cfg.block_q, cfg.block_kv, q_ref.dtype
    head_dim = q_ref.shape[-1]
    batch, head, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
    cta_rows = lax.axis_index("q_seq") * (2 * bq)  # first query row of this CTA
    n_kv = seq_kv // bkv
    if causal:  # the CTA needs keys up to its last row (top-left alignment), never past S
        cta_steps = jnp.minimum(pl.cdiv(cta_rows + 2 * bq, jnp.array(bkv, jnp.int32)), n_kv)
    else:
        cta_steps = n_kv

    def take_turn():  # the two compute warpgroups alternate on the tensor cores
        plgpu.barrier_arrive(schedule)
        plgpu.barrier_wait(schedule)

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(232, action="increase")  # 2 × 128 threads × 232 + 128 × 40 ≤ 64K registers
        qo_smem = qo_smem2.at[wg]  # q tile in, output tile out: (block_q, H)
        row0 = cta_rows + wg * bq
        steps = causal_steps(row0, bq, bkv, n_kv) if causal else n_kv

        plgpu.copy_gmem_to_smem(q_ref.at[batch, pl.ds(row0, bq), head], qo_smem, q_ready.at[wg])
        if not fp8:  # base-2 logits: exp(scale·s) = 2^(scale·log2e·s), one FMA each
            c, c_out = scale * LOG2E, None
        else:  # FP8: the output and p get tiles of their own; both factors of the logits come from c_ref
            o_smem2, p_smem2, c_smem2 = fp8_smem
            plgpu.copy_gmem_to_smem(c_ref, c_smem2.at[wg], c_ready[0].at[wg])
            plgpu.barrier_wait(c_ready[0].at[wg])
            c_smem = c_smem2.at[wg]
            c, c_out = c_smem[0], c_smem[1]  # scale·log2e·descale_q·descale_k, descale_v / p_scale
        plgpu.barrier_wait(q_ready.at[wg])
        # Running max (in base-2 logits), running sum, accumulator: registers, in wgmma's layout.
        m = plgpu.layout_cast(jnp.full((bq,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
        l = plgpu.layout_cast(jnp.full((bq,), 0.0, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
        acc = plgpu.layout_cast(jnp.full((bq, head_dim), 0.0, jnp.float32), plgpu.Layout.WGMMA)

        @pl.when(steps > 0)
        def _():
            plgpu.barrier_wait(k_ready.at[0])

        pl.when(wg == 1)(take_turn)  # warpgroup 1 starts half a turn later

        def step(j, carry, masked=False):
            acc, m, l = carry
            slot = lax.rem(j, jnp.array(stages, j.dtype))

            def qk(s_ref):  # s = q kᵀ, float32, issued asynchronously; then hand the tensor cores over
                plgpu.wgmma(s_ref, qo_smem, k_smem.at[slot].transpose((1, 0)))
                take_turn()
                return s_ref[...]

            s = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32))  # (block_q, block_kv)
            plgpu.barrier_arrive(k_free.at[slot])
            if masked:  # only blocks that straddle the diagonal build a mask
                rows = plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 0, layout=plgpu.Layout.WGMMA) + row0
                cols = plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 1, layout=plgpu.Layout.WGMMA) + j * bkv
                s = jnp.where(cols <= rows, s, -jnp.inf)
            # Online softmax in base 2 with the scale folded in (c above).
            m_new = jnp.maximum(m, s.max(axis=1) * c)
            alpha = jnp.exp2(m - m_new)  # rescales what was summed relative to the old max
            p = jnp.exp2(s * c - lax.broadcast_in_dim(m_new, s.shape, [0]))
            acc *= lax.broadcast_in_dim(alpha, acc.shape, [0])
            l = l * alpha + p.sum(axis=1)
            if fp8 and p_operand is not None:  # E4M3 tops out at 448: scale p (<= 1) up to use its range
                p16 = p_operand(p * p_scale)
                acc, l, m_new, p16 = lax.optimization_barrier((acc, l, m_new, p16))
            elif fp8:  # the same, through shared memory
                p_smem = p_smem2.at[wg]
                p_smem[...] = (p * p_scale).astype(dtype)
                plgpu.commit_smem()
                acc, l, m_new = lax.optimization_barrier((acc, l, m_new))
                p16 = p_smem
            else:
                p16 = p.astype(dtype)
                # Keep the compiler from sinking the softmax past the barriers below (it would serialise the turns).
                acc, l, m_new, p16 = lax.optimization_barrier((acc, l, m_new, p16))
            plgpu.barrier_arrive(schedule)  # softmax done
            plgpu.barrier_wait(v_ready.at[slot])
            plgpu.barrier_wait(schedule)  # the other warpgroup has issued its matmul: our turn

            def pv(acc_ref):  # acc += p v, p from registers (or shared memory, FP8); meanwhile wait for the next k
                plgpu.wgmma(acc_ref, p16, v_smem.at[slot].transpose((1, 0)) if fp8 else v_smem.at[slot])

                @pl.when(j + 1 < steps)
                def _():
                    plgpu.barrier_wait(k_ready.at[lax.rem(j + 1, jnp.array(stages, j.dtype))])

            acc = pl.run_state(pv)(plgpu.ACC.init(acc))
            plgpu.barrier_arrive(v_free.at[slot])
            return acc, m_new, l

        if cfg.pipeline and not fp8:  # FlashAttention-3's intra-warpgroup overlap on top of the ping-pong (issue 17)
            acc, m, l = _pipelined_steps(
                (acc, m, l), qo_smem, k_smem, v_smem, (k_ready, v_ready, k_free, v_free), schedule, take_turn,
                row0=row0, steps=steps, cta_steps=cta_steps, n_kv=n_kv, causal=causal, stages=stages, scale=scale,
            )  # fmt: skip
        elif not causal:
            acc, m, l = lax.fori_loop(0, n_kv, step, (acc, m, l))
        else:
            # Blocks wholly at or below the diagonal need no mask; those that straddle it do; the rest are skipped.
            unmasked = jnp.minimum(lax.div(row0, jnp.array(bkv, jnp.int32)), steps)
            carry = lax.fori_loop(0, unmasked, step, (acc, m, l))
            acc, m, l = lax.fori_loop(unmasked, steps, functools.partial(step, masked=True), carry)

            @pl.loop(steps, cta_steps)
            def _(j):  # warpgroup 0 ends early: keep freeing slots and taking turns so the others go on
                slot = lax.rem(j, jnp.array(stages, j.dtype))
                plgpu.barrier_arrive(k_free.at[slot])
                plgpu.barrier_arrive(v_free.at[slot])
                take_turn()
                take_turn()

        pl.when(wg == 0)(take_turn)  # balance warpgroup 1's extra half turn
        if fp8:
            out_smem = o_smem2.at[wg]
            out_smem[...] = (acc * lax.broadcast_in_dim(c_out / l, acc.shape, [0])).astype(out_smem.dtype)
        else:
            out_smem = qo_smem
            out_smem[...] = (acc / lax.broadcast_in_dim(l, acc.shape, [0])).astype(dtype)
        lse_smem2.at[wg][...] = m + jnp.log(l) * LOG2E  # base-2 log-sum-exp: the backward's residual
        plgpu.commit_smem()  # make the stores visible to the TMA engine
        plgpu.copy_smem_to_gmem(out_smem, o_ref.at[batch, pl.ds(row0, bq), head])
        plgpu.copy_smem_to_gmem(lse_smem2.at[wg], lse_ref.at[batch, head, pl.ds(row0, bq)])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _copy():
        plgpu.set_max_registers(40, action="decrease")
        kv_head = lax.div(head, jnp.array(groups, head.dtype))  # GQA: query head n reads kv head n // (N/K)

        def v_tile(j):  # FP8: v comes transposed, (B, K, H, S)
            return (batch, kv_head, slice(None), pl.ds(j * bkv, bkv)) if fp8 else (batch, pl.ds(j * bkv, bkv), kv_head)

        for i in range(stages):  # fill the ring
            rows = (batch, pl.ds(i * bkv, bkv), kv_head)
            plgpu.copy_gmem_to_smem(k_ref.at[rows], k_smem.at[i], k_ready.at[i])
            plgpu.copy_gmem_to_smem(v_ref.at[v_tile(i)], v_smem.at[i], v_ready.at[i])

        @pl.loop(0, cta_steps - stages)
        def _(j):  # refill each slot once both compute warpgroups are done with it
            slot = lax.rem(j, jnp.array(stages, j.dtype))
            rows = (batch, pl.ds((j + stages) * bkv, bkv), kv_head)
            plgpu.barrier_wait(k_free.at[slot])
            plgpu.copy_gmem_to_smem(k_ref.at[rows], k_smem.at[slot], k_ready.at[slot])
            plgpu.barrier_wait(v_free.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[v_tile(j + stages)], v_smem.at[slot], v_ready.at[slot])


def _pipelined_steps(carry, qo_smem, k_smem, v_smem, kv_barriers, schedule, take_turn, *, row0, steps, cta_steps,
                     n_kv, causal, stages, scale):  # fmt: skip
    """FlashAttention-3's intra-warpgroup pipelining (its §3.2): one warpgroup's loop over its key blocks, software
    pipelined by one block so that its own softmax overlaps its own p·v matmul.

    Step j issues s = q kᵀ of block j+1 and acc += p v of block j back to back, hands the tensor cores to the other
    warpgroup, waits for the q·kᵀ only (``wait_n=1``: p·v may still run) and computes block j+1's softmax while
    p·v runs; then waits for p·v and rescales acc by block j+1's correction. A prologue computes block 0's s and
    softmax, an epilogue issues the last p·v. The ping-pong stays: each block still takes two turns of the schedule
    barrier (after the matmuls are issued and after the softmax), so the two warpgroups keep alternating on the
    tensor cores. The price: block j's p (16-bit) stays in registers, read by the running p·v, while block j+1's s
    and p are made.

    Causal: a warpgroup's number of key blocks depends on its rows, but every loop here runs a trip count fixed when
    the kernel is built (:func:`_static_trip_loop`), its steps past the bound skipped: with a trip count it cannot
    see, ``ptxas`` serialises the warpgroup matmuls (its warning C7513) and the overlap is lost
    (``scripts/issue17_probe2_h200.json``: a bound merely hidden from the compiler does it to the unmasked kernel).
    """
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    k_ready, v_ready, k_free, v_free = kv_barriers
    acc, m, l = carry
    (bq, head_dim), bkv, dtype = acc.shape, k_smem.shape[1], qo_smem.dtype
    c = scale * LOG2E

    def slot(j):
        return lax.rem(j, jnp.array(stages, jnp.int32))

    def softmax(s, m, l, j, masked):  # block j's online softmax in base 2: (p in 16 bits, new max, new sum, alpha)
        if masked:
            rows = plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 0, layout=plgpu.Layout.WGMMA) + row0
            cols = plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 1, layout=plgpu.Layout.WGMMA) + j * bkv
            s = jnp.where(cols <= rows, s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(axis=1) * c)
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s * c - lax.broadcast_in_dim(m_new, s.shape, [0]))
        # Keep the compiler from sinking the softmax past the waits and barriers that follow it.
        return lax.optimization_barrier((p.astype(dtype), m_new, l * alpha + p.sum(axis=1), alpha))

    def end_turn(j):  # block j's softmax is done: wait for block j+1's k and block j's v, then for our turn
        plgpu.barrier_arrive(schedule)

        @pl.when(j + 1 < steps)
        def _():
            plgpu.barrier_wait(k_ready.at[slot(j + 1)])

        plgpu.barrier_wait(v_ready.at[slot(j)])
        plgpu.barrier_wait(schedule)

    def qk(s_ref):  # prologue: block 0's s = q kᵀ
        plgpu.wgmma(s_ref, qo_smem, k_smem.at[0].transpose((1, 0)))
        take_turn()
        return s_ref[...]

    zero = jnp.array(0, jnp.int32)
    s = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32))
    plgpu.barrier_arrive(k_free.at[0])
    p16, m, l, _ = softmax(s, m, l, zero, masked=causal)  # a mask on a block below the diagonal changes nothing
    end_turn(zero)

    def step(j, carry, masked=False):  # issue q·k_{j+1}ᵀ and p_j·v_j; block j+1's softmax while p_j·v_j runs
        acc, m, l, p16 = carry

        def both(s_ref, o_ref):
            o_ref[...] = acc
            plgpu.wgmma(s_ref, qo_smem, k_smem.at[slot(j + 1)].transpose((1, 0)))
            plgpu.wgmma(o_ref, p16, v_smem.at[slot(j)])
            take_turn()
            # q·kᵀ done; p·v may still run.
            s = plgpu.wgmma_accumulator_load(s_ref, wait_n=1)
            plgpu.barrier_arrive(k_free.at[slot(j + 1)])
            block = softmax(s, m, l, j + 1, masked)
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
        # block was slower on the H200: scripts/issue17_probe_onemask_h200.json)
        split, last = pipelined_causal_bounds(row0, steps, bkv)
        carry = _static_trip_loop(zero, split, n_kv - 1, step, (acc, m, l, p16))
        acc, m, l, p16 = _static_trip_loop(
            split, last, most_masked_steps(bq, bkv, n_kv), functools.partial(step, masked=True), carry
        )

    def pv(acc_ref):  # epilogue: the last block's p·v
        plgpu.wgmma(acc_ref, p16, v_smem.at[slot(last)])

    acc = pl.run_state(pv)(plgpu.ACC.init(acc))
    plgpu.barrier_arrive(v_free.at[slot(last)])
    if causal and bkv % (2 * bq):  # else both warpgroups end on the same key block: no loop to emit

        @pl.loop(steps, cta_steps)
        def _(j):  # warpgroup 0 ends early: keep freeing slots and taking turns so the others go on
            plgpu.barrier_arrive(k_free.at[slot(j)])
            plgpu.barrier_arrive(v_free.at[slot(j)])
            take_turn()
            take_turn()

    return acc, m, l


def _static_trip_loop(lo, hi, most, body, carry):
    """``lax.fori_loop(lo, hi, body, carry)`` with ``most`` iterations (a Python int), those past ``hi`` skipped by
    ``lax.cond``: a trip count the compiler can see. The caller must know that ``hi - lo <= most``: steps beyond
    ``most`` would be dropped. In every variant the H200 probes tried (one shape, H = 128), a trip count known only
    at run time made ``ptxas`` serialise the pipelined kernel's warpgroup matmuls (C7513), even the unmasked
    kernel's with its bound merely hidden from the compiler (``scripts/issue17_probe2_h200.json``,
    ``issue17_probe3_h200.json``; the flash page shows them)."""

    def guarded(i, carry):
        j = lo + i
        return lax.cond(j < hi, functools.partial(body, j), lambda c: c, carry)

    return lax.fori_loop(0, most, guarded, carry)


def causal_steps(row0, block_q: int, block_kv: int, n_kv: int):
    """How many key blocks a warpgroup whose ``block_q`` rows start at ``row0`` sees under a top-left causal mask:
    those holding a key at or below its last row, ``cdiv(row0 + block_q, block_kv)``, at most the ``n_kv`` there are.
    """
    return jnp.minimum(lax.div(jnp.asarray(row0, jnp.int32) + (block_q + block_kv - 1), jnp.int32(block_kv)), n_kv)


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


def _load(ref, layout):
    """A whole shared-memory vector into registers in ``layout`` (jax 0.11 takes no index; jax 0.10 needs ``()``)."""
    import inspect

    import jax.experimental.pallas.mosaic_gpu as plgpu

    idx = inspect.signature(plgpu.load).parameters.get("idx")
    if idx is not None and idx.default is inspect.Parameter.empty:
        return plgpu.load(ref, (), layout=layout)
    return plgpu.load(ref, layout=layout)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, scoped, *, causal, bq, bkv, stages, seq_kv,
               groups, scale):  # fmt: skip
    """dQ: each compute warpgroup owns ``bq`` query rows and walks the key blocks they see, as the forward does."""
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
        plgpu.set_max_registers(232, action="increase")
        q_smem, do_smem, lse_smem, delta_smem = q_smem2.at[wg], do_smem2.at[wg], lse_smem2.at[wg], delta_smem2.at[wg]
        row0 = cta_rows + wg * bq
        steps = causal_steps(row0, bq, bkv, n_kv) if causal else n_kv
        rows = (batch, pl.ds(row0, bq), head)
        plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem, q_ready.at[wg])
        plgpu.copy_gmem_to_smem(do_ref.at[rows], do_smem, do_ready.at[wg])
        plgpu.copy_gmem_to_smem(lse_ref.at[batch, head, pl.ds(row0, bq)], lse_smem, lse_ready.at[wg])
        plgpu.copy_gmem_to_smem(delta_ref.at[batch, head, pl.ds(row0, bq)], delta_smem, delta_ready.at[wg])
        for barrier in (q_ready, do_ready, lse_ready, delta_ready):
            plgpu.barrier_wait(barrier.at[wg])
        lse = _load(lse_smem, plgpu.Layout.WGMMA.reduce(1))
        delta = _load(delta_smem, plgpu.Layout.WGMMA.reduce(1))
        dq = plgpu.layout_cast(jnp.full((bq, head_dim), 0.0, jnp.float32), plgpu.Layout.WGMMA)

        def step(j, dq, masked=False):
            slot = lax.rem(j, jnp.array(stages, j.dtype))
            plgpu.barrier_wait(k_ready.at[slot])

            def qk(s_ref):  # s = q kᵀ
                plgpu.wgmma(s_ref, q_smem, k_smem.at[slot].transpose((1, 0)))
                return s_ref[...]

            s = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32))
            if masked:
                r = plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 0, layout=plgpu.Layout.WGMMA) + row0
                col = plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 1, layout=plgpu.Layout.WGMMA) + j * bkv
                s = jnp.where(col <= r, s, -jnp.inf)
            p = jnp.exp2(s * c - lax.broadcast_in_dim(lse, s.shape, [0]))  # the forward's weights, recomputed
            plgpu.barrier_wait(v_ready.at[slot])

            def dov(dp_ref):  # dP = dO vᵀ
                plgpu.wgmma(dp_ref, do_smem, v_smem.at[slot].transpose((1, 0)))
                return dp_ref[...]

            dp = pl.run_scoped(dov, plgpu.ACC((bq, bkv), jnp.float32))
            plgpu.barrier_arrive(v_free.at[slot])
            ds = (p * (dp - lax.broadcast_in_dim(delta, dp.shape, [0]))).astype(dtype)

            def dsk(dq_ref):  # dQ += dS k
                plgpu.wgmma(dq_ref, ds, k_smem.at[slot])

            dq = pl.run_state(dsk)(plgpu.ACC.init(dq))
            plgpu.barrier_arrive(k_free.at[slot])
            return dq

        if not causal:
            dq = lax.fori_loop(0, n_kv, step, dq)
        else:
            unmasked = jnp.minimum(lax.div(row0, jnp.array(bkv, jnp.int32)), steps)
            dq = lax.fori_loop(0, unmasked, step, dq)
            dq = lax.fori_loop(unmasked, steps, functools.partial(step, masked=True), dq)

            @pl.loop(steps, cta_steps)
            def _(j):  # warpgroup 0 ends early: keep freeing slots so warpgroup 1 goes on
                slot = lax.rem(j, jnp.array(stages, j.dtype))
                plgpu.barrier_arrive(k_free.at[slot])
                plgpu.barrier_arrive(v_free.at[slot])

        q_smem[...] = (dq * scale).astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[rows])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _copy():
        plgpu.set_max_registers(40, action="decrease")
        kv_head = lax.div(head, jnp.array(groups, head.dtype))

        def fetch(j, slot):
            rows = (batch, pl.ds(j * bkv, bkv), kv_head)
            plgpu.copy_gmem_to_smem(k_ref.at[rows], k_smem.at[slot], k_ready.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[rows], v_smem.at[slot], v_ready.at[slot])

        for i in range(stages):
            pl.when(i < cta_steps)(functools.partial(fetch, i, i))

        @pl.loop(0, cta_steps - stages)
        def _(j):
            slot = lax.rem(j, jnp.array(stages, j.dtype))
            plgpu.barrier_wait(k_free.at[slot])
            plgpu.barrier_wait(v_free.at[slot])
            fetch(j + stages, slot)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, scoped, *, causal, bq, bkv, stages,
                seq_q, groups, scale):  # fmt: skip
    """dK, dV: each compute warpgroup owns ``bkv`` keys of one kv head and walks, for each of the N // K query
    heads sharing it (GQA: summed here, in registers), the query blocks that see them."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    (k_smem2, v_smem2, q_smem, do_smem, lse_smem, delta_smem), ready, tile_free = scoped
    k_ready, v_ready, q_ready, do_ready, lse_ready, delta_ready = ready
    dtype, head_dim = q_ref.dtype, q_ref.shape[-1]
    batch, kv_head, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
    cta_keys = lax.axis_index("kv_seq") * (2 * bkv)
    n_q = jnp.array(seq_q // bq, jnp.int32)
    # causal: query blocks wholly above the diagonal never see these keys; the CTA starts at the first that does
    first = jnp.minimum(lax.div(cta_keys, jnp.array(bq, jnp.int32)), n_q) if causal else jnp.array(0, jnp.int32)
    per_head = n_q - first
    total = groups * per_head  # pipeline steps: (query head of the group, query block)
    c = scale * LOG2E

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(232, action="increase")
        k_smem, v_smem = k_smem2.at[wg], v_smem2.at[wg]
        key0 = cta_keys + wg * bkv
        keys = (batch, pl.ds(key0, bkv), kv_head)
        plgpu.copy_gmem_to_smem(k_ref.at[keys], k_smem, k_ready.at[wg])
        plgpu.copy_gmem_to_smem(v_ref.at[keys], v_smem, v_ready.at[wg])
        plgpu.barrier_wait(k_ready.at[wg])
        plgpu.barrier_wait(v_ready.at[wg])
        zeros = jnp.full((bkv, head_dim), 0.0, jnp.float32)
        dk = plgpu.layout_cast(zeros, plgpu.Layout.WGMMA)
        dv = plgpu.layout_cast(zeros, plgpu.Layout.WGMMA)

        def wait_tile(slot):
            for barrier in (q_ready, do_ready, lse_ready, delta_ready):
                plgpu.barrier_wait(barrier.at[slot])

        def skip(jq, carry, base):  # a block the CTA loads but this warpgroup's keys never see: pass it on
            slot = lax.rem(base + jq, jnp.array(stages, jnp.int32))
            wait_tile(slot)
            plgpu.barrier_arrive(tile_free.at[slot])
            return carry

        def step(jq, carry, base, masked):
            dk, dv = carry
            slot = lax.rem(base + jq, jnp.array(stages, jnp.int32))
            wait_tile(slot)
            q_tile, do_tile = q_smem.at[slot], do_smem.at[slot]

            def kq(s_ref):  # sᵀ = k qᵀ: (keys, queries)
                plgpu.wgmma(s_ref, k_smem, q_tile.transpose((1, 0)))
                return s_ref[...]

            st = pl.run_scoped(kq, plgpu.ACC((bkv, bq), jnp.float32))
            if masked:
                key = plgpu.broadcasted_iota(jnp.int32, (bkv, bq), 0, layout=plgpu.Layout.WGMMA) + key0
                row = plgpu.broadcasted_iota(jnp.int32, (bkv, bq), 1, layout=plgpu.Layout.WGMMA) + jq * bq
                st = jnp.where(key <= row, st, -jnp.inf)
            lse = _load(lse_smem.at[slot], plgpu.Layout.WGMMA.reduce(0))
            pt = jnp.exp2(st * c - lax.broadcast_in_dim(lse, st.shape, [1]))  # Pᵀ

            def dv_and_dpt(refs):  # both matmuls in one group: one wait instead of two
                dv_ref, dpt_ref = refs
                plgpu.wgmma(dv_ref, pt.astype(dtype), do_tile)  # dV += Pᵀ dO
                plgpu.wgmma(dpt_ref, v_smem, do_tile.transpose((1, 0)))  # dPᵀ = v dOᵀ

            dpt0 = plgpu.layout_cast(jnp.full((bkv, bq), 0.0, jnp.float32), plgpu.Layout.WGMMA)
            dv, dpt = pl.run_state(dv_and_dpt)((plgpu.ACC.init(dv), plgpu.ACC.init(dpt0)))
            delta = _load(delta_smem.at[slot], plgpu.Layout.WGMMA.reduce(0))
            dst = (pt * (dpt - lax.broadcast_in_dim(delta, dpt.shape, [1]))).astype(dtype)  # dSᵀ

            def dk_step(dk_ref):  # dK += dSᵀ q
                plgpu.wgmma(dk_ref, dst, q_tile)

            dk = pl.run_state(dk_step)(plgpu.ACC.init(dk))
            plgpu.barrier_arrive(tile_free.at[slot])
            return dk, dv

        n_q_ = n_q
        if causal:
            mine = jnp.minimum(lax.div(key0, jnp.array(bq, jnp.int32)), n_q_)  # first block that sees our keys
            unmasked = jnp.minimum(pl.cdiv(key0 + bkv, jnp.array(bq, jnp.int32)), n_q_)  # ... wholly below them
        else:
            mine = unmasked = first

        def one_head(g, carry):
            base = g * per_head - first  # pipeline step of (g, query block jq) is base + jq
            lax.fori_loop(first, mine, functools.partial(skip, base=base), None)
            carry = lax.fori_loop(mine, unmasked, functools.partial(step, base=base, masked=True), carry)
            return lax.fori_loop(unmasked, n_q_, functools.partial(step, base=base, masked=False), carry)

        dk, dv = lax.fori_loop(0, groups, one_head, (dk, dv))
        k_smem[...] = (dk * scale).astype(dtype)
        v_smem[...] = dv.astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[keys])
        plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[keys])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _copy():
        plgpu.set_max_registers(40, action="decrease")

        def fetch(t, slot):
            g, jq = lax.div(t, jnp.maximum(per_head, 1)), first + lax.rem(t, jnp.maximum(per_head, 1))
            head = kv_head * groups + g
            rows = (batch, pl.ds(jq * bq, bq), head)
            plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem.at[slot], q_ready.at[slot])
            plgpu.copy_gmem_to_smem(do_ref.at[rows], do_smem.at[slot], do_ready.at[slot])
            plgpu.copy_gmem_to_smem(lse_ref.at[batch, head, pl.ds(jq * bq, bq)], lse_smem.at[slot], lse_ready.at[slot])
            plgpu.copy_gmem_to_smem(
                delta_ref.at[batch, head, pl.ds(jq * bq, bq)], delta_smem.at[slot], delta_ready.at[slot]
            )

        for i in range(stages):
            pl.when(i < total)(functools.partial(fetch, jnp.array(i, jnp.int32), i))

        @pl.loop(0, total - stages)
        def _(t):
            slot = lax.rem(t, jnp.array(stages, t.dtype))
            plgpu.barrier_wait(tile_free.at[slot])
            fetch(t + stages, slot)


def mosaic_flash_attention(
    q,
    k,
    v,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    config: MosaicConfig | None = None,
    return_lse: bool = False,
):
    """Our Mosaic GPU FlashAttention: q (B, T, N, H), k/v (B, S, K, H) -> (B, T, N, H), differentiable. Hopper only.

    float16 or bfloat16; H = 64 or 128 (or 256, forward only: :func:`default_config` then takes block_kv = 64); T a
    multiple of 2·block_q (128), S a multiple of block_kv (128; 64 at H = 256). Causal
    masks align top-left, as everywhere on this site. ``return_lse=True`` returns ``(out, lse)`` with lse
    (B, N, T) float32, each row's natural log-sum-exp of the scaled scores (for context parallelism; differentiable).

    The backward (``jax.custom_vjp``; FlashAttention-2 with FlashAttention-3's Hopper machinery, after JAX's
    ``attention_mgpu``) recomputes the weights from the saved log-sum-exp in two warp-specialised kernels — two
    wgmma warpgroups and one TMA warpgroup each: one owns key blocks and accumulates dK, dV over the query blocks
    (and, for GQA, the query heads) that see them; the other owns query blocks and accumulates dQ. dQ gets its own
    pass instead of atomic float32 adds from the dK/dV kernel: every CTA owns its outputs (deterministic, no
    float32 dQ buffer and conversion pass), at the cost of recomputing q·kᵀ and dO·vᵀ once more.
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    cfg = config or default_config(H)
    problem = _problem_why_not(AttentionShape(B, T, S, N, K, H), q.dtype, cfg)
    if problem:
        raise ValueError(f"mosaic_flash_attention: {problem}")
    plan = _Plan(check_flag("is_causal", is_causal), positive_scale(scale, H), cfg)
    out, lse2 = _mosaic(q, k, v, plan)
    return (out, lse2 * (1.0 / LOG2E)) if return_lse else out


def mosaic_flash_backward(q, k, v, out, lse, d_out, *, is_causal: bool = False, scale: float | None = None,
                          config: MosaicConfig | None = None):  # fmt: skip
    """(dq, dk, dv) from a given output and natural log-sum-exp (B, N, T): the backward kernels on their own.

    What a context-parallel ring needs: its merged ``out`` and ``lse`` over all keys, and this kernel's share of
    the gradient for one block of keys (P rebuilt from the merged lse is the block's slice of the full softmax).
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    cfg = config or default_config(H)
    problem = _problem_why_not(AttentionShape(B, T, S, N, K, H), q.dtype, cfg)
    if problem:
        raise ValueError(f"mosaic_flash_backward: {problem}")
    if out.shape != q.shape or d_out.shape != q.shape or lse.shape != (B, N, T):
        raise ValueError(f"out and d_out must have q's shape {q.shape} and lse (B, N, T) = {(B, N, T)}; got out "
                         f"{out.shape}, d_out {d_out.shape}, lse {lse.shape}.")  # fmt: skip
    plan = _Plan(check_flag("is_causal", is_causal), positive_scale(scale, H), cfg)
    delta = jnp.einsum("btnh,btnh->bnt", out.astype(jnp.float32), d_out.astype(jnp.float32))
    lse2 = lse.astype(jnp.float32) * LOG2E
    return _backward(q, k, v, d_out.astype(q.dtype), lse2, delta, plan)


def positive_scale(scale, head_dim: int) -> float:
    """:func:`~attention_tutorial.inputs.resolve_scale`, refusing zero and negative scales: our kernels take each
    row's running maximum of the raw scores and multiply it by the scale, which is the maximum of the scaled ones only
    for a positive scale (a masked score is -inf, and -inf · 0 is NaN)."""
    value = resolve_scale(scale, head_dim)
    if value <= 0:
        raise ValueError(f"our Mosaic GPU kernels take a positive softmax scale; got {value}. For a negative one, "
                         "negate q and pass its absolute value.")  # fmt: skip
    return value


@dataclasses.dataclass(frozen=True)
class _Plan:
    causal: bool
    scale: float
    cfg: MosaicConfig


def _call(body, out_type, scratch, grid, grid_names, *args):
    """One warp-specialised Mosaic GPU kernel: two compute warpgroups and one copy warpgroup per CTA."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    def entry(*refs):
        pl.run_scoped(lambda *scoped: body(*refs, scoped), *scratch, collective_axes="wg")

    return plgpu.kernel(
        entry,
        out_type=out_type,
        grid=grid,
        grid_names=grid_names,
        num_threads=3,  # warpgroups per CTA: two compute, one copy
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),  # exp2 as the hardware's ex2.approx
    )(*args)


def _tile():
    """Shared-memory tiles in 8×64 tiles with a 128-byte swizzle: the layout wgmma and TMA read without bank
    conflicts."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    return (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))


def _forward(q, k, v, plan: _Plan):
    """The forward kernel: (out, lse2), lse2 (B, N, T) the base-2 log-sum-exp of the scaled scores."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    cfg = plan.cfg
    B, T, S, N, K, H = attention_shape(q, k, v)
    stages = min(cfg.stages, S // cfg.block_kv)
    smem = (
        plgpu.SMEM((2, cfg.block_q, H), q.dtype, transforms=_tile()),  # q / output, one per compute warpgroup
        plgpu.SMEM((stages, cfg.block_kv, H), q.dtype, transforms=_tile()),  # k ring
        plgpu.SMEM((stages, cfg.block_kv, H), q.dtype, transforms=_tile()),  # v ring
        plgpu.SMEM((2, cfg.block_q), jnp.float32),  # log-sum-exp out, one per compute warpgroup
    )
    barriers = (
        (plgpu.Barrier(num_barriers=stages), plgpu.Barrier(num_barriers=stages), plgpu.Barrier(num_barriers=2)),
        (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 2,  # k_free, v_free: both compute warpgroups
        plgpu.Barrier(num_arrivals=2),  # the schedule barrier
    )
    kernel = functools.partial(
        _kernel, causal=plan.causal, cfg=cfg, stages=stages, seq_kv=S, groups=N // K, scale=plan.scale
    )
    out_type = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, N, T), jnp.float32)]
    grid = (N, T // (2 * cfg.block_q), B)
    return tuple(_call(kernel, out_type, (smem, *barriers), grid, ("heads", "q_seq", "batch"), q, k, v))


def _backward(q, k, v, d_out, lse2, delta, plan: _Plan):
    """dq, dk, dv from the two backward kernels (see :func:`mosaic_flash_attention`)."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    cfg = plan.cfg
    B, T, S, N, K, H = attention_shape(q, k, v)
    if H > 128:  # dK and dV at H = 256 would take 2 × 128 registers per thread alone
        raise ValueError(f"the backward kernels take H = 64 or 128; got H={H} (H = 256 is forward-only here).")
    bq, bkv, dt = cfg.bwd_block_q, cfg.bwd_block_kv, q.dtype
    common = dict(causal=plan.causal, bq=bq, bkv=bkv, groups=N // K, scale=plan.scale)
    args = (q, k, v, d_out, lse2, delta)

    def two(shape, dtype, **kw):
        return plgpu.SMEM((2, *shape), dtype, **kw)

    stages = min(cfg.bwd_stages, S // bkv)
    smem = (two((bq, H), dt, transforms=_tile()), two((bq, H), dt, transforms=_tile()), two((bq,), jnp.float32),
            two((bq,), jnp.float32), plgpu.SMEM((stages, bkv, H), dt, transforms=_tile()),
            plgpu.SMEM((stages, bkv, H), dt, transforms=_tile()))  # fmt: skip
    ready = (*(plgpu.Barrier(num_barriers=2),) * 4, *(plgpu.Barrier(num_barriers=stages),) * 2)
    free = (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 2
    kernel = functools.partial(_dq_kernel, stages=stages, seq_kv=S, **common)
    grid = (N, T // (2 * bq), B)
    dq = _call(kernel, jax.ShapeDtypeStruct(q.shape, dt), (smem, ready, free), grid, ("heads", "q_seq", "batch"),
               *args)  # fmt: skip

    stages = min(cfg.bwd_stages, (N // K) * (T // bq))
    smem = (two((bkv, H), dt, transforms=_tile()), two((bkv, H), dt, transforms=_tile()),
            plgpu.SMEM((stages, bq, H), dt, transforms=_tile()), plgpu.SMEM((stages, bq, H), dt, transforms=_tile()),
            plgpu.SMEM((stages, bq), jnp.float32), plgpu.SMEM((stages, bq), jnp.float32))  # fmt: skip
    ready = (*(plgpu.Barrier(num_barriers=2),) * 2, *(plgpu.Barrier(num_barriers=stages),) * 4)
    free = plgpu.Barrier(num_arrivals=2, num_barriers=stages)
    kernel = functools.partial(_dkv_kernel, stages=stages, seq_q=T, **common)
    grid = (K, S // (2 * bkv), B)
    out_type = [jax.ShapeDtypeStruct(k.shape, dt)] * 2
    dk, dv = _call(kernel, out_type, (smem, ready, free), grid, ("heads", "kv_seq", "batch"), *args)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _mosaic(q, k, v, plan):
    return _forward(q, k, v, plan)


def _mosaic_fwd(q, k, v, plan):
    out, lse2 = _forward(q, k, v, plan)
    return (out, lse2), (q, k, v, out, lse2)


def _mosaic_bwd(plan: _Plan, residuals, cotangents):
    q, k, v, out, lse2 = residuals
    d_out, d_lse2 = cotangents
    # D = rowsum(dO ∘ O); a cotangent on the log-sum-exp adds P·d_lse to dS, i.e. shifts D (base 2 -> natural).
    delta = jnp.einsum("btnh,btnh->bnt", out.astype(jnp.float32), d_out.astype(jnp.float32))
    delta = delta - LOG2E * d_lse2.astype(jnp.float32)
    return _backward(q, k, v, d_out.astype(q.dtype), lse2, delta, plan)


_mosaic.defvjp(_mosaic_fwd, _mosaic_bwd)


def _on_hopper() -> str | None:
    if jax.default_backend() != "gpu":
        return "it is a Hopper (sm_90) kernel: it needs an NVIDIA H100/H200-class GPU."
    cc = getattr(jax.devices()[0], "compute_capability", "")
    if not str(cc).startswith("9"):
        return f"it uses Hopper-only instructions (wgmma, TMA): needs compute capability 9.x, this GPU has {cc}."
    return None


SMEM_BYTES = 227 * 1024  # shared memory one CTA may use on Hopper (H100, H200)
SMEM_RESERVE = 4 * 1024  # on top of the tiles, where not measured otherwise: the pipelined forward with 3 stages at
# H = 128 asked the H200 for 232,568 B against the 229,888 counted (the plain one with 3 stages compiled and ran)
TILE_REGISTERS = 192  # of a compute thread's 232 (set_max_registers), for tiles; the rest: indices, max, sum, ...


def smem_bytes(cfg: MosaicConfig, head_dim: int, dtype) -> int:
    """Bytes of shared memory the forward allocates: both compute warpgroups' q/output tiles (2·block_q × H),
    the k and v rings (stages·block_kv × H each) and the log-sum-exp rows. H = 256 in 16 bits: 64 KiB of q with
    2×64 rows, and k + v take 2·stages·block_kv·512 B: block_kv = 128 with 2 stages needs 256 KiB more (too much),
    block_kv = 64 with 2 stages 128 KiB (192.5 KiB in all)."""
    item = jnp.dtype(dtype).itemsize
    return (2 * cfg.block_q + 2 * cfg.stages * cfg.block_kv) * head_dim * item + 2 * cfg.block_q * 4


def tile_registers(cfg: MosaicConfig, head_dim: int) -> int:
    """32-bit registers per compute thread for the forward's tiles, each spread over a warpgroup's 128 threads: the
    float32 accumulator (block_q × H: 128 at H = 256), the float32 scores s (block_q × block_kv) and p in 16 bits
    (two to a register) — twice when pipelined (block j's p feeds the running p·v while block j+1's is made)."""
    regs = lambda cols, bits: cfg.block_q * cols * bits // 32 // 128  # noqa: E731
    return regs(head_dim, 32) + regs(cfg.block_kv, 32) + regs(cfg.block_kv, 16) * (2 if cfg.pipeline else 1)


def _problem_why_not(shape: AttentionShape, dtype, cfg: MosaicConfig) -> str | None:
    name = jnp.dtype(dtype).name
    if name not in ("bfloat16", "float16"):
        return f"it takes bfloat16 or float16 inputs, not {name}."
    H = shape.head_dim
    if H not in (64, 128, 256):
        return f"head_dim must be 64, 128 or 256; got {H}."
    reserve = SMEM_RESERVE if cfg.pipeline else 0
    if (need := smem_bytes(cfg, H, dtype)) + reserve > SMEM_BYTES:
        return (
            f"at H={H}, block_kv={cfg.block_kv} and stages={cfg.stages} the forward's tiles need {need / 1024:.1f} "
            f"KiB of shared memory, more than the {(SMEM_BYTES - reserve) // 1024} KiB a Hopper CTA leaves for them: "
            f"pick a smaller block_kv or "
            f"fewer stages (H=256 fits with config=MosaicConfig(block_kv=64, stages=2), or pass no config)."
        )
    if (H > 128 or cfg.pipeline) and (regs := tile_registers(cfg, H)) > TILE_REGISTERS:
        return (
            f"at H={H}, block_kv={cfg.block_kv}{' with pipeline=True' if cfg.pipeline else ''} the forward's tiles "
            f"need {regs} registers per thread, more than the {TILE_REGISTERS} this kernel budgets: pick "
            f"block_kv=64 (e.g. config=MosaicConfig(block_kv=64, stages=2{', pipeline=True' if cfg.pipeline else ''}))."
        )
    if shape.seq_q % (2 * cfg.block_q):
        return f"T must be a multiple of 2·block_q = {2 * cfg.block_q}; got T={shape.seq_q}. Pad the queries."
    if shape.seq_kv % cfg.block_kv:
        return f"S must be a multiple of block_kv = {cfg.block_kv}; got S={shape.seq_kv}. Pad the keys."
    if shape.seq_q % (2 * cfg.bwd_block_q) or shape.seq_kv % (2 * cfg.bwd_block_kv):
        return (
            f"the backward needs T a multiple of 2·bwd_block_q = {2 * cfg.bwd_block_q} and S of 2·bwd_block_kv = "
            f"{2 * cfg.bwd_block_kv}; got T={shape.seq_q}, S={shape.seq_kv}. Pad, or pick smaller bwd blocks."
        )
    return None


def default_config(head_dim: int, *, pipeline: bool = False) -> MosaicConfig:
    """The tiles used when no config is given: ``MosaicConfig()`` (block_kv = 128, 2 stages); at H = 256 block_kv =
    64, since 128 would need more shared memory (:func:`smem_bytes`) and registers (:func:`tile_registers`)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ValueError(f"head_dim must be a positive int; got {head_dim!r}.")
    return MosaicConfig(block_kv=64 if head_dim > 128 else 128, pipeline=pipeline)


def why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why our Mosaic GPU kernel cannot run this problem here, or None."""
    return _on_hopper() or _problem_why_not(shape, dtype, default_config(shape.head_dim))


def mosaic_pipelined_attention(q, k, v, *, is_causal: bool = False, scale: float | None = None):
    """:func:`mosaic_flash_attention` with FlashAttention-3's intra-warpgroup pipelining in the forward
    (``default_config(H, pipeline=True)``, see :func:`_pipelined_steps`); the same backward."""
    config = default_config(attention_shape(q, k, v).head_dim, pipeline=True)
    return mosaic_flash_attention(q, k, v, is_causal=is_causal, scale=scale, config=config)


def pipelined_why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why the pipelined forward cannot run this problem here, or None."""
    return _on_hopper() or _problem_why_not(shape, dtype, default_config(shape.head_dim, pipeline=True))


def jax_bundled_mosaic(q, k, v, *, is_causal: bool = False):
    """JAX's bundled Mosaic GPU kernel, ``jax.experimental.pallas.ops.gpu.attention_mgpu.attention``, to race.

    It applies no softmax scale, so q is scaled first (one fused elementwise pass, timed with it); float16 only.
    Its backward (64×64 blocks, as JAX's tests use) has no causal mask: differentiating a causal call raises.
    """
    from jax.experimental.pallas.ops.gpu import attention_mgpu

    H = q.shape[-1]
    config = attention_mgpu.TuningConfig(
        block_q=64, block_kv=128, max_concurrent_steps=2, causal=is_causal,
        block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64,
    )  # fmt: skip
    return attention_mgpu.attention((q * (1.0 / math.sqrt(H))).astype(q.dtype), k, v, config)


def bundled_why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why JAX's bundled Mosaic GPU kernel cannot run this problem here, or None."""
    if reason := _on_hopper():
        return reason
    if jnp.dtype(dtype).name != "float16":
        return f"JAX's kernel allocates float16 shared memory: float16 inputs only, not {jnp.dtype(dtype).name}."
    return _problem_why_not(shape, dtype, MosaicConfig())
