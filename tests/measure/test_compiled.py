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
    both = describe_kernels(
        ("te_fused_attn_forward_ffi", "__cublas$lt$matmul", "te_fused_attn_backward_ffi", "te_fused_attn_forward_ffi")
    )
    assert both == "TransformerEngine fused attention (te_fused_attn_forward_ffi, te_fused_attn_backward_ffi)"
    assert "cuBLAS" in describe_kernels(("__cublas$lt$matmul",))
    assert describe_kernels(()).startswith("XLA")


def test_naive_temporaries_grow_quadratically_blockwise_linearly():
    """Measured from XLA's memory analysis: the (T, T) weights dominate naive; blockwise keeps O(T)."""
    naive, block = [], []
    for t in (256, 512, 1024):
        q, k, v = make_qkv(1, t, 2, 32)
        naive.append(compile_stats(lambda q, k, v: naive_attention(q, k, v), q, k, v).temp_bytes)
        block.append(
            compile_stats(lambda q, k, v: blockwise_attention(q, k, v, block_q=128, block_k=128), q, k, v).temp_bytes
        )
    assert naive[0] >= 2 * 256 * 256 * 4  # at least one float32 (N, T, T) matrix
    assert 3.5 < naive[2] / naive[1] < 4.5  # doubling T quadruples it
    assert block[2] / block[1] < 2.5  # doubling T at most doubles it
    assert block[2] < naive[2] / 4


def test_compile_stats_reports_seconds_and_no_library_kernel_on_cpu():
    q, k, v = make_qkv(1, 32, 2, 16, dtype=jnp.float32)
    stats = compile_stats(lambda q, k, v: naive_attention(q, k, v), q, k, v)
    assert stats.compile_s > 0 and stats.temp_bytes > 0
    assert stats.attention_kernel.startswith("XLA")
