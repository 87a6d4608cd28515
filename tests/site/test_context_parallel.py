import json
import re

import jax
import matplotlib.pyplot as plt
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from attention_tutorial import make_qkv
from attention_tutorial.kernels import context_parallel as cp
from attention_tutorial.measure.flops import attention_flops
from attention_tutorial.measure.ring_cost import SPEEDUP_MIN, ring_costs
from attention_tutorial.results import store
from attention_tutorial.site import context_parallel as site
from attention_tutorial.site.report import live_check
from tests.built_pages import executed, glued
from tests.measure.test_ring_cost import cp_rec

RECORDED = store.select((store.recorded() or {"records": []})["records"], experiment="context_parallel")


def _executed(suffix):
    path = executed(f"context_parallel{suffix}")
    if not RECORDED:
        pytest.skip("no recorded results")
    return path


@pytest.fixture(scope="module")
def built():
    """What the page's cells glued in the last docs build, as Python values (Markdown as its text)."""
    _executed(".glue.json")  # skips without the build or the records
    return glued("context_parallel")


@pytest.fixture(scope="module")
def printed():
    """Everything the page's cells printed in the last docs build."""
    cells = json.loads(_executed(".ipynb").read_text())["cells"]
    lines = (
        "".join(o.get("text", "")).splitlines()
        for c in cells
        for o in c.get("outputs", ())
        if o.get("name") == "stdout"
    )
    return "\n".join(dict.fromkeys(line for out in lines for line in out))  # each line once


def num(text):
    return float(str(text).replace(",", ""))


needs4 = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices (XLA_FLAGS host device count)")


@needs4
@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("strategy", cp.STRATEGIES)
def test_the_compiled_library_holds_the_collectives_the_page_names(strategy, devices):
    mesh = Mesh(np.array(jax.devices()[:devices]), ("seq",))
    q, k, v = make_qkv(1, 16 * devices, 2, 8, seed=0)
    args = [jax.device_put(x, NamedSharding(mesh, PartitionSpec(None, "seq"))) for x in (q, k, v)]

    def f(q, k, v):
        return cp.context_parallel_attention(q, k, v, mesh=mesh, strategy=strategy, is_causal=True, reorder=False)

    ring = strategy == "ring"  # P - 1 steps, each permuting K and V; or K and V gathered once each
    want = {"all-gather": 0 if ring else 2, "collective-permute": 2 * (devices - 1) if ring else 0}
    assert cp.collectives(jax.jit(f).lower(*args).compile().as_text()) == want


def _grid(ax, devices):  # the K/V block named in each cell of a panel: (row, device) -> block
    named = [t for t in ax.texts if t.get_text()]
    return np.array([int(t.get_text().removeprefix("K/V ")) for t in named]).reshape(-1, devices)


def test_the_ring_hands_each_device_the_block_of_device_d_minus_s():
    ring = _grid(site.strategies_figure(4).axes[1], 4)
    np.testing.assert_array_equal(ring[0], [0, 1, 2, 3])  # step 0: its own block
    np.testing.assert_array_equal(ring[1], [3, 0, 1, 2])  # step 1: the left neighbour's
    for s in range(3):  # every step passes each block one device to the right
        np.testing.assert_array_equal(np.roll(ring[s], 1), ring[s + 1])
    assert all(sorted(ring[:, d]) == [0, 1, 2, 3] for d in range(4))  # every device meets every block once


def test_strategies_figure_labels_the_blocks_each_device_holds():
    fig = site.strategies_figure(3)
    ag, ring = fig.axes
    np.testing.assert_array_equal(_grid(ag, 3), [[0, 0, 0], [1, 1, 1], [2, 2, 2]])  # every device holds every block
    arrows = [t.arrow_patch for t in ring.texts if not t.get_text()]
    wraps = [a for a in arrows if a.get_edgecolor()[:3] == plt.matplotlib.colors.to_rgb(site.WRAP)]
    assert len(arrows) == 2 * 3 and len(wraps) == 2  # per step gap: 2 to the next device, 1 from the last to the first
    assert ring.get_xticklabels()[0].get_text() == ag.get_xticklabels()[0].get_text() == "device 0"  # same columns


def test_balance_figure_shows_the_causal_work_and_each_layout_s_busy_share():
    work = cp.causal_work(256, 4, "contiguous")
    fig = site.balance_figure(4)
    np.testing.assert_array_equal(fig.axes[0].get_images()[0].get_array(), work)
    busy = work.sum() / 4 / sum(row.max() for row in work)
    assert busy < 0.6 and fig.axes[0].get_title() == f"contiguous: {busy:.0%} of devices' time busy"
    assert fig.axes[1].get_title() == "zigzag: 100% of devices' time busy"  # every device equally busy at every step
    assert set(np.unique(work)) == {0, 64 * 64, 64 * 65 // 2}  # a full block, the causal triangle, a hidden block


def test_the_chunk_that_hides_the_transfer_balances_compute_and_transfer():
    c = cp.chunk_to_hide_transfer(32, 8, "bfloat16", flops_per_s=600e12, bytes_per_s=450e9)
    compute = 4 * 32 * 128 * c**2 / 600e12  # one step at chunk c, no mask
    transfer = 2 * c * 8 * 128 * 2 / 450e9  # k and v blocks of c tokens, K = 8, bf16
    assert compute == pytest.approx(transfer)
    fewer = cp.chunk_to_hide_transfer(32, 1, "bfloat16", flops_per_s=600e12, bytes_per_s=450e9)
    assert fewer == pytest.approx(c / 8)  # fewer kv heads: less to send per FLOP


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


OLD = [
    cp_rec("cp_local", 4096, True, 0.16, devices=1),
    cp_rec("cp_ring_1dev", 4096, True, 0.20, devices=1),
    cp_rec("cp_emulated_P2", 4096, True, 0.24, devices=2),
    cp_rec("cp_emulated_P4", 4096, True, 0.60, devices=4),
    cp_rec("cp_local", 8192, True, 0.54, devices=1),
    cp_rec("cp_emulated_P4", 8192, True, 0.98, devices=4),
]


def test_ring_cost_figure_draws_the_per_device_shares_against_p():
    costs = ring_costs(OLD)
    fig = site.ring_cost_figure(costs)
    causal, plain = fig.axes
    lines = {line.get_label(): line for line in causal.get_lines()}
    assert list(lines["T = 4,096"].get_xdata()) == [2, 4]
    assert list(lines["T = 4,096"].get_ydata()) == pytest.approx([0.24 / 0.16 / 2, 0.60 / 0.16 / 4])
    assert list(lines["T = 8,192"].get_ydata()) == pytest.approx([0.98 / 0.54 / 4])
    assert list(lines["ideal: 1 / P"].get_ydata()) == [0.5, 0.25]
    assert not [line for line in plain.get_lines() if line.get_label().startswith("T =") and len(line.get_xdata())]
    assert [t.get_text() for t in plain.get_legend().get_texts()][-2:] == ["ideal: 1 / P", "one GPU alone: 1"]


def test_the_live_check_pairs_the_same_implementation_on_the_same_local_step():
    live = [
        cp_rec("cp_local", 4096, True, 0.17, 0.169, 0.171),
        cp_rec("cp_emulated_P4", 4096, True, 0.6),
        cp_rec("cp_local", 256, True, 1.0),
    ]
    other = [cp_rec("cp_local", 4096, True, 0.5, local="blockwise")]
    rows = live_check(live, store.select(OLD + other, local="mosaic"))  # as the page selects the recording
    assert [(r["impl"], r["verdict"]) for r in rows] == [("cp_local", "slower"), ("cp_emulated_P4", "on par")]
    assert rows[0]["live_over_recorded"] == pytest.approx(0.17 / 0.16)


# --- the built page: its numbers are the recorded results and the package's own counts


def test_the_work_and_memory_per_device_at_a_million_tokens(built):
    rate = max(
        store.select(RECORDED, impl="cp_local", status="ok", causal=False, pass_="fwd"),
        key=lambda r: (r["seq_q"], r["tflops"]),
    )
    seconds = attention_flops(1, 2**20, 2**20, 32, 128, causal=True) / (rate["tflops"] * 1e12)
    gib = 2**20 * (2 * 32 + 2 * 8) * 128 * 2 / 2**30
    assert built["why_f"] == f"{rate['tflops']:.0f}" and built["rate_seq"] == f"{rate['seq_q']:,}"
    assert (built["why_s1"], built["why_s8"]) == (f"{seconds:.1f}", f"{seconds / 8:.1f}")
    assert (built["why_gib"], built["why_model1"], built["why_model8"]) == (
        f"{gib:.0f}",
        f"{32 * gib:,.0f}",
        f"{4 * gib:,.0f}",
    )
    assert num(built["why_model1"]) > num(built["why_mem"]) > num(built["why_model8"])  # fits only when split


def test_the_page_s_rings_match_the_float64_reference(printed):
    errors = [float(x) for x in re.findall(r"max error,? (?:output )?([0-9.e+-]+)", printed)]
    grads = [float(x) for x in re.findall(r"gradients ([0-9.e+-]+)", printed)]
    assert len(errors) == 3 and len(grads) == 2  # the plain ring; the package's ring and all-gather, causal
    assert max(errors) < 1e-5 and max(grads) < 1e-5


def test_the_collectives_and_the_balance_on_the_page(built):
    p = built["cp_devices"]
    assert (built["permutes"], built["gathers"]) == (2 * (p - 1), 2) and built["reorder_gathers"] > 0
    work = cp.causal_work(256, 4, "contiguous")
    assert built["busy_contiguous"] == f"{work.sum() / 4 / work.max(axis=1).sum():.0%}"
    assert built["busy_zigzag"] == "100%"
    assert (built["bal_chunk"], built["bal_full"], built["bal_diag"]) == (64, "4,096", "2,080")


def test_the_transfer_hides_sooner_with_fewer_kv_heads(built):
    f = num(built["why_f"]) * 1e12  # rounded on the page: compare loosely
    for kv in (32, 8, 1):
        want = cp.chunk_to_hide_transfer(32, kv, "bfloat16", flops_per_s=f, bytes_per_s=450e9)
        assert num(built[f"hide_{kv}"]) == pytest.approx(want, rel=0.01, abs=1)
    assert num(built["hide_1"]) < num(built["hide_8"]) < num(built["hide_32"])
    assert num(built["hide_8_causal"]) == pytest.approx(2 * num(built["hide_8"]), abs=1)
    assert num(built["hide_8_us"]) < num(built["call_floor_us"])  # the crossing is a lower bound
    assert built["crossing_reach"] == "lower bounds that real calls do not reach"
    assert num(built["floor_chunk"]) > num(built["hide_8"])


def test_the_one_gpu_ring_costs_on_the_page_are_the_recorded_ones(built):
    costs = [c for c in ring_costs(RECORDED) if c.pass_ == "fwd"]
    causal4 = sorted((c for c in costs if c.steps == 4 and c.causal), key=lambda c: c.seq)
    head, top = causal4[0], next(c for c in causal4 if c.best_speedup >= SPEEDUP_MIN)
    assert (built["cp_t"], built["cp_chunk"], built["cp_calls"]) == (f"{head.seq:,}", f"{head.chunk:,}", head.calls)
    assert built["cp_per_device"] == f"{head.per_device:.2f}" and built["cp_verdict"] == "no real speed-up"
    assert float(built["cp_speedup"]) < SPEEDUP_MIN <= float(built["cp_speedup2"])
    assert (built["cp_t2"], built["cp_per_device2"]) == (f"{top.seq:,}", f"{top.per_device:.2f}")
    paying = min(c.chunk for c in costs if c.verdict == "some")
    assert built["pays_chunk"] == f"{paying:,}" and built["pays_claim"].startswith("every recorded ring")
    assert float(built["cp_plain_per_device"]) < float(built["cp_per_device"])  # no mask: fewer, larger calls
