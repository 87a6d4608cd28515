"""The five-way timing: every step's times, in order, measured for real on this machine; the shapes per backend."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape
from attention_tutorial.measure import timing_lesson


def test_five_ways_times_each_step_and_waits_where_it_should():
    slow = jnp.ones((256, 256), jnp.float32)
    calls = []

    def fn(x):
        calls.append(1)  # traced once: jit compiles once, whatever the number of calls
        return x @ x @ x

    t = timing_lesson.five_ways(fn, slow, warmup=2, waited=3, samples=4, inner=5)
    assert len(calls) == 1
    assert (len(t["warmup_ms"]), len(t["waited_ms"]), len(t["samples_ms"]), t["inner"]) == (2, 3, 4, 5)
    times = [t["no_wait_ms"], *t["warmup_ms"], *t["waited_ms"], *t["samples_ms"]]
    assert all(np.isfinite(times)) and min(times) > 0 and t["compile_s"] > 0


@pytest.mark.parametrize("name", ["warmup", "waited", "samples", "inner"])
def test_five_ways_refuses_counts_below_one(name):
    with pytest.raises(ValueError, match=name):
        timing_lesson.five_ways(jnp.sin, jnp.ones(3), **{name: 0})


def test_the_lesson_shape_is_the_page_s_on_each_backend():
    assert timing_lesson.lesson_shape(gpu=True) == (AttentionShape(4, 4096, 4096, 16, 16, 128), "bfloat16")
    assert timing_lesson.lesson_shape(gpu=False) == (AttentionShape(1, 256, 256, 4, 4, 64), "float32")


def test_the_record_names_what_ran_where():
    rec = timing_lesson.timing_lesson_record()
    shape, dtype = timing_lesson.lesson_shape()
    assert (rec["batch"], rec["seq_q"], rec["heads"], rec["head_dim"], rec["dtype"]) == (
        shape.batch,
        shape.seq_q,
        shape.heads,
        shape.head_dim,
        dtype,
    )
    assert rec["backend"] == jax.default_backend() and rec["device"] == jax.devices()[0].device_kind
    assert len(rec["samples_ms"]) == 20 and rec["inner"] == 10
