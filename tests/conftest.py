"""Shared fixtures: GPU/TE markers skip with a reason where the hardware or package is missing."""

from __future__ import annotations

import os

# Eight simulated CPU devices for the context-parallel tests; must be set before JAX initialises its backends.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax
import pytest
from hypothesis import HealthCheck, settings

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
