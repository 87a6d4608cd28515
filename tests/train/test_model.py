"""The GPT: loss at initialisation ≈ ln 256, causal, and its gradients really pass through the attention."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.train.data import batch_at, load_corpus
from attention_tutorial.train.loop import init_params, loss_fn
from attention_tutorial.train.model import GPT, TINY, Config, matmul_flops_per_token


@pytest.fixture(scope="module")
def params():
    return init_params(TINY, 0)


@pytest.fixture(scope="module")
def tokens():
    return jnp.asarray(batch_at(load_corpus().train, batch=TINY.batch, seq_len=TINY.seq_len, seed=0, step=0))


def test_loss_at_initialisation_is_about_ln_256(params, tokens):
    loss = float(loss_fn(GPT(TINY, "xla"), params, tokens))
    assert abs(loss - math.log(256)) < 0.05, loss


def test_logits_are_causal_and_see_the_past(params, tokens):
    x = tokens[:, :-1]
    changed = x.at[:, 10].set((x[:, 10] + 1) % 256)
    model = GPT(TINY, "xla")
    a, b = (np.asarray(model.apply({"params": params}, t)) for t in (x, changed))
    assert a.shape == (TINY.batch, TINY.seq_len, 256) and a.dtype == np.float32
    np.testing.assert_array_equal(a[:, :10], b[:, :10])  # the future never leaks back
    assert np.abs(a[:, 20] - b[:, 20]).max() > 1e-4  # position 20 sees token 10 only through attention


def _qk_grad_norm(attention, params, tokens):
    grads = jax.grad(lambda p: loss_fn(GPT(TINY, attention), p, tokens))(params)
    qkv = grads["block0"]["qkv"]["kernel"]  # (d_model, 3, N, H): q, k, v
    return float(jnp.abs(qkv[:, :2]).max())


def test_gradients_flow_through_the_attention(params, tokens):
    assert _qk_grad_norm("blockwise", params, tokens) > 1e-6
    # the check can fail: an "attention" that ignores q and k gives them no gradient at all
    assert _qk_grad_norm(lambda q, k, v, is_causal: v, params, tokens) == 0.0


def test_matmul_flops_count_the_weights_used(params):
    kernels = [x for path, x in jax.tree_util.tree_leaves_with_path(params) if "kernel" in jax.tree_util.keystr(path)]
    assert matmul_flops_per_token(TINY) == 2 * sum(x.size for x in kernels)


def test_bad_config_and_too_long_input_name_the_fix(params):
    with pytest.raises(ValueError, match="layers"):
        Config(layers=0)
    with pytest.raises(ValueError, match="seq_len"):
        GPT(TINY, "xla").apply({"params": params}, jnp.zeros((1, TINY.seq_len + 1), jnp.int32))


def test_named_configs_are_valid_and_small_one_fits_our_kernels():
    from attention_tutorial.train.model import H200, SMALL

    for cfg in (TINY, SMALL, H200):
        assert cfg.warmup_steps >= 1 and 0 < cfg.learning_rate <= 3e-3
    # SMALL is a GPU build's live run: bf16 and a shape every GPU implementation takes (H 64, T a multiple of 128)
    assert SMALL.dtype == "bfloat16" and SMALL.head_dim in (64, 128) and SMALL.seq_len % 128 == 0
    assert SMALL.learning_rate < TINY.learning_rate and SMALL.warmup_steps > TINY.warmup_steps
