import jax
import pytest

from attention_tutorial.train import profile
from attention_tutorial.train.model import Config


@pytest.mark.parametrize(
    "name, group",
    [
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", "attention"),
        ("input_scatter_fusion", "embedding gradient"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmuls"),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "matmuls"),
        ("loop_add_fusion", "other"),
        ("Memset 3", "other"),
    ],
)
def test_kernels_fall_into_their_group(name, group):
    assert profile.group_of(name) == group


def test_group_shares_sum_device_work_only():
    rows = [
        {"name": "input_scatter_fusion", "us": 20.0, "kind": "kernel"},
        {"name": "gemm_a", "us": 5.0, "kind": "kernel"},
        {"name": "gemm_b", "us": 3.0, "kind": "kernel"},
        {"name": "Memset", "us": 1.0, "kind": "memset"},
        {"name": "PjitFunction", "us": 99.0, "kind": "op"},
    ]
    assert profile.group_shares(rows) == {"embedding gradient": 20.0, "matmuls": 8.0, "other": 1.0}


def test_a_step_profile_on_this_device_names_its_groups():
    tiny = Config(layers=1, d_model=32, heads=2, head_dim=16, seq_len=32, batch=2, dtype="float32")
    (gather, onehot) = profile.profile_records(("xla",), ("gather", "onehot"), config=tiny, repeats=1)
    for rec, emb in ((gather, "gather"), (onehot, "onehot")):
        assert rec["status"] == "ok" and rec["embedding"] == emb and rec["median_ms"] > 0
        assert rec["kernels"] and all({"name", "us", "count", "kind"} <= set(k) for k in rec["kernels"])
    if jax.default_backend() != "gpu":  # cuDNN cannot run here: the record says so instead of failing
        missing = profile.step_profile("cudnn", config=tiny, repeats=1)
        assert missing["status"] == "unsupported" and missing["reason"]


def test_timed_gives_the_fields_of_an_ok_record():
    rec = profile.timed({"median_ms": 20.0, "step_flops": 5.0e12}, repeats=5)
    assert rec["p10_ms"] == rec["p90_ms"] == 20.0 and rec["tflops"] == pytest.approx(250.0)
    assert "5 profiled steps" in rec["timing"]
