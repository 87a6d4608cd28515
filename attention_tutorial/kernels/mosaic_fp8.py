"""Our FP8 forward by its first name: the public names of :mod:`attention_tutorial.kernels.mosaic.fp8`."""

from .mosaic.fp8 import (
    E4M3_MAX,
    F8,
    FP8_HEAD_DIMS,
    P_VIA,
    logit_factors,
    mosaic_fp8_attention,
    operand_key_order,
    operand_register_pairs,
    quantize_e4m3,
    why_not,
)

__all__ = ["E4M3_MAX", "F8", "FP8_HEAD_DIMS", "P_VIA", "logit_factors", "mosaic_fp8_attention", "operand_key_order",
           "operand_register_pairs", "quantize_e4m3", "why_not"]  # fmt: skip
