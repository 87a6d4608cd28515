import jax.numpy as jnp
import pytest

from attention_tutorial.measure.flops import attention_bytes, attention_flops, kv_cache_bytes


def test_forward_flops_by_hand():
    # B=4, N=8, T=S=128, H=64: 2 matmuls x 2 FLOP x 4*8*128*128*64 MACs
    assert attention_flops(4, 128, 128, 8, 64) == 2 * 2 * 4 * 8 * 128 * 128 * 64 == 134_217_728


def test_causal_halves_and_backward_is_two_and_a_half_times():
    full = attention_flops(2, 1024, 1024, 16, 128)
    assert attention_flops(2, 1024, 1024, 16, 128, causal=True) == full / 2
    assert attention_flops(2, 1024, 1024, 16, 128, pass_="fwd+bwd") == full * 3.5


def test_cross_attention_uses_both_lengths():
    assert attention_flops(1, 10, 30, 1, 8) == 4 * 10 * 30 * 8


def test_unknown_pass():
    with pytest.raises(ValueError, match="pass_"):
        attention_flops(1, 1, 1, 1, 1, pass_="bwd")


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
