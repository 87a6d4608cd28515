import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape
from attention_tutorial.kernels.masks import MASK_KINDS, mask_args, split_static
from attention_tutorial.measure.flops import (
    BF16_PEAK,
    DATASHEET,
    DATASHEET_BF16,
    DATASHEET_FP8,
    FP8_PEAK,
    attention_bytes,
    attention_flops,
    datasheet_peak,
    gemm_flops,
    kept_positions,
    kv_cache_bytes,
    mask_kept_positions,
    materialised_bytes,
    peak_for,
)


def test_forward_flops_by_hand():
    # B=4, N=8, T=S=128, H=64: 2 matmuls x 2 FLOP x 4*8*128*128*64 MACs
    assert attention_flops(4, 128, 128, 8, 64) == 2 * 2 * 4 * 8 * 128 * 128 * 64 == 134_217_728


def test_causal_counts_the_triangle_exactly_and_backward_is_three_and_a_half_times():
    full = attention_flops(2, 1024, 1024, 16, 128)
    # T=S=1024: 1024*1025/2 kept pairs per (batch, head), one more than half per query on average
    assert attention_flops(2, 1024, 1024, 16, 128, causal=True) == full * (1024 * 1025 / 2) / 1024**2
    assert attention_flops(2, 1024, 1024, 16, 128, pass_="fwd+bwd") == full * 3.5


def test_cross_attention_uses_both_lengths_and_causal_stays_top_left():
    assert attention_flops(1, 10, 30, 1, 8) == 4 * 10 * 30 * 8
    # T=1 decoding with a top-left causal mask sees key 0 only; T=4 < S=10: 1+2+3+4 keys
    assert kept_positions(1, 8192, causal=True) == 1
    assert kept_positions(4, 10, causal=True) == 10
    # T=10 > S=4: rows 0..3 see 1..4 keys, rows 4..9 see all 4
    assert kept_positions(10, 4, causal=True) == 1 + 2 + 3 + 4 + 6 * 4


def test_unknown_pass_and_mask():
    with pytest.raises(ValueError, match="pass_"):
        attention_flops(1, 1, 1, 1, 1, pass_="bwd")
    with pytest.raises(ValueError, match="unknown mask"):
        attention_flops(1, 1, 1, 1, 1, mask="diagonal")


def _kept_by_jax(kind, shape, causal, window):
    """Count kept positions with JAX's own masking: v one-hot per key (H = S), so output[b, i, n, j] is query i's
    weight on key j, > 0 exactly where it attends key j. q = k = 0 and a bias falling with j (ALiBi's, or one added
    here) make the weights of kept keys unequal, so a row whose weights are all equal had every key masked (JAX
    then spreads it evenly over all keys): it keeps nothing."""
    B, T, S, N = shape.batch, shape.seq_q, shape.seq_kv, shape.heads
    q = jnp.zeros((B, T, N, S), jnp.float32)
    k = jnp.zeros((B, S, N, S), jnp.float32)
    v = jnp.broadcast_to(jnp.eye(S, dtype=jnp.float32)[None, :, None, :], (B, S, N, S))
    arrays, static = split_static(mask_args(kind, shape, jnp.float32, causal=causal, window=window))
    arrays.setdefault("bias", -0.01 * jnp.arange(S, dtype=jnp.float32)[None, None, None, :])
    out = np.asarray(jax.nn.dot_product_attention(q, k, v, implementation="xla", is_causal=causal, **arrays, **static))
    fully_masked = (out == out[..., :1]).all(axis=-1, keepdims=True)
    kept = (out > 0) & ~fully_masked  # (B, T, N, S)
    assert (kept == kept[:, :, :1]).all()  # every head keeps the same positions
    return int(kept[:, :, 0].sum())


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("T", "S"), [(24, 24), (9, 24), (24, 9), (1, 17)])
def test_kept_positions_match_jax_s_own_masking(kind, causal, T, S):
    shape = AttentionShape(3, T, S, 2, 2, 8)
    window = 5
    expected = _kept_by_jax(kind, shape, causal, window)
    assert mask_kept_positions(kind, shape, causal=causal, window=window) == expected
    flops = attention_flops(3, T, S, 2, 8, causal=causal, mask=kind, window=window)
    assert flops == 4 * 2 * 8 * expected


def test_window_and_padding_keep_fewer_than_full():
    shape = AttentionShape(4, 4096, 4096, 16, 16, 128)
    full = mask_kept_positions("none", shape)
    assert mask_kept_positions("window", shape, causal=True) < full / 10  # 257 keys of 4096 at most
    assert mask_kept_positions("padding", shape) < full


def test_gemm_and_peaks():
    assert gemm_flops(32768, 4096, 4096) == 2 * 32768 * 4096 * 4096
    assert peak_for("bfloat16", 700.0) == (700.0, BF16_PEAK)
    assert peak_for("float8_e4m3fn", 700.0) == (1400.0, FP8_PEAK) and peak_for("float8", 700.0)[0] == 1400.0
    assert peak_for("float8", None) == (None, FP8_PEAK)


def test_bytes_read_q_k_v_write_out():
    # decode: T=1 query, S=1000 keys, N=32 heads, K=8 kv heads, H=128, bf16
    q_out = 2 * 1 * 32 * 128
    kv = 2 * 1000 * 8 * 128
    assert attention_bytes(1, 1, 1000, 32, 8, 128, jnp.bfloat16) == 2 * (q_out + kv)


def test_kv_cache_bytes_llama_like():
    # 32 layers, 8 kv heads, H=128, bf16: 2*32*8*128*2 = 131072 bytes per token
    assert kv_cache_bytes(8, 128, jnp.bfloat16, layers=32) == 131_072
    assert kv_cache_bytes(8, 128, jnp.bfloat16, layers=32, tokens=4096, batch=2) == 131_072 * 8192
    assert kv_cache_bytes(32, 128, jnp.bfloat16) == 4 * kv_cache_bytes(8, 128, jnp.bfloat16)  # MHA vs GQA-8
    assert kv_cache_bytes(1, 128, jnp.float32) == 2 * 128 * 4


def test_materialised_bytes_add_the_scores_and_weights_written_and_read_once():
    # B=2, T=S=64, N=4, H=32, bf16: 2·4·64·64 = 32768 scores, each float32 (4 B) and bf16 weights (2 B), both ways
    fused = attention_bytes(2, 64, 64, 4, 4, 32, jnp.bfloat16)
    assert fused == (2 * 2 * 64 * 4 * 32 + 2 * 2 * 64 * 4 * 32) * 2
    assert materialised_bytes(2, 64, 64, 4, 4, 32, jnp.bfloat16) == fused + 32768 * 2 * (4 + 2)
    # float32 inputs keep float32 weights; a bf16 score buffer halves that part
    f32 = attention_bytes(2, 64, 64, 4, 4, 32, "float32")
    assert materialised_bytes(2, 64, 64, 4, 4, 32, "float32") == f32 + 32768 * 2 * (4 + 4)
    assert materialised_bytes(2, 64, 64, 4, 4, 32, "float32", score_dtype="bfloat16") == f32 + 32768 * 2 * (2 + 4)


def test_materialised_traffic_grows_with_s_while_the_fused_minimum_does_not_at_fixed_t():
    grow = [
        materialised_bytes(1, 128, s, 8, 8, 64, "bfloat16") - attention_bytes(1, 128, s, 8, 8, 64, "bfloat16")
        for s in (1024, 2048, 4096)
    ]
    assert grow[1] == 2 * grow[0] and grow[2] == 2 * grow[1]  # the score part is linear in S


def test_datasheet_peaks_by_device_name_and_dtype():
    assert datasheet_peak("NVIDIA H200", "bfloat16") == (989.4, DATASHEET_BF16)
    assert round(datasheet_peak("NVIDIA H200", "float16")[0]) == 989  # the figure FlashAttention-3 divides by
    assert datasheet_peak("NVIDIA H200", "float32")[0] == 989.4  # judged against bf16, as peak_for does
    assert datasheet_peak("NVIDIA H200", "float8_e4m3fn") == (1978.9, DATASHEET_FP8)
    assert datasheet_peak("NVIDIA A100-SXM4-80GB", "float8_e5m2")[0] is None  # no FP8 tensor cores
    assert datasheet_peak(None, "bfloat16")[0] is None and datasheet_peak("cpu", "bfloat16")[0] is None


def test_datasheet_fp8_is_twice_bf16_where_a_chip_has_it():
    for name, sheet in DATASHEET.items():
        assert sheet.bf16_tflops > 0 and sheet.hbm_gbps > 0, name
        if sheet.fp8_tflops is not None:
            assert sheet.fp8_tflops == pytest.approx(2 * sheet.bf16_tflops, rel=1e-2), name  # rounded figures
