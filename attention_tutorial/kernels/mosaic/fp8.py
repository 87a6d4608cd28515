"""An FP8 forward of our own: the forward kernel's shape on E4M3 inputs.

What changes against the 16-bit forward (:mod:`attention_tutorial.kernels.mosaic.forward`), and why (Hopper's FP8
wgmma, FlashAttention-3 §3.3, cuDNN's FP8 path):

* q, k and v are quantised per tensor to ``float8_e4m3fn``: ``x8 = x · (448 / max|x|)``, each with its *descale*
  (the inverse) kept in float32. q·kᵀ runs in FP8 with float32 accumulation; the two descales and the softmax
  scale fold into one factor of the logits (:func:`logit_factors`).
* Hopper's FP8 wgmma reads both operands K-major. For q·kᵀ that is how q and k lie already; for p·v the contraction
  runs over the keys, so v is handed over transposed, (B, K, H, S) — fused into the quantising pass by XLA.
* p (at most 1) is stored in E4M3 times ``p_scale`` (448 by default, the format's largest value, as cuDNN's
  ``scale_s``), and p·v runs in FP8 too. Mosaic GPU has no built-in relayout from the accumulator's register layout
  into the 8-bit operand layout (the bytes could be permuted in registers with ``prmt`` through inline PTX, as
  FlashAttention-3 does). ``p_via="registers"`` (the default; the flash page times both ways) keeps p in registers
  anyway, taking each thread's four scores of a 16-key group *as they lie* as the operand's four, and permutes v's
  keys to match (:func:`operand_key_order`, fused into the quantising pass); ``p_via="smem"`` takes the plain way,
  storing p to shared memory and reading it back as the operand.
* The kernel is the 16-bit forward's (:func:`~attention_tutorial.kernels.mosaic.forward.forward_kernel`) with these
  operands (:func:`fp8_operands`): masks, any T and S and both schedules come with it.
* The output is bfloat16: ``acc · descale_v / p_scale / l``.

Legend: B batch, T query length, S key length, N heads, K kv heads, H head dim.
"""

from __future__ import annotations

import functools
import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...inputs import AttentionShape, attention_shape
from ._common import LOG2E, call, on_hopper, pad_rows, padded_rows, positive_scale, shared_lowering, swizzled_tiles
from .budget import FP8_HEAD_DIMS, NO_PROBE, MosaicConfig, Probe, fp8_problem, smem_bytes_fp8
from .forward import Operands, forward_kernel, make_plan, mask_inputs, scratch_types, why_not_persistent
from .masks import Mask, MaskArrays, make_mask

__all__ = [
    "E4M3_MAX",
    "F8",
    "FP8_HEAD_DIMS",
    "P_VIA",
    "fp8_forward",
    "fp8_operands",
    "logit_factors",
    "mosaic_fp8_attention",
    "operand_key_order",
    "operand_register_pairs",
    "quantize_e4m3",
    "why_not",
]

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
    causal_alignment: str = "top_left",
    local_window_size=None,
    segment_ids=None,
    prefix_length=None,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    softcap: float | None = None,
    scale: float | None = None,
    p_scale: float = E4M3_MAX,
    config: MosaicConfig | None = None,
    p_via: str = "registers",
    probe: Probe | None = None,
):
    """Our FP8 attention forward: q (B, T, N, H), k/v (B, S, K, H) in any float type -> bfloat16 (B, T, N, H).

    Quantises q, k, v per tensor to E4M3 (:func:`quantize_e4m3`; timed with the kernel, as
    :func:`attention_tutorial.measure.fp8.cudnn_fp8_attention` times cuDNN's), runs both matmuls in FP8 and
    returns bfloat16. Forward only, Hopper only, H = 128; any T and S, and the masks of
    :func:`~attention_tutorial.kernels.mosaic.mosaic_flash_attention`. ``config``: the tiles (block_kv a multiple
    of 64, stages; no pipeline). ``p_via``: "registers" (p stays in registers) or "smem" (p goes through shared
    memory); see the module docstring, and the flash page for both measured on the H200.
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    cfg, probe = config or MosaicConfig(), probe or NO_PROBE
    if problem := fp8_problem(AttentionShape(B, T, S, N, K, H), cfg, probe):
        raise ValueError(f"mosaic_fp8_attention: {problem}")
    mask, arrays = make_mask(
        B,
        T,
        S,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        local_window_size=local_window_size,
        segment_ids=segment_ids,
        prefix_length=prefix_length,
        query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths,
        softcap=softcap,
    )
    if reason := why_not_persistent(cfg, mask):
        raise ValueError(f"mosaic_fp8_attention: {reason}")
    if isinstance(p_scale, (bool, np.bool_)) or not isinstance(p_scale, numbers.Real) or not 1 <= p_scale <= E4M3_MAX:
        raise ValueError(
            f"p_scale must be a real number in [1, {E4M3_MAX:g}] (p <= 1 times it must stay within E4M3's "
            f"range, and below 1 small weights would vanish); got {p_scale!r}."
        )
    if p_via not in P_VIA:
        raise ValueError(f"p_via must be one of {P_VIA}; got {p_via!r}.")
    (q8, dq), (k8, dk), (v8, dv) = quantize_e4m3(q), quantize_e4m3(k), quantize_e4m3(v)
    vt8 = jnp.transpose(v8, (0, 2, 3, 1))  # (B, K, H, S): K-major for p·v
    # keys up to whole 128-byte rows of E4M3 (the copies' tiles; zeros, and masked: the mask stops at S)
    vt8 = jnp.pad(vt8, ((0, 0), (0, 0), (0, 0), (0, -S % 128)))
    if p_via == "registers":  # v's keys in the order p's registers hold them: key 16J + 8h + 2t + e to column
        # 16J + 4t + 2h + e (operand_key_order), as a swap of two axes that XLA fuses into the quantising pass
        vt8 = vt8.reshape(*vt8.shape[:-1], vt8.shape[-1] // 16, 2, 4, 2).swapaxes(-3, -2).reshape(vt8.shape)
    factors = logit_factors(positive_scale(scale, H), dq, dk, dv, float(p_scale))
    return fp8_forward(
        q8, k8, vt8, factors, arrays, cfg=cfg, mask=mask, p_scale=float(p_scale), p_via=p_via, probe=probe
    )


class Extra(NamedTuple):
    """What the FP8 forward adds to the forward's scratch."""

    out: Any  # (2, block_q, H) bfloat16: each warpgroup's output tile (q's tile is E4M3)
    p: Any  # (2, block_q, block_kv) E4M3: p as the A operand of p·v, when it goes through shared memory
    factors: Any  # (2, 128) float32: the two logit factors (logit_factors), one copy per warpgroup
    factors_ready: Any  # (2,)


def fp8_operands(cfg: MosaicConfig, p_scale: float, p_via: str) -> Operands:
    """The forward kernel's operands for E4M3 inputs: the logit factors from the call, p scaled into E4M3's range
    (in registers, reordered as they lie, or through shared memory), vᵀ K-major, a bfloat16 output tile."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    registers = _to_operand((cfg.block_q, cfg.block_kv)) if p_via == "registers" else None

    def setup(refs, scratch, wg):
        (factors_ref,) = refs
        extra = scratch.extra
        plgpu.copy_gmem_to_smem(factors_ref, extra.factors.at[wg], extra.factors_ready.at[wg])
        plgpu.barrier_wait(extra.factors_ready.at[wg])
        factors = extra.factors.at[wg]
        return factors[0], factors[1]  # scale·log2e·descale_q·descale_k, descale_v / p_scale

    def to_operand(p, scratch, wg):  # E4M3 tops out at 448: scale p (<= 1) up to use its range
        if registers is not None:
            return registers(p * p_scale)
        p_smem = scratch.extra.p.at[wg]
        p_smem[...] = (p * p_scale).astype(F8)
        plgpu.commit_smem()
        return p_smem

    return Operands(
        setup=setup,
        to_operand=to_operand,
        v_operand=lambda v: v.transpose((1, 0)),  # vᵀ tiles (H, block_kv): K-major for FP8's p·v
        out_tile=lambda scratch, wg, q_smem: scratch.extra.out.at[wg],
        v_tile=lambda batch, kv_head, block, bkv: (batch, kv_head, slice(None), pl.ds(block * bkv, bkv)),
    )


def _tile8(row_bytes: int = 128):
    """E4M3 tiles: 8 rows × the widest swizzle (bytes) that ``row_bytes`` is a multiple of (128, else 64), with that
    swizzle: q's and k's rows are H = 128 bytes; vᵀ's and p's are block_kv (192 takes the 64-byte one)."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    swizzle = 128 if row_bytes % 128 == 0 else 64
    return (plgpu.TilingTransform((8, swizzle)), plgpu.SwizzleTransform(swizzle))


@shared_lowering("cfg", "mask", "p_scale", "p_via", "probe")
def fp8_forward(
    q8,
    k8,
    vt8,
    factors,
    arrays: MaskArrays,
    *,
    cfg: MosaicConfig,
    mask: Mask,
    p_scale: float,
    p_via: str,
    probe: Probe = NO_PROBE,
):
    """The forward kernel (:func:`~.forward.forward_kernel`) on quantised q8 (B, T, N, H), k8 (B, S, K, H), vt8
    (B, K, H, S') and the two factors: the bfloat16 output (B, T, N, H)."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    B, T, N, H = q8.shape
    K = k8.shape[2]
    q8, k8 = pad_rows(q8), pad_rows(k8)  # rows a multiple of 8 for the copies; the mask stops at T, S
    bq, bkv = cfg.block_q, cfg.block_kv
    operands, smem = fp8_operands(cfg, p_scale, p_via), smem_bytes_fp8(cfg, H)
    plan = make_plan(cfg, mask, (B, T, N, H), N // K, operands, probe, smem=smem, itemsize=1)
    extra = Extra(
        out=plgpu.SMEM((2, bq, H), jnp.bfloat16, transforms=swizzled_tiles()),
        p=plgpu.SMEM((2, bq, bkv), F8, transforms=_tile8(bkv)),
        factors=plgpu.SMEM((2, 128), jnp.float32),
        factors_ready=plgpu.Barrier(num_barriers=2),
    )
    scratch = scratch_types(plan, H, F8, v_shape=(H, bkv), transforms=_tile8(), v_transforms=_tile8(bkv), extra=extra)
    kernel = functools.partial(forward_kernel, plan=plan)
    rows = padded_rows(T, 2 * bq)  # lse is stored a CTA's rows at a time
    out_type = [jax.ShapeDtypeStruct(q8.shape, jnp.bfloat16), jax.ShapeDtypeStruct((B, N, rows), jnp.float32)]
    out, _ = call(kernel, out_type, scratch, *plan.items.grid, q8, k8, vt8, *mask_inputs(plan, arrays), factors)
    return out[:, :T]
