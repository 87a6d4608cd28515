"""attention_tutorial: attention on NVIDIA GPUs with JAX, from scratch to fused kernels, measured.

Shape legend used throughout: B batch, T query length, S key/value length, N query heads, K key/value heads,
H head dimension; q (B, T, N, H), k and v (B, S, K, H).

The names in ``__all__`` load on first use: ``import attention_tutorial`` imports neither JAX nor the command line
and leaves the process as it was (its signal handlers included); ``from attention_tutorial import make_qkv`` imports
the module that defines ``make_qkv``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Each name re-exported here, and the module (in this package) that defines it.
_EXPORTS = {
    "IMPLEMENTATIONS": "registry",
    "AttentionShape": "inputs",
    "CompileStats": "measure.compiled",
    "Point": "measure.sweep",
    "Timing": "measure.timing",
    "attention_bytes": "measure.flops",
    "attention_flops": "measure.flops",
    "attention_shape": "inputs",
    "blockwise_attention": "kernels.blockwise",
    "compile_stats": "measure.compiled",
    "cudnn_why_not": "kernels.fused",
    "describe_kernels": "measure.compiled",
    "dot_product_attention": "kernels.fused",
    "environment": "env",
    "grid": "measure.sweep",
    "kernels_used": "measure.compiled",
    "kv_cache_bytes": "measure.flops",
    "make_qkv": "inputs",
    "measure_ceilings": "measure.ceilings",
    "naive_attention": "kernels.reference",
    "reference_attention": "kernels.reference",
    "run_point": "measure.sweep",
    "run_sweep": "measure.sweep",
    "summarize": "measure.timing",
    "time_fn": "measure.timing",
    "why_not": "registry",
}

__all__ = [
    "IMPLEMENTATIONS",
    "AttentionShape",
    "CompileStats",
    "Point",
    "Timing",
    "__version__",
    "attention_bytes",
    "attention_flops",
    "attention_shape",
    "blockwise_attention",
    "compile_stats",
    "cudnn_why_not",
    "describe_kernels",
    "dot_product_attention",
    "environment",
    "grid",
    "kernels_used",
    "kv_cache_bytes",
    "make_qkv",
    "measure_ceilings",
    "naive_attention",
    "reference_attention",
    "run_point",
    "run_sweep",
    "summarize",
    "time_fn",
    "why_not",
]


def __getattr__(name: str):
    """A re-exported name, imported from its module the first time it is asked for (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value  # later look-ups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from .env import environment
    from .inputs import AttentionShape, attention_shape, make_qkv
    from .kernels.blockwise import blockwise_attention
    from .kernels.fused import cudnn_why_not, dot_product_attention
    from .kernels.reference import naive_attention, reference_attention
    from .measure.ceilings import measure_ceilings
    from .measure.compiled import CompileStats, compile_stats, describe_kernels, kernels_used
    from .measure.flops import attention_bytes, attention_flops, kv_cache_bytes
    from .measure.sweep import Point, grid, run_point, run_sweep
    from .measure.timing import Timing, summarize, time_fn
    from .registry import IMPLEMENTATIONS, why_not
