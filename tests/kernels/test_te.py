import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape, make_qkv
from attention_tutorial.kernels import te
from attention_tutorial.kernels.reference import reference_attention


def test_argument_mapping():
    cfg = te.te_config(AttentionShape(2, 128, 128, 32, 8, 128), causal=True)
    assert cfg["num_attention_heads"] == 32 and cfg["num_gqa_groups"] == 8 and cfg["head_dim"] == 128
    assert cfg["attn_mask_type"] == "causal" and cfg["qkv_layout"] == "bshd_bshd_bshd"
    assert cfg["transpose_batch_sequence"] is False
    assert cfg["scale_factor"] == pytest.approx(128**-0.5)
    assert te.te_config(AttentionShape(1, 8, 8, 4, 4, 64), causal=False)["attn_mask_type"] == "no_mask"


def test_without_gpu_or_te_it_says_why():
    reason = te.why_not(AttentionShape(1, 8, 8, 1, 1, 64), jnp.bfloat16, True)
    if jax.default_backend() != "gpu":
        assert "GPU" in reason
    elif not te.installed():
        assert "not installed" in reason and "[te]" in reason
    else:
        assert reason is None


@pytest.mark.te
@pytest.mark.parametrize("causal", [False, True])
def test_te_matches_reference_and_runs_te_kernel(causal):
    from attention_tutorial.measure.compiled import kernels_used

    q, k, v = make_qkv(2, 512, 8, 128, kv_heads=2, dtype=jnp.bfloat16, seed=2)
    fn = lambda q, k, v: te.te_attention(q, k, v, is_causal=causal)  # noqa: E731
    out = np.asarray(jax.jit(fn)(q, k, v), np.float32)
    np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=causal), atol=1e-2, rtol=1e-2)
    assert any(t.startswith("te_fused_attn") for t in kernels_used(fn, q, k, v))


@pytest.mark.te
def test_te_reports_a_fused_backend_and_rejects_float32():
    shape = AttentionShape(2, 4096, 4096, 16, 16, 128)
    assert te.te_backend(shape, jnp.bfloat16, causal=True).startswith("NVTE_F16")
    assert te.te_backend(shape, jnp.bfloat16, causal=False, training=True).startswith("NVTE_F16")
    assert te.te_backend(shape, jnp.float32, causal=True).startswith("NVTE_No_Backend")


def test_bad_arguments_and_a_missing_install_are_named():
    shape = AttentionShape(1, 16, 16, 2, 2, 8)
    with pytest.raises(ValueError, match="causal must be True or False"):
        te.why_not(shape, "bfloat16", "no")
    with pytest.raises(ValueError, match="AttentionShape"):
        te.te_config((1, 2), True)
    if not te.installed():  # what a call without TE says: how to install it, not "No module named ..."
        q, k, v = make_qkv(1, 16, 2, 8, dtype=jnp.bfloat16)
        for call in (lambda: te.te_attention(q, k, v), te.delayed_scaling_recipe):
            with pytest.raises(ImportError, match=r"attention-tutorial\[te\]"):
                call()
