"""FP8 on Hopper, three honest experiments (GPU only; the recorder runs them, the TE page shows them).

1. ``te.autocast`` around TransformerEngine's ``DotProductAttention``: does anything become FP8? We compare the
   outputs and list the FP8 types in the compiled HLO (none: TE's attention stays bf16 under autocast).
2. Where autocast does act: a TE ``DenseGeneral`` GEMM, bf16 vs FP8 (E4M3 forward under the HYBRID recipe),
   speed and error against a float32 product.
3. Real FP8 attention: cuDNN's FP8 flash attention through JAX's **private**
   ``jax._src.cudnn.fused_attention_stablehlo.dot_product_attention(..., use_fp8=True)`` (checked with
   jax 0.10.2 and 0.11.2). Inputs are cast to ``float8_e4m3fn``; each tensor carries a float32 *scale* (multiply
   before casting to FP8) and *descale* (its inverse, applied by the kernel after each FP8 matmul). The softmax
   probabilities P are also stored in FP8 before P·V, with their own ``scale_s``; we measure ``scale_s = 1`` and
   ``scale_s = 448`` (E4M3's largest value, since P <= 1) to see whether that scale matters.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax.core import meta

from ..inputs import AttentionShape, make_qkv
from ..kernels import mosaic
from ..kernels.mosaic import fp8, mosaic_flash_attention
from ..kernels.mosaic.fp8 import E4M3_MAX, mosaic_fp8_attention, quantize_e4m3
from .compiled import compile_stats
from .flops import attention_flops, gemm_flops
from .kernel_code import FP8_PATHS
from .sweep import Point, empty_record, failure_fields, gemm_record, timed_record
from .timing import time_fn

REF_MAX_T = 4096  # the float32 reference (its T × T scores) is computed up to this length
WRONG_ABOVE = {"bfloat16": 0.02, "float8_e4m3fn": 0.1}  # relative errors past E4M3's (~0.06) or bf16's own rounding
OURS_WHY_NOT = {"mosaic": mosaic.why_not, "mosaic_fp8": fp8.why_not, "mosaic_fp8_regs": fp8.why_not}
FP8_SHAPES = ((8, 4096), (4, 8192), (2, 16384), (1, 32768), (1, 65536))  # (B, T), N=16, H=128: 32k tokens, 64k last
DENSE_SHAPE = (8, 4096, 4096, 4096)  # TE DenseGeneral: x (8, 4096 tokens, 4096 in) -> 4096 out


def rel_error(x, ref) -> float:
    """‖x − ref‖ / ‖ref‖ in float64."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def cudnn_fp8_attention(q, k, v, *, is_causal=False, scale_s: float = 1.0):
    """cuDNN FP8 attention forward on bf16/f32 inputs: per-tensor scales to E4M3, FP8 out, dequantized to bf16."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_attn  # private API: guarded by the caller

    H = q.shape[-1]
    (q8, dq), (k8, dk), (v8, dv) = (quantize_e4m3(x) for x in (q, k, v))  # the largest |x| maps to 448
    one = jnp.ones((1, 1, 1, 1), jnp.float32)
    params = {key: one for key in cudnn_attn.fp8_params_keys}
    params.update(
        descale_q=one * dq,
        descale_k=one * dk,
        descale_v=one * dv,
        scale_s=one * scale_s,
        descale_s=one / scale_s,
        scale_o=one / dv,
        descale_o=one * dv,
    )
    mask = cudnn_attn.MaskType.CAUSAL if is_causal else cudnn_attn.MaskType.NO_MASK
    out8, _, _ = cudnn_attn.dot_product_attention(
        q8,
        k8,
        v8,
        fp8_params=params,  # type: ignore[arg-type]
        scale=1.0 / math.sqrt(H),
        mask_type=mask,
        use_fp8=True,
    )
    return (out8.astype(jnp.float32) * dv).astype(jnp.bfloat16)  # O was stored as O · scale_o


def output_rounding_error(q, k, v, *, is_causal: bool = False) -> float:
    """The relative error (against float32) of rounding the exact attention output to E4M3 the way cuDNN's FP8 path
    stores it — O · scale_o with scale_o = 1 / descale_v, as :func:`cudnn_fp8_attention` asks — and nothing else:
    the part of cuDNN FP8's error that its 8-bit output alone costs. Runs on any backend."""
    ref = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=is_causal, implementation="xla"))(
        *(x.astype(jnp.float32) for x in (q, k, v))
    )
    _, dv = quantize_e4m3(v)
    rounded = (ref / dv).astype(jnp.float8_e4m3fn).astype(jnp.float32) * dv
    return rel_error(rounded, ref)


def _point(impl, shape: AttentionShape, causal, dtype) -> Point:
    return Point(impl, *shape, dtype=dtype, causal=causal)


def _record(impl, shape: AttentionShape, causal, dtype, t, *, flops, peak, **extra):
    """An attention record; ``peak`` is the bf16 matmul measured in the run (FP8 dtypes are set against twice it).
    Every call here is timed end to end: an FP8 path quantises its bf16 inputs and dequantises its output."""
    return timed_record(empty_record(_point(impl, shape, causal, dtype)), t, flops=flops, peak_tflops=peak, **extra)


def _gemm(impl, dtype) -> dict:
    """The TE DenseGeneral GEMM's record before measuring: (8·4096, 4096) × (4096, 4096)."""
    m_b, m_t, k_in, n_out = DENSE_SHAPE
    return gemm_record(impl, m=m_b * m_t, k=k_in, n=n_out, dtype=dtype, experiment="te_dense")


def _failed(impl, shape, causal, dtype, status, reason) -> list[dict]:
    return [{**empty_record(_point(impl, shape, causal, dtype)), "status": status, "reason": reason}]


def _guarded(impl, shape, causal, dtype, fn) -> list[dict]:
    """Run ``fn`` (returning records); a failure becomes one oom/unsupported/error record, as in a sweep."""
    try:
        return fn()
    except Exception as err:
        return [{**empty_record(_point(impl, shape, causal, dtype)), **failure_fields(err)}]


def cudnn_fp8_records(peak=None, **timing) -> list[dict]:
    """bf16 cuDNN vs FP8 cuDNN (scale_s = 1 and 448), and ours in bf16 and FP8 (``mosaic``, ``mosaic_fp8``): time,
    TFLOP/s and error against a float32 reference."""
    from ..kernels.fused import dot_product_attention

    recs = []
    for B, T in FP8_SHAPES:
        for causal in (False, True):
            shape = AttentionShape(B, T, T, 16, 16, 128)

            def run(shape=shape, causal=causal, B=B, T=T):
                q, k, v = make_qkv(B, T, 16, 128, dtype=jnp.bfloat16, seed=T)
                ref = (
                    jax.jit(
                        lambda q, k, v: dot_product_attention(
                            q.astype(jnp.float32),
                            k.astype(jnp.float32),
                            v.astype(jnp.float32),
                            implementation="xla",
                            is_causal=causal,
                        )
                    )(q, k, v)
                    if T <= REF_MAX_T
                    else None
                )
                flops = attention_flops(B, T, T, 16, 128, causal=causal)
                out = []
                variants: list[tuple[str, str, Callable, dict]] = [
                    (
                        "cudnn",
                        "bfloat16",
                        lambda q, k, v: dot_product_attention(q, k, v, implementation="cudnn", is_causal=causal),
                        {},
                    )
                ]
                for s in (1.0, E4M3_MAX):
                    variants.append(
                        (
                            f"cudnn_fp8_s{int(s)}",
                            "float8_e4m3fn",
                            lambda q, k, v, s=s: cudnn_fp8_attention(q, k, v, is_causal=causal, scale_s=s),
                            {"scale_s": s},
                        )
                    )
                # ours: the Mosaic GPU kernel in bf16 and our FP8 forward (P scale 448, as cuDNN's best)
                variants.append(("mosaic", "bfloat16", functools.partial(mosaic_flash_attention, is_causal=causal), {}))
                for impl, p_via in FP8_PATHS.items():  # "mosaic_fp8": p via shared memory (the name predates the
                    # registers path, the kernel's default now; recorded results keep the name)
                    variants.append(
                        (
                            impl,
                            "float8_e4m3fn",
                            functools.partial(mosaic_fp8_attention, is_causal=causal, p_via=p_via),
                            {"scale_s": E4M3_MAX},
                        )
                    )

                def one(impl, dtype, fn, extra):
                    err = rel_error(jax.jit(fn)(q, k, v), ref) if ref is not None else None
                    if err is not None and err > WRONG_ABOVE[dtype]:  # a wrong answer is not timed as a result
                        raise ArithmeticError(
                            f"wrong result: relative error {err:.3g} against float32, above "
                            f"{WRONG_ABOVE[dtype]} for {dtype}"
                        )
                    t = time_fn(fn, q, k, v, **timing)
                    kern = compile_stats(fn, q, k, v).attention_kernel
                    return [
                        _record(
                            impl,
                            shape,
                            causal,
                            dtype,
                            t,
                            flops=flops,
                            peak=peak,
                            rel_error=err,
                            kernel=kern,
                            experiment="cudnn_fp8",
                            **extra,
                        )
                    ]

                for impl, dtype, fn, extra in variants:  # each guarded apart: one failing leaves the others standing
                    why = OURS_WHY_NOT[impl](shape, jnp.bfloat16, causal) if impl in OURS_WHY_NOT else None
                    got = (
                        _failed(impl, shape, causal, dtype, "unsupported", why)
                        if why
                        else _guarded(impl, shape, causal, dtype, functools.partial(one, impl, dtype, fn, extra))
                    )
                    out += [{**r, "experiment": "cudnn_fp8"} for r in got]
                return out

            recs += _guarded("cudnn_fp8", shape, causal, "float8_e4m3fn", run)
    return recs


def te_records(peak=None, **timing) -> list[dict]:
    """TE attention with and without ``te.autocast`` (FP8 types in HLO, output change) and a TE DenseGeneral GEMM
    in bf16 vs FP8."""
    from ..kernels import te

    shape = AttentionShape(8, 4096, 4096, 16, 16, 128)
    if reason := te.why_not(shape, jnp.bfloat16, True):
        return _failed("te_autocast", shape, True, "bfloat16", "unsupported", reason)

    def attention():
        te_jax = te.import_te()

        q, k, v = make_qkv(8, 4096, 16, 128, dtype=jnp.bfloat16, seed=1)
        flops = attention_flops(8, 4096, 4096, 16, 128, causal=True)
        base = jax.jit(lambda q, k, v: te.te_attention(q, k, v, is_causal=True))
        plain = base(q, k, v)
        out = []
        t = time_fn(base, q, k, v, **timing)
        out.append(
            _record(
                "te",
                shape,
                True,
                "bfloat16",
                t,
                flops=flops,
                peak=peak,
                experiment="te_autocast",
                fp8_types_in_hlo=list(te.hlo_fp8_types(base, q, k, v)),
                kernel=compile_stats(base, q, k, v).attention_kernel,
            )
        )
        with te_jax.autocast(enabled=True, recipe=te.delayed_scaling_recipe()):
            fn = jax.jit(lambda q, k, v: te.te_attention(q, k, v, is_causal=True))
            under = fn(q, k, v)
            t = time_fn(fn, q, k, v, **timing)
            types = list(te.hlo_fp8_types(fn, q, k, v))
            kern = compile_stats(fn, q, k, v).attention_kernel
        diff = float(jnp.max(jnp.abs(under.astype(jnp.float32) - plain.astype(jnp.float32))))
        out.append(
            _record(
                "te_autocast",
                shape,
                True,
                "bfloat16",
                t,
                flops=flops,
                peak=peak,
                experiment="te_autocast",
                fp8_types_in_hlo=types,
                max_abs_diff_vs_bf16=diff,
                kernel=kern,
            )
        )
        return out

    def dense():
        te_jax = te.import_te()
        te_flax = te_jax.flax

        m_b, m_t, k_in, n_out = DENSE_SHAPE
        x = jax.random.normal(jax.random.key(0), (m_b, m_t, k_in), jnp.bfloat16)
        flops = gemm_flops(m_b * m_t, k_in, n_out)
        layer = te_flax.DenseGeneral(features=n_out, use_bias=False, dtype=jnp.bfloat16)
        out = []
        for impl, enabled in (("te_dense_bf16", False), ("te_dense_fp8", True)):
            with te_jax.autocast(enabled=enabled, recipe=te.delayed_scaling_recipe() if enabled else None):
                variables = layer.init(jax.random.key(1), x)
                fn = jax.jit(lambda variables, x: layer.apply(variables, x, mutable=True)[0])
                y = fn(variables, x)
                t = time_fn(fn, variables, x, **timing)
                types = list(te.hlo_fp8_types(fn, variables, x))
            w = meta.unbox(variables["params"]["kernel"]).astype(jnp.float32)  # TE boxes params with sharding axes
            ref = jnp.einsum("btk,kn->btn", x.astype(jnp.float32), w, precision="highest")
            base = _gemm(impl, "float8" if enabled else "bfloat16")
            out.append(
                timed_record(
                    base, t, flops=flops, peak_tflops=peak, fp8_types_in_hlo=types, rel_error=rel_error(y, ref)
                )
            )
            del ref, y
        return out

    try:
        dense_recs = dense()
    except Exception as err:
        dense_recs = [{**_gemm("te_dense_fp8", "float8"), **failure_fields(err)}]
    return _guarded("te_autocast", shape, True, "bfloat16", attention) + dense_recs


def fp8_records(peak_tflops=None, **timing) -> list[dict]:
    """All FP8 experiments: TE (when installed) and cuDNN FP8 attention."""
    return te_records(peak_tflops, **timing) + cudnn_fp8_records(peak_tflops, **timing)
