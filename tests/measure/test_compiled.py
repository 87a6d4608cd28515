import jax.numpy as jnp

from attention_tutorial.inputs import make_qkv
from attention_tutorial.kernels.blockwise import blockwise_attention
from attention_tutorial.kernels.reference import naive_attention
from attention_tutorial.measure.compiled import compile_stats, describe_kernels, kernels_in_hlo

HLO = """
  %a = bf16[4,128,8,64] custom-call(%p0), custom_call_target="__cublas$lt$matmul", backend_config={}
  %b = (bf16[4,128,8,64], u8[0]) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax"
  %c = bf16[4,128,8,64] custom-call(%p0), custom_call_target="__cublas$lt$matmul"
"""


def test_kernels_in_hlo_distinct_in_order():
    assert kernels_in_hlo(HLO) == ("__cublas$lt$matmul", "__cudnn$fmhaSoftmax")
    assert kernels_in_hlo("no custom calls") == ()


def test_describe_kernels_families():
    assert describe_kernels(("__cublas$lt$matmul", "__cudnn$fmhaSoftmax")).startswith("cuDNN fused attention")
    assert "ScaleBias" in describe_kernels(("__cudnn$fmhaScaleBiasSoftmax",))
    assert describe_kernels(("te_fused_attn_forward_ffi",)).startswith("TransformerEngine")
    both = describe_kernels(("te_fused_attn_forward_ffi", "__cublas$lt$matmul", "te_fused_attn_backward_ffi",
                             "te_fused_attn_forward_ffi"))  # fmt: skip
    assert both == "TransformerEngine fused attention (te_fused_attn_forward_ffi, te_fused_attn_backward_ffi)"
    assert "cuBLAS" in describe_kernels(("__cublas$lt$matmul",))
    assert describe_kernels(()).startswith("XLA")


def test_naive_temporaries_grow_quadratically_blockwise_linearly():
    """Measured from XLA's memory analysis: the (T, T) weights dominate naive; blockwise keeps O(T)."""
    naive, block = [], []
    for t in (256, 512, 1024):
        q, k, v = make_qkv(1, t, 2, 32)
        naive.append(compile_stats(lambda q, k, v: naive_attention(q, k, v), q, k, v).temp_bytes)
        block.append(compile_stats(lambda q, k, v: blockwise_attention(q, k, v, block_q=128, block_k=128), q, k, v)
                     .temp_bytes)  # fmt: skip
    assert naive[0] >= 2 * 256 * 256 * 4  # at least one float32 (N, T, T) matrix
    assert 3.5 < naive[2] / naive[1] < 4.5  # doubling T quadruples it
    assert block[2] / block[1] < 2.5  # doubling T at most doubles it
    assert block[2] < naive[2] / 4


def test_compile_stats_reports_seconds_and_no_library_kernel_on_cpu():
    q, k, v = make_qkv(1, 32, 2, 16, dtype=jnp.float32)
    stats = compile_stats(lambda q, k, v: naive_attention(q, k, v), q, k, v)
    assert stats.compile_s > 0 and stats.temp_bytes > 0
    assert stats.attention_kernel.startswith("XLA")


def test_compile_stats_each_matches_one_by_one_and_keeps_the_callers_precision():
    import jax
    import pytest

    from attention_tutorial.measure.compiled import compile_stats_each

    def f(q, k, v):
        return naive_attention(q, k, v, is_causal=True)

    sets = [make_qkv(1, t, 2, 32) for t in (64, 128, 256)]
    each = compile_stats_each(f, sets)
    alone = [compile_stats(f, *a) for a in sets]
    assert [s.temp_bytes for s in each] == [s.temp_bytes for s in alone]
    assert [s.kernels for s in each] == [s.kernels for s in alone]
    out = each[1].compiled(*sets[1])  # the executable runs, for its own shapes
    assert out.shape == sets[1][0].shape
    with jax.default_matmul_precision("highest"):  # traced in the caller's thread: the setting is in the program
        hi = compile_stats_each(f, sets[:1], workers=1)[0].compiled.as_text()
    assert "HIGHEST" in hi.upper() and "HIGHEST" not in each[0].compiled.as_text().upper()
    for bad in ([], 0, True, 2.0):
        with pytest.raises(ValueError, match="arg_sets|workers"):
            compile_stats_each(f, [] if bad == [] else sets, workers=None if bad == [] else bad)
