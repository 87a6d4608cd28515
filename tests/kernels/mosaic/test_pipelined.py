"""The pipelined forward: each step's softmax between its two waits, static trip counts whose bounds fit the causal
mask, and values against float64 on a Hopper GPU."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape, make_qkv
from attention_tutorial.kernels.mosaic import masks
from attention_tutorial.kernels.mosaic._common import on_hopper
from attention_tutorial.kernels.mosaic.attention import mosaic_flash_attention
from attention_tutorial.kernels.mosaic.budget import MosaicConfig, problem
from attention_tutorial.kernels.mosaic.pipelined import most_masked_steps, pipelined_causal_bounds, static_trip_loop
from attention_tutorial.measure.compiled import kernels_used
from tests.kernels.mosaic.test_budget import CONFIGS
from tests.kernels.mosaic.test_forward import check_output
from tests.kernels.test_pallas_flash import reference_lse


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
    def body(j, carry):  # records which j ran, in order: an order-sensitive sum of the steps
        total, count = carry
        return total * 10 + (j + 1), count + 1

    @jax.jit
    def run(lo, hi):
        return static_trip_loop(lo, hi, most, body, (jnp.int32(0), jnp.int32(0)))

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
    for n_kv in range(1, 20):
        seq_kv = n_kv * block_kv
        seq_q = int(seq_kv * t_over_s) // block_q * block_q
        for row0 in range(0, seq_q, block_q):
            # from the mask (row r attends to key k <= r): block b is seen if its first key is at or below the last
            # row, and needs the mask if its last key lies beyond the first row
            seen = [b for b in range(n_kv) if b * block_kv <= row0 + block_q - 1]
            needs_mask = {b for b in seen if (b + 1) * block_kv - 1 > row0}
            steps = int(masks.band_steps(masks.Mask(seq_q, seq_kv, right=0), row0, block_q, block_kv).hi)
            assert steps == len(seen) and seen == list(range(steps))
            split, last = (int(x) for x in pipelined_causal_bounds(jnp.int32(row0), jnp.int32(steps), block_kv))
            unmasked = {j + 1 for j in range(split)}  # step j makes block j + 1
            masked = {j + 1 for j in range(split, last)}
            assert unmasked.isdisjoint(masked) and {0} | unmasked | masked == set(seen)  # each seen block once
            assert not unmasked & needs_mask  # block 0 and the masked loop's blocks carry the mask
            assert split <= n_kv - 1 and last - split <= most_masked_steps(block_q, block_kv, n_kv)


def check_against_reference(head_dim, cfg, dtype, causal):
    if reason := on_hopper():
        pytest.skip(reason)
    for b, t, s, n, k in ((2, 512, 1024, 8, 2), (1, 1024, 256, 4, 1)):  # GQA T<S (8 key blocks of 64), MQA T>S
        assert problem(AttentionShape(b, t, s, n, k, head_dim), dtype, cfg) is None
        q, kk, v = make_qkv(b, t, n, head_dim, seq_kv=s, kv_heads=k, dtype=dtype, seed=t + s + head_dim)
        fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg, return_lse=True))
        out, lse = fn(q, kk, v)
        check_output(out, q, kk, v, causal)
        want = reference_lse(q[:, :256], kk, is_causal=causal)  # the first rows, as check_output does (top-left mask)
        np.testing.assert_allclose(np.asarray(lse)[..., :256], want, atol=1e-2, rtol=1e-3)
    assert any(name.startswith("mosaic_gpu") for name in kernels_used(fn, q, kk, v))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("head_dim", "cfg"), CONFIGS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gpu_pipelined_and_h256_match_reference(causal, head_dim, cfg, dtype):
    check_against_reference(head_dim, cfg, dtype, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("head_dim", "cfg"),
    [(128, MosaicConfig(registers=240)), (256, MosaicConfig(block_kv=64, pipeline=True, registers=240))],
)
def test_gpu_forward_with_240_registers_matches_reference(causal, head_dim, cfg):
    """The copy warpgroup down to 24 registers, the compute ones up to 240 (the plain kernel and the fullest one)."""
    check_against_reference(head_dim, cfg, jnp.bfloat16, causal)
