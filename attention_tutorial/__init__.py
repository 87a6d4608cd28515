"""attention_tutorial: attention on NVIDIA GPUs with JAX, from scratch to fused kernels, measured.

Shape legend used throughout: B batch, T query length, S key/value length, N query heads, K key/value heads,
H head dimension; q (B, T, N, H), k and v (B, S, K, H).
"""

import signal as _signal
import threading as _threading

# Ctrl-C before the hold below is in place (while the command line's own imports load) is noted, then handed to it.
_early: list[int] = []
_main = _threading.current_thread() is _threading.main_thread()  # signal handlers belong to the main thread
_previous = _signal.signal(_signal.SIGINT, lambda *_: _early.append(1)) if _main else None

from .cli import interrupts_held_while_importing  # noqa: E402

if _main:
    _signal.signal(_signal.SIGINT, _previous)

# Ctrl-C while JAX's compiled extensions load would crash at exit or fail the import: it is held until they are loaded
with interrupts_held_while_importing():
    if _early:
        _signal.raise_signal(_signal.SIGINT)  # the early Ctrl-C, now held like any other
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

__version__ = "0.1.0"

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
