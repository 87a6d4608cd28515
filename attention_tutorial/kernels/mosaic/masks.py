"""Which scores a query keeps, as our Mosaic GPU kernels see it: one static spec (:class:`Mask`), the per-row
arrays it needs (:class:`MaskArrays`), which key tiles each warpgroup computes in full, masks or skips, and the
element mask of a tile that needs one.

Every mask here is a predicate on (query row r, key column c) of batch row b::

    band      r + d − left ≤ c ≤ r + d + right       causal: right = 0; d = 0 top-left, d = S − T bottom-right
    prefix    c < prefix[b]                          prefix-LM: every query sees the prefix
    segments  q_segment[b, r] == kv_segment[b, c]    packed documents: a query sees its own document only
    lengths   r < q_len[b] and c < kv_len[b]         padded batch rows
    ends      c < S                                  a ragged last key tile (rows ≥ T are computed, never stored)

    kept(r, c) = (band or prefix) and segments and lengths and ends

A row that keeps no key gets output 0 and log-sum-exp −inf. Tiles are classified once, outside the kernel:
*full* (every score kept: no mask is built), *partial* (the element mask is built) or *empty* (skipped: no
matmul, no exponential). A band alone is classified by arithmetic inside the kernel (:func:`band_steps`); the
masks with per-row arrays get per-CTA lists of the key tiles to visit, full ones first (:func:`tile_lists`), as
splash attention's mask info and FlexAttention's block mask do.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..masks import segment_pair

EMPTY, PARTIAL, FULL = 0, 1, 2  # a tile's state for one warpgroup
HEADER = 8  # ints before a CTA's tile list: n_full, n_total, prefix, q_len, kv_len, and padding to 32 bytes


@dataclasses.dataclass(frozen=True)
class Mask:
    """The static part of a mask (hashable: part of the kernels' compiled shape). ``left``/``right`` None: the band
    is unbounded on that side; ``prefix``, ``segments``, ``lengths``: those arrays come with the call
    (:class:`MaskArrays`). ``softcap``: scores become ``softcap · tanh(score / softcap)`` (after the softmax scale)."""

    seq_q: int
    seq_kv: int
    diagonal: int = 0
    left: int | None = None
    right: int | None = None
    prefix: bool = False
    segments: bool = False
    lengths: bool = False
    softcap: float | None = None

    @property
    def causal(self) -> bool:
        return self.right is not None and self.right <= 0

    @property
    def has_arrays(self) -> bool:
        """Whether the tiles depend on per-row arrays (then the kernels walk per-CTA tile lists)."""
        return self.prefix or self.segments or self.lengths

    @property
    def banded(self) -> bool:
        return self.left is not None or self.right is not None

    def ragged(self, block_q: int, block_kv: int) -> bool:
        """Whether T or S leaves a partly filled last tile for these tiles (2·block_q query rows per CTA)."""
        return bool(self.seq_q % (2 * block_q) or self.seq_kv % block_kv)

    def plain(self, block_q: int, block_kv: int) -> bool:
        """No mask at all, or the top-left causal mask, on whole tiles: the kernels' original paths."""
        return (
            not self.has_arrays
            and self.left is None
            and self.right in (None, 0)
            and self.diagonal == 0
            and self.softcap is None
            and not self.ragged(block_q, block_kv)
        )

    @property
    def rows_can_be_empty(self) -> bool:
        """Whether some query row may keep no key (its output then needs a guard against 0 / 0)."""
        band_empty = self.left is not None or (self.right is not None and self.diagonal + self.right < 0)
        return band_empty or self.segments or self.lengths

    def transposed(self) -> Mask:
        """The band seen from the keys (rows: keys, columns: queries), for the kernels that own key tiles: key c
        keeps query r when c − d − right ≤ r ≤ c − d + left. Band masks only (the arrays' masks walk tile lists)."""
        if self.has_arrays:
            raise ValueError("transposed() is for band masks; masks with per-row arrays walk tile lists.")
        return dataclasses.replace(
            self, seq_q=self.seq_kv, seq_kv=self.seq_q, diagonal=-self.diagonal, left=self.right, right=self.left
        )


class MaskArrays(NamedTuple):
    """The per-row arrays of a mask (each None when not used): segment ids (B, T) and (B, S) int32, prefix
    lengths (B,), query and key lengths (B,)."""

    q_segment: jax.Array | None = None
    kv_segment: jax.Array | None = None
    prefix: jax.Array | None = None
    q_len: jax.Array | None = None
    kv_len: jax.Array | None = None


# --- building and checking a mask ------------------------------------------------------------------------------


def make_mask(
    batch: int,
    seq_q: int,
    seq_kv: int,
    *,
    is_causal=False,
    causal_alignment="top_left",
    local_window_size=None,
    segment_ids=None,
    prefix_length=None,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    softcap=None,
) -> tuple[Mask, MaskArrays]:
    """The kernels' mask from the public arguments (see :func:`~attention_tutorial.kernels.mosaic.
    mosaic_flash_attention`), each checked with an error that names it."""
    from ...inputs import check_flag
    from ..masks import _check_alignment, _lengths, _window

    causal = check_flag("is_causal", is_causal)
    diagonal = seq_kv - seq_q if _check_alignment(causal_alignment) == "bottom_right" else 0
    left = right = None
    if local_window_size is not None:
        left, right = _window(local_window_size)
    if causal:
        right = 0 if right is None else min(right, 0)
    arrays = MaskArrays(
        *segment_pair(segment_ids, batch, seq_q, seq_kv),
        prefix=_per_row("prefix_length", prefix_length, batch, seq_kv),
        q_len=None if query_seq_lengths is None else _lengths("query_seq_lengths", query_seq_lengths, batch, seq_q, 0),
        kv_len=None
        if key_value_seq_lengths is None
        else _lengths("key_value_seq_lengths", key_value_seq_lengths, batch, seq_kv, 0),
    )
    if arrays.q_len is not None or arrays.kv_len is not None:  # one flag: both are passed, the missing one full
        arrays = arrays._replace(
            q_len=jnp.full((batch,), seq_q, jnp.int32) if arrays.q_len is None else arrays.q_len.astype(jnp.int32),
            kv_len=jnp.full((batch,), seq_kv, jnp.int32) if arrays.kv_len is None else arrays.kv_len.astype(jnp.int32),
        )
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or not 0 < softcap < float("inf"):
            raise ValueError(
                f"softcap must be a positive number (scores become softcap·tanh(score/softcap)) or None; "
                f"got {softcap!r}."
            )
        softcap = float(softcap)
    mask = Mask(
        seq_q,
        seq_kv,
        diagonal,
        left,
        right,
        prefix=arrays.prefix is not None,
        segments=arrays.q_segment is not None,
        lengths=arrays.q_len is not None,
        softcap=softcap,
    )
    return mask, arrays


def _per_row(name, x, B, limit):
    """A per-batch-row count in [0, limit]: an int for every row, or (B,) integers."""
    if x is None:
        return None
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        if not 0 <= x <= limit:
            raise ValueError(f"{name} must lie in [0, {limit}]; got {x}.")
        return jnp.full((B,), int(x), jnp.int32)
    x = jnp.asarray(x)
    if x.shape != (B,) or not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{name} must be an int or (B,) = ({B},) integers; got {x.dtype} {x.shape}.")
    return jnp.clip(x.astype(jnp.int32), 0, limit)


# --- a band, by arithmetic inside the kernel --------------------------------------------------------------------


class BandSteps(NamedTuple):
    """Key tiles of one warpgroup under a band mask: [lo, full_lo) masked, [full_lo, full_hi) full, [full_hi, hi)
    masked; tiles outside [lo, hi) are empty for it."""

    lo: jax.Array
    full_lo: jax.Array
    full_hi: jax.Array
    hi: jax.Array


def band_steps(mask: Mask, row0, rows: int, block: int) -> BandSteps:
    """The :class:`BandSteps` of a warpgroup whose ``rows`` query rows start at ``row0`` (traced int32), for key
    tiles of ``block`` keys. Rows at or past T count for nothing (a warpgroup wholly past T gets no tiles)."""
    i32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    n = -(-mask.seq_kv // block)
    row0 = i32(row0)
    last = jnp.minimum(row0 + rows, mask.seq_q) - 1  # the last row that counts
    d = mask.diagonal
    if mask.left is None:
        lo = i32(0)
    else:  # the tile of the first key kept (none past S)
        first = jnp.maximum(row0 + (d - mask.left), 0)
        lo = jnp.where(first < mask.seq_kv, lax.div(first, i32(block)), n)
    if mask.right is None:
        hi = i32(n)
    else:
        hi = jnp.clip(lax.div(jnp.maximum(last + (d + mask.right + block), 0), i32(block)), lo, n)
    if mask.left is None:
        full_lo = lo
    else:
        full_lo = jnp.clip(lax.div(jnp.maximum(last + (d - mask.left + block - 1), 0), i32(block)), lo, hi)
    whole = mask.seq_kv // block  # tiles wholly inside S
    if mask.right is None:
        full_hi = jnp.clip(i32(whole), full_lo, hi)
    else:
        full_hi = jnp.clip(lax.div(jnp.maximum(row0 + (d + mask.right + 1), 0), i32(block)), full_lo, hi)
        full_hi = jnp.minimum(full_hi, whole) if whole < n else full_hi
        full_hi = jnp.maximum(full_hi, full_lo)
    if mask.seq_q % rows:  # a warpgroup wholly past T computes nothing
        hi = jnp.where(row0 < mask.seq_q, hi, lo)
        full_lo, full_hi = jnp.minimum(full_lo, hi), jnp.minimum(full_hi, hi)
    return BandSteps(lo, full_lo, full_hi, hi)


# --- masks with per-row arrays: per-CTA tile lists --------------------------------------------------------------


def tile_grid(mask: Mask, arrays: MaskArrays, *, block_q: int, block_kv: int) -> jax.Array:
    """(B, query tiles, key tiles) int32 (B = 1 for a band alone): each tile's state (EMPTY, PARTIAL, FULL), from
    bounds on its rows and columns (exact for a band, prefix and lengths; for segments exact when each batch row's
    ids are sorted, as packed documents are, and safe otherwise: a tile it cannot prove empty or full is partial).
    Query rows past T count for nothing; key columns past S make a tile partial."""
    B = _batch(arrays)
    T, S = mask.seq_q, mask.seq_kv
    n_rows, n_cols = -(-T // block_q), -(-S // block_kv)
    r0 = jnp.arange(n_rows, dtype=jnp.int32)[:, None] * block_q  # (row tiles, 1)
    r1 = jnp.minimum(r0 + block_q, T) - 1  # last row that counts
    c0 = jnp.arange(n_cols, dtype=jnp.int32)[None, :] * block_kv  # (1, key tiles)
    c1 = jnp.minimum(c0 + block_kv, S) - 1
    full = jnp.broadcast_to(c0 + block_kv <= S, (B, n_rows, n_cols))  # a ragged last tile is partial
    empty = jnp.zeros((B, n_rows, n_cols), bool)
    d = mask.diagonal
    band_full, band_empty = jnp.ones((n_rows, n_cols), bool), jnp.zeros((n_rows, n_cols), bool)
    if mask.right is not None:
        band_full &= c1 <= r0 + d + mask.right
        band_empty |= c0 > r1 + d + mask.right
    if mask.left is not None:
        band_full &= c0 >= r1 + d - mask.left
        band_empty |= c1 < r0 + d - mask.left
    band_full, band_empty = band_full[None], band_empty[None]
    if arrays.prefix is not None:
        p = arrays.prefix[:, None, None]
        band_full, band_empty = band_full | (c1[None] < p), band_empty & (c0[None] >= p)
    full &= band_full
    empty |= band_empty
    if arrays.q_len is not None:
        ql, kl = arrays.q_len[:, None, None], arrays.kv_len[:, None, None]
        full &= (r1[None] < ql) & (c1[None] < kl)
        empty |= (r0[None] >= ql) | (c0[None] >= kl)
    if arrays.q_segment is not None:
        q_lo, q_hi = _tile_range(arrays.q_segment, block_q, n_rows)  # (B, row tiles)
        k_lo, k_hi = _tile_range(arrays.kv_segment, block_kv, n_cols)  # (B, key tiles)
        q_lo, q_hi, k_lo, k_hi = q_lo[:, :, None], q_hi[:, :, None], k_lo[:, None, :], k_hi[:, None, :]
        full &= (q_lo == q_hi) & (k_lo == k_hi) & (q_lo == k_lo)
        empty |= (q_hi < k_lo) | (k_hi < q_lo)
    return jnp.where(empty, EMPTY, jnp.where(full, FULL, PARTIAL)).astype(jnp.int32)


def by_cta(grid: jax.Array, *, shared: bool = False) -> jax.Array:
    """(B, owner tiles, visited tiles) -> (B, CTAs, 2, visited tiles): a CTA's two compute warpgroups own two
    consecutive tiles (a missing last one sees nothing), or with ``shared`` both the same one."""
    if shared:
        return jnp.stack([grid, grid], axis=2)
    B, n, m = grid.shape
    grid = jnp.pad(grid, ((0, 0), (0, n % 2), (0, 0)))
    return grid.reshape(B, (n + n % 2) // 2, 2, m)


def _tile_range(ids, block, n):
    """Per tile of ``block`` positions: the least and largest id in it (the last tile: its positions only)."""
    B, L = ids.shape
    pad = n * block - L
    lo = jnp.pad(ids, ((0, 0), (0, pad)), constant_values=jnp.iinfo(jnp.int32).max).reshape(B, n, block).min(-1)
    hi = jnp.pad(ids, ((0, 0), (0, pad)), constant_values=jnp.iinfo(jnp.int32).min).reshape(B, n, block).max(-1)
    return lo, hi


def tile_lists(states: jax.Array, arrays: MaskArrays, *, padded: int) -> jax.Array:
    """Per CTA, the key tiles to visit, packed into one int32 row (one copy into shared memory):
    ``[n_full, n_total, prefix, q_len, kv_len, 0, 0, 0, tiles[padded], state0[padded], state1[padded], 0...]``
    (zeros up to :func:`list_length`). Tiles full for both warpgroups come first (``n_full`` of them: no mask is
    built), then those partial for either (each warpgroup's state says whether it masks or skips), in key order
    within each group; ``padded`` ≥ the key tiles, a multiple of 4."""
    B, C, _, n = states.shape
    both_full = (states == FULL).all(axis=2)  # (B, C, n)
    any_kept = (states != EMPTY).any(axis=2)
    rank = jnp.where(both_full, 0, jnp.where(any_kept, 1, 2))  # full first, then partial, empty last
    order = jnp.argsort(rank * n + jnp.arange(n, dtype=jnp.int32), axis=-1).astype(jnp.int32)  # (B, C, n)
    n_full, n_total = both_full.sum(-1, dtype=jnp.int32), any_kept.sum(-1, dtype=jnp.int32)
    per_wg = jnp.take_along_axis(states, order[:, :, None, :], axis=-1)  # (B, C, 2, n)

    def fill(x):
        return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, padded - n)])

    def per_row(x, default):
        return jnp.full((B,), default, jnp.int32) if x is None else x.astype(jnp.int32)

    head = jnp.stack(
        [
            n_full,
            n_total,
            *(jnp.broadcast_to(per_row(x, 0)[:, None], (B, C)) for x in (arrays.prefix, arrays.q_len, arrays.kv_len)),
            *(jnp.zeros((B, C), jnp.int32),) * 3,
        ],
        axis=-1,
    )
    row = jnp.concatenate([head, fill(order), fill(per_wg[:, :, 0]), fill(per_wg[:, :, 1])], axis=-1)
    return jnp.pad(row, [(0, 0), (0, 0), (0, list_length(padded) - row.shape[-1])])


COPY_LIMIT = 256  # a TMA copy moves at most 256 elements along each axis
COPY_QUANTUM = 32  # int32s: Mosaic GPU's copies into shared memory move a multiple of 128 bytes (one per thread)


def list_length(padded: int) -> int:
    """The int32s of one CTA's tile list (see :func:`tile_lists`), rounded up to a whole :data:`COPY_QUANTUM`."""
    return -(-(HEADER + 3 * padded) // COPY_QUANTUM) * COPY_QUANTUM


def list_copies(padded: int) -> tuple[tuple[int, int], ...]:
    """(start, size) of the copies that bring one CTA's tile list into shared memory, each at most
    :data:`COPY_LIMIT` long and a multiple of :data:`COPY_QUANTUM`, so a list of any length lands; its barrier
    expects one arrival per copy."""
    n = list_length(padded)
    return tuple((start, min(COPY_LIMIT, n - start)) for start in range(0, n, COPY_LIMIT))


def padded_tiles(n: int) -> int:
    """Key tiles rounded up to a multiple of 4 (a tile list's parts start on 16-byte boundaries)."""
    return -(-n // 4) * 4


def _batch(arrays: MaskArrays) -> int:
    """The batch of the per-row arrays; 1 for a band alone (the same tiles for every batch row)."""
    for x in arrays:
        if x is not None:
            return x.shape[0]
    return 1


# --- the element mask of one tile, inside the kernel ------------------------------------------------------------


def kept(
    mask: Mask, rows, cols, *, q_segment=None, kv_segment=None, prefix=None, q_len=None, kv_len=None, ends: bool = True
):
    """kept(r, c) for index arrays ``rows``/``cols`` of one shape (query rows, key columns; any layout), the segment
    ids broadcast to that shape and the batch row's scalars; ``ends``: check c < S. None when nothing is masked."""
    keep = None

    def both(a, b):
        return b if a is None else a & b

    d = mask.diagonal
    if mask.right is not None:
        keep = both(keep, cols <= (rows + (d + mask.right) if d + mask.right else rows))
    if mask.left is not None:
        keep = both(keep, cols >= rows + (d - mask.left))
    if mask.prefix:
        keep = None if keep is None else keep | (cols < prefix)
    if ends:
        keep = both(keep, cols < mask.seq_kv)
    if mask.lengths:
        keep = both(keep, (rows < q_len) & (cols < kv_len))
    if mask.segments:
        keep = both(keep, q_segment == kv_segment)
    return keep


def dense(mask: Mask, arrays: MaskArrays, batch: int) -> np.ndarray:
    """The whole (B, T, S) boolean mask in NumPy (for figures, and to count the kept scores)."""
    T, S = mask.seq_q, mask.seq_kv
    rows, cols = np.arange(T)[:, None], np.arange(S)[None, :]
    out = np.ones((batch, T, S), bool)
    for b in range(batch):
        get = lambda x, b=b: None if x is None else np.asarray(x)[b]  # noqa: E731
        qs, ks = get(arrays.q_segment), get(arrays.kv_segment)
        k = kept(
            mask,
            rows,
            cols,
            q_segment=None if qs is None else qs[:, None],
            kv_segment=None if ks is None else ks[None, :],
            prefix=get(arrays.prefix),
            q_len=get(arrays.q_len),
            kv_len=get(arrays.kv_len),
        )
        if k is not None:
            out[b] = np.broadcast_to(k, (T, S))
    return out


def tile_kept(
    mask: Mask,
    shape,
    row0,
    col0,
    *,
    keys_axis: int = 1,
    q_segment=None,
    kv_segment=None,
    scalars=None,
    ends: bool = True,
):
    """:func:`kept` over one score tile in wgmma's register layout: ``shape`` (rows, keys) when ``keys_axis`` is 1,
    (keys, rows) when 0 (the backward's sᵀ); query rows count from ``row0``, keys from ``col0``. ``q_segment`` and
    ``kv_segment``: the tile's ids as vectors in the matching reduced layouts; ``scalars``: (prefix, q_len, kv_len)
    of this batch row."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    layout = plgpu.Layout.WGMMA
    a = plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=layout)
    b = plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=layout)
    first = (row0, col0) if keys_axis == 1 else (col0, row0)
    a, b = a + first[0], b + first[1]
    rows, cols = (a, b) if keys_axis == 1 else (b, a)
    q_axis, kv_axis = (0, 1) if keys_axis == 1 else (1, 0)
    segments = {}
    if mask.segments:
        segments = dict(
            q_segment=lax.broadcast_in_dim(q_segment, shape, [q_axis]),
            kv_segment=lax.broadcast_in_dim(kv_segment, shape, [kv_axis]),
        )
    prefix, q_len, kv_len = scalars if scalars is not None else (None, None, None)
    return kept(mask, rows, cols, prefix=prefix, q_len=q_len, kv_len=kv_len, ends=ends, **segments)
