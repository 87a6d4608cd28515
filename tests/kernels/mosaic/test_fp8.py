"""Our FP8 forward: quantisation and validation on the CPU, values against float64 (and cuDNN FP8's error) on Hopper."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape, make_qkv
from attention_tutorial.kernels.mosaic._common import LOG2E, on_hopper
from attention_tutorial.kernels.mosaic.budget import MosaicConfig, Probe
from attention_tutorial.kernels.mosaic.fp8 import (
    E4M3_MAX,
    logit_factors,
    mosaic_fp8_attention,
    operand_key_order,
    quantize_e4m3,
    why_not,
)
from attention_tutorial.kernels.reference import reference_attention


def test_quantize_maps_the_largest_magnitude_to_448_and_rounds_to_three_mantissa_bits():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 128)) * 3.0, jnp.bfloat16)
    x8, descale = quantize_e4m3(x)
    assert x8.dtype == jnp.float8_e4m3fn
    x64 = np.asarray(x, np.float64)
    back = np.asarray(x8, np.float64) * float(descale)
    assert float(descale) == pytest.approx(np.abs(x64).max() / 448.0, rel=1e-6)
    assert np.abs(np.asarray(x8, np.float64)).max() == 448.0
    normal = np.abs(x64) >= 2.0**-6 * float(descale)  # E4M3's smallest normal, in x's units
    # round to nearest with 3 mantissa bits: at most half a step, 2^-4 of the value
    assert np.all(np.abs(back - x64)[normal] <= 2.0**-4 * np.abs(x64)[normal] * (1 + 1e-6))


def test_logit_factors_fold_both_descales_and_the_softmax_scale():
    f = np.asarray(logit_factors(0.125, 0.5, 0.25, 3.0, 448.0))
    assert f.shape == (128,) and f.dtype == np.float32
    assert f[0] == pytest.approx(0.125 * LOG2E * 0.5 * 0.25) and f[1] == pytest.approx(3.0 / 448.0)
    assert not f[2:].any()


@pytest.mark.parametrize(
    ("shape", "kwargs", "match"),
    [
        ((1, 256, 2, 64), {}, "takes H = 128 .* got H=64"),
        ((1, 256, 2, 128), {"p_scale": 0.5}, r"p_scale must be a real number in \[1, 448\] .*got 0.5"),
        ((1, 256, 2, 128), {"p_scale": 1000.0}, r"p_scale must be a real number in \[1, 448\] .*got 1000.0"),
        ((1, 256, 2, 128), {"p_scale": True}, r"p_scale must be a real number .*got True"),
        ((1, 256, 2, 128), {"p_scale": float("nan")}, r"p_scale must be a real number .*got nan"),
        ((1, 256, 2, 128), {"scale": -0.1}, "positive softmax scale"),
        ((1, 256, 2, 128), {"config": MosaicConfig(block_kv=256)}, "need 224 registers per thread"),
        ((1, 256, 2, 128), {"config": MosaicConfig(block_q=128)}, "block_q=64"),
        ((1, 256, 2, 128), {"config": MosaicConfig(stages=8)}, "KiB of shared memory"),
        ((1, 256, 2, 128), {"is_causal": "yes"}, "is_causal must be True or False"),
        ((1, 256, 2, 128), {"p_via": "tmem"}, r"p_via must be one of \('smem', 'registers'\); got 'tmem'"),
        (
            (1, 256, 2, 128),
            {"config": MosaicConfig(block_kv=96)},
            "block_kv a multiple of 64 .* block_kv=96",
        ),
        ((1, 256, 2, 128), {"config": MosaicConfig(pipeline=True)}, "takes pipeline=False"),
    ],
)
def test_bad_input_names_the_fix(shape, kwargs, match):
    q = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    with pytest.raises(ValueError, match=match):
        jax.jit(functools.partial(mosaic_fp8_attention, **kwargs)).trace(q, q, q)


@pytest.mark.parametrize("p_via", ["smem", "registers"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_kv", [128, 192])
def test_lowers_to_one_mosaic_gpu_kernel_with_fp8_operands(causal, p_via, block_kv):
    """Mosaic GPU lowers the kernel on a CPU too: one custom call, after XLA's quantising (and transposing) ops;
    192 keys put vᵀ and p in 64-byte swizzled tiles."""
    q = jax.ShapeDtypeStruct((1, 500, 2, 128), jnp.bfloat16)
    cfg = MosaicConfig(block_kv=block_kv)
    fn = jax.jit(functools.partial(mosaic_fp8_attention, is_causal=causal, p_via=p_via, config=cfg))
    hlo = fn.trace(q, q, q).lower(lowering_platforms=("cuda",)).as_text()
    assert len(re.findall(r"custom_call @mosaic_gpu", hlo)) == 1
    assert "f8E4M3FN" in hlo and "transpose" in hlo


def test_operand_key_order_permutes_within_16_key_groups_as_the_two_layouts_share_them():
    """Thread t of a row holds scores 2t, 2t+1, 8+2t, 9+2t of each 16-key group in wgmma's 32-bit accumulator layout
    (pairs of columns, 8-column groups) and operand columns 4t … 4t+3 in the 8-bit layout (quads, 16-column groups):
    operand column 4t + i must carry key [2t, 2t+1, 8+2t, 9+2t][i]. Weights and values permuted alike leave p·v."""
    order = operand_key_order(64)
    assert sorted(order) == list(range(64)) and all((order // 16) == (np.arange(64) // 16))
    for t in range(4):  # each thread's four accumulator scores, in register order, are its four operand columns
        assert list(order[4 * t : 4 * t + 4]) == [2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t]
    rng = np.random.default_rng(0)
    p, v = rng.random((8, 64)), rng.normal(size=(64, 32))
    np.testing.assert_allclose(p[:, order] @ v[order], p @ v, rtol=1e-12)
    for bad in (40, 0, -16, True):
        with pytest.raises(ValueError, match="positive multiple of 16"):
            operand_key_order(bad)
    # the wrapper permutes v as a swap of two axes (XLA fuses it); the same order as the gather
    x = np.arange(3 * 64).reshape(3, 64)
    np.testing.assert_array_equal(x.reshape(3, 4, 2, 4, 2).swapaxes(-3, -2).reshape(x.shape), x[:, order])


def test_why_not_on_a_cpu_names_hopper():
    if jax.default_backend() == "gpu":
        pytest.skip("on a GPU it runs")
    assert "Hopper" in why_not(AttentionShape(1, 256, 256, 2, 2, 128), jnp.bfloat16, False)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("p_via", "registers", "block_kv"),
    [("smem", 232, 128), ("registers", 232, 128), ("registers", 240, 128), ("registers", 232, 192), ("smem", 232, 192)],
)
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_fp8_forward_is_as_accurate_as_cudnn_fp8(causal, p_via, registers, block_kv):
    """Relative error against float64 within FP8's reach, and no worse than 1.25× cuDNN FP8's on the same inputs."""
    if reason := on_hopper():
        pytest.skip(reason)
    from attention_tutorial.measure.fp8 import cudnn_fp8_attention, rel_error

    for b, t, s, n, k in ((2, 512, 1024, 8, 2), (1, 1024, 256, 4, 4)):  # GQA T<S, MHA T>S
        q, kk, v = make_qkv(b, t, n, 128, seq_kv=s, kv_heads=k, dtype=jnp.bfloat16, seed=t + s)
        cfg = MosaicConfig(registers=registers, block_kv=block_kv)
        out = jax.jit(functools.partial(mosaic_fp8_attention, is_causal=causal, p_via=p_via, config=cfg))(q, kk, v)
        assert out.dtype == jnp.bfloat16 and out.shape == q.shape
        want = reference_attention(q, kk, v, is_causal=causal)
        err = rel_error(out, want)
        assert err < 0.1, err
        if k == n:  # cuDNN's FP8 path, MHA only
            theirs = rel_error(
                jax.jit(functools.partial(cudnn_fp8_attention, is_causal=causal, scale_s=E4M3_MAX))(q, kk, v), want
            )
            assert err <= 1.25 * theirs, (err, theirs)


def test_the_kernels_arithmetic_with_these_factors_is_attention():
    """The FP8 kernel's arithmetic, step by step in NumPy (E4M3 casts included): base-2 logits from ``logit_factors``'s
    first factor, p·448 in E4M3, the output factor last. Against float64 attention on the unquantised inputs: a
    misplaced descale, a missing log2(e) or a wrong p scale moves the result far outside E4M3's few per cent."""
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.normal(size=(64, 128)) * s, jnp.bfloat16) for s in (1.0, 2.0, 0.5))
    (q8, dq), (k8, dk), (v8, dv) = quantize_e4m3(q), quantize_e4m3(k), quantize_e4m3(v)
    c, c_out = np.asarray(logit_factors(128**-0.5, dq, dk, dv, E4M3_MAX), np.float64)[:2]
    f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    t = f64(q8) @ f64(k8).T * c  # base-2 logits
    p = np.exp2(t - t.max(axis=1, keepdims=True))
    p8 = f64(jnp.asarray(p * E4M3_MAX, jnp.float32).astype(jnp.float8_e4m3fn))
    out = p8 @ f64(v8) * c_out / p.sum(axis=1, keepdims=True)
    want = np.asarray(reference_attention(q[None, :, None], k[None, :, None], v[None, :, None]), np.float64)[0, :, 0]
    err = np.linalg.norm(out - want) / np.linalg.norm(want)
    assert err < 0.08, err


def _element_positions(layout, shape):
    """{(thread, register index, vector element): (row, column)} of a Mosaic GPU tiled layout, computed from its own
    tiling (tile strides, warp and lane dimensions): an independent reading of where each element lives."""
    from jax.experimental.mosaic.gpu import fragmented_array as fa

    strides, tiled = layout.tiling.tile_strides((shape[1], 1)), layout.tiling.tile_shape(shape)
    nd = len(tiled)
    warp = [d % nd for d in layout.partitioned_warp_dims]
    lanes = [d % nd for d in layout.lane_dims if not isinstance(d, fa.Replicated)]
    vec = layout.vector_dim % nd
    sizes = [tiled[d] for d in lanes]
    lane_strides = np.cumprod([1, *sizes[::-1][:-1]])[::-1]
    out = {}
    for thread in range(128):
        base = [0] * nd
        base[warp[0]] = (thread // 32) % tiled[warp[0]]
        for d, s, n in zip(lanes, lane_strides, sizes):
            base[d] = (thread % 32 // s) % n
        for reg in np.ndindex(layout.registers_shape(shape)):
            for e in range(tiled[vec]):
                at = [a + b for a, b in zip(base, reg)]
                at[vec] = e
                out[(thread, reg, e)] = divmod(sum(i * s for i, s in zip(at, strides)), shape[1])
    return out


def test_the_register_regrouping_puts_each_score_where_operand_key_order_says():
    """p_via="registers", checked against Mosaic GPU's own layouts: every E4M3 element the 8-bit operand register
    takes from an accumulator register (in ``operand_register_pairs``' order, two scores from each) holds the score
    of the key that ``operand_key_order`` puts in that operand column, on the same row. A swapped order fails."""
    from jax.experimental.mosaic.gpu import fragmented_array as fa

    from attention_tutorial.kernels.mosaic.fp8 import operand_register_pairs

    shape = (64, 128)
    acc, operand = _element_positions(fa.WGMMA_LAYOUT, shape), _element_positions(fa.WGMMA_LAYOUT_8BIT, shape)
    assert len(set(acc.values())) == len(set(operand.values())) == 64 * 128  # each a layout of the whole tile
    order, pairs = operand_key_order(shape[1]), operand_register_pairs(shape)
    wrong = 0
    for (thread, reg, e), (row, col) in operand.items():
        src_row, src_col = acc[(thread, pairs[reg][e // 2], e % 2)]
        wrong += (src_row, src_col) != (row, order[col])
    assert wrong == 0


def test_no_exp_drops_the_fp8_forwards_exponentials_only():
    q = jax.ShapeDtypeStruct((1, 256, 2, 128), jnp.bfloat16)

    def ops(probe):
        text = str(jax.make_jaxpr(functools.partial(mosaic_fp8_attention, is_causal=True, probe=probe))(q, q, q))
        found = re.findall(r"^\s*(?:[\w:\[\],{}<> ]+ = )?(\w+)[\[ ]", text, re.M)
        return {op: found.count(op) for op in ("exp2", "log", "wgmma_ref", "barrier_wait")}

    as_is, no_exp = ops(Probe()), ops(Probe(no_exp=True))
    assert as_is["exp2"] >= 2 and no_exp == {**as_is, "exp2": 0}


@pytest.mark.parametrize("p_via", ["smem", "registers"])
@pytest.mark.parametrize("causal", [False, True])
def test_exp_poly_fp8_forward_lowers_to_one_mosaic_gpu_kernel(causal, p_via):
    q = jax.ShapeDtypeStruct((1, 256, 2, 128), jnp.bfloat16)
    fn = jax.jit(functools.partial(mosaic_fp8_attention, is_causal=causal, p_via=p_via, probe=Probe(exp_poly=0.25)))
    hlo = fn.trace(q, q, q).lower(lowering_platforms=("cuda",)).as_text()
    assert re.findall(r"custom_call @(mosaic_gpu\w*)", hlo) == ["mosaic_gpu_v2"]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_exp_poly_fp8_forward_keeps_its_accuracy(causal):
    """A quarter of p's exponentials by the cubic: the error against float64 within 2 % of the kernel's without it
    (E4M3's rounding of p, 2^-4, dwarfs the cubic's 1e-4)."""
    if reason := on_hopper():
        pytest.skip(reason)
    from attention_tutorial.measure.fp8 import rel_error

    q, kk, v = make_qkv(2, 512, 8, 128, seq_kv=1024, kv_heads=2, dtype=jnp.bfloat16, seed=7)
    want = reference_attention(q, kk, v, is_causal=causal)
    err = {
        f: rel_error(
            jax.jit(functools.partial(mosaic_fp8_attention, is_causal=causal, probe=Probe(exp_poly=f)))(q, kk, v), want
        )
        for f in (0.0, 0.25)
    }
    assert err[0.25] < 0.1 and err[0.25] <= 1.02 * err[0.0], err
