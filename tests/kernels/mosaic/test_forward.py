"""The forward kernel: it lowers for CUDA on a CPU (with and without the profiler's regions, with and without its
exponentials, with part of them on the FMA units) and matches float64 on a Hopper GPU."""

import functools
import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape, make_qkv
from attention_tutorial.kernels.mosaic import forward
from attention_tutorial.kernels.mosaic.attention import mosaic_flash_attention, why_not
from attention_tutorial.kernels.mosaic.budget import NO_PROBE, MosaicConfig, Probe
from attention_tutorial.kernels.mosaic.masks import make_mask
from attention_tutorial.kernels.reference import reference_attention
from attention_tutorial.measure.compiled import kernels_used
from tests.kernels.mosaic.test_budget import CONFIGS
from tests.kernels.test_pallas_flash import reference_lse

PERSISTENT = [
    (128, MosaicConfig(persistent=True)),
    (128, MosaicConfig(persistent=True, heavy_first=True, schedule="turns", block_kv=176)),
    (256, MosaicConfig(block_kv=80, persistent=True)),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("t", "s", "n", "k"), [(1024, 1024, 4, 4), (256, 512, 8, 2)])
def test_lowers_to_one_mosaic_gpu_kernel(causal, t, s, n, k):
    """Traces the whole kernel (layouts, barriers, wgmma shapes) and lowers it for CUDA, without a GPU."""
    q = jax.ShapeDtypeStruct((2, t, n, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, s, k, 128), jnp.bfloat16)
    fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal))
    hlo = fn.trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()
    assert re.findall(r"custom_call @(mosaic_gpu\w*)", hlo) == ["mosaic_gpu_v2"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("head_dim", "cfg"), [(64, MosaicConfig()), (128, MosaicConfig()), *CONFIGS])
def test_configs_lower_to_one_mosaic_gpu_kernel(causal, head_dim, cfg):
    """Pipeline off/on × causal × H = 64, 128, 256: GQA, T < S."""
    q = jax.ShapeDtypeStruct((2, 256, 8, head_dim), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 512, 2, head_dim), jnp.bfloat16)
    fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg))
    hlo = fn.trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()
    assert re.findall(r"custom_call @(mosaic_gpu\w*)", hlo) == ["mosaic_gpu_v2"]


@pytest.mark.parametrize(("head_dim", "cfg"), [*CONFIGS, *PERSISTENT])
def test_configs_lower_with_x64_enabled(head_dim, cfg):
    q = jax.ShapeDtypeStruct((1, 256, 4, head_dim), jnp.bfloat16)
    with jax.enable_x64(True):
        fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=True, config=cfg))
        hlo = fn.trace(q, q, q).lower(lowering_platforms=("cuda",)).as_text()
    assert len(re.findall(r"custom_call @mosaic_gpu", hlo)) == 1


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("head_dim", "cfg"), PERSISTENT)
@pytest.mark.parametrize("sms", [3, 132])
def test_persistent_ctas_lower_to_one_mosaic_gpu_kernel(causal, head_dim, cfg, sms, monkeypatch):
    """One CTA per SM (132 on an H200: fewer than the 2 · 4 · 8 = 64 query blocks here launch 64), each walking
    its query blocks; T ragged."""
    monkeypatch.setattr(forward, "sm_count", lambda: sms)
    q = jax.ShapeDtypeStruct((2, 500, 8, head_dim), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 500, 2, head_dim), jnp.bfloat16)
    fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg))
    hlo = fn.trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()
    assert re.findall(r"custom_call @(mosaic_gpu\w*)", hlo) == ["mosaic_gpu_v2"]


def test_persistent_ctas_launch_one_per_sm_or_one_per_block(monkeypatch):
    monkeypatch.setattr(forward, "sm_count", lambda: 132)
    mask = make_mask(2, 1000, 1000, is_causal=True)[0]
    plan = forward.make_plan(MosaicConfig(persistent=True), mask, (2, 1000, 16, 128), 1, None)
    assert plan.items.grid == ((132,), ("cta",)) and plan.items.blocks == 8  # 2 · 16 · 8 = 256 blocks
    plan = forward.make_plan(MosaicConfig(persistent=True), mask, (1, 1000, 4, 128), 1, None)
    assert plan.items.grid == ((32,), ("cta",))  # 32 blocks, one CTA each
    plan = forward.make_plan(MosaicConfig(), mask, (2, 1000, 16, 128), 1, None)
    assert plan.items.grid == ((16, 8, 2), ("heads", "q_seq", "batch"))


def check_output(out, q, k, v, causal):
    out = np.asarray(out, np.float32)
    assert np.isfinite(out).all()
    rows = slice(0, 256)  # the float64 reference on the first 256 rows keeps the test quick
    ref = reference_attention(q[:, rows], k, v, is_causal=causal)
    np.testing.assert_allclose(out[:, rows], ref, atol=1e-2, rtol=1e-2)
    if causal:  # and the last rows, where the mask matters least
        last = slice(q.shape[1] - 128, q.shape[1])
        ref = reference_attention(q, k, v, is_causal=True)[:, last]
        np.testing.assert_allclose(out[:, last], ref, atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gpu_kernel_matches_reference(causal, head_dim, dtype):
    if reason := why_not(AttentionShape(1, 1024, 1024, 8, 8, head_dim), dtype, causal):
        pytest.skip(reason)
    for b, t, s, n, k in ((2, 1024, 1024, 8, 8), (1, 512, 1024, 8, 2), (1, 1024, 256, 4, 1)):
        q, kk, v = make_qkv(b, t, n, head_dim, seq_kv=s, kv_heads=k, dtype=dtype, seed=t + s)
        fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal))
        check_output(fn(q, kk, v), q, kk, v, causal)
        assert any(name.startswith("mosaic_gpu") for name in kernels_used(fn, q, kk, v))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_kv", [160, 176])
def test_gpu_longer_key_tiles_match_reference(causal, head_dim, block_kv):
    """block_kv = 160 and 176 (v in 64- and 32-byte swizzled tiles), whole and ragged key tiles, GQA."""
    if reason := why_not(AttentionShape(1, 1024, 1024, 8, 8, head_dim), jnp.bfloat16, causal):
        pytest.skip(reason)
    cfg = MosaicConfig(block_kv=block_kv)
    for b, t, s, n, k in ((2, 960, 960, 8, 8), (1, 500, 1000, 8, 2)):
        q, kk, v = make_qkv(b, t, n, head_dim, seq_kv=s, kv_heads=k, dtype=jnp.bfloat16, seed=t + s)
        fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg))
        check_output(fn(q, kk, v), q, kk, v, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("head_dim", "cfg"), PERSISTENT)
def test_gpu_persistent_ctas_match_reference(causal, head_dim, cfg):
    """132 CTAs walking 256 query blocks (two or three each), short and ragged sequences, GQA, T != S."""
    if reason := why_not(AttentionShape(1, 1024, 1024, 8, 8, head_dim), jnp.bfloat16, causal):
        pytest.skip(reason)
    for b, t, s, n, k in ((4, 1000, 1000, 16, 16), (2, 520, 1500, 8, 2), (8, 256, 256, 4, 4)):
        q, kk, v = make_qkv(b, t, n, head_dim, seq_kv=s, kv_heads=k, dtype=jnp.bfloat16, seed=t + s)
        fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg))
        out = np.asarray(fn(q, kk, v), np.float32)  # every row: a block no CTA walked would be zeros
        np.testing.assert_allclose(out, reference_attention(q, kk, v, is_causal=causal), atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_lse_matches_float64(causal):
    if reason := why_not(AttentionShape(1, 256, 512, 4, 2, 128), jnp.bfloat16, causal):
        pytest.skip(reason)
    q, k, v = make_qkv(1, 256, 4, 128, seq_kv=512, kv_heads=2, dtype=jnp.bfloat16, seed=5)
    out, lse = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, return_lse=True))(q, k, v)
    np.testing.assert_allclose(np.asarray(lse), reference_lse(q, k, is_causal=causal), atol=1e-2, rtol=1e-3)
    check_output(out, q, k, v, causal)


def test_the_kernel_reads_alone():
    """The kernel a page prints: one function of about 150 lines as ``ruff format`` lays it out, the copy warpgroup
    apart, no FP8 branch in its module (FP8 brings its own operands)."""
    lines = inspect.getsource(forward.forward_kernel).splitlines()
    assert len(lines) <= 160, len(lines)
    source = inspect.getsource(forward)
    assert "float8" not in source and "e4m3" not in source.lower()


def _jaxpr(cfg, causal, shape=(1, 512, 2, 128), probe=NO_PROBE):
    q = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    fn = functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg, probe=probe)
    return jax.make_jaxpr(fn)(q, q, q)


def _scope_names(jaxpr, found=None):
    """Every named scope the equations of ``jaxpr`` and its sub-jaxprs (the kernel's bodies) were traced under."""
    from jax.extend.core import jaxprs_in_params

    found = set() if found is None else found
    for eqn in jaxpr.eqns:
        found |= {scope.name for scope in eqn.source_info.name_stack.stack}
        for sub in jaxprs_in_params(eqn.params):
            _scope_names(sub, found)
    return found


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pipeline", [False, True])
def test_profiler_regions_exist_only_when_profiling_and_add_no_operation(pipeline, causal):
    plain = MosaicConfig(pipeline=pipeline)
    profiled = Probe(profile_space=64, profile_dir="/tmp/trace")
    assert _scope_names(_jaxpr(plain, causal).jaxpr) == {"forward_kernel"}
    regions = {"forward_kernel", "qk", "softmax", "pv", "wait", "copy"}
    assert _scope_names(_jaxpr(plain, causal, probe=profiled).jaxpr) == regions
    # the same operations either way: the two programs differ only in the compiler parameters that switch it on
    a, b = str(_jaxpr(plain, causal)).splitlines(), str(_jaxpr(plain, causal, probe=profiled)).splitlines()
    differ = [(x, y) for x, y in zip(a, b) if x != y]
    assert len(a) == len(b) and len(differ) == 1 and "profile_space=64" in differ[0][1]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pipeline", [False, True])
def test_no_exp_drops_every_exponential_of_the_forward_and_nothing_else(pipeline, causal):
    def counts(probe):
        text = str(_jaxpr(MosaicConfig(pipeline=pipeline), causal, probe=probe))
        ops = re.findall(r"^\s*(?:[\w:\[\],{}<> ]+ = )?(\w+)[\[ ]", text, re.M)  # each equation's primitive
        return {op: ops.count(op) for op in ("exp2", "log", "reduce_max", "reduce_sum", "wgmma_ref", "barrier_wait")}

    as_is, no_exp = counts(Probe()), counts(Probe(no_exp=True))
    assert as_is["exp2"] >= 2 and no_exp["exp2"] == 0  # alpha and p, in each loop
    assert {k: v for k, v in as_is.items() if k != "exp2"} == {k: v for k, v in no_exp.items() if k != "exp2"}


@pytest.mark.gpu
@pytest.mark.parametrize("pipeline", [False, True])
def test_gpu_profiled_forward_writes_a_trace_and_the_same_numbers(pipeline, tmp_path):
    if reason := why_not(AttentionShape(1, 1024, 1024, 2, 2, 128), jnp.bfloat16, False):
        pytest.skip(reason)
    q, k, v = make_qkv(1, 1024, 2, 128, dtype=jnp.bfloat16, seed=4)
    from attention_tutorial.measure.timeline import profile_space

    space = profile_space(AttentionShape(1, 1024, 1024, 2, 2, 128), MosaicConfig(pipeline=pipeline).block_kv)
    cfg, probe = MosaicConfig(pipeline=pipeline), Probe(profile_space=space, profile_dir=str(tmp_path))
    out = jax.block_until_ready(jax.jit(functools.partial(mosaic_flash_attention, config=cfg, probe=probe))(q, k, v))
    jax.effects_barrier()  # the trace is written by a host callback
    plain = jax.jit(functools.partial(mosaic_flash_attention, config=MosaicConfig(pipeline=pipeline)))(q, k, v)
    # the same arithmetic; at most a bf16 rounding apart where the compiler schedules it differently
    assert np.max(np.abs(np.asarray(out, np.float32) - np.asarray(plain, np.float32))) <= 2**-7
    assert len(list(tmp_path.glob("*.json"))) == 1


EXP_POLY_CONFIGS = [
    (128, MosaicConfig(), 0.25),
    (128, MosaicConfig(pipeline=True), 0.5),
    (128, MosaicConfig(), 1.0),
    (256, MosaicConfig(block_kv=64), 0.25),
    (256, MosaicConfig(block_kv=64, pipeline=True), 0.25),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("head_dim", "cfg", "poly"), EXP_POLY_CONFIGS)
def test_exp_poly_lowers_to_one_mosaic_gpu_kernel(causal, head_dim, cfg, poly):
    """The polynomial's integer and bit operations, the column split and join in wgmma's layout: Mosaic GPU lowers
    them for CUDA, plain and pipelined."""
    q = jax.ShapeDtypeStruct((2, 256, 8, head_dim), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 512, 2, head_dim), jnp.bfloat16)
    fn = jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg, probe=Probe(exp_poly=poly)))
    hlo = fn.trace(q, kv, kv).lower(lowering_platforms=("cuda",)).as_text()
    assert re.findall(r"custom_call @(mosaic_gpu\w*)", hlo) == ["mosaic_gpu_v2"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pipeline", [False, True])
def test_exp_poly_changes_only_the_exponentials_of_p(pipeline, causal):
    def counts(probe):
        text = str(_jaxpr(MosaicConfig(pipeline=pipeline), causal, probe=probe))
        ops = re.findall(r"^\s*(?:[\w:\[\],{}<> ]+ = )?(\w+)[\[ ]", text, re.M)  # each equation's primitive
        names = (
            "exp2",
            "shift_left",
            "bitcast_convert_type",
            "inline_mgpu_p",
            "slice",
            "reduce_max",
            "reduce_sum",
            "wgmma_ref",
            "barrier_wait",
        )
        return {op: ops.count(op) for op in names}

    as_is = counts(Probe())
    split, poly = (counts(Probe(exp_poly=f)) for f in (0.25, 1.0))
    assert as_is["shift_left"] == as_is["inline_mgpu_p"] == 0
    loops = as_is["exp2"] // 2  # each softmax: exp2 of alpha and of p
    assert split["exp2"] == as_is["exp2"] and split["shift_left"] == split["inline_mgpu_p"] == loops
    assert poly["exp2"] == loops and poly["shift_left"] == loops and poly["inline_mgpu_p"] == 0  # p all on the FMAs
    same = ("reduce_max", "reduce_sum", "wgmma_ref", "barrier_wait")
    assert {k: split[k] for k in same} == {k: poly[k] for k in same} == {k: as_is[k] for k in same}


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("head_dim", "cfg", "poly"), EXP_POLY_CONFIGS)
def test_gpu_exp_poly_matches_reference_and_the_kernel_without_it(causal, head_dim, cfg, poly):
    """Within bfloat16 of float64, and of the same kernel with every exponential on MUFU.EX2."""
    if reason := why_not(AttentionShape(1, 1024, 1024, 8, 8, head_dim), jnp.bfloat16, causal):
        pytest.skip(reason)
    for b, t, s, n, k in ((2, 512, 1024, 8, 2), (1, 1024, 256, 4, 1)):  # GQA T<S, MQA T>S
        q, kk, v = make_qkv(b, t, n, head_dim, seq_kv=s, kv_heads=k, dtype=jnp.bfloat16, seed=t + s + head_dim)
        out, lse = jax.jit(
            functools.partial(
                mosaic_flash_attention, is_causal=causal, config=cfg, probe=Probe(exp_poly=poly), return_lse=True
            )
        )(q, kk, v)
        check_output(out, q, kk, v, causal)
        np.testing.assert_allclose(
            np.asarray(lse)[..., :256], reference_lse(q[:, :256], kk, is_causal=causal), atol=1e-2, rtol=1e-3
        )
        mufu = np.asarray(
            jax.jit(functools.partial(mosaic_flash_attention, is_causal=causal, config=cfg))(q, kk, v), np.float32
        )
        # p within 1.02e-4: at most a last-bit flip of the bfloat16 output apart (2^-7 of it, or of 1 below 1)
        assert (np.abs(np.asarray(out, np.float32) - mufu) <= 2**-7 * np.maximum(1, np.abs(mufu))).all()
