import ml_dtypes
import numpy as np
import pytest

from attention_tutorial.site import transformer_engine as page


def _rec(impl, T, causal, ms, spread=0.01, **extra):
    point = {
        "batch": 1,
        "seq_q": T,
        "seq_kv": T,
        "heads": 16,
        "kv_heads": 16,
        "head_dim": 128,
        "dtype": "bfloat16",
        "causal": causal,
        "pass": "fwd",
    }
    return {
        "impl": impl,
        "status": "ok",
        "median_ms": ms,
        "p10_ms": ms * (1 - spread),
        "p90_ms": ms * (1 + spread),
        **point,
        **extra,
    }


def test_te_vs_cudnn_pairs_points_and_reads_spreads():
    te = [_rec("te", 1024, True, 1.0), _rec("te", 2048, True, 2.0), _rec("te", 4096, True, 9.0, status="error")]
    cudnn = [_rec("cudnn", 1024, True, 1.0), _rec("cudnn", 2048, True, 3.0)]
    rows = page.te_vs_cudnn(te, te + cudnn)
    assert [r["seq_q"] for r in rows] == [1024, 2048]  # the failed TE point and unmatched points are left out
    assert [r["ratio"] for r in rows] == pytest.approx([1.0, 1.5])
    assert [r["word"] for r in rows] == ["on par", "faster"]
    s = page.summary(rows)
    assert (s.low, s.high, s.points, s.verdict) == (pytest.approx(1.0), pytest.approx(1.5), 2, "mixed")
    assert s.words == {"on par": 1, "faster": 1}
    assert page.summary([]) is None


def test_fp8_speedups_and_their_figure():
    recs = [
        _rec("cudnn", 4096, False, 2.0),
        _rec("cudnn_fp8_s448", 4096, False, 1.0),
        _rec("cudnn", 4096, True, 1.0),
        _rec("cudnn_fp8_s448", 4096, True, 1.25),
        _rec("cudnn_fp8_s448", 8192, True, 1.0),
    ]
    rows = page.fp8_speedups(recs)
    assert [(r["seq_q"], r["causal"]) for r in rows] == [(4096, False), (4096, True)]
    assert [r["ratio"] for r in rows] == pytest.approx([2.0, 0.8])
    assert [r["word"] for r in rows] == ["faster", "slower"]
    fig = page.fp8_speedup_figure(rows)
    ys = [float(c.lines[0].get_ydata()[0]) for c in fig.axes[0].containers]
    assert ys == pytest.approx([2.0, 0.8])  # no mask, then causal


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("bfloat16", ml_dtypes.bfloat16),
        ("float16", np.float16),
        ("FP8 E4M3", ml_dtypes.float8_e4m3fn),
        ("FP8 E5M2", ml_dtypes.float8_e5m2),
    ],
)
def test_formats_match_the_dtypes(name, dtype):
    sign, exp, man, largest = page.FORMATS[name]
    info = ml_dtypes.finfo(dtype)
    assert (exp, man) == (info.nexp, info.nmant)
    assert largest == pytest.approx(float(info.max), rel=1e-6)
    fig = page.formats_figure()
    assert len(fig.axes[0].patches) == 3 * 4


def test_around_kernel_splits_the_main_kernel_from_the_rest():
    recs = [
        {
            "impl": "cudnn",
            "causal": False,
            "status": "ok",
            "kernels": [
                {"name": "Memset", "us": 6.0, "count": 3.0, "kind": "memset"},
                {"name": "sdpa_flash_fprop", "us": 800.0, "count": 1.0, "kind": "kernel"},
                {"name": "python op", "us": 50.0, "count": 1.0, "kind": "op"},
            ],
        },
        {"impl": "te", "causal": False, "status": "error", "kernels": []},
    ]
    (a,) = page.around_kernel(recs)
    assert (a.impl, a.main_us, a.other_us) == ("cudnn", 800.0, 6.0)  # host ops are not device work
    assert a.other == (("Memset", 6.0),)


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


def _profiled(impl, kernel_us, extra_us, ms, p10, p90, *, causal=False, name="fmha_kernel_" + "x" * 120, T=4096):
    kernels = [{"name": name, "us": kernel_us, "count": 1.0, "kind": "kernel"},
               {"name": "Memset 3", "us": extra_us, "count": 1.0, "kind": "memset"}]  # fmt: skip
    return {**_rec(impl, T, causal, ms), "grid": "device_time", "kernels": kernels, "device_ms": (kernel_us + extra_us) / 1e3,
            "p10_ms": p10, "p90_ms": p90}  # fmt: skip


def test_device_pairs_set_two_profiles_of_one_point_side_by_side():
    te = _profiled("te", 873.2, 3.5, 0.90, 0.89, 0.91)
    jc = _profiled("cudnn", 835.9, 17.6, 0.95, 0.94, 0.96)  # host: TE faster, outside the spreads
    other_shape = _profiled("cudnn", 100.0, 1.0, 0.1, 0.09, 0.11, T=1024)
    (p,) = page.device_pairs([te, jc, other_shape])  # paired with the same shape only
    assert p.same_kernel and not p.causal
    assert (p.a_kernel_us, p.b_kernel_us) == (873.2, 835.9)
    assert p.a_device_us == pytest.approx(876.7) and p.b_device_us == pytest.approx(853.5)
    assert p.host.word == "faster" and p.host_gap_outside_kernels  # faster on the host, longer on the GPU
    on_par = _profiled("cudnn", 835.9, 17.6, 0.905, 0.88, 0.93)  # spreads overlap: nothing to attribute
    assert not page.device_pairs([te, on_par])[0].host_gap_outside_kernels
    shorter = _profiled("cudnn", 900.0, 17.6, 0.95, 0.94, 0.96)  # TE faster on both: the kernels explain it
    assert not page.device_pairs([te, shorter])[0].host_gap_outside_kernels
    different = _profiled("cudnn", 835.9, 17.6, 0.95, 0.94, 0.96, name="another_kernel")
    assert not page.device_pairs([te, different])[0].same_kernel
    assert page.device_pairs([te]) == []
    (row,) = page.device_pair_rows([p])
    assert row["TE kernel (µs)"] == "873.2" and row["TE on the host"] == "faster" and row["mask"] == "none"
