"""FLOP and byte models for attention, kept apart from timing (as in FlashAttention's benchmarks).

Forward: two matmuls per score position a mask keeps, q·kᵀ and P·v, each H multiply-adds: 4·N·H FLOPs per kept
(query, key) pair, summed over the batch. With no mask every one of the T·S pairs is kept (4·B·N·T·S·H). A mask
counts only what it keeps (:func:`kept_positions`): the causal triangle (top-left aligned, as
``jax.nn.dot_product_attention`` applies it, also when T != S: query i sees keys 0…i), a sliding window, and
padding (the pairs inside each row's lengths). The count is exact: a causal T = S problem keeps T·(T+1)/2 pairs,
not the T²/2 of FlashAttention's convention (they differ by 1/T). The backward pass does five such matmuls to
the forward's two: ×2.5, so a forward+backward step is 3.5× the forward. Softmax FLOPs are not counted.

Bytes: :func:`attention_bytes` is the fewest a forward pass can move to and from HBM (q, k, v read once, the output
written once: what a fused kernel moves); :func:`materialised_bytes` adds the (B, N, T, S) scores and softmax
weights that an unfused path (the naive version, XLA's) writes to HBM and reads back. FLOPs over bytes is the
arithmetic intensity a roofline is read by.

Peaks, two bases. :func:`datasheet_peak`, the peak: the vendor's dense tensor-core figure (:data:`DATASHEET`), the
basis the FlashAttention papers quote. A CPU has no datasheet peak. :func:`peak_for`, a reference on the card:
bf16/fp16/f32 results are set against the bf16 matmul measured in the same run, FP8 results against twice it
(Hopper's FP8 tensor cores do twice the bf16 rate), stated in ``peak_basis``. That matmul is not a ceiling: an
attention kernel can run faster than it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from ..inputs import AttentionShape
from ..kernels.masks import MASK_KINDS, WINDOW, mask_args

PASSES = ("fwd", "fwd+bwd")
BF16_PEAK = "bf16 matmul (measured)"
FP8_PEAK = "fp8 = 2 × bf16 matmul (measured)"


class Datasheet(NamedTuple):
    """A GPU's datasheet figures: dense (no 2:4 sparsity) tensor-core TFLOP/s for bf16 (fp16 is the same) and FP8
    (None where the chip has no FP8 tensor cores), and the HBM bandwidth in GB/s."""

    bf16_tflops: float
    fp8_tflops: float | None
    hbm_gbps: float


#: Datasheet figures by the device name JAX reports (``jax.devices()[0].device_kind``, a result file's ``gpu``).
#: NVIDIA quotes tensor-core rates "with sparsity"; these are the dense halves. H100 SXM and H200 share one compute
#: die and clocks (132 SMs at 1.83 GHz: 989.4 bf16, 1978.9 FP8); the H200 has more and faster HBM.
DATASHEET = {
    "NVIDIA H200": Datasheet(989.4, 1978.9, 4800.0),
    "NVIDIA H100 80GB HBM3": Datasheet(989.4, 1978.9, 3350.0),
    "NVIDIA A100-SXM4-80GB": Datasheet(312.0, None, 2039.0),
    "NVIDIA A100-SXM4-40GB": Datasheet(312.0, None, 1555.0),
    "NVIDIA L4": Datasheet(121.0, 242.5, 300.0),
}
#: FlashAttention-3's best bf16 forward on an H100 SXM5 as its paper reports it (arXiv 2407.08608), TFLOP/s: a
#: published attention speed to set beside the matmul measured on a card.
FA3_BF16_TFLOPS = 740
DATASHEET_BF16 = "dense bf16 tensor cores (datasheet)"
DATASHEET_FP8 = "dense fp8 tensor cores (datasheet)"


def kept_positions(seq_q, seq_kv, *, causal=False, window=None, q_lengths=None, kv_lengths=None) -> int:
    """(query, key) pairs kept, summed over the batch rows given by ``q_lengths``/``kv_lengths`` (one row if
    neither): top-left causal (key j <= query i), a ``window`` (left, right) keeping i-left <= j <= i+right, and
    per-row lengths (query i < q_len, key j < kv_len)."""
    rows = max(np.size(q_lengths) if q_lengths is not None else 1, np.size(kv_lengths) if kv_lengths is not None else 1)
    q_len = np.broadcast_to(np.asarray(seq_q if q_lengths is None else q_lengths, np.int64), (rows,))
    kv_len = np.broadcast_to(np.asarray(seq_kv if kv_lengths is None else kv_lengths, np.int64), (rows,))
    i = np.arange(seq_q, dtype=np.int64)[None, :]  # one row of queries per batch row
    lo = np.zeros_like(i)
    hi = np.broadcast_to(np.minimum(kv_len, seq_kv)[:, None] - 1, (rows, seq_q))
    if causal:
        hi = np.minimum(hi, i)
    if window is not None:
        left, right = window
        lo, hi = np.maximum(lo, i - left), np.minimum(hi, i + right)
    kept = np.clip(hi - lo + 1, 0, None) * (i < np.minimum(q_len, seq_q)[:, None])
    return int(kept.sum())


def mask_kept_positions(mask: str, shape: AttentionShape, *, causal=False, window=WINDOW, seed=0) -> int:
    """Score positions (per head, summed over the batch) that mask ``mask`` of
    :mod:`attention_tutorial.kernels.masks` keeps for ``shape``, with the same window and padding lengths."""
    B, T, S = shape.batch, shape.seq_q, shape.seq_kv
    if mask in ("none", "bias"):  # a bias reweights, it masks nothing
        return B * kept_positions(T, S, causal=causal)
    if mask == "dense":  # the causal triangle as a matrix
        return B * kept_positions(T, S, causal=True)
    if mask == "window":
        return B * kept_positions(T, S, causal=causal, window=(window, 0 if causal else window))
    if mask == "padding":
        lengths = mask_args("padding", shape, jnp.float32, causal=causal, seed=seed)
        return kept_positions(
            T,
            S,
            causal=causal,
            q_lengths=np.asarray(lengths["query_seq_lengths"]),
            kv_lengths=np.asarray(lengths["key_value_seq_lengths"]),
        )
    raise ValueError(f"unknown mask kind {mask!r}; choose from {MASK_KINDS}.")


def attention_flops(
    batch, seq_q, seq_kv, heads, head_dim, *, causal=False, pass_="fwd", mask="none", window=WINDOW, seed=0
) -> float:
    """Matmul FLOPs of one attention call: 4·N·H per kept score position (all B·T·S without a mask), ×3.5 for
    fwd+bwd."""
    if pass_ not in PASSES:
        raise ValueError(f"pass_ must be one of {PASSES}; got {pass_!r}.")
    shape = AttentionShape(batch, seq_q, seq_kv, heads, heads, head_dim)
    kept = mask_kept_positions(mask, shape, causal=causal, window=window, seed=seed)
    return 4.0 * heads * head_dim * kept * (3.5 if pass_ == "fwd+bwd" else 1.0)


def gemm_flops(m, k, n) -> float:
    """FLOPs of an (m, k) × (k, n) matrix product: 2·m·k·n."""
    return 2.0 * m * k * n


def is_fp8(dtype: str) -> bool:
    """Whether ``dtype`` names an FP8 type ('float8', 'float8_e4m3fn', 'float8_e5m2', ...)."""
    return str(dtype).startswith("float8")


def peak_for(dtype: str, bf16_peak: float | None) -> tuple[float | None, str]:
    """(reference TFLOP/s, peak_basis) to set a ``dtype`` result against: the bf16 matmul measured on the card, ×2 for
    FP8."""
    if is_fp8(dtype):
        return (2 * bf16_peak if bf16_peak else None), FP8_PEAK
    return bf16_peak, BF16_PEAK


def datasheet_peak(gpu: str | None, dtype: str) -> tuple[float | None, str]:
    """(TFLOP/s, basis) of the datasheet peak to judge a ``dtype`` result on ``gpu`` by: dense FP8 for FP8 results,
    dense bf16 for every other dtype (as :func:`peak_for` judges them against the measured bf16 matmul). The peak is
    None for a device not in :data:`DATASHEET` (a CPU, an unlisted GPU) or an FP8 result on a chip without FP8."""
    sheet = DATASHEET.get(gpu) if gpu else None
    if is_fp8(dtype):
        return (sheet.fp8_tflops if sheet else None), DATASHEET_FP8
    return (sheet.bf16_tflops if sheet else None), DATASHEET_BF16


def attention_bytes(batch, seq_q, seq_kv, heads, kv_heads, head_dim, dtype) -> int:
    """The fewest bytes a forward pass must move: read q, k, v once and write the output once."""
    item = jnp.dtype(dtype).itemsize
    q_and_out = 2 * batch * seq_q * heads * head_dim
    k_and_v = 2 * batch * seq_kv * kv_heads * head_dim
    return (q_and_out + k_and_v) * item


def materialised_bytes(
    batch, seq_q, seq_kv, heads, kv_heads, head_dim, dtype, *, score_dtype="float32", weight_dtype=None
) -> int:
    """The fewest bytes a forward pass that materialises the scores must move: :func:`attention_bytes` plus the
    (B, N, T, S) scores written once and read once (``score_dtype``: float32, as the naive version and XLA compute
    them) and the softmax weights written once and read once (``weight_dtype``, default ``dtype``: both cast the
    weights to v's dtype before the second matmul). A mask does not shrink it: these paths compute every score."""
    weight_dtype = dtype if weight_dtype is None else weight_dtype
    per_score = 2 * (jnp.dtype(score_dtype).itemsize + jnp.dtype(weight_dtype).itemsize)  # write + read of each
    scores = batch * heads * seq_q * seq_kv
    return attention_bytes(batch, seq_q, seq_kv, heads, kv_heads, head_dim, dtype) + scores * per_score


def kv_cache_bytes(kv_heads, head_dim, dtype, *, tokens=1, batch=1, layers=1) -> int:
    """Bytes of a key/value cache: 2 (k and v) · layers · K · H · itemsize per token, times tokens and batch.

    Only K, the number of key/value heads, enters: query heads don't. That is why GQA (K < N) and MQA (K = 1)
    shrink the cache by N / K.
    """
    return 2 * layers * kv_heads * head_dim * jnp.dtype(dtype).itemsize * tokens * batch
