"""Our Mosaic GPU FlashAttention by its first name: the public names of :mod:`attention_tutorial.kernels.mosaic`
(the kernels live there, one module each)."""

from .mosaic import (
    SMEM_BYTES,
    SMEM_RESERVE,
    TILE_REGISTERS,
    MosaicConfig,
    atomic_dq_why_not,
    bundled_why_not,
    default_config,
    jax_bundled_mosaic,
    mosaic_atomic_dq_attention,
    mosaic_flash_attention,
    mosaic_flash_backward,
    mosaic_pipelined_attention,
    pipelined_why_not,
    problem,
    smem_bytes,
    tile_registers,
    why_not,
)
from .mosaic._common import LOG2E, causal_steps, on_hopper, positive_scale
from .mosaic.pipelined import most_masked_steps, pipelined_causal_bounds

__all__ = [
    "LOG2E",
    "SMEM_BYTES",
    "SMEM_RESERVE",
    "TILE_REGISTERS",
    "MosaicConfig",
    "atomic_dq_why_not",
    "bundled_why_not",
    "causal_steps",
    "default_config",
    "jax_bundled_mosaic",
    "mosaic_atomic_dq_attention",
    "mosaic_flash_attention",
    "mosaic_flash_backward",
    "mosaic_pipelined_attention",
    "most_masked_steps",
    "on_hopper",
    "pipelined_causal_bounds",
    "pipelined_why_not",
    "positive_scale",
    "problem",
    "smem_bytes",
    "tile_registers",
    "why_not",
]  # fmt: skip
