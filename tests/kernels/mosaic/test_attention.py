"""The public functions: validation before any kernel, what keeps them from running here, the pipelined entry point,
and JAX's bundled Mosaic GPU kernel against float64 on a Hopper GPU."""

import contextlib
import dataclasses
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape, make_qkv
from attention_tutorial.kernels.mosaic.attention import (
    bundled_why_not,
    jax_bundled_mosaic,
    mosaic_flash_attention,
    mosaic_pipelined_attention,
    why_not,
)
from attention_tutorial.kernels.mosaic.budget import MosaicConfig, default_config, problem
from tests.kernels.mosaic.test_forward import check_output
from tests.kernels.test_pallas_flash import assert_grads_close, chained_grad_text

ROOT = Path(__file__).resolve().parents[3]
H256 = MosaicConfig(block_kv=64)


def test_bad_input_raises_before_any_kernel():
    q, k, v = make_qkv(1, 256, 2, 64)  # float32
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        mosaic_flash_attention(q, k, v)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU answer")
def test_why_not_on_cpu_names_hopper():
    shape = AttentionShape(1, 1024, 1024, 4, 4, 128)
    assert "Hopper" in why_not(shape, jnp.bfloat16, False)
    assert "Hopper" in bundled_why_not(shape, jnp.float16, True)


@pytest.mark.parametrize("scale", [0.0, -0.125])
def test_a_scale_that_is_not_positive_is_refused(scale):
    """The kernels take the running maximum of the raw scores times the scale: only right for a positive scale."""
    q = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match=f"positive softmax scale; got {scale}. For a negative one, negate q"):
        jax.jit(functools.partial(mosaic_flash_attention, scale=scale)).trace(q, q, q)


def test_segment_ids_with_a_key_tile_of_16_odd_keys_are_refused_naming_the_fix():
    """Each key tile's segment ids go into shared memory by one copy of whole 128 bytes: 176 keys (704 bytes) would
    not compile on a GPU; 160 lowers."""
    q = jax.ShapeDtypeStruct((1, 352, 2, 128), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((1, 352), jnp.int32)

    def run(block_kv):
        fn = functools.partial(mosaic_flash_attention, config=MosaicConfig(block_kv=block_kv))
        return jax.jit(lambda q, ids: fn(q, q, q, segment_ids=ids)).trace(q, ids).lower(lowering_platforms=("cuda",))

    with pytest.raises(ValueError, match="block_kv must then be a multiple of 32; got block_kv=176"):
        run(176)
    assert "mosaic_gpu" in run(160).as_text()


def test_default_config_takes_block_kv_64_at_h256():
    """Without a config, H = 256 gets block_kv = 64 (plain and pipelined); an explicit 128 is refused, naming it."""
    shape = AttentionShape(1, 1024, 1024, 4, 4, 256)
    assert default_config(128) == MosaicConfig() and default_config(64) == MosaicConfig(bwd_dq="atomic")
    assert default_config(256) == H256 and default_config(256, pipeline=True) == MosaicConfig(
        block_kv=64, pipeline=True
    )
    assert problem(shape, jnp.bfloat16, default_config(256)) is None
    assert problem(shape, jnp.bfloat16, default_config(256, pipeline=True)) is None
    reason = problem(shape, jnp.bfloat16, MosaicConfig())
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


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_jax_bundled_mosaic_matches_reference(causal):
    if reason := bundled_why_not(AttentionShape(1, 1024, 1024, 4, 4, 128), jnp.float16, causal):
        pytest.skip(reason)
    q, k, v = make_qkv(1, 1024, 4, 128, dtype=jnp.float16, seed=3)
    check_output(jax_bundled_mosaic(q, k, v, is_causal=causal), q, k, v, causal)


@pytest.mark.gpu
def test_gpu_jax_bundled_mosaic_gradients_match_float64():
    if reason := bundled_why_not(AttentionShape(1, 512, 512, 4, 4, 64), jnp.float16, False):
        pytest.skip(reason)
    q, k, v = make_qkv(1, 512, 4, 64, kv_heads=2, dtype=jnp.float16, seed=9)
    assert_grads_close(jax_bundled_mosaic, q, k, v, causal=False, tol=3e-2)


def test_jax_pipeline_emitter_forward_refuses_causal_as_the_flash_page_says():
    # The flash page gives this as one reason the pipelining is written by hand, not with
    # plgpu.emit_pipeline_warp_specialized: when JAX's emitter-based forward takes causal masks, the page must change.
    attention_mgpu = pytest.importorskip("jax.experimental.pallas.ops.gpu.attention_mgpu")
    assert "does not take causal masks" in " ".join((ROOT / "docs" / "flash3.md").read_text().split())
    q = jnp.zeros((1, 256, 2, 64), jnp.float16)
    config = attention_mgpu.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, causal=True)
    with pytest.raises(NotImplementedError, match=r"[Cc]ausal"):
        attention_mgpu.attention_with_pipeline_emitter(q, q, q, config)


@pytest.mark.gpu
def test_layers_at_the_same_shapes_share_one_compiled_kernel():
    """Three chained calls lower to the same program text of Mosaic kernels as one call: each kernel once, called from
    every layer, so a deeper model does not lower and compile the kernels again per layer."""
    q, k, v = make_qkv(2, 256, 2, 64, dtype=jnp.bfloat16)
    attention = functools.partial(mosaic_flash_attention, is_causal=True)
    one, three = (chained_grad_text(attention, q, k, v, calls=n).count("mosaic_gpu") for n in (1, 3))
    assert one > 0 and three == one


def _register_moves(fn, *args):
    """(action, registers) of each set_max_registers in the traced kernels of ``fn(*args)``, sorted."""
    import re

    text = str(jax.make_jaxpr(fn)(*args))
    return sorted((a, int(n)) for a, n in re.findall(r"set_max_registers_p\[action=(\w+)\] (\d+)", text))


@pytest.mark.parametrize(("head_dim", "dq"), [(64, "atomic"), (128, "pass"), (128, "split"), (256, "pass")])
def test_any_length_lowers_for_cuda_forward_and_backward(head_dim, dq):
    """T and S that are not multiples of 8 (Mosaic GPU copies tiles of arrays whose rows are; the kernels pad the
    rows and their masks stop at T and S), a single query, and packed documents (tile lists that are short)."""
    cfg = dataclasses.replace(default_config(head_dim), bwd_dq=dq)
    for T, S, masks in (
        (113, 200, {"is_causal": True}),
        (1, 300, {"is_causal": True, "causal_alignment": "bottom_right"}),
        (500, 436, {"segment_ids": (jnp.zeros((1, 500), jnp.int32), jnp.zeros((1, 436), jnp.int32))}),
    ):
        q = jax.ShapeDtypeStruct((1, T, 4, head_dim), jnp.bfloat16)
        kv = jax.ShapeDtypeStruct((1, S, 2, head_dim), jnp.bfloat16)

        def loss(q, k, v, masks=masks):
            return mosaic_flash_attention(q, k, v, config=cfg, **masks).astype(jnp.float32).sum()

        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        shapes = [x.shape for x in jax.eval_shape(grad, q, kv, kv)]
        assert shapes == [q.shape, kv.shape, kv.shape]
        hlo = grad.trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()
        assert "custom_call @mosaic_gpu" in hlo


@pytest.mark.parametrize("p_via", ["registers", "smem"])
def test_the_fp8_forward_lowers_at_any_length(p_via):
    from attention_tutorial.kernels.mosaic.fp8 import mosaic_fp8_attention

    for T in (113, 1000):
        q = jax.ShapeDtypeStruct((1, T, 2, 128), jnp.bfloat16)
        fn = jax.jit(functools.partial(mosaic_fp8_attention, is_causal=True, p_via=p_via))
        assert jax.eval_shape(fn, q, q, q).shape == q.shape
        assert "custom_call @mosaic_gpu" in fn.trace(q, q, q).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize(("registers", "bwd_registers"), [(232, 232), (240, 232), (232, 240)])
def test_registers_reach_each_kernel_and_leave_the_copy_warpgroup_the_rest(registers, bwd_registers):
    """Forward (plain, pipelined, FP8) with ``registers``, both backward kernels with ``bwd_registers``."""
    from attention_tutorial.kernels.mosaic.fp8 import mosaic_fp8_attention

    cfg = MosaicConfig(registers=registers, bwd_registers=bwd_registers)
    fwd = [("decrease", 504 - 2 * registers), ("increase", registers)]
    bwd = [("decrease", 504 - 2 * bwd_registers), ("increase", bwd_registers)]
    q = jax.ShapeDtypeStruct((1, 512, 2, 128), jnp.bfloat16)
    for c in (cfg, dataclasses.replace(cfg, pipeline=True)):
        assert _register_moves(functools.partial(mosaic_flash_attention, config=c), q, q, q) == fwd
    assert _register_moves(functools.partial(mosaic_fp8_attention, config=cfg), q, q, q) == fwd
    for dq, kernels in (("pass", 2), ("atomic", 1)):
        c = dataclasses.replace(cfg, bwd_dq=dq)
        grad = jax.grad(lambda q, c=c: mosaic_flash_attention(q, q, q, config=c).astype(jnp.float32).sum())
        assert _register_moves(grad, q) == sorted(fwd + bwd * kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["rendezvous", "turns"])
@pytest.mark.parametrize(
    ("head_dim", "dq"), [(64, "atomic"), (64, "pass"), (128, "pass"), (128, "atomic"), (128, "split"), (256, "pass")]
)
def test_gpu_every_mask_forward_and_backward_matches_float64(head_dim, dq, schedule):
    """Every mask of the interpreter's matrix, compiled: causal both ways, windows, prefix-LM, lengths (rows with no
    key), softcap, packed documents with T != S; any T and S (320 × 384: partial tiles). The turns schedule runs
    with the backward's S and dP together and the query blocks heaviest first."""
    from tests.kernels.mosaic.test_interpret_masks import MASKS, check_masked

    if reason := why_not(AttentionShape(2, 320, 384, 2, 1, head_dim), jnp.bfloat16, True):
        pytest.skip(reason)
    new = {"bwd_together": True, "heavy_first": True} if schedule == "turns" else {}
    cfg = dataclasses.replace(default_config(head_dim), bwd_dq=dq, schedule=schedule, **new)
    failed = {}
    for name, (kwargs, kept) in MASKS.items():
        try:
            check_masked(
                kwargs, kept, B=2, T=320, S=384, H=head_dim, config=cfg, seed=len(name), run=contextlib.nullcontext
            )
        except AssertionError as e:
            failed[name] = str(e).splitlines()[:6]
    assert not failed, failed


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gpu_packed_documents_over_long_rows_forward_and_backward(head_dim):
    """Four documents packed into 5,500 tokens, causal: each key tile's list of query tiles (86) is longer than one
    copy moves (256 ints), so the backward's lists land in pieces; values and gradients against float64."""
    from tests.kernels.mosaic.test_interpret_masks import check_masked, documents

    if reason := why_not(AttentionShape(1, 5500, 5500, 1, 1, head_dim), jnp.bfloat16, True):
        pytest.skip(reason)
    ids = documents(1, 5500, [300, 2000, 1200, 2000], seed=1)
    kept = (ids[:, :, None] == ids[:, None, :]) & np.tri(5500, dtype=bool)
    check_masked(
        dict(segment_ids=ids, is_causal=True), kept, T=5500, S=5500, N=1, K=1, H=head_dim, run=contextlib.nullcontext
    )


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [80, 96, 192])
def test_gpu_head_dims_between_the_kernels_run_padded(head_dim):
    """H = 80 and 96 run as 128, H = 192 as 256: values, lse and gradients against float64, causal over a ragged
    T."""
    from tests.kernels.mosaic.test_interpret_masks import band, check_masked

    if reason := why_not(AttentionShape(1, 640, 640, 2, 1, head_dim), jnp.bfloat16, True):
        pytest.skip(reason)
    check_masked(
        dict(is_causal=True),
        band(1, 600, 600, right=0),
        T=600,
        S=600,
        N=2,
        K=1,
        H=head_dim,
        run=contextlib.nullcontext,
    )


def test_deterministic_makes_dq_by_a_pass(monkeypatch):
    """H = 64 makes dQ by atomic adds by default; deterministic=True takes the pass (the same bits every run)."""
    from attention_tutorial.kernels.mosaic import attention as mod

    seen = []
    monkeypatch.setattr(mod, "_attention", lambda q, k, v, arrays, plan: seen.append(plan.cfg) or (q, None))
    q, k, v = make_qkv(1, 128, 2, 64, dtype=jnp.bfloat16)
    assert default_config(64).bwd_dq == "atomic"
    mosaic_flash_attention(q, k, v)
    mosaic_flash_attention(q, k, v, deterministic=True)
    assert [c.bwd_dq for c in seen] == ["atomic", "pass"]
    with pytest.raises(ValueError, match="deterministic must be True or False"):
        mosaic_flash_attention(q, k, v, deterministic="yes")


@pytest.mark.gpu
def test_gpu_deterministic_gradients_are_the_same_bits_twice():
    if reason := why_not(AttentionShape(2, 1024, 1024, 4, 4, 64), jnp.bfloat16, True):
        pytest.skip(reason)
    q, k, v = make_qkv(2, 1024, 4, 64, dtype=jnp.bfloat16, seed=3)

    def loss(q, k, v):
        return mosaic_flash_attention(q, k, v, is_causal=True, deterministic=True).astype(jnp.float32).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    for a, b in zip(grad(q, k, v), grad(q, k, v)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
