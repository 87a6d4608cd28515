"""Context-parallel scaling records on the simulated CPU devices (tests/conftest.py asks for eight), tiny sizes."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from attention_tutorial.kernels import context_parallel as cp
from attention_tutorial.kernels.reference import reference_attention
from attention_tutorial.measure import cp_scaling
from attention_tutorial.measure.sweep import Point, check_record, empty_record, timed_record
from attention_tutorial.measure.timing import Timing

TINY = {"batch": 1, "heads": 4, "kv_heads": 2, "head_dim": 16, "dtype": "float32"}
FAST = {"repeats": 2, "warmup": 1, "min_sample_ms": 0.1, "min_inner": 1, "max_seconds": 0.05}


def test_records_are_valid_and_complete():
    recs = cp_scaling.scaling_records(
        2, seqs=(256,), weak_base=128, passes=("fwd",), causal=(True,), block=32, profile=False, **TINY, **FAST
    )
    assert all(check_record(r) == [] for r in recs), [check_record(r) for r in recs]
    impls = {r["impl"] for r in recs}
    assert {
        "local_P1_strong",
        "cp_ring_zigzag_P2_strong",
        "cp_allgather_contiguous_P2_strong",
        "local_P1_weak",
        "cp_ring_contiguous_P2_weak",
        "te_ring_P2_strong",
        "te_local_P1_weak",
    } <= impls
    assert len(impls) == len(recs)  # every record its own point
    for r in recs:
        assert r["experiment"] == "context_parallel" and r["scaling"] in ("strong", "weak")
        if r["family"] == "te":  # no TE on a CPU: the reason is recorded
            assert r["status"] == "unsupported" and "GPU" in r["reason"] and r["efficiency"] is None
        else:
            assert r["status"] == "ok", r
            assert r["tflops_per_gpu"] == pytest.approx(r["tflops"] / r["devices"])
            assert r["efficiency"] > 0
    weak = {r["devices"]: r["seq_q"] for r in recs if r["scaling"] == "weak"}
    assert weak == {1: 128, 2: 256}


@pytest.mark.parametrize("strategy,layout,causal", [("ring", "zigzag", True), ("allgather", "contiguous", False)])
def test_measured_program_computes_attention(strategy, layout, causal):
    """What is timed (inputs sharded in the layout's order, reorder=False) is attention on the original tokens."""
    shape = {k: TINY[k] for k in ("batch", "heads", "kv_heads", "head_dim", "dtype")}
    fn, args, context = cp_scaling._problem("cp", strategy, layout, shape, 128, causal, "fwd", 4, local=None, block=16)
    assert all(len(x.sharding.device_set) == 4 for x in args)
    with context():
        out = np.asarray(jax.jit(fn)(*args))
    perm = cp.layout_permutation(128, 4, layout)
    q, k, v = (np.asarray(x)[:, np.argsort(perm)] for x in args)
    np.testing.assert_allclose(out[:, np.argsort(perm)], reference_attention(q, k, v, is_causal=causal), atol=2e-5)


def _rec(impl, t, p, ms, *, scaling, family="ours", status="ok"):
    point = Point(impl, 1, t, t, 4, 4, 16, "float32", False, "fwd")
    rec = {**empty_record(point), "devices": p, "scaling": scaling, "family": family}
    if status != "ok":
        return {**rec, "status": status, "reason": "synthetic"}
    return timed_record(rec, Timing(ms, ms, ms, 1, 1, 0.0, ms), flops=4 * 4 * 16 * t * t)


def test_strong_and_weak_efficiency_arithmetic():
    recs = cp_scaling.add_efficiency(
        [
            _rec("base", 1024, 1, 100.0, scaling="strong"),
            _rec("p2", 1024, 2, 60.0, scaling="strong"),  # t1 / (P tP) = 100 / 120
            _rec("p4", 1024, 4, 25.0, scaling="strong"),  # 100 / 100: linear
            _rec("wbase", 512, 1, 10.0, scaling="weak"),
            _rec("w2", 1024, 2, 25.0, scaling="weak"),  # 4x the work on 2 devices in 2.5x the time: 4 / (2 · 2.5)
            _rec("failed", 1024, 2, 1.0, scaling="strong", status="oom"),
            _rec("te", 1024, 2, 50.0, scaling="strong", family="te"),  # no TE baseline
        ]
    )
    eff = {r["impl"]: r["efficiency"] for r in recs}
    assert eff["p2"] == pytest.approx(100 / 120)
    assert eff["p4"] == pytest.approx(1.0)
    assert eff["w2"] == pytest.approx(0.8)
    assert eff["base"] == pytest.approx(1.0) and eff["wbase"] == pytest.approx(1.0)
    assert eff["failed"] is None and eff["te"] is None


def test_overlap_from_timelines():
    timelines = {
        "/device:GPU:0": [("fusion_1", 0, 100), ("ncclDevKernel_SendRecv", 50, 100), ("fusion_2", 140, 20)],
        "/device:GPU:1": [("ncclKernel_AllGather", 0, 10), ("MemcpyPtoP", 5, 10), ("fusion", 20, 30)],
        "/device:GPU:2": [("fusion", 0, 10), ("fusion", 5, 10)],
    }
    res = cp_scaling.overlap(timelines)
    # GPU 0: transfers [50, 150], compute [0, 100] ∪ [140, 160]: 50 + 10 of 100 ns hidden
    assert res["overlap_pct"][0] == pytest.approx(60.0)
    assert res["comm_ms"][0] == pytest.approx(100e-6) and res["compute_ms"][0] == pytest.approx(120e-6)
    assert res["overlap_pct"][1] == pytest.approx(0.0) and res["comm_ms"][1] == pytest.approx(15e-6)
    assert res["overlap_pct"][2] is None and res["compute_ms"][2] == pytest.approx(15e-6)


def test_overlap_fields_off_a_gpu_say_why():
    fields = cp_scaling.overlap_fields(None, (), calls=1)
    assert fields["overlap_pct"] is None and "CPU" in fields["overlap_reason"]


def test_interconnect_without_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    info = cp_scaling.interconnect()
    assert info["topology"] is None and info["nvlink"] is None and "nvidia-smi" in info["reason"]


@pytest.mark.skipif(os.name != "posix", reason="a shell script stands in for nvidia-smi")
def test_interconnect_reads_nvidia_smi(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\nif [ "$1" = topo ]; then echo "GPU0  X  NV18"; else echo "no nvlink" >&2; exit 3; fi\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    info = cp_scaling.interconnect()
    assert info["topology"] == "GPU0  X  NV18" and info["nvlink"] is None
    assert "nvlink -s exited 3" in info["reason"] and "no nvlink" in info["reason"]


def test_device_counts():
    assert cp_scaling.device_counts() == (1, 2, 4, 8)
    assert cp_scaling.device_counts(2) == (1, 2)
    assert cp_scaling.device_counts(6) == (1, 2, 4, 6)
    assert cp_scaling.device_counts((4,)) == (1, 4)
    with pytest.raises(ValueError, match="this process has 8"):
        cp_scaling.device_counts(9)


def test_spent_budget_records_the_reason():
    recs = cp_scaling.scaling_records(
        2, seqs=(256,), weak_base=None, passes=("fwd",), causal=(False,), te=False, budget_s=0.0, **TINY
    )
    assert [r["impl"] for r in recs] == [
        "local_P1_strong",
        "cp_ring_contiguous_P2_strong",
        "cp_allgather_contiguous_P2_strong",
    ]
    assert all(r["status"] == "unsupported" and "budget" in r["reason"] and check_record(r) == [] for r in recs)


def test_records_say_the_gpus_and_the_ring_steps_apart():
    recs = cp_scaling.scaling_records(
        4, seqs=(256,), weak_base=None, passes=("fwd",), causal=(False,), te=True, budget_s=0.0, **TINY
    )
    ran = {r["impl"]: (r["gpus"], r["ring_steps"]) for r in recs}
    assert ran["local_P1_strong"] == (1, None) and ran["te_local_P1_strong"] == (1, None)
    assert ran["cp_ring_contiguous_P4_strong"] == (4, 4) and ran["te_ring_P4_strong"] == (4, 4)
    assert ran["cp_allgather_contiguous_P2_strong"] == (2, None)  # all-gather: no ring
    assert all(r["devices"] == r["gpus"] for r in recs)


@pytest.mark.parametrize(("devices", "match"), [(0, ">= 1"), (2.0, "integer"), (True, "integer"), ((0, 2), ">= 1")])
def test_device_counts_refuse_what_is_no_count(devices, match):
    with pytest.raises(ValueError, match=match):
        cp_scaling.device_counts(devices)


def test_recorder_offers_the_extra():
    from attention_tutorial.cli import _parser
    from attention_tutorial.results.record import EXTRAS, GRID_DETAILS

    assert "cp_scaling" in EXTRAS and "cp_scaling" in GRID_DETAILS
    args = _parser().parse_args(["record", "--grids", "--extras", "cp_scaling"])
    assert args.grids == [] and args.extras == ["cp_scaling"]


def test_recorder_extra_reads_its_environment(monkeypatch):
    from attention_tutorial.results.record import EXTRAS

    monkeypatch.setenv("ATTENTION_TUTORIAL_CP_SEQS", "4096")
    monkeypatch.setenv("ATTENTION_TUTORIAL_CP_BUDGET_S", "0")  # nothing is measured: only the plan is recorded
    monkeypatch.setenv("ATTENTION_TUTORIAL_CP_TE", "0")
    recs = EXTRAS["cp_scaling"](None, repeats=20, max_seconds=1.0)
    strong = {r["seq_q"] for r in recs if r["scaling"] == "strong"}
    assert strong == {4096} and all(r["family"] == "ours" and "budget of 0 s" in r["reason"] for r in recs)
    assert {r["devices"] for r in recs} == {1, 2, 4, 8} and {r["heads"] for r in recs} == {32}


MULTI_GPU = pytest.mark.skipif(jax.device_count() < 2 or jax.default_backend() != "gpu", reason="needs 2 GPUs")


@pytest.mark.gpu
@MULTI_GPU
def test_trace_shows_transfers_on_gpus():
    """The ring on 2 GPUs: the trace reader finds each GPU's NCCL (or peer-copy) work and the compute beside it."""
    shape = {"batch": 1, "heads": 8, "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"}
    fn, args, _ = cp_scaling._problem("cp", "ring", "zigzag", shape, 8192, True, "fwd", 2, local=None, block=512)
    compiled = jax.jit(fn).lower(*args).compile()
    fields = cp_scaling.overlap_fields(compiled, args, calls=2)
    assert fields["overlap_reason"] is None, fields
    assert len(fields["comm_ms"]) >= 2 and all(x > 0 for x in fields["comm_ms"][:2])
    assert 0 <= fields["overlap_mean_pct"] <= 100


@pytest.mark.te
@MULTI_GPU
@pytest.mark.parametrize("strategy,causal", [("ring", True), ("ring", False), ("allgather", True)])
def test_te_context_parallelism_computes_attention(strategy, causal):
    """TE's context parallelism, called as the records call it, against the float64 reference (bf16 tolerance)."""
    shape = {"batch": 1, "heads": 8, "kv_heads": 2, "head_dim": 128, "dtype": "bfloat16"}
    layout = "zigzag" if causal else "contiguous"
    fn, args, context = cp_scaling._problem(
        "te", strategy, layout, shape, 2048, causal, "fwd", 2, local=None, block=512
    )
    with context():
        out = np.asarray(jax.jit(fn)(*args), np.float64)
    back = np.argsort(cp.layout_permutation(2048, 2, layout))
    q, k, v = (np.asarray(x, np.float64)[:, back] for x in args)
    np.testing.assert_allclose(out[:, back], reference_attention(q, k, v, is_causal=causal), atol=2e-2)
