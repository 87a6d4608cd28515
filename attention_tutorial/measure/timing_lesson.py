"""The first lesson of timing GPU work, as an experiment: one function timed five ways, in the order a careful
benchmark runs them (compile apart, warm up, a clock read without waiting, single waited calls, pipelined samples).

:func:`five_ways` is the code the timing page prints and runs live. ``python -m attention_tutorial record --grids
--extras timing_lesson`` stores :func:`timing_lesson_record` (the same five steps on
``jax.nn.dot_product_attention`` at the page's GPU shape) in the result file's provenance, under
``lessons["timing"]``, so a build without a GPU shows what the clock reads on one.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from ..inputs import AttentionShape, check_int, make_qkv

#: The shape the page and the recorder time on a GPU (bf16), and the smaller one a CPU build runs (float32).
GPU_SHAPE, GPU_DTYPE = AttentionShape(4, 4096, 4096, 16, 16, 128), "bfloat16"
CPU_SHAPE, CPU_DTYPE = AttentionShape(1, 256, 256, 4, 4, 64), "float32"


def five_ways(fn, *args, warmup: int = 3, waited: int = 5, samples: int = 20, inner: int = 10) -> dict:
    """Time ``fn(*args)`` five ways; every time in ms, in the order it ran, the compilation in s."""
    for name, value in (("warmup", warmup), ("waited", waited), ("samples", samples), ("inner", inner)):
        check_int(name, value, minimum=1)
    clock = time.perf_counter

    t = clock()
    compiled = jax.jit(fn).lower(*args).compile()  # 1. compile apart
    compile_s = clock() - t

    def waited_call():  # one call, then wait for its result
        t = clock()
        jax.block_until_ready(compiled(*args))
        return (clock() - t) * 1e3

    warmup_ms = [waited_call() for _ in range(warmup)]  # 2. warm up: the first call pays one-time costs
    t = clock()
    out = compiled(*args)
    no_wait_ms = (clock() - t) * 1e3  # 3. the clock read before the result is ready
    jax.block_until_ready(out)
    waited_ms = [waited_call() for _ in range(waited)]  # 4. single calls, each waited for

    samples_ms = []
    for _ in range(samples):  # 5. samples of `inner` calls queued back to back, one wait each
        t = clock()
        for _ in range(inner):
            out = compiled(*args)
        jax.block_until_ready(out)
        samples_ms.append((clock() - t) * 1e3 / inner)
    times = {"compile_s": compile_s, "no_wait_ms": no_wait_ms, "inner": inner}
    return times | {"warmup_ms": warmup_ms, "waited_ms": waited_ms, "samples_ms": samples_ms}


def lesson_shape(*, gpu: bool | None = None) -> tuple[AttentionShape, str]:
    """(shape, dtype) the lesson times on this backend (``gpu``: override the check): :data:`GPU_SHAPE` in bf16 on a
    GPU, the smaller :data:`CPU_SHAPE` in float32 elsewhere."""
    gpu = jax.default_backend() == "gpu" if gpu is None else gpu
    return (GPU_SHAPE, GPU_DTYPE) if gpu else (CPU_SHAPE, CPU_DTYPE)


def timing_lesson_record(*, seed: int = 0) -> dict:
    """:func:`five_ways` of ``jax.nn.dot_product_attention`` at :func:`lesson_shape`, with the shape, the dtype and
    the device it ran on (a few seconds on an H200, the compilation included)."""
    shape, dtype = lesson_shape()
    q, k, v = make_qkv(shape.batch, shape.seq_q, shape.heads, shape.head_dim, dtype=jnp.dtype(dtype), seed=seed)
    times = five_ways(jax.nn.dot_product_attention, q, k, v)
    return {
        "fn": "jax.nn.dot_product_attention",
        "device": jax.devices()[0].device_kind,
        "backend": jax.default_backend(),
        "batch": shape.batch,
        "seq_q": shape.seq_q,
        "seq_kv": shape.seq_kv,
        "heads": shape.heads,
        "head_dim": shape.head_dim,
        "dtype": dtype,
        **times,
    }
