"""The train grid: failures become records with their reason; a child process hands its records back."""

from __future__ import annotations

import jax
import pytest

from attention_tutorial.measure.sweep import check_record
from attention_tutorial.train.grid import train_grid


def test_a_failing_implementation_becomes_an_error_record():
    (rec,) = train_grid(("no_such_attention",), steps=1, config="tiny", isolate=False)
    assert rec["status"] == "error" and "no_such_attention" in rec["reason"]
    assert rec["kind"] == "summary" and rec["median_ms"] is None
    assert check_record(rec) == []


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU's answer for cuDNN")
def test_a_child_process_returns_its_records():
    (rec,) = train_grid(("cudnn",), steps=1, config="tiny", isolate=True)
    assert rec["status"] == "unsupported" and "GPU" in rec["reason"]
    assert rec["impl"] == "cudnn" and rec["seq_q"] == 64 and check_record(rec) == []


def test_unknown_config_lists_the_known_ones():
    with pytest.raises(ValueError, match="h200"):
        train_grid(("xla",), config="huge")
