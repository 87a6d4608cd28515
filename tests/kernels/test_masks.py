"""Each mask kind, through jax.nn.dot_product_attention's own arguments, against the float64 reference."""

import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape, make_qkv
from attention_tutorial.kernels.fused import dot_product_attention
from attention_tutorial.kernels.masks import MASK_KINDS, mask_args, split_static
from attention_tutorial.kernels.reference import naive_attention, reference_attention


def _reference_kwargs(kind, kwargs, shape):
    """The reference takes the same keywords, except that the bias/mask arrays go in as NumPy."""
    return {k: (np.asarray(v, np.float64) if k == "bias" else np.asarray(v) if hasattr(v, "shape") else v)
            for k, v in kwargs.items()}  # fmt: skip


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
    ref = reference_attention(q, k, v, is_causal=causal, **_reference_kwargs(kind, kwargs, shape))
    np.testing.assert_allclose(out, ref, atol=3e-5, rtol=3e-5)


def test_dense_causal_mask_equals_is_causal():
    q, k, v = make_qkv(1, 32, 2, 16)
    dense = mask_args("dense", AttentionShape(1, 32, 32, 2, 2, 16), q.dtype)
    np.testing.assert_allclose(dot_product_attention(q, k, v, **dense), dot_product_attention(q, k, v, is_causal=True),
                               rtol=1e-6, atol=1e-6)  # fmt: skip


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
