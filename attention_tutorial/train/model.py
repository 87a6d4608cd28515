"""A GPT-style causal language model in flax whose attention is any implementation of the registry.

Pre-LayerNorm blocks: x + out(attention(LN(x))), then x + MLP(LN(x)); learned position embeddings; an output
layer of its own (tying it to the embedding would favour repeating the current byte at initialisation; a separate
small-weight head makes every byte about equally likely, loss ≈ ln 256). The attention is called exactly as the
registry calls every implementation, ``fn(q, k, v, is_causal=True)`` on (B, T, N, H) arrays, so swapping "xla"
for "cudnn" or our kernels changes nothing else. Parameters are float32; ``dtype`` is the compute type (bfloat16
on a GPU).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import checkify

from .. import registry
from ..inputs import AttentionShape, check_int, check_number
from .data import VOCAB

EMBEDDINGS = ("onehot", "gather")  # how the token embedding's gradient is formed: see embed
ONEHOT_MAX_VOCAB = 8192  # the one-hot matrix is (B·T, vocab): beyond this, use "gather"


@dataclass(frozen=True)
class Config:
    """Model and optimiser sizes. ``heads`` × ``head_dim`` is the attention width (usually ``d_model``)."""

    layers: int = 2
    d_model: int = 64
    heads: int = 4
    head_dim: int = 16
    seq_len: int = 64  # T
    batch: int = 4  # B
    dtype: str = "float32"
    learning_rate: float = 3e-3
    warmup_steps: int = 2
    weight_decay: float = 0.1
    vocab: int = VOCAB
    embedding: str = "onehot"  # the token embedding's gradient: a one-hot matmul ("onehot") or a scatter ("gather")
    bias: bool = True  # biases in the projections, the MLP and the layer norms (GPT-2's); False: none (as nanoGPT's)

    def __post_init__(self):
        for name in ("layers", "d_model", "heads", "head_dim", "seq_len", "batch", "vocab"):
            check_int(f"Config.{name}", getattr(self, name), minimum=1)
        check_int("Config.warmup_steps", self.warmup_steps, minimum=0, example="30")
        check_number("Config.learning_rate", self.learning_rate, positive=True, example="1e-3")
        check_number("Config.weight_decay", self.weight_decay, non_negative=True, example="0.1")
        try:
            floating = isinstance(self.dtype, str) and jnp.issubdtype(jnp.dtype(self.dtype), jnp.floating)
        except TypeError:
            floating = False
        if not floating:
            raise ValueError(
                f"Config.dtype must name a floating type, e.g. 'bfloat16' or 'float32'; got {self.dtype!r}."
            )
        if not isinstance(self.bias, bool):
            raise ValueError(f"Config.bias must be True or False; got {self.bias!r}.")
        if self.embedding not in EMBEDDINGS:
            raise ValueError(f"Config.embedding must be one of {EMBEDDINGS}; got {self.embedding!r}.")
        if self.embedding == "onehot" and self.vocab > ONEHOT_MAX_VOCAB:
            raise ValueError(
                f"Config.embedding='onehot' builds a (batch·seq_len, vocab) matrix; vocab={self.vocab} is over "
                f"{ONEHOT_MAX_VOCAB}: use embedding='gather'."
            )

    def fields(self) -> dict:
        """The config as record fields."""
        return dataclasses.asdict(self)

    def attention_shape(self) -> AttentionShape:
        """The attention problem each layer solves: (B, T = S, N = K, H), causal in the model."""
        return AttentionShape(self.batch, self.seq_len, self.seq_len, self.heads, self.heads, self.head_dim)


TINY = Config()  # seconds on a CPU
# a GPU build's live run: seconds on an H200; TINY's learning rate and warm-up made its loss spike at step 7–9 on the
# H200 (bf16), where the implementations' curves then parted
SMALL = Config(
    layers=2,
    d_model=256,
    heads=4,
    head_dim=64,
    seq_len=512,
    batch=8,
    dtype="bfloat16",
    learning_rate=1e-3,
    warmup_steps=15,
)
H200 = Config(
    layers=6,
    d_model=768,
    heads=6,
    head_dim=128,
    seq_len=2048,
    batch=8,
    dtype="bfloat16",
    learning_rate=1e-3,
    warmup_steps=30,
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def onehot_embed(table, tokens, dtype):
    """``table[tokens]`` in ``dtype``: table (V, D), tokens (B, T) ints -> (B, T, D), the same values as a lookup.

    Its gradient is a matrix product, one_hot(tokens)ᵀ · g: (V, B·T) · (B·T, D), exact products accumulated in
    float32 on the tensor cores. A lookup's own gradient is a scatter-add of B·T rows into V: with V = 256 and
    B·T = 16k, about 64 updates land on each row, and the GPU serialises them (atomics on the same addresses).
    """
    return jnp.take(table, tokens, axis=0).astype(dtype)


def _onehot_fwd(table, tokens, dtype):
    return onehot_embed(table, tokens, dtype), (table, tokens)


def _onehot_bwd(dtype, res, g):
    table, tokens = res
    onehot = jax.nn.one_hot(tokens, table.shape[0], dtype=g.dtype)  # (B, T, V): 0 and 1 are exact in any dtype
    grad = jnp.einsum("btv,btd->vd", onehot, g, preferred_element_type=jnp.promote_types(g.dtype, jnp.float32))
    return grad.astype(table.dtype), None


onehot_embed.defvjp(_onehot_fwd, _onehot_bwd)


def check_tokens(tokens, vocab: int) -> None:
    """Refuse token ids outside [0, vocab): a lookup would return NaN rows (a one-hot row of zeros) and train on
    them. Checked at once for concrete ids; traced under ``jit`` only under ``jax.experimental.checkify``."""
    if not jnp.issubdtype(jnp.result_type(tokens), jnp.integer):
        raise ValueError(f"tokens must be integer ids; got dtype {jnp.result_type(tokens)}. Cast with .astype(int32).")
    if isinstance(tokens, jax.core.Tracer):
        checkify.debug_check(
            jnp.all((tokens >= 0) & (tokens < vocab)),
            f"token ids must lie in [0, vocab) = [0, {vocab}); got ids from {{lo}} to {{hi}}.",
            lo=jnp.min(tokens),
            hi=jnp.max(tokens),
        )
        return
    lo, hi = int(jnp.min(tokens)), int(jnp.max(tokens))
    if lo < 0 or hi >= vocab:
        raise ValueError(
            f"token ids must lie in [0, vocab) = [0, {vocab}); got ids from {lo} to {hi}. Map them into the "
            "vocabulary, or build the model with Config(vocab=...) large enough."
        )


class Embed(nn.Module):
    """Token embedding (vocab, d_model): a lookup whose gradient is ``Config.embedding``'s ("onehot": see
    :func:`onehot_embed`; "gather": the lookup's own scatter-add, as ``flax.linen.Embed``)."""

    config: Config

    @nn.compact
    def __call__(self, tokens):
        c = self.config
        table = self.param("embedding", nn.initializers.normal(0.02), (c.vocab, c.d_model))
        if c.embedding == "onehot":
            return onehot_embed(table, tokens, jnp.dtype(c.dtype))
        return jnp.take(table.astype(c.dtype), tokens, axis=0)


def attention_fn(attention: str | Callable) -> Callable:
    """A registry name's callable (``fn(q, k, v, is_causal=...)``), or ``attention`` itself if callable."""
    return attention if callable(attention) else registry.get(attention).fn


class Block(nn.Module):
    """One transformer block: causal self-attention and an MLP, each pre-normalised with a residual."""

    config: Config
    attention: Callable

    @nn.compact
    def __call__(self, x, segment_ids=None):
        c, dt = self.config, jnp.dtype(self.config.dtype)
        init = nn.initializers.normal(0.02)
        proj_init = nn.initializers.normal(0.02 / (2 * c.layers) ** 0.5)  # residual projections, GPT-2 style
        b = c.bias
        h = nn.LayerNorm(dtype=dt, use_bias=b, name="ln_attn")(x)
        qkv = nn.DenseGeneral((3, c.heads, c.head_dim), use_bias=b, dtype=dt, kernel_init=init, name="qkv")(
            h
        )  # (B,T,3,N,H)
        docs = {} if segment_ids is None else {"segment_ids": segment_ids}  # packed documents: each sees itself
        out = self.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], is_causal=True, **docs)  # (B, T, N, H)
        x = x + nn.DenseGeneral(c.d_model, axis=(-2, -1), use_bias=b, dtype=dt, kernel_init=proj_init, name="out")(out)
        h = nn.LayerNorm(dtype=dt, use_bias=b, name="ln_mlp")(x)
        h = nn.gelu(nn.Dense(4 * c.d_model, use_bias=b, dtype=dt, kernel_init=init, name="up")(h))
        return x + nn.Dense(c.d_model, use_bias=b, dtype=dt, kernel_init=proj_init, name="down")(h)


class GPT(nn.Module):
    """Byte tokens (B, T) -> next-token logits (B, T, vocab), float32."""

    config: Config
    attention: str | Callable = "xla"

    @nn.compact
    def __call__(self, tokens, segment_ids=None):
        """``segment_ids`` (B, T) integers, or None: documents packed into each row, each attending to itself
        only (the attention must take ``segment_ids=``, as our kernel and ``kernels.fused`` do) and counting its
        positions from 0, so a document packed in a row gives the logits it would give alone."""
        c, dt = self.config, jnp.dtype(self.config.dtype)
        if jnp.ndim(tokens) != 2:
            raise ValueError(
                f"tokens must be (B, T) integer ids; got shape {jnp.shape(tokens)}. Add a batch axis: x[None]."
            )
        B, T = tokens.shape
        if T > c.seq_len:
            raise ValueError(f"tokens have T={T} positions; the model was built for at most seq_len={c.seq_len}.")
        check_tokens(tokens, c.vocab)
        pos = self.param("pos", nn.initializers.normal(0.02), (c.seq_len, c.d_model))
        if segment_ids is not None and jnp.shape(segment_ids) != (B, T):
            raise ValueError(f"segment_ids must be (B, T) = {(B, T)} like tokens; got {jnp.shape(segment_ids)}.")
        at = jnp.arange(T) if segment_ids is None else document_positions(segment_ids)  # (T,) or (B, T)
        x = (Embed(c, name="embed")(tokens) + pos[at].astype(dt)).astype(dt)
        fn = attention_fn(self.attention)
        for i in range(c.layers):
            x = Block(c, fn, name=f"block{i}")(x, segment_ids)
        x = nn.LayerNorm(dtype=dt, use_bias=c.bias, name="ln_out")(x)
        head = nn.Dense(c.vocab, use_bias=False, dtype=dt, kernel_init=nn.initializers.normal(0.02), name="head")
        return head(x).astype(jnp.float32)


def document_positions(segment_ids):
    """(B, T) each byte's position in its own document: 0 where the segment id changes, counting up until the next
    change."""
    ids = jnp.asarray(segment_ids)
    T = ids.shape[-1]
    first = jnp.concatenate([jnp.ones_like(ids[:, :1], bool), ids[:, 1:] != ids[:, :-1]], axis=1)
    starts = jax.lax.cummax(jnp.where(first, jnp.arange(T), 0), axis=1)  # where each byte's document began
    return jnp.arange(T) - starts


def matmul_flops_per_token(config: Config) -> float:
    """Forward FLOPs per token of the model's matrix products, attention scores excluded: 2 per weight used."""
    if not isinstance(config, Config):
        raise ValueError(f"config must be a train.model.Config (e.g. TINY); got {type(config).__name__}.")
    c = config
    attn = c.heads * c.head_dim
    per_layer = c.d_model * 3 * attn + attn * c.d_model + 2 * c.d_model * 4 * c.d_model
    return 2.0 * (c.layers * per_layer + c.d_model * c.vocab)
