"""Every way of computing attention: from scratch, fused (XLA/cuDNN), blockwise JAX, our Pallas kernels, TE.

Modules: :mod:`~attention_tutorial.kernels.reference` (naive attention and the float64 NumPy reference),
:mod:`~attention_tutorial.kernels.fused` (``jax.nn.dot_product_attention``, forced cuDNN),
:mod:`~attention_tutorial.kernels.masks` (the mask kinds as arguments), :mod:`~attention_tutorial.kernels.blockwise`
(online softmax in pure JAX), :mod:`~attention_tutorial.kernels.pallas_flash` (Pallas, Triton lowering),
:mod:`~attention_tutorial.kernels.mosaic` (Pallas, Mosaic GPU lowering) and
:mod:`~attention_tutorial.kernels.te` (TransformerEngine, optional). This layer imports only
:mod:`attention_tutorial.inputs`: never ``measure`` or ``results`` (``tests/test_layout.py`` checks).
The GPU kernels and TE are imported where used, so an optional backend stays optional.
"""

from .blockwise import blockwise_attention
from .fused import cudnn_why_not, dot_product_attention
from .masks import causal_args, causal_mask
from .reference import naive_attention, reference_attention

__all__ = [
    "blockwise_attention",
    "causal_args",
    "causal_mask",
    "cudnn_why_not",
    "dot_product_attention",
    "naive_attention",
    "reference_attention",
]
