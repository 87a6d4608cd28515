"""An FP8 forward of our own: the forward kernel's shape on E4M3 inputs.

What changes against the 16-bit forward (:mod:`attention_tutorial.kernels.mosaic.forward`), and why (Hopper's FP8
wgmma, FlashAttention-3 §3.3, cuDNN's FP8 path):

* q, k and v are quantised per tensor to ``float8_e4m3fn``: ``x8 = x · (448 / max|x|)``, each with its *descale*
  (the inverse) kept in float32. q·kᵀ runs in FP8 with float32 accumulation; the two descales and the softmax
  scale fold into one factor of the logits (:func:`logit_factors`).
* Hopper's FP8 wgmma reads both operands K-major. For q·kᵀ that is how q and k lie already; for p·v the contraction
  runs over the keys, so v is handed over transposed, (B, K, H, S) — fused into the quantising pass by XLA.
* p (at most 1) is stored in E4M3 times ``p_scale`` (448 by default, the format's largest value, as cuDNN's
  ``scale_s``), and p·v runs in FP8 too. Mosaic GPU has no relayout of registers into the 8-bit operand layout.
  ``p_via="registers"`` (the default; the flash page times both ways) keeps p in registers anyway, taking each thread's
  four scores of a 16-key group *as they lie* as the operand's four, and permutes v's keys to match
  (:func:`operand_key_order`, fused into the quantising pass); ``p_via="smem"`` takes the plain way, storing p to
  shared memory and reading it back as the operand. FlashAttention-3 permutes bytes in registers instead.
* The output is bfloat16: ``acc · descale_v / p_scale / l``.

Legend: B batch, T query length, S key length, N heads, K kv heads, H head dim.
"""

from __future__ import annotations

import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...inputs import AttentionShape, attention_shape, check_flag
from ._common import (
    LOG2E,
    call,
    causal_block_mask,
    causal_steps,
    copy_kv_ring,
    drain,
    on_hopper,
    positive_scale,
    regions,
    shared_lowering,
    swizzled_tiles,
)
from .budget import FP8_HEAD_DIMS, MosaicConfig, copy_registers, fp8_problem
from .exp2 import softmax_exp2

__all__ = ["E4M3_MAX", "F8", "FP8_HEAD_DIMS", "P_VIA", "fp8_forward", "fp8_forward_kernel", "logit_factors",
           "mosaic_fp8_attention", "operand_key_order", "operand_register_pairs", "quantize_e4m3", "why_not"]  # fmt: skip

F8 = jnp.float8_e4m3fn
E4M3_MAX = float(jnp.finfo(F8).max)  # 448


def quantize_e4m3(x):
    """``x`` (any float) -> (E4M3 array, float32 descale): per-tensor, the largest magnitude maps to 448."""
    amax = jnp.max(jnp.abs(x.astype(jnp.float32)))
    scale = E4M3_MAX / jnp.maximum(amax, 1e-12)
    return (x.astype(jnp.float32) * scale).astype(F8), 1.0 / scale


def logit_factors(softmax_scale: float, descale_q, descale_k, descale_v, p_scale: float):
    """The kernel's two factors, padded to 128 floats (one TMA copy): base-2 logits per unit of q8·k8ᵀ, and the
    output's factor per unit of the FP8 p·v accumulator."""
    c = softmax_scale * LOG2E * descale_q * descale_k
    return jnp.zeros((128,), jnp.float32).at[0].set(c).at[1].set(descale_v / p_scale)


def why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why our FP8 forward cannot run this problem here, or None."""
    return on_hopper() or fp8_problem(shape, MosaicConfig())


P_VIA = ("smem", "registers")


def operand_key_order(n: int) -> np.ndarray:
    """The key order that makes p in wgmma's accumulator layout read as the 8-bit A operand, for ``n`` keys (a
    multiple of 16): a thread holds scores 2t, 2t+1, 8+2t, 9+2t of each 16-key group (two pairs, the 32-bit layout)
    where the operand wants its columns 4t … 4t+3; so operand column 16J + 4t + 2h + e takes key 16J + 8h + 2t + e.
    Returns that key for each column (a permutation)."""
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0 or n % 16:
        raise ValueError(f"operand_key_order needs a positive multiple of 16 keys; got {n!r}.")
    m = np.arange(n)
    t, h, e = (m % 16) // 4, (m % 4) // 2, m % 2
    return m - m % 16 + 8 * h + 2 * t + e


def operand_register_pairs(shape) -> dict[tuple, tuple]:
    """{register of the 8-bit operand layout: the two accumulator-layout registers (two scores each) that make its
    four, in order}, for a (rows, keys) tile: the regrouping :func:`_to_operand` does, kept apart to be tested."""
    import jax.experimental.mosaic.gpu as mgpu

    out_shape = mgpu.WGMMA_LAYOUT_8BIT.registers_shape(shape)  # (…, keys / 16, …): four scores each
    return {idx: tuple((idx[0], 2 * idx[1] + i, *idx[2:]) for i in (0, 1)) for idx in np.ndindex(out_shape)}


def _to_operand(shape):
    """f32 p in wgmma's layout -> E4M3 in the 8-bit operand layout, registers reused as they lie (see
    :func:`operand_key_order`): each pair of two-score registers of a 16-key group becomes one four-score one."""
    import jax.experimental.mosaic.gpu as mgpu
    import jax.experimental.pallas.mosaic_gpu as plgpu

    def to_operand(ctx, p):
        regs = p.astype(mgpu.utils.dtype_to_ir_type(F8)).registers  # (…, keys / 8, …): two scores each
        out = np.empty(mgpu.WGMMA_LAYOUT_8BIT.registers_shape(shape), dtype=object)
        for idx, pair in operand_register_pairs(shape).items():
            out[idx] = mgpu.utils.vector_concat([regs[i] for i in pair])
        return mgpu.FragmentedArray(_registers=out, _layout=mgpu.WGMMA_LAYOUT_8BIT, _is_signed=None)

    # The same on a plain array (the CPU interpreter): operand column c holds key operand_key_order(c).
    to_operand.logical = lambda p: p[:, operand_key_order(shape[1])].astype(F8)
    return plgpu.inline_mgpu(
        arg_types=(plgpu.Layout.WGMMA,), return_type=plgpu.ShapeDtypeStruct(shape, F8, layout=plgpu.Layout.WGMMA_8BIT)
    )(to_operand)


def mosaic_fp8_attention(
    q,
    k,
    v,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    p_scale: float = E4M3_MAX,
    config: MosaicConfig | None = None,
    p_via: str = "registers",
):
    """Our FP8 attention forward: q (B, T, N, H), k/v (B, S, K, H) in any float type -> bfloat16 (B, T, N, H).

    Quantises q, k, v per tensor to E4M3 (:func:`quantize_e4m3`; timed with the kernel, as
    :func:`attention_tutorial.measure.fp8.cudnn_fp8_attention` times cuDNN's), runs both matmuls in FP8 and
    returns bfloat16. Forward only, Hopper only, H = 128; causal masks align top-left. ``config``: the tiles
    (block_kv a multiple of 128, stages; no pipeline). ``p_via``: "registers" (p stays in registers) or "smem"
    (p goes through shared memory); see the module docstring, and the flash page for both measured on the H200.
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    cfg = config or MosaicConfig()
    if problem := fp8_problem(AttentionShape(B, T, S, N, K, H), cfg):
        raise ValueError(f"mosaic_fp8_attention: {problem}")
    causal = check_flag("is_causal", is_causal)
    if isinstance(p_scale, (bool, np.bool_)) or not isinstance(p_scale, numbers.Real) or not 1 <= p_scale <= E4M3_MAX:
        raise ValueError(f"p_scale must be a real number in [1, {E4M3_MAX:g}] (p <= 1 times it must stay within E4M3's "
                         f"range, and below 1 small weights would vanish); got {p_scale!r}.")  # fmt: skip
    if p_via not in P_VIA:
        raise ValueError(f"p_via must be one of {P_VIA}; got {p_via!r}.")
    (q8, dq), (k8, dk), (v8, dv) = quantize_e4m3(q), quantize_e4m3(k), quantize_e4m3(v)
    vt8 = jnp.transpose(v8, (0, 2, 3, 1))  # (B, K, H, S): K-major for p·v
    if p_via == "registers":  # v's keys in the order p's registers hold them: key 16J + 8h + 2t + e to column
        # 16J + 4t + 2h + e (operand_key_order), as a swap of two axes that XLA fuses into the quantising pass
        vt8 = vt8.reshape(*vt8.shape[:-1], S // 16, 2, 4, 2).swapaxes(-3, -2).reshape(vt8.shape)
    factors = logit_factors(positive_scale(scale, H), dq, dk, dv, float(p_scale))
    return fp8_forward(q8, k8, vt8, factors, causal=causal, cfg=cfg, p_scale=float(p_scale), p_via=p_via)


def fp8_forward_kernel(q_ref, k_ref, v_ref, c_ref, o_ref, lse_ref, scoped, *, causal, cfg, stages, seq_kv, groups,
                       p_scale, p_operand):  # fmt: skip
    """The forward kernel on E4M3 q, k and vᵀ (B, K, H, S), its two logit factors from ``c_ref``
    (:func:`logit_factors`); p is E4M3 · ``p_scale``, through shared memory, or with ``p_operand`` (f32 p -> the 8-bit
    operand layout) straight from registers; the output is bfloat16."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    (q_smem2, k_smem, v_smem, lse_smem2, o_smem2, p_smem2, c_smem2), ready, (k_free, v_free), schedule = scoped
    k_ready, v_ready, q_ready, c_ready = ready
    bq, bkv, dtype, head_dim = cfg.block_q, cfg.block_kv, q_ref.dtype, q_ref.shape[-1]
    batch, head, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
    cta_rows = lax.axis_index("q_seq") * (2 * bq)  # first query row of this CTA
    n_kv = seq_kv // bkv
    if causal:  # the CTA needs keys up to its last row (top-left alignment), never past S
        cta_steps = jnp.minimum(pl.cdiv(cta_rows + 2 * bq, jnp.array(bkv, jnp.int32)), n_kv)
    else:
        cta_steps = n_kv
    exp2, exp2_tile = softmax_exp2(cfg)  # of alpha, of p (cfg.exp_poly: part of p's on the FMA units)
    region = regions(False)

    def take_turn():  # the two compute warpgroups alternate on the tensor cores
        plgpu.barrier_arrive(schedule)
        plgpu.barrier_wait(schedule)

    @pl.when(wg < 2)
    def _compute():
        plgpu.set_max_registers(cfg.registers, action="increase")
        q_smem = q_smem2.at[wg]
        row0 = cta_rows + wg * bq
        steps = causal_steps(row0, bq, bkv, n_kv) if causal else n_kv
        plgpu.copy_gmem_to_smem(q_ref.at[batch, pl.ds(row0, bq), head], q_smem, q_ready.at[wg])
        plgpu.copy_gmem_to_smem(c_ref, c_smem2.at[wg], c_ready.at[wg])
        plgpu.barrier_wait(c_ready.at[wg])
        c_smem = c_smem2.at[wg]
        c, c_out = c_smem[0], c_smem[1]  # scale·log2e·descale_q·descale_k, descale_v / p_scale
        plgpu.barrier_wait(q_ready.at[wg])
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

            def qk(s_ref):  # s = q kᵀ in FP8, float32 accumulation; then hand the tensor cores over
                plgpu.wgmma(s_ref, q_smem, k_smem.at[slot].transpose((1, 0)))
                take_turn()
                return s_ref[...]

            s = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32))
            plgpu.barrier_arrive(k_free.at[slot])
            if masked:
                s = causal_block_mask(s, row0, j * bkv)
            m_new = jnp.maximum(m, s.max(axis=1) * c)
            alpha = exp2(m - m_new)
            p = exp2_tile(s * c - lax.broadcast_in_dim(m_new, s.shape, [0]))
            acc *= lax.broadcast_in_dim(alpha, acc.shape, [0])
            l = l * alpha + p.sum(axis=1)
            if p_operand is not None:  # E4M3 tops out at 448: scale p (<= 1) up to use its range
                p8 = p_operand(p * p_scale)
                acc, l, m_new, p8 = lax.optimization_barrier((acc, l, m_new, p8))
            else:  # the same, through shared memory
                p_smem = p_smem2.at[wg]
                p_smem[...] = (p * p_scale).astype(dtype)
                plgpu.commit_smem()
                acc, l, m_new = lax.optimization_barrier((acc, l, m_new))
                p8 = p_smem
            plgpu.barrier_arrive(schedule)  # softmax done
            plgpu.barrier_wait(v_ready.at[slot])
            plgpu.barrier_wait(schedule)  # the other warpgroup has issued its matmul: our turn

            def pv(acc_ref):  # acc += p v (vᵀ K-major); meanwhile wait for the next k
                plgpu.wgmma(acc_ref, p8, v_smem.at[slot].transpose((1, 0)))

                @pl.when(j + 1 < steps)
                def _():
                    plgpu.barrier_wait(k_ready.at[lax.rem(j + 1, jnp.array(stages, j.dtype))])

            acc = pl.run_state(pv)(plgpu.ACC.init(acc))
            plgpu.barrier_arrive(v_free.at[slot])
            return acc, m_new, l

        if not causal:
            acc, m, l = lax.fori_loop(0, n_kv, step, (acc, m, l))
        else:
            unmasked = jnp.minimum(lax.div(row0, jnp.array(bkv, jnp.int32)), steps)
            carry = lax.fori_loop(0, unmasked, step, (acc, m, l))
            acc, m, l = lax.fori_loop(unmasked, steps, functools.partial(step, masked=True), carry)
            drain(steps, cta_steps, stages, (k_free, v_free), take_turn)  # warpgroup 0 ends early

        pl.when(wg == 0)(take_turn)  # balance warpgroup 1's extra half turn
        out_smem = o_smem2.at[wg]
        out_smem[...] = (acc * lax.broadcast_in_dim(c_out / l, acc.shape, [0])).astype(out_smem.dtype)
        lse_smem2.at[wg][...] = m + jnp.log(l) * LOG2E
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_smem, o_ref.at[batch, pl.ds(row0, bq), head])
        plgpu.copy_smem_to_gmem(lse_smem2.at[wg], lse_ref.at[batch, head, pl.ds(row0, bq)])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 2)
    def _copy():
        plgpu.set_max_registers(copy_registers(cfg.registers), action="decrease")
        kv_head = lax.div(head, jnp.array(groups, head.dtype))
        copy_kv_ring(k_ref, v_ref, k_smem, v_smem, (k_ready, v_ready, k_free, v_free),
                     k_tile=lambda j: (batch, pl.ds(j * bkv, bkv), kv_head),
                     v_tile=lambda j: (batch, kv_head, slice(None), pl.ds(j * bkv, bkv)),  # vᵀ: (H, block_kv)
                     stages=stages, steps=cta_steps, region=region)  # fmt: skip


def _tile8():
    """E4M3 tiles: 8×128 (128-byte rows) with the 128-byte swizzle."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    return (plgpu.TilingTransform((8, 128)), plgpu.SwizzleTransform(128))


@shared_lowering("causal", "cfg", "p_scale", "p_via")
def fp8_forward(q8, k8, vt8, factors, *, causal: bool, cfg: MosaicConfig, p_scale: float, p_via: str):
    """The FP8 kernel on quantised q8 (B, T, N, H), k8 (B, S, K, H), vt8 (B, K, H, S) and the two factors: the
    bfloat16 output (B, T, N, H)."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    B, T, N, H = q8.shape
    S, K = k8.shape[1], k8.shape[2]
    bq, bkv = cfg.block_q, cfg.block_kv
    stages = min(cfg.stages, S // bkv)
    smem = (
        plgpu.SMEM((2, bq, H), F8, transforms=_tile8()),  # q, one per compute warpgroup
        plgpu.SMEM((stages, bkv, H), F8, transforms=_tile8()),  # k ring
        plgpu.SMEM((stages, H, bkv), F8, transforms=_tile8()),  # vᵀ ring
        plgpu.SMEM((2, bq), jnp.float32),  # log-sum-exp
        plgpu.SMEM((2, bq, H), jnp.bfloat16, transforms=swizzled_tiles()),  # output
        plgpu.SMEM((2, bq, bkv), F8, transforms=_tile8()),  # p in E4M3, the A operand of p·v
        plgpu.SMEM((2, 128), jnp.float32),  # the two factors (logit_factors)
    )
    barriers = (
        (plgpu.Barrier(num_barriers=stages), plgpu.Barrier(num_barriers=stages), plgpu.Barrier(num_barriers=2),
         plgpu.Barrier(num_barriers=2)),  # k_ready, v_ready, q_ready, factors ready
        (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 2,
        plgpu.Barrier(num_arrivals=2),
    )  # fmt: skip
    operand = _to_operand((bq, bkv)) if p_via == "registers" else None
    kernel = functools.partial(fp8_forward_kernel, causal=causal, cfg=cfg, stages=stages, seq_kv=S, groups=N // K,
                               p_scale=p_scale, p_operand=operand)  # fmt: skip
    out_type = [jax.ShapeDtypeStruct((B, T, N, H), jnp.bfloat16), jax.ShapeDtypeStruct((B, N, T), jnp.float32)]
    grid = (N, T // (2 * bq), B)
    out, _ = call(kernel, out_type, (smem, *barriers), grid, ("heads", "q_seq", "batch"), q8, k8, vt8, factors)
    return out
