import jax

from attention_tutorial.env import environment
from attention_tutorial.measure.ceilings import measure_ceilings


def test_environment_report_has_versions():
    env = environment()
    for key in (
        "backend",
        "devices",
        "gpu",
        "driver",
        "jax",
        "jaxlib",
        "cudnn",
        "transformer_engine",
        "python",
        "created",
    ):
        assert key in env
    assert env["jax"] == jax.__version__
    if jax.default_backend() != "gpu":
        assert env["gpu"] is None and env["cudnn"] is None


def test_ceilings_are_positive_and_plausible():
    c = measure_ceilings(repeats=5)
    assert c["matmul_bf16_tflops"] > 0 and c["copy_gbps"] > 0 and c["read_gbps"] > 0
    assert c["matmul_bf16_tflops"] < 2000  # no chip here beats ~2 PFLOP/s dense bf16
