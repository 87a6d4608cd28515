import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import (
    AttentionShape,
    attention_shape,
    check_block_size,
    invalid_reason,
    make_qkv,
    memory_limit_bytes,
    resolve_scale,
)


def test_make_qkv_layout_and_dtype():
    q, k, v = make_qkv(2, 16, 8, 32, seq_kv=24, kv_heads=2, dtype=jnp.bfloat16, seed=3)
    assert q.shape == (2, 16, 8, 32) and k.shape == v.shape == (2, 24, 2, 32)
    assert q.dtype == k.dtype == v.dtype == jnp.bfloat16
    assert attention_shape(q, k, v) == AttentionShape(2, 16, 24, 8, 2, 32)
    assert attention_shape(q, k, v).groups == 4


def test_make_qkv_is_random_not_zero_and_seeded():
    a = make_qkv(1, 64, 2, 16, seed=0)
    b = make_qkv(1, 64, 2, 16, seed=0)
    c = make_qkv(1, 64, 2, 16, seed=1)
    for x, y, z in zip(a, b, c):
        assert np.array_equal(x, y) and not np.array_equal(x, z)
        assert 0.8 < float(jnp.std(x)) < 1.2  # standard normal, not zeros
    assert not np.array_equal(a[0], a[1])  # q, k, v drawn independently


def test_make_qkv_draws_jax_random_normal_in_float32_then_casts_any_seed():
    # the recipe: split the seed's key in three, draw standard normals in float32, cast; seeds past int32 work too
    for seed in (0, 2**31, 2**40):
        q, k, v = make_qkv(2, 16, 4, 8, seq_kv=12, kv_heads=2, dtype=jnp.bfloat16, seed=seed)
        kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
        assert np.array_equal(q, jax.random.normal(kq, (2, 16, 4, 8)).astype(jnp.bfloat16))
        assert np.array_equal(k, jax.random.normal(kk, (2, 12, 2, 8)).astype(jnp.bfloat16))
        assert np.array_equal(v, jax.random.normal(kv, (2, 12, 2, 8)).astype(jnp.bfloat16))


def test_defaults_self_attention_mha():
    q, k, v = make_qkv(1, 8, 4, 16)
    assert k.shape == (1, 8, 4, 16)


def _qkv(q=(2, 8, 4, 16), k=(2, 8, 4, 16), v=None, dtype=jnp.float32):
    v = k if v is None else v
    return jnp.ones(q, dtype), jnp.ones(k, dtype), jnp.ones(v, dtype)


BAD = {
    "q rank 3": (lambda: (jnp.ones((8, 4, 16)), *_qkv()[1:]), "rank 4"),
    "k rank 5": (lambda: (_qkv()[0], jnp.ones((1, 2, 8, 4, 16)), _qkv()[2]), "rank 4"),
    "v rank 2": (lambda: (*_qkv()[:2], jnp.ones((8, 16))), "rank 4"),
    "batch mismatch": (lambda: _qkv(q=(3, 8, 4, 16)), "same batch"),
    "head_dim mismatch": (lambda: _qkv(q=(2, 8, 4, 32)), "same head_dim"),
    "k/v seq mismatch": (lambda: _qkv(v=(2, 9, 4, 16)), "k and v must have the same shape"),
    "k/v heads mismatch": (lambda: _qkv(v=(2, 8, 2, 16)), "k and v must have the same shape"),
    "heads not divisible": (lambda: _qkv(q=(2, 8, 6, 16), k=(2, 8, 4, 16)), "multiple of kv_heads"),
    "more kv heads than heads": (lambda: _qkv(q=(2, 8, 2, 16), k=(2, 8, 4, 16)), "multiple of kv_heads"),
    "integer dtype": (lambda: _qkv(dtype=jnp.int32), "floating point"),
    "bool dtype": (lambda: _qkv(dtype=jnp.bool_), "floating point"),
    "mixed dtypes": (lambda: (_qkv()[0], *_qkv(dtype=jnp.bfloat16)[1:]), "share one dtype"),
    "empty query length": (lambda: _qkv(q=(2, 0, 4, 16)), "at least 1"),
    "empty key length": (lambda: _qkv(k=(2, 0, 4, 16)), "at least 1"),
    "empty batch": (lambda: _qkv(q=(0, 8, 4, 16), k=(0, 8, 4, 16)), "at least 1"),
    "zero head_dim": (lambda: _qkv(q=(2, 8, 4, 0), k=(2, 8, 4, 0)), "at least 1"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_inputs_raise_a_clear_error(case):
    build, message = BAD[case]
    with pytest.raises(ValueError, match=message):
        attention_shape(*build())


def test_error_names_the_actual_shapes():
    with pytest.raises(ValueError, match=r"\(3, 8, 4, 16\).*\(2, 8, 4, 16\)"):
        attention_shape(*_qkv(q=(3, 8, 4, 16)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"kv_heads": 3}, "multiple of kv_heads"), ({"dtype": jnp.int8}, "floating"), ({"seq_kv": 0}, "at least 1")],
)
def test_make_qkv_rejects_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_qkv(1, 8, 4, 16, **kwargs)


@pytest.mark.parametrize(
    ("scale", "expected"),
    [
        (None, 0.25),
        (0.5, 0.5),
        (2, 2.0),
        (np.float32(0.125), 0.125),
        (np.int64(3), 3.0),
        (jnp.bfloat16(0.5), 0.5),
        (np.array(0.75), 0.75),
        (0.0, 0.0),
        (-1.5, -1.5),
    ],
)
def test_resolve_scale_accepts_real_numbers(scale, expected):
    value = resolve_scale(scale, 16)
    assert type(value) is float and value == expected


@pytest.mark.parametrize(
    ("scale", "message"),
    [
        (float("nan"), "must be finite"),
        (float("inf"), "must be finite"),
        (np.float32("-inf"), "must be finite"),
        (True, "real number; got bool"),
        ("0.125", "real number; got str"),
        (1 + 2j, "real number; got complex"),
        (np.complex64(1), "real scalar"),
        (np.array([0.1, 0.2]), r"real scalar; got shape \(2,\)"),
        ([0.1], "real number; got list"),
    ],
)
def test_resolve_scale_refuses_with_the_fix(scale, message):
    with pytest.raises(ValueError, match=message) as err:
        resolve_scale(scale, 16)
    assert "or None for that default" in str(err.value)


def test_resolve_scale_refuses_a_traced_scale():
    with pytest.raises(ValueError, match="not a traced value"):
        jax.jit(lambda s: resolve_scale(s, 16))(0.5)


@pytest.mark.parametrize("value", [1, 64, np.int32(128), np.int64(256)])
def test_check_block_size_accepts_positive_ints(value):
    assert check_block_size("block_q", value) == int(value) and type(check_block_size("block_q", value)) is int


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "positive integer.*got 0"),
        (-64, "got -64"),
        (64.0, r"got float 64.0. Pass an int, e.g. block_k=int"),
        (True, "got bool"),
        ("64", "got str"),
        (None, "got NoneType"),
    ],
)
def test_check_block_size_refuses_with_the_fix(value, message):
    with pytest.raises(ValueError, match=message):
        check_block_size("block_k", value)


def test_python_lists_get_a_short_clear_error():
    q = [[[[0.0] * 16] * 4] * 8] * 2
    with pytest.raises(ValueError, match=r"q must be an array.*got list. Convert it with jnp.asarray\(q") as err:
        attention_shape(q, q, q)
    assert len(str(err.value)) < 200  # the message, not a dump of the data


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((1.5, 8, 4, 16), {}, "batch must be an int; got float"),
        ((1, 8, True, 16), {}, "heads must be an int; got bool"),
        ((1, 8, 4, 16), {"seed": 0.5}, "seed must be an int"),
        ((1, 8, 4, 16), {"dtype": "float"}, "jax_enable_x64"),
        ((1, 8, 4, 16), {"dtype": "nonsense"}, "floating type"),
        ((1, 8, 4, np.int64(16)), {"seq_kv": -1}, "at least 1"),
    ],
)
def test_make_qkv_refuses_bad_values(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_qkv(*args, **kwargs)


def test_make_qkv_refuses_more_than_the_device_memory_instead_of_aborting():
    limit = memory_limit_bytes()
    assert limit is not None and limit > 2**28  # RAM on a CPU, bytes_limit on a GPU
    with pytest.raises(ValueError, match=r"need about .* GiB to create, more than the .* GiB.*choose smaller sizes"):
        make_qkv(64, 2**20, 64, 128, dtype=jnp.bfloat16)  # 3 x 2^42 bf16 values: 24 TiB
    # the check is about memory only: numpy integer sizes that fit still work
    assert make_qkv(np.int64(1), np.int32(8), 2, 8)[0].shape == (1, 8, 2, 8)


@pytest.mark.parametrize(
    ("shape", "dtype", "message"),
    [
        (AttentionShape(1, 8, 8, 6, 4, 16), "float32", "multiple of kv_heads"),
        (AttentionShape(1, 0, 8, 4, 4, 16), "float32", "at least 1"),
        ((1, 8, 8, 4, 4), "float32", "6 ints"),
        ((1, 8, 8, 4, 4, 16.0), "float32", "6 ints"),
        (AttentionShape(1, 8, 8, 4, 4, 16), "int8", "floating point"),
        (AttentionShape(1, 8, 8, 4, 4, 16), "nonsense", "floating dtype"),
    ],
)
def test_invalid_reason_names_the_problem(shape, dtype, message):
    assert re.search(message, invalid_reason(shape, dtype))


def test_invalid_reason_is_none_for_valid_problems():
    assert invalid_reason(AttentionShape(1, 8, 8, 4, 2, 16), jnp.bfloat16) is None
    assert invalid_reason((np.int64(1), 8, 8, 4, 4, 16), "float32") is None


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(0)])
def test_check_int_accepts_python_and_numpy_integers(value):
    from attention_tutorial.inputs import check_int

    got = check_int("n", value, minimum=0)
    assert got == int(value) and type(got) is int


@pytest.mark.parametrize(
    ("value", "message"),
    [(2.5, "float 2.5"), (2.0, "float 2.0"), (True, "bool True"), (None, "NoneType"), ("3", "str '3'"), (-1, "-1\\.$")],
)
def test_check_int_names_the_argument_the_value_and_the_fix(value, message):
    from attention_tutorial.inputs import check_int

    with pytest.raises(ValueError, match=rf"^steps must be an integer >= 0 \(e\.g\. steps=200\); got .*{message}"):
        check_int("steps", value, minimum=0, example="200")


@pytest.mark.parametrize(
    ("value", "kw", "ok"),
    [
        (1e-3, {"positive": True}, True),
        (0, {"non_negative": True}, True),
        (np.float32(2), {}, True),
        (0.0, {"positive": True}, False),
        (-1, {"non_negative": True}, False),
        (float("nan"), {}, False),
        (float("inf"), {}, False),
        (True, {}, False),
        ("1e-3", {}, False),
        (None, {}, False),
    ],
)
def test_check_number_refuses_what_is_not_a_finite_number_in_range(value, kw, ok):
    from attention_tutorial.inputs import check_number

    if ok:
        assert check_number("lr", value, **kw) == float(value)
    else:
        with pytest.raises(ValueError, match=r"^lr must be a finite number"):
            check_number("lr", value, **kw)


def test_make_qkv_refuses_a_negative_seed():
    with pytest.raises(ValueError, match="seed must be >= 0"):
        make_qkv(1, 8, 2, 8, seed=-1)


def test_check_scores_fit_refuses_an_overflowing_scale_and_only_that():
    from attention_tutorial.inputs import check_scores_fit

    q = jnp.full((1, 2, 1, 4), 2.0)
    k = jnp.full((1, 2, 1, 4), 3.0)
    # scores are 4 · 2 · 3 = 24 per unit of scale: 1e37 gives 2.4e38 (fits float32), 2e37 gives 4.8e38 (does not)
    check_scores_fit(q, k, 1e37, what="f")
    with pytest.raises(ValueError, match=r"scale=-2e\+37 can make scores up to 4\.8e\+38.*f would return NaN"):
        check_scores_fit(q, k, -2e37, what="f")
    # an infinite entry is not counted: what it does is each function's own documented business
    check_scores_fit(q.at[0, 0, 0, 0].set(jnp.inf), k, 1e37, what="f")
    # float16 values cannot reach it at any ordinary scale: no reduction, no error
    check_scores_fit(q.astype(jnp.float16), k.astype(jnp.float16), 1e20, what="f")
