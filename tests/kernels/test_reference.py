"""The naive JAX attention against the independent float64 NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_tutorial.kernels.reference import naive_attention, reference_attention

TOL = {"float32": 2e-5, "bfloat16": 2e-2}
# one compiled program per drawn shape (run eagerly, every operation compiles apart for each new shape)
naive_jit = jax.jit(naive_attention, static_argnames=("is_causal",))


def normal_qkv(batch, seq_q, heads, head_dim, *, seq_kv=None, kv_heads=None, dtype=jnp.float32, seed=0):
    """q, k, v as make_qkv gives them (the same arguments, standard normal), drawn by NumPy: jax.random compiles its
    sampler for each new shape, most of a small test's time on the CPU (make_qkv has its tests in test_inputs.py)."""
    rng = np.random.default_rng(seed)
    kv = (batch, seq_q if seq_kv is None else seq_kv, heads if kv_heads is None else kv_heads, head_dim)
    return tuple(
        jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
        for shape in [(batch, seq_q, heads, head_dim), kv, kv]
    )


@st.composite
def problems(draw):
    k = draw(st.sampled_from([1, 2, 4]))
    return {
        "batch": draw(st.integers(1, 3)),
        "seq_q": draw(st.integers(1, 40)),
        "seq_kv": draw(st.integers(1, 40)),
        "kv_heads": k,
        "heads": k * draw(st.sampled_from([1, 2, 3])),
        "head_dim": draw(st.sampled_from([4, 8, 16, 32])),
        "causal": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=12)
@given(problems())
def test_naive_matches_float64_reference(p):
    q, k, v = normal_qkv(
        p["batch"], p["seq_q"], p["heads"], p["head_dim"], seq_kv=p["seq_kv"], kv_heads=p["kv_heads"], seed=p["seed"]
    )
    out = naive_jit(q, k, v, is_causal=p["causal"])
    ref = reference_attention(q, k, v, is_causal=p["causal"])
    assert out.shape == q.shape and out.dtype == q.dtype
    np.testing.assert_allclose(out, ref, atol=TOL["float32"], rtol=TOL["float32"])


def test_naive_bf16_within_bf16_tolerance():
    q, k, v = normal_qkv(2, 64, 4, 32, kv_heads=2, dtype=jnp.bfloat16)
    out = naive_attention(q, k, v, is_causal=True)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(out, np.float32),
        reference_attention(q, k, v, is_causal=True),
        atol=TOL["bfloat16"],
        rtol=TOL["bfloat16"],
    )


def test_reference_against_a_hand_computed_case():
    # one query, two keys: scores [0, 1]/sqrt(1) -> weights softmax([0, 1]) -> mix of v
    q = np.array([[[[1.0]]]])
    k = np.array([[[[0.0]], [[1.0]]]])
    v = np.array([[[[10.0]], [[20.0]]]])
    w1 = np.exp(1) / (1 + np.exp(1))
    np.testing.assert_allclose(reference_attention(q, k, v), [[[[10 * (1 - w1) + 20 * w1]]]], rtol=1e-12)
    np.testing.assert_allclose(
        naive_attention(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32), jnp.asarray(v, jnp.float32)),
        [[[[10 * (1 - w1) + 20 * w1]]]],
        rtol=1e-6,
    )


def test_causal_first_position_sees_only_itself_and_last_sees_all():
    q, k, v = normal_qkv(1, 16, 2, 8, seed=4)
    out = np.asarray(naive_attention(q, k, v, is_causal=True))
    full = np.asarray(naive_attention(q, k, v))
    np.testing.assert_allclose(out[:, 0], np.asarray(v)[:, 0], rtol=1e-6)  # one key -> weight 1
    np.testing.assert_allclose(out[:, -1], full[:, -1], rtol=1e-6)  # the last query sees every key anyway


def test_causal_aligns_top_left_when_t_differs_from_s():
    q, k, v = normal_qkv(1, 4, 1, 8, seq_kv=8, seed=2)
    out = np.asarray(naive_attention(q, k, v, is_causal=True))
    # top-left: query 0 sees key 0 only (bottom-right would let it see keys 0..4)
    np.testing.assert_allclose(out[0, 0, 0], np.asarray(v)[0, 0, 0], rtol=1e-6)


def test_gqa_equals_mha_with_repeated_kv_heads():
    q, k, v = normal_qkv(2, 12, 8, 16, kv_heads=2, seed=9)
    rep = lambda x: jnp.repeat(x, 4, axis=2)  # noqa: E731 - kv head j serves query heads 4j..4j+3
    np.testing.assert_allclose(naive_attention(q, k, v), naive_attention(q, rep(k), rep(v)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(reference_attention(q, k, v), reference_attention(q, rep(k), rep(v)), rtol=1e-12)


def test_boolean_mask_matches_reference_and_excludes_keys():
    q, k, v = normal_qkv(2, 10, 2, 8, seq_kv=12, seed=1)
    mask = np.random.default_rng(0).random((2, 1, 10, 12)) > 0.3
    mask[..., 0] = True  # every row keeps a key
    np.testing.assert_allclose(
        naive_attention(q, k, v, mask=mask), reference_attention(q, k, v, mask=mask), atol=2e-5, rtol=2e-5
    )
    # changing a masked-out value leaves the output unchanged
    v2 = np.array(v)
    v2[0, 11] += 100.0
    keep = ~mask[0, 0, :, 11]
    a = np.asarray(naive_attention(q, k, v, mask=mask))[0, keep]
    b = np.asarray(naive_attention(q, k, jnp.asarray(v2), mask=mask))[0, keep]
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_fully_masked_rows_give_zeros_not_nan():
    q, k, v = normal_qkv(1, 4, 2, 8)
    mask = np.ones((1, 1, 4, 4), bool)
    mask[..., 2, :] = False  # query 2 may see nothing
    assert not mask[0, 0, 2].any() and mask[0, 0, [0, 1, 3]].all()  # the row really is empty, the others full
    out = np.asarray(naive_attention(q, k, v, mask=mask))
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[0, 2], 0.0)
    np.testing.assert_array_equal(reference_attention(q, k, v, mask=mask)[0, 2], 0.0)


def test_scale_and_bias():
    q, k, v = normal_qkv(1, 6, 2, 8, seed=5)
    bias = np.random.default_rng(1).normal(size=(1, 2, 6, 6))
    np.testing.assert_allclose(
        naive_attention(q, k, v, scale=0.3, bias=bias),
        reference_attention(q, k, v, scale=0.3, bias=bias),
        atol=2e-5,
        rtol=2e-5,
    )


@pytest.mark.parametrize("window", [0, 2, (3, 0), (1, 4)])
def test_local_window(window):
    q, k, v = normal_qkv(1, 12, 2, 8, seed=6)
    np.testing.assert_allclose(
        naive_attention(q, k, v, local_window_size=window),
        reference_attention(q, k, v, local_window_size=window),
        atol=2e-5,
        rtol=2e-5,
    )


def test_padding_lengths():
    q, k, v = normal_qkv(3, 8, 2, 8, seed=7)
    ql, kl = np.array([8, 5, 1]), np.array([8, 3, 6])
    out = naive_attention(q, k, v, query_seq_lengths=ql, key_value_seq_lengths=kl)
    ref = reference_attention(q, k, v, query_seq_lengths=ql, key_value_seq_lengths=kl)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)
    np.testing.assert_array_equal(np.asarray(out)[1, 5:], 0.0)  # padded queries: zeros


@pytest.mark.parametrize("scale", [1e30, -1e30])
def test_huge_scale_is_a_hard_max_not_nan(scale):
    """|scale| -> infinity turns softmax into a one-hot on the best (or, negative, the worst) key."""
    q, k, v = normal_qkv(2, 6, 2, 8, seq_kv=5, seed=16)
    scores = np.einsum("btnh,bsnh->bnts", np.asarray(q, np.float64), np.asarray(k, np.float64))
    pick = (scores.argmax if scale > 0 else scores.argmin)(axis=-1)  # (B, N, T): the key each row picks
    b, n, _ = np.indices(pick.shape)
    expected = np.asarray(v)[b, pick, n].transpose(0, 2, 1, 3)  # (B, N, T, H) -> (B, T, N, H)
    for fn in (naive_attention, reference_attention):
        np.testing.assert_allclose(fn(q, k, v, scale=scale), expected, atol=1e-6)
        assert np.isfinite(fn(q, k, v, scale=scale, is_causal=True, causal_alignment="bottom_right")).all()


@pytest.mark.parametrize("scale", [1e300, -1e300, 3e38])
def test_scale_beyond_float32_gives_no_nan(scale):
    q, k, v = normal_qkv(1, 8, 2, 8, seed=17)
    for fn in (naive_attention, reference_attention):
        out = np.asarray(fn(q, k, v, scale=scale, is_causal=True))
        assert np.isfinite(out).all()
        np.testing.assert_allclose(out[:, 0], np.asarray(v)[:, 0], rtol=1e-6)  # one key to see: weight 1


def test_infinite_bias_masks_a_key_without_nan():
    q, k, v = normal_qkv(1, 4, 1, 8, seed=18)
    bias = np.zeros((4, 4))
    bias[:, 1] = -np.inf  # key 1 hidden from every query
    bias[2] = -np.inf  # query 2: every key at -inf
    mask = np.ones((4, 4), bool)
    mask[:, 1] = False
    mask[2] = False
    for fn in (naive_attention, reference_attention):
        out = np.asarray(fn(q, k, v, bias=bias))
        assert np.isfinite(out).all()
        np.testing.assert_allclose(out, reference_attention(q, k, v, mask=mask), atol=2e-5)


def test_naive_gradients_match_xla_and_stay_finite_with_empty_rows():
    q, k, v = normal_qkv(1, 6, 2, 8, seq_kv=4, seed=19)
    d_out = normal_qkv(1, 6, 2, 8, seed=20)[0]
    args = {"is_causal": True, "causal_alignment": "bottom_right"}  # T > S: queries 0 and 1 see nothing

    def grads(f):  # (dq, dk, dv) for d_out, compiled as one program
        return jax.jit(lambda q, k, v, d: jax.vjp(f, q, k, v)[1](d))(q, k, v, d_out)

    bottom = grads(lambda q, k, v: naive_attention(q, k, v, **args))
    assert all(np.isfinite(g).all() for g in bottom)
    np.testing.assert_array_equal(bottom[0][:, :2], 0.0)  # nothing seen, nothing to learn
    top = grads(lambda q, k, v: naive_attention(q, k, v, is_causal=True))
    ref = grads(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True))
    for a, b in zip(top, ref):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5)


def test_the_float64_reference_propagates_nan_instead_of_writing_a_zero_row():
    q, k, v = normal_qkv(1, 8, 2, 4, seed=0)
    out = reference_attention(np.asarray(q).copy() * np.where(np.arange(8)[None, :, None, None] == 3, np.nan, 1), k, v)
    assert np.isnan(out[0, 3]).all()  # the poisoned query row
    assert np.isfinite(np.delete(out, 3, axis=1)).all()  # the others are untouched


def _two_keys():
    """One query against two keys whose raw scores are 2 and 3 (H = 1), and values telling the keys apart."""
    q = jnp.ones((1, 1, 1, 1), jnp.float32)
    k = jnp.asarray([2.0, 3.0], jnp.float32).reshape(1, 2, 1, 1)
    v = jnp.asarray([10.0, 20.0], jnp.float32).reshape(1, 2, 1, 1)
    return q, k, v


@pytest.mark.parametrize(("scale", "value"), [(2e38, 20.0), (3e38, 20.0), (-2e38, 10.0), (1e300, 20.0)])
def test_a_scale_past_float32_is_the_hard_maximum_not_a_tie(scale, value):
    # scale · 2 and scale · 3 both overflow float32: clamped, they would tie and average v to 15
    q, k, v = _two_keys()
    for fn in (naive_attention, reference_attention):
        assert float(np.asarray(fn(q, k, v, scale=scale)).ravel()[0]) == value


@pytest.mark.parametrize("scale", [0.0, -0.7, 3.0])
def test_the_shifted_scores_keep_values_and_gradients_at_ordinary_scales(scale):
    q, k, v = normal_qkv(2, 12, 4, 8, seq_kv=10, kv_heads=2, seed=31)
    d_out = jnp.asarray(np.random.default_rng(31).standard_normal(q.shape), jnp.float32)
    np.testing.assert_allclose(
        naive_attention(q, k, v, scale=scale, is_causal=True),
        reference_attention(q, k, v, scale=scale, is_causal=True),
        atol=2e-5,
    )
    ours = jax.vjp(lambda q, k, v: naive_attention(q, k, v, scale=scale, is_causal=True), q, k, v)[1](d_out)
    jaxs = jax.vjp(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True), q, k, v)
    for a, b in zip(ours, jaxs[1](d_out)):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5)
