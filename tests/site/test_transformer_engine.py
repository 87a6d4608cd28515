"""The TransformerEngine page: its figures and table rows on synthetic rows a wrong number would fail; and the
numbers its cells computed in the last docs build (TE against cuDNN, the profiles, FP8), set against the committed
results read here independently."""

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from attention_tutorial.measure.profile import DEVICE_KINDS
from attention_tutorial.results import store
from attention_tutorial.site import transformer_engine as page
from attention_tutorial.site.claims import POINT_FIELDS, compare
from tests.built_pages import glued

DATA = store.recorded()
ROOT = Path(__file__).resolve().parents[2]


def test_ratio_figure_draws_each_series_with_its_range():
    rows = [
        {"series": s, "seq_q": t, "ratio": r, "low": r - 0.1, "high": r + 0.2}
        for (s, t, r) in [("no mask", 512, 1.1), ("causal", 4096, 0.8), ("no mask", 128, 0.9)]
    ]
    fig = page.ratio_figure(rows, ylabel="bf16 time / FP8 time", title="t")
    ax = fig.axes[0]
    drawn = {c.get_label(): (list(c.lines[0].get_xdata()), list(c.lines[0].get_ydata())) for c in ax.containers}
    assert drawn == {"no mask": ([128, 512], pytest.approx([0.9, 1.1])), "causal": ([4096], [0.8])}  # T ascending
    (bars,) = ax.containers[1].lines[2]  # the error bar of the causal point: its range over runs
    np.testing.assert_allclose(bars.get_segments()[0][:, 1], [0.7, 1.0])
    assert ax.get_ylabel() == "bf16 time / FP8 time"


@pytest.mark.parametrize(
    "name, dtype, bits",
    [
        ("bfloat16", ml_dtypes.bfloat16, (1, 8, 7)),
        ("float16", np.float16, (1, 5, 10)),
        ("FP8 E4M3", ml_dtypes.float8_e4m3fn, (1, 4, 3)),
        ("FP8 E5M2", ml_dtypes.float8_e5m2, (1, 5, 2)),
    ],
)
def test_the_formats_figure_draws_each_format_s_bit_fields(name, dtype, bits):
    fig = page.formats_figure()
    ax = fig.axes[0]
    row = [t.get_text() for t in ax.get_yticklabels()].index(name)
    widths = [p.get_width() for p in ax.patches if p.get_y() < row < p.get_y() + p.get_height()]
    assert tuple(widths) == bits  # sign, exponent, stored mantissa
    assert f"max {float(ml_dtypes.finfo(dtype).max):.4g}" in [t.get_text() for t in ax.texts]
    assert len(ax.patches) == 3 * 4


def test_table_rows_round_and_join_the_range():
    rows = [
        {"seq_q": 128, "head_dim": 64, "pass": "fwd", "ratio": 0.94379, "low": 0.6055, "high": 1.1723, "word": "on par"}
    ]
    assert page.table_rows(rows) == [
        {
            "seq_q": 128,
            "head_dim": 64,
            "pass": "fwd",
            "ratio": "0.94",
            "range over runs": "0.61–1.17",
            "verdict": "on par",
        }
    ]


def test_the_fp8_check_finds_a_cast_on_cpu():
    import jax
    import jax.numpy as jnp

    from attention_tutorial.kernels import te

    x = jnp.ones((2, 16, 2, 8), jnp.bfloat16)
    assert te.hlo_fp8_types(lambda q: q.astype(jnp.float8_e4m3fn).astype(jnp.bfloat16), x) == ("f8e4m3fn",)
    assert te.hlo_fp8_types(lambda q: jax.nn.dot_product_attention(q, q, q), x) == ()


# --- the built page against the committed results


@pytest.fixture(scope="module")
def built():
    """What the page's cells glued in the last docs build, as Python values (Markdown as its text)."""
    out = glued("transformer_engine")
    if DATA is None:
        pytest.skip("no recorded results")
    return out


def _ok(**where):
    return store.select(DATA["records"], status="ok", **where)


def _at(records, rec, impl):  # the records of ``impl`` at ``rec``'s point, matched field by field
    return [r for r in records if r["impl"] == impl and all(r.get(f) == rec.get(f) for f in POINT_FIELDS)]


def _less(cudnn_ms, te_ms):  # percent less time TE takes, by hand
    return 100 * (1 - te_ms / cudnn_ms)


def test_te_against_cudnn_point_by_point(built):
    te = _ok(grid="te", impl="te")
    pairs = [(r, _at(_ok(), r, "cudnn")) for r in te]
    pairs = [(r, c) for r, c in pairs if c]
    assert built["te_points"] == str(len(pairs)) == "20"
    words = [compare([r], c).word for r, c in pairs]
    assert built["te_tally"] == f"faster at {words.count('faster')}, on par at {words.count('on par')}"
    saved = {}
    for r, c in pairs:
        saved.setdefault(r["seq_q"], []).append(_less(np.median([x["median_ms"] for x in c]), r["median_ms"]))
    lo, hi = min(map(min, saved.values())), max(map(max, saved.values()))
    assert built["te_span"] == f"from {abs(lo):.0f} % {'less' if lo >= 0 else 'more'} to {hi:.0f} % less"
    assert built["te_gap_t"] == str(min(saved)) == "128" and built["te_gap_most"] == f"{max(saved[128]):.0f} % less"
    longest = max(saved)
    assert built["te_long_t"] == str(longest) and built["te_long_gap"].endswith(f"{max(saved[longest]):.0f} % less")
    long_words = {compare([r], c).word for r, c in pairs if r["seq_q"] == longest}
    assert (long_words == {"on par"}) == (built["te_long_word"] == "within the range over runs")
    assert built["te_short_t"] == "128" and built["te_short_pct"].count("H = ") == 4
    assert built["te_table"].count("\n| 128 |") == 4  # every point is a row


def test_te_runs_cudnns_kernel_and_launches_less_around_it(built):
    te = _ok(grid="te", impl="te")
    assert built["te_backends"] == "NVTE_F16_arbitrary_seqlen" and built["te_backend_count"] == f"all {len(te)}"
    assert built["te_backend_words"] == page.BACKENDS["NVTE_F16_arbitrary_seqlen"]
    prof = {(r["impl"], r["causal"]): r for r in _ok(grid="device_time", impl=("te", "cudnn"))}

    def around(r):  # everything but the longest kernel, device work only
        work = sorted((k["us"] for k in r["kernels"] if k["kind"] in DEVICE_KINDS), reverse=True)
        return work[0], sum(work[1:])

    assert built["around_cudnn"] == f"{around(prof['cudnn', False])[1]:.1f}"
    assert built["around_te"] == f"{around(prof['te', False])[1]:.1f}"
    assert num(built["around_te"]) < num(built["around_cudnn"])
    assert built["around_main"] == f"{around(prof['cudnn', False])[0]:.0f}"
    assert built["te_profile_t"] == "4096" and built["te_same_kernel"] == "the very same kernel as JAX's cuDNN path"
    for causal in (False, True):
        word = compare([prof["te", causal]], [prof["cudnn", causal]]).word
        row = next(
            line for line in built["te_profile"].split("\n") if line.startswith(f"| {'causal' if causal else 'none'} |")
        )
        assert row.endswith(f"| {word} |")
    assert "outside the kernels" not in built["te_profile"]


def num(text):
    return float(text.replace(",", "").rstrip("×% "))


def test_autocast_leaves_attention_in_bf16_and_makes_the_gemm_fp8(built):
    (auto,) = _ok(grid="fp8", impl="te_autocast")
    assert auto["fp8_types_in_hlo"] == [] and auto["max_abs_diff_vs_bf16"] == 0
    assert (built["auto_fp8_types"], built["auto_diff"]) == (
        "holds no FP8 element type",
        "is the same as bf16's, bit for bit",
    )
    b16, f8 = (_ok(grid="fp8", impl=i)[0] for i in ("te_dense_bf16", "te_dense_fp8"))
    assert built["dense_speedup"] == f"{b16['median_ms'] / f8['median_ms']:.2f}" and num(built["dense_speedup"]) > 1
    assert built["dense_types"] == "f8e4m3fn" and built["dense_fp8_tflops"] == f"{f8['tflops']:.0f}"
    assert (built["dense_err_fp8"], built["dense_err_bf16"]) == (f"{f8['rel_error']:.3f}", f"{b16['rel_error']:.4f}")
    peak = DATA["provenance"]["grids"]["fp8"]["matmul_bf16_tflops"]
    assert built["dense_fp8_pct2"] == f"{100 * f8['tflops'] / (2 * peak):.0f}"


def test_fp8_attention_pays_on_long_sequences(built):
    fp8 = _ok(grid="fp8")
    words = {}
    for f in store.select(fp8, impl="cudnn_fp8_s448"):
        c = compare([f], store.select(fp8, impl="cudnn", seq_q=f["seq_q"], causal=f["causal"]))
        words[f["causal"], f["seq_q"]] = c.word
    assert {w for (causal, _), w in words.items() if not causal} == {"faster"}
    assert built["fp8_from_full"] == "at every recorded T" and built["fp8_below_full"] == "nothing"
    causal = sorted((t, w) for (c, t), w in words.items() if c)
    first = next(t for t, _ in causal if all(w == "faster" for u, w in causal if u >= t))
    assert built["fp8_from_causal"] == f"from T = {first}" and first > causal[0][0]
    assert re.fullmatch(r"\d+ % more time at T = \d+ \(slower\)", built["fp8_below_causal"])
    err = {
        i: store.select(fp8, impl=i, causal=False, seq_q=4096)[0]["rel_error"]
        for i in ("cudnn", "cudnn_fp8_s1", "cudnn_fp8_s448")
    }
    assert all(built[f"err_{i}"] == f"{e:.3f}" for i, e in err.items())
    assert err["cudnn"] < err["cudnn_fp8_s448"] / 10  # FP8's error: E4M3's mantissa, not bf16's
    assert built["p_scale_verdict"] == "the P scale makes no difference, with or without a mask"


def test_the_page_shows_the_packages_own_te_call():
    import inspect

    from attention_tutorial.kernels import te

    source = (ROOT / "docs" / "transformer_engine.md").read_text()
    assert ":pyobject: te_attention" in source and ":pyobject: cudnn_fp8_attention" in source
    body = inspect.getsource(te.te_attention)
    assert "DotProductAttention(**te_config(shape, is_causal))" in body
    assert "apply({}, q, k, v, deterministic=True)" in body
