"""The ablations: which kernels and variants, each pair's records (with a stand-in for the GPU kernels), and the
ratios read back from records written by hand."""

import functools

import jax
import jax.numpy as jnp
import pytest

from attention_tutorial.measure import ablations as ab
from attention_tutorial.measure.ablations import KERNELS, AblationKernel, ablation_ratios, ablation_records
from attention_tutorial.measure.sweep import check_record
from attention_tutorial.results.store import validate


def test_the_kernels_are_the_plain_and_pipelined_forwards_at_h128_and_h256_and_fp8_with_both_masks():
    got = {(k.impl, k.head_dim, k.causal, k.baseline) for k in KERNELS}
    want = {
        (impl, H, causal, "cudnn") for impl in ("mosaic", "mosaic_pipe") for H in (128, 256) for causal in (False, True)
    } | {("mosaic_fp8_regs", 128, c, "cudnn_fp8_s448") for c in (False, True)}
    assert got == want and len(KERNELS) == len(want)
    assert ab.SHAPE == (4, 8192, 16) and ab.ROUNDS == 2
    assert ab.VARIANTS == ("as_is", "no_exp", "exp_poly_25", "exp_poly_50") and set(ab.DESCRIPTIONS) == set(ab.VARIANTS)
    assert ab.EXP_POLY == {"exp_poly_25": 0.25, "exp_poly_50": 0.5}


def test_only_the_plain_and_pipelined_bf16_forwards_at_h128_try_the_polynomial():
    poly = {(k.impl, k.head_dim, k.causal) for k in KERNELS if "exp_poly_25" in ab.kernel_variants(k)}
    assert poly == {(impl, 128, causal) for impl in ("mosaic", "mosaic_pipe") for causal in (False, True)}
    assert all(
        ab.kernel_variants(k) == ab.VARIANTS
        if (k.impl, k.head_dim, k.causal) in poly
        else ab.kernel_variants(k) == ("as_is", "no_exp")
        for k in KERNELS
    )
    assert sum(len(ab.kernel_variants(k)) for k in KERNELS) == 28  # pairs per round: 2 × 10 kernels + 2 × 4


@pytest.mark.parametrize("variant", ["exp_poly_25", "exp_poly_50"])
@pytest.mark.parametrize("kernel", [k for k in KERNELS if k.head_dim == 128], ids=lambda k: f"{k.impl}-{k.causal}")
def test_exp_poly_moves_that_fraction_of_ps_exponentials_to_the_polynomial(kernel, variant):
    q = jax.ShapeDtypeStruct((1, 256, 2, 128), jnp.bfloat16)
    text = {v: str(jax.make_jaxpr(ab.kernel_fn(kernel, v))(q, q, q)) for v in ("as_is", variant)}
    cols = round(ab.EXP_POLY[variant] * 128)
    assert text["as_is"].count("shift_left") == 0 < text[variant].count("shift_left")
    assert f"f32[64,{cols}] = slice" in text[variant] and f"f32[64,{128 - cols}] = exp2" in text[variant]
    assert text["as_is"].count("wgmma_ref") == text[variant].count("wgmma_ref") > 0


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: f"{k.impl}-{k.head_dim}-{k.causal}")
def test_no_exp_removes_every_exponential_of_our_kernel_and_keeps_its_tiles(kernel):
    q = jax.ShapeDtypeStruct((1, 256, 2, kernel.head_dim), jnp.bfloat16)
    text = {v: str(jax.make_jaxpr(ab.kernel_fn(kernel, v))(q, q, q)) for v in ab.VARIANTS}
    assert text["as_is"].count("exp2") >= 2 and text["no_exp"].count("exp2") == 0
    assert text["as_is"].count("wgmma_ref") == text["no_exp"].count("wgmma_ref") > 0


def test_bad_variants_and_kernels_are_refused():
    with pytest.raises(ValueError, match=r"variant must be one of \('as_is', 'no_exp', .*\); got 'fast'"):
        ab.kernel_fn(KERNELS[0], "fast")
    with pytest.raises(ValueError, match=r"kernel\.impl must be"):
        ab.kernel_fn(AblationKernel("pallas", 128, False, "cudnn"), "as_is")
    with pytest.raises(ValueError, match=r"kernel\.baseline must be"):
        ab.baseline_fn(AblationKernel("mosaic", 128, False, "xla"))
    with pytest.raises(ValueError, match="rounds must be a positive int; got 0"):
        ablation_records(rounds=0)
    for bad in ("as_is", (), ("as_is", "exp_poly_10")):
        with pytest.raises(ValueError, match=r"variants must be a non-empty sequence of \('as_is'"):
            ablation_records(variants=bad)


def _xla(q, k, v, *, is_causal=False, scale=1.0):  # a kernel that runs on any backend
    return jax.nn.dot_product_attention(q * scale, k, v, is_causal=is_causal, implementation="xla")


def _stand_ins(monkeypatch, fail=None):
    """Our kernels and cuDNN replaced by XLA's attention (ours 'no_exp' scaled so it differs), runnable on a CPU."""
    monkeypatch.setattr(ab, "why_not", lambda kernel, shape: None)
    monkeypatch.setattr(ab, "baseline_fn", lambda kernel: functools.partial(_xla, is_causal=kernel.causal))

    def ours(kernel, variant):
        if fail and (kernel.impl, variant) == fail:
            raise RuntimeError("it broke")
        return functools.partial(_xla, is_causal=kernel.causal, scale=0.5 if variant == "no_exp" else 1.0)

    monkeypatch.setattr(ab, "kernel_fn", ours)


TINY = {"shape": (1, 128, 2), "repeats": 2, "warmup": 1, "max_seconds": 0.01, "min_sample_ms": 0.1}


def test_each_kernel_record_has_its_cudnn_record_timed_beside_it_in_every_round(monkeypatch):
    _stand_ins(monkeypatch)
    kernels = (
        AblationKernel("mosaic", 128, False, "cudnn"),  # in all four variants
        AblationKernel("mosaic_fp8_regs", 128, True, "cudnn_fp8_s448"),  # as it is and without exp2
    )
    recs = ablation_records(kernels=kernels, rounds=2, **TINY)
    assert len(recs) == (4 + 2) * 2 * 2  # (kernel, variant) pairs × rounds × (ours, cuDNN)
    for r in recs:
        assert check_record(r) == [] and r["status"] == "ok" and r["experiment"] == "ablation"
        assert (r["batch"], r["seq_q"], r["seq_kv"], r["heads"], r["kv_heads"]) == (1, 128, 128, 2, 2)
    ours = [r for r in recs if r["impl"] == r["pair"]]
    assert {(r["impl"], r["variant"], r["round"]) for r in ours} == {
        (k.impl, v, n) for k in kernels for v in ab.kernel_variants(k) for n in (1, 2)
    }
    for r in ours:  # exactly one baseline per kernel record, the one timed right before it
        mates = [c for c in recs if c["impl"] != c["pair"] and ab._pair_key(c) == ab._pair_key(r)]
        assert len(mates) == 1 and recs.index(mates[0]) == recs.index(r) - 1
        assert mates[0]["impl"] == ("cudnn_fp8_s448" if r["impl"] == "mosaic_fp8_regs" else "cudnn")
        assert r["dtype"] == mates[0]["dtype"] == ("float8_e4m3fn" if r["impl"] == "mosaic_fp8_regs" else "bfloat16")
    assert [r["round"] for r in recs] == [1] * 12 + [2] * 12  # round by round over all pairs
    prov = {
        "gpu": "g",
        "driver": "d",
        "jax": "j",
        "jaxlib": "j",
        "cudnn": "c",
        "transformer_engine": None,
        "python": "p",
        "created": "2026-01-01T00:00:00",
        "command": "c",
        "matmul_bf16_tflops": None,
        "copy_gbps": None,
        "grids": {"ablations": {"created": "2026-01-01T00:00:00"}},
    }
    assert validate({"provenance": prov, "records": [{**r, "grid": "ablations"} for r in recs]}) == []
    ratios = ablation_ratios(recs)
    assert [(x.impl, x.variant, len(x.per_round)) for x in ratios] == [
        ("mosaic", "as_is", 2),
        ("mosaic", "no_exp", 2),
        ("mosaic", "exp_poly_25", 2),
        ("mosaic", "exp_poly_50", 2),
        ("mosaic_fp8_regs", "as_is", 2),
        ("mosaic_fp8_regs", "no_exp", 2),
    ]


def test_variants_chooses_the_same_variants_for_every_kernel(monkeypatch):
    _stand_ins(monkeypatch)
    kernels = (AblationKernel("mosaic", 128, False, "cudnn"), AblationKernel("mosaic_pipe", 128, True, "cudnn"))
    recs = ablation_records(kernels=kernels, rounds=1, variants=("as_is", "exp_poly_25"), **TINY)
    assert [(r["impl"], r["variant"]) for r in recs] == [
        ("cudnn", "as_is"),
        ("mosaic", "as_is"),
        ("cudnn", "exp_poly_25"),
        ("mosaic", "exp_poly_25"),
        ("cudnn", "as_is"),
        ("mosaic_pipe", "as_is"),
        ("cudnn", "exp_poly_25"),
        ("mosaic_pipe", "exp_poly_25"),
    ]


def test_a_pair_that_fails_is_recorded_on_both_sides_in_every_round_and_the_others_stand(monkeypatch):
    _stand_ins(monkeypatch, fail=("mosaic", "no_exp"))
    recs = ablation_records(kernels=(AblationKernel("mosaic", 64, False, "cudnn"),), rounds=2, **TINY)
    bad = [r for r in recs if r["variant"] == "no_exp"]
    assert len(bad) == 4 and all(r["status"] == "error" and "it broke" in r["reason"] for r in bad)
    assert all(check_record(r) == [] for r in recs)
    assert all(r["status"] == "ok" for r in recs if r["variant"] == "as_is")


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU answer")
def test_off_hopper_every_pair_is_unsupported_with_the_reason():
    recs = ablation_records(kernels=KERNELS[:1], rounds=1, shape=(1, 256, 2))
    assert len(recs) == 2 * len(ab.kernel_variants(KERNELS[0])) == 8
    assert all(r["status"] == "unsupported" and "Hopper" in r["reason"] for r in recs)


def _rec(impl, pair, variant, rnd, median, p10, p90, *, causal=False, status="ok", H=128):
    return {
        "grid": "ablations",
        "impl": impl,
        "pair": pair,
        "variant": variant,
        "round": rnd,
        "batch": 4,
        "seq_q": 8192,
        "seq_kv": 8192,
        "heads": 16,
        "kv_heads": 16,
        "head_dim": H,
        "causal": causal,
        "status": status,
        "median_ms": median,
        "p10_ms": p10,
        "p90_ms": p90,
    }


def test_ablation_ratios_are_cudnns_time_over_ours_round_by_round_with_the_range_over_rounds():
    recs = [
        _rec("cudnn", "mosaic", "as_is", 1, 1.00, 0.98, 1.02),
        _rec("mosaic", "mosaic", "as_is", 1, 1.04, 1.02, 1.10),
        _rec("cudnn", "mosaic", "as_is", 2, 1.00, 0.99, 1.01),
        _rec("mosaic", "mosaic", "as_is", 2, 0.98, 0.97, 1.00),
        _rec("cudnn", "mosaic", "no_exp", 1, 1.00, 0.99, 1.01),
        _rec("mosaic", "mosaic", "no_exp", 1, 0.80, 0.79, 0.81),
        # a failed pair is left out; a pair of another mask stands apart
        _rec("cudnn", "mosaic", "no_exp", 2, 1.0, 1.0, 1.0),
        _rec("mosaic", "mosaic", "no_exp", 2, None, None, None, status="error"),
        _rec("cudnn", "mosaic", "as_is", 1, 2.0, 2.0, 2.0, causal=True),
        _rec("mosaic", "mosaic", "as_is", 1, 1.0, 1.0, 1.0, causal=True),
        {"grid": "beyond", "impl": "mosaic"},  # another grid: ignored
    ]
    as_is, no_exp, causal = ablation_ratios(recs)
    assert (as_is.impl, as_is.variant, as_is.causal, as_is.baseline) == ("mosaic", "as_is", False, "cudnn")
    assert as_is.per_round == pytest.approx((1.00 / 1.04, 1.00 / 0.98))
    assert as_is.low == pytest.approx(0.98 / 1.10) and as_is.high == pytest.approx(1.01 / 0.97)  # within a round
    assert as_is.median == pytest.approx((1 / 1.04 + 1 / 0.98) / 2)
    assert no_exp.per_round == pytest.approx((1.25,)) and no_exp.median == pytest.approx(1.25)
    assert causal.causal and causal.per_round == (2.0,)
    assert ablation_ratios([]) == []
