"""The GPT: loss at initialisation ≈ ln 256, causal, and its gradients really pass through the attention."""

from __future__ import annotations

import dataclasses
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


def test_without_bias_the_model_has_only_weights_and_computes_the_same_flops(params, tokens):
    plain = dataclasses.replace(TINY, bias=False)
    nobias = init_params(plain, 0)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(nobias)]
    assert not any("bias" in p for p in paths) and any(
        "bias" in jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)
    )
    dropped = sum(x.size for p, x in jax.tree_util.tree_leaves_with_path(params) if "bias" in jax.tree_util.keystr(p))
    assert sum(x.size for x in jax.tree.leaves(params)) - sum(x.size for x in jax.tree.leaves(nobias)) == dropped
    assert matmul_flops_per_token(plain) == matmul_flops_per_token(TINY)  # biases are adds, not matmul FLOPs
    loss = float(loss_fn(GPT(plain, "xla"), nobias, tokens))
    assert abs(loss - math.log(256)) < 0.05, loss


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


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("learning_rate", float("nan"), "learning_rate must be a finite number > 0"),
        ("learning_rate", float("inf"), "learning_rate must be a finite number > 0"),
        ("learning_rate", -1e-3, "learning_rate must be a finite number > 0"),
        ("learning_rate", "1e-3", "learning_rate must be a finite number > 0"),
        ("batch", True, "batch must be an integer >= 1"),
        ("seq_len", 64.0, "seq_len must be an integer >= 1"),
        ("warmup_steps", -1, "warmup_steps must be an integer >= 0"),
        ("weight_decay", float("nan"), "weight_decay must be a finite number >= 0"),
        ("dtype", "int32", "dtype must name a floating type"),
        ("dtype", "no_such_type", "dtype must name a floating type"),
        ("embedding", "scatter", "embedding must be one of"),
        ("vocab", 50_000, "use embedding='gather'"),
        ("bias", 0, "bias must be True or False"),
    ],
)
def test_bad_config_values_name_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        Config(**{field: value})
    assert Config(warmup_steps=0, weight_decay=0.0, vocab=50_000, embedding="gather").warmup_steps == 0


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_onehot_embedding_is_a_lookup_in_values_and_gradients(dtype):
    from attention_tutorial.train.model import onehot_embed

    rng = np.random.default_rng(0)
    with jax.enable_x64(dtype == jnp.float64):
        table = jnp.asarray(rng.standard_normal((256, 16)), dtype)
        tokens = jnp.asarray(rng.integers(0, 256, (4, 64)), jnp.int32)  # many repeats: rows gather several updates
        weight = jnp.asarray(rng.standard_normal((4, 64, 16)), dtype)
        ours = jax.value_and_grad(lambda t: (onehot_embed(t, tokens, dtype) * weight).sum())
        plain = jax.value_and_grad(lambda t: (jnp.take(t, tokens, axis=0) * weight).sum())
        np.testing.assert_array_equal(onehot_embed(table, tokens, dtype), jnp.take(table, tokens, axis=0))
        (v1, g1), (v2, g2) = ours(table), plain(table)
        assert g1.dtype == g2.dtype == dtype
    tol = 1e-6 if dtype == jnp.float32 else 1e-14  # the same sums, added in another order
    np.testing.assert_allclose(g1, g2, rtol=tol, atol=tol)
    assert float(v1) == pytest.approx(float(v2), rel=tol)
    # the check can fail: a token that appears twice collects two rows of the upstream gradient
    counts = np.bincount(np.asarray(tokens).ravel(), minlength=256)
    row = int(np.argmax(counts))
    assert counts[row] > 1
    np.testing.assert_allclose(g1[row], np.asarray(weight)[np.asarray(tokens) == row].sum(0), rtol=1e-5, atol=1e-5)


def test_both_embeddings_train_the_same_model(params, tokens):
    gather = dataclasses.replace(TINY, embedding="gather")
    a = jax.value_and_grad(lambda p: loss_fn(GPT(TINY, "xla"), p, tokens))(params)
    b = jax.value_and_grad(lambda p: loss_fn(GPT(gather, "xla"), p, tokens))(params)
    assert float(a[0]) == float(b[0])  # the same forward values
    for x, y in zip(jax.tree.leaves(a[1]), jax.tree.leaves(b[1])):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def test_token_ids_outside_the_vocabulary_are_refused(params):
    from jax.experimental import checkify

    model, bad = GPT(TINY, "xla"), jnp.full((1, 8), 256, jnp.int32)
    with pytest.raises(ValueError, match=r"\[0, 256\); got ids from 256 to 256"):
        model.apply({"params": params}, bad)
    with pytest.raises(ValueError, match="integer ids"):
        model.apply({"params": params}, bad.astype(jnp.float32))
    # traced under jit: the values are checked when the call runs under checkify
    err, _ = checkify.checkify(jax.jit(lambda p, t: model.apply({"params": p}, t)))(params, bad.at[0, 3].set(-1))
    assert "got ids from -1 to 256" in err.get()
    err, _ = checkify.checkify(jax.jit(lambda p, t: model.apply({"params": p}, t)))(params, bad % 256)
    assert err.get() is None


def test_misshapen_tokens_and_a_config_that_is_none_are_named(params):
    from attention_tutorial.train.loop import step_flops

    with pytest.raises(ValueError, match=r"tokens must be \(B, T\) integer ids; got shape \(8,\)"):
        GPT(TINY, "xla").apply({"params": params}, jnp.zeros((8,), jnp.int32))
    with pytest.raises(ValueError, match=r"tokens must be \(B, T \+ 1\) with T >= 1"):
        loss_fn(GPT(TINY, "xla"), params, jnp.zeros((1, 1), jnp.int32))
    for fn in (matmul_flops_per_token, step_flops):
        with pytest.raises(ValueError, match=r"config must be a train\.model\.Config"):
            fn("tiny")


@pytest.mark.gpu
def test_onehot_gradient_at_the_h200_size_is_exact_products_summed_in_float32():
    """On the GPU, in bfloat16 at the recorded run's size (16k tokens into a 256-row table): the one-hot gradient
    sums exact products in float32, so it matches a float64 sum of the same bfloat16 values to float32 rounding;
    the lookup's scatter-add is no closer."""
    from attention_tutorial.train.model import H200, onehot_embed

    rng = np.random.default_rng(7)
    tokens = rng.integers(0, H200.vocab, (H200.batch, H200.seq_len)).astype(np.int32)
    upstream = jnp.asarray(rng.standard_normal((H200.batch, H200.seq_len, H200.d_model)), jnp.bfloat16)
    table = jnp.asarray(rng.standard_normal((H200.vocab, H200.d_model)) * 0.02, jnp.float32)
    want = np.zeros((H200.vocab, H200.d_model))
    np.add.at(want, tokens.ravel(), np.asarray(upstream, np.float64).reshape(-1, H200.d_model))

    def grad(lookup):  # tokens and upstream as arguments: closed over, XLA would fold the whole sum at compile time
        loss = lambda t, ids, up: (lookup(t, ids) * up).astype(jnp.float32).sum()  # noqa: E731
        return np.asarray(jax.jit(jax.grad(loss))(table, tokens, upstream))

    ours = grad(lambda t, ids: onehot_embed(t, ids, jnp.bfloat16))
    plain = grad(lambda t, ids: jnp.take(t.astype(jnp.bfloat16), ids, axis=0))
    err = {name: np.abs(g - want).max() / np.abs(want).max() for name, g in (("ours", ours), ("plain", plain))}
    assert err["ours"] < 1e-5 and err["ours"] <= err["plain"], err
