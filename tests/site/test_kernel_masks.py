"""The page on masks: its figures on synthetic records a wrong number would fail, the committed masks records
against the FLOP model, and the numbers the page's cells computed in the last docs build, set against the committed
results read here independently."""

from pathlib import Path

import numpy as np
import pytest

from attention_tutorial.kernels.masks import MASK_KINDS
from attention_tutorial.measure.flops import attention_flops
from attention_tutorial.measure.grids import points
from attention_tutorial.results import store
from attention_tutorial.site import kernel_masks as page
from attention_tutorial.site.claims import compare
from tests.built_pages import glued

DATA = store.recorded(store.REFERENCE_GPU)


@pytest.fixture(scope="module")
def built():
    """What the page's cells glued in the last docs build, as Python values (Markdown as its text)."""
    return glued("kernel_masks")


def _recs(**where):
    return store.select(DATA["records"], status="ok", **where)


def timed(ms, lo, hi, **kw):
    return {"status": "ok", "median_ms": ms, "p10_ms": lo, "p90_ms": hi, **kw}


def num(text):  # a number as the page shows it: "4,468", "2.1" -> 4468, 2.1
    return float(str(text).replace(",", ""))


# --- the figures


def test_mask_weights_spread_evenly_over_the_keys_each_mask_keeps():
    n = 8
    tril = np.tril(np.ones((n, n)))
    uniform = tril / tril.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(page.mask_weights("none", seq=n), uniform)
    np.testing.assert_allclose(page.mask_weights("dense", seq=n), uniform)  # the same triangle, given as a matrix
    band = tril * np.triu(np.ones((n, n)), -2)  # a causal window of 2 keys back: j in [i - 2, i]
    np.testing.assert_allclose(page.mask_weights("window", seq=n, window=2), band / band.sum(axis=1, keepdims=True))
    pad = page.mask_weights("padding", seq=n)
    kept = int((pad.sum(axis=1) > 0).sum())  # the shorter batch row: its queries past the length see nothing
    assert kept < n and np.allclose(pad[:kept].sum(axis=1), 1) and not pad[kept:].any()
    assert np.all(pad[:, kept:] == 0)
    bias = page.mask_weights("bias", seq=n)
    np.testing.assert_allclose(bias.sum(axis=1), 1)
    assert np.all(np.triu(bias, 1) == 0)
    assert np.all(np.diff(bias[-1]) > 0)  # ALiBi: the nearer the key, the larger its weight


def test_masks_figure_draws_one_panel_per_kind():
    fig = page.masks_figure(seq=8, window=2)
    assert len(fig.axes) == len(MASK_KINDS)
    drawn = fig.axes[2].get_images()[0].get_array()
    assert fig.axes[0].get_title() == "causal (is_causal)"
    np.testing.assert_allclose(drawn.filled(0), page.mask_weights("window", seq=8, window=2))


def msk(impl, mask, causal, ms=None, status="ok", **kw):
    base = {
        "impl": impl,
        "batch": 1,
        "seq_q": 1024,
        "seq_kv": 1024,
        "heads": 2,
        "kv_heads": 2,
        "head_dim": 64,
        "dtype": "bfloat16",
        "causal": causal,
        "pass": "fwd",
        "mask": mask,
        "status": status,
    }
    return {**base, **(timed(ms, ms * 0.99, ms * 1.01) if ms else {"median_ms": None}), **kw}


MASKS = [
    msk("cudnn", "none", True, 0.5),
    msk("cudnn", "dense", False, 1.5),
    msk("cudnn", "dense", True, 0.9),
    msk("cudnn", "window", False, status="unsupported", reason="left only"),
    msk("xla", "none", True, 6.0),
]


def test_masks_cost_figure_bars_are_the_medians_and_a_failure_is_named():
    fig = page.masks_cost_figure(MASKS)
    causal_ax, plain_ax = fig.axes[0], fig.axes[1]
    assert sorted(round(p.get_height(), 3) for p in causal_ax.patches) == [0.5, 0.9, 6.0]
    assert [round(p.get_height(), 3) for p in plain_ax.patches] == [1.5]
    assert [t.get_text() for t in plain_ax.texts] == ["unsupported"]
    ticks = [t.get_text() for t in plain_ax.get_xticklabels()]
    assert ticks == ["none", "window", "dense\n(causal matrix)"]  # the dense mask is the causal triangle itself


def test_the_page_s_mask_table_lists_every_kind_the_package_builds():
    """The masks table is written in the page: one row per kind of ``MASK_KINDS`` (``"none"`` is the causal row)."""

    text = (Path(__file__).resolve().parents[2] / "docs" / "kernel_masks.md").read_text(encoding="utf-8")
    table = text.split("| mask | argument |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|")[1].strip() for line in table.strip().splitlines()[1:]]
    assert rows == ["causal" if kind == "none" else kind for kind in MASK_KINDS]


# --- the committed records against the FLOP model


def test_no_recorded_mask_point_beats_the_peak_when_only_kept_positions_count():
    """A FLOP model that credited work a mask removes would put a point above 100 % of the measured peak."""
    masks = _recs(grid="masks")
    peak = DATA["provenance"]["grids"]["masks"]["matmul_bf16_tflops"]
    assert masks
    for r in masks:
        kept = attention_flops(
            r["batch"], r["seq_q"], r["seq_kv"], r["heads"], r["head_dim"], causal=r["causal"], mask=r["mask"]
        )
        assert r["tflops"] == pytest.approx(kept / (r["median_ms"] * 1e-3) / 1e12, rel=1e-6), (r["impl"], r["mask"])
        assert r["pct_peak"] == pytest.approx(100 * r["tflops"] / peak, rel=1e-6) and r["pct_peak"] < 100


def test_a_gpu_build_s_live_points_are_recorded_points():
    """The page runs its live points from the recorded grid; on a GPU they are set against the recording."""
    for p in points("masks", gpu=True, live=True):
        want = p.as_record()
        assert any(r.get("grid") == "masks" and all(r.get(f) == v for f, v in want.items()) for r in DATA["records"])


# --- the built page against the committed results: each value as the page shows it


def test_each_mask_against_float64_and_what_it_costs(built):
    assert built["acc_word"].startswith("agree to within") and num(built["acc_worst"]) < 1e-5
    assert all(f"| {kind} |" in built["acc_table"] for kind in MASK_KINDS)
    masks = _recs(grid="masks")

    def one(impl, mask, causal):
        return store.select(masks, impl=impl, mask=mask, causal=causal)

    dense = compare(one("cudnn", "none", True), one("cudnn", "dense", False))
    assert built["dense_word"] == dense.word == "faster" and built["dense_ratio"] == f"{dense.value:.1f}"
    assert built["xla_dense_word"] == compare(one("xla", "none", True), one("xla", "dense", False)).word == "slower"
    assert num(built["win_ms"]) < num(built["causal_ms"]) and num(built["xla_mask_lo"]) <= num(built["xla_causal_ms"])
    assert num(built["xla_none_ms"]) < num(built["xla_mask_lo"])  # XLA skips nothing: every causal call is slower
    failed = [r for r in store.select(DATA["records"], grid="masks") if r["status"] != "ok"]
    assert failed and all(f"the {r['mask']} mask" in built["msk_failed_what"] for r in failed)


def test_the_live_table_runs_two_points(built):
    live = built["msk_tables"].split("**Live, this build:**")[1].split("\n\nAgainst the recording")[0]
    assert live.split("**Recorded")[0].count("\n| ") - 1 == 2  # rows under the header


def test_race_rows_set_ours_against_the_baseline_and_the_causal_kernel():
    def contender(name, ms, **kw):
        return {"contender": name, "median_ms": ms, "tflops": kw.pop("tflops", None), "speed": None, **kw}

    window = {  # no causal kernel beside it; ours timed
        "group": "masks_backward",
        "case": "sliding window",
        "pass": "fwd+bwd",
        "baseline": "cuDNN",
        "shape": [4, 8192, 8192, 16, 16, 128],
        "rows": [contender("cuDNN", 4.0), contender("ours", 5.0, tflops=100.0, speed=0.8)],
    }
    docs = {  # ours beside the causal kernel, whose rate counts the causal triangle
        "group": "masks",
        "case": "packed documents",
        "pass": "fwd",
        "baseline": "XLA",
        "shape": [1, 1024, 1024, 2, 2, 64],
        "rows": [contender("XLA", 3.0), contender("ours", 1.0, tflops=50.0, speed=3.0), contender("ours, causal", 2.0)],
    }
    broken = {**docs, "case": "broken", "rows": [contender("XLA", 3.0), contender("ours", None, error="Boom: x")]}
    prov = {"race": {"a": window, "b": docs, "c": broken, "d": {**docs, "group": "forward"}}}
    rows = page.race_rows(prov)
    assert [r["mask"] for r in rows] == ["sliding window", "packed documents", "broken"]
    assert rows[0]["speed"] == 0.8 and rows[0]["causal_ms"] is None and rows[0]["rate_vs_causal"] is None
    assert rows[1]["vs_causal"] == 2.0
    causal_tflops = attention_flops(1, 1024, 1024, 2, 64, causal=True) / 2.0 / 1e9
    assert rows[1]["rate_vs_causal"] == pytest.approx(50.0 / causal_tflops)
    assert rows[2]["ms"] is None and rows[2]["vs_causal"] is None and rows[2]["error"] == "Boom: x"
    assert page.race_rows({}) == [] and page.race_rows(None) == []
