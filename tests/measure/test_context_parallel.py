"""measure.context_parallel at a tiny size on the CPU: records that follow the schema, failures recorded."""

import pytest

from attention_tutorial.measure.context_parallel import cp_records, overhead_table, what_ran
from attention_tutorial.measure.sweep import check_record

FAST = {"repeats": 2, "warmup": 1, "min_sample_ms": 0.5, "max_seconds": 0.2}


def test_records_at_a_tiny_size():
    recs = cp_records(
        seq=(16,),
        heads=2,
        kv_heads=1,
        head_dim=8,
        dtype="float32",
        causal=(True,),
        devices=(2,),
        passes=("fwd", "fwd+bwd"),
        block=8,
        **FAST,
    )
    assert [(r["impl"], r["pass"]) for r in recs] == [
        (impl, p) for p in ("fwd", "fwd+bwd") for impl in ("cp_local", "cp_ring_1dev", "cp_emulated_P2")
    ]
    for r in recs:
        assert check_record(r) == [], (r, check_record(r))
        assert r["status"] == "ok" and r["experiment"] == "context_parallel" and r["median_ms"] > 0
        assert r["local"] == "blockwise"
    # one device ran them all; the ring steps are said apart
    assert [(r["gpus"], r["devices"], r["ring_steps"]) for r in recs[:3]] == [(1, 1, None), (1, 1, 1), (1, 1, 2)]
    assert recs[3]["tflops"] == pytest.approx(3.5 * recs[0]["tflops"] * recs[0]["median_ms"] / recs[3]["median_ms"])
    table = overhead_table(recs)
    assert {row["impl"]: row["vs_local"] for row in table if row["pass"] == "fwd"}["cp_local"] == 1.0


def test_the_one_device_ring_can_be_left_out():
    recs = cp_records(
        seq=(16,),
        heads=2,
        kv_heads=1,
        head_dim=8,
        dtype="float32",
        causal=(True,),
        devices=(2, 4),
        block=4,
        one_device_ring=False,
        **FAST,
    )
    assert [r["impl"] for r in recs] == ["cp_local", "cp_emulated_P2", "cp_emulated_P4"]
    assert all(r["status"] == "ok" for r in recs)


def test_a_local_step_that_cannot_run_becomes_error_records():
    # our Mosaic kernel is Hopper-only: on a CPU every point fails, and each failure is recorded with its reason
    recs = cp_records(
        seq=(256,),
        heads=1,
        kv_heads=1,
        head_dim=64,
        dtype="bfloat16",
        causal=(False,),
        devices=(2,),
        local="mosaic",
        **FAST,
    )
    assert [r["impl"] for r in recs] == ["cp_local", "cp_ring_1dev", "cp_emulated_P2"]
    assert all(r["status"] == "error" and r["reason"] and r["local"] == "mosaic" for r in recs)
    assert all(check_record(r) == [] for r in recs)


def test_an_unknown_local_step_is_refused_before_measuring():
    with pytest.raises(ValueError, match="local step must be one of"):
        cp_records(seq=(16,), heads=1, kv_heads=1, head_dim=8, dtype="float32", local="cudnn", **FAST)


@pytest.mark.parametrize(
    ("rec", "want"),
    [  # records written before gpus/ring_steps: an emulated ring's P sat in devices, on one GPU
        ({"impl": "cp_emulated_P4", "devices": 4}, (1, 4)),
        ({"impl": "cp_ring_1dev", "devices": 1}, (1, 1)),
        ({"impl": "cp_local", "devices": 1}, (1, None)),
        ({"impl": "cp_ring_zigzag_P8_strong", "devices": 8, "strategy": "ring"}, (8, 8)),
        ({"impl": "cp_allgather_zigzag_P8_strong", "devices": 8, "strategy": "allgather"}, (8, None)),
        # new records say it themselves
        ({"impl": "cp_emulated_P4", "devices": 1, "gpus": 1, "ring_steps": 4}, (1, 4)),
    ],
)
def test_what_ran_reads_old_and_new_records(rec, want):
    got = what_ran(rec)
    assert (got["gpus"], got["ring_steps"]) == want


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"devices": (0,)}, "devices must be an integer >= 1"),
        ({"devices": (2.0,)}, "devices must be an integer >= 1"),
        ({"devices": 2}, "devices must be a list or tuple"),
        ({"seq": (12,), "devices": (8,)}, "multiple of 16"),
        ({"seq": (2.5,)}, "seq must be an integer"),
        ({"causal": ("no",)}, "causal must be True or False"),
        ({"passes": ("bwd",)}, "passes must hold"),
        ({"block": 0}, "block must be a positive integer"),
        ({"heads": True}, "heads must be an integer"),
    ],
)
def test_bad_arguments_are_refused_before_measuring(kwargs, match):
    args = {"seq": (16,), "heads": 2, "kv_heads": 1, "head_dim": 8, "dtype": "float32", "devices": (2,), **kwargs}
    with pytest.raises(ValueError, match=match):
        cp_records(**args, **FAST)
