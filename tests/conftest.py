"""Shared fixtures: GPU/TE markers skip with a reason where the hardware or package is missing."""

from __future__ import annotations

import os
import shutil
import sys

# XLA flags, set before JAX initialises its backends (flags already in XLA_FLAGS are kept as they are).
# Eight simulated CPU devices for the context-parallel tests:
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
# Without a GPU, LLVM's quickest code generation for the CPU: the tests compile hundreds of small programs and run
# each a few times, so compiling is most of their time (a quarter less with these); a GPU's kernels stay optimised.
if shutil.which("nvidia-smi") is None and "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

import jax
import pytest
from hypothesis import HealthCheck, settings

# Computations on the CPU run where they are called, not queued: the Mosaic GPU interpreter runs each kernel's
# warpgroups as computations launched from inside the kernel's own computation, and a test that queues many small
# computations behind a running kernel (a model run op by op) can take every slot the CPU client allows in flight,
# so the kernel's warpgroups wait for a slot that only the kernel's end frees. Set before the backends start.
jax.config.update("jax_cpu_enable_async_dispatch", False)

settings.register_profile("ci", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")

ON_GPU = jax.default_backend() == "gpu"


def pytest_collection_modifyitems(config, items):
    from attention_tutorial.kernels.te import installed

    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(pytest.mark.skip(reason=f"needs an NVIDIA GPU; JAX runs on {jax.default_backend()} here"))
        if "te" in item.keywords and not (ON_GPU and installed()):
            item.add_marker(pytest.mark.skip(reason="needs TransformerEngine on a GPU (the 'te' extra)"))


@pytest.fixture(autouse=True)
def _close_figures():
    """Each test leaves no pyplot figure open: a worker runs other files' tests after it (more than 20 open figures
    is a warning, so an error here)."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
