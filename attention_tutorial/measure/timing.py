"""One measurement, done the way an expert would trust it.

The method (``time_fn``):

1. **Compile apart.** ``jax.jit(fn).lower(*args).compile()`` is timed on its own and reported as ``compile_s``.
2. **Warm up.** A few calls run untimed, so allocation, autotuning and first-call costs stay out.
3. **Pipelined samples.** JAX dispatches asynchronously: the host queues work and the device runs it in order.
   One sample runs ``inner`` calls back to back and waits (``block_until_ready``) on the last; the sample's
   time over ``inner`` is the device's time per call, with the host's dispatch hidden behind the device work —
   as long as the device work is the longer of the two. For calls of a few tens of µs, the host's dispatch rate
   is the limit, and that is what the median then measures (as a real loop of such calls would see).
   ``inner`` grows until a sample lasts at least ``min_sample_ms`` (and is at least ``min_inner``), so neither
   timer noise nor the one launch-and-wait latency per sample (tens of µs) weighs on a millisecond kernel.
4. **Many repeats, robust statistics.** ``repeats`` samples; we report the median and the 10th/90th percentiles.
5. **Dispatch apart.** ``single_call_ms`` times one call with a wait after it (what a Python loop that waits
   each step sees); ``single_call_ms - median_ms`` is the host's per-call overhead, which dominates tiny problems.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import jax
import numpy as np


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call (median, p10, p90 over ``repeats`` samples of ``inner`` calls) and compile seconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int
    inner: int
    compile_s: float
    single_call_ms: float

    @property
    def dispatch_ms(self) -> float:
        """Per-call host overhead: a waited single call minus the pipelined per-call time (>= 0)."""
        return max(self.single_call_ms - self.median_ms, 0.0)

    def as_dict(self) -> dict:
        return {**asdict(self), "dispatch_ms": self.dispatch_ms}


def summarize(samples_ms) -> tuple[float, float, float]:
    """(median, p10, p90) of a sequence of times; raises ``ValueError`` on an empty one."""
    samples = np.asarray(samples_ms, dtype=np.float64)
    if samples.size == 0:
        raise ValueError("need at least one sample to summarize.")
    p10, median, p90 = np.percentile(samples, [10, 50, 90])
    return float(median), float(p10), float(p90)


def time_fn(
    fn,
    *args,
    repeats: int = 30,
    warmup: int = 3,
    min_sample_ms: float = 20.0,
    min_inner: int = 3,
    max_seconds: float = 10.0,
    clock=time.perf_counter,
    compiled=None,
) -> Timing:
    """Time ``fn(*args)`` (jitted here) as described in this module's docstring.

    ``max_seconds`` caps the timed part: a slow problem gets fewer repeats (at least 5), never a shorter sample.
    ``compiled`` (an executable of ``fn`` for these arguments) skips the compilation; ``compile_s`` is then 0.
    """
    if repeats < 1 or warmup < 0 or min_inner < 1:
        raise ValueError(f"need repeats >= 1, warmup >= 0, min_inner >= 1; got {repeats}, {warmup}, {min_inner}.")
    compile_s = 0.0
    if compiled is None:
        t0 = clock()
        compiled = jax.jit(fn).lower(*args).compile()
        compile_s = clock() - t0

    for _ in range(max(warmup, 1)):
        jax.block_until_ready(compiled(*args))

    def waited_call() -> float:
        t = clock()
        jax.block_until_ready(compiled(*args))
        return (clock() - t) * 1e3

    single = [waited_call() for _ in range(5)]
    single_ms = summarize(single)[0]

    # Grow `inner` until one pipelined sample is long enough to time reliably.
    inner = max(min_inner, int(np.ceil(min_sample_ms / max(single_ms, 1e-3))))
    while True:
        sample_ms = _sample(compiled, args, inner, clock)
        if sample_ms >= min_sample_ms or inner >= 1 << 16:
            break
        inner *= 2
    per_call = sample_ms / inner
    repeats = int(min(repeats, max(5, max_seconds * 1e3 / max(sample_ms, 1e-6))))
    samples = [per_call] + [_sample(compiled, args, inner, clock) / inner for _ in range(repeats - 1)]
    median, p10, p90 = summarize(samples)
    return Timing(median, p10, p90, len(samples), inner, compile_s, single_ms)


def _sample(compiled, args, inner, clock) -> float:
    """Milliseconds for ``inner`` back-to-back calls, waiting on the last."""
    t = clock()
    out = None
    for _ in range(inner):
        out = compiled(*args)
    jax.block_until_ready(out)
    return (clock() - t) * 1e3
