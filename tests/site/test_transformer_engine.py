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


def test_gap_by_length_and_less_time_say_it_in_percent():
    rows = [
        {"seq_q": 128, "ratio": 0.8, "word": "slower"},
        {"seq_q": 128, "ratio": 1.25, "word": "faster"},
        {"seq_q": 4096, "ratio": 1.01, "word": "on par"},
    ]
    assert page.less_time(1.25) == pytest.approx(20.0) and page.less_time(0.8) == pytest.approx(-25.0)
    short, long = page.gap_by_length(rows)
    assert (short["seq_q"], short["least"], short["most"], short["on_par"]) == (
        128,
        pytest.approx(-25.0),
        pytest.approx(20.0),
        False,
    )
    assert long["seq_q"] == 4096 and long["on_par"]


def test_te_vs_cudnn_figure_draws_each_pass_and_head_size():
    rows = [
        {"seq_q": t, "head_dim": h, "pass": p, "ratio": r, "low": r - 0.01, "high": r + 0.01}
        for (t, h, p, r) in [(128, 64, "fwd", 0.9), (512, 64, "fwd", 1.1), (128, 128, "fwd+bwd", 1.2)]
    ]
    fig = page.te_vs_cudnn_figure(rows)
    ax = fig.axes[0]
    drawn = {c.get_label(): list(c.lines[0].get_ydata()) for c in ax.containers}
    assert drawn == {"forward, H = 64": pytest.approx([0.9, 1.1]), "forward + backward, H = 128": [1.2]}
    assert ax.get_ylabel() == "TE's speed / cuDNN's"


def test_pays_from_and_same_error():
    rows = [
        {"seq_q": 4096, "causal": True, "word": "slower"},
        {"seq_q": 8192, "causal": True, "word": "faster"},
        {"seq_q": 16384, "causal": True, "word": "faster"},
        {"seq_q": 4096, "causal": False, "word": "faster"},
        {"seq_q": 8192, "causal": False, "word": "on par"},
    ]
    assert page.pays_from(rows, True) == 8192
    assert page.pays_from(rows, False) is None  # not faster at the longest T
    assert page.same_error(0.05939, 0.05931) and not page.same_error(0.059, 0.054)


def test_backend_words():
    recs = [{"status": "ok", "backend": "NVTE_F16_arbitrary_seqlen"}] * 3 + [{"status": "error", "backend": "x"}]
    assert page.backend_words(recs) == ("cuDNN's flash-attention backend", 3, True)
    assert page.backend_words([]) is None


def test_te_call_listing_spells_out_the_package_arguments():
    import ast
    import inspect
    import math

    from attention_tutorial import AttentionShape
    from attention_tutorial.kernels import te

    H, N, K = 128, 32, 8
    config = te.te_config(AttentionShape(8, 4096, 4096, N, K, H), causal=True)
    call = next(
        n
        for n in ast.walk(ast.parse(page.TE_CALL))
        if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("Attention")
    )
    given = {kw.arg: eval(ast.unparse(kw.value), {"math": math, "H": H, "N": N, "K": K}) for kw in call.keywords}
    assert given == config
    assert "apply({}, q, k, v, deterministic=True)" in page.TE_CALL
    assert "apply({}, q, k, v, deterministic=True)" in inspect.getsource(te.te_attention)


def test_the_fp8_check_finds_a_cast_on_cpu():
    import jax
    import jax.numpy as jnp

    from attention_tutorial.kernels import te

    x = jnp.ones((2, 16, 2, 8), jnp.bfloat16)
    assert te.hlo_fp8_types(lambda q: q.astype(jnp.float8_e4m3fn).astype(jnp.bfloat16), x) == ("f8e4m3fn",)
    assert te.hlo_fp8_types(lambda q: jax.nn.dot_product_attention(q, q, q), x) == ()
