"""The kernels' masks: tile states and band steps against a brute-force reading of the element mask, written here
from the definitions; the arguments' checks."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_tutorial.kernels.mosaic import masks as M


def truth(B, T, S, *, d=0, left=None, right=None, prefix=None, qseg=None, kseg=None, qlen=None, kvlen=None):
    """(B, T, S) kept scores, straight from the definitions."""
    r, c = np.arange(T)[:, None], np.arange(S)[None, :]
    out = np.ones((B, T, S), bool)
    for b in range(B):
        band = np.ones((T, S), bool)
        if right is not None:
            band &= c <= r + d + right
        if left is not None:
            band &= c >= r + d - left
        if prefix is not None and (left is not None or right is not None):
            band |= c < prefix[b]
        ok = band
        if qlen is not None:
            ok = ok & (r < qlen[b]) & (c < kvlen[b])
        if qseg is not None:
            ok = ok & (qseg[b][:, None] == kseg[b][None, :])
        out[b] = ok
    return out


def brute_states(kept, bq, bk):
    """(B, query tiles, key tiles): FULL where every score of the tile is kept (key columns past S never are),
    EMPTY where none is, rows past T ignored."""
    B, T, S = kept.shape
    nq, nk = -(-T // bq), -(-S // bk)
    pad = np.zeros((B, T, nk * bk), bool)
    pad[:, :, :S] = kept
    out = np.zeros((B, nq, nk), int)
    for i in range(nq):
        rows = pad[:, i * bq : min((i + 1) * bq, T)]
        for j in range(nk):
            tile = rows[:, :, j * bk : (j + 1) * bk]
            out[:, i, j] = np.where(tile.all((1, 2)), M.FULL, np.where(tile.any((1, 2)), M.PARTIAL, M.EMPTY))
    return out


bands = st.tuples(
    st.one_of(st.none(), st.integers(0, 300)),  # left
    st.one_of(st.none(), st.integers(0, 300)),  # right (causal: 0)
    st.sampled_from(["top_left", "bottom_right"]),
)


@given(T=st.integers(1, 400), S=st.integers(1, 400), band=bands, bk=st.sampled_from([64, 128]))
def test_band_steps_match_the_brute_force_states(T, S, band, bk):
    left, right, align = band
    d = S - T if align == "bottom_right" else 0
    mask = M.Mask(T, S, d, left, right)
    want = brute_states(truth(1, T, S, d=d, left=left, right=right), 64, bk)[0]
    for i in range(want.shape[0]):
        lo, full_lo, full_hi, hi = (int(x) for x in M.band_steps(mask, i * 64, 64, bk))
        got = np.full(want.shape[1], M.EMPTY)
        got[lo:hi] = M.PARTIAL
        got[full_lo:full_hi] = M.FULL
        assert lo <= full_lo <= full_hi <= hi
        # every kept score is visited; no tile is called full that is not; empty tiles may be visited masked only
        # where the band's bounds cannot tell (never: the band is exact)
        np.testing.assert_array_equal(got, want[i], err_msg=f"row tile {i}")


@given(
    T=st.integers(1, 300),
    S=st.integers(1, 300),
    docs=st.lists(st.integers(1, 120), min_size=1, max_size=6),
    causal=st.booleans(),
    prefix=st.one_of(st.none(), st.integers(0, 300)),
    lengths=st.booleans(),
)
def test_tile_grid_is_exact_for_packed_documents_and_safe_always(T, S, docs, causal, prefix, lengths):
    B = 2
    ids = np.repeat(np.arange(len(docs)), docs)
    qseg = np.stack([np.resize(ids, T), np.resize(ids[::-1], T)]).astype(np.int32)
    kseg = np.stack([np.resize(ids, S), np.resize(ids[::-1], S)]).astype(np.int32)
    rng = np.random.default_rng(T * S)
    qlen, kvlen = rng.integers(0, T + 1, B), rng.integers(0, S + 1, B)
    args = dict(segment_ids=(qseg, kseg), is_causal=causal)
    if prefix is not None and causal:
        args["prefix_length"] = min(prefix, S)
    if lengths:
        args.update(query_seq_lengths=qlen, key_value_seq_lengths=kvlen)
    mask, arrays = M.make_mask(B, T, S, **args)
    want_kept = truth(
        B,
        T,
        S,
        right=0 if causal else None,
        prefix=None if "prefix_length" not in args else [args["prefix_length"]] * B,
        qseg=qseg,
        kseg=kseg,
        qlen=qlen if lengths else None,
        kvlen=kvlen if lengths else None,
    )
    np.testing.assert_array_equal(M.dense(mask, arrays, B), want_kept)
    want = brute_states(want_kept, 64, 64)
    got = np.asarray(M.tile_grid(mask, arrays, block_q=64, block_kv=64))
    sorted_ids = np.all(np.diff(qseg[0]) >= 0) and np.all(np.diff(kseg[0]) >= 0)
    assert not ((got == M.EMPTY) & (want != M.EMPTY)).any(), "a tile with kept scores was skipped"
    assert not ((got == M.FULL) & (want != M.FULL)).any(), "a tile with masked scores was called full"
    if sorted_ids and not (causal or lengths):  # segments alone, in order in batch row 0: exact there
        np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("n", [1, 4, 5, 8, 9, 83, 84, 100])
def test_a_tile_list_lands_in_copies_of_whole_128_byte_rows(n):
    """Mosaic GPU copies into shared memory a multiple of 128 bytes (one per thread of a warpgroup), at most 256
    elements each: the list is padded with zeros to a whole number of those, and its copies cover it exactly."""
    padded = M.padded_tiles(n)
    length = M.list_length(padded)
    assert length >= M.HEADER + 3 * padded and length % 32 == 0
    copies = M.list_copies(padded)
    assert all(size % 32 == 0 and 0 < size <= M.COPY_LIMIT for _, size in copies)
    assert [start for start, _ in copies] == list(range(0, length, M.COPY_LIMIT)) and sum(
        s for _, s in copies
    ) == length
    states = jnp.full((1, 1, 2, n), M.FULL, jnp.int32)
    row = np.asarray(M.tile_lists(states, M.MaskArrays(), padded=padded))[0, 0]
    assert row.shape == (length,) and not row[M.HEADER + 3 * padded :].any()


def test_tile_lists_put_full_tiles_first_then_the_partial_ones():
    # one CTA, five key tiles: warpgroup 0's states, then warpgroup 1's
    states = jnp.asarray([[[[2, 1, 0, 0, 2], [2, 2, 1, 0, 2]]]], jnp.int32)
    arrays = M.MaskArrays(prefix=jnp.asarray([7], jnp.int32))
    row = np.asarray(M.tile_lists(states, arrays, padded=8))[0, 0]
    assert row.shape == (M.HEADER + 3 * 8,) == (M.list_length(8),)
    n_full, n_total, prefix = row[:3]
    tiles, s0, s1 = row[8:16], row[16:24], row[24:32]
    assert (n_full, n_total, prefix) == (2, 4, 7)  # tile 3 is empty for both: not visited
    np.testing.assert_array_equal(tiles[:4], [0, 4, 1, 2])  # full for both in key order, then the partial ones
    np.testing.assert_array_equal(s0[:4], [2, 2, 1, 0])
    np.testing.assert_array_equal(s1[:4], [2, 2, 2, 1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(segment_ids=np.zeros((2, 5), np.int32)), r"query ids must be integers of shape \(B, T\) = \(2, 8\)"),
        (dict(segment_ids=np.zeros((2, 8), np.float32)), "must be integers"),
        (dict(segment_ids=(np.zeros((2, 8), np.int32),)), "one \\(B, T\\) array or a pair"),
        (dict(prefix_length=9), r"prefix_length must lie in \[0, 8\]"),
        (dict(prefix_length=np.zeros(3, np.int32)), r"\(B,\) = \(2,\) integers"),
        (dict(softcap=0.0), "softcap must be a positive number"),
        (dict(softcap=True), "softcap must be a positive number"),
        (dict(causal_alignment="bottom"), "causal_alignment"),
        (dict(local_window_size=-1), "local_window_size"),
        (dict(is_causal=1), "is_causal"),
    ],
)
def test_bad_mask_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        M.make_mask(2, 8, 8, **kwargs)


def test_the_plain_masks_are_the_kernels_original_paths():
    assert M.make_mask(1, 256, 256)[0].plain(64, 128)
    assert M.make_mask(1, 256, 512, is_causal=True)[0].plain(64, 128)
    assert not M.make_mask(1, 256, 512, is_causal=True, causal_alignment="bottom_right")[0].plain(64, 128)
    assert not M.make_mask(1, 250, 256)[0].plain(64, 128)  # a ragged last query tile
    assert not M.make_mask(1, 256, 256, softcap=30.0)[0].plain(64, 128)
    window = M.make_mask(1, 256, 256, is_causal=True, local_window_size=(100, 50))[0]
    assert (window.left, window.right) == (100, 0)  # causal caps the window's right side
