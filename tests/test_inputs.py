import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape, attention_shape, make_qkv


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
