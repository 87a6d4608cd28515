import numpy as np
import pytest

from attention_tutorial.kernels import context_parallel as cp
from attention_tutorial.measure import ring_cost
from attention_tutorial.results import store


def cp_rec(impl, t, causal, ms, lo=None, hi=None, **kw):
    base = {
        "impl": impl,
        "experiment": "context_parallel",
        "batch": 1,
        "seq_q": t,
        "seq_kv": t,
        "heads": 16,
        "kv_heads": 4,
        "head_dim": 128,
        "dtype": "bfloat16",
        "causal": causal,
        "pass": "fwd",
        "mask": "none",
        "status": "ok",
        "local": "mosaic",
        "median_ms": ms,
        "p10_ms": lo or ms,
        "p90_ms": hi or ms,
    }
    return {**base, **kw}


OLD = [
    cp_rec("cp_local", 4096, True, 0.16, devices=1),
    cp_rec("cp_ring_1dev", 4096, True, 0.20, devices=1),
    cp_rec("cp_emulated_P2", 4096, True, 0.24, devices=2),
    cp_rec("cp_emulated_P4", 4096, True, 0.60, devices=4),
    cp_rec("cp_local", 8192, True, 0.54, devices=1),
    cp_rec("cp_emulated_P4", 8192, True, 0.98, devices=4),
    cp_rec("cp_local", 8192, False, 0.95, devices=1, tflops=580.0),
    cp_rec("cp_local", 4096, False, 0.24, devices=1, tflops=570.0),
]
NEW = [{**r, "gpus": 1, "ring_steps": int(r["devices"])} for r in OLD]
for r in NEW:
    r.pop("devices")
    if r["impl"].startswith("cp_emulated"):
        r["impl"] = "cp_emulated"


def _cost(records, *, steps, causal, seq=None):
    found = [
        c
        for c in ring_cost.ring_costs(records)
        if c.steps == steps and c.causal == causal and (seq is None or c.seq == seq)
    ]
    return min(found, key=lambda c: c.seq) if found else None


@pytest.mark.parametrize("records", [OLD, NEW], ids=["steps in the name", "steps in their own field"])
def test_ring_costs_read_both_record_forms(records):
    costs = ring_cost.ring_costs(records)
    assert [(c.seq, c.causal, c.steps) for c in costs] == [(4096, True, 2), (4096, True, 4), (8192, True, 4)]
    c = _cost(records, steps=4, causal=True)  # the shortest T
    assert (c.seq, c.chunk, c.local_ms, c.emulated_ms, c.ring_1dev_ms) == (4096, 512, 0.16, 0.60, 0.20)
    assert c.over_local == pytest.approx(0.60 / 0.16) and c.per_device == pytest.approx(0.60 / 0.16 / 4)
    assert c.ideal == 0.25 and c.best_speedup == pytest.approx(4 * 0.16 / 0.60)
    assert c.verdict == "none"  # 1.07× at most: less than SPEEDUP_MIN
    longer = _cost(records, steps=4, causal=True, seq=8192)
    assert longer.verdict == "some" and longer.ring_1dev_ms is None
    assert _cost(records, steps=8, causal=True) is None
    assert c.calls == 9  # zig-zag, P = 4: 2P + 1 (query chunk, key chunk) pairs are not wholly hidden
    assert [(c.seq, c.steps, f"{c.per_device:.2f}") for c in ring_cost.ring_costs(records)] == [
        (4096, 2, "0.75"),
        (4096, 4, "0.94"),
        (8192, 4, "0.45"),
    ]


def test_local_calls_count_the_pairs_that_are_not_wholly_hidden():
    assert [ring_cost.local_calls(p, causal=False) for p in (1, 2, 4)] == [1, 2, 4]
    assert [ring_cost.local_calls(p, causal=True) for p in (1, 2, 4, 8)] == [3, 5, 9, 17]  # 2P + 1 with zig-zag
    assert ring_cost.local_calls(4, causal=True, layout="contiguous") == 4  # the last device: all four blocks
    for p in (2, 4):  # the 2P chunks as 2P one-chunk "devices": the non-zero pairs, shared evenly by the P devices
        pairs = np.count_nonzero(cp.causal_work(8 * p, 2 * p, "contiguous"))
        assert ring_cost.local_calls(p, causal=True) * p == pairs
    with pytest.raises(ValueError, match="devices"):
        ring_cost.local_calls(0, causal=True)


def test_verdicts_say_where_the_recorded_rings_start_to_pay():
    fwd = ring_cost.ring_costs(OLD)
    assert [(c.seq, c.steps, c.chunk, c.verdict) for c in fwd if c.causal] == [
        (4096, 2, 1024, "some"),  # P = 2: 0.75 of one call each, 1.33x
        (4096, 4, 512, "none"),
        (8192, 4, 1024, "some"),
    ]
    no_mask = [cp_rec("cp_local", 4096, False, 0.24, devices=1), cp_rec("cp_emulated_P4", 4096, False, 0.36)]
    (c,) = ring_cost.ring_costs(no_mask)
    assert (c.chunk, c.calls, c.verdict) == (1024, 4, "some")  # no mask: one call per block of T/P
    assert ring_cost.ring_costs([]) == []


def test_ring_steps_and_gpus_of_each_form_and_other_experiments():
    assert [ring_cost.ring_steps(r) for r in OLD[:4]] == [1, 1, 2, 4]
    assert [ring_cost.ring_steps(r) for r in NEW[:4]] == [1, 1, 2, 4]
    assert {ring_cost.gpus(r) for r in OLD + NEW} == {1}
    scaling = cp_rec("cp_ring_zigzag_P4_strong", 65536, True, 1.0, devices=4)  # several GPUs: not a one-GPU kind
    assert ring_cost.kind(scaling) is None and ring_cost.gpus(scaling) == 4
    assert ring_cost.ring_costs([*OLD, scaling]) == ring_cost.ring_costs(OLD)
    with pytest.raises(ValueError, match="ring_steps"):
        ring_cost.ring_steps({"impl": "cp_emulated"})


def test_the_recorded_one_gpu_result():
    records = store.select(store.recorded(store.REFERENCE_GPU)["records"], experiment="context_parallel")
    c = next(c for c in ring_cost.ring_costs(records) if c.steps == 4 and c.causal and c.pass_ == "fwd")
    emulated = [r for r in records if r["impl"] == "cp_emulated_P4" and r["causal"] and r["seq_q"] == c.seq]
    local = [r for r in records if r["impl"] == "cp_local" and r["causal"] and r["seq_q"] == c.seq]
    assert c.per_device == pytest.approx(emulated[0]["median_ms"] / local[0]["median_ms"] / 4)
