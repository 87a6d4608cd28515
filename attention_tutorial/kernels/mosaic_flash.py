"""Our FlashAttention forward for Hopper, in Pallas's Mosaic GPU lowering: the kernel that races cuDNN.

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
the other's matmuls run, so neither unit waits (FlashAttention-3's "ping-pong").
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from ..inputs import AttentionShape, attention_shape

LOG2E = math.log2(math.e)


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
    """Tile sizes: ``block_q`` rows per compute warpgroup (wgmma's M is 64), ``block_kv`` keys per step, and
    ``stages`` k/v slots in flight."""

    block_q: int = 64
    block_kv: int = 128
    stages: int = 2


def _kernel(q_ref, k_ref, v_ref, o_ref, scoped, *, causal, cfg, stages, seq_kv, groups, scale):
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    (qo_smem2, k_smem, v_smem), (k_ready, v_ready, q_ready), (k_free, v_free), schedule = scoped
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
        steps = jnp.minimum(pl.cdiv(row0 + bq, jnp.array(bkv, jnp.int32)), n_kv) if causal else n_kv

        plgpu.copy_gmem_to_smem(q_ref.at[batch, pl.ds(row0, bq), head], qo_smem, q_ready.at[wg])
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
            # Online softmax in base 2 with the scale folded in: exp(scale·s) = 2^(scale·log2e·s) — one FMA each.
            c = scale * LOG2E
            m_new = jnp.maximum(m, s.max(axis=1) * c)
            alpha = jnp.exp2(m - m_new)  # rescales what was summed relative to the old max
            p = jnp.exp2(s * c - lax.broadcast_in_dim(m_new, s.shape, [0]))
            acc *= lax.broadcast_in_dim(alpha, acc.shape, [0])
            l = l * alpha + p.sum(axis=1)
            p16 = p.astype(dtype)
            # Keep the compiler from sinking the softmax past the barriers below (it would serialise the turns).
            acc, l, m_new, p16 = lax.optimization_barrier((acc, l, m_new, p16))
            plgpu.barrier_arrive(schedule)  # softmax done
            plgpu.barrier_wait(v_ready.at[slot])
            plgpu.barrier_wait(schedule)  # the other warpgroup has issued its matmul: our turn

            def pv(acc_ref):  # acc += p v, p straight from registers; meanwhile wait for the next k tile
                plgpu.wgmma(acc_ref, p16, v_smem.at[slot])

                @pl.when(j + 1 < steps)
                def _():
                    plgpu.barrier_wait(k_ready.at[lax.rem(j + 1, jnp.array(stages, j.dtype))])

            acc = pl.run_state(pv)(plgpu.ACC.init(acc))
            plgpu.barrier_arrive(v_free.at[slot])
            return acc, m_new, l

        if not causal:
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
        qo_smem[...] = (acc / lax.broadcast_in_dim(l, acc.shape, [0])).astype(dtype)
        plgpu.commit_smem()  # make the stores visible to the TMA engine
        plgpu.copy_smem_to_gmem(qo_smem, o_ref.at[batch, pl.ds(row0, bq), head])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _copy():
        plgpu.set_max_registers(40, action="decrease")
        kv_head = lax.div(head, jnp.array(groups, head.dtype))  # GQA: query head n reads kv head n // (N/K)
        for i in range(stages):  # fill the ring
            rows = (batch, pl.ds(i * bkv, bkv), kv_head)
            plgpu.copy_gmem_to_smem(k_ref.at[rows], k_smem.at[i], k_ready.at[i])
            plgpu.copy_gmem_to_smem(v_ref.at[rows], v_smem.at[i], v_ready.at[i])

        @pl.loop(0, cta_steps - stages)
        def _(j):  # refill each slot once both compute warpgroups are done with it
            slot = lax.rem(j, jnp.array(stages, j.dtype))
            rows = (batch, pl.ds((j + stages) * bkv, bkv), kv_head)
            plgpu.barrier_wait(k_free.at[slot])
            plgpu.copy_gmem_to_smem(k_ref.at[rows], k_smem.at[slot], k_ready.at[slot])
            plgpu.barrier_wait(v_free.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[rows], v_smem.at[slot], v_ready.at[slot])


def mosaic_flash_attention(
    q, k, v, *, is_causal: bool = False, scale: float | None = None, config: MosaicConfig | None = None
) -> jax.Array:
    """Our Mosaic GPU FlashAttention forward: q (B, T, N, H), k/v (B, S, K, H) -> (B, T, N, H). Hopper only.

    float16 or bfloat16; H = 64 or 128; T a multiple of 2·block_q (128), S a multiple of block_kv (128). Causal
    masks align top-left, as everywhere on this site.
    """
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    cfg = config or MosaicConfig()
    B, T, S, N, K, H = attention_shape(q, k, v)
    problem = _problem_why_not(AttentionShape(B, T, S, N, K, H), q.dtype, cfg)
    if problem:
        raise ValueError(f"mosaic_flash_attention: {problem}")
    scale = 1.0 / math.sqrt(H) if scale is None else float(scale)
    stages = min(cfg.stages, S // cfg.block_kv)
    # Shared memory: tiles are stored in 8×64 tiles with a 128-byte swizzle, the layout wgmma and TMA read
    # without bank conflicts.
    tile = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    smem = (
        plgpu.SMEM((2, cfg.block_q, H), q.dtype, transforms=tile),  # q / output, one per compute warpgroup
        plgpu.SMEM((stages, cfg.block_kv, H), q.dtype, transforms=tile),  # k ring
        plgpu.SMEM((stages, cfg.block_kv, H), q.dtype, transforms=tile),  # v ring
    )
    barriers = (
        (plgpu.Barrier(num_barriers=stages), plgpu.Barrier(num_barriers=stages), plgpu.Barrier(num_barriers=2)),
        (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 2,  # k_free, v_free: both compute warpgroups
        plgpu.Barrier(num_arrivals=2),  # the schedule barrier
    )
    kernel = functools.partial(_kernel, causal=is_causal, cfg=cfg, stages=stages, seq_kv=S, groups=N // K, scale=scale)

    def entry(q_ref, k_ref, v_ref, o_ref):
        pl.run_scoped(lambda *scoped: kernel(q_ref, k_ref, v_ref, o_ref, scoped), smem, *barriers, collective_axes="wg")

    return plgpu.kernel(
        entry,
        out_type=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(N, T // (2 * cfg.block_q), B),
        grid_names=("heads", "q_seq", "batch"),
        num_threads=3,  # warpgroups per CTA: two compute, one copy
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),  # exp2 as the hardware's ex2.approx
    )(q, k, v)


def _on_hopper() -> str | None:
    if jax.default_backend() != "gpu":
        return "it is a Hopper (sm_90) kernel: it needs an NVIDIA H100/H200-class GPU."
    cc = getattr(jax.devices()[0], "compute_capability", "")
    if not str(cc).startswith("9"):
        return f"it uses Hopper-only instructions (wgmma, TMA): needs compute capability 9.x, this GPU has {cc}."
    return None


def _problem_why_not(shape: AttentionShape, dtype, cfg: MosaicConfig) -> str | None:
    name = jnp.dtype(dtype).name
    if name not in ("bfloat16", "float16"):
        return f"it takes bfloat16 or float16 inputs, not {name}."
    if shape.head_dim not in (64, 128):
        return f"head_dim must be 64 or 128; got {shape.head_dim}."
    if shape.seq_q % (2 * cfg.block_q):
        return f"T must be a multiple of 2·block_q = {2 * cfg.block_q}; got T={shape.seq_q}. Pad the queries."
    if shape.seq_kv % cfg.block_kv:
        return f"S must be a multiple of block_kv = {cfg.block_kv}; got S={shape.seq_kv}. Pad the keys."
    return None


def why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why our Mosaic GPU kernel cannot run this problem here, or None."""
    return _on_hopper() or _problem_why_not(shape, dtype, MosaicConfig())


def jax_bundled_mosaic(q, k, v, *, is_causal: bool = False):
    """JAX's bundled Mosaic GPU kernel, ``jax.experimental.pallas.ops.gpu.attention_mgpu.attention``, to race.

    It applies no softmax scale, so q is scaled first (one fused elementwise pass, timed with it); float16 only.
    """
    from jax.experimental.pallas.ops.gpu import attention_mgpu

    H = q.shape[-1]
    config = attention_mgpu.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=is_causal)
    return attention_mgpu.attention((q * (1.0 / math.sqrt(H))).astype(q.dtype), k, v, config)


def bundled_why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why JAX's bundled Mosaic GPU kernel cannot run this problem here, or None."""
    if reason := _on_hopper():
        return reason
    if jnp.dtype(dtype).name != "float16":
        return f"JAX's kernel allocates float16 shared memory: float16 inputs only, not {jnp.dtype(dtype).name}."
    return _problem_why_not(shape, dtype, MosaicConfig())
