"""What XLA compiled: which kernels a function calls, and how much temporary memory it needs.

Both come from one ``jax.jit(fn).lower(*args).compile()``: the custom-call targets in the compiled HLO name
library kernels (cuDNN's fused attention, cuBLAS matmuls, TransformerEngine), and XLA's memory analysis
gives the bytes of temporaries the program allocates besides its inputs and outputs.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, cast

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
    compiled: Any = field(default=None, repr=False, compare=False)  # the executable, to run without recompiling

    @property
    def attention_kernel(self) -> str:
        """Which family computed the attention: a fused kernel's name, or XLA's own ops."""
        return describe_kernels(self.kernels)


def compile_stats(fn, *args, donate_argnums=()) -> CompileStats:
    """Compile ``jax.jit(fn)`` for ``args`` (arrays or ``jax.ShapeDtypeStruct``) and report what came out.
    ``donate_argnums``: as :func:`jax.jit`'s; the executable then consumes those arguments' buffers."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=donate_argnums).lower(*args).compile()
    seconds = time.perf_counter() - t0
    try:
        temp = int(compiled.memory_analysis().temp_size_in_bytes)  # type: ignore[union-attr]
    except (AttributeError, NotImplementedError, TypeError):  # some backends don't report it
        temp = None
    return CompileStats(seconds, temp, kernels_in_hlo(cast(str, compiled.as_text())), compiled)


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
