"""Our Mosaic GPU kernels on a CPU, through Pallas's GPU interpreter (:mod:`attention_tutorial.kernels.mosaic.
interpret`): the kernels as written, every warpgroup a thread, against float64. The default suite runs a few
shapes; the slow suite every kernel path."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import make_qkv
from attention_tutorial.kernels.mosaic import MosaicConfig, default_config, mosaic_flash_attention
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


def test_outside_interpret_a_cpu_refuses_the_kernel():
    q, k, v = qkv(128, 128, 1, 1, 64)
    with pytest.raises(ValueError, match="interpret"):
        mosaic_flash_attention(q, k, v)


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

    kernel = plgpu.kernel(entry, out_type=jax.ShapeDtypeStruct((8,), jnp.float32), grid=(1,), grid_names=("x",),
                          num_threads=2, thread_name="wg")  # fmt: skip
    with pytest.raises(Exception, match="waited 1 s on a barrier"):
        with interpret():
            jax.block_until_ready(kernel(jnp.zeros((8,), jnp.float32)))
    assert issubclass(DeadlockError, RuntimeError)


CONFIGS = {
    "dq pass": lambda h: dataclasses.replace(default_config(h), bwd_dq="pass"),
    "dq atomic": lambda h: dataclasses.replace(default_config(h), bwd_dq="atomic"),
    "pipelined": lambda h: default_config(h, pipeline=True),
    "3 stages": lambda h: dataclasses.replace(default_config(h), stages=3, bwd_stages=3),
}


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize(("t", "s", "n", "k"), [(256, 256, 2, 2), (128, 384, 4, 1), (384, 128, 2, 1)])
def test_every_kernel_path_matches_float64(causal, head_dim, name, t, s, n, k):
    cfg = CONFIGS[name](head_dim)
    q, kk, v = qkv(t, s, n, k, head_dim, seed=t + s + n)
    fn = functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg)
    check_forward(fn, q, kk, v, causal=causal)
    check_gradients(fn, q, kk, v, causal=causal)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "cfg", [MosaicConfig(block_kv=64), MosaicConfig(block_kv=64, pipeline=True)], ids=["plain", "pipelined"]
)
def test_h256_forward_matches_float64(causal, cfg):
    q, k, v = qkv(256, 256, 2, 1, 256, seed=9)
    check_forward(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg), q, k, v, causal=causal)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_forward_with_exponentials_on_the_fma_units_matches_float64(causal):
    cfg = dataclasses.replace(default_config(128), exp_poly=0.25)
    q, k, v = qkv(256, 256, 2, 2, 128, seed=5)
    check_forward(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg), q, k, v, causal=causal)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p_via", ["registers", "smem"])
def test_fp8_forward_matches_float64(causal, p_via):
    q, k, v = qkv(256, 384, 2, 1, 128, seed=6)
    fn = functools.partial(mosaic_fp8_attention, is_causal=causal, p_via=p_via)
    check_forward(fn, q, k, v, causal=causal, tol=0.15)
