"""An FP8 forward of our own (issue 17): :mod:`attention_tutorial.kernels.mosaic_flash`'s kernel on E4M3 inputs.

What changes against the 16-bit forward, and why (Hopper's FP8 wgmma, FlashAttention-3 §3.3, cuDNN's FP8 path):

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

from ..inputs import AttentionShape, attention_shape, check_flag
from .mosaic_flash import (
    LOG2E,
    SMEM_BYTES,
    SMEM_RESERVE,
    TILE_REGISTERS,
    MosaicConfig,
    _call,
    _kernel,
    _on_hopper,
    positive_scale,
    tile_registers,
)

F8 = jnp.float8_e4m3fn
E4M3_MAX = float(jnp.finfo(F8).max)  # 448
FP8_HEAD_DIMS = (128,)  # 128-byte rows of E4M3: the 128-byte swizzle the tiles use


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
    return _on_hopper() or _problem(shape, MosaicConfig())


def smem_bytes_fp8(cfg: MosaicConfig, head_dim: int) -> int:
    """Shared memory the FP8 forward allocates: q (E4M3) and the bfloat16 output per compute warpgroup, the k and vᵀ
    rings in E4M3, p in E4M3 per warpgroup, the log-sum-exp rows and the two factors."""
    bq, bkv = cfg.block_q, cfg.block_kv
    return 2 * bq * head_dim * (1 + 2) + 2 * cfg.stages * bkv * head_dim + 2 * bq * bkv + 2 * bq * 4 + 2 * 128 * 4


def _problem(shape: AttentionShape, cfg: MosaicConfig) -> str | None:
    if cfg.pipeline or cfg.block_q != 64 or cfg.block_kv % 128:
        return (f"the FP8 forward takes pipeline=False, block_q=64 and block_kv a multiple of 128 (128-byte rows of "
                f"E4M3 p); got pipeline={cfg.pipeline}, block_q={cfg.block_q}, block_kv={cfg.block_kv}.")  # fmt: skip
    if (regs := tile_registers(cfg, shape.head_dim)) > TILE_REGISTERS:
        return (f"at block_kv={cfg.block_kv} the FP8 forward's float32 tiles need {regs} registers per thread, more "
                f"than the {TILE_REGISTERS} the kernel budgets: use block_kv=128.")  # fmt: skip
    if (need := smem_bytes_fp8(cfg, shape.head_dim)) + SMEM_RESERVE > SMEM_BYTES:
        return (f"at block_kv={cfg.block_kv} and stages={cfg.stages} the FP8 forward needs {need / 1024:.1f} KiB of "
                f"shared memory, more than the {(SMEM_BYTES - SMEM_RESERVE) // 1024} KiB a Hopper CTA leaves beside "
                "barriers: use fewer stages.")  # fmt: skip
    if shape.head_dim not in FP8_HEAD_DIMS:
        return f"the FP8 forward takes H = 128 (128-byte rows of E4M3); got H={shape.head_dim}."
    if shape.seq_q % (2 * cfg.block_q) or shape.seq_kv % cfg.block_kv:
        return (
            f"T must be a multiple of {2 * cfg.block_q} and S of {cfg.block_kv}; got T={shape.seq_q}, "
            f"S={shape.seq_kv}. Pad them."
        )
    return None


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

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA,),
                       return_type=plgpu.ShapeDtypeStruct(shape, F8, layout=plgpu.Layout.WGMMA_8BIT))  # fmt: skip
    def to_operand(ctx, p):
        regs = p.astype(mgpu.utils.dtype_to_ir_type(F8)).registers  # (…, keys / 8, …): two scores each
        out = np.empty(mgpu.WGMMA_LAYOUT_8BIT.registers_shape(shape), dtype=object)
        for idx, pair in operand_register_pairs(shape).items():
            out[idx] = mgpu.utils.vector_concat([regs[i] for i in pair])
        return mgpu.FragmentedArray(_registers=out, _layout=mgpu.WGMMA_LAYOUT_8BIT, _is_signed=None)

    return to_operand


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
    if problem := _problem(AttentionShape(B, T, S, N, K, H), cfg):
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
    return _forward_fp8(q8, k8, vt8, factors, causal=causal, cfg=cfg, p_scale=float(p_scale), p_via=p_via)


def _tile8():
    """E4M3 tiles: 8×128 (128-byte rows) with the 128-byte swizzle."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    return (plgpu.TilingTransform((8, 128)), plgpu.SwizzleTransform(128))


def _forward_fp8(q8, k8, vt8, factors, *, causal, cfg: MosaicConfig, p_scale: float, p_via: str):
    import jax.experimental.pallas.mosaic_gpu as plgpu

    from .mosaic_flash import _tile

    B, T, N, H = q8.shape
    S, K = k8.shape[1], k8.shape[2]
    bq, bkv = cfg.block_q, cfg.block_kv
    stages = min(cfg.stages, S // bkv)
    smem = (
        plgpu.SMEM((2, bq, H), F8, transforms=_tile8()),  # q, one per compute warpgroup
        plgpu.SMEM((stages, bkv, H), F8, transforms=_tile8()),  # k ring
        plgpu.SMEM((stages, H, bkv), F8, transforms=_tile8()),  # vᵀ ring
        plgpu.SMEM((2, bq), jnp.float32),  # log-sum-exp
        plgpu.SMEM((2, bq, H), jnp.bfloat16, transforms=_tile()),  # output
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
    kernel = functools.partial(_kernel, causal=causal, cfg=cfg, stages=stages, seq_kv=S, groups=N // K, scale=None,
                               p_scale=p_scale, p_operand=operand)  # fmt: skip
    out_type = [jax.ShapeDtypeStruct((B, T, N, H), jnp.bfloat16), jax.ShapeDtypeStruct((B, N, T), jnp.float32)]
    grid = (N, T // (2 * bq), B)
    out, _ = _call(kernel, out_type, (smem, *barriers), grid, ("heads", "q_seq", "batch"), q8, k8, vt8, factors)
    return out
