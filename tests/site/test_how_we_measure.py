"""The measuring page's numbers: the verdict examples and their figure, the two peaks, provenance rows."""

import matplotlib.pyplot as plt
import pytest

from attention_tutorial.measure.flops import BF16_PEAK
from attention_tutorial.results import store
from attention_tutorial.site import how_we_measure as page

PROV = {
    "gpu": "NVIDIA H200",
    "matmul_bf16_tflops": 700.0,
    "created": "2026-12-02T18:00:00+00:00",
    "grids": {"a": {"matmul_bf16_tflops": 695.94}, "b": {"matmul_bf16_tflops": 696.41}, "c": {}},
    "lessons": {
        "inputs": [
            {"inputs": "zeros", "tflops": 827.0},
            {"inputs": "ones", "tflops": 818.0},
            {"inputs": "random normal", "tflops": 697.0},
        ]
    },
}
DATA = store.recorded()
needs_data = pytest.mark.skipif(DATA is None, reason="no recorded results")


def rec(impl, ms, lo, hi, **kw):
    return {"impl": impl, "status": "ok", "median_ms": ms, "p10_ms": lo, "p90_ms": hi, **kw}


def test_run_peaks_one_per_run_unrounded():
    recs = [{"grid": g, "pct_peak": 50.0, "peak_basis": BF16_PEAK} for g in ("a", "b", "b", "seq_long")]
    recs.append({"grid": "te", "pct_peak": 50.0, "peak_basis": "fp8"})  # another basis: not counted
    assert page.run_peaks(recs, PROV) == [695.94, 696.41, 700.0]


def test_peaks_of_a_provenance():
    p = page.peaks(PROV)
    assert (p.datasheet, p.measured, p.runs) == (989.4, (695.94, 700.0), 3)
    assert p.share == pytest.approx((695.94 / 989.4, 700.0 / 989.4))
    assert p.by_input == {"zeros": 827.0, "ones": 818.0, "random normal": 697.0}
    only = page.peaks(PROV, [{"grid": "a", "pct_peak": 1.0, "peak_basis": BF16_PEAK}])
    assert only.measured == (695.94, 695.94) and only.runs == 1
    cpu = page.peaks({"gpu": None, "matmul_bf16_tflops": 0.03})
    assert cpu.datasheet is None and cpu.share is None and cpu.by_input == {}
    with pytest.raises(ValueError, match="matmul_bf16_tflops"):
        page.peaks(PROV, [])


@needs_data
def test_the_recorded_peaks_span_every_run_and_the_datasheet_basis_matches_tflops():
    prov = DATA["provenance"]
    p = page.peaks(prov)
    runs = {g["matmul_bf16_tflops"] for g in prov["grids"].values() if g.get("matmul_bf16_tflops")}
    runs.add(prov["matmul_bf16_tflops"])
    assert p.measured == (min(runs), max(runs)) and p.runs == len(runs)
    assert 0.6 < p.share[0] <= p.share[1] < 0.8  # a random-data matmul sits well below the datasheet's figure
    best = max(store.select(DATA["records"], grid="seq_long", impl="cudnn", status="ok"), key=lambda r: r["tflops"])
    peak = page.run_peaks([best], prov)[0]
    assert best["pct_peak"] == pytest.approx(100 * best["tflops"] / peak)
    assert page.to_datasheet(best["pct_peak"], peak, 989.4) == pytest.approx(100 * best["tflops"] / 989.4)


def test_to_datasheet_converts_and_refuses_a_zero_peak():
    assert page.to_datasheet(88.0, 696.0, 989.4) == pytest.approx(88.0 * 696.0 / 989.4)
    with pytest.raises(ValueError, match="positive"):
        page.to_datasheet(88.0, 0.0, 989.4)


def test_peaks_figure_draws_each_basis_with_its_value():
    p = page.peaks(PROV)
    fig = page.peaks_figure(p, ("attention", 611.0))
    ax = fig.axes[0]
    assert [round(b.get_width(), 2) for b in ax.patches] == [989.4, 827.0, 818.0, 697.0, 611.0]
    from matplotlib.container import ErrorbarContainer

    (bar,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]  # the range over the recording runs
    (segment,) = bar.lines[2][0].get_segments()
    assert segment[0][0] == pytest.approx(695.94) and segment[1][0] == pytest.approx(700.0)
    plt.close(fig)
    cpu = page.peaks_figure(page.peaks({"gpu": None, "matmul_bf16_tflops": 0.03}))
    assert [b.get_width() for b in cpu.axes[0].patches] == [0.03]  # no datasheet bar
    plt.close(cpu)


def test_example_follows_the_ranges():
    recs = [rec("a", 1.0, 0.98, 1.02), rec("b", 1.01, 0.99, 1.03), rec("c", 1.04, 1.03, 1.05)]
    on_par = page.example(recs, "a", "b")
    assert on_par.claim.word == "on par" and on_par.gap_pct == pytest.approx(100 * (1.0 / 1.01 - 1))
    slower = page.example(recs, "c", "a")
    assert slower.claim.word == "slower" and slower.a_ms == (1.04, 1.03, 1.05)
    with pytest.raises(ValueError, match="'x'"):
        page.example(recs, "x", "a")


@needs_data
def test_the_recorded_examples_are_read_from_their_ranges():
    recs = store.select(DATA["records"], grid="device_time", causal=False, status="ok")
    for a in ("te", "mosaic"):
        ex = page.example(recs, a, "cudnn")
        (ra,), (rb,) = store.select(recs, impl=a), store.select(recs, impl="cudnn")
        overlap = ra["p10_ms"] <= rb["p90_ms"] and rb["p10_ms"] <= ra["p90_ms"]
        assert (ex.claim.word == "on par") == overlap
        if not overlap:
            assert ex.claim.word == ("slower" if ra["p10_ms"] > rb["p90_ms"] else "faster")


def test_verdict_figure_draws_each_range_and_median():
    recs = [rec("te", 1.0, 0.98, 1.02), rec("cudnn", 1.01, 0.99, 1.03)]
    fig = page.verdict_figure([page.example(recs, "te", "cudnn")])
    ax = fig.axes[0]
    spans = sorted((round(b.get_x(), 6), round(b.get_x() + b.get_width(), 6)) for b in ax.patches)
    assert spans == [(0.98, 1.02), (0.99, 1.03)]
    assert sorted(line.get_xdata()[0] for line in ax.lines) == [1.0, 1.01]
    assert ax.get_title(loc="left").endswith("on par")
    plt.close(fig)


def test_provenance_and_record_rows():
    rows = page.provenance_rows(
        {
            **PROV,
            "matmul_shape": [8192, 8192, 8192],
            "cudnn": None,
            "command": "python -m attention_tutorial record --grids",
        }
    )
    by = {r["field"]: r["value"] for r in rows}
    assert by["matmul_bf16_tflops"] == "700" and by["matmul_shape"] == "8192 × 8192 × 8192" and by["cudnn"] == "–"
    assert by["command"] == "`python -m attention_tutorial record --grids`"  # code: "--" stays two hyphens
    assert [r["field"] for r in rows] == list(page.PROVENANCE_FIELDS)
    assert (by["commit"], by["dirty"]) == ("–", "–")  # a run that kept no commit names none
    by = {r["field"]: r["value"] for r in page.provenance_rows({**PROV, "commit": "0123abc", "dirty": True})}
    assert (by["commit"], by["dirty"]) == ("0123abc", "yes (uncommitted changes)")
    rows = page.record_rows(rec("cudnn", 1.8901234, 1.8, 2.0, grid="seq_long"))
    assert rows[0] == {"field": "grid", "value": "seq_long"} and {"field": "median_ms", "value": "1.89"} in rows
