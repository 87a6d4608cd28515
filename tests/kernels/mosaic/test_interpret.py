"""Our Mosaic GPU kernels on a CPU, through Pallas's GPU interpreter (:mod:`attention_tutorial.kernels.mosaic.
interpret`): the kernels as written, every warpgroup a thread, against float64. The default suite runs a few
shapes; the slow suite each kernel path (masks: ``test_interpret_masks.py``)."""

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import make_qkv
from attention_tutorial.kernels.mosaic import MosaicConfig, Probe, default_config, mosaic_flash_attention
from attention_tutorial.kernels.mosaic import interpret as interpret_module
from attention_tutorial.kernels.mosaic.fp8 import mosaic_fp8_attention
from attention_tutorial.kernels.mosaic.interpret import DeadlockError, interpret, why_not
from attention_tutorial.kernels.reference import reference_attention
from tests.kernels.test_pallas_flash import assert_grads_close

pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


def qkv(t, s, n, k, h, seed=0):
    return make_qkv(1, t, n, h, seq_kv=s, kv_heads=k, dtype=jnp.bfloat16, seed=seed)


def check_forward(fn, q, k, v, *, causal, tol=1e-2):
    with interpret():
        out = np.asarray(fn(q, k, v).astype(jnp.float32))
    want = reference_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), is_causal=causal)
    np.testing.assert_allclose(out, want, atol=tol, rtol=tol)


def check_gradients(fn, q, k, v, *, causal):
    with interpret():
        assert_grads_close(fn, q, k, v, causal=causal, tol=3e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_run_on_a_cpu(causal):
    """The default kernels at H = 64 (dQ by atomic adds), GQA with T < S."""
    q, k, v = qkv(128, 256, 2, 1, 64, seed=3)
    fn = functools.partial(mosaic_flash_attention, is_causal=causal)
    check_forward(fn, q, k, v, causal=causal)
    check_gradients(fn, q, k, v, causal=causal)


def test_fp8_forward_runs_on_a_cpu():
    q, k, v = qkv(128, 256, 2, 2, 128, seed=4)
    check_forward(functools.partial(mosaic_fp8_attention, is_causal=True), q, k, v, causal=True, tol=0.15)


def test_persistent_ctas_walk_several_query_blocks_each():
    """Three CTAs (off a GPU) walk the 4 · 4 = 16 query blocks of a causal T = S = 512 in whole tiles, heaviest first,
    GQA, turns: the first block walks one key tile of two slots, the ring's barriers and the turns carry on from
    block to block."""
    q, k, v = qkv(512, 512, 4, 2, 64, seed=6)
    cfg = MosaicConfig(persistent=True, heavy_first=True, schedule="turns")
    check_forward(functools.partial(mosaic_flash_attention, is_causal=True, config=cfg), q, k, v, causal=True)


def test_persistent_ctas_refuse_a_mask_with_per_row_arrays():
    q, k, v = qkv(128, 128, 1, 1, 128)
    with pytest.raises(ValueError, match="pass persistent=False for it"), interpret():
        mosaic_flash_attention(
            q, k, v, segment_ids=jnp.zeros((1, 128), jnp.int32), config=MosaicConfig(persistent=True)
        )
    with pytest.raises(ValueError, match="mosaic_fp8_attention: persistent CTAs"), interpret():
        mosaic_fp8_attention(q, k, v, query_seq_lengths=jnp.array([100]), config=MosaicConfig(persistent=True))


def test_outside_interpret_a_cpu_refuses_the_kernel():
    q, k, v = qkv(128, 128, 1, 1, 64)
    with pytest.raises(ValueError, match="interpret"):
        mosaic_flash_attention(q, k, v)


def test_a_store_past_the_end_of_a_per_row_vector_is_refused():
    """A slice of the innermost axis with every other axis fixed runs on as one flat copy on the GPU: refused; the
    same overrun along an outer axis is clipped as TMA clips it."""
    info = types.SimpleNamespace(source_info=None)
    with pytest.raises(ValueError, match=r"innermost axis \(128 > 113"):
        interpret_module._refuse_folded_overrun((0, 1, slice(64, 128)), (2, 2, 113), info)
    interpret_module._refuse_folded_overrun((0, slice(64, 128), 1), (2, 113, 2), info)  # clipped, not refused
    interpret_module._refuse_folded_overrun((0, 1, slice(0, 64)), (2, 2, 113), info)  # inside


def test_a_copy_into_shared_memory_of_a_ragged_number_of_bytes_is_refused():
    """Mosaic GPU copies a multiple of 128 bytes into shared memory: 20 int32s (80 bytes) is refused, 32 pass."""
    with pytest.raises(ValueError, match="got 80 bytes of shape \\(20,\\)"):
        interpret_module._refuse_ragged_copy(np.zeros(20, np.int32))
    interpret_module._refuse_ragged_copy(np.zeros(32, np.int32))
    interpret_module._refuse_ragged_copy(np.zeros((32, 128), jnp.bfloat16))


def test_a_deadlocked_kernel_raises_instead_of_hanging(monkeypatch):
    """A compute warpgroup that waits on a barrier nobody arrives at: the interpreter gives up and names the wait."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    monkeypatch.setattr(interpret_module, "DEADLOCK_SECONDS", 1.0)

    def body(x_ref, o_ref, scoped):
        (barrier,) = scoped

        @pl.when(jax.lax.axis_index("wg") == 0)
        def _():
            plgpu.barrier_wait(barrier)  # nobody arrives

    def entry(x_ref, o_ref):
        pl.run_scoped(lambda *s: body(x_ref, o_ref, s), plgpu.Barrier(num_arrivals=1), collective_axes="wg")

    kernel = plgpu.kernel(
        entry,
        out_type=jax.ShapeDtypeStruct((8,), jnp.float32),
        grid=(1,),
        grid_names=("x",),
        num_threads=2,
        thread_name="wg",
    )
    with pytest.raises(Exception, match="waited 1 s on a barrier"):
        with interpret():
            jax.block_until_ready(kernel(jnp.zeros((8,), jnp.float32)))
    assert issubclass(DeadlockError, RuntimeError)


CONFIGS = {
    "dq pass": lambda h: dataclasses.replace(default_config(h), bwd_dq="pass"),
    "dq atomic": lambda h: dataclasses.replace(default_config(h), bwd_dq="atomic"),
    "pipelined": lambda h: default_config(h, pipeline=True),
    "3 stages": lambda h: dataclasses.replace(default_config(h), stages=3, bwd_stages=3),
    "together, dq pass": lambda h: dataclasses.replace(default_config(h), bwd_dq="pass", bwd_together=True),
    "together, dq atomic": lambda h: dataclasses.replace(default_config(h), bwd_dq="atomic", bwd_together=True),
    "heavy first": lambda h: dataclasses.replace(default_config(h), bwd_dq="pass", heavy_first=True),
    "dq split": lambda h: dataclasses.replace(default_config(h), bwd_dq="split"),
    "dq split, together": lambda h: dataclasses.replace(default_config(h), bwd_dq="split", bwd_together=True),
}


MHA, GQA_SHORT_Q, GQA_LONG_Q = (256, 256, 2, 2), (128, 384, 4, 1), (384, 128, 2, 1)  # (T, S, N, K)
# Each kernel path with and without the causal mask and at both head dims, each (causal, H) pair twice, the shapes
# in turn; on a GPU, the compiled kernels run these paths over more shapes (the gpu tests beside this file).
PATHS = [
    ("dq pass", False, 64, MHA),
    ("dq pass", True, 128, GQA_SHORT_Q),
    ("dq atomic", True, 64, GQA_LONG_Q),
    ("dq atomic", False, 128, MHA),
    ("pipelined", False, 64, GQA_SHORT_Q),
    ("pipelined", True, 128, GQA_LONG_Q),
    ("3 stages", True, 64, MHA),
    ("3 stages", False, 128, GQA_SHORT_Q),
    ("together, dq pass", True, 64, GQA_LONG_Q),
    ("together, dq atomic", False, 128, GQA_SHORT_Q),
    ("heavy first", True, 64, GQA_LONG_Q),
    ("dq split", True, 128, GQA_SHORT_Q),
    ("dq split", False, 128, GQA_LONG_Q),
    ("dq split, together", True, 128, MHA),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "causal", "head_dim", "shape"),
    PATHS,
    ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else str(x),
)
def test_every_kernel_path_matches_float64(name, causal, head_dim, shape):
    t, s, n, k = shape
    cfg = CONFIGS[name](head_dim)
    q, kk, v = qkv(t, s, n, k, head_dim, seed=t + s + n)
    fn = functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg)
    check_forward(fn, q, kk, v, causal=causal)
    check_gradients(fn, q, kk, v, causal=causal)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mask", "head_dim", "cfg"),
    [
        ({}, 128, MosaicConfig(persistent=True, schedule="turns", block_kv=176)),
        ({"local_window_size": (70, 30)}, 64, MosaicConfig(block_kv=64, persistent=True, stages=1)),
        ({"is_causal": True, "causal_alignment": "bottom_right"}, 64, MosaicConfig(block_kv=64, persistent=True)),
        ({"is_causal": True}, 256, MosaicConfig(block_kv=80, persistent=True, heavy_first=True)),
        ({"is_causal": True}, 64, MosaicConfig(block_kv=64, persistent=True, stages=3)),
    ],
    ids=["turns, 176 keys", "window, one slot", "bottom-right causal", "H=256 causal", "causal, 3 slots"],
)
def test_persistent_ctas_match_float64_with_gradients(mask, head_dim, cfg):
    """Values, and gradients through the log-sum-exp the persistent forward leaves; T < S, ragged, GQA (a window
    with one slot: a warpgroup skipping a step releases k before it waits for v)."""
    q, k, v = qkv(200, 260, 4, 2, head_dim, seed=head_dim)
    with interpret():
        out = np.asarray(mosaic_flash_attention(q, k, v, config=cfg, **mask).astype(jnp.float32))
    f32 = (x.astype(jnp.float32) for x in (q, k, v))
    np.testing.assert_allclose(out, reference_attention(*f32, **mask), atol=1e-2, rtol=1e-2)
    if set(mask) <= {"is_causal"}:  # the float64 gradients know no other mask (test_interpret_masks has them)
        check_gradients(
            functools.partial(mosaic_flash_attention, config=cfg, **mask), q, k, v, causal=bool(mask.get("is_causal"))
        )


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["rendezvous", "turns"])
def test_persistent_ctas_take_blocks_that_see_no_key(schedule):
    """Bottom-right causal with T = 700 > S = 200: the first query blocks keep no key (rows 0-499), so a warpgroup
    walks blocks of no step; the turns must still pass in order, one slot."""
    q, k, v = qkv(700, 200, 2, 1, 64, seed=5)
    mask = {"is_causal": True, "causal_alignment": "bottom_right"}
    cfg = MosaicConfig(block_kv=64, stages=1, persistent=True, heavy_first=True, schedule=schedule)
    with interpret():
        out = np.asarray(mosaic_flash_attention(q, k, v, config=cfg, **mask).astype(jnp.float32))
    f32 = (x.astype(jnp.float32) for x in (q, k, v))
    np.testing.assert_allclose(out, reference_attention(*f32, **mask), atol=1e-2, rtol=1e-2)
    assert not out[:, :500].any()  # rows that keep no key: zeros


@pytest.mark.slow
def test_persistent_fp8_forward_matches_float64():
    q, k, v = qkv(300, 300, 4, 4, 128, seed=2)
    fn = functools.partial(mosaic_fp8_attention, is_causal=True, config=MosaicConfig(persistent=True))
    check_forward(fn, q, k, v, causal=True, tol=0.15)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("causal", "cfg"),
    [
        (False, MosaicConfig(block_kv=64)),
        (True, MosaicConfig(block_kv=64, pipeline=True)),
        (True, MosaicConfig(block_kv=80)),  # FlashAttention-3's tile: v in 32-byte swizzled tiles, S ragged
    ],
    ids=["plain", "pipelined, causal", "80 keys, causal"],
)
def test_h256_forward_matches_float64(causal, cfg):
    q, k, v = qkv(256, 256, 2, 1, 256, seed=9)
    check_forward(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg), q, k, v, causal=causal)


def test_h256_backward_runs_on_a_cpu():
    """The backward that splits the head dim between the warpgroups, GQA with a ragged T < S."""
    q, k, v = qkv(100, 160, 2, 1, 256, seed=4)
    check_gradients(functools.partial(mosaic_flash_attention, config=default_config(256)), q, k, v, causal=False)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [GQA_SHORT_Q, GQA_LONG_Q], ids=["T<S", "T>S"])
def test_h256_backward_matches_float64(causal, shape):
    t, s, n, k = shape
    q, kk, v = qkv(t, s, n, k, 256, seed=t + s)
    cfg = dataclasses.replace(default_config(256), heavy_first=causal)
    check_gradients(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg), q, kk, v, causal=causal)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_forward_with_176_key_tiles_matches_float64(causal):
    """FlashAttention-3's key tile at H = 128: v in 32-byte swizzled tiles; S = 2 · 176 + 48 ends on a ragged tile."""
    q, k, v = qkv(200, 400, 2, 1, 128, seed=1)
    fn = functools.partial(mosaic_flash_attention, is_causal=causal, config=MosaicConfig(block_kv=176))
    check_forward(fn, q, k, v, causal=causal)


@pytest.mark.slow
def test_forward_with_exponentials_on_the_fma_units_matches_float64():
    q, k, v = qkv(256, 256, 2, 2, 128, seed=5)
    fn = functools.partial(mosaic_flash_attention, is_causal=True, probe=Probe(exp_poly=0.25))
    check_forward(fn, q, k, v, causal=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("p_via", "causal", "block_kv"), [("registers", False, 128), ("smem", True, 128), ("registers", True, 192)]
)
def test_fp8_forward_matches_float64(causal, p_via, block_kv):
    """S = 384: three whole 128-key tiles, or two of 192 (vᵀ and p in 64-byte swizzled tiles)."""
    q, k, v = qkv(256, 384, 2, 1, 128, seed=6)
    fn = functools.partial(mosaic_fp8_attention, is_causal=causal, p_via=p_via, config=MosaicConfig(block_kv=block_kv))
    check_forward(fn, q, k, v, causal=causal, tol=0.15)
