"""Our Mosaic GPU kernels with masks on a CPU, through Pallas's GPU interpreter: output, lse and gradients against
float64 for any length, head dims between the kernels', packed documents and every mask the kernels take. The slow
suite runs each mask once (dQ by a pass and by atomic adds in turn); the compiled kernels run every mask with every
configuration on a GPU (``test_attention.py``)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import make_qkv
from attention_tutorial.kernels.mosaic import default_config, mosaic_flash_attention
from attention_tutorial.kernels.mosaic.interpret import interpret, why_not

pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


def masked_reference(q, k, v, d_out, kept, *, softcap=None):
    """(out, lse, (dq, dk, dv)) in float64 for a (B, T, S) boolean mask and an optional softcap, from the
    definitions: rows that keep no key give 0 (and lse -inf, no gradient)."""
    q, k, v, d_out = (np.asarray(x.astype(jnp.float32), np.float64) for x in (q, k, v, d_out))
    B, T, N, H = q.shape
    G = N // k.shape[2]
    k, v = np.repeat(k, G, 2), np.repeat(v, G, 2)
    ok = kept[:, None]  # (B, 1, T, S)
    s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(H)
    y = softcap * np.tanh(s / softcap) if softcap else s
    y = np.where(ok, y, -np.inf)
    m = y.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(ok, np.exp(y - m), 0.0)
    den = e.sum(-1, keepdims=True)
    p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
    lse = np.where(den[..., 0] > 0, np.log(np.where(den[..., 0] > 0, den[..., 0], 1.0)) + m[..., 0], -np.inf)
    out = np.einsum("bnts,bsnh->btnh", p, v)
    dp = np.einsum("btnh,bsnh->bnts", d_out, v)
    dy = p * (dp - (dp * p).sum(-1, keepdims=True))
    ds = dy * (1 - np.tanh(s / softcap) ** 2) if softcap else dy
    ds /= np.sqrt(H)
    dq = np.einsum("bnts,bsnh->btnh", ds, k)
    dk = np.einsum("bnts,btnh->bsnh", ds, q)
    dv = np.einsum("bnts,btnh->bsnh", p, d_out)
    fold = lambda x: x.reshape(*x.shape[:2], -1, G, H).sum(3)  # noqa: E731 - GQA: a kv head's query heads
    return out, lse, (dq, fold(dk), fold(dv))


def band(B, T, S, *, d=0, left=None, right=None):
    r, c = np.arange(T)[:, None], np.arange(S)[None, :]
    ok = np.ones((T, S), bool)
    if right is not None:
        ok &= c <= r + d + right
    if left is not None:
        ok &= c >= r + d - left
    return np.broadcast_to(ok, (B, T, S))


def documents(B, L, lengths, seed=0):
    """(B, L) segment ids: documents of the given lengths packed in order, a different shuffle per row."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(B):
        order = rng.permutation(len(lengths))
        ids = np.repeat(np.arange(len(lengths)), np.asarray(lengths)[order])
        rows.append(np.resize(ids, L))
    return np.stack(rows).astype(np.int32)


def check_masked(kwargs, kept, *, B=1, T=256, S=256, N=2, K=1, H=64, config=None, grads=True, seed=0, run=interpret):
    """The masked kernels' output, lse and gradients against :func:`masked_reference`, inside ``run()`` (the
    interpreter; on a GPU, ``contextlib.nullcontext``: the compiled kernels)."""
    q, k, v = make_qkv(B, T, N, H, seq_kv=S, kv_heads=K, dtype=jnp.bfloat16, seed=seed)
    d_out = jnp.asarray(np.random.default_rng(seed + 1).standard_normal(q.shape), jnp.bfloat16)
    fn = functools.partial(mosaic_flash_attention, config=config, return_lse=True, **kwargs)
    out, lse, want_grads = masked_reference(q, k, v, d_out, kept, softcap=kwargs.get("softcap"))
    with run():
        (got, got_lse), vjp = jax.vjp(fn, q, k, v)
        np.testing.assert_allclose(np.asarray(got, np.float64), out, atol=1e-2, rtol=1e-2)
        np.testing.assert_array_equal(np.isinf(np.asarray(got_lse)), np.isinf(lse))  # rows with no key: -inf
        np.testing.assert_allclose(
            np.asarray(got_lse, np.float64)[np.isfinite(lse)], lse[np.isfinite(lse)], atol=1e-3, rtol=1e-3
        )
        if grads:
            got_grads = vjp((d_out, jnp.zeros_like(got_lse)))
            for name, g, w in zip(("dq", "dk", "dv"), got_grads, want_grads):
                np.testing.assert_allclose(np.asarray(g, np.float64), w, atol=3e-2, rtol=3e-2, err_msg=name)


def test_any_length_and_a_single_query_run_without_padding():
    """T = 113 against S = 200: the last tiles are partly filled; and T = 1 (a decoding step), bottom-right."""
    check_masked({}, band(1, 113, 200), T=113, S=200, N=1, K=1)
    check_masked(
        dict(is_causal=True, causal_alignment="bottom_right"),
        band(1, 1, 300, d=299, right=0),
        T=1,
        S=300,
        N=1,
        K=1,
        grads=False,
    )


@pytest.mark.parametrize("grads", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_tile_list_longer_than_one_copy_lands_whole(grads):
    """A decoding step over 10,500 keys: its CTA's tile list (8 + 3 · 84 ints) is longer than the 256 elements one
    copy moves, so it lands in two; the keys past each row's length are masked."""
    lengths = dict(query_seq_lengths=np.asarray([1]), key_value_seq_lengths=np.asarray([10_500]))
    kept = np.arange(10_700)[None, None, :] < 10_500
    check_masked(lengths, kept, T=1, S=10_700, N=1, K=1, grads=grads)


@pytest.mark.parametrize(("H", "grads"), [(96, True), (40, False), pytest.param(192, False, marks=pytest.mark.slow)])
def test_head_dims_between_the_kernels_run_padded_with_zeros(H, grads):
    """H = 40 and 96 run as 64 and 128, H = 192 (forward only) as 256: scaled by their own 1/sqrt(H)."""
    check_masked(dict(is_causal=True), band(1, 200, 200, right=0), T=200, S=200, N=1, K=1, H=H, grads=grads)


def test_packed_documents_with_a_causal_mask_forward_and_backward():
    ids = documents(1, 300, [40, 100, 7, 90, 63])
    kept = (ids[:, :, None] == ids[:, None, :]) & band(1, 300, 300, right=0)
    check_masked(dict(segment_ids=ids, is_causal=True), kept, T=300, S=300)


MASKS = {  # name: (kwargs, kept) for B = 2, T = 320, S = 384
    "causal top-left": (dict(is_causal=True), band(2, 320, 384, right=0)),
    "causal bottom-right": (dict(is_causal=True, causal_alignment="bottom_right"), band(2, 320, 384, d=64, right=0)),
    "sliding window": (dict(is_causal=True, local_window_size=100), band(2, 320, 384, left=100, right=0)),
    "window both sides": (dict(local_window_size=(60, 30)), band(2, 320, 384, left=60, right=30)),
    "prefix-LM": (
        dict(is_causal=True, prefix_length=np.asarray([50, 200], np.int32)),
        band(2, 320, 384, right=0) | (np.arange(384)[None, None, :] < np.asarray([50, 200])[:, None, None]),
    ),
    "lengths": (
        dict(query_seq_lengths=np.asarray([320, 100]), key_value_seq_lengths=np.asarray([200, 384])),
        (np.arange(320)[None, :, None] < np.asarray([320, 100])[:, None, None])
        & (np.arange(384)[None, None, :] < np.asarray([200, 384])[:, None, None]),
    ),
    "softcap, causal": (dict(is_causal=True, softcap=5.0), band(2, 320, 384, right=0)),
}
_docs_q, _docs_kv = documents(2, 320, [64, 200, 33, 23], seed=3), documents(2, 384, [64, 200, 33, 87], seed=3)
MASKS["documents (T != S), window"] = (
    dict(segment_ids=(_docs_q, _docs_kv), local_window_size=(80, 80)),
    (_docs_q[:, :, None] == _docs_kv[:, None, :]) & band(2, 320, 384, left=80, right=80),
)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "dq"), [(name, ("pass", "atomic")[i % 2]) for i, name in enumerate(MASKS)])
def test_every_mask_forward_and_backward_matches_float64(name, dq):
    kwargs, kept = MASKS[name]
    cfg = dataclasses.replace(default_config(64), bwd_dq=dq)
    check_masked(kwargs, kept, B=2, T=320, S=384, config=cfg, seed=len(name))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "schedule"),
    [("causal bottom-right", "rendezvous"), ("documents (T != S), window", "turns"), ("lengths", "turns")],
)
def test_masks_at_h128_and_both_schedules(name, schedule):
    kwargs, kept = MASKS[name]
    cfg = dataclasses.replace(default_config(128), schedule=schedule)
    check_masked(kwargs, kept, B=2, T=320, S=384, H=128, config=cfg, seed=7)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sliding window", "prefix-LM", "softcap, causal", "documents (T != S), window"])
def test_masks_at_h256_where_the_warpgroups_split_the_head_dim(name):
    """A band, a prefix, a softcap and tile lists of packed documents through the H = 256 backward."""
    kwargs, kept = MASKS[name]
    check_masked(kwargs, kept, B=2, T=320, S=384, H=256, config=default_config(256), seed=11)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["causal bottom-right", "window both sides", "documents (T != S), window", "lengths"])
def test_masks_with_dq_split_between_the_warpgroups(name):
    """Both warpgroups walk the union of their tiles and hand dS over: bands, lengths and tile lists."""
    kwargs, kept = MASKS[name]
    cfg = dataclasses.replace(default_config(128), bwd_dq="split")
    check_masked(kwargs, kept, B=2, T=320, S=384, H=128, config=cfg, seed=13)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "H", "block_kv"),
    [("causal bottom-right", 128, 176), ("lengths", 128, 176), ("sliding window", 256, 80)],
)
def test_masks_with_flash_attention_3s_key_tiles(name, H, block_kv):
    """Key tiles of 16 · odd keys (v in 32-byte swizzled tiles): bands and tile lists, S = 384 ending mid-tile.
    (Segment ids need a multiple of 32 keys: their copies move whole 128 bytes.)"""
    kwargs, kept = MASKS[name]
    cfg = dataclasses.replace(default_config(H), block_kv=block_kv)
    check_masked(kwargs, kept, B=2, T=320, S=384, H=H, config=cfg, seed=17)
