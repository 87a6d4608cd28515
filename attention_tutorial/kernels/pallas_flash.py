"""Our own FlashAttention kernels (forward and backward) in Pallas (Triton lowering), and JAX's bundled one.

Why the Triton lowering: it runs on every NVIDIA GPU JAX supports (Ampere, Hopper, ...) and the same kernel runs
on a CPU in Pallas's interpreter, so the tests check it without a GPU. Mosaic GPU, Pallas's Hopper-only lowering,
reaches further (warpgroup matmuls, TMA copies, explicit pipelining) at the price of a longer kernel; the page
compares with JAX's own Mosaic GPU kernel and says what it would take.

The kernel: the grid is (query blocks, batch, heads); one program owns ``block_q`` query rows of one head and
walks over the keys ``block_k`` at a time with the online softmax of :mod:`attention_tutorial.kernels.blockwise`:

1. load its q tile once (it stays in registers/shared memory); the softmax scale and log2(e) multiply the
   float32 scores, so the loop uses ``exp2``, the GPU's native exponential;
2. for each key block: s = q kᵀ (tensor cores, float32 accumulate); running max; p = exp2(s - m);
   rescale the accumulator and add p v;
3. causal: blocks wholly after the query block are never visited (the loop stops at the diagonal), and only the
   blocks that straddle the diagonal pay for building a mask;
4. GQA: the key/value BlockSpec maps query head n to kv head n // (N // K), so shared heads are never copied;
5. it also writes each row's log-sum-exp, which the backward (a ``jax.custom_vjp``, FlashAttention-2: see
   :func:`flash_attention`) uses to recompute the weights block by block instead of storing them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ..inputs import AttentionShape, attention_shape, check_block_size, check_flag, resolve_scale

F32_MAX = float(jnp.finfo(jnp.float32).max)  # scores are clamped to it, as naive attention does
LOG2E = math.log2(math.e)


# JAX 0.11 deprecates Pallas's Triton lowering (for Mosaic GPU) and its bundled Triton attention, warning when a
# kernel is lowered. This module chooses that lowering on purpose and the page says so once, so the warnings are
# filtered here instead of repeated in every output.
_DEPRECATIONS = ("The Pallas Triton backend is deprecated", "jax.experimental.pallas.ops.gpu.attention is deprecated")
for _message in _DEPRECATIONS:
    warnings.filterwarnings("ignore", message=_message, category=DeprecationWarning)


def _i32(x):
    """An int32 scalar: loop bounds stay int32 also under JAX_ENABLE_X64=1 (Python ints would become int64)."""
    return jnp.asarray(x, jnp.int32)


def _kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, causal, block_q, block_k, seq_kv, scale):
    i = pl.program_id(0)  # which block of queries
    q = q_ref[...]  # (block_q, H), loaded once
    c = scale * LOG2E  # softmax in base 2: exp(scale·x) = 2^(c·x), applied to the float32 scores (one multiply)
    m = jnp.full((block_q,), -jnp.inf, jnp.float32)  # running max (base-2 logits)
    l = jnp.zeros((block_q,), jnp.float32)  # running sum
    acc = jnp.zeros(q.shape, jnp.float32)  # unnormalised output

    def step(j, carry, masked):
        m, l, acc = carry
        k = k_ref[pl.ds(j * block_k, block_k), :]  # (block_k, H)
        v = v_ref[pl.ds(j * block_k, block_k), :]
        s = jnp.clip(
            jnp.dot(q, k.T, preferred_element_type=jnp.float32) * c, -F32_MAX, F32_MAX
        )  # (block_q, block_k); a huge scale: no inf - inf
        if masked:  # only the diagonal blocks build a mask
            rows = i * block_q + lax.broadcasted_iota(jnp.int32, s.shape, 0)
            cols = j * block_k + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(cols <= rows, s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(axis=1))
        p = jnp.exp2(s - m_new[:, None])
        alpha = jnp.exp2(m - m_new)
        l = alpha * l + p.sum(axis=1)
        acc = alpha[:, None] * acc + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return m_new, l, acc

    n_blocks = _i32(seq_kv // block_k)
    if causal:
        # blocks entirely at or below the diagonal need no mask; the ones that straddle it do; the rest are skipped
        first_masked = jnp.minimum(lax.div(i * block_q, _i32(block_k)), n_blocks)
        end = jnp.minimum(lax.div((i + 1) * block_q + block_k - 1, _i32(block_k)), n_blocks)
        carry = lax.fori_loop(_i32(0), first_masked, functools.partial(step, masked=False), (m, l, acc))
        m, l, acc = lax.fori_loop(first_masked, end, functools.partial(step, masked=True), carry)
    else:
        m, l, acc = lax.fori_loop(_i32(0), n_blocks, functools.partial(step, masked=False), (m, l, acc))
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l) * LOG2E  # base-2 log-sum-exp of the scaled logits: the backward's residual


def _dkv_kernel(
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, causal, block_q, block_k, seq_q, scale
):
    """One key block of one query head: walk the query blocks that see it; dV += Pᵀ dO, dK += dSᵀ Q · scale."""
    j = pl.program_id(0)  # which block of keys
    k, v = k_ref[...], v_ref[...]  # (block_k, H), loaded once
    dk = jnp.zeros(k.shape, jnp.float32)
    dv = jnp.zeros(v.shape, jnp.float32)

    def step(i, carry, masked):
        dk, dv = carry
        rows = pl.ds(i * block_q, block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]  # (block_q, H)
        lse, delta = lse_ref[rows], delta_ref[rows]  # (block_q,)
        s = jnp.clip(jnp.dot(q, k.T, preferred_element_type=jnp.float32) * (scale * LOG2E), -F32_MAX, F32_MAX)
        p = jnp.exp2(s - lse[:, None])  # the forward's weights, recomputed from its log-sum-exp
        if masked:
            r = i * block_q + lax.broadcasted_iota(jnp.int32, s.shape, 0)
            c = j * block_k + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            p = jnp.where(c <= r, p, 0.0)
        dv = dv + jnp.dot(p.astype(do.dtype).T, do, preferred_element_type=jnp.float32)
        dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32)
        ds = p * (dp - delta[:, None])
        dk = dk + jnp.dot(ds.astype(q.dtype).T, q, preferred_element_type=jnp.float32)
        return dk, dv

    n_q = _i32(seq_q // block_q)
    if causal:  # query blocks wholly above the diagonal never see these keys: start at the first that does
        first = jnp.minimum(lax.div(j * block_k, _i32(block_q)), n_q)
        unmasked = jnp.minimum(lax.div((j + 1) * block_k + block_q - 1, _i32(block_q)), n_q)
        carry = lax.fori_loop(first, unmasked, functools.partial(step, masked=True), (dk, dv))
        dk, dv = lax.fori_loop(unmasked, n_q, functools.partial(step, masked=False), carry)
    else:
        dk, dv = lax.fori_loop(_i32(0), n_q, functools.partial(step, masked=False), (dk, dv))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, causal, block_q, block_k, seq_kv, scale):
    """One query block: walk the key blocks it sees (as the forward does); dQ += dS K · scale."""
    i = pl.program_id(0)
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]
    dq = jnp.zeros(q.shape, jnp.float32)

    def step(j, dq, masked):
        cols = pl.ds(j * block_k, block_k)
        k, v = k_ref[cols, :], v_ref[cols, :]
        s = jnp.clip(jnp.dot(q, k.T, preferred_element_type=jnp.float32) * (scale * LOG2E), -F32_MAX, F32_MAX)
        p = jnp.exp2(s - lse[:, None])
        if masked:
            r = i * block_q + lax.broadcasted_iota(jnp.int32, s.shape, 0)
            c = j * block_k + lax.broadcasted_iota(jnp.int32, s.shape, 1)
            p = jnp.where(c <= r, p, 0.0)
        dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32)
        ds = p * (dp - delta[:, None])
        return dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    n_kv = _i32(seq_kv // block_k)
    if causal:
        first_masked = jnp.minimum(lax.div(i * block_q, _i32(block_k)), n_kv)
        end = jnp.minimum(lax.div((i + 1) * block_q + block_k - 1, _i32(block_k)), n_kv)
        dq = lax.fori_loop(_i32(0), first_masked, functools.partial(step, masked=False), dq)
        dq = lax.fori_loop(first_masked, end, functools.partial(step, masked=True), dq)
    else:
        dq = lax.fori_loop(_i32(0), n_kv, functools.partial(step, masked=False), dq)
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


# Tuned on the H200 (tools/tune.py pallas, eight configurations, B=8, T=4096, N=16): (block_q, block_k, warps) per
# head dim as the kernels run it (padded: see padded_head_dim); other head dims take (128, 64, 4 or 8 warps). The
# stages are not in the table: by default each pass takes the most, up to MAX_STAGES, that fit (smem_bytes).
TUNED = {64: (128, 64, 4), 128: (128, 128, 8)}
BWD_BLOCK = 64  # the backward holds more tiles per program (k, v, dk, dv or q, dO, dq): smaller blocks
MAX_STAGES = 3
MAX_HEAD_DIM = 256
HOPPER_SMEM_BYTES = 232448  # 227 KiB: the most shared memory one program (CUDA block) may ask for on Hopper
# The same limit per compute capability (CUDA's "maximum shared memory per block, opt-in"); a GPU not listed, and
# Pallas's interpreter, are held to Hopper's.
SMEM_BYTES = {
    "7.0": 98304,
    "7.5": 65536,
    "8.0": 166912,
    "8.6": 101376,
    "8.7": 166912,
    "8.9": 101376,
    "9.0": HOPPER_SMEM_BYTES,
    "10.0": HOPPER_SMEM_BYTES,
    "12.0": 101376,
}
KERNELS = ("forward", "backward dK/dV", "backward dQ")


def padded_head_dim(head_dim: int) -> int:
    """The head dim the kernels run at: the next power of two, at least 16.

    Triton's tiles must have power-of-two sizes and its tensor-core products at least 16 along each axis, so
    :func:`flash_attention` zero-pads q, k and v from ``head_dim`` to this size (80 and 96 -> 128, 192 -> 256).
    """
    return max(16, 1 << (int(head_dim) - 1).bit_length())


def head_dim_why_not(head_dim: int) -> str | None:
    """Why the kernel does not take this head dim (a multiple of 8, at most 256), or None."""
    if head_dim % 8 or not 8 <= head_dim <= MAX_HEAD_DIM:
        return (
            f"head_dim must be a multiple of 8 between 8 and {MAX_HEAD_DIM}; got {head_dim}. Below that, zero-pad q, "
            f"k and v to the next multiple of 8 (the scores stay the same), pass scale=1/sqrt({head_dim}) and slice "
            f"the extra output columns off; above it, use another implementation (xla or cudnn)."
        )
    return None


def smem_bytes(kernel: str, block_q: int, block_k: int, head_dim: int, num_stages: int, itemsize: int = 2) -> int:
    """Bytes of shared memory one program of ``kernel`` asks for, as Triton lays it out for our kernels.

    Triton keeps the tiles that feed the tensor-core products in shared memory and the float32 accumulators and the
    softmax statistics in registers. A tile loaded once, before the loop, takes one buffer; a tile loaded inside the
    loop is software-pipelined over ``num_stages`` buffers (later iterations' copies land while this one computes).
    With H = ``head_dim`` (as padded) and tiles of ``itemsize``-byte elements:

    - ``"forward"``: q (block_q × H) once; k and v (block_k × H each) in the loop:
      ``itemsize · H · (block_q + 2 · num_stages · block_k)``;
    - ``"backward dK/dV"``: k and v (block_k × H each) once; q and dO (block_q × H each) in the loop:
      ``itemsize · H · (2 · block_k + 2 · num_stages · block_q)``;
    - ``"backward dQ"``: q and dO once; k and v in the loop: ``itemsize · H · (2 · block_q + 2 · num_stages · block_k)``.

    For example the forward at H = 256 with blocks (128, 64) and 3 stages in bfloat16 asks for
    2 · 256 · (128 + 6 · 64) = 262144 bytes, more than the 232448 a Hopper GPU allows, as its compiler reports.
    """
    if kernel == "forward":
        once, looped = block_q, block_k
    elif kernel == "backward dK/dV":
        once, looped = 2 * block_k, block_q
    elif kernel == "backward dQ":
        once, looped = 2 * block_q, block_k
    else:
        raise ValueError(f"kernel must be one of {KERNELS}; got {kernel!r}.")
    return itemsize * head_dim * (once + 2 * num_stages * looped)


def smem_limit() -> int:
    """Shared memory one program may ask for on this machine's first GPU (:data:`SMEM_BYTES`); Hopper's elsewhere."""
    device = jax.devices()[0]
    if device.platform != "gpu":
        return HOPPER_SMEM_BYTES
    return SMEM_BYTES.get(str(getattr(device, "compute_capability", "")), HOPPER_SMEM_BYTES)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything static about one call: mask, scale, blocks (forward and backward), Triton settings."""

    causal: bool
    scale: float
    block_q: int
    block_k: int
    bwd_q: int
    bwd_k: int
    num_warps: int
    num_stages: int  # the forward's
    bwd_stages: int  # both backward kernels'
    interpret: bool


def flash_attention(
    q,
    k,
    v,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_q: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    interpret: bool | None = None,
    return_lse: bool = False,
):
    """Our Pallas FlashAttention: q (B, T, N, H), k/v (B, S, K, H) -> (B, T, N, H), differentiable.

    Needs T % block_q == 0 and S % block_k == 0 (block sizes shrink to T or S when those are smaller); causal
    masks align top-left. ``interpret`` (default: when not on a GPU) runs Pallas's interpreter instead.
    ``return_lse=True`` returns ``(out, lse)`` with lse (B, N, T) float32, the natural log of each row's sum of
    exp(scale · q·k) — what context parallelism needs to merge partial results (differentiable too).

    Head dims: any multiple of 8 up to 256. Triton's tiles need power-of-two sizes, so a head dim that is not one
    (80, 96, 192, ...) is zero-padded to the next power of two (:func:`padded_head_dim`) before the kernels and the
    output's extra columns are sliced off after them: zero columns in q and k leave every score unchanged, zero
    columns in v give output columns that are dropped, and the softmax scale stays 1/sqrt(head_dim). The cost is the
    padded work: every product runs at the padded size, 128/80 = 1.6 times the FLOPs at H = 80 and 4/3 at H = 96 or
    192, plus one padded copy of q, k and v. Gradients flow through the pad and the slice (the custom VJP is inside).

    Shared memory: each kernel keeps its tiles in shared memory, the loop's tiles ``num_stages`` times over
    (:func:`smem_bytes`). ``num_stages=None`` takes, for the forward and for the backward, the most stages up to 3
    that fit this GPU's limit (:func:`smem_limit`, 227 KiB on Hopper); blocks and stages that cannot fit are refused
    with a ``ValueError`` that names the fix, before anything compiles.

    The backward (a ``jax.custom_vjp``) recomputes the weights block by block from the saved log-sum-exp
    (FlashAttention-2) in two kernels: one per key block accumulates dK and dV over the query blocks that see it,
    one per query block accumulates dQ over the key blocks it sees. dQ gets its own pass rather than being
    accumulated into from the dK/dV kernel because every program then owns its output: no atomic adds (which
    Pallas's Triton lowering offers only in float32 and which make results run-to-run nondeterministic), at the
    cost of recomputing q·kᵀ and dO·vᵀ once more. GQA: dK and dV are computed per query head and summed over the
    N // K heads that share a kv head.
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    if reason := head_dim_why_not(H):
        raise ValueError(f"{reason} (q {tuple(q.shape)}, k {tuple(k.shape)})")
    fields = _configure(
        T,
        S,
        H,
        jnp.dtype(q.dtype),
        block_q=block_q,
        block_k=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
        limit=smem_limit(),
        shapes=f"q {tuple(q.shape)}, k {tuple(k.shape)}",
    )
    plan = _Plan(
        causal=check_flag("is_causal", is_causal),
        scale=resolve_scale(scale, H),  # the head dim's own scale, also when it is padded
        interpret=jax.default_backend() != "gpu" if interpret is None else bool(interpret),
        **fields,
    )
    Hp = padded_head_dim(H)
    if Hp != H:
        pad = [(0, 0)] * 3 + [(0, Hp - H)]
        q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
    out, lse2 = _flash(q, k, v, plan)
    out = out[..., :H]
    return (out, lse2 * (1.0 / LOG2E)) if return_lse else out


def _configure(T, S, H, dtype, *, block_q, block_k, num_warps, num_stages, limit, shapes) -> dict:
    """The plan's blocks, warps and stages for this problem (the tuned ones where not given), or ``ValueError``.

    Every kernel's tiles must fit ``limit`` bytes of shared memory. A given ``num_stages`` is used as it is;
    ``None`` takes the most up to :data:`MAX_STAGES` that fit, per pass (forward, backward). Where even the fewest
    stages overflow, the blocks the caller did not choose are halved (block_k first) down to 16; what still
    overflows is refused, naming the fix.
    """
    Hp = padded_head_dim(H)
    tuned_q, tuned_k, tuned_warps = TUNED.get(Hp, (128, 64, 4 if Hp <= 64 else 8))
    bq = min(check_block_size("block_q", block_q) if block_q is not None else tuned_q, T)
    bk = min(check_block_size("block_k", block_k) if block_k is not None else tuned_k, S)
    if T % bq or S % bk:
        raise ValueError(
            f"T={T} and S={S} must be multiples of block_q={bq} and block_k={bk}; pad the sequences or pick "
            f"blocks that divide them ({shapes})."
        )
    fit = functools.partial(
        _fit,
        stages=check_block_size("num_stages", num_stages) if num_stages is not None else None,
        H=H,
        dtype=jnp.dtype(dtype),
        limit=limit,
        shapes=shapes,
    )
    bq, bk, stages = fit(KERNELS[:1], [bq, bk], [i for i, given in ((1, block_k), (0, block_q)) if given is None])
    bwd_q, bwd_k, bwd_stages = fit(KERNELS[1:], [_bwd_block(bq), _bwd_block(bk)], [0, 1])  # never the caller's
    warps = check_block_size("num_warps", num_warps) if num_warps is not None else tuned_warps
    return dict(
        block_q=bq, block_k=bk, bwd_q=bwd_q, bwd_k=bwd_k, num_stages=stages, bwd_stages=bwd_stages, num_warps=warps
    )


def _fit(kernels, blocks, free, *, stages, H, dtype, limit, shapes) -> tuple[int, int, int]:
    """(block_q, block_k, stages) at which every kernel of one pass fits: ``blocks`` as given, the ones indexed by
    ``free`` halved in that order while even the fewest stages overflow; ``ValueError`` when nothing frees room."""
    Hp, size = padded_head_dim(H), dtype.itemsize
    while True:
        n = stages if stages is not None else _most_stages(kernels, blocks, Hp, size, limit)
        over = [name for name in kernels if smem_bytes(name, blocks[0], blocks[1], Hp, n, size) > limit]
        if not over:
            return blocks[0], blocks[1], n
        halvable = [i for i in free if blocks[i] > 16 and blocks[i] % 2 == 0]
        if not halvable:
            raise ValueError(
                _smem_message(over[0], blocks[0], blocks[1], H, n, dtype, limit, stages is not None, shapes)
            )
        blocks[halvable[0]] //= 2


def _most_stages(kernels, blocks, head_dim, itemsize, limit) -> int:
    """The most stages, up to :data:`MAX_STAGES`, at which every kernel fits at ``blocks`` (1 if none does)."""
    for n in range(MAX_STAGES, 1, -1):
        if all(smem_bytes(name, blocks[0], blocks[1], head_dim, n, itemsize) <= limit for name in kernels):
            return n
    return 1


def _smem_message(kernel, bq, bk, H, stages, dtype, limit, stages_given, shapes) -> str:
    """Why these blocks and stages cannot run: the argument, the bytes, the arithmetic and what would fit."""
    Hp, size = padded_head_dim(H), dtype.itemsize
    need = smem_bytes(kernel, bq, bk, Hp, stages, size)
    once, looped = {"forward": (bq, bk), "backward dK/dV": (2 * bk, bq), "backward dQ": (2 * bq, bk)}[kernel]
    head = f"head_dim {H}" + (f" (padded to {Hp})" if Hp != H else "")
    lead = f"num_stages={stages}" if stages_given else f"block_q={bq}, block_k={bk} (even at one stage)"
    fixes = []
    fewer = [n for n in range(stages - 1, 0, -1) if smem_bytes(kernel, bq, bk, Hp, n, size) <= limit]
    if stages_given and fewer:
        fixes.append(f"num_stages={fewer[0]} (or None: the most that fit)")
    # halve the block the loop streams first (block_k in the forward and dQ, block_q in dK/dV), then the other
    order = ("block_q", "block_k") if kernel == "backward dK/dV" else ("block_k", "block_q")
    blocks = {"block_q": bq, "block_k": bk}
    for name in order:
        while blocks[name] > 16 and smem_bytes(kernel, blocks["block_q"], blocks["block_k"], Hp, stages, size) > limit:
            blocks[name] //= 2
        if smem_bytes(kernel, blocks["block_q"], blocks["block_k"], Hp, stages, size) <= limit:
            fixes.append(" and ".join(f"{n}={b}" for n, b in blocks.items() if b != {"block_q": bq, "block_k": bk}[n]))
            break
    return (
        f"{lead}: the {kernel} kernel at {head}, {dtype.name}, blocks ({bq}, {bk}) and {stages} stage(s) needs "
        f"{need} bytes of shared memory per program ({size} · {Hp} · ({once} + 2 · {stages} · {looped})), more than "
        f"the {limit} this GPU allows ({shapes}). Pass " + (" or ".join(fixes) or "a smaller head_dim") + "."
    )


def _bwd_block(block: int) -> int:
    return BWD_BLOCK if block > BWD_BLOCK and block % BWD_BLOCK == 0 else block


def _params(plan: _Plan, stages: int) -> dict:
    if plan.interpret:
        return {}
    from jax.experimental.pallas import triton as plgpu

    return {"compiler_params": plgpu.CompilerParams(num_warps=plan.num_warps, num_stages=stages)}


@functools.partial(jax.jit, static_argnums=3)  # calls with the same shapes and plan share one lowering
def _forward(q, k, v, plan: _Plan):
    """The forward kernel: (out, lse2) with lse2 (B, N, T) the base-2 log-sum-exp of the scaled logits."""
    B, T, S, N, K, H = attention_shape(q, k, v)
    G, bq = N // K, plan.block_q
    kernel = functools.partial(
        _kernel, causal=plan.causal, block_q=bq, block_k=plan.block_k, seq_kv=S, scale=plan.scale
    )
    call = pl.pallas_call(
        kernel,
        grid=(T // bq, B, N),
        in_specs=[
            pl.BlockSpec((None, bq, None, H), lambda i, b, n: (b, i, n, 0)),  # one q tile of head n
            pl.BlockSpec((None, S, None, H), lambda i, b, n: (b, 0, n // G, 0)),  # all keys of kv head n // G
            pl.BlockSpec((None, S, None, H), lambda i, b, n: (b, 0, n // G, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, bq, None, H), lambda i, b, n: (b, i, n, 0)),
            pl.BlockSpec((None, None, bq), lambda i, b, n: (b, n, i)),  # the log-sum-exp of each row
        ],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, N, T), jnp.float32)],
        interpret=plan.interpret,
        name="our_flash_forward",
        **_params(plan, plan.num_stages),
    )
    return tuple(call(q, k, v))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _flash(q, k, v, plan):
    return _forward(q, k, v, plan)


def _flash_fwd(q, k, v, plan):
    out, lse2 = _forward(q, k, v, plan)
    return (out, lse2), (q, k, v, out, lse2)


def _flash_bwd(plan: _Plan, residuals, cotangents):
    q, k, v, out, lse2 = residuals
    d_out, d_lse2 = cotangents
    # D = rowsum(dO ∘ O); a cotangent on the log-sum-exp adds P·d_lse to dS, i.e. shifts D (base 2 -> natural).
    delta = jnp.einsum("btnh,btnh->bnt", out.astype(jnp.float32), d_out.astype(jnp.float32))
    delta = delta - LOG2E * d_lse2.astype(jnp.float32)
    return _backward(q, k, v, d_out.astype(q.dtype), lse2, delta, plan)


@functools.partial(jax.jit, static_argnums=6)  # as _forward: one lowering per shape and plan
def _backward(q, k, v, d_out, lse2, delta, plan: _Plan):
    """The two backward kernels: (dq, dk, dv)."""
    B, T, S, N, K, H = attention_shape(q, k, v)
    G, bq, bk = N // K, plan.bwd_q, plan.bwd_k
    row = pl.BlockSpec((None, None, T), lambda j, b, n: (b, n, 0))
    whole_q = pl.BlockSpec((None, T, None, H), lambda j, b, n: (b, 0, n, 0))
    kv_tile = pl.BlockSpec((None, bk, None, H), lambda j, b, n: (b, j, n // G, 0))
    dkv_dtype = q.dtype if G == 1 else jnp.float32  # per-query-head partial sums stay float32 until summed
    dkv_out = pl.BlockSpec((None, bk, None, H), lambda j, b, n: (b, j, n, 0))
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, causal=plan.causal, block_q=bq, block_k=bk, seq_q=T, scale=plan.scale),
        grid=(S // bk, B, N),
        in_specs=[whole_q, kv_tile, kv_tile, whole_q, row, row],
        out_specs=[dkv_out, dkv_out],
        out_shape=[jax.ShapeDtypeStruct((B, S, N, H), dkv_dtype)] * 2,
        interpret=plan.interpret,
        name="our_flash_backward_dkv",
        **_params(plan, plan.bwd_stages),
    )(q, k, v, d_out, lse2, delta)
    if G > 1:  # GQA: sum over the query heads that share each kv head
        dk = dk.reshape(B, S, K, G, H).sum(axis=3).astype(k.dtype)
        dv = dv.reshape(B, S, K, G, H).sum(axis=3).astype(v.dtype)
    q_tile = pl.BlockSpec((None, bq, None, H), lambda i, b, n: (b, i, n, 0))
    whole_kv = pl.BlockSpec((None, S, None, H), lambda i, b, n: (b, 0, n // G, 0))
    row_tile = pl.BlockSpec((None, None, bq), lambda i, b, n: (b, n, i))
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, causal=plan.causal, block_q=bq, block_k=bk, seq_kv=S, scale=plan.scale),
        grid=(T // bq, B, N),
        in_specs=[q_tile, whole_kv, whole_kv, q_tile, row_tile, row_tile],
        out_specs=q_tile,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=plan.interpret,
        name="our_flash_backward_dq",
        **_params(plan, plan.bwd_stages),
    )(q, k, v, d_out, lse2, delta)
    return dq, dk, dv


_flash.defvjp(_flash_fwd, _flash_bwd)


def why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why our kernel cannot run this problem here (it times only on a GPU), or None."""
    if jax.default_backend() != "gpu":
        return "our Pallas kernel is timed on a GPU only (on a CPU it runs in Pallas's slow interpreter, for tests)."
    return _why_not_here(shape, dtype, smem_limit())


def _why_not_here(shape: AttentionShape, dtype, limit: int) -> str | None:
    """Why :func:`flash_attention`, at its default blocks and stages, refuses this problem on a GPU that allows
    ``limit`` bytes of shared memory per program, or None."""
    if reason := _dtype_why_not(dtype) or head_dim_why_not(shape.head_dim):
        return reason
    try:
        _configure(
            shape.seq_q,
            shape.seq_kv,
            shape.head_dim,
            dtype,
            block_q=None,
            block_k=None,
            num_warps=None,
            num_stages=None,
            limit=limit,
            shapes=f"T={shape.seq_q}, S={shape.seq_kv}",
        )
    except ValueError as e:
        return str(e)
    return None


def _dtype_why_not(dtype) -> str | None:
    if jnp.dtype(dtype).name not in ("bfloat16", "float16"):
        return f"it takes bfloat16/float16 (tensor-core) inputs, not {jnp.dtype(dtype).name}."
    return None


def jax_bundled_mha(q, k, v, *, is_causal: bool = False):
    """JAX's bundled Pallas (Triton) attention, ``jax.experimental.pallas.ops.gpu.attention.mha``, for the race.

    It has no GQA: k/v heads are repeated to N first. Its default softmax scale is 1.0, so we pass 1/sqrt(H).
    """
    B, T, S, N, K, H = attention_shape(q, k, v)
    if K != N:
        k, v = jnp.repeat(k, N // K, axis=2), jnp.repeat(v, N // K, axis=2)
    from jax.experimental.pallas.ops.gpu import attention

    return attention.mha(q, k, v, None, sm_scale=1.0 / math.sqrt(H), causal=is_causal)


def bundled_why_not(shape: AttentionShape, dtype, causal: bool) -> str | None:
    """Why JAX's bundled Pallas kernel cannot run this problem here, or None."""
    if jax.default_backend() != "gpu":
        return "JAX's bundled Pallas kernel lowers through Triton: it needs an NVIDIA GPU."
    return _bundled_why_not_here(shape, dtype, smem_limit())


BUNDLED_BLOCKS, BUNDLED_STAGES = (128, 128), 2  # mha's defaults (BlockSizes.get_default(), num_stages=2)


def _bundled_why_not_here(shape: AttentionShape, dtype, limit: int) -> str | None:
    """Why JAX's bundled kernel (its forward: its defaults, the same tiles as ours) does not fit, or None."""
    if reason := _dtype_why_not(dtype):
        return reason
    if shape.head_dim not in (16, 32, 64, 128, 256):
        return f"head_dim must be a power of two between 16 and 256; got {shape.head_dim}."
    bq, bk = min(BUNDLED_BLOCKS[0], shape.seq_q), min(BUNDLED_BLOCKS[1], shape.seq_kv)
    if shape.seq_q % bq or shape.seq_kv % bk:
        return f"T and S must be multiples of the blocks ({bq}, {bk}); got T={shape.seq_q}, S={shape.seq_kv}."
    if (need := smem_bytes("forward", bq, bk, shape.head_dim, BUNDLED_STAGES, jnp.dtype(dtype).itemsize)) > limit:
        return (
            f"at head_dim {shape.head_dim} its forward (blocks ({bq}, {bk}), {BUNDLED_STAGES} stages) needs {need} "
            f"bytes of shared memory per program, more than the {limit} this GPU allows."
        )
    return None
