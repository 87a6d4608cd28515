"""The train grid: failures become records with their reason; a child process hands its records back."""

from __future__ import annotations

import jax
import pytest

from attention_tutorial.measure.sweep import check_record
from attention_tutorial.train.grid import train_grid


def test_a_failing_implementation_becomes_an_error_record():
    (rec,) = train_grid(("no_such_attention",), steps=1, config="tiny", isolate=False, twin=False)
    assert rec["status"] == "error" and "no_such_attention" in rec["reason"]
    assert rec["kind"] == "summary" and rec["median_ms"] is None
    assert check_record(rec) == []


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU's answer for cuDNN")
def test_a_child_process_returns_its_records():
    (rec,) = train_grid(("cudnn",), steps=1, config="tiny", isolate=True, twin=False)
    assert rec["status"] == "unsupported" and "GPU" in rec["reason"]
    assert rec["impl"] == "cudnn" and rec["seq_q"] == 64 and check_record(rec) == []


def test_unknown_config_lists_the_known_ones():
    with pytest.raises(ValueError, match="h200"):
        train_grid(("xla",), config="huge")


def test_the_twin_trains_the_first_implementation_from_nudged_weights():
    import dataclasses

    from attention_tutorial.train.model import TINY

    cfg = dataclasses.replace(TINY, dtype="bfloat16")  # bfloat16: one rounding step is large enough to show
    recs = train_grid(("xla", "blockwise"), steps=3, config=cfg, isolate=False, log_every=1)
    impls = [r["impl"] for r in recs if r["kind"] == "summary"]
    assert impls == ["xla", "blockwise", "xla_twin"]
    twin = [r for r in recs if r["impl"] == "xla_twin"]
    assert all(r["perturb"] == 2.0**-7 for r in twin) and all(check_record(r) == [] for r in recs)
    loss = {(r["impl"], r["step"]): r["loss"] for r in recs if r["kind"] == "step"}
    # the nudge moves the curve, by bfloat16 rounding's order, not more
    diffs = [abs(loss[("xla_twin", s)] - loss[("xla", s)]) for s in range(3)]
    assert 0 < max(diffs) < 0.1, diffs


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="cuDNN runs on a GPU: the first runnable is cuDNN there")
def test_the_twin_is_of_the_first_implementation_that_can_run():
    recs = train_grid(("cudnn", "xla"), steps=1, config="tiny", isolate=False, log_every=1)
    assert [r["impl"] for r in recs if r["kind"] == "summary"] == ["cudnn", "xla", "xla_twin"]
