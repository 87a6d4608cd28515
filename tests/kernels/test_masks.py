"""Each mask kind, through jax.nn.dot_product_attention's own arguments, against the float64 reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape, make_qkv
from attention_tutorial.kernels.fused import dot_product_attention
from attention_tutorial.kernels.masks import (
    MASK_KINDS,
    causal_args,
    causal_mask,
    check_mask_args,
    mask_args,
    split_static,
)
from attention_tutorial.kernels.reference import naive_attention, reference_attention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("impl", ["naive", "xla"])
def test_mask_kind_matches_reference(kind, causal, impl):
    shape = AttentionShape(3, 64, 64, 4, 2, 16)
    q, k, v = make_qkv(3, 64, 4, 16, kv_heads=2, seed=3)
    kwargs = mask_args(kind, shape, q.dtype, causal=causal, window=8, seed=1)
    if impl == "naive":
        out = naive_attention(q, k, v, is_causal=causal, **kwargs)
    else:
        out = dot_product_attention(q, k, v, implementation="xla", is_causal=causal, **kwargs)
    ref = reference_attention(q, k, v, is_causal=causal, **kwargs)  # the same keywords, computed in float64
    np.testing.assert_allclose(out, ref, atol=3e-5, rtol=3e-5)


def test_dense_causal_mask_equals_is_causal():
    q, k, v = make_qkv(1, 32, 2, 16)
    dense = mask_args("dense", AttentionShape(1, 32, 32, 2, 2, 16), q.dtype)
    np.testing.assert_allclose(
        dot_product_attention(q, k, v, **dense), dot_product_attention(q, k, v, is_causal=True), rtol=1e-6, atol=1e-6
    )


def test_padding_lengths_are_within_range_and_first_row_full():
    args = mask_args("padding", AttentionShape(8, 100, 100, 2, 2, 8), jnp.float32, seed=5)
    kv = np.asarray(args["key_value_seq_lengths"])
    assert kv[0] == 100 and (kv >= 50).all() and (kv <= 100).all()
    np.testing.assert_array_equal(args["query_seq_lengths"], kv)


def test_window_is_static_and_arrays_are_inputs():
    arrays, static = split_static(mask_args("window", AttentionShape(1, 8, 8, 1, 1, 8), jnp.float32, causal=True))
    assert arrays == {} and static == {"local_window_size": (256, 0)}
    arrays, static = split_static(mask_args("bias", AttentionShape(1, 8, 8, 2, 2, 8), jnp.float32))
    assert set(arrays) == {"bias"} and arrays["bias"].shape == (1, 2, 8, 8) and not static


def test_unknown_mask_kind():
    with pytest.raises(ValueError, match="unknown mask kind"):
        mask_args("alibi", AttentionShape(1, 8, 8, 1, 1, 8), jnp.float32)


def test_xla_fully_masked_row_documented_behaviour():
    """JAX's XLA path averages v over an emptied row (no NaN); the naive one gives zeros (documented)."""
    q, k, v = make_qkv(1, 4, 1, 8)
    mask = np.ones((1, 1, 4, 4), bool)
    mask[..., 1, :] = False
    out = np.asarray(dot_product_attention(q, k, v, mask=mask, implementation="xla"))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0, 1], np.asarray(v)[0].mean(axis=0), rtol=1e-5)


# --- causal alignment when T != S -------------------------------------------------------------------------------

# Hand-written: rows are queries, columns keys; 1 = may attend.
HAND = {
    (2, 4, "top_left"): [[1, 0, 0, 0], [1, 1, 0, 0]],
    (2, 4, "bottom_right"): [[1, 1, 1, 0], [1, 1, 1, 1]],
    (4, 2, "top_left"): [[1, 0], [1, 1], [1, 1], [1, 1]],
    (4, 2, "bottom_right"): [[0, 0], [0, 0], [1, 0], [1, 1]],
    (3, 3, "top_left"): [[1, 0, 0], [1, 1, 0], [1, 1, 1]],
    (3, 3, "bottom_right"): [[1, 0, 0], [1, 1, 0], [1, 1, 1]],
    (1, 5, "bottom_right"): [[1, 1, 1, 1, 1]],  # decoding: the one new token sees the whole cache
}


@pytest.mark.parametrize(("t", "s", "alignment"), sorted(HAND))
def test_causal_mask_matches_hand_written(t, s, alignment):
    np.testing.assert_array_equal(causal_mask(t, s, alignment=alignment), np.array(HAND[t, s, alignment], bool))


@pytest.mark.parametrize(("t", "s", "alignment"), sorted(HAND))
@pytest.mark.parametrize("impl", ["naive", "reference", "xla", "jax.nn + causal_args"])
def test_causal_alignment_matches_the_hand_written_mask(t, s, alignment, impl):
    """Each implementation's causal_alignment equals the float64 reference given the hand-written mask."""
    q, k, v = make_qkv(2, t, 2, 8, seq_kv=s, seed=t * 10 + s)
    expected = reference_attention(q, k, v, mask=np.array(HAND[t, s, alignment], bool))
    if impl == "jax.nn + causal_args":
        out = jax.nn.dot_product_attention(q, k, v, **causal_args(t, s, alignment=alignment))
    else:
        fn = {"naive": naive_attention, "reference": reference_attention, "xla": dot_product_attention}[impl]
        out = fn(q, k, v, is_causal=True, causal_alignment=alignment)
    rows = np.array(HAND[t, s, alignment]).any(axis=1)  # rows with nothing to see: compared in their own test
    np.testing.assert_allclose(np.asarray(out)[:, rows], expected[:, rows], atol=2e-5, rtol=2e-5)


def test_bottom_right_is_what_decoding_needs():
    """Prefill 6 tokens causally, then the last one decoded against the 6-token cache: the same row."""
    q, k, v = make_qkv(1, 6, 2, 16, seed=8)
    full = naive_attention(q, k, v, is_causal=True)
    last = naive_attention(q[:, -1:], k, v, is_causal=True, causal_alignment="bottom_right")
    np.testing.assert_allclose(last[:, 0], full[:, -1], atol=1e-6, rtol=1e-6)
    chunk = dot_product_attention(q[:, 3:], k, v, is_causal=True, causal_alignment="bottom_right")
    np.testing.assert_allclose(chunk, np.asarray(full)[:, 3:], atol=1e-6, rtol=1e-6)  # chunked prefill


def test_causal_args_top_left_is_is_causal_and_bottom_right_a_mask():
    assert causal_args(2, 4) == {"is_causal": True}
    assert causal_args(3, 3, alignment="bottom_right") == {"is_causal": True}  # T == S: the same triangle
    mask = causal_args(2, 4, alignment="bottom_right")["mask"]
    assert mask.shape == (1, 1, 2, 4) and mask.dtype == bool


@pytest.mark.parametrize(("t", "s"), [(1, 4), (3, 6), (5, 5), (2, 9)])
def test_the_fused_page_s_one_line_mask_is_the_bottom_right_mask(t, s):
    mask = jnp.tril(jnp.ones((t, s), bool), k=s - t)[None, None]  # the line docs/fused_attention.md shows
    want = causal_args(t, s, alignment="bottom_right")
    np.testing.assert_array_equal(mask, want.get("mask", jnp.tril(jnp.ones((t, s), bool))[None, None]))
    np.testing.assert_array_equal(mask[0, 0], causal_mask(t, s, alignment="bottom_right"))


# --- rows with nothing to see: one documented behaviour per implementation --------------------------------------

# Each way of leaving rows with no key: (seq_kv, keywords, the (B=2, T=4) rows that see nothing, written by hand).
EMPTY = {
    "mask row of False": (
        4,
        {"mask": np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 1]], bool)},
        [[0, 1, 0, 0], [0, 1, 0, 0]],
    ),
    "key length 0": (4, {"key_value_seq_lengths": np.array([0, 4], np.int32)}, [[1, 1, 1, 1], [0, 0, 0, 0]]),
    "bottom-right, T > S": (3, {"is_causal": True, "causal_alignment": "bottom_right"}, [[1, 0, 0, 0], [1, 0, 0, 0]]),
    "window past the keys": (3, {"local_window_size": (0, 0)}, [[0, 0, 0, 1], [0, 0, 0, 1]]),
}


def _empty_problem(how):
    s, kwargs, empty = EMPTY[how]
    q, k, v = make_qkv(2, 4, 2, 8, seq_kv=s, seed=12)
    return q, k, v, kwargs, np.array(empty, bool)


@pytest.mark.parametrize("impl", ["naive", "reference"])
@pytest.mark.parametrize("how", sorted(EMPTY))
def test_rows_with_nothing_to_see_are_zero_in_naive_and_reference(how, impl):
    q, k, v, kwargs, empty = _empty_problem(how)
    fn = {"naive": naive_attention, "reference": reference_attention}[impl]
    out = np.asarray(fn(q, k, v, **kwargs))
    assert empty.any() and np.isfinite(out).all()
    np.testing.assert_array_equal(out[empty], 0.0)
    assert (np.abs(out[~empty]).sum(axis=(-1, -2)) > 0).all()  # the other rows are not zeros
    np.testing.assert_allclose(out[~empty], reference_attention(q, k, v, **kwargs)[~empty], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("how", sorted(EMPTY))
def test_rows_with_nothing_to_see_are_the_mean_of_v_in_xla(how):
    """JAX's XLA path masks with a large finite negative number: an empty row averages v over all S keys."""
    q, k, v, kwargs, empty = _empty_problem(how)
    out = np.asarray(dot_product_attention(q, k, v, implementation="xla", **kwargs))
    assert np.isfinite(out).all()
    mean_v = np.asarray(v).mean(axis=1)  # (B, K=N, H)
    for b, t in zip(*np.nonzero(empty)):
        np.testing.assert_allclose(out[b, t], mean_v[b], atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(out[~empty], reference_attention(q, k, v, **kwargs)[~empty], atol=2e-5, rtol=2e-5)


def test_rows_past_the_query_length_are_zero_everywhere():
    q, k, v = make_qkv(2, 4, 2, 8, seed=13)
    lengths = np.array([2, 4], np.int32)
    for fn in (naive_attention, reference_attention, functools.partial(dot_product_attention, implementation="xla")):
        out = np.asarray(fn(q, k, v, query_seq_lengths=lengths))
        np.testing.assert_array_equal(out[0, 2:], 0.0)
        assert (np.abs(out[0, :2]).sum(axis=-1) > 0).all() and (np.abs(out[1]).sum(axis=-1) > 0).all()


# --- every bad value refused, with the fix, by every implementation ----------------------------------------------

B, T, S, N = 2, 4, 6, 4  # q (2, 4, 4, 8), k/v (2, 6, 2, 8)
BAD = {  # keywords -> what the message must say (the fix or the accepted range)
    "kv length negative": ({"key_value_seq_lengths": np.array([-1, 6])}, r"\[0, S\] = \[0, 6\]; batch row 0 has -1"),
    "kv length too long": ({"key_value_seq_lengths": np.array([6, 7])}, r"\[0, S\] = \[0, 6\]; batch row 1 has 7"),
    "q length too long": ({"query_seq_lengths": np.array([5, 1])}, r"\[0, T\] = \[0, 4\]; batch row 0 has 5"),
    "q length negative": ({"query_seq_lengths": [2, -3]}, r"\[0, T\] = \[0, 4\]; batch row 1 has -3"),
    "lengths one per head": ({"key_value_seq_lengths": np.array([6, 6, 6, 6])}, r"shape \(B,\) = \(2,\)"),
    "lengths 2-D": ({"key_value_seq_lengths": np.full((2, 1), 6)}, r"shape \(B,\) = \(2,\)"),
    "lengths a bare int": ({"key_value_seq_lengths": 6}, r"jnp.full\(\(2,\), length, jnp.int32\)"),
    "lengths float": (
        {"key_value_seq_lengths": np.array([6.0, 5.5])},
        r"jnp.asarray\(key_value_seq_lengths, jnp.int32",
    ),
    "lengths ragged list": ({"query_seq_lengths": [[1, 2], [3]]}, "flat list of 2 ints"),
    "window negative": ({"local_window_size": -1}, r"not be negative; got \(-1, -1\)"),
    "window right negative": ({"local_window_size": (2, -1)}, r"not be negative.*\(left, right\)"),
    "window float": ({"local_window_size": 2.5}, r"an int w >= 0.*\(left, right\)"),
    "window triple": ({"local_window_size": (1, 2, 3)}, r"an int w >= 0.*\(left, right\)"),
    "window bool": ({"local_window_size": True}, r"an int w >= 0"),
    "window string": ({"local_window_size": "8"}, r"an int w >= 0"),
    "scale NaN": ({"scale": float("nan")}, "finite real number"),
    "scale inf": ({"scale": -np.inf}, "finite real number"),
    "scale string": ({"scale": "0.125"}, "finite real number"),
    "scale bool": ({"scale": True}, "finite real number"),
    "scale vector": ({"scale": np.array([0.1, 0.2])}, "real scalar"),
    "mask rank 3, B == 2 looks like heads": ({"mask": np.ones((2, T, S), bool)}, r"ambiguous.*mask\[:, None\]"),
    "mask of floats": ({"mask": np.zeros((T, S), np.float32)}, r"mask.astype\(bool\).*bias="),
    "mask a Python list": ({"mask": [[True] * S] * T}, r"jnp.asarray\(mask\)"),
    "mask wrong T": (
        {"mask": np.ones((1, 1, T + 1, S), bool)},
        r"\(B\|1, N\|1, T\|1, S\|1\) = \(2\|1, 4\|1, 4\|1, 6\|1\)",
    ),
    "mask per kv head": ({"mask": np.ones((1, 2, T, S), bool)}, r"N\|1.*got \(1, 2, 4, 6\)"),
    "mask rank 1": ({"mask": np.ones(S, bool)}, r"\(T, S\) = \(4, 6\)"),
    "bias rank 3": ({"bias": np.zeros((N, T, S))}, r"ambiguous.*bias\[None\]"),
    "bias boolean": ({"bias": np.ones((T, S), bool)}, "belongs in mask="),
    "bias wrong S": ({"bias": np.zeros((T, S + 2))}, r"got \(1, 1, 4, 8\)"),
    "is_causal a string": ({"is_causal": "yes"}, "True or False"),
    "alignment typo": ({"is_causal": True, "causal_alignment": "bottom-right"}, r"\('top_left', 'bottom_right'\)"),
    "alignment without is_causal": ({"causal_alignment": "bottom_right"}, "pass is_causal=True"),
}
IMPLS = {"naive": naive_attention, "reference": reference_attention, "xla": dot_product_attention}


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_option_is_refused_with_the_fix(case, impl):
    kwargs, message = BAD[case]
    q, k, v = make_qkv(B, T, N, 8, seq_kv=S, kv_heads=2)
    with pytest.raises(ValueError, match=message):
        IMPLS[impl](q, k, v, **kwargs)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_numpy_integers_and_lists_are_accepted_alike(impl):
    q, k, v = make_qkv(B, T, N, 8, seq_kv=S, kv_heads=2, seed=14)
    plain = {"local_window_size": (2, 1), "key_value_seq_lengths": jnp.array([6, 3], jnp.int32), "scale": 0.25}
    numpy = {
        "local_window_size": (np.int64(2), np.int32(1)),
        "key_value_seq_lengths": [6, np.int64(3)],
        "scale": np.float32(0.25),
    }
    np.testing.assert_allclose(IMPLS[impl](q, k, v, **numpy), reference_attention(q, k, v, **plain), atol=2e-5)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_per_batch_and_per_head_masks_are_not_confused(impl):
    """B == N == 2: a (B, 1, T, S) mask and a (1, N, T, S) mask differ, and each is applied on its own axis."""
    q, k, v = make_qkv(2, T, 2, 8, seq_kv=S, seed=15)
    m = np.ones((2, T, S), bool)
    m[0, :, 3:] = False  # entry 0 hides keys 3..5
    per_batch, per_head = IMPLS[impl](q, k, v, mask=m[:, None]), IMPLS[impl](q, k, v, mask=m[None])
    np.testing.assert_allclose(
        per_batch, reference_attention(q, k, v, mask=np.broadcast_to(m[:, None], (2, 2, T, S))), atol=2e-5
    )
    np.testing.assert_allclose(
        per_head, reference_attention(q, k, v, mask=np.broadcast_to(m[None], (2, 2, T, S))), atol=2e-5
    )
    assert not np.allclose(per_batch, per_head)


def test_mask_args_are_accepted_by_the_checks():
    shape = AttentionShape(3, 16, 16, 4, 2, 8)
    for kind in MASK_KINDS:
        for causal in (False, True):
            check_mask_args(shape, is_causal=causal, **mask_args(kind, shape, jnp.float32, causal=causal, window=4))


def test_a_rank3_bias_matching_neither_batch_nor_heads_says_so():
    q, k, v = make_qkv(2, 16, 4, 8, kv_heads=2, seed=0)
    with pytest.raises(ValueError, match="matches neither B=2 nor N=4"):
        naive_attention(q, k, v, bias=np.zeros((3, 16, 16), np.float32))


@pytest.mark.parametrize("impl", [naive_attention, dot_product_attention])
def test_traced_lengths_are_checked_under_checkify_and_clamped_otherwise(impl):
    from jax.experimental import checkify

    q, k, v = make_qkv(2, 8, 2, 8, seed=21)
    run = jax.jit(lambda q, k, v, ql, kl: impl(q, k, v, query_seq_lengths=ql, key_value_seq_lengths=kl))
    good, bad = jnp.array([8, 3]), jnp.array([99, -2])
    err, _ = checkify.checkify(run)(q, k, v, good, bad)
    assert "key_value_seq_lengths must lie in [0, S] = [0, 8]; got values from -2 to 99" in err.get()
    err, _ = checkify.checkify(run)(q, k, v, bad, good)
    assert "query_seq_lengths must lie in [0, T] = [0, 8]" in err.get()
    assert checkify.checkify(run)(q, k, v, good, good)[0].get() is None
    # without checkify: a length past the end means every position, a negative one none (the concrete call's values)
    np.testing.assert_array_equal(
        run(q, k, v, good, bad), impl(q, k, v, query_seq_lengths=[8, 3], key_value_seq_lengths=[8, 0])
    )
    with pytest.raises(ValueError, match=r"\[0, 8\]; batch row 0 has 99"):  # concrete: refused at once
        impl(q, k, v, key_value_seq_lengths=[99, 3])


def test_a_traced_window_says_to_make_it_static():
    q, k, v = make_qkv(1, 8, 2, 8, seed=22)
    with pytest.raises(ValueError, match="static argument"):
        jax.jit(lambda q, k, v, w: naive_attention(q, k, v, local_window_size=w))(q, k, v, 3)
    static = jax.jit(naive_attention, static_argnames=("local_window_size",))
    np.testing.assert_allclose(
        static(q, k, v, local_window_size=3), reference_attention(q, k, v, local_window_size=3), atol=2e-5
    )


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: causal_mask(-1, 3), "seq_q must be an integer >= 1"),
        (lambda: causal_mask(2.5, 3), "seq_q must be an integer >= 1"),
        (lambda: causal_mask(2, 0), "seq_kv must be an integer >= 1"),
        (lambda: mask_args("window", AttentionShape(1, 8, 8, 2, 2, 8), "float32", window=-1), "window must be"),
        (lambda: mask_args("padding", AttentionShape(1, 8, 8, 2, 2, 8), "float32", seed=-1), "seed must be"),
        (lambda: mask_args("none", (1, 8, 0, 2, 2, 8), "float32"), "AttentionShape"),
        (lambda: mask_args("nope", AttentionShape(1, 8, 8, 2, 2, 8), "float32"), "unknown mask kind"),
    ],
)
def test_mask_builders_name_a_bad_size(call, match):
    with pytest.raises(ValueError, match=match):
        call()
