"""The page on shared keys and values: its figure on synthetic records a wrong number would fail, the committed
decode records against the byte model, and the numbers the page's cells computed in the last
docs build, set against the committed results read here independently."""

from itertools import pairwise

import pytest

from attention_tutorial.measure.flops import attention_bytes, kv_cache_bytes
from attention_tutorial.measure.grids import points
from attention_tutorial.results import store
from attention_tutorial.results.plotting import label
from attention_tutorial.site import heads
from attention_tutorial.site.claims import TOLERANCES, compare, growth, same_point
from attention_tutorial.site.report import read_ceiling
from tests.built_pages import glued

DATA = store.recorded(store.REFERENCE_GPU)


@pytest.fixture(scope="module")
def built():
    """What the page's cells glued in the last docs build, as Python values (Markdown as its text)."""
    return glued("heads_decode")


def _recs(**where):
    return store.select(DATA["records"], status="ok", **where)


# --- GQA


def test_sharing_figure_joins_each_query_head_to_its_kv_head():
    fig = heads.sharing_figure(heads=8, layouts=(("GQA", 2),))
    ax = fig.axes[0]
    lines = [line.get_xydata() for line in ax.get_lines()]
    assert len(lines) == 8
    kv_x = {tuple(line[1]) for line in lines}  # where the lines end: one point per kv head, below its group
    assert kv_x == {(1.5, 0.0), (5.5, 0.0)}
    assert [line[0][0] for line in lines] == list(range(8))
    assert all(line[1][0] == (1.5 if n < 4 else 5.5) for n, line in enumerate(lines))  # heads 0-3 read kv head 0


def test_sharing_figure_gives_every_query_head_its_own_kv_head_in_mha_and_one_in_mqa():
    fig = heads.sharing_figure(heads=4, layouts=(("MHA", 4), ("MQA", 1)))
    mha, mqa = ([tuple(line.get_xydata()[1]) for line in ax.get_lines()] for ax in fig.axes)
    assert mha == [(0.0, 0.0), (1.0, 0.0), (2.0, 0.0), (3.0, 0.0)] and set(mqa) == {(1.5, 0.0)}


# --- the committed records against the byte model


def test_the_recorded_decode_bandwidth_counts_the_fewest_bytes():
    """GB/s × time is the bytes a decode call must move: one kv head moves 32 times fewer at the longest context."""
    at = {r["kv_heads"]: r for r in _recs(grid="decode", impl="cudnn", seq_kv=131072)}
    shape = dict(batch=16, seq_q=1, seq_kv=131072, heads=32, head_dim=128, dtype="bfloat16")
    fewest = attention_bytes(kv_heads=32, **shape) / attention_bytes(kv_heads=1, **shape)
    moved = {k: r["gbps"] * r["median_ms"] for k, r in at.items()}
    assert moved[32] / moved[1] == pytest.approx(fewest, rel=1e-3) and round(fewest) == 32


def test_a_gpu_build_s_live_points_are_recorded_points():
    """The page runs its live points from the recorded grids; on a GPU they are set against the recording."""
    recs = DATA["records"]
    for grid in ("decode", "prefill_heads"):
        for p in points(grid, gpu=True, live=True):
            want = p.as_record()
            assert any(r.get("grid") == grid and all(r.get(f) == v for f, v in want.items()) for r in recs), want


# --- the built page against the committed results: each value as the page shows it


def num(text):  # a number as the page shows it: "4,468", "2.1" -> 4468, 2.1
    return float(str(text).replace(",", ""))


def test_gqa_matches_mha_on_the_h200_and_here(built):
    rows = [r for r in DATA["provenance"]["lessons"]["gqa"] if r["status"] == "ok"]
    exact = [label(r["impl"]) for r in rows if r["max_abs_diff"] == 0]
    close = [r for r in rows if 0 < r["max_abs_diff"] <= TOLERANCES[r["computed_in"]]]
    assert exact and all(name in built["gqa_exact_names"] for name in exact)
    assert close and all(label(r["impl"]) in built["gqa_close_names"] for r in close)
    assert built["gqa_close_largest"] == f"{max(r['max_abs_diff'] for r in close):.1e}"
    assert built["gqa_close_word"].startswith("agree to within") and len(exact) + len(close) == len(rows)
    live, recorded = built["gqa_tables"].split("**Recorded on the GPU:**")
    assert recorded.count("exactly equal") == len(exact) and "differ by more" not in built["gqa_tables"]
    assert live.count("| ok |") >= 2  # naive and XLA run everywhere, cuDNN only on a GPU


def test_the_cache_at_128k_tokens(built):
    memory = DATA["provenance"]["environment"]["gpu_memory_mib"] / 1024
    mha = kv_cache_bytes(32, 128, "bfloat16", layers=32, tokens=131072) / 2**30
    assert (built["kv_mha"], built["kv_gqa"], built["kv_mqa"]) == (f"{mha:.0f}", "4", "32")
    assert (built["kv_mem"], built["kv_pct"]) == (f"{memory:.0f}", f"{100 * mha / memory:.0f}")


def test_decoding_reads_the_cache_near_the_ceiling_and_one_kv_head_is_not_32_times_faster(built):
    cudnn = {(r["kv_heads"], r["seq_kv"]): r for r in _recs(grid="decode", impl="cudnn")}
    assert built["dec_best"] == f"{max(r['gbps'] for r in cudnn.values()):,.0f}" and num(built["dec_best_pct"]) > 95
    mqa, mha = cudnn[1, 131072], cudnn[32, 131072]
    assert (built["dec_s"], built["dec_bytes"]) == ("131,072", "32")
    assert built["dec_speedup"] == f"{mha['median_ms'] / mqa['median_ms']:.0f}"
    assert num(built["dec_speedup"]) < num(built["dec_bytes"]) and compare([mqa], [mha]).word == "faster"
    assert num(built["dec_pct_one"]) < num(built["dec_pct_full"])
    near = min((r for r in cudnn.values() if r["kv_heads"] != 1), key=lambda r: abs(r["median_ms"] - mqa["median_ms"]))
    assert (built["dec_near_k"], built["dec_near_s"]) == (near["kv_heads"], f"{near['seq_kv']:,}")
    assert num(built["dec_near_ms"]) < num(built["dec_one_ms"]) and num(built["dec_near_pct"]) > num(
        built["dec_pct_one"]
    )
    assert (built["dec_streams_one"], built["dec_streams_full"], built["dec_sms"]) == (16, 512, 132)
    for name, k in (("MHA", 32), ("GQA", 8), ("MQA", 1)):
        assert built[f"step_{name}_step"] == f"{32 * cudnn[k, 32768]['median_ms']:.3g}"
    assert built["step_layers"] == 32 and built["step_batch"] == 16  # the 32-layer model of the cache section


def test_short_decode_calls_hit_a_floor_that_xla_does_not(built):
    short = sorted(
        (r for r in _recs(grid="decode", impl="cudnn", kv_heads=1) if r["seq_kv"] < 131072), key=lambda r: r["seq_kv"]
    )
    per_doubling = growth([r["seq_kv"] for r in short], [r["median_ms"] for r in short], var="S")
    assert built["floor_word"] == per_doubling.word == "stays flat"
    assert built["floor_growth"] == f"{per_doubling.value:.2f}"
    assert built["floor_s"] == "2,048, 8,192 and 32,768"
    xla_faster = any(compare(same_point(DATA["records"], r, impl="xla"), [r]).word == "faster" for r in short)
    assert xla_faster and built["floor_owner"].startswith("is cuDNN's own")
    ceiling = read_ceiling(_recs(grid="decode"), DATA["provenance"])
    assert built["floor_ideal"] == f"{max(r['gbps'] * r['median_ms'] for r in short) / ceiling:.3f}"
    assert num(built["floor_ideal"]) < max(r["median_ms"] for r in short) / 1.4  # the time left the bytes behind


def test_the_largest_fall_in_bandwidth(built):
    falls = []
    for impl, k in {(r["impl"], r["kv_heads"]) for r in _recs(grid="decode")}:
        curve = sorted((r["seq_kv"], r["gbps"]) for r in _recs(grid="decode", impl=impl, kv_heads=k))
        falls += [(g0 / g1, impl, k, s0, g0, s1, g1) for (s0, g0), (s1, g1) in pairwise(curve)]
    ratio, impl, k, s0, g0, s1, g1 = max(falls)
    assert ratio >= 1.2 and built["drop_who"] == f"{label(impl)}'s curve with K = {k}"
    assert (built["drop_s_from"], built["drop_s_to"]) == (f"{s0:,}", f"{s1:,}")
    assert (built["drop_from"], built["drop_to"]) == (f"{g0:,.0f}", f"{g1:,.0f}")


def test_prefill_does_the_same_work_whatever_k(built):
    for impl, word in (("cudnn", "on par"), ("xla", "slower")):
        full, one = (_recs(grid="prefill_heads", impl=impl, kv_heads=k) for k in (32, 1))
        assert built[f"pre_{impl}_full"] == f"{full[0]['median_ms']:.2f}"
        assert built[f"pre_{impl}_one"] == f"{one[0]['median_ms']:.2f}"
        assert built[f"pre_{impl}_word"] == compare(one, full).word == word
    assert num(built["ridge"]) < 1000  # thousands of FLOPs per byte either way: right of the ridge


def test_each_live_table_runs_two_points(built):
    for key in ("dec_live", "pre_tables"):
        live = built[key].split("**Live, this build:**")[1].split("\n\nAgainst the recording")[0]
        assert live.split("**Recorded")[0].count("\n| ") - 1 == 2, key  # rows under the header
