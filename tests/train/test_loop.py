"""Training runs: the loss falls, the same seed gives the same curve with any attention, records are valid."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from attention_tutorial.measure.flops import BF16_PEAK
from attention_tutorial.measure.sweep import check_record
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
    cfg = dataclasses.replace(TINY, layers=1, d_model=32, heads=2, head_dim=16, seq_len=32, batch=2, dtype="bfloat16")
    a, b = (
        [r["loss"] for r in train_records(i, steps=3, config=cfg, eval_batches=1).records] for i in ("xla", "blockwise")
    )
    np.testing.assert_allclose(a, b, rtol=0, atol=3e-2)


def test_records_fit_the_result_file_schema(runs):
    rec, summary = runs["blockwise"]
    prov = {
        "gpu": "cpu",
        "driver": "",
        "jax": "",
        "jaxlib": "",
        "cudnn": "",
        "transformer_engine": None,
        "python": "",
        "created": "2026-01-01T00:00:00+00:00",
        "command": "",
        "matmul_bf16_tflops": 1.0,
        "copy_gbps": 1.0,
    }
    assert store.validate({"provenance": prov, "records": [*rec, summary]}) == []
    for r in [*rec, summary]:
        assert r["p10_ms"] <= r["median_ms"] <= r["p90_ms"] and r["tokens_per_s"] > 0
        assert r["peak_bytes"] is None  # the CPU does not report device memory
    assert summary["kind"] == "summary" and summary["compile_s"] > 0 and summary["params"] > 0
    assert summary["corpus"] == "python-stdlib" and len(summary["corpus_sha256"]) == 64


def test_log_every_keeps_the_last_step_and_no_eval_batches_skip_the_held_out_loss():
    rec, summary = train_records("xla", steps=5, config=TINY, log_every=2, eval_batches=0)
    assert [r["step"] for r in rec] == [0, 2, 4]
    assert summary["eval_loss_init"] is None and summary["eval_loss"] is None and summary["final_loss"] > 0


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


def test_a_run_repeating_anothers_program_reuses_its_compiled_step():
    """The twin (same config, implementation and length, nudged weights) runs the first run's executable."""
    from attention_tutorial.train import loop

    _, first = train_records("xla", steps=STEPS, config=TINY, seed=0, eval_batches=2)
    program = loop._STEP_PROGRAMS[(TINY, "xla", STEPS, True)]
    _, twin = train_records("xla", steps=STEPS, config=TINY, seed=0, eval_batches=2, perturb=1e-3)
    assert loop._STEP_PROGRAMS[(TINY, "xla", STEPS, True)] is program  # not compiled again
    assert twin["compile_s"] == first["compile_s"] and twin["temp_bytes"] == first["temp_bytes"]
    assert twin["final_loss"] != first["final_loss"] or twin["eval_loss"] != first["eval_loss"]


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
    signs = np.concatenate(
        [
            np.sign(np.asarray(b) - np.asarray(a)).ravel()
            for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(nudged))
        ]
    )
    assert 0.4 < np.mean(signs[signs != 0] > 0) < 0.6  # both directions, at random


SMALL = dataclasses.replace(TINY, layers=1, d_model=32, heads=2, head_dim=16, seq_len=32, batch=2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": 2.5}, "steps must be an integer >= 1"),
        ({"steps": True}, "steps must be an integer >= 1"),
        ({"steps": 0}, "steps must be an integer >= 1"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"seed": 1.5}, "seed must be an integer >= 0"),
        ({"log_every": 0}, "log_every must be an integer >= 1"),
        ({"eval_batches": -1}, "eval_batches must be an integer >= 0"),
        ({"perturb": float("nan")}, "perturb must be a finite number >= 0"),
        ({"perturb": -0.1}, "perturb must be a finite number >= 0"),
        ({"peak_tflops": -1.0}, "peak_tflops must be a finite number > 0"),
        ({"impl": None}, "impl must be an implementation name"),
        ({"config": "tiny"}, "config must be a train.model.Config"),
        ({"wait_every": 0}, "wait_every must be an integer >= 1"),
    ],
)
def test_bad_arguments_name_the_argument_and_the_fix(kwargs, match):
    args = {"impl": "xla", "steps": 1, "config": SMALL, **kwargs}
    with pytest.raises(ValueError, match=match):
        train_records(args.pop("impl"), **args)


def test_token_ids_outside_the_vocabulary_are_refused_before_training():
    from attention_tutorial.train.data import Corpus

    with pytest.raises(ValueError, match=r"ids from \d+ to \d+, outside the vocabulary \[0, 100\)"):
        train_records("xla", steps=1, config=dataclasses.replace(SMALL, vocab=100))  # bytes reach 255
    wide = np.full(1000, 300, np.uint16)
    with pytest.raises(ValueError, match="from 300 to 300"):
        train_records("xla", steps=1, config=SMALL, corpus=Corpus(wide, wide, "", 1, 1, ""))


def test_steps_dispatched_ahead_train_the_same_curve_each_step_timed_by_its_group(runs):
    """wait_every=4 over 6 steps: groups of 4 and 2, the same losses as waiting after every step; the steps of a
    group share its time."""
    rec, summary = train_records("xla", steps=STEPS, config=TINY, seed=0, eval_batches=2, wait_every=4)
    assert [r["step"] for r in rec] == list(range(STEPS))
    np.testing.assert_allclose([r["loss"] for r in rec], [r["loss"] for r in runs["xla"].records], rtol=0, atol=1e-6)
    ms = [r["median_ms"] for r in rec]
    assert len(set(ms[:4])) == 1 and len(set(ms[4:])) == 1
    assert summary["wait_every"] == 4 and runs["xla"].summary["wait_every"] == 1
    assert summary["eval_loss"] == pytest.approx(runs["xla"].summary["eval_loss"], abs=1e-6)


@pytest.mark.parametrize("wait_every", [1, 3])
def test_a_run_whose_loss_turns_non_finite_fails_at_that_step(wait_every):
    diverging = dataclasses.replace(SMALL, learning_rate=1e30, warmup_steps=0)
    rec, summary = train_records("xla", steps=4, config=diverging, log_every=1, eval_batches=1, wait_every=wait_every)
    assert summary["status"] == "error" and summary["failed_step"] >= 1
    assert "nan" in summary["reason"] or "inf" in summary["reason"]
    assert "learning_rate" in summary["reason"] and summary["median_ms"] is None and check_record(summary) == []
    # the steps before it stand, each with a finite loss
    assert [r["step"] for r in rec] == list(range(summary["failed_step"]))
    assert all(np.isfinite(r["loss"]) and r["status"] == "ok" for r in rec)


def test_steady_state_leaves_out_the_warm_up_and_judges_both_peaks():
    from attention_tutorial.measure.flops import DATASHEET
    from attention_tutorial.train.loop import flops_per_token, steady_state

    cfg = dataclasses.replace(TINY, warmup_steps=3)
    times = [90.0, 80.0, 70.0] + [10.0 + i for i in range(11)]  # warm-up steps slow, then 10..20 ms
    got = steady_state(times, cfg, 2.0, gpu="NVIDIA H200")
    tokens = cfg.batch * cfg.seq_len
    assert got["steady_from"] == 3 and got["steady_steps"] == 11
    assert (got["steady_median_ms"], got["steady_p10_ms"], got["steady_p90_ms"]) == pytest.approx((15.0, 11.0, 19.0))
    per_step = sorted(tokens / (t / 1e3) for t in times[3:])
    assert got["steady_tokens_per_s"] == pytest.approx(per_step[5])  # the median of each step's own tokens/s
    assert got["steady_tokens_per_s_p10"] < got["steady_tokens_per_s"] < got["steady_tokens_per_s_p90"]
    # FLOPs per token from the shapes, counted here independently: 6 per weight used (the embedding is a lookup) and
    # the causal attention's kept pairs, T(T+1)/2 of T², 4·N·H each, ×3.5 forward + backward
    d, T, NH = cfg.d_model, cfg.seq_len, cfg.heads * cfg.head_dim
    weights = cfg.layers * (d * 3 * NH + NH * d + 2 * d * 4 * d) + d * cfg.vocab  # qkv, out, up, down; the head
    attention = cfg.layers * 3.5 * 4 * NH * (T * (T + 1) / 2) / T
    assert flops_per_token(cfg)["total"] == pytest.approx(6 * weights + attention)
    assert got["flops_per_token"] == pytest.approx(6 * weights + attention)
    tflops = got["flops_per_token"] * tokens / 0.015 / 1e12
    assert got["mfu_datasheet_pct"] == pytest.approx(100 * tflops / DATASHEET["NVIDIA H200"].bf16_tflops)
    assert got["mfu_measured_pct"] == pytest.approx(100 * tflops / 2.0)
    cpu = steady_state(times[:2], cfg, None, gpu="cpu")  # too short for the warm-up: half the run is kept
    assert cpu["steady_from"] == 1 and cpu["mfu_datasheet_pct"] is None and cpu["mfu_measured_pct"] is None


def test_the_summary_holds_the_steady_state(runs):
    summary = runs["xla"].summary
    assert summary["steady_from"] == min(TINY.warmup_steps, STEPS // 2)
    assert summary["steady_steps"] == STEPS - summary["steady_from"]
    assert summary["steady_p10_ms"] <= summary["steady_median_ms"] <= summary["steady_p90_ms"]
    assert summary["flops_per_token"] * TINY.batch * TINY.seq_len == pytest.approx(summary["step_flops"])
    assert summary["cfg_embedding"] == "onehot"


def test_the_onehot_embedding_leaves_no_scatter_into_the_table():
    """The compiled gradient of the token table: a scatter-add with embedding="gather", none with "onehot" (the one
    scatter left there is the loss's, into the (B, T, vocab) logits: one update per element)."""
    import re

    import jax.numpy as jnp

    from attention_tutorial.train.loop import init_params, loss_fn
    from attention_tutorial.train.model import GPT

    found = {}
    for embedding in ("gather", "onehot"):
        cfg = dataclasses.replace(SMALL, embedding=embedding)
        grad = jax.jit(jax.grad(lambda p, x, cfg=cfg: loss_fn(GPT(cfg, "naive"), p, x)))
        text = grad.lower(init_params(cfg, 0), jnp.zeros((cfg.batch, cfg.seq_len + 1), jnp.int32)).compile().as_text()
        found[embedding] = len(re.findall(rf"= \w+\[{cfg.vocab},{cfg.d_model}\]\S* scatter\(", text))
    assert found == {"gather": 1, "onehot": 0}


def test_profile_step_lists_what_a_training_step_runs():
    from attention_tutorial.train.loop import profile_step

    rows, host_ms, span = profile_step("xla", config=SMALL, trained_steps=1, repeats=2)
    assert rows and all(r.device_us >= 0 for r in rows) and sum(r.device_us for r in rows) > 0
    assert host_ms > 0 and (span is None) == (jax.default_backend() != "gpu")
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="cudnn cannot run this model here"):
            profile_step("cudnn", config=SMALL)


def test_the_helpers_name_a_bad_argument():
    from attention_tutorial.train.data import load_corpus
    from attention_tutorial.train.loop import (
        evaluate,
        init_params,
        optimizer,
        perturb_params,
        rounding_step,
        steady_state,
    )
    from attention_tutorial.train.model import GPT

    params = init_params(SMALL, 0)
    with pytest.raises(ValueError, match="batches must be an integer >= 1"):
        evaluate(GPT(SMALL), params, load_corpus().held_out, SMALL, seed=0, batches=0)  # was NaN, silently
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        optimizer(SMALL, 0)
    with pytest.raises(ValueError, match="dtype must be a floating type"):
        rounding_step("int32")
    with pytest.raises(ValueError, match="rel must be a finite number >= 0"):
        perturb_params(params, float("nan"), 0)
    with pytest.raises(ValueError, match="times_ms must hold at least one step time"):
        steady_state([], SMALL)
