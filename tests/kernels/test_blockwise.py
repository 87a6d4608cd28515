"""The online-softmax (FlashAttention) algorithm in JAX: values and gradients against references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_tutorial.inputs import make_qkv
from attention_tutorial.kernels.blockwise import blockwise_attention
from attention_tutorial.kernels.reference import naive_attention, reference_attention


@given(
    t=st.integers(1, 70), s=st.integers(1, 70), k=st.sampled_from([1, 2]), g=st.sampled_from([1, 2]),
    causal=st.booleans(), bq=st.sampled_from([8, 16, 32]), bk=st.sampled_from([8, 16, 64]), seed=st.integers(0, 99),
)  # fmt: skip
def test_values_match_float64_reference(t, s, k, g, causal, bq, bk, seed):
    q, kk, v = make_qkv(2, t, k * g, 8, seq_kv=s, kv_heads=k, seed=seed)
    out = blockwise_attention(q, kk, v, is_causal=causal, block_q=bq, block_k=bk)
    np.testing.assert_allclose(out, reference_attention(q, kk, v, is_causal=causal), atol=2e-5, rtol=2e-5)


def _grad_reference(q, k, v, d_out, causal):
    """Gradients by autodiff of the naive attention in float64 (jax x64 locally enabled)."""
    with jax.enable_x64(True):
        f = lambda q, k, v: naive_attention(q, k, v, is_causal=causal)  # noqa: E731
        _, vjp = jax.vjp(f, *(jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, v)))
        return [np.asarray(g) for g in vjp(jnp.asarray(np.asarray(d_out), jnp.float64))]


@pytest.mark.parametrize(
    ("t", "s", "n", "k", "causal"), [(48, 48, 4, 2, True), (40, 56, 2, 2, False), (33, 17, 4, 1, True)]
)
def test_gradients_match_float64_autodiff(t, s, n, k, causal):
    q, kk, v = make_qkv(2, t, n, 16, seq_kv=s, kv_heads=k, seed=t)
    d_out = jax.random.normal(jax.random.key(1), q.shape)
    _, vjp = jax.vjp(lambda q, k, v: blockwise_attention(q, k, v, is_causal=causal, block_q=16, block_k=16), q, kk, v)
    for got, want in zip(vjp(d_out), _grad_reference(q, kk, v, d_out, causal)):
        np.testing.assert_allclose(got, want, atol=5e-5, rtol=5e-5)


def test_bf16_within_bf16_tolerance():
    q, k, v = make_qkv(1, 128, 4, 32, dtype=jnp.bfloat16)
    out = blockwise_attention(q, k, v, is_causal=True, block_q=32, block_k=32)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(out, np.float32), reference_attention(q, k, v, is_causal=True), atol=2e-2, rtol=2e-2
    )


def test_rows_with_nothing_to_see_are_zero():
    # T > S with causal top-left: every query sees key 0 at least; with S padded inside a block nothing leaks
    q, k, v = make_qkv(1, 20, 2, 8, seq_kv=5, seed=3)
    out = blockwise_attention(q, k, v, is_causal=True, block_q=8, block_k=4)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=True), atol=2e-5)


def test_bad_block_size():
    q, k, v = make_qkv(1, 8, 1, 8)
    with pytest.raises(ValueError, match="block sizes"):
        blockwise_attention(q, k, v, block_q=0)
