"""Every attention implementation by name, with the reason it cannot run a given problem here (or None).

Each entry is called as ``fn(q, k, v, is_causal=...)`` on (B, T, N, H) / (B, S, K, H) arrays; the sweep, the CLI
and the pages all go through this table, so a new implementation appears everywhere once it is added here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from .inputs import AttentionShape, invalid_reason
from .kernels.fused import cudnn_why_not, dot_product_attention, xla_why_not
from .kernels.masks import MASK_KINDS
from .kernels.reference import naive_attention


@dataclass(frozen=True)
class Implementation:
    """One attention implementation: a label for tables, the callable, and its 'why not here' check."""

    name: str
    label: str
    fn: Callable
    why_not: Callable[[AttentionShape, object, bool], str | None]
    masks: tuple[str, ...] = ("none",)
    # For library front ends that choose among several backends: (shape, dtype, causal, training) -> its name.
    backend: Callable | None = None

    def __post_init__(self):  # every why_not first asks whether the problem is valid at all
        object.__setattr__(self, "why_not", _checked(self.why_not))


def _checked(check: Callable) -> Callable:
    """``check`` behind the checks every implementation makes (``invalid_reason``): int8 is never "can run"."""

    @functools.wraps(check)
    def why_not(shape, dtype, causal=False):
        if not isinstance(causal, (bool, np.bool_)):
            raise ValueError(f"causal must be True or False; got {type(causal).__name__} {causal!r:.60}.")
        if reason := invalid_reason(shape, dtype):
            return reason
        return check(AttentionShape(*(int(n) for n in shape)), jnp.dtype(dtype), bool(causal))

    return why_not


def _always(shape, dtype, causal):
    return None


def _cudnn(shape, dtype, causal):
    return cudnn_why_not(shape, dtype)


def _xla(shape, dtype, causal):
    return xla_why_not(shape, dtype)


def _lazy(module: str, attr: str):
    """Import ``attention_tutorial.<module>.<attr>`` at call time (optional backends stay optional)."""

    def call(*args, **kwargs):
        import importlib

        return getattr(importlib.import_module(f"attention_tutorial.{module}"), attr)(*args, **kwargs)

    return call


IMPLEMENTATIONS: dict[str, Implementation] = {
    impl.name: impl
    for impl in (
        Implementation("naive", "naive (from scratch)", naive_attention, _always, MASK_KINDS),
        Implementation("xla", "XLA", functools.partial(dot_product_attention, implementation="xla"), _xla, MASK_KINDS),
        Implementation(
            "default",
            "jax.nn default",
            functools.partial(dot_product_attention, implementation=None),
            _xla,
            MASK_KINDS,
        ),
        Implementation(
            "cudnn", "cuDNN", functools.partial(dot_product_attention, implementation="cudnn"), _cudnn, MASK_KINDS
        ),
        Implementation(
            "blockwise", "blockwise JAX (online softmax)", _lazy("kernels.blockwise", "blockwise_attention"), _always
        ),
        Implementation(
            "pallas",
            "our Pallas kernel (Triton)",
            _lazy("kernels.pallas_flash", "flash_attention"),
            _lazy("kernels.pallas_flash", "why_not"),
        ),
        Implementation(
            "jax_pallas",
            "JAX's Pallas kernel (Triton)",
            _lazy("kernels.pallas_flash", "jax_bundled_mha"),
            _lazy("kernels.pallas_flash", "bundled_why_not"),
        ),
        Implementation(
            "mosaic",
            "our Pallas kernel (Mosaic GPU)",
            _lazy("kernels.mosaic", "mosaic_flash_attention"),
            _lazy("kernels.mosaic", "why_not"),
        ),
        Implementation(
            "mosaic_pipe",
            "our Pallas kernel (Mosaic GPU), pipelined",
            _lazy("kernels.mosaic", "mosaic_pipelined_attention"),
            _lazy("kernels.mosaic", "pipelined_why_not"),
        ),
        Implementation(
            "mosaic_atomic",
            "our Pallas kernel (Mosaic GPU), dQ by atomic adds",
            _lazy("kernels.mosaic", "mosaic_atomic_dq_attention"),
            _lazy("kernels.mosaic", "atomic_dq_why_not"),
        ),
        Implementation(
            "jax_mosaic",
            "JAX's Pallas kernel (Mosaic GPU)",
            _lazy("kernels.mosaic", "jax_bundled_mosaic"),
            _lazy("kernels.mosaic", "bundled_why_not"),
        ),
        Implementation(
            "te",
            "TransformerEngine",
            _lazy("kernels.te", "te_attention"),
            _lazy("kernels.te", "why_not"),
            backend=_lazy("kernels.te", "te_backend"),
        ),
    )
}


def get(name: str) -> Implementation:
    """The implementation called ``name``; ``ValueError`` lists the known names otherwise."""
    if not isinstance(name, str):
        raise ValueError(
            f"implementation name must be a str; got {type(name).__name__} {name!r:.60}. "
            f"Choose from {sorted(IMPLEMENTATIONS)}."
        )
    try:
        return IMPLEMENTATIONS[name]
    except KeyError:
        raise ValueError(f"unknown implementation {name!r}; choose from {sorted(IMPLEMENTATIONS)}.") from None


def why_not(name: str, shape: AttentionShape, dtype, causal: bool = False) -> str | None:
    """Why ``name`` cannot run ``shape``/``dtype``/``causal`` here, or None if it can (it then accepts them)."""
    return get(name).why_not(shape, dtype, causal)
