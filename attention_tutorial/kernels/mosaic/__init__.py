"""Our FlashAttention for Hopper (forward and backward), in Pallas's Mosaic GPU lowering: it races cuDNN.

Why a second kernel: the Triton-lowered one (:mod:`attention_tutorial.kernels.pallas_flash`) runs anywhere but leaves
Hopper's three big features to a compiler's heuristics. Mosaic GPU hands them to us:

* **wgmma** — a *warpgroup* (4 warps, 128 threads) issues one asynchronous 64×N×16 matrix product that reads its
  operands from shared memory (or A from registers) and accumulates in registers;
* **TMA** — one thread starts a bulk copy of a whole tile from global to shared memory; it completes on a
  barrier that the consumers wait on;
* **warp specialisation** — different warpgroups of one CTA do different jobs, each with its own register
  budget (``set_max_registers``).

The shape of the kernel is FlashAttention-3's, as in JAX's example ``jax.experimental.pallas.ops.gpu.
attention_mgpu`` which it follows; ours adds bfloat16 (JAX's allocates float16 buffers), the softmax scale
(JAX's applies none), and top-left causal masking for T != S. One CTA owns ``2 * block_q`` query rows of one
(batch, head) and runs three warpgroups:

* warpgroups 0 and 1 **compute**, ``block_q`` rows each: s = q kᵀ (wgmma, q and k from shared memory), the
  online softmax in registers, then acc += p v (wgmma with p from registers);
* warpgroup 2 only **copies**: it streams k and v tiles by TMA into a ring of ``stages`` shared-memory slots,
  refilling a slot as soon as both compute warpgroups have said they are done with it.

Barriers connect them: ``k_ready[slot]``/``v_ready[slot]`` complete when a TMA copy lands; ``k_free[slot]``/
``v_free[slot]`` when both compute warpgroups have consumed it; and a two-party *schedule* barrier makes the two
compute warpgroups take turns on the tensor cores — while one runs its softmax (exp2 on the multi-function units)
the other's matmuls run, so neither unit waits (FlashAttention-3's "ping-pong"). The forward also writes each
row's log-sum-exp; the backward (:func:`mosaic_flash_attention`'s custom VJP) has the same three-warpgroup shape
in two kernels.

Modules: :mod:`~.forward` (the kernel), :mod:`~.pipelined` (FlashAttention-3's intra-warpgroup pipelining),
:mod:`~.backward` (and :mod:`~.backward_split`, the backward at H = 256),
:mod:`~attention_tutorial.kernels.mosaic.fp8` (an FP8 forward), :mod:`~.budget` (the config,
shared-memory and register budgets), :mod:`~attention_tutorial.kernels.mosaic.masks` (masks as tiles),
:mod:`~.attention` (the public functions); ``_common`` holds what they share.
"""

from .attention import (
    atomic_dq_why_not,
    bundled_why_not,
    jax_bundled_mosaic,
    mosaic_atomic_dq_attention,
    mosaic_flash_attention,
    mosaic_flash_backward,
    mosaic_pipelined_attention,
    pipelined_why_not,
    why_not,
)
from .budget import (
    SMEM_BYTES,
    SMEM_RESERVE,
    TILE_REGISTERS,
    MosaicConfig,
    Probe,
    default_config,
    problem,
    smem_bytes,
    tile_registers,
)

__all__ = [
    "SMEM_BYTES",
    "SMEM_RESERVE",
    "TILE_REGISTERS",
    "MosaicConfig",
    "Probe",
    "atomic_dq_why_not",
    "bundled_why_not",
    "default_config",
    "jax_bundled_mosaic",
    "mosaic_atomic_dq_attention",
    "mosaic_flash_attention",
    "mosaic_flash_backward",
    "mosaic_pipelined_attention",
    "pipelined_why_not",
    "problem",
    "smem_bytes",
    "tile_registers",
    "why_not",
]
