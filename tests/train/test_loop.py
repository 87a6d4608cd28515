"""Training runs: the loss falls, the same seed gives the same curve with any attention, records are valid."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from attention_tutorial.measure.flops import BF16_PEAK
from attention_tutorial.results import store
from attention_tutorial.train.loop import train_records
from attention_tutorial.train.model import TINY

STEPS = 6


@pytest.fixture(scope="module")
def runs():
    return {
        impl: train_records(impl, steps=STEPS, config=TINY, seed=0, eval_batches=2) for impl in ("xla", "blockwise")
    }


def test_the_loss_falls(runs):
    rec, summary = runs["xla"]
    losses = [r["loss"] for r in rec]
    assert [r["step"] for r in rec] == list(range(STEPS))
    assert losses[-1] < losses[0] - 0.3, losses
    assert summary["eval_loss"] < summary["eval_loss_init"] - 0.2


def test_same_seed_same_curve_whatever_the_attention(runs):
    a = [r["loss"] for r in runs["xla"].records]
    b = [r["loss"] for r in runs["blockwise"].records]
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    assert runs["xla"].summary["impl"] == "xla" and runs["blockwise"].summary["impl"] == "blockwise"


def test_bf16_runs_agree_within_bf16_noise():
    cfg = dataclasses.replace(TINY, dtype="bfloat16")
    a, b = (
        [r["loss"] for r in train_records(i, steps=3, config=cfg, eval_batches=1).records] for i in ("xla", "blockwise")
    )
    np.testing.assert_allclose(a, b, rtol=0, atol=3e-2)


def test_records_fit_the_result_file_schema(runs):
    rec, summary = runs["blockwise"]
    prov = {"gpu": "cpu", "driver": "", "jax": "", "jaxlib": "", "cudnn": "", "transformer_engine": None,
            "python": "", "created": "2026-01-01T00:00:00+00:00", "command": "", "matmul_bf16_tflops": 1.0, "copy_gbps": 1.0}  # fmt: skip
    assert store.validate({"provenance": prov, "records": [*rec, summary]}) == []
    for r in [*rec, summary]:
        assert r["p10_ms"] <= r["median_ms"] <= r["p90_ms"] and r["tokens_per_s"] > 0
        assert r["peak_bytes"] is None  # the CPU does not report device memory
    assert summary["kind"] == "summary" and summary["compile_s"] > 0 and summary["params"] > 0
    assert summary["corpus"] == "python-stdlib" and len(summary["corpus_sha256"]) == 64


def test_log_every_keeps_the_last_step():
    rec, _ = train_records("xla", steps=5, config=TINY, log_every=2, eval_batches=1)
    assert [r["step"] for r in rec] == [0, 2, 4]


def test_an_implementation_that_cannot_run_here_is_recorded_as_unsupported():
    import jax

    if jax.default_backend() == "gpu":
        pytest.skip("cuDNN runs on a GPU; this checks the CPU's answer")
    rec, summary = train_records("cudnn", steps=2, config=TINY)
    assert rec == [] and summary["status"] == "unsupported" and summary["reason"]
    with pytest.raises(ValueError, match="steps"):
        train_records("xla", steps=0)


@pytest.mark.gpu
def test_cudnn_trains_like_xla_on_the_gpu():
    cfg = dataclasses.replace(TINY, d_model=128, heads=2, head_dim=64, dtype="bfloat16")
    xla, cudnn = (train_records(i, steps=5, config=cfg, eval_batches=1) for i in ("xla", "cudnn"))
    np.testing.assert_allclose([r["loss"] for r in xla.records], [r["loss"] for r in cudnn.records], atol=5e-2)
    assert "cuDNN" in cudnn.summary["attention_kernel"], cudnn.summary["attention_kernel"]
    assert cudnn.summary["peak_bytes"] > 0 and cudnn.summary["step_bytes"] > 0


def test_percent_of_peak_names_its_basis():
    rec, summary = train_records("xla", steps=2, config=TINY, eval_batches=1, peak_tflops=2.0)
    for r in [*rec, summary]:
        assert r["peak_basis"] == BF16_PEAK
        assert r["pct_peak"] == pytest.approx(100 * r["tflops"] / 2.0)


def test_rounding_step_is_one_epsilon():
    from attention_tutorial.train.loop import rounding_step

    assert rounding_step("bfloat16") == 2.0**-7 and rounding_step("float32") == 2.0**-23


def test_perturb_params_nudges_every_weight_by_the_relative_step():
    import numpy as np

    from attention_tutorial.train.loop import init_params, perturb_params

    params = init_params(TINY, 0)
    nudged = perturb_params(params, 2.0**-8, seed=1)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(nudged)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        nz = a != 0
        np.testing.assert_allclose(np.abs(b[nz] / a[nz] - 1), 2.0**-8, rtol=1e-4)
        assert np.all(b[~nz] == 0)
    signs = np.concatenate([np.sign(np.asarray(b) - np.asarray(a)).ravel()
                            for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(nudged))])  # fmt: skip
    assert 0.4 < np.mean(signs[signs != 0] > 0) < 0.6  # both directions, at random
