"""2^x on the FMA units: its error against float64 over the softmax's range, its coefficients against a minimax fit
redone here, the column split, and (on a Hopper GPU) the same numbers from inside a Mosaic GPU kernel."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.kernels.mosaic._common import on_hopper
from attention_tutorial.kernels.mosaic.budget import Probe
from attention_tutorial.kernels.mosaic.exp2 import POLY, exp2_poly, exp2_split, softmax_exp2

TINY = 2.0**-126  # float32's smallest normal number


def rel_error(y, x):
    return np.abs(np.asarray(y, np.float64) / 2.0 ** np.asarray(x, np.float64) - 1)


def softmax_range():
    """x ≤ 0 as the softmax sees it: a dense sweep down to −125.5 and every 1/1024 near 0, float32."""
    return np.concatenate([np.linspace(-125.5, 0, 1_000_001), -np.arange(0, 8, 2.0**-10)]).astype(np.float32)


@pytest.mark.parametrize("jit", [False, True])
def test_relative_error_over_the_softmax_range_is_that_of_the_cubic(jit):
    """Jitted too: XLA must not fold x + 1.5·2^23 − 1.5·2^23 into x (the fraction would be 0, the error 41 %)."""
    x = softmax_range()
    err = rel_error((jax.jit(exp2_poly) if jit else exp2_poly)(x), x)
    assert 1.0e-4 < err.max() <= 1.02e-4  # the cubic's own error (minimax 1.013e-4), float32 rounding on top
    assert err.max() < 2.0**-9  # below bfloat16's rounding of p


def test_above_zero_up_to_127_as_well():
    x = np.linspace(0, 127, 100_001, dtype=np.float32)
    assert rel_error(jax.jit(exp2_poly)(x), x).max() <= 1.02e-4


def test_far_below_zero_it_is_zero_never_garbage():
    y = np.asarray(jax.jit(exp2_poly)(np.array([-np.inf, -1e30, -1000.0, -127.0], np.float32)))
    assert (y == 0).all() and not np.signbit(y).any()  # +0.0, as MUFU.EX2 flushes these
    between = np.linspace(-127, -125.5, 10_001, dtype=np.float32)  # where 2^x leaves float32's normal range
    y = np.asarray(jax.jit(exp2_poly)(between), np.float64)
    assert (y >= 0).all() and (y < 2 * TINY).all() and np.isfinite(y).all()
    assert exp2_poly(np.float32(0.0)) == 1.0  # the constant term is 1: 2^0 exactly
    assert np.isnan(exp2_poly(np.float32(np.nan)))


def test_the_coefficients_are_the_minimax_cubic_with_constant_one():
    """Redo the fit: minimise max |p(f) / 2^f − 1| over f in [−½, ½] for p(f) = 1 + c1 f + c2 f² + c3 f³ (linear in
    c, a linear program), and compare with the coefficients the kernel uses."""
    from scipy.optimize import linprog

    f = np.linspace(-0.5, 0.5, 20_001)
    a = np.stack([f, f**2, f**3], axis=1) / 2 ** f[:, None]  # p(f)/2^f − 1 = a·c − b
    b = 1 - 2**-f
    ones = np.ones((len(f), 1))
    fit = linprog(
        [0, 0, 0, 1],
        A_ub=np.block([[a, -ones], [-a, -ones]]),
        b_ub=np.concatenate([b, -b]),
        bounds=[(None, None)] * 4,
        method="highs",
    )
    assert fit.success
    np.testing.assert_allclose(POLY[1:], fit.x[:3], rtol=1e-6)
    assert POLY[0] == 1.0 and fit.x[3] == pytest.approx(1.013e-4, rel=1e-3)
    c1, c2, c3 = POLY[1:]  # rounded to float32, still the fit's error
    assert np.abs((1 + f * (c1 + f * (c2 + f * c3))) / 2**f - 1).max() == pytest.approx(fit.x[3], rel=1e-3)


def test_exp2_split_sends_the_first_columns_through_the_polynomial():
    x = jnp.asarray(np.random.default_rng(0).uniform(-30, 0, size=(64, 128)), jnp.float32)
    out = np.asarray(exp2_split(x, 32, concat=jnp.concatenate))
    np.testing.assert_array_equal(out[:, :32], np.asarray(exp2_poly(x[:, :32])))
    np.testing.assert_array_equal(out[:, 32:], np.asarray(jnp.exp2(x[:, 32:])))
    assert rel_error(out[:, :32], x[:, :32]).max() > 1e-5  # the cubic, not exp2
    np.testing.assert_array_equal(exp2_split(x, 0, concat=jnp.concatenate), jnp.exp2(x))
    np.testing.assert_array_equal(exp2_split(x, 128, concat=jnp.concatenate), exp2_poly(x))
    for bad in (12, -8, 136):
        with pytest.raises(ValueError, match=rf"poly_cols must be a multiple of 8 in \[0, 128\]; got {bad}"):
            exp2_split(x, bad)


def test_softmax_exp2_follows_the_probe():
    x = jnp.linspace(-20, 0, 64 * 128, dtype=jnp.float32).reshape(64, 128)
    rows, tile = softmax_exp2(Probe(), 128)
    assert rows is jnp.exp2 and tile is jnp.exp2
    rows, tile = softmax_exp2(Probe(no_exp=True), 128)
    assert rows(x) is x and tile(x) is x
    rows, tile = softmax_exp2(Probe(exp_poly=0.25), 128)
    assert rows is jnp.exp2 and tile.keywords == {"poly_cols": 32}
    rows, tile = softmax_exp2(Probe(exp_poly=0.5), 64)
    assert tile.keywords == {"poly_cols": 32}


def split_kernel(shape, poly_cols, low=-130.0):
    """A one-warpgroup Mosaic GPU kernel: x spread over [low, 0] in wgmma's layout (row 1 all −inf), exp2_split of
    it stored out; returns (the call, x as the kernel makes it)."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    step = np.float32(low / (shape[0] * shape[1]))

    def kernel(o_ref, o_smem):
        rows = plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=plgpu.Layout.WGMMA)
        cols = plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=plgpu.Layout.WGMMA)
        x = (rows * shape[1] + cols).astype(jnp.float32) * step
        o_smem[...] = exp2_split(jnp.where(rows == 1, -jnp.inf, x), poly_cols)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_ref)
        plgpu.wait_smem_to_gmem(0)

    call = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct(shape, jnp.float32),
        scratch_types=[plgpu.SMEM(shape, jnp.float32)],
        compiler_params=plgpu.CompilerParams(approx_math=True),
    )
    x = np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape) * step
    x[1] = -np.inf
    return call, x


@pytest.mark.parametrize("poly_cols", [32, 64, 128])
def test_exp2_split_lowers_inside_a_mosaic_gpu_kernel(poly_cols):
    call, _ = split_kernel((64, 128), poly_cols)
    hlo = jax.jit(call).trace().lower(lowering_platforms=("cuda",)).as_text()
    assert re.findall(r"custom_call @(mosaic_gpu\w*)", hlo) == ["mosaic_gpu_v2"]


@pytest.mark.gpu
@pytest.mark.parametrize("poly_cols", [32, 64])
def test_gpu_exp_poly_split_in_a_kernel_matches_float64_and_the_cpu(poly_cols):
    """Inside a kernel: the first columns are the cubic (its error, its bits as on the CPU up to FMA contraction),
    the rest MUFU.EX2's; 0 at and below −127 and for −inf."""
    if reason := on_hopper():
        pytest.skip(reason)
    call, x = split_kernel((64, 128), poly_cols)
    out = np.asarray(jax.jit(call)(), np.float64)
    poly, mufu = (slice(0, poly_cols), x[:, :poly_cols]), (slice(poly_cols, 128), x[:, poly_cols:])
    for (cols, xs), bound in ((poly, 1.02e-4), (mufu, 1e-5)):  # ex2.approx: a few last bits
        y = out[:, cols]
        normal = xs >= -125.5
        assert rel_error(y[normal], xs[normal]).max() <= bound
        assert (y[xs <= -127] == 0).all() and (y[~normal] < 2 * TINY).all() and (y >= 0).all()
    normal = x[:, :poly_cols] >= -125.5
    assert rel_error(out[:, :poly_cols][normal], x[:, :poly_cols][normal]).max() > 5e-5  # the cubic's error, not MUFU's
    cpu = np.asarray(jax.jit(exp2_poly)(x[:, :poly_cols]), np.float64)
    np.testing.assert_allclose(out[:, :poly_cols], cpu, rtol=5e-7, atol=2.0**-140)  # denormals: a few last bits
