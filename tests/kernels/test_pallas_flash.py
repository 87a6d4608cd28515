"""Our Pallas kernel: in Pallas's interpreter on the CPU, compiled through Triton on the GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape, make_qkv
from attention_tutorial.kernels.pallas_flash import _block_why_not, flash_attention, jax_bundled_mha
from attention_tutorial.kernels.reference import reference_attention
from attention_tutorial.measure.compiled import kernels_used


@pytest.mark.parametrize(
    ("t", "s", "n", "k", "causal", "bq", "bk"),
    [
        (64, 64, 2, 2, False, 32, 16),
        (64, 64, 4, 1, True, 16, 16),
        (32, 96, 2, 1, True, 16, 32),
        (96, 32, 2, 2, True, 32, 16),
    ],
)
def test_interpreted_kernel_matches_reference(t, s, n, k, causal, bq, bk):
    q, kk, v = make_qkv(1, t, n, 16, seq_kv=s, kv_heads=k, seed=t + s)
    out = flash_attention(q, kk, v, is_causal=causal, block_q=bq, block_k=bk, interpret=True)
    np.testing.assert_allclose(out, reference_attention(q, kk, v, is_causal=causal), atol=2e-5, rtol=2e-5)


def test_block_divisibility_error():
    q, k, v = make_qkv(1, 48, 1, 16)
    with pytest.raises(ValueError, match="multiples of block_q"):
        flash_attention(q, k, v, block_q=32, interpret=True)


def test_why_not_names_dtype_and_head_dim():
    assert "bfloat16" in _block_why_not(AttentionShape(1, 128, 128, 1, 1, 64), jnp.float32, 128, 64)
    assert "power of two" in _block_why_not(AttentionShape(1, 128, 128, 1, 1, 96), jnp.bfloat16, 128, 64)
    assert _block_why_not(AttentionShape(1, 256, 256, 1, 1, 128), jnp.bfloat16, 128, 64) is None


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gpu_kernel_matches_reference(causal, head_dim, dtype):
    for b, t, n, k in ((2, 1024, 8, 8), (1, 2048, 8, 2)):
        q, kk, v = make_qkv(b, t, n, head_dim, kv_heads=k, dtype=dtype, seed=t)
        fn = jax.jit(lambda q, k, v: flash_attention(q, k, v, is_causal=causal))
        out = np.asarray(fn(q, kk, v), np.float32)
        ref = reference_attention(q[:, :256], kk, v, is_causal=causal)  # check the first 256 rows in float64
        np.testing.assert_allclose(out[:, :256], ref, atol=1e-2, rtol=1e-2)
        assert np.isfinite(out).all()
        assert not any(t.startswith("__cudnn") for t in kernels_used(fn, q, kk, v))


@pytest.mark.gpu
def test_jax_bundled_kernel_matches_reference():
    q, k, v = make_qkv(2, 512, 4, 64, kv_heads=2, dtype=jnp.bfloat16)
    out = np.asarray(jax_bundled_mha(q, k, v, is_causal=True), np.float32)
    np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=True), atol=1e-2, rtol=1e-2)
