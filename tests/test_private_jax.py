"""JAX's private entry points the package uses, checked on the JAX that is installed (CI runs the oldest supported
one on the CPU, the GPU machine the newest): each resolves, with the names and arguments the package calls. A new use
of ``jax._src`` must be listed here (the last test finds them)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "attention_tutorial"
#: Each module that imports from ``jax._src``, with how many such imports it holds.
PRIVATE_USERS = {
    "env.py": 1,
    "measure/fp8.py": 1,
    "measure/profile.py": 1,
    "kernels/mosaic/interpret.py": 9,
}


def test_the_cudnn_fp8_attention_entry_point_takes_what_the_fp8_race_passes():
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_attn

    assert {"CAUSAL", "NO_MASK"} <= set(cudnn_attn.MaskType.__members__)
    assert {"descale_q", "descale_k", "descale_v", "scale_s", "descale_s", "scale_o"} <= set(cudnn_attn.fp8_params_keys)
    params = inspect.signature(cudnn_attn.dot_product_attention).parameters
    assert {"fp8_params", "scale", "mask_type", "use_fp8"} <= set(params)


def test_the_trace_reader_and_the_cuda_versions_resolve():
    from attention_tutorial.measure.profile import profile_data_class

    cls = profile_data_class()
    assert callable(cls.from_file)  # what the profile readers call
    from jax._src.lib import cuda_versions  # None on a CPU-only jaxlib

    assert cuda_versions is None or callable(cuda_versions.cudnn_get_version)


def test_the_mosaic_gpu_interpreter_resolves():
    from attention_tutorial.kernels.mosaic import interpret

    if interpret.why_not():
        pytest.skip(interpret.why_not())
    p = interpret._private()  # imports every private module the interpreter uses and checks the names it calls
    assert callable(p.params.force_gpu_interpret_mode)


def test_private_imports_live_only_where_this_file_lists_them():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        n = len(re.findall(r"^\s*from jax\._src[\w.]* import", path.read_text(encoding="utf-8"), re.M))
        if n:
            found[path.relative_to(PACKAGE).as_posix()] = n
    assert found == PRIVATE_USERS
