"""The online-softmax (FlashAttention) algorithm in JAX: values and gradients against references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_tutorial.kernels.blockwise import blockwise_attention
from attention_tutorial.kernels.reference import naive_attention, reference_attention
from tests.kernels.test_reference import normal_qkv

# one compiled program per drawn shape: run eagerly, every operation outside the loops compiles apart for each shape
blockwise_jit = jax.jit(blockwise_attention, static_argnames=("is_causal", "block_q", "block_k"))


@settings(max_examples=8)
@given(
    t=st.integers(1, 70),
    s=st.integers(1, 70),
    k=st.sampled_from([1, 2]),
    g=st.sampled_from([1, 2]),
    causal=st.booleans(),
    bq=st.sampled_from([8, 16, 32]),
    bk=st.sampled_from([8, 16, 64]),
    seed=st.integers(0, 99),
)
def test_values_match_float64_reference(t, s, k, g, causal, bq, bk, seed):
    q, kk, v = normal_qkv(2, t, k * g, 8, seq_kv=s, kv_heads=k, seed=seed)
    out = blockwise_jit(q, kk, v, is_causal=causal, block_q=bq, block_k=bk)
    np.testing.assert_allclose(out, reference_attention(q, kk, v, is_causal=causal), atol=2e-5, rtol=2e-5)


def _grad_reference(q, k, v, d_out, causal):
    """Gradients by autodiff of the naive attention in float64 (jax x64 locally enabled), compiled as one program."""
    with jax.enable_x64(True):
        f = lambda q, k, v: naive_attention(q, k, v, is_causal=causal)  # noqa: E731
        grads = jax.jit(lambda q, k, v, d: jax.vjp(f, q, k, v)[1](d))
        return [np.asarray(g) for g in grads(*(jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, v, d_out)))]


@pytest.mark.parametrize(
    ("t", "s", "n", "k", "causal"), [(48, 48, 4, 2, True), (40, 56, 2, 2, False), (33, 17, 4, 1, True)]
)
def test_gradients_match_float64_autodiff(t, s, n, k, causal):
    q, kk, v = normal_qkv(2, t, n, 16, seq_kv=s, kv_heads=k, seed=t)
    d_out = normal_qkv(2, t, n, 16, seed=t + 1)[0]
    grads = jax.jit(
        lambda q, k, v, d: jax.vjp(
            lambda q, k, v: blockwise_attention(q, k, v, is_causal=causal, block_q=16, block_k=16), q, k, v
        )[1](d)
    )
    for got, want in zip(grads(q, kk, v, d_out), _grad_reference(q, kk, v, d_out, causal)):
        np.testing.assert_allclose(got, want, atol=5e-5, rtol=5e-5)


def test_bf16_within_bf16_tolerance():
    q, k, v = normal_qkv(1, 128, 4, 32, dtype=jnp.bfloat16)
    out = blockwise_attention(q, k, v, is_causal=True, block_q=32, block_k=32)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(out, np.float32), reference_attention(q, k, v, is_causal=True), atol=2e-2, rtol=2e-2
    )


def test_rows_with_nothing_to_see_are_zero():
    # T > S with causal top-left: every query sees key 0 at least; with S padded inside a block nothing leaks
    q, k, v = normal_qkv(1, 20, 2, 8, seq_kv=5, seed=3)
    out = blockwise_attention(q, k, v, is_causal=True, block_q=8, block_k=4)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=True), atol=2e-5)


@pytest.mark.parametrize(("name", "value"), [("block_q", 0), ("block_k", -4), ("block_q", 8.5), ("block_k", None)])
def test_bad_block_size_names_the_argument(name, value):
    q, k, v = normal_qkv(1, 8, 1, 8)
    with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
        blockwise_attention(q, k, v, **{name: value})


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "0.1", 1j, [0.1], True])
def test_bad_scale_raises(scale):
    q, k, v = normal_qkv(1, 8, 1, 8)
    with pytest.raises(ValueError, match="scale must be"):
        blockwise_attention(q, k, v, scale=scale)


def _poisoned(where, value, causal):
    """q, k, v with one entry set to ``value`` (NaN or inf) in q, k or v through blockwise; naive's outputs alongside."""
    q, k, v = normal_qkv(1, 24, 2, 8, seed=4)
    arrays = {"q": q, "k": k, "v": v}
    arrays[where] = arrays[where].at[0, 5, 1, 3].set(value)
    want = np.asarray(naive_attention(**arrays, is_causal=causal))
    got = np.asarray(blockwise_jit(**arrays, is_causal=causal, block_q=8, block_k=8))  # one compile per mask
    return got, want


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("causal", [False, True])
def test_nan_and_inf_propagate_like_naive(where, value, causal):
    got, want = _poisoned(where, value, causal)
    assert (np.isnan(got) == np.isnan(want)).all()
    assert (np.isinf(got) == np.isinf(want)).all()
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], atol=2e-5, rtol=2e-5)


def test_nan_row_is_not_zeros():
    got, _ = _poisoned("q", float("nan"), False)
    assert np.isnan(got[0, 5, 1]).all() and np.isfinite(np.delete(got, 5, axis=1)).all()


@pytest.mark.parametrize("scale", [1e30, -1e30, 1e38])
def test_huge_scale_gives_no_nan(scale):
    q, k, v = normal_qkv(1, 16, 2, 8, seed=2)
    got = blockwise_attention(q, k, v, scale=scale, is_causal=True, block_q=8, block_k=8)
    assert np.isfinite(np.asarray(got)).all()
    # naive clamps to float32's range as well (at 1e38 several scores tie at the clamp; float64's would not)
    np.testing.assert_allclose(got, naive_attention(q, k, v, scale=scale, is_causal=True), atol=1e-5)


def test_works_with_x64_enabled():
    q, k, v = normal_qkv(1, 20, 2, 8, seed=1)
    with jax.enable_x64(True):
        out32 = blockwise_attention(q, k, v, is_causal=True, block_q=8, block_k=8)
        q64, k64, v64 = (jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, v))
        out64, lse64 = blockwise_attention(q64, k64, v64, is_causal=True, block_q=8, block_k=8, return_lse=True)
        g = jax.grad(lambda q: blockwise_attention(q, k64, v64, block_q=8, block_k=8).sum())(q64)
    assert out32.dtype == jnp.float32 and g.dtype == jnp.float64
    assert out64.dtype == jnp.float64 and lse64.dtype == jnp.float64
    want = reference_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(out32, want, atol=2e-5)
    np.testing.assert_allclose(out64, want, atol=1e-12)
    np.testing.assert_allclose(lse64, _lse_reference(q, k, True), atol=1e-12)


def _lse_reference(q, k, causal, scale=None):
    """log Σⱼ exp(sⱼ) per row in float64 NumPy: (B, N, T)."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    scale = 1 / np.sqrt(H) if scale is None else scale
    s = np.einsum("btnh,bsnh->bnts", q, np.repeat(k, N // K, axis=2)) * scale
    if causal:
        s = np.where(np.arange(S)[None, :] <= np.arange(T)[:, None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    return (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]


@pytest.mark.parametrize(("t", "s", "causal"), [(24, 24, True), (20, 13, False), (30, 7, True)])
def test_return_lse_values(t, s, causal):
    q, k, v = normal_qkv(2, t, 4, 8, seq_kv=s, kv_heads=2, seed=t)
    out, lse = blockwise_attention(q, k, v, is_causal=causal, block_q=8, block_k=8, return_lse=True)
    assert lse.shape == (2, 4, t) and lse.dtype == jnp.float32
    np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=causal), atol=2e-5)
    np.testing.assert_allclose(lse, _lse_reference(q, k, causal), atol=2e-5, rtol=2e-5)


def test_lse_gradient_matches_float64_autodiff():
    # a loss through both outputs: the lse's cotangent must enter the backward pass (dS += P * dlse)
    q, k, v = normal_qkv(1, 20, 4, 8, kv_heads=2, seed=8)
    w_out = normal_qkv(1, 20, 4, 8, seed=2)[0]
    w_lse = jnp.asarray(np.random.default_rng(3).standard_normal((1, 4, 20), np.float32))

    def loss(q, k, v):
        out, lse = blockwise_attention(q, k, v, is_causal=True, block_q=8, block_k=8, return_lse=True)
        return jnp.sum(out * w_out) + jnp.sum(lse * w_lse)

    def loss64(q, k, v):
        qg = q.reshape(1, 20, 2, 2, 8)
        s = jnp.einsum("btkgh,bskh->bkgts", qg, k).reshape(1, 4, 20, 20) / np.sqrt(8)
        s = jnp.where(jnp.tril(jnp.ones((20, 20), bool)), s, -jnp.inf)
        lse = jax.nn.logsumexp(s, axis=-1)
        out = naive_attention(q, k, v, is_causal=True)
        return jnp.sum(out * w_out.astype(out.dtype)) + jnp.sum(lse * w_lse.astype(lse.dtype))

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    with jax.enable_x64(True):
        want = jax.jit(jax.grad(loss64, argnums=(0, 1, 2)))(
            *(jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, v))
        )
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=5e-5, rtol=5e-5)


def test_every_causal_row_sees_key_zero():
    # blockwise's masks never empty a row (top-left causal: query i sees key 0), even for T much larger than S
    q, k, v = normal_qkv(1, 17, 2, 8, seq_kv=1, seed=6)
    out, lse = blockwise_attention(q, k, v, is_causal=True, block_q=4, block_k=4, return_lse=True)
    np.testing.assert_allclose(out, np.broadcast_to(np.asarray(v), out.shape), atol=1e-6)  # one key: weight 1
    np.testing.assert_allclose(lse, _lse_reference(q, k, True), atol=1e-5)


@pytest.mark.parametrize("flag", ["no", "False", 0, None])
def test_is_causal_must_be_a_bool_not_a_truthy_value(flag):
    q, k, v = normal_qkv(1, 16, 2, 8, seed=0)
    with pytest.raises(ValueError, match="is_causal must be True or False"):
        blockwise_attention(q, k, v, is_causal=flag)


@pytest.mark.parametrize(("scale", "value"), [(2e38, 20.0), (-2e38, 10.0), (1e300, 20.0)])
def test_a_scale_past_float32_is_the_hard_maximum_not_a_tie(scale, value):
    # one query, two keys of raw scores 2 and 3: scale · both overflows float32; clamped, they would tie at 15
    q = jnp.ones((1, 1, 1, 1), jnp.float32)
    k = jnp.asarray([2.0, 3.0], jnp.float32).reshape(1, 2, 1, 1)
    v = jnp.asarray([10.0, 20.0], jnp.float32).reshape(1, 2, 1, 1)
    for block in (1, 2):  # the two keys in one block, and in two (the running maximum moves)
        assert float(np.asarray(blockwise_attention(q, k, v, scale=scale, block_k=block)).ravel()[0]) == value


@pytest.mark.parametrize("scale", [0.0, -0.7, 3.0])
def test_zero_and_negative_scales_give_the_reference_values_lse_and_gradients(scale):
    from attention_tutorial.kernels.blockwise import blockwise_backward

    q, k, v = normal_qkv(2, 20, 4, 8, kv_heads=2, seed=32)
    d_out = jnp.asarray(np.random.default_rng(32).standard_normal(q.shape), jnp.float32)
    run = lambda q, k, v: blockwise_attention(q, k, v, scale=scale, is_causal=True, block_q=8, block_k=8)  # noqa: E731
    np.testing.assert_allclose(run(q, k, v), reference_attention(q, k, v, scale=scale, is_causal=True), atol=2e-5)
    out, lse = blockwise_attention(q, k, v, scale=scale, is_causal=True, block_q=8, block_k=8, return_lse=True)
    scores = scale * np.einsum("btnh,bsnh->bnts", np.asarray(q, np.float64), np.repeat(np.asarray(k, np.float64), 2, 2))
    scores = np.where(np.tril(np.ones((20, 20), bool)), scores, -np.inf)
    np.testing.assert_allclose(lse, np.logaddexp.reduce(scores, axis=-1), atol=2e-5)
    want = jax.vjp(lambda q, k, v: naive_attention(q, k, v, scale=scale, is_causal=True), q, k, v)[1](d_out)
    for got in (
        jax.vjp(run, q, k, v)[1](d_out),
        blockwise_backward(q, k, v, out, lse, d_out, is_causal=True, scale=scale, block_q=8, block_k=8),
    ):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize("flag", ["no", 0, None])
def test_return_lse_must_be_a_bool(flag):
    q, k, v = normal_qkv(1, 8, 1, 8)
    with pytest.raises(ValueError, match="return_lse must be True or False"):
        blockwise_attention(q, k, v, return_lse=flag)


def test_blockwise_backward_names_a_misshapen_argument():
    from attention_tutorial.kernels.blockwise import blockwise_backward

    q, k, v = normal_qkv(1, 16, 2, 8)
    lse = jnp.zeros((1, 2, 16))
    for args, name in (
        ((q, lse[..., :5], q), "lse"),
        ((q[:, :4], lse, q), "out"),
        ((q, lse, None), "d_out"),
        ((q, [0.0], q), "lse"),
    ):
        out, lse_, d_out = args
        with pytest.raises(ValueError, match=f"^{name} must be an array of shape"):
            blockwise_backward(q, k, v, out, lse_, d_out)
