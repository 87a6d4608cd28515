"""What XLA compiled: which kernels a function calls, and how much temporary memory it needs.

Both come from one ``jax.jit(fn).lower(*args).compile()``: the custom-call targets in the compiled HLO name
library kernels (cuDNN's fused attention, cuBLAS matmuls, TransformerEngine), and XLA's memory analysis
gives the bytes of temporaries the program allocates besides its inputs and outputs.
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import jax

_TARGET = re.compile(r'custom_call_target="([^"]+)"')

# Custom-call targets that are fused attention kernels, by family.
ATTENTION_KERNELS = {
    "__cudnn$fmha": "cuDNN fused attention",
    "te_fused_attn": "TransformerEngine fused attention",
    "mosaic_gpu": "Pallas (Mosaic GPU) kernel",
    "__gpu$xla.gpu.triton": "Pallas (Triton) kernel",
    "triton_kernel_call": "Pallas (Triton) kernel",
}


@dataclass(frozen=True)
class CompileStats:
    """One compilation: seconds it took, temporary bytes, custom-call targets, and the attention family."""

    compile_s: float
    temp_bytes: int | None
    kernels: tuple[str, ...]
    compiled: object = field(default=None, repr=False, compare=False)  # the executable, to run without recompiling

    @property
    def attention_kernel(self) -> str:
        """Which family computed the attention: a fused kernel's name, or XLA's own ops."""
        return describe_kernels(self.kernels)


def compile_stats(fn, *args) -> CompileStats:
    """Compile ``jax.jit(fn)`` for ``args`` (arrays or ``jax.ShapeDtypeStruct``) and report what came out."""
    return _stats(*_compile(jax.jit(fn).lower(*args)))


def compile_stats_each(fn, arg_sets, *, workers: int | None = None) -> list[CompileStats]:
    """:func:`compile_stats` of ``fn`` for each tuple of arguments in ``arg_sets``, in order, the programs built side
    by side on up to ``workers`` threads (default: one per program, at most the CPU count). XLA compiles outside
    Python's lock, so several cores work at once. Each is traced here first, in this thread's JAX settings
    (``jax.default_matmul_precision`` and the like). For what the compiler made (memory, kernels), not for compile
    times: a ``compile_s`` then includes the wait for the programs built beside it."""
    arg_sets = [tuple(a) for a in arg_sets]
    if not arg_sets:
        raise ValueError("arg_sets must hold at least one tuple of arguments, e.g. [(q, k, v)].")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive int or None; got {workers!r:.60}.")
    lowered = [jax.jit(fn).lower(*args) for args in arg_sets]
    workers = workers or min(len(lowered), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [_stats(*built) for built in pool.map(_compile, lowered)]


def _compile(lowered):
    t0 = time.perf_counter()
    compiled = lowered.compile()
    return compiled, time.perf_counter() - t0


def _stats(compiled, seconds: float) -> CompileStats:
    try:
        temp = int(compiled.memory_analysis().temp_size_in_bytes)
    except (AttributeError, NotImplementedError, TypeError):  # some backends don't report it
        temp = None
    return CompileStats(seconds, temp, kernels_in_hlo(compiled.as_text()), compiled)


def kernels_used(fn, *args) -> tuple[str, ...]:
    """The distinct custom-call targets (library kernels) in ``fn``'s compiled HLO, in order of appearance."""
    return compile_stats(fn, *args).kernels


def kernels_in_hlo(hlo_text: str) -> tuple[str, ...]:
    """The distinct ``custom_call_target`` names in an HLO text, in order of first appearance."""
    return tuple(dict.fromkeys(_TARGET.findall(hlo_text)))


def describe_kernels(kernels: tuple[str, ...]) -> str:
    """Name the attention path from custom-call targets, e.g. 'cuDNN fused attention (__cudnn$fmhaSoftmax)'; every
    distinct target of that family is named (a gradient's program calls a forward and a backward kernel)."""
    for target in kernels:
        for prefix, family in ATTENTION_KERNELS.items():
            if target.startswith(prefix):
                same = dict.fromkeys(t for t in kernels if t.startswith(prefix))
                return f"{family} ({', '.join(same)})"
    if any("cublas" in t for t in kernels):
        return "XLA: cuBLAS matmuls + fusions"
    return "XLA: own fusions, no library kernel"
