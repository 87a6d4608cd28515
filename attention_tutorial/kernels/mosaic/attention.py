"""The public functions: our Mosaic GPU FlashAttention (the forward and backward kernels tied by a custom VJP), its
pipelined variant, what keeps either from running here, and JAX's bundled Mosaic GPU kernel to race them.

Legend: B batch, T query length, S key length, N heads, K kv heads, H head dim.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from ...inputs import AttentionShape, attention_shape
from ._common import LOG2E, on_hopper, positive_scale
from .backward import backward
from .budget import NO_PROBE, MosaicConfig, Probe, default_config, kernel_head_dim, problem
from .forward import forward, why_not_persistent
from .masks import Mask, make_mask


def mosaic_flash_attention(
    q,
    k,
    v,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    local_window_size: int | tuple[int, int] | None = None,
    segment_ids=None,
    prefix_length=None,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    softcap: float | None = None,
    scale: float | None = None,
    config: MosaicConfig | None = None,
    probe: Probe | None = None,
    return_lse: bool = False,
    deterministic: bool = False,
):
    """Our Mosaic GPU FlashAttention: q (B, T, N, H), k/v (B, S, K, H) -> (B, T, N, H), differentiable. Hopper only
    (on a CPU it runs inside :func:`~attention_tutorial.kernels.mosaic.interpret.interpret`).

    float16 or bfloat16; any T and S; the kernels run H = 64, 128 and 256, and any other H up to 256 runs padded
    with zero columns to the next of these (the scores are unchanged, the padding's output columns are dropped; it
    costs the padded head dim's FLOPs: H = 96 those of 128). At H = 256 :func:`default_config` takes block_kv = 64,
    and the backward's two compute warpgroups split the head dim
    (:mod:`~attention_tutorial.kernels.mosaic.backward_split`). The mask, every part optional and combined (a score
    is kept when all parts keep it):

    * ``is_causal``: query i sees keys j <= i + d, with d = 0 for ``causal_alignment="top_left"`` and S − T for
      ``"bottom_right"`` (the last query sees the last key: decoding, chunked prefill);
    * ``local_window_size``: w or (left, right): keys j with i + d − left <= j <= i + d + right (a sliding window;
      with ``is_causal`` its right side is 0);
    * ``segment_ids``: (B, T) integers (or a pair (B, T), (B, S)): a query sees only keys of its own segment —
      documents packed into one row;
    * ``prefix_length``: an int or (B,) integers p: every query also sees keys j < p (prefix-LM; with
      ``is_causal``);
    * ``query_seq_lengths`` / ``key_value_seq_lengths``: (B,) integers: rows and keys past them are padding;
    * ``softcap``: scores s (after the scale) become ``softcap · tanh(s / softcap)``.

    A row that keeps no key gets output 0 (and log-sum-exp −inf). Tiles the mask keeps wholly run without a mask,
    tiles it removes wholly are skipped (:mod:`~attention_tutorial.kernels.mosaic.masks`). ``return_lse=True``
    returns ``(out, lse)`` with lse (B, N, T) float32, each row's natural log-sum-exp of the (capped) scaled scores
    (for context parallelism; differentiable).

    The backward (``jax.custom_vjp``; :mod:`~attention_tutorial.kernels.mosaic.backward`) recomputes the weights from
    the saved log-sum-exp in warp-specialised kernels (``config.bwd_dq``: dQ by a pass of its own or by atomic adds).
    ``deterministic=True``: the same inputs give the same gradient bits every run (dQ by a pass of its own where the
    config says atomic adds, whose summation order varies).
    ``probe`` (:class:`~attention_tutorial.kernels.mosaic.budget.Probe`): ways to measure the kernels, never for use.
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    cfg = config or default_config(H)
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be True or False; got {deterministic!r:.60}.")
    if deterministic and cfg.bwd_dq != "pass":
        cfg = dataclasses.replace(cfg, bwd_dq="pass")
    probe = probe or NO_PROBE
    if reason := problem(AttentionShape(B, T, S, N, K, H), q.dtype, cfg, probe):
        raise ValueError(f"mosaic_flash_attention: {reason}")
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
    if mask.segments and cfg.block_kv % 32:
        raise ValueError(
            f"mosaic_flash_attention: with segment_ids the forward copies each key tile's ids (block_kv int32s) "
            f"into shared memory, which takes whole 128-byte copies: block_kv must then be a multiple of 32; got "
            f"block_kv={cfg.block_kv} (pick 160 or 192)."
        )
    if reason := why_not_persistent(cfg, mask):
        raise ValueError(f"mosaic_flash_attention: {reason}")
    if cfg.pipeline and not mask.plain(cfg.block_q, cfg.block_kv):
        raise ValueError(
            "mosaic_flash_attention: the pipelined forward (config.pipeline=True) takes no mask but the "
            "top-left causal one, on T a multiple of 2·block_q and S of block_kv; pass pipeline=False "
            "(the default) for this mask."
        )
    plan = _Plan(mask, positive_scale(scale, H), cfg, probe)
    out, lse2 = _attention(*_pad_heads(q, k, v), arrays, plan)  # scaled by H's own 1/sqrt(H)
    out = out[..., :H]
    return (out, lse2 * (1.0 / LOG2E)) if return_lse else out


def mosaic_flash_backward(
    q,
    k,
    v,
    out,
    lse,
    d_out,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    local_window_size=None,
    segment_ids=None,
    prefix_length=None,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    softcap=None,
    scale: float | None = None,
    config: MosaicConfig | None = None,
    probe: Probe | None = None,
):
    """(dq, dk, dv) from a given output and natural log-sum-exp (B, N, T): the backward kernels on their own, with
    the mask arguments of :func:`mosaic_flash_attention`.

    What a context-parallel ring needs: its merged ``out`` and ``lse`` over all keys, and this kernel's share of
    the gradient for one block of keys (P rebuilt from the merged lse is the block's slice of the full softmax).
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    cfg = config or default_config(H)
    probe = probe or NO_PROBE
    if reason := problem(AttentionShape(B, T, S, N, K, H), q.dtype, cfg, probe):
        raise ValueError(f"mosaic_flash_backward: {reason}")
    if out.shape != q.shape or d_out.shape != q.shape or lse.shape != (B, N, T):
        raise ValueError(
            f"out and d_out must have q's shape {q.shape} and lse (B, N, T) = {(B, N, T)}; got out "
            f"{out.shape}, d_out {d_out.shape}, lse {lse.shape}."
        )
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
    delta = jnp.einsum("btnh,btnh->bnt", out.astype(jnp.float32), d_out.astype(jnp.float32))
    lse2 = lse.astype(jnp.float32) * LOG2E
    q, k, v, d_out = _pad_heads(q, k, v, d_out.astype(q.dtype))
    grads = backward(
        q, k, v, d_out, lse2, delta, arrays, scale=positive_scale(scale, H), cfg=cfg, mask=mask, probe=probe
    )
    return tuple(g[..., :H] for g in grads)


def _pad_heads(*xs):
    """Each (.., H) array with zero columns up to the kernels' head dim (:func:`kernel_head_dim`); as is when H is
    one of theirs. Zero columns of q and k add nothing to a score; those of v give output columns to drop."""
    H = xs[0].shape[-1]
    pad = (kernel_head_dim(H) or H) - H
    return tuple(jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)]) if pad else x for x in xs)


@dataclasses.dataclass(frozen=True)
class _Plan:
    mask: Mask
    scale: float
    cfg: MosaicConfig
    probe: Probe = NO_PROBE


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, arrays, plan):
    return _forward(q, k, v, arrays, plan)


def _forward(q, k, v, arrays, plan):
    return forward(q, k, v, arrays, scale=plan.scale, cfg=plan.cfg, mask=plan.mask, probe=plan.probe)


def _attention_fwd(q, k, v, arrays, plan):
    out, lse2 = _forward(q, k, v, arrays, plan)
    return (out, lse2), (q, k, v, arrays, out, lse2)


def _attention_bwd(plan: _Plan, residuals, cotangents):
    q, k, v, arrays, out, lse2 = residuals
    d_out, d_lse2 = cotangents
    # D = rowsum(dO ∘ O); a cotangent on the log-sum-exp adds P·d_lse to dS, i.e. shifts D (base 2 -> natural).
    delta = jnp.einsum("btnh,btnh->bnt", out.astype(jnp.float32), d_out.astype(jnp.float32))
    delta = delta - LOG2E * d_lse2.astype(jnp.float32)
    grads = backward(
        q,
        k,
        v,
        d_out.astype(q.dtype),
        lse2,
        delta,
        arrays,
        scale=plan.scale,
        cfg=plan.cfg,
        mask=plan.mask,
        probe=plan.probe,
    )
    return (*grads, jax.tree.map(lambda x: None, arrays))


_attention.defvjp(_attention_fwd, _attention_bwd)


def why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why our Mosaic GPU kernel cannot run this problem here, or None."""
    return on_hopper() or problem(shape, dtype, default_config(shape.head_dim))


def mosaic_pipelined_attention(q, k, v, *, is_causal: bool = False, scale: float | None = None):
    """:func:`mosaic_flash_attention` with FlashAttention-3's intra-warpgroup pipelining in the forward
    (``default_config(H, pipeline=True)``, see :mod:`~attention_tutorial.kernels.mosaic.pipelined`); the same
    backward."""
    config = default_config(attention_shape(q, k, v).head_dim, pipeline=True)
    return mosaic_flash_attention(q, k, v, is_causal=is_causal, scale=scale, config=config)


def pipelined_why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why the pipelined forward cannot run this problem here, or None."""
    return on_hopper() or problem(shape, dtype, default_config(shape.head_dim, pipeline=True))


def _atomic_dq_config(head_dim: int) -> MosaicConfig:
    """The default tiles with dQ by atomic adds."""
    return dataclasses.replace(default_config(head_dim), bwd_dq="atomic")


def mosaic_atomic_dq_attention(q, k, v, *, is_causal: bool = False, scale: float | None = None):
    """:func:`mosaic_flash_attention` whose backward makes dQ by atomic float32 adds from the dK/dV kernel
    (``bwd_dq="atomic"``, FlashAttention-2's way, which FlashAttention-3 keeps) instead of a pass of its own; the same forward."""
    config = _atomic_dq_config(attention_shape(q, k, v).head_dim)
    return mosaic_flash_attention(q, k, v, is_causal=is_causal, scale=scale, config=config)


def atomic_dq_why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why the kernel with dQ by atomic adds cannot run this problem here, or None."""
    return on_hopper() or problem(shape, dtype, _atomic_dq_config(shape.head_dim))


def jax_bundled_mosaic(q, k, v, *, is_causal: bool = False):
    """JAX's bundled Mosaic GPU kernel, ``jax.experimental.pallas.ops.gpu.attention_mgpu.attention``, to race.

    It applies no softmax scale, so q is scaled first (one fused elementwise pass, timed with it); float16 only.
    Its backward (64×64 blocks, as JAX's tests use) has no causal mask: differentiating a causal call raises.
    """
    from jax.experimental.pallas.ops.gpu import attention_mgpu

    H = q.shape[-1]
    config = attention_mgpu.TuningConfig(
        block_q=64,
        block_kv=128,
        max_concurrent_steps=2,
        causal=is_causal,
        block_q_dkv=64,
        block_kv_dkv=64,
        block_q_dq=64,
        block_kv_dq=64,
    )
    return attention_mgpu.attention((q * (1.0 / math.sqrt(H))).astype(q.dtype), k, v, config)


def bundled_why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why JAX's bundled Mosaic GPU kernel cannot run this problem here, or None."""
    if reason := on_hopper():
        return reason
    if jnp.dtype(dtype).name != "float16":
        return f"JAX's kernel allocates float16 shared memory: float16 inputs only, not {jnp.dtype(dtype).name}."
    return problem(shape, dtype, MosaicConfig())
