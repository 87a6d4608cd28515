import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.measure.timing import Timing, summarize, time_fn


def test_summarize_known_values():
    median, p10, p90 = summarize([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert (median, p10, p90) == pytest.approx((5.5, 1.9, 9.1))
    assert summarize([3.0]) == (3.0, 3.0, 3.0)
    with pytest.raises(ValueError, match="at least one sample"):
        summarize([])


def _sleepy(ms):
    """A jitted function whose device work is a host sleep of `ms`: a known duration to time."""

    def host(x):
        time.sleep(ms / 1e3)
        return x

    return lambda x: jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def test_time_fn_measures_a_known_duration():
    t = time_fn(_sleepy(5.0), jnp.ones(4), repeats=8, warmup=1, min_sample_ms=1.0, min_inner=1)
    assert 4.8 <= t.median_ms <= 15.0
    assert t.p10_ms <= t.median_ms <= t.p90_ms
    assert t.repeats == 8 and t.inner == 1
    assert t.compile_s > 0


def test_tiny_work_grows_inner_until_a_sample_is_long_enough():
    t = time_fn(lambda x: x + 1, jnp.ones(8), repeats=5, min_sample_ms=2.0)
    assert t.inner > 1
    assert t.median_ms * t.inner >= 1.0  # a sample lasted about min_sample_ms
    assert t.dispatch_ms >= 0 and t.single_call_ms > 0


def test_max_seconds_caps_repeats_but_keeps_five():
    t = time_fn(_sleepy(20.0), jnp.ones(2), repeats=100, warmup=1, max_seconds=0.05, min_inner=1)
    assert t.repeats == 5


def test_min_inner_pipelines_several_calls_per_sample():
    t = time_fn(_sleepy(5.0), jnp.ones(2), repeats=3, warmup=1, min_sample_ms=1.0, min_inner=3)
    assert t.inner == 3 and 4.8 <= t.median_ms <= 15.0


def test_as_dict_includes_dispatch():
    t = Timing(1.0, 0.9, 1.2, 10, 4, 0.5, 1.5)
    assert t.as_dict()["dispatch_ms"] == pytest.approx(0.5)
    assert Timing(1.0, 0.9, 1.2, 10, 4, 0.5, 0.8).dispatch_ms == 0.0


def test_rejects_bad_counts():
    with pytest.raises(ValueError, match="repeats"):
        time_fn(lambda x: x, np.ones(1), repeats=0)
    with pytest.raises(ValueError, match="min_inner"):
        time_fn(lambda x: x, np.ones(1), min_inner=0)


def test_precompiled_executable_is_used_and_compile_time_is_zero():
    x = jnp.ones(4)
    compiled = jax.jit(lambda x: x * 3).lower(x).compile()
    t = time_fn(lambda x: x * 3, x, repeats=3, compiled=compiled)
    assert t.compile_s == 0.0 and t.median_ms > 0
