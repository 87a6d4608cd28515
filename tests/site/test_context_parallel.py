import jax
import matplotlib.pyplot as plt
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from attention_tutorial import make_qkv
from attention_tutorial.kernels import context_parallel as cp
from attention_tutorial.results import store
from attention_tutorial.site import context_parallel as site


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_per_device_divides_the_causal_work_and_the_held_tensors_by_p():
    one, eight = site.per_device(1024, 1, heads=4, kv_heads=2, head_dim=8), site.per_device(1024, 8, heads=4,
                                                                                             kv_heads=2, head_dim=8)  # fmt: skip
    kept = 1024 * 1025 // 2  # causal score positions
    assert one.tflop == pytest.approx(4 * 4 * 8 * kept / 1e12)  # 4·N·H per kept position
    assert one.gib == pytest.approx(1024 * (2 * 4 + 2 * 2) * 8 * 2 / 2**30)  # q, out: N heads; k, v: K; bf16
    assert eight.tflop == pytest.approx(one.tflop / 8) and eight.gib == pytest.approx(one.gib / 8)
    assert one.seconds is None and one.layers == 32 and one.model_gib == pytest.approx(32 * one.gib)
    timed = site.per_device(1024, 8, heads=4, kv_heads=2, head_dim=8, flops_per_s=1e9, layers=2)
    assert timed.seconds == pytest.approx(eight.tflop * 1e12 / 1e9) and timed.model_gib == pytest.approx(2 * eight.gib)
    with pytest.raises(ValueError, match="split evenly"):
        site.per_device(1000, 3)
    with pytest.raises(ValueError, match="layers"):
        site.per_device(1024, 1, layers=0)


needs4 = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices (XLA_FLAGS host device count)")


@needs4
def test_the_plain_ring_matches_the_float64_reference_and_the_library():
    mesh = Mesh(np.array(jax.devices()[:4]), ("seq",))
    q, k, v = make_qkv(1, 64, 4, 16, kv_heads=2, seed=1)  # GQA, 16 tokens per device
    split = NamedSharding(mesh, PartitionSpec(None, "seq"))
    args = [jax.device_put(x, split) for x in (q, k, v)]
    out = jax.jit(lambda q, k, v: site.ring_attention(q, k, v, mesh=mesh))(*args)
    want, _ = site.float64_reference(q, k, v, np.zeros_like(q), causal=False)
    assert out.shape == q.shape and out.sharding.spec == PartitionSpec(None, "seq")
    assert site.max_error(out, want) < 1e-5
    lib = cp.context_parallel_attention(*args, mesh=mesh, strategy="ring", layout="contiguous")
    assert site.max_error(out, lib) < 1e-6
    counts = cp.collectives(jax.jit(lambda q, k, v: site.ring_attention(q, k, v, mesh=mesh)).lower(*args).compile()
                            .as_text())  # fmt: skip
    assert counts == site.expected_collectives("ring", 4)  # 3 steps × (K, V)


@needs4
@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("strategy", cp.STRATEGIES)
def test_expected_collectives_are_what_the_compiled_library_holds(strategy, devices):
    mesh = Mesh(np.array(jax.devices()[:devices]), ("seq",))
    q, k, v = make_qkv(1, 16 * devices, 2, 8, seed=0)
    args = [jax.device_put(x, NamedSharding(mesh, PartitionSpec(None, "seq"))) for x in (q, k, v)]
    f = lambda q, k, v: cp.context_parallel_attention(q, k, v, mesh=mesh, strategy=strategy, is_causal=True,  # noqa: E731
                                                      reorder=False)  # fmt: skip
    assert cp.collectives(jax.jit(f).lower(*args).compile().as_text()) == site.expected_collectives(strategy, devices)
    assert site.expected_collectives("ring", 4) == {"all-gather": 0, "collective-permute": 6}
    assert site.expected_collectives("allgather", 4) == {"all-gather": 2, "collective-permute": 0}
    with pytest.raises(ValueError, match="strategy"):
        site.expected_collectives("tree", 4)


def test_the_float64_reference_and_its_gradients_against_numpy():
    rng = np.random.default_rng(0)
    q, k, v, d_out = (rng.standard_normal((1, 5, 2, 3)).astype(np.float32) for _ in range(4))
    out, (dq, dk, dv) = site.float64_reference(q, k, v, d_out, causal=True)
    s = np.einsum("btnh,bsnh->bnts", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(3)
    s = np.where(np.tril(np.ones((5, 5), bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, np.einsum("bnts,bsnh->btnh", w, v), rtol=1e-12)
    np.testing.assert_allclose(dv, np.einsum("bnts,btnh->bsnh", w, d_out), rtol=1e-12)  # dV = Wᵀ dO
    # dq by a central difference of <out, d_out> in float64
    eps, bump = 1e-6, np.zeros_like(q, np.float64)
    bump[0, 3, 1, 2] = eps

    def loss(x):
        return float(np.sum(site.float64_reference(x, k, v, d_out)[0] * d_out))

    numeric = (loss(q + bump) - loss(q - bump)) / (2 * eps)
    assert dq[0, 3, 1, 2] == pytest.approx(numeric, rel=1e-5)
    assert dk.shape == k.shape
    # GQA: 4 query heads on 2 kv heads, against the package's NumPy float64 reference
    from attention_tutorial import reference_attention

    qg = rng.standard_normal((2, 6, 4, 3))
    kg, vg = (rng.standard_normal((2, 6, 2, 3)) for _ in range(2))
    for causal in (True, False):
        out, grads = site.float64_reference(qg, kg, vg, np.ones_like(qg), causal=causal)
        np.testing.assert_allclose(out, reference_attention(qg, kg, vg, is_causal=causal), rtol=1e-12, atol=1e-14)
        assert [g.shape for g in grads] == [qg.shape, kg.shape, vg.shape]


def test_max_error_of_arrays_and_of_tuples():
    assert site.max_error(np.ones(3), np.array([1.0, 1.5, 0.75])) == 0.5
    assert site.max_error((np.zeros(2), np.ones(2)), (np.zeros(2), np.full(2, 3.0))) == 2.0
    with pytest.raises(ValueError):
        site.max_error((np.zeros(2),), (np.zeros(2), np.zeros(2)))


def test_ring_schedule_hands_each_device_the_block_of_device_d_minus_s():
    sched = site.ring_schedule(4)
    np.testing.assert_array_equal(sched[0], [0, 1, 2, 3])  # step 0: its own block
    np.testing.assert_array_equal(sched[1], [3, 0, 1, 2])  # step 1: the left neighbour's
    for s in range(4):  # every step passes each block one device to the right
        np.testing.assert_array_equal(np.roll(sched[s], 1), sched[(s + 1) % 4])
    assert all(sorted(sched[:, d]) == [0, 1, 2, 3] for d in range(4))  # every device meets every block once
    with pytest.raises(ValueError, match="devices"):
        site.ring_schedule(0)


def test_strategies_figure_labels_the_blocks_each_device_holds():
    fig = site.strategies_figure(3)
    ag, ring = fig.axes
    assert [t.get_text() for t in ag.texts] == [f"K/V {j}" for _ in range(3) for j in range(3)]
    assert [t.get_text() for t in ring.texts] == [f"K/V {j}" for s in range(3) for j in site.ring_schedule(3)[s]]
    arrows = [p for p in ring.patches if type(p).__name__ == "FancyArrowPatch"]
    wraps = [a for a in arrows if a.get_edgecolor()[:3] == plt.matplotlib.colors.to_rgb(site.WRAP)]
    assert len(arrows) == 2 * 3 and len(wraps) == 2  # per step gap: 2 to the next device, 1 from the last to the first
    assert ring.get_xticklabels()[0].get_text() == ag.get_xticklabels()[0].get_text() == "device 0"  # same columns


def test_balance_counts_the_ring_time_by_the_busiest_device_of_each_step():
    work = cp.causal_work(256, 4, "contiguous")
    b = site.balance(256, 4, "contiguous")
    assert b.total == work.sum() and b.ring_time == sum(row.max() for row in work)
    assert b.efficiency == pytest.approx(work.sum() / 4 / b.ring_time) and b.efficiency < 0.6
    assert site.balance(256, 4, "zigzag").efficiency == 1.0  # every device equally busy at every step
    assert (b.chunk, b.full_block, b.diagonal_block) == (64, 64 * 64, 64 * 65 // 2)  # the numbers in the heatmap
    assert set(np.unique(work)) == {0, b.full_block, b.diagonal_block}
    fig = site.balance_figure(4)
    np.testing.assert_array_equal(fig.axes[0].get_images()[0].get_array(), work)


def cp_rec(impl, t, causal, ms, lo=None, hi=None, **kw):
    base = {"impl": impl, "experiment": "context_parallel", "batch": 1, "seq_q": t, "seq_kv": t, "heads": 16,
            "kv_heads": 4, "head_dim": 128, "dtype": "bfloat16", "causal": causal, "pass": "fwd", "mask": "none",
            "status": "ok", "local": "mosaic", "median_ms": ms, "p10_ms": lo or ms, "p90_ms": hi or ms}  # fmt: skip
    return {**base, **kw}


OLD = [cp_rec("cp_local", 4096, True, 0.16, devices=1), cp_rec("cp_ring_1dev", 4096, True, 0.20, devices=1),
       cp_rec("cp_emulated_P2", 4096, True, 0.24, devices=2), cp_rec("cp_emulated_P4", 4096, True, 0.60, devices=4),
       cp_rec("cp_local", 8192, True, 0.54, devices=1), cp_rec("cp_emulated_P4", 8192, True, 0.98, devices=4),
       cp_rec("cp_local", 8192, False, 0.95, devices=1, tflops=580.0),
       cp_rec("cp_local", 4096, False, 0.24, devices=1, tflops=570.0)]  # fmt: skip
NEW = [{**r, "gpus": 1, "ring_steps": int(r["devices"])} for r in OLD]
for r in NEW:
    r.pop("devices")
    if r["impl"].startswith("cp_emulated"):
        r["impl"] = "cp_emulated"


@pytest.mark.parametrize("records", [OLD, NEW], ids=["steps in the name", "steps in their own field"])
def test_ring_costs_read_both_record_forms(records):
    costs = site.ring_costs(records)
    assert [(c.seq, c.causal, c.steps) for c in costs] == [(4096, True, 2), (4096, True, 4), (8192, True, 4)]
    c = site.ring_cost(records, steps=4, causal=True)  # the shortest T by default
    assert (c.seq, c.chunk, c.local_ms, c.emulated_ms, c.ring_1dev_ms) == (4096, 512, 0.16, 0.60, 0.20)
    assert c.over_local == pytest.approx(0.60 / 0.16) and c.per_device == pytest.approx(0.60 / 0.16 / 4)
    assert c.ideal == 0.25 and c.best_speedup == pytest.approx(4 * 0.16 / 0.60)
    assert c.verdict == "none"  # 1.07× at most: less than SPEEDUP_MIN
    longer = site.ring_cost(records, steps=4, causal=True, seq=8192)
    assert longer.verdict == "some" and longer.ring_1dev_ms is None
    assert site.ring_cost(records, steps=8) is None
    assert c.calls == 9  # zig-zag, P = 4: 2P + 1 (query chunk, key chunk) pairs are not wholly hidden
    rows = site.cost_rows(records)
    assert [(r["T"], r["P"], r["per device"]) for r in rows] == [
        (4096, 2, "0.75"),
        (4096, 4, "0.94"),
        (8192, 4, "0.45"),
    ]


def test_local_calls_count_the_pairs_that_are_not_wholly_hidden():
    assert [site.local_calls(p, causal=False) for p in (1, 2, 4)] == [1, 2, 4]
    assert [site.local_calls(p, causal=True) for p in (1, 2, 4, 8)] == [3, 5, 9, 17]  # 2P + 1 with zig-zag
    assert site.local_calls(4, causal=True, layout="contiguous") == 4  # the last device: all four blocks
    for p in (2, 4):  # the 2P chunks as 2P one-chunk "devices": the non-zero pairs, shared evenly by the P devices
        pairs = np.count_nonzero(cp.causal_work(8 * p, 2 * p, "contiguous"))
        assert site.local_calls(p, causal=True) * p == pairs
    with pytest.raises(ValueError, match="devices"):
        site.local_calls(0, causal=True)


def test_where_the_recorded_rings_start_to_pay():
    causal, no_mask = site.first_paying(OLD, causal=True), site.first_paying(NEW, causal=False)
    assert (causal.seq, causal.chunk, causal.verdict) == (8192, 1024, "some") and no_mask is None
    assert site.first_paying(OLD, steps=2).seq == 4096  # P = 2: 0.75 of one call each, 1.33x
    no_mask_rec = [cp_rec("cp_local", 4096, False, 0.24, devices=1), cp_rec("cp_emulated_P4", 4096, False, 0.36)]
    assert site.first_paying(no_mask_rec, causal=False).chunk == 1024  # no mask: one call per block of T/P
    paying = site.paying_chunk(OLD)
    assert (paying.smallest_paying, paying.largest_not) == (1024, 512)
    assert site.paying_chunk([]) == site.PayingChunk(None, None)


def test_ring_steps_and_gpus_of_each_form_and_other_experiments():
    assert [site.ring_steps(r) for r in OLD[:4]] == [1, 1, 2, 4]
    assert [site.ring_steps(r) for r in NEW[:4]] == [1, 1, 2, 4]
    assert {site.gpus(r) for r in OLD + NEW} == {1}
    scaling = cp_rec("cp_ring_zigzag_P4_strong", 65536, True, 1.0, devices=4)  # several GPUs: not a one-GPU kind
    assert site.kind(scaling) is None and site.gpus(scaling) == 4
    assert site.ring_costs([*OLD, scaling]) == site.ring_costs(OLD)
    with pytest.raises(ValueError, match="ring_steps"):
        site.ring_steps({"impl": "cp_emulated"})


def test_local_rate_is_the_no_mask_forward_at_the_longest_t():
    rate = site.local_rate(OLD)
    assert (rate.tflops, rate.seq, rate.head_dim, rate.local) == (580.0, 8192, 128, "mosaic")
    assert site.local_rate(OLD[:6]) is None


def test_hide_chunk_balances_compute_and_transfer():
    h = site.hide_chunk(32, 8, flops_per_s=600e12, bytes_per_s=450e9)
    c = h.chunk
    compute = 4 * 32 * 128 * c**2 / 600e12  # one step at chunk c, no mask
    transfer = 2 * c * 8 * 128 * 2 / 450e9  # k and v blocks of c tokens, K = 8, bf16
    assert compute == pytest.approx(transfer) and h.chunk_causal == 2 * c
    assert h.step_us == pytest.approx(compute * 1e6)
    assert site.chunk_for_time(40e-6, heads=32, flops_per_s=600e12) == pytest.approx(np.sqrt(40e-6 * 600e12 / 16384))
    assert site.chunk_for_time(compute, heads=32, flops_per_s=600e12) == pytest.approx(c)  # the inverse
    with pytest.raises(ValueError, match="positive"):
        site.chunk_for_time(0, heads=32, flops_per_s=600e12)
    assert h.step_mib == pytest.approx(2 * round(c) * 8 * 128 * 2 / 2**20)
    fewer = site.hide_chunk(32, 1, flops_per_s=600e12, bytes_per_s=450e9)
    assert fewer.chunk == pytest.approx(c / 8)  # fewer kv heads: less to send per FLOP


def test_overlap_figure_marks_where_each_transfer_meets_the_compute():
    fig = site.overlap_figure(flops_per_s=600e12, bytes_per_s=450e9, kv_heads=(8,))
    lines = fig.axes[0].get_lines()
    compute, transfer, mark = lines
    x = compute.get_xdata()
    np.testing.assert_allclose(compute.get_ydata(), 4 * 32 * 128 * x**2 / 600e12 * 1e6)
    np.testing.assert_allclose(transfer.get_ydata(), 2 * x * 8 * 128 * 2 / 450e9 * 1e6)
    cx, cy = mark.get_xdata()[0], mark.get_ydata()[0]
    assert cy == pytest.approx(4 * 32 * 128 * cx**2 / 600e12 * 1e6)  # on the compute line too
    floor = site.overlap_figure(flops_per_s=600e12, bytes_per_s=450e9, kv_heads=(8,), shortest_us=40.0)
    assert list(floor.axes[0].get_lines()[-1].get_ydata()) == [40.0, 40.0]


def test_ring_cost_figure_bars_are_the_per_device_shares():
    fig = site.ring_cost_figure(OLD)
    heights = sorted(round(p.get_height(), 4) for p in fig.axes[0].patches)
    assert heights == sorted(round(c.per_device, 4) for c in site.ring_costs(OLD))
    labels = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    assert labels == ["P = 2", "P = 4", "ideal: 1 / P", "one GPU alone: 1"]


def test_live_check_pairs_the_same_kind_and_local_step():
    live = [cp_rec("cp_local", 4096, True, 0.17, 0.169, 0.171), cp_rec("cp_emulated_P4", 4096, True, 0.6),
            cp_rec("cp_local", 4096, True, 0.5, local="blockwise"), cp_rec("cp_local", 256, True, 1.0)]  # fmt: skip
    rows = site.live_check(live, OLD)
    assert [(r["impl"], r["verdict"]) for r in rows] == [("cp_local", "slower"), ("cp_emulated_P4", "on par")]
    assert rows[0]["live_over_recorded"] == pytest.approx(0.17 / 0.16)


def test_the_recorded_one_gpu_result():
    records = store.select(store.recorded(store.REFERENCE_GPU)["records"], experiment="context_parallel")
    c = site.ring_cost(records, steps=4, causal=True)
    emulated = [r for r in records if r["impl"] == "cp_emulated_P4" and r["causal"] and r["seq_q"] == c.seq]
    local = [r for r in records if r["impl"] == "cp_local" and r["causal"] and r["seq_q"] == c.seq]
    assert c.per_device == pytest.approx(emulated[0]["median_ms"] / local[0]["median_ms"] / 4)
