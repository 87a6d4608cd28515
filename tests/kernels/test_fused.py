"""The jax.nn.dot_product_attention wrapper: XLA everywhere, cuDNN on the GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_tutorial.inputs import AttentionShape, Unsupported
from attention_tutorial.kernels.fused import cudnn_why_not, dot_product_attention, xla_why_not
from attention_tutorial.kernels.reference import reference_attention
from attention_tutorial.measure.compiled import kernels_used
from tests.kernels.test_reference import normal_qkv

# one compiled program per drawn shape (run eagerly, every operation compiles apart for each new shape)
attention_jit = jax.jit(dot_product_attention, static_argnames=("implementation", "is_causal"))


@settings(max_examples=12)
@given(
    b=st.integers(1, 2),
    t=st.integers(1, 33),
    s=st.integers(1, 33),
    k=st.sampled_from([1, 2]),
    g=st.sampled_from([1, 2, 4]),
    h=st.sampled_from([8, 16]),
    causal=st.booleans(),
    impl=st.sampled_from([None, "xla"]),
    seed=st.integers(0, 999),
)
def test_xla_matches_float64_reference(b, t, s, k, g, h, causal, impl, seed):
    q, kk, v = normal_qkv(b, t, k * g, h, seq_kv=s, kv_heads=k, seed=seed)
    out = attention_jit(q, kk, v, implementation=impl, is_causal=causal)
    np.testing.assert_allclose(out, reference_attention(q, kk, v, is_causal=causal), atol=2e-5, rtol=2e-5)


def test_xla_bf16_close_to_reference():
    q, k, v = normal_qkv(2, 64, 4, 32, dtype=jnp.bfloat16)
    out = dot_product_attention(q, k, v, implementation="xla")
    np.testing.assert_allclose(np.asarray(out, np.float32), reference_attention(q, k, v), atol=1e-2, rtol=1e-2)


def test_wrapper_validates_before_jax():
    q, k, v = normal_qkv(1, 8, 6, 16)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        dot_product_attention(q, k[:, :, :4], v[:, :, :4])
    with pytest.raises(ValueError, match="implementation must be"):
        dot_product_attention(q, k, v, implementation="flash")


def test_cudnn_on_cpu_says_why_and_names_the_fix():
    q, k, v = normal_qkv(1, 8, 2, 16, dtype=jnp.bfloat16)
    if jax.default_backend() == "gpu":
        pytest.skip("this checks the CPU message")
    reason = cudnn_why_not(AttentionShape(1, 8, 8, 2, 2, 16), jnp.bfloat16)
    assert "NVIDIA GPU" in reason and "CPU" in reason
    with pytest.raises(Unsupported, match="needs an NVIDIA GPU"):  # a ValueError too
        dot_product_attention(q, k, v, implementation="cudnn")


def test_float16_on_a_cpu_is_refused_up_front_with_the_fix():
    shape = AttentionShape(1, 16, 16, 2, 2, 8)
    cpu = jax.devices("cpu")[0]
    reason = xla_why_not(shape, jnp.float16, device=cpu)
    assert "float16" in reason and "float32 or bfloat16" in reason
    assert xla_why_not(shape, jnp.float32, device=cpu) is None and xla_why_not(shape, jnp.bfloat16, device=cpu) is None
    if jax.default_backend() != "cpu":
        return
    q, k, v = normal_qkv(1, 16, 2, 8, dtype=jnp.float16)
    for fn in (dot_product_attention, jax.jit(dot_product_attention)):  # compiled, JAX itself fails deep inside
        with pytest.raises(Unsupported, match="float32 or bfloat16"):
            fn(q, k, v)


def test_default_and_xla_use_no_cudnn_kernel_on_cpu():
    if jax.default_backend() == "gpu":
        pytest.skip("on a GPU the default may pick cuDNN")
    q, k, v = normal_qkv(1, 64, 2, 32, dtype=jnp.bfloat16)
    for impl in (None, "xla"):
        kernels = kernels_used(lambda q, k, v, impl=impl: dot_product_attention(q, k, v, implementation=impl), q, k, v)
        assert not any(t.startswith("__cudnn$fmha") for t in kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_cudnn_matches_reference_and_runs_the_fused_kernel(causal, dtype):
    q, k, v = normal_qkv(2, 256, 8, 64, kv_heads=2, dtype=dtype, seed=11)
    fn = lambda q, k, v: dot_product_attention(q, k, v, implementation="cudnn", is_causal=causal)  # noqa: E731
    out = fn(q, k, v)
    np.testing.assert_allclose(
        np.asarray(out, np.float32), reference_attention(q, k, v, is_causal=causal), atol=1e-2, rtol=1e-2
    )
    assert any(t.startswith("__cudnn$fmha") for t in kernels_used(fn, q, k, v))


@pytest.mark.gpu
def test_cudnn_rejects_float32_and_odd_head_dim_with_the_fix():
    assert "bfloat16" in cudnn_why_not(AttentionShape(1, 8, 8, 2, 2, 64), jnp.float32)
    assert "multiple of 8" in cudnn_why_not(AttentionShape(1, 8, 8, 2, 2, 100), jnp.bfloat16)
    q, k, v = normal_qkv(1, 8, 2, 64)
    with pytest.raises(ValueError, match="astype"):
        dot_product_attention(q, k, v, implementation="cudnn")


def test_cudnn_why_not_refuses_invalid_problems_before_asking_the_device():
    assert "floating point" in cudnn_why_not(AttentionShape(1, 8, 8, 2, 2, 64), jnp.int8)
    assert "multiple of kv_heads" in cudnn_why_not(AttentionShape(1, 8, 8, 3, 2, 64), jnp.bfloat16)
    assert "float8_e4m3fn" in xla_why_not(AttentionShape(1, 8, 8, 2, 2, 64), jnp.float8_e4m3fn)
    assert xla_why_not(AttentionShape(1, 8, 8, 2, 2, 64), jnp.float32) is None


def test_traced_lengths_are_checked_for_shape_and_dtype_only():
    """Under jit the values are unknown: shape and dtype are still checked, and the result stays right."""
    q, k, v = normal_qkv(2, 8, 2, 16, seed=22)
    fn = jax.jit(lambda q, k, v, kl: dot_product_attention(q, k, v, key_value_seq_lengths=kl))
    kl = jnp.array([8, 3], jnp.int32)
    ref = reference_attention(q, k, v, key_value_seq_lengths=np.asarray(kl))
    np.testing.assert_allclose(fn(q, k, v, kl), ref, atol=2e-5, rtol=2e-5)
    with pytest.raises(ValueError, match=r"shape \(B,\) = \(2,\)"):
        fn(q, k, v, jnp.array([8, 3, 1], jnp.int32))
    with pytest.raises(ValueError, match="must be integers"):
        fn(q, k, v, jnp.array([8.0, 3.0]))


def test_int64_lengths_reach_jax_as_int32():
    """jax.nn wants int32 lengths; NumPy's default int64 (or a list) used to fail inside JAX."""
    q, k, v = normal_qkv(2, 8, 2, 16, seed=23)
    out = dot_product_attention(q, k, v, query_seq_lengths=np.array([8, 5]), key_value_seq_lengths=[4, 8])
    ref = reference_attention(q, k, v, query_seq_lengths=[8, 5], key_value_seq_lengths=np.array([4, 8]))
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.gpu
def test_cudnn_refuses_a_right_window_without_causal_with_the_fix():
    q, k, v = normal_qkv(1, 128, 2, 64, dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match=r"Use \(left, 0\)"):
        dot_product_attention(q, k, v, implementation="cudnn", local_window_size=(8, 8))


@pytest.mark.gpu
@pytest.mark.parametrize(("t", "s"), [(64, 256), (1, 256)])
def test_cudnn_bottom_right_causal_matches_reference(t, s):
    q, k, v = normal_qkv(2, t, 4, 64, seq_kv=s, dtype=jnp.bfloat16, seed=24)
    out = dot_product_attention(q, k, v, implementation="cudnn", is_causal=True, causal_alignment="bottom_right")
    ref = reference_attention(q, k, v, is_causal=True, causal_alignment="bottom_right")
    np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=1e-2, rtol=1e-2)


def test_cudnn_window_that_looks_right_is_refused_as_unsupported(monkeypatch):
    from attention_tutorial.kernels import fused

    monkeypatch.setattr(fused, "cudnn_why_not", lambda shape, dtype: None)  # as on a GPU: only the window is refused
    q, k, v = normal_qkv(1, 8, 2, 16, dtype=jnp.bfloat16)
    with pytest.raises(Unsupported, match="windows look left only"):
        dot_product_attention(q, k, v, implementation="cudnn", local_window_size=(2, 2))
    with pytest.raises(ValueError) as bad:  # bad input stays a plain ValueError, not a refusal
        dot_product_attention(q.astype(jnp.int32), k, v)
    assert not isinstance(bad.value, Unsupported)


def test_a_scale_whose_scores_overflow_float32_is_refused_not_nan():
    from jax.experimental import checkify

    from attention_tutorial.inputs import make_qkv

    q, k, v = make_qkv(1, 8, 2, 8, seed=41)
    with pytest.raises(ValueError, match=r"scale=1e\+38 can make scores up to .* past float32's"):
        dot_product_attention(q, k, v, scale=1e38, implementation="xla")
    # under jit the values are unknown when the call is traced: checkify checks them when it runs
    run = jax.jit(lambda q, k, v: dot_product_attention(q, k, v, scale=1e38, implementation="xla"))
    err, out = checkify.checkify(run)(q, k, v)
    assert "can make scores overflow float32" in err.get()
    assert np.isnan(np.asarray(out)).any()  # what the check is there for: jax.nn's own answer
    # a large scale that fits is computed as before
    got = dot_product_attention(q, k, v, scale=1e3, implementation="xla")
    np.testing.assert_allclose(got, reference_attention(q, k, v, scale=1e3), atol=1e-5)


def test_cudnn_why_not_refuses_what_is_no_device():
    with pytest.raises(ValueError, match=r"device must be a jax\.Device"):
        cudnn_why_not(AttentionShape(1, 16, 16, 2, 2, 64), "bfloat16", device="gpu")
