"""The masks real models use, expressed through ``jax.nn.dot_product_attention``'s own arguments.

=============  ===========================================================  ==============================
kind           what it means                                                argument
=============  ===========================================================  ==============================
``none``       every query sees every key (or the causal triangle)          ``is_causal``
``padding``    batch rows of different lengths; pad positions are ignored   ``query_seq_lengths``,
                                                                            ``key_value_seq_lengths``
``window``     sliding-window / local attention: the last ``w`` keys only   ``local_window_size=(w, 0|w)``
``dense``      an explicit boolean (B|1, 1, T, S) matrix (here: causal)     ``mask``
``bias``       an additive (1, N, T, S) bias (here: ALiBi's linear slopes)  ``bias``
=============  ===========================================================  ==============================

``mask_args`` builds the arrays for a problem; every kind is checked against the naive reference in the tests.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..inputs import AttentionShape

MASK_KINDS = ("none", "padding", "window", "dense", "bias")
WINDOW = 256


def mask_args(kind: str, shape: AttentionShape, dtype, *, causal: bool = False, window: int = WINDOW,
              seed: int = 0) -> dict:  # fmt: skip
    """The keyword arguments (arrays and static values) that express mask ``kind`` for ``shape``."""
    B, T, S, N = shape.batch, shape.seq_q, shape.seq_kv, shape.heads
    if kind == "none":
        return {}
    if kind == "padding":  # lengths between half and all of the sequence, the first row full
        rng = np.random.default_rng(seed)
        kv = rng.integers(max(1, S // 2), S + 1, size=B)
        kv[0] = S
        q = np.minimum(kv, T) if T == S else np.full(B, T)
        return {"query_seq_lengths": jnp.asarray(q, jnp.int32), "key_value_seq_lengths": jnp.asarray(kv, jnp.int32)}
    if kind == "window":
        return {"local_window_size": (window, 0 if causal else window)}
    if kind == "dense":  # the causal triangle as an explicit matrix: same math as is_causal=True, other kernel
        return {"mask": jnp.tril(jnp.ones((T, S), bool))[None, None]}
    if kind == "bias":  # ALiBi: head n adds -slope_n * (distance between query and key)
        slopes = 2.0 ** (-8.0 * jnp.arange(1, N + 1) / N)
        dist = jnp.abs(jnp.arange(T)[:, None] - jnp.arange(S)[None, :])
        return {"bias": (-slopes[:, None, None] * dist[None]).astype(dtype)[None]}
    raise ValueError(f"unknown mask kind {kind!r}; choose from {MASK_KINDS}.")


def split_static(kwargs: dict) -> tuple[dict, dict]:
    """(array arguments, static arguments): arrays go into a jitted function as inputs, not as constants."""
    arrays = {k: v for k, v in kwargs.items() if isinstance(v, jax.Array)}
    return arrays, {k: v for k, v in kwargs.items() if k not in arrays}
