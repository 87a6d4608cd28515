"""The named benchmark grids the pages and the recorder use, each in a GPU size and a small CPU size.

``points(name)`` gives the grid for the backend this runs on. The recorder (``python -m attention_tutorial
record``) runs the GPU size of every grid on the GPU and saves the records with their provenance; the pages run
the size that fits their build live and show the recorded GPU results beside it.

The GPU sizes were chosen on an H200 (141 GB). ``plan(name, memory=device_memory())`` sizes a grid for the GPU at
hand (an L4, an A100): points whose inputs, outputs and (for implementations that materialise the T × S scores)
score matrices cannot fit its memory are not run but recorded as ``oom`` with the estimate as the reason.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..kernels.masks import MASK_KINDS
from .sweep import Point, empty_record, grid

KIB = 1024


def _seed_shape(gpu: bool) -> list[Point]:
    """The seed codelab's default shape, B=4, T=128, N=8, H=64: naive, XLA f32/bf16, cuDNN bf16."""
    base: dict[str, Any] = dict(batch=4, seq_q=128, seq_kv=128, heads=8, kv_heads=8, head_dim=64)
    return [
        Point("naive", dtype="float32", **base),
        Point("xla", dtype="float32", **base),
        Point("default", dtype="float32", **base),
        Point("naive", dtype="bfloat16", **base),
        Point("xla", dtype="bfloat16", **base),
        Point("default", dtype="bfloat16", **base),
        Point("cudnn", dtype="bfloat16", **base),
    ]


def _grids(gpu: bool) -> dict[str, list[Point]]:
    big = ("naive", "xla", "cudnn")
    dt = ("bfloat16",) if gpu else ("float32",)
    if gpu:
        seq_long = (1 * KIB, 2 * KIB, 4 * KIB, 8 * KIB, 16 * KIB, 32 * KIB)
        race_seq = (1 * KIB, 4 * KIB, 16 * KIB, 32 * KIB)  # the backward race: every other length, to fit a lease
        return {
            "seed_shape": _seed_shape(gpu),
            "seq_short": grid(
                big, seq_q=(64, 128, 256, 512, 1024), batch=(4,), heads=(8,), head_dim=(64,), causal=(False, True)
            ),
            "seq_long": grid(big, seq_q=seq_long, tokens=32 * KIB, heads=(16,), head_dim=(128,), causal=(False, True)),
            "batch": grid(big, seq_q=(256,), batch=(1, 2, 4, 8, 16), heads=(8,), head_dim=(64,)),
            "head_dim": grid(
                ("xla", "cudnn"), seq_q=(4 * KIB,), batch=(4,), heads=(16,), head_dim=(32, 64, 100, 128, 256)
            ),
            # the training race: our two kernels' custom VJPs against cuDNN, JAX's bundled kernels, XLA, blockwise
            "backward": grid(
                ("xla", "cudnn", "blockwise", "pallas", "jax_pallas", "mosaic", "mosaic_atomic"),
                seq_q=race_seq,
                tokens=16 * KIB,
                heads=(16,),
                head_dim=(64, 128),
                causal=(False, True),
                passes=("fwd+bwd",),
            )
            + grid(  # JAX's Mosaic GPU kernel takes float16 only, and its backward has no causal mask
                ("mosaic", "jax_mosaic", "cudnn"),
                seq_q=race_seq[:-1],
                tokens=16 * KIB,
                heads=(16,),
                head_dim=(64, 128),
                dtype=("float16",),
                passes=("fwd+bwd",),
            )
            + grid(  # one GQA shape: 32 query heads sharing 8 kv heads
                ("xla", "cudnn", "pallas", "mosaic"),
                seq_q=(4 * KIB, 16 * KIB),
                tokens=16 * KIB,
                heads=(32,),
                kv_heads=(8,),
                head_dim=(128,),
                causal=(False, True),
                passes=("fwd+bwd",),
            ),
            "prefill_heads": grid(
                ("xla", "cudnn"), seq_q=(4 * KIB,), batch=(4,), heads=(32,), kv_heads=(32, 8, 1), head_dim=(128,)
            ),
            "decode": grid(
                ("xla", "cudnn"),
                seq_q=(1,),
                seq_kv=(2 * KIB, 8 * KIB, 32 * KIB, 128 * KIB),
                batch=(16,),
                heads=(32,),
                kv_heads=(32, 8, 1),
                head_dim=(128,),
            ),
            # bf16 for every kernel; float16 too for the Mosaic GPU kernels (JAX's takes float16 only) and cuDNN
            "flash": grid(
                ("blockwise", "pallas", "jax_pallas", "mosaic", "cudnn"),
                seq_q=(1 * KIB, 4 * KIB, 16 * KIB, 32 * KIB),
                tokens=32 * KIB,
                heads=(16,),
                head_dim=(64, 128),
                causal=(False, True),
            )
            + grid(
                ("mosaic", "jax_mosaic", "cudnn"),
                seq_q=(1 * KIB, 4 * KIB, 16 * KIB, 32 * KIB),
                tokens=32 * KIB,
                heads=(16,),
                head_dim=(128,),
                dtype=("float16",),
                causal=(False, True),
            ),
            "masks": grid(
                ("xla", "cudnn"),
                seq_q=(4 * KIB,),
                batch=(4,),
                heads=(16,),
                head_dim=(128,),
                causal=(False, True),
                masks=MASK_KINDS,
            ),
            # the race: our Mosaic GPU forward, plain and with FA3's intra-warpgroup pipelining, against cuDNN
            "beyond": grid(
                ("mosaic", "mosaic_pipe", "cudnn"),
                seq_q=(4 * KIB, 8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB),
                tokens=64 * KIB,
                heads=(16,),
                head_dim=(64, 128, 256),
                causal=(False, True),
            ),
            "te": grid(
                ("te", "cudnn", "xla"),
                seq_q=(128, 512, 2 * KIB, 4 * KIB, 16 * KIB),
                tokens=32 * KIB,
                heads=(16,),
                head_dim=(64, 128),
                causal=(True,),
                passes=("fwd", "fwd+bwd"),
            ),
        }
    small = ("naive", "xla", "cudnn")
    return {
        "seed_shape": _seed_shape(gpu),
        "seq_short": grid(
            small, seq_q=(64, 128, 256, 512), batch=(4,), heads=(8,), head_dim=(64,), dtype=dt, causal=(False, True)
        ),
        "seq_long": grid(
            small,
            seq_q=(256, 512, 1024, 2048),
            tokens=2 * KIB,
            heads=(4,),
            head_dim=(64,),
            dtype=dt,
            causal=(False, True),
        ),
        "batch": grid(small, seq_q=(256,), batch=(1, 2, 4, 8), heads=(8,), head_dim=(64,), dtype=dt),
        "head_dim": grid(
            ("xla", "cudnn"), seq_q=(512,), batch=(2,), heads=(4,), head_dim=(32, 64, 100, 128, 256), dtype=dt
        ),
        "backward": grid(
            ("xla", "cudnn"),
            seq_q=(256, 512, 1024),
            tokens=1 * KIB,
            heads=(4,),
            head_dim=(64,),
            dtype=dt,
            causal=(False, True),
            passes=("fwd+bwd",),
        ),
        "prefill_heads": grid(
            ("xla", "cudnn"), seq_q=(512,), batch=(1,), heads=(8,), kv_heads=(8, 2, 1), head_dim=(64,), dtype=dt
        ),
        "decode": grid(
            ("xla", "cudnn"),
            seq_q=(1,),
            seq_kv=(1 * KIB, 4 * KIB, 16 * KIB),
            batch=(4,),
            heads=(8,),
            kv_heads=(8, 2, 1),
            head_dim=(64,),
            dtype=dt,
        ),
        "flash": grid(
            ("naive", "blockwise", "pallas", "cudnn"),
            seq_q=(256, 512, 1024),
            tokens=1 * KIB,
            heads=(4,),
            head_dim=(64,),
            dtype=dt,
            causal=(False, True),
        ),
        "masks": grid(
            ("naive", "xla", "cudnn"),
            seq_q=(512,),
            batch=(2,),
            heads=(4,),
            head_dim=(64,),
            dtype=dt,
            causal=(False, True),
            masks=MASK_KINDS,
        ),
        "beyond": grid(  # Hopper kernels: on a CPU every point is recorded as unsupported, with the reason
            ("mosaic", "mosaic_pipe", "cudnn"), seq_q=(256,), tokens=256, heads=(2,), head_dim=(64,), dtype=dt
        ),
        "te": grid(
            ("te", "cudnn", "xla"),
            seq_q=(128, 512),
            tokens=1 * KIB,
            heads=(4,),
            head_dim=(64,),
            dtype=dt,
            causal=(True,),
        ),
    }


GRID_NAMES = tuple(_grids(True))


# What a GPU build of the site runs live (the recorder runs the whole grid): enough to show each trend, small
# enough that the whole site builds on the GPU in a few minutes.
LIVE_ON_GPU: dict[str, dict[str, tuple]] = {
    "seq_short": {"seq_q": (64, 256, 1024)},
    "seq_long": {"seq_q": (1 * KIB, 4 * KIB, 16 * KIB)},
    "batch": {"batch": (1, 16)},
    "head_dim": {"head_dim": (64, 128, 256)},
    # the race's compiled custom VJPs dominate a build: one length, bf16, the MHA shape
    "backward": {"seq_q": (4 * KIB,), "head_dim": (128,), "heads": (16,), "dtype": ("bfloat16",)},
    "decode": {"seq_kv": (8 * KIB, 128 * KIB), "impl": ("cudnn",)},
    "flash": {"seq_q": (16 * KIB,), "head_dim": (128,)},
    "masks": {"causal": (True,)},
    "te": {"seq_q": (512, 4 * KIB), "head_dim": (128,)},
    "beyond": {"seq_q": (16 * KIB,), "head_dim": (256,)},
}


def points(name: str, *, gpu: bool | None = None, live: bool = False) -> list[Point]:
    """The grid called ``name`` in the size for ``gpu`` (default: whether JAX's default backend is a GPU).

    ``live`` on a GPU keeps the subset a GPU build of the site runs (``LIVE_ON_GPU``).
    """
    gpu = jax.default_backend() == "gpu" if gpu is None else gpu
    grids = _grids(gpu)
    if name not in grids:
        raise ValueError(f"unknown grid {name!r}; choose from {sorted(grids)}.")
    keep = LIVE_ON_GPU.get(name, {}) if (gpu and live) else {}
    return [p for p in grids[name] if all(getattr(p, k) in v for k, v in keep.items())]


# Implementations that hold the whole (B, N, T, S) score matrix, and the bytes per score they were measured to need
# on the H200 (float32 logits + probabilities; the backward pass keeps more): see ``temp_bytes`` in its results.
MATERIALISE_SCORES = ("naive", "xla")
SCORE_BYTES = {"fwd": 6, "fwd+bwd": 10}


def device_memory() -> int | None:
    """Bytes the default device lets XLA allocate (its ``bytes_limit``), or None where it does not say (a CPU)."""
    try:
        return int(jax.devices()[0].memory_stats()["bytes_limit"])
    except (TypeError, KeyError, AttributeError, jax.errors.JaxRuntimeError):
        return None


def footprint(point: Point) -> int:
    """An estimate of the bytes ``point`` needs on the device: q, k, v, the output (and for fwd+bwd the output
    gradient and dq, dk, dv) plus the score matrices of implementations that materialise them."""
    B, T, S, N, K, H = point.shape
    item = jnp.dtype(point.dtype).itemsize
    tensors = (2 * B * T * N * H + 2 * B * S * K * H) * item
    if point.pass_ == "fwd+bwd":
        tensors *= 2
    scores = B * N * T * S * SCORE_BYTES[point.pass_] if point.impl in MATERIALISE_SCORES else 0
    return tensors + scores


def plan(name: str, *, gpu: bool | None = None, memory: int | None = None) -> tuple[list[Point], list[dict]]:
    """(points of grid ``name`` to run, records of those that cannot fit ``memory`` bytes, status oom, with the
    estimate as the reason). ``memory`` None (unknown) runs every point."""
    run, skipped = [], []
    for p in points(name, gpu=gpu):
        need = footprint(p)
        if memory is not None and need > memory:
            reason = (
                f"needs about {need / 2**30:.1f} GiB (inputs, outputs and score matrices, estimated) and "
                f"this device lets XLA use {memory / 2**30:.1f} GiB: not run"
            )
            skipped.append({**empty_record(p), "status": "oom", "reason": reason, "estimated_bytes": need})
        else:
            run.append(p)
    return run, skipped
