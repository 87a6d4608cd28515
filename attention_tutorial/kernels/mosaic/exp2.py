"""2^x on the FMA units: part of the softmax's exponentials taken off the special-function unit.

A Hopper SM completes 16 ``exp2`` per clock on its multi-function unit (``MUFU.EX2``; FlashAttention-3 §3 counts
3.9 TFLOPS of special functions on an H100 SXM5: 132 SMs × 16 × 1.83 GHz) but 128 float32 FMAs, and issues one warp
instruction per clock in each of its four quarters (128 threads' worth). So one ``MUFU.EX2`` keeps the unit busy as
long as eight instructions take to issue — about what the polynomial below costs (a clamp, three adds, three FMAs,
a shift and an integer add). Alone it is no faster; beside the MUFU both run at once. With the rest of the softmax
(about 4.5 instructions per score: the scaled subtract, the max, the sum, half a conversion to 16 bits), with a
fraction φ of the scores on the polynomial the softmax takes 4.5 + 7φ instructions per score against the MUFU's
8(1 − φ) clock-slots:
they balance near φ = 0.23, where the softmax would take 6.3 slots per score instead of 8. FlashAttention-4 splits
Blackwell's exponentials this way:

    2^x = 2^n · 2^f,   n = round(x),   f = x − n ∈ [−½, ½]

* n and f come from the float32 adder: x + 1.5·2^23 rounds x to an integer (between 2^23 and 2^24 a float's last
  bit is worth 1), which sits in the sum's low mantissa bits; subtracting 1.5·2^23 again gives n as a float.
* 2^f: a cubic in Horner form, three FMAs (:data:`POLY`).
* 2^n: n added to the exponent field of 2^f's bits — the sum's bits shifted left by 23 (which leaves n · 2^23)
  plus 2^f's bits, integer arithmetic.

Below −127 the exponent field would wrap: x is clamped to −127 first, where f = 0, 2^f = 1 exactly and the bits
add up to +0.0. So 2^x → 0 for x ≤ −127 and −inf, as ``MUFU.EX2`` (which flushes results below 2^−126 to zero);
between −127 and −125.5 it lies in [0, 2^−125), not within the cubic's error of 2^x. Softmax arguments are at most
about 0.

:func:`exp2_split` runs the first columns of a score tile in wgmma's register layout through :func:`exp2_poly` and
the rest through ``exp2``: ``Probe(exp_poly=f)`` chooses the fraction.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

# 2^f ≈ 1 + f·(c1 + f·(c2 + f·c3)) on [−½, ½]: the least maximum relative error (1.013e−4, under bfloat16's
# 2^−9 rounding) with the constant term held at 1 (so 2^0 = 1 exactly and −127 gives +0.0), found by linear
# programming over 20,001 points (scipy.optimize.linprog) and rounded to float32; the tests redo the fit.
POLY = (1.0, 0.6932829022407532, 0.24221095442771912, 0.05500892922282219)
ROUND = 1.5 * 2**23  # x + ROUND rounds x to the nearest integer n, held in the sum's low mantissa bits
FLOOR = -127.0  # below it the exponent field would wrap; at it the result is +0.0
COLUMN_GROUP = 8  # wgmma's accumulator layout holds a tile's columns in groups of 8 (two per thread)


def exp2_poly(x):
    """2^x in float32 without ``exp2``: a cubic for the fraction, integer arithmetic on the bits for the power of
    two (module docstring). Relative error ≤ 1.02e−4 for −125.5 ≤ x ≤ 127; +0.0 for x ≤ −127 and −inf; in
    [0, 2^−125) between. Pure jax.numpy: it runs anywhere, and inside Mosaic GPU kernels."""
    x = jnp.maximum(jnp.asarray(x, jnp.float32), FLOOR)
    rounded = x + ROUND
    f = x + (ROUND - rounded)  # x − n, in [−½, ½] (written so that XLA cannot fold x + ROUND − ROUND into x)
    c0, c1, c2, c3 = POLY
    frac = c0 + f * (c1 + f * (c2 + f * c3))  # 2^f
    shift = lax.shift_left(lax.bitcast_convert_type(rounded, jnp.int32), jnp.int32(23))  # n · 2^23 (mod 2^32)
    return lax.bitcast_convert_type(lax.bitcast_convert_type(frac, jnp.int32) + shift, jnp.float32)


def exp2_split(x, poly_cols: int, *, concat=None):
    """2^x of a (rows, cols) score tile: its first ``poly_cols`` columns by :func:`exp2_poly` (FMA units), the
    rest by ``exp2`` (MUFU), so that both units work at once. ``poly_cols`` a multiple of 8 (wgmma's column
    groups). ``concat`` joins the two parts along the columns: wgmma's register layout by default (inside a Mosaic
    GPU kernel), ``jnp.concatenate`` elsewhere."""
    rows, cols = x.shape
    if poly_cols % COLUMN_GROUP or not 0 <= poly_cols <= cols:
        raise ValueError(f"poly_cols must be a multiple of {COLUMN_GROUP} in [0, {cols}]; got {poly_cols!r}.")
    if poly_cols == 0:
        return jnp.exp2(x)
    if poly_cols == cols:
        return exp2_poly(x)
    poly = exp2_poly(lax.slice(x, (0, 0), (rows, poly_cols)))  # no strides: Mosaic GPU slices without them
    mufu = jnp.exp2(lax.slice(x, (0, poly_cols), (rows, cols)))
    if concat is None:
        return wgmma_columns((rows, poly_cols), (rows, cols - poly_cols))(poly, mufu)
    return concat([poly, mufu], axis=1)


@functools.cache
def wgmma_columns(left: tuple[int, int], right: tuple[int, int]):
    """Two float32 tiles in wgmma's accumulator layout, ``left`` and ``right`` (rows, columns), side by side as one:
    their registers concatenated (jax 0.10's Mosaic GPU has no rule for ``concatenate``; this runs on both)."""
    import jax.experimental.mosaic.gpu as mgpu
    import jax.experimental.pallas.mosaic_gpu as plgpu

    shape = (left[0], left[1] + right[1])
    layout = mgpu.WGMMA_LAYOUT
    axis = 1  # (rows / 64, columns / 8, ...): the column groups
    expected = layout.registers_shape(shape)
    joined = np.concatenate([np.empty(layout.registers_shape(s), dtype=object) for s in (left, right)], axis=axis)
    if joined.shape != tuple(expected):  # the layout's register axes are not what this counts on
        raise NotImplementedError(f"wgmma's register layout {expected} does not join {left} and {right} on axis 1.")

    def join(ctx, a, b):
        regs = np.concatenate([a.registers, b.registers], axis=axis)
        return mgpu.FragmentedArray(_registers=regs, _layout=layout, _is_signed=None)

    join.logical = lambda a, b: jnp.concatenate([a, b], axis=1)  # the same on plain arrays (the CPU interpreter)
    return plgpu.inline_mgpu(
        arg_types=(plgpu.Layout.WGMMA, plgpu.Layout.WGMMA),
        return_type=plgpu.ShapeDtypeStruct(shape, jnp.float32, layout=plgpu.Layout.WGMMA),
    )(join)


def softmax_exp2(probe, block_kv: int):
    """The forward's two exponentials under ``probe`` (a :class:`~attention_tutorial.kernels.mosaic.budget.Probe`):
    ``(exp2, exp2_tile)``, of the row factors (alpha) and of the score tile (p). ``no_exp``: both the identity (a
    timing bound, wrong numbers); ``exp_poly``: the tile's with that fraction of its columns on the FMA units
    (:func:`exp2_split`)."""
    if probe.no_exp:
        return (lambda x: x), (lambda x: x)
    cols = probe.poly_columns(block_kv)
    return jnp.exp2, (functools.partial(exp2_split, poly_cols=cols) if cols else jnp.exp2)
