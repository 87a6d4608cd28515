"""The backward kernels: the gradient lowers to the forward and two backward kernels on a CPU (at H = 256 those that
split the head dim), and matches float64 gradients on a Hopper GPU (through jax.grad and called alone, as the
context-parallel ring does)."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import pytest

from attention_tutorial.inputs import AttentionShape, make_qkv
from attention_tutorial.kernels.mosaic.attention import mosaic_flash_attention, mosaic_flash_backward, why_not
from attention_tutorial.kernels.mosaic.budget import MosaicConfig
from tests.kernels.test_pallas_flash import assert_grads_close, assert_grads_match

H256 = MosaicConfig(block_kv=64)


@pytest.mark.parametrize("causal", [False, True])
def test_gradient_lowers_to_forward_and_two_backward_kernels(causal):
    """jax.grad goes through the custom VJP: the forward, the dQ and the dK/dV kernels, all Mosaic GPU (GQA, T < S)."""
    q = jax.ShapeDtypeStruct((1, 256, 8, 64), jnp.float16)
    kv = jax.ShapeDtypeStruct((1, 512, 2, 64), jnp.float16)
    cfg = MosaicConfig(bwd_dq="pass")

    def loss(q, k, v):
        return mosaic_flash_attention(q, k, v, is_causal=causal, config=cfg).astype(jnp.float32).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    hlo = grad.trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()
    assert re.findall(r"custom_call @(mosaic_gpu\w*)", hlo) == ["mosaic_gpu_v2"] * 3


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("dq", "head_dim"), [("atomic", 64), ("atomic", 128)])
def test_dq_by_atomics_lowers_to_one_backward_kernel_adding_into_float32(causal, dq, head_dim):
    """dQ by atomics: the dK/dV kernel adds dQ into a float32 array aliased in and out; no dQ kernel (GQA, T < S)."""
    q = jax.ShapeDtypeStruct((1, 256, 8, head_dim), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 512, 2, head_dim), jnp.bfloat16)
    cfg = MosaicConfig(bwd_dq=dq)

    def loss(q, k, v):
        return mosaic_flash_attention(q, k, v, is_causal=causal, config=cfg).astype(jnp.float32).sum()

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in hlo.splitlines() if "custom_call @mosaic_gpu" in line]
    assert len(calls) == 2  # the forward, then dK/dV with dQ
    assert "reduction_op" not in calls[0] and calls[1].count("output_operand_alias<") == 3
    assert (
        f"-> (tensor<1x256x8x{head_dim}xf32>, tensor<1x512x2x{head_dim}xbf16>, tensor<1x512x2x{head_dim}xbf16>)"
        in calls[1]
    )


def test_the_atomic_dq_kernel_keeps_the_default_tiles_and_takes_the_atomic_backward():
    from attention_tutorial.kernels.mosaic.attention import mosaic_atomic_dq_attention

    q = jax.ShapeDtypeStruct((1, 256, 4, 128), jnp.bfloat16)
    grad = jax.jit(jax.grad(lambda q: mosaic_atomic_dq_attention(q, q, q).astype(jnp.float32).sum()))
    hlo = grad.trace(q).lower(lowering_platforms=("cuda",)).as_text()
    assert len(re.findall(r"custom_call @mosaic_gpu", hlo)) == 2  # the forward, then dK/dV adding dQ


def test_lowers_with_x64_enabled():
    """JAX_ENABLE_X64=1: loop indices stay int32 through the forward and backward kernels."""
    q = jax.ShapeDtypeStruct((1, 256, 4, 128), jnp.bfloat16)
    with jax.enable_x64(True):
        fn = jax.jit(jax.grad(lambda q: mosaic_flash_attention(q, q, q, is_causal=True).astype(jnp.float32).sum()))
        hlo = fn.trace(q).lower(lowering_platforms=("cuda",)).as_text()
    assert len(re.findall(r"custom_call @mosaic_gpu", hlo)) == 3


@pytest.mark.gpu
@pytest.mark.parametrize("dq", ["pass", "atomic", "split"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gpu_gradients_match_float64(causal, head_dim, dtype, dq):
    if reason := why_not(AttentionShape(1, 512, 512, 4, 4, head_dim), dtype, causal):
        pytest.skip(reason)
    if dq == "split" and head_dim != 128:
        pytest.skip("dQ split takes H = 128")
    cfg = MosaicConfig(bwd_dq=dq)
    for b, t, s, n, k in ((1, 512, 512, 4, 4), (1, 256, 512, 8, 2), (2, 512, 256, 4, 1)):  # MHA, GQA T<S, MQA T>S
        q, kk, v = make_qkv(b, t, n, head_dim, seq_kv=s, kv_heads=k, dtype=dtype, seed=t + s)
        fn = functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg)
        assert_grads_close(fn, q, kk, v, causal=causal, tol=3e-2)


@pytest.mark.parametrize("dq", ["pass", "atomic"])
def test_s_and_dp_together_lower_on_a_cpu(dq):
    """bwd_together: both score-sized products issued before the first is read (a wgmma wait of 1 in the kernels)."""
    q = jax.ShapeDtypeStruct((1, 256, 4, 128), jnp.bfloat16)
    cfg = MosaicConfig(bwd_dq=dq, bwd_together=True)
    fn = jax.grad(lambda q: mosaic_flash_attention(q, q, q, is_causal=True, config=cfg).astype(jnp.float32).sum())
    hlo = jax.jit(fn).trace(q).lower(lowering_platforms=("cuda",)).as_text()
    assert len(re.findall(r"custom_call @mosaic_gpu", hlo)) == (3 if dq == "pass" else 2)


@pytest.mark.gpu
@pytest.mark.parametrize("dq", ["pass", "atomic", "split"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_gradients_with_s_and_dp_together_match_float64(causal, head_dim, dq):
    """bwd_together (with the query blocks heaviest first), at whole tiles and at a ragged T (the last tiles
    masked in the kernel), GQA."""
    if reason := why_not(AttentionShape(1, 512, 512, 4, 4, head_dim), jnp.bfloat16, causal):
        pytest.skip(reason)
    if dq == "split" and head_dim != 128:
        pytest.skip("dQ split takes H = 128")
    cfg = MosaicConfig(bwd_dq=dq, bwd_together=True, heavy_first=causal)
    for b, t, s, n, k in ((1, 512, 512, 4, 4), (1, 500, 500, 8, 2)):
        q, kk, v = make_qkv(b, t, n, head_dim, seq_kv=s, kv_heads=k, dtype=jnp.bfloat16, seed=t + s)
        fn = functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg)
        assert_grads_close(fn, q, kk, v, causal=causal, tol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("dq", "head_dim"), [("pass", 128), ("atomic", 64)])
def test_gpu_gradients_with_240_registers_match_float64(causal, dq, head_dim):
    """The backward kernels' compute warpgroups at 240 registers, the copy warpgroup at 24."""
    if reason := why_not(AttentionShape(1, 512, 512, 4, 4, head_dim), jnp.bfloat16, causal):
        pytest.skip(reason)
    cfg = MosaicConfig(bwd_dq=dq, bwd_registers=240)
    for b, t, s, n, k in ((1, 512, 512, 4, 4), (1, 256, 512, 8, 2)):  # MHA, GQA T<S
        q, kk, v = make_qkv(b, t, n, head_dim, seq_kv=s, kv_heads=k, dtype=jnp.bfloat16, seed=t + s)
        fn = functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg)
        assert_grads_close(fn, q, kk, v, causal=causal, tol=3e-2)


def test_backward_alone_checks_its_inputs():
    q, k, v = make_qkv(1, 256, 2, 64, dtype=jnp.bfloat16)
    lse = jnp.zeros((1, 2, 256))
    with pytest.raises(ValueError, match=r"out and d_out must have q's shape \(1, 256, 2, 64\)"):
        mosaic_flash_backward(q, k, v, q[:, :128], lse, q)
    with pytest.raises(ValueError, match=r"lse \(B, N, T\) = \(1, 2, 256\)"):
        mosaic_flash_backward(q, k, v, q, lse[:, :1], q)
    with pytest.raises(ValueError, match="head_dim must be at most 256; got 320"):
        mosaic_flash_backward(*make_qkv(1, 256, 2, 320, dtype=jnp.bfloat16), q, lse, q)


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
    assert_grads_match(got, q, k, v, d_out, causal=causal, tol=3e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_h256_gradient_lowers_to_the_kernels_that_split_the_head_dim(causal):
    """Above H = 128 (192 runs padded to 256) the gradient takes the dQ and dK/dV kernels of backward_split, whose
    warpgroups each hold half the head dim (GQA, T < S, ragged T)."""
    q = jax.ShapeDtypeStruct((1, 320, 8, 192), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 512, 2, 192), jnp.bfloat16)

    def loss(q, k, v):
        return mosaic_flash_attention(q, k, v, is_causal=causal, config=H256).astype(jnp.float32).sum()

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in hlo.splitlines() if "custom_call @mosaic_gpu" in line]
    assert len(calls) == 3  # the forward, dQ, dK/dV
    assert "-> tensor<1x320x8x256xbf16>" in calls[1]
    assert "-> (tensor<1x512x2x256xbf16>, tensor<1x512x2x256xbf16>)" in calls[2]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("together", [False, True])
def test_dq_split_lowers_at_h128_to_one_backward_kernel_adding_halves(causal, together):
    """dQ split: the dK/dV kernel alone after the forward; refused at H = 64, naming the field."""
    q = jax.ShapeDtypeStruct((1, 320, 8, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 512, 2, 128), jnp.bfloat16)
    cfg = MosaicConfig(bwd_dq="split", bwd_together=together)

    def loss(q, k, v, cfg=cfg):
        return mosaic_flash_attention(q, k, v, is_causal=causal, config=cfg).astype(jnp.float32).sum()

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()
    assert len(re.findall(r"custom_call @mosaic_gpu", hlo)) == 2
    small = jax.ShapeDtypeStruct((1, 320, 8, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"bwd_dq='split' takes H = 128 .* got H=64"):
        jax.jit(jax.grad(loss)).trace(small, small, small)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bwd_dq": "atomic"}, r"at H=256 the backward makes dQ in a pass .* got 'atomic'"),
        ({"bwd_block_kv": 128}, r"at H=256 the backward takes bwd_block_q = bwd_block_kv = 64 .* bwd_block_kv=128"),
    ],
)
def test_an_h256_backward_config_it_cannot_run_is_refused_naming_the_field(changes, message):
    q = jax.ShapeDtypeStruct((1, 256, 2, 256), jnp.bfloat16)
    cfg = dataclasses.replace(H256, **changes)

    def loss(q):
        return mosaic_flash_attention(q, q, q, config=cfg).astype(jnp.float32).sum()

    with pytest.raises(ValueError, match=message):
        jax.jit(jax.grad(loss)).trace(q)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_h256_gradients_match_float64(causal):
    """The head-dim-split backward: MHA, GQA with T < S, ragged T and S (the last tiles masked in the kernel), and
    the query blocks heaviest first."""
    if reason := why_not(AttentionShape(1, 512, 512, 4, 4, 256), jnp.bfloat16, causal):
        pytest.skip(reason)
    for cfg in (H256, dataclasses.replace(H256, heavy_first=True)):
        for b, t, s, n, k in ((1, 512, 512, 4, 4), (1, 256, 512, 8, 2), (2, 500, 436, 4, 1)):
            q, kk, v = make_qkv(b, t, n, 256, seq_kv=s, kv_heads=k, dtype=jnp.bfloat16, seed=t + s)
            fn = functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg)
            assert_grads_close(fn, q, kk, v, causal=causal, tol=3e-2)
