"""Our Mosaic GPU kernel: validation and lowering on the CPU, values against float64 on a Hopper GPU."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape, make_qkv
from attention_tutorial.kernels.mosaic_flash import (
    MosaicConfig,
    _problem_why_not,
    bundled_why_not,
    jax_bundled_mosaic,
    mosaic_flash_attention,
    mosaic_flash_backward,
    why_not,
)
from attention_tutorial.kernels.reference import reference_attention
from attention_tutorial.measure.compiled import kernels_used
from tests.kernels.test_pallas_flash import (  # float64 NumPy gradients, shared with its tests
    assert_grads_close,
    reference_grads,
    reference_lse,
)


@pytest.mark.parametrize(
    ("shape", "dtype", "expected"),
    [
        (AttentionShape(1, 256, 256, 4, 4, 128), jnp.float32, "bfloat16 or float16"),
        (AttentionShape(1, 256, 256, 4, 4, 96), jnp.bfloat16, "head_dim must be 64 or 128; got 96"),
        (AttentionShape(1, 200, 256, 4, 4, 64), jnp.bfloat16, "multiple of 2·block_q = 128; got T=200"),
        (AttentionShape(1, 256, 200, 4, 4, 64), jnp.float16, "multiple of block_kv = 128; got S=200"),
        (AttentionShape(1, 256, 384, 4, 2, 128), jnp.float16, None),
    ],
)
def test_problem_checks_name_the_fix(shape, dtype, expected):
    reason = _problem_why_not(shape, dtype, MosaicConfig())
    assert reason is None if expected is None else expected in reason


def test_bad_input_raises_before_any_kernel():
    q, k, v = make_qkv(1, 256, 2, 64)  # float32
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        mosaic_flash_attention(q, k, v)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU answer")
def test_why_not_on_cpu_names_hopper():
    shape = AttentionShape(1, 1024, 1024, 4, 4, 128)
    assert "Hopper" in why_not(shape, jnp.bfloat16, False)
    assert "Hopper" in bundled_why_not(shape, jnp.float16, True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("t", "s", "n", "k"), [(1024, 1024, 4, 4), (256, 512, 8, 2)])
def test_lowers_to_one_mosaic_gpu_kernel(causal, t, s, n, k):
    """Traces the whole kernel (layouts, barriers, wgmma shapes) and lowers it for CUDA, without a GPU."""
    q = jax.ShapeDtypeStruct((2, t, n, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, s, k, 128), jnp.bfloat16)
    fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal))
    hlo = fn.trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()
    assert re.findall(r"custom_call @(mosaic_gpu\w*)", hlo) == ["mosaic_gpu_v2"]


@pytest.mark.parametrize("causal", [False, True])
def test_gradient_lowers_to_forward_and_two_backward_kernels(causal):
    """jax.grad goes through the custom VJP: the forward, the dQ and the dK/dV kernels, all Mosaic GPU (GQA, T < S)."""
    q = jax.ShapeDtypeStruct((1, 256, 8, 64), jnp.float16)
    kv = jax.ShapeDtypeStruct((1, 512, 2, 64), jnp.float16)

    def loss(q, k, v):
        return mosaic_flash_attention(q, k, v, is_causal=causal).astype(jnp.float32).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    hlo = grad.trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()
    assert re.findall(r"custom_call @(mosaic_gpu\w*)", hlo) == ["mosaic_gpu_v2"] * 3


def test_lowers_with_x64_enabled():
    """JAX_ENABLE_X64=1 (issue 13): loop indices stay int32 through the forward and backward kernels."""
    q = jax.ShapeDtypeStruct((1, 256, 4, 128), jnp.bfloat16)
    with jax.enable_x64(True):
        fn = jax.jit(jax.grad(lambda q: mosaic_flash_attention(q, q, q, is_causal=True).astype(jnp.float32).sum()))
        hlo = fn.trace(q).lower(lowering_platforms=("cuda",)).as_text()
    assert len(re.findall(r"custom_call @mosaic_gpu", hlo)) == 3


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [("block_kv", 0, "must be a positive integer"), ("bwd_stages", -1, "must be a positive integer"),
     ("bwd_block_q", 96, "must be a multiple of 64"), ("block_q", 2.0, "must be a positive integer")],
)  # fmt: skip
def test_config_refuses_bad_sizes(field, value, expected):
    with pytest.raises(ValueError, match=f"MosaicConfig.{field} {expected}"):
        MosaicConfig(**{field: value})


def _check(out, q, k, v, causal):
    out = np.asarray(out, np.float32)
    assert np.isfinite(out).all()
    rows = slice(0, 256)  # the float64 reference on the first 256 rows keeps the test quick
    ref = reference_attention(q[:, rows], k, v, is_causal=causal)
    np.testing.assert_allclose(out[:, rows], ref, atol=1e-2, rtol=1e-2)
    if causal:  # and the last rows, where the mask matters least
        last = slice(q.shape[1] - 128, q.shape[1])
        ref = reference_attention(q, k, v, is_causal=True)[:, last]
        np.testing.assert_allclose(out[:, last], ref, atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gpu_kernel_matches_reference(causal, head_dim, dtype):
    if reason := why_not(AttentionShape(1, 1024, 1024, 8, 8, head_dim), dtype, causal):
        pytest.skip(reason)
    for b, t, s, n, k in ((2, 1024, 1024, 8, 8), (1, 512, 1024, 8, 2), (1, 1024, 256, 4, 1)):
        q, kk, v = make_qkv(b, t, n, head_dim, seq_kv=s, kv_heads=k, dtype=dtype, seed=t + s)
        fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal))
        _check(fn(q, kk, v), q, kk, v, causal)
        assert any(name.startswith("mosaic_gpu") for name in kernels_used(fn, q, kk, v))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_jax_bundled_mosaic_matches_reference(causal):
    if reason := bundled_why_not(AttentionShape(1, 1024, 1024, 4, 4, 128), jnp.float16, causal):
        pytest.skip(reason)
    q, k, v = make_qkv(1, 1024, 4, 128, dtype=jnp.float16, seed=3)
    _check(jax_bundled_mosaic(q, k, v, is_causal=causal), q, k, v, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gpu_gradients_match_float64(causal, head_dim, dtype):
    if reason := why_not(AttentionShape(1, 512, 512, 4, 4, head_dim), dtype, causal):
        pytest.skip(reason)
    for b, t, s, n, k in ((1, 512, 512, 4, 4), (1, 256, 512, 8, 2), (2, 512, 256, 4, 1)):  # MHA, GQA T<S, MQA T>S
        q, kk, v = make_qkv(b, t, n, head_dim, seq_kv=s, kv_heads=k, dtype=dtype, seed=t + s)
        fn = functools.partial(mosaic_flash_attention, is_causal=causal)
        assert_grads_close(fn, q, kk, v, causal=causal, tol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_lse_matches_float64(causal):
    if reason := why_not(AttentionShape(1, 256, 512, 4, 2, 128), jnp.bfloat16, causal):
        pytest.skip(reason)
    q, k, v = make_qkv(1, 256, 4, 128, seq_kv=512, kv_heads=2, dtype=jnp.bfloat16, seed=5)
    out, lse = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, return_lse=True))(q, k, v)
    np.testing.assert_allclose(np.asarray(lse), reference_lse(q, k, is_causal=causal), atol=1e-2, rtol=1e-3)
    _check(out, q, k, v, causal)


@pytest.mark.gpu
def test_gpu_jax_bundled_mosaic_gradients_match_float64():
    if reason := bundled_why_not(AttentionShape(1, 512, 512, 4, 4, 64), jnp.float16, False):
        pytest.skip(reason)
    q, k, v = make_qkv(1, 512, 4, 64, kv_heads=2, dtype=jnp.float16, seed=9)
    assert_grads_close(jax_bundled_mosaic, q, k, v, causal=False, tol=3e-2)


def test_backward_alone_checks_its_inputs():
    q, k, v = make_qkv(1, 256, 2, 64, dtype=jnp.bfloat16)
    lse = jnp.zeros((1, 2, 256))
    with pytest.raises(ValueError, match=r"out and d_out must have q's shape \(1, 256, 2, 64\)"):
        mosaic_flash_backward(q, k, v, q[:, :128], lse, q)
    with pytest.raises(ValueError, match=r"lse \(B, N, T\) = \(1, 2, 256\)"):
        mosaic_flash_backward(q, k, v, q, lse[:, :1], q)
    with pytest.raises(ValueError, match="head_dim must be 64 or 128"):
        mosaic_flash_backward(*make_qkv(1, 256, 2, 32, dtype=jnp.bfloat16), q, lse, q)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_backward_alone_from_out_and_lse(causal):
    # what the context-parallel ring calls: the backward kernels from a given output and natural log-sum-exp
    if reason := why_not(AttentionShape(1, 512, 512, 4, 2, 128), jnp.bfloat16, causal):
        pytest.skip(reason)
    q, k, v = make_qkv(1, 512, 4, 128, kv_heads=2, dtype=jnp.bfloat16, seed=13)
    d_out = jax.random.normal(jax.random.key(5), q.shape, jnp.float32).astype(q.dtype)
    out, lse = mosaic_flash_attention(q, k, v, is_causal=causal, return_lse=True)
    got = jax.jit(functools.partial(mosaic_flash_backward, is_causal=causal))(q, k, v, out, lse, d_out)
    for name, g, want in zip(("dq", "dk", "dv"), got, reference_grads(q, k, v, d_out, is_causal=causal)):
        np.testing.assert_allclose(np.asarray(g, np.float64), want, atol=3e-2, rtol=3e-2, err_msg=name)
