"""The chip's reference rates, measured in the same run as the benchmarks set beside them.

* ``matmul_bf16_tflops``: a large bf16 matrix product (8192³ on a GPU) on random data — a reference for attention's
  arithmetic on this card, not a ceiling: the datasheet's dense figure is the peak, and an attention kernel can run
  faster than this matmul does (FlashAttention-3's paper reports 740 TFLOP/s in bf16 on an H100).
* ``copy_gbps``: ``x * 2`` over a large array, bytes read plus written — the read+write bandwidth.
* ``read_gbps``: ``jnp.sum`` over a large array, bytes read — the read bandwidth decoding, which mostly reads, is
  judged against.

On a CPU the sizes shrink so a build stays quick; the numbers then describe that CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .timing import time_fn


def _sizes() -> tuple[int, int]:
    """(matmul side, elements of the bandwidth arrays): large on a GPU, small on a CPU."""
    if jax.default_backend() == "gpu":
        return 8192, 1 << 30  # 2 GiB of bf16 (4 GiB for the read test below)
    return 1024, 1 << 24


def measure_ceilings(repeats: int = 20) -> dict:
    """Measure the matmul, copy and read rates on the default device; returns them with their shapes."""
    n, elems = _sizes()
    key_a, key_b = jax.random.split(jax.random.key(0))
    a = jax.random.normal(key_a, (n, n), jnp.bfloat16)
    b = jax.random.normal(key_b, (n, n), jnp.bfloat16)
    mm = time_fn(jnp.matmul, a, b, repeats=repeats)
    del a, b
    x = jax.random.normal(key_a, (elems,), jnp.bfloat16)
    copy = time_fn(lambda x: x * 2, x, repeats=repeats)
    del x
    y = jax.random.normal(key_b, (2 * elems,), jnp.bfloat16)
    read = time_fn(lambda y: jnp.sum(y, dtype=jnp.float32), y, repeats=repeats)
    del y
    return {
        "matmul_bf16_tflops": 2 * n**3 / (mm.median_ms * 1e-3) / 1e12,
        "matmul_shape": [n, n, n],
        "copy_gbps": 2 * 2 * elems / (copy.median_ms * 1e-3) / 1e9,
        "copy_bytes": 2 * elems,
        "read_gbps": 2 * 2 * elems / (read.median_ms * 1e-3) / 1e9,
        "read_bytes": 4 * elems,
    }
