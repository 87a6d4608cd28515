"""Where a training step's time goes: the GPU's own profile of one compiled step, kernel by kernel.

:func:`step_profile` traces a few calls of the training step (the same step :func:`~.loop.train_records` times)
with JAX's profiler and groups its kernels: the attention kernels, the matrix products of the rest of the model, the
token embedding's gradient (a scatter-add, or a one-hot matrix product) and everything else (element-wise
fusions, the optimizer, copies). Run it with both embeddings to see what the one-hot gradient changes.
"""

from __future__ import annotations

import dataclasses
import re

from .. import registry
from ..inputs import check_int
from ..measure.profile import DEVICE_KINDS
from .loop import profile_step, step_fields, step_flops
from .model import H200, Config

# Groups of a step's kernels, by name, first match wins. Attention: the fused kernels of every implementation
# (cuDNN's fmha/sdpa, our Pallas kernels, XLA's softmax fusions are "other"). Matmuls: cuBLAS/CUTLASS GEMMs and
# XLA's own dot fusions. Embedding: the scatter-add a lookup's gradient compiles to.
GROUPS = (
    ("attention", re.compile(r"fmha|sdpa|flash|mosaic|attention|_kernel\b.*wg|pallas", re.IGNORECASE)),
    ("embedding gradient", re.compile(r"scatter", re.IGNORECASE)),
    ("matmuls", re.compile(r"gemm|cublas|cutlass|nvjet|xmma|matmul|dot|wgmma", re.IGNORECASE)),
)


def group_of(name: str) -> str:
    """The group a kernel of the step belongs to (:data:`GROUPS`), else "other"."""
    for group, pattern in GROUPS:
        if pattern.search(name):
            return group
    return "other"


def group_shares(kernels) -> dict[str, float]:
    """{group: µs per step} of a step's device work (rows with ``name``, ``us``, ``kind``; host ops left out)."""
    out: dict[str, float] = {}
    for k in kernels:
        if k["kind"] not in DEVICE_KINDS:
            continue
        g = group_of(k["name"])
        out[g] = out.get(g, 0.0) + k["us"]
    return out


def step_profile(
    impl: str,
    *,
    config: Config = H200,
    embedding: str | None = None,
    seed: int = 0,
    repeats: int = 5,
    top: int = 20,
    corpus=None,
) -> dict:
    """One record: the profile of ``repeats`` training steps with attention ``impl`` (grid "train_profile").

    ``embedding`` overrides ``config.embedding`` ("onehot" or "gather"). The record holds the host time per step, the
    summed device time per step, µs per step in each group (:func:`group_shares`) and the ``top`` longest kernels.
    """
    c = config if embedding is None else dataclasses.replace(config, embedding=embedding)
    repeats = check_int("repeats", repeats, minimum=1, example="5")
    base = {"impl": impl, "embedding": c.embedding, **step_fields(c)}
    reason = registry.why_not(impl, c.attention_shape(), c.dtype, causal=True)
    if reason:
        return {**base, "status": "unsupported", "reason": reason, "median_ms": None, "p10_ms": None, "p90_ms": None}
    kernels, host_ms, busy_ms = profile_step(impl, config=c, seed=seed, repeats=repeats, corpus=corpus)
    rows = [{"name": k.name, "us": k.device_us, "count": k.count, "kind": k.kind} for k in kernels]
    device_us = sum(k["us"] for k in rows if k["kind"] in DEVICE_KINDS)
    return timed(
        {
            **base,
            "status": "ok",
            "median_ms": host_ms,
            "device_ms": device_us / 1e3,
            "busy_ms": busy_ms,
            "step_flops": step_flops(c),
            "groups_us": group_shares(rows),
            "kernels": rows[:top],
        },
        repeats,
    )


def timed(rec: dict, repeats: int) -> dict:
    """``rec`` with the fields every ok record carries: its host time per step is one mean over ``repeats`` profiled
    steps (``timing`` says so), so p10 and p90 equal it; TFLOP/s from the step's FLOPs."""
    ms = rec["median_ms"]
    return {
        **rec,
        "p10_ms": ms,
        "p90_ms": ms,
        "tflops": rec["step_flops"] / (ms / 1e3) / 1e12,
        "timing": f"mean over {repeats} profiled steps, no spread",
    }


def profile_records(impls=("cudnn", "mosaic"), embeddings=("gather", "onehot"), **options) -> list[dict]:
    """:func:`step_profile` for each implementation and embedding gradient."""
    return [step_profile(impl, embedding=e, **options) for impl in impls for e in embeddings]
