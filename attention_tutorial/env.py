"""The environment report: which device this runs on and the versions that shape its numbers."""

from __future__ import annotations

import datetime as _dt
import functools
import importlib.metadata as _md
import os
import platform as _platform
import shutil
import subprocess
from pathlib import Path

import jax


def _version(dist: str) -> str | None:
    try:
        return _md.version(dist)
    except _md.PackageNotFoundError:
        return None


def cudnn_version() -> str | None:
    """cuDNN's version as loaded by JAX (e.g. '9.19.0'), or None without a CUDA backend."""
    try:
        from jax._src.lib import cuda_versions  # private; None on CPU-only jaxlib

        if cuda_versions is None or jax.default_backend() != "gpu":
            return None
        v = int(cuda_versions.cudnn_get_version())
    except Exception:
        return None
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def _nvidia_smi() -> dict:
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}
    name, driver, mem = (s.strip() for s in out.split(","))
    return {"gpu_name": name, "driver": driver, "gpu_memory_mib": int(float(mem))}


def transformer_engine_version() -> str | None:
    """TransformerEngine's version if it is installed (read from package metadata; TE is not imported)."""
    for dist in ("transformer_engine", "transformer-engine", "transformer_engine_jax"):
        if (v := _version(dist)) is not None:
            return v
    return None


def timestamp() -> str:
    """Now, in UTC, to the second: the ``created`` of reports and records."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def code_version() -> dict:
    """The code's commit and whether the tree differs from it: ``{"commit": str | None, "dirty": bool | None}``.

    ``ATTENTION_TUTORIAL_COMMIT`` and ``ATTENTION_TUTORIAL_DIRTY`` ("0" or "1") win where set: whoever copied the
    tree (onto a lent GPU machine, say) knows what it holds, while a ``.git`` copied beside it may be older. Else
    read from git where this runs in a clone; else unknown (None)."""
    if commit := os.environ.get("ATTENTION_TUTORIAL_COMMIT"):
        dirty: str | bool | None = os.environ.get("ATTENTION_TUTORIAL_DIRTY")
        return {"commit": commit, "dirty": None if dirty is None else dirty not in ("0", "", "false")}
    root = Path(__file__).resolve().parent.parent
    try:
        run = functools.partial(subprocess.run, cwd=root, capture_output=True, text=True, timeout=20, check=True)
        commit = run(["git", "rev-parse", "HEAD"]).stdout.strip()
        dirty = bool(run(["git", "status", "--porcelain", "--untracked-files=no"]).stdout.strip())
        return {"commit": commit, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def environment() -> dict:
    """Devices, GPU name, driver, JAX/jaxlib, cuDNN, TransformerEngine and Python versions, and today's date."""
    dev = jax.devices()[0]
    smi = _nvidia_smi() if dev.platform == "gpu" else {}
    return {
        "backend": jax.default_backend(),
        "devices": [f"{d.platform}:{d.id} {d.device_kind}" for d in jax.devices()],
        "gpu": dev.device_kind if dev.platform == "gpu" else None,
        "compute_capability": getattr(dev, "compute_capability", None),
        "driver": smi.get("driver"),
        "gpu_memory_mib": smi.get("gpu_memory_mib"),
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "jax_cuda_plugin": _version("jax-cuda13-plugin") or _version("jax-cuda12-plugin"),
        "cudnn": cudnn_version(),
        "transformer_engine": transformer_engine_version(),
        "flax": _version("flax"),
        "python": _platform.python_version(),
        "cpu": _platform.processor() or _platform.machine(),
        "created": timestamp(),
        **code_version(),
    }
