import datetime
import importlib.metadata
import platform
import re

import jax

from attention_tutorial.env import environment, timestamp
from attention_tutorial.measure.ceilings import measure_ceilings

VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([.+-]?\w+)*$")  # 0.10.2, 9.19.0, 2.8.0+cu12, 0.11.2.dev20260101


def test_environment_report_values():
    env = environment()
    expected_keys = {
        "backend",
        "devices",
        "gpu",
        "compute_capability",
        "driver",
        "gpu_memory_mib",
        "jax",
        "jaxlib",
        "jax_cuda_plugin",
        "cudnn",
        "transformer_engine",
        "flax",
        "python",
        "cpu",
        "created",
        "commit",
        "dirty",
    }
    assert set(env) == expected_keys
    assert env["backend"] == jax.default_backend() in ("cpu", "gpu")
    assert env["devices"] == [f"{d.platform}:{d.id} {d.device_kind}" for d in jax.devices()] and env["devices"]
    assert env["jax"] == jax.__version__ and env["jaxlib"] == importlib.metadata.version("jaxlib")
    assert env["python"] == platform.python_version() and env["cpu"]
    for key in ("jax", "jaxlib", "jax_cuda_plugin", "cudnn", "transformer_engine", "flax"):
        assert env[key] is None or VERSION.match(env[key]), (key, env[key])
    created = datetime.datetime.fromisoformat(env["created"])
    assert created.utcoffset() == datetime.timedelta(0)  # UTC, with its offset written
    assert abs(datetime.datetime.now(datetime.UTC) - created) < datetime.timedelta(minutes=5)
    if jax.default_backend() == "gpu":
        assert env["gpu"] == jax.devices()[0].device_kind and env["cudnn"] is not None
        assert re.match(r"^\d+\.\d+$", str(env["compute_capability"]))
        assert env["gpu_memory_mib"] is None or env["gpu_memory_mib"] > 1024  # nvidia-smi may be absent
    else:
        assert env["gpu"] is None and env["cudnn"] is None and env["compute_capability"] is None
        assert env["driver"] is None and env["gpu_memory_mib"] is None


def test_timestamp_is_utc_to_the_second():
    stamp = timestamp()
    assert re.match(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\+00:00$", stamp), stamp


def test_ceilings_are_positive_and_plausible():
    c = measure_ceilings(repeats=5)
    assert c["matmul_bf16_tflops"] > 0 and c["copy_gbps"] > 0 and c["read_gbps"] > 0
    assert c["matmul_bf16_tflops"] < 2000  # no chip here beats ~2 PFLOP/s dense bf16
