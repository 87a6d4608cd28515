"""Four small experiments the pages run live and the recorder keeps for builds without a GPU.

- :func:`precision_rows`: float32 attention at JAX's default matmul precision (TF32 on an NVIDIA GPU) and at
  ``"highest"`` (true float32): error against float64 and time per call.
- :func:`cudnn_refusal_rows`: what :func:`~attention_tutorial.kernels.fused.cudnn_why_not` says for shapes cuDNN
  cannot take, beside what JAX itself does when cuDNN is forced anyway.
- :func:`gqa_rows`: grouped-query attention against multi-head attention with the kv heads repeated, for every
  implementation this machine runs.
- :func:`input_rows`: one bf16 matmul on zeros, on ones and on random numbers (the same FLOPs): constant inputs
  draw less power, so a GPU may clock higher on them, which is why every benchmark here uses random inputs.

``python -m attention_tutorial record --extras lessons`` stores :func:`lesson_records` in the result file's
provenance (``lessons``), so a CPU build shows the GPU's answer beside its own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..inputs import AttentionShape, attention_shape, make_qkv
from ..kernels.fused import cudnn_why_not, dot_product_attention
from ..kernels.reference import reference_attention
from .timing import time_fn

# the implementations the GQA check runs where they can (why_not decides)
GQA_IMPLS = ("naive", "xla", "cudnn", "blockwise", "pallas", "mosaic", "te")

# (shape, dtype) pairs the refusal lesson tries: float32, a head size that is not a multiple of 8, one too large,
# the largest Hopper takes, and one that runs everywhere cuDNN runs
REFUSAL_CASES = (
    (AttentionShape(4, 1024, 1024, 8, 8, 64), "float32"),
    (AttentionShape(4, 1024, 1024, 8, 8, 100), "bfloat16"),
    (AttentionShape(4, 1024, 1024, 8, 8, 512), "bfloat16"),
    (AttentionShape(4, 1024, 1024, 8, 8, 256), "bfloat16"),
    (AttentionShape(4, 1024, 1024, 8, 8, 128), "bfloat16"),
)


def _on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def matmul_kind(dtype="float32") -> str:
    """The precision float32 matmuls really run in on this backend at JAX's default: "tf32" on a GPU (NVIDIA,
    Ampere on), else the dtype's own name."""
    name = jnp.dtype(dtype).name
    return "tf32" if name == "float32" and _on_gpu() else name


def precision_rows(
    batch=4, seq=128, heads=8, head_dim=64, *, time_seq=None, timed: bool = True, seed=0, timing=None
) -> list[dict]:
    """float32 XLA attention at the default and the "highest" matmul precision.

    Error: the largest absolute difference from float64 at (B=batch, T=S=seq, N=heads, H=head_dim). Time: the same
    call at T = S = ``time_seq`` (default 2048 on a GPU, 256 elsewhere; median, p10, p90 in ms; ``timing`` passes
    options to :func:`~attention_tutorial.measure.timing.time_fn`). ``timed=False`` measures the errors only (no time
    fields): two programs compiled instead of four.
    """
    time_seq = time_seq or (2048 if _on_gpu() else 256)
    q, k, v = make_qkv(batch, seq, heads, head_dim, dtype=jnp.float32, seed=seed)
    ref = reference_attention(q, k, v)
    big = make_qkv(batch, time_seq, heads, head_dim, dtype=jnp.float32, seed=seed) if timed else None
    rows = []
    for precision in ("default", "highest"):
        with jax.default_matmul_precision(precision):  # the precision is part of what jit traces
            attend = jax.jit(lambda q, k, v: dot_product_attention(q, k, v, implementation="xla"))
            err = float(np.max(np.abs(np.asarray(attend(q, k, v)) - ref)))
            t = time_fn(attend, *big, **(timing or {})) if big is not None else None
        row = {
            "precision": precision,
            "matmuls_in": matmul_kind() if precision == "default" else "float32",
            "max_abs_error": err,
            "shape": f"B={batch}, T=S={seq}, N={heads}, H={head_dim}",
        }
        if t is not None:
            row.update(
                time_shape=f"B={batch}, T=S={time_seq}, N={heads}, H={head_dim}",
                median_ms=t.median_ms,
                p10_ms=t.p10_ms,
                p90_ms=t.p90_ms,
            )
        rows.append(row)
    return rows


def _first_line(err: BaseException, limit: int = 160) -> str:
    line = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _forced_cudnn(shape: AttentionShape, dtype: str) -> str:
    """What ``jax.nn.dot_product_attention(..., implementation="cudnn")`` does on this machine: "runs" or the
    first line of the error JAX raises (small B and T: only acceptance is tested)."""
    small = AttentionShape(1, 128, 128, shape.heads, shape.kv_heads, shape.head_dim)
    q, k, v = make_qkv(small.batch, small.seq_q, small.heads, small.head_dim, dtype=jnp.dtype(dtype), seed=0)
    try:
        out = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="cudnn"))(q, k, v)
        jax.block_until_ready(out)
    except Exception as err:  # the lesson is the error JAX gives
        return _first_line(err)
    return "runs"


def cudnn_refusal_rows(cases=REFUSAL_CASES) -> list[dict]:
    """For each (shape, dtype): our check's reason (None: cuDNN can run it) and JAX's own answer when forced."""
    return [
        {
            "head_dim": shape.head_dim,
            "dtype": dtype,
            "why_not": cudnn_why_not(shape, jnp.dtype(dtype)),
            "forced": _forced_cudnn(shape, dtype),
        }
        for shape, dtype in cases
    ]


def gqa_rows(batch=2, seq=256, heads=8, kv_heads=2, head_dim=64, *, dtype=None, impls=GQA_IMPLS, seed=3) -> list[dict]:
    """The largest absolute difference between GQA and MHA with repeated kv heads, per implementation (status "unsupported" with the reason where this
    machine cannot run it). ``dtype``: bfloat16 on a GPU, float32 elsewhere, by default."""
    from ..registry import IMPLEMENTATIONS, why_not

    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    dtype = jnp.dtype(dtype or (jnp.bfloat16 if _on_gpu() else jnp.float32))
    q, k, v = make_qkv(batch, seq, heads, head_dim, kv_heads=kv_heads, dtype=dtype, seed=seed)
    rep = lambda x: jnp.repeat(x, heads // kv_heads, axis=2)  # noqa: E731 — kv head j -> query heads jG … jG+G-1
    rows = []
    for name in impls:
        base = {"impl": name, "dtype": dtype.name, "computed_in": matmul_kind(dtype)}
        if reason := why_not(name, attention_shape(q, k, v), dtype):
            rows.append({**base, "status": "unsupported", "reason": reason, "max_abs_diff": None})
            continue
        fn = jax.jit(IMPLEMENTATIONS[name].fn)
        try:
            gqa, mha = (np.asarray(x, np.float32) for x in (fn(q, k, v), fn(q, rep(k), rep(v))))
        except Exception as err:  # recorded, not a crash
            rows.append({**base, "status": "error", "reason": _first_line(err), "max_abs_diff": None})
            continue
        rows.append({**base, "status": "ok", "reason": None, "max_abs_diff": float(np.max(np.abs(gqa - mha)))})
    return rows


INPUT_KINDS = ("zeros", "ones", "random normal")


def input_rows(n=None, *, seed=0, timing=None) -> list[dict]:
    """TFLOP/s of one (n, n) @ (n, n) bf16 matmul (default n = 8192 on a GPU, 512 elsewhere) per input kind:
    the same work, different data."""
    n = n or (8192 if _on_gpu() else 512)
    key_a, key_b = jax.random.split(jax.random.key(seed))
    inputs = {
        "zeros": (jnp.zeros((n, n), jnp.bfloat16),) * 2,
        "ones": (jnp.ones((n, n), jnp.bfloat16),) * 2,
        "random normal": (
            jax.random.normal(key_a, (n, n), jnp.bfloat16),
            jax.random.normal(key_b, (n, n), jnp.bfloat16),
        ),
    }
    rows = []
    for kind in INPUT_KINDS:
        t = time_fn(jnp.matmul, *inputs[kind], **(timing or {}))
        rows.append(
            {
                "inputs": kind,
                "n": n,
                "tflops": 2 * n**3 / (t.median_ms * 1e-3) / 1e12,
                "median_ms": t.median_ms,
                "p10_ms": t.p10_ms,
                "p90_ms": t.p90_ms,
            }
        )
    return rows


def lesson_records(**timing) -> dict:
    """All four lessons, as the recorder keeps them (provenance['lessons'])."""
    timing = timing or None
    return {
        "precision": precision_rows(timing=timing),
        "cudnn_refusals": cudnn_refusal_rows(),
        "gqa": gqa_rows(),
        "inputs": input_rows(timing=timing),
    }
