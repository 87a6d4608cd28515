"""Our Mosaic GPU kernel: validation and lowering on the CPU, values against float64 on a Hopper GPU."""

import functools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape, make_qkv
from attention_tutorial.kernels.mosaic_flash import (
    MosaicConfig,
    _on_hopper,
    _problem_why_not,
    bundled_why_not,
    default_config,
    jax_bundled_mosaic,
    mosaic_flash_attention,
    mosaic_flash_backward,
    mosaic_pipelined_attention,
    smem_bytes,
    tile_registers,
    why_not,
)
from attention_tutorial.kernels.reference import reference_attention
from attention_tutorial.measure.compiled import kernels_used
from tests.kernels.test_pallas_flash import (  # float64 NumPy gradients, shared with its tests
    assert_grads_close,
    assert_grads_match,
    reference_lse,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("shape", "dtype", "expected"),
    [
        (AttentionShape(1, 256, 256, 4, 4, 128), jnp.float32, "bfloat16 or float16"),
        (AttentionShape(1, 256, 256, 4, 4, 96), jnp.bfloat16, "head_dim must be 64, 128 or 256; got 96"),
        (AttentionShape(1, 256, 256, 4, 4, 256), jnp.bfloat16, "320.5 KiB of shared memory"),
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
    with pytest.raises(ValueError, match="head_dim must be 64, 128 or 256"):
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
    assert_grads_match(got, q, k, v, d_out, causal=causal, tol=3e-2)


# Issue 17: FlashAttention-3's intra-warpgroup pipelining (MosaicConfig(pipeline=True)) and H = 256 in the forward.
H256 = MosaicConfig(block_kv=64)  # the default's block_kv=128 does not fit H = 256's tiles in shared memory
CONFIGS = [(64, MosaicConfig(pipeline=True)), (128, MosaicConfig(pipeline=True)), (256, H256),
           (256, MosaicConfig(block_kv=64, pipeline=True))]  # fmt: skip


def test_budgets_by_hand():
    # q/out 2·64×256, k and v (2) × 2 stages × 64 × 256, 2 bytes each, plus 2·64 float32 lse rows: 192.5 KiB
    assert smem_bytes(H256, 256, jnp.bfloat16) == (2 * 64 * 256 + 2 * 2 * 64 * 256) * 2 + 512 == 197120
    assert smem_bytes(MosaicConfig(), 128, jnp.float16) == (128 * 128 + 4 * 128 * 128) * 2 + 512  # 160.5 KiB
    # per thread of 128: acc 64·H/128 float32, s 64·block_kv/128 float32, p 64·block_kv/256 (two 16-bit per register)
    assert tile_registers(H256, 256) == 128 + 32 + 16
    assert tile_registers(MosaicConfig(block_kv=64, pipeline=True), 256) == 128 + 32 + 2 * 16
    assert tile_registers(MosaicConfig(pipeline=True), 128) == 64 + 64 + 2 * 32


@pytest.mark.parametrize(
    ("head_dim", "cfg", "expected"),
    [
        (256, H256, None),
        (256, MosaicConfig(block_kv=64, pipeline=True), None),
        (128, MosaicConfig(pipeline=True), None),
        (128, MosaicConfig(stages=3), None),  # 224.5 KiB: still fits (it ran on the H200)
        (128, MosaicConfig(stages=3, pipeline=True), "224.5 KiB of shared memory, more than the 223 KiB"),
        (256, MosaicConfig(block_kv=64, stages=3), "256.5 KiB of shared memory"),
        (128, MosaicConfig(stages=4), "288.5 KiB of shared memory, more than the 227 KiB a Hopper CTA leaves"),
        (256, MosaicConfig(block_kv=128, stages=1), "need 224 registers per thread"),
        (128, MosaicConfig(block_kv=256, stages=1, pipeline=True), "with pipeline=True the forward's tiles need 320"),
    ],
)  # fmt: skip
def test_h256_and_pipeline_budgets_name_the_fix(head_dim, cfg, expected):
    reason = _problem_why_not(AttentionShape(1, 512, 512, 4, 4, head_dim), jnp.bfloat16, cfg)
    assert reason is None if expected is None else (expected in reason and "block_kv=64" in reason)


@pytest.mark.parametrize("scale", [0.0, -0.125])
def test_a_scale_that_is_not_positive_is_refused(scale):
    """The kernels take the running maximum of the raw scores times the scale: only right for a positive scale."""
    q = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match=f"positive softmax scale; got {scale}. For a negative one, negate q"):
        jax.jit(functools.partial(mosaic_flash_attention, scale=scale)).trace(q, q, q)


@pytest.mark.parametrize("bad", [0, -64, True, 128.0])
def test_default_config_refuses_a_head_dim_that_is_not_a_positive_int(bad):
    with pytest.raises(ValueError, match="head_dim must be a positive int"):
        default_config(bad)


def test_default_config_takes_block_kv_64_at_h256():
    """Without a config, H = 256 gets block_kv = 64 (plain and pipelined); an explicit 128 is refused, naming it."""
    shape = AttentionShape(1, 1024, 1024, 4, 4, 256)
    assert default_config(128) == MosaicConfig() and default_config(64) == MosaicConfig()
    assert default_config(256) == H256 and default_config(256, pipeline=True) == MosaicConfig(
        block_kv=64, pipeline=True
    )
    assert _problem_why_not(shape, jnp.bfloat16, default_config(256)) is None
    assert _problem_why_not(shape, jnp.bfloat16, default_config(256, pipeline=True)) is None
    reason = _problem_why_not(shape, jnp.bfloat16, MosaicConfig())
    assert "config=MosaicConfig(block_kv=64, stages=2)" in reason
    q = jax.ShapeDtypeStruct((1, 256, 2, 256), jnp.bfloat16)
    jax.jit(mosaic_flash_attention).trace(q, q, q)  # traces with the default tiles
    with pytest.raises(ValueError, match=r"mosaic_flash_attention: at H=256, block_kv=128 and stages=2"):
        jax.jit(functools.partial(mosaic_flash_attention, config=MosaicConfig())).trace(q, q, q)


def test_pipelined_entry_point_uses_the_pipelined_default():
    q = jax.ShapeDtypeStruct((1, 256, 2, 128), jnp.bfloat16)
    text = str(jax.make_jaxpr(mosaic_pipelined_attention)(q, q, q))
    assert text.count("wait_n=1") == 1  # the overlapped loop exists only in the pipelined forward
    with pytest.raises(ValueError, match="q must have rank 4"):
        mosaic_pipelined_attention(jnp.ones((2, 3, 4)), jnp.ones((2, 3, 4)), jnp.ones((2, 3, 4)))


def test_h256_backward_is_refused():
    q = jax.ShapeDtypeStruct((1, 256, 2, 256), jnp.bfloat16)

    def loss(q):
        return mosaic_flash_attention(q, q, q, config=H256).astype(jnp.float32).sum()

    with pytest.raises(ValueError, match=r"backward kernels take H = 64 or 128; got H=256"):
        jax.jit(jax.grad(loss)).trace(q)


def test_pipeline_flag_must_be_bool():
    with pytest.raises(ValueError, match=r"MosaicConfig\.pipeline must be True or False; got 'yes'"):
        MosaicConfig(pipeline="yes")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("head_dim", "cfg"), [(64, MosaicConfig()), (128, MosaicConfig()), *CONFIGS])
def test_configs_lower_to_one_mosaic_gpu_kernel(causal, head_dim, cfg):
    """Pipeline off/on × causal × H = 64, 128, 256: GQA, T < S."""
    q = jax.ShapeDtypeStruct((2, 256, 8, head_dim), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 512, 2, head_dim), jnp.bfloat16)
    fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg))
    hlo = fn.trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()
    assert re.findall(r"custom_call @(mosaic_gpu\w*)", hlo) == ["mosaic_gpu_v2"]


@pytest.mark.parametrize(("head_dim", "cfg"), CONFIGS)
def test_configs_lower_with_x64_enabled(head_dim, cfg):
    q = jax.ShapeDtypeStruct((1, 256, 4, head_dim), jnp.bfloat16)
    with jax.enable_x64(True):
        fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=True, config=cfg))
        hlo = fn.trace(q, q, q).lower(lowering_platforms=("cuda",)).as_text()
    assert len(re.findall(r"custom_call @mosaic_gpu", hlo)) == 1


def _kernel_jaxpr(cfg, causal):
    q = jax.ShapeDtypeStruct((1, 256, 2, 128), jnp.bfloat16)
    return str(jax.make_jaxpr(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg))(q, q, q))


@pytest.mark.parametrize("causal", [False, True])
def test_pipelined_softmax_runs_between_the_two_waits(causal):
    """Pipelined: each loop step waits for q·kᵀ alone (wait_n=1), computes the softmax (exp2), and only then waits
    for p·v (wait_n=0); the default kernel never waits with a matmul still in flight."""
    assert "wait_n=1" not in _kernel_jaxpr(MosaicConfig(), causal)
    text = _kernel_jaxpr(MosaicConfig(pipeline=True), causal)
    loops = text.split("wait_n=1")[1:]
    assert len(loops) == (2 if causal else 1)  # causal: the unmasked and the masked loop
    for after in loops:
        between = after.split("wait_n=0")[0]
        assert "exp2" in between and "wgmma_ref" not in between


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("head_dim", "cfg"), CONFIGS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gpu_pipelined_and_h256_match_reference(causal, head_dim, cfg, dtype):
    if reason := _on_hopper():
        pytest.skip(reason)
    for b, t, s, n, k in ((2, 512, 1024, 8, 2), (1, 1024, 256, 4, 1)):  # GQA T<S (8 key blocks of 64), MQA T>S
        assert _problem_why_not(AttentionShape(b, t, s, n, k, head_dim), dtype, cfg) is None
        q, kk, v = make_qkv(b, t, n, head_dim, seq_kv=s, kv_heads=k, dtype=dtype, seed=t + s + head_dim)
        fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg, return_lse=True))
        out, lse = fn(q, kk, v)
        _check(out, q, kk, v, causal)
        want = reference_lse(q[:, :256], kk, is_causal=causal)  # the first rows, as _check does (top-left mask)
        np.testing.assert_allclose(np.asarray(lse)[..., :256], want, atol=1e-2, rtol=1e-3)
    assert any(name.startswith("mosaic_gpu") for name in kernels_used(fn, q, kk, v))


def test_pipelined_causal_emits_the_early_end_loop_only_where_warpgroups_can_end_apart():
    """With block_kv a multiple of 2·block_q both compute warpgroups end on the same key block: the loop that lets
    warpgroup 0 keep taking turns after its last block is left out (one less loop of barrier traffic for ptxas);
    with block_kv = 64 it is needed and emitted."""
    loops = {bkv: _kernel_jaxpr(MosaicConfig(block_kv=bkv, pipeline=True), True).count("while[") for bkv in (64, 128)}
    assert loops[64] == loops[128] + 1


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("head_dim", "cfg"), CONFIGS)
def test_pipelined_and_h256_lower_to_one_mosaic_gpu_kernel(causal, head_dim, cfg):
    """The pipelined loops (static trip counts, lax.cond inside, when causal) trace and lower for CUDA on a CPU."""
    q = jax.ShapeDtypeStruct((1, 1024, 2, head_dim), jnp.bfloat16)
    fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg))
    hlo = fn.trace(q, q, q).lower(lowering_platforms=("cuda",)).as_text()
    assert re.findall(r"custom_call @(mosaic_gpu\w*)", hlo) == ["mosaic_gpu_v2"]


@pytest.mark.parametrize(("lo", "hi", "most"), [(0, 0, 3), (0, 3, 3), (2, 5, 7), (4, 2, 5), (1, 6, 5)])
def test_static_trip_loop_runs_exactly_the_steps_from_lo_to_hi(lo, hi, most):
    from attention_tutorial.kernels.mosaic_flash import _static_trip_loop

    def body(j, carry):  # records which j ran, in order: an order-sensitive sum of the steps
        total, count = carry
        return total * 10 + (j + 1), count + 1

    @jax.jit
    def run(lo, hi):
        return _static_trip_loop(lo, hi, most, body, (jnp.int32(0), jnp.int32(0)))

    expected = (0, 0)
    for j in range(lo, hi):
        expected = (expected[0] * 10 + j + 1, expected[1] + 1)
    assert tuple(int(x) for x in run(jnp.int32(lo), jnp.int32(hi))) == expected


@pytest.mark.parametrize("block_q", [64, 128])
@pytest.mark.parametrize("block_kv", [64, 128, 192, 256])
@pytest.mark.parametrize("t_over_s", [0.5, 1, 2])
def test_pipelined_causal_bounds_fit_the_static_loops_and_mask_every_block_that_needs_it(block_q, block_kv, t_over_s):
    """For every warpgroup (rows row0 .. row0 + block_q - 1, top-left causal, T != S too): the key blocks it sees,
    counted from the mask itself, are what the kernel's step count says, and are made by the prologue (block 0) and
    the two loops, once each; the unmasked loop makes only blocks with no masked key; neither loop needs more steps
    than its static trip count."""
    from attention_tutorial.kernels.mosaic_flash import causal_steps, most_masked_steps, pipelined_causal_bounds

    for n_kv in range(1, 20):
        seq_kv = n_kv * block_kv
        seq_q = int(seq_kv * t_over_s) // block_q * block_q
        for row0 in range(0, seq_q, block_q):
            # from the mask (row r attends to key k <= r): block b is seen if its first key is at or below the last
            # row, and needs the mask if its last key lies beyond the first row
            seen = [b for b in range(n_kv) if b * block_kv <= row0 + block_q - 1]
            needs_mask = {b for b in seen if (b + 1) * block_kv - 1 > row0}
            steps = int(causal_steps(row0, block_q, block_kv, n_kv))
            assert steps == len(seen) and seen == list(range(steps))
            split, last = (int(x) for x in pipelined_causal_bounds(jnp.int32(row0), jnp.int32(steps), block_kv))
            unmasked = {j + 1 for j in range(split)}  # step j makes block j + 1
            masked = {j + 1 for j in range(split, last)}
            assert unmasked.isdisjoint(masked) and {0} | unmasked | masked == set(seen)  # each seen block once
            assert not unmasked & needs_mask  # block 0 and the masked loop's blocks carry the mask
            assert split <= n_kv - 1 and last - split <= most_masked_steps(block_q, block_kv, n_kv)


def test_the_flash_page_h256_budget_claims_hold():
    """The flash page: with H = 128's key block, H = 256's tiles overflow shared memory at two stages and the tile
    registers at any number of stages; the pipelined tiles fill the tile registers at H = 256 as at H = 128."""
    from attention_tutorial.kernels.mosaic_flash import SMEM_BYTES, TILE_REGISTERS

    text = " ".join((ROOT / "docs" / "flash_from_scratch.md").read_text().split())
    assert "the tiles overflow shared memory at two stages, and the registers set aside for tiles at any number" in text
    wide = MosaicConfig()  # H = 128's tiles
    assert wide.stages == 2 and smem_bytes(wide, 256, jnp.bfloat16) > SMEM_BYTES
    assert tile_registers(wide, 256) > TILE_REGISTERS
    # "at any number of stages": the stages are buffers in shared memory, so the tiles' registers do not change
    assert len({tile_registers(MosaicConfig(stages=stages), 256) for stages in (1, 2, 3)}) == 1
    assert smem_bytes(MosaicConfig(stages=1), 256, jnp.bfloat16) <= SMEM_BYTES  # one stage would fit in memory
    assert 2 * default_config(256).block_kv == wide.block_kv == default_config(128).block_kv
    assert "but so they do at H = 128, so a full budget alone does not set H = 256 apart" in text
    full = (default_config(256, pipeline=True), 256), (default_config(128, pipeline=True), 128)
    assert [tile_registers(cfg, H) for cfg, H in full] == [TILE_REGISTERS] * 2
    assert "gets 232 registers (`set_max_registers` in the kernel), of which the kernel sets 192 aside" in text
    assert TILE_REGISTERS == 192 and SMEM_BYTES == 227 * 1024


def test_jax_pipeline_emitter_forward_refuses_causal_as_the_flash_page_says():
    # The flash page gives this as one reason the pipelining is written by hand, not with
    # plgpu.emit_pipeline_warp_specialized: when JAX's emitter-based forward takes causal masks, the page must change.
    attention_mgpu = pytest.importorskip("jax.experimental.pallas.ops.gpu.attention_mgpu")
    assert "does not take causal masks" in " ".join((ROOT / "docs" / "flash_from_scratch.md").read_text().split())
    q = jnp.zeros((1, 256, 2, 64), jnp.float16)
    config = attention_mgpu.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, causal=True)
    with pytest.raises(NotImplementedError, match=r"[Cc]ausal"):
        attention_mgpu.attention_with_pipeline_emitter(q, q, q, config)
