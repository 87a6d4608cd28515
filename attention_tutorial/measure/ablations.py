"""The kernels' ablations: each of our Mosaic GPU forwards as it is, with its exponentials removed, and with part of
them moved to the FMA units, timed beside cuDNN in the same process.

Without ``exp2`` (``Probe(no_exp=True)``: each exp2 of the softmax becomes the identity, so the numbers are
wrong) a kernel keeps every matmul, copy, barrier and the rest of its softmax: how fast it runs then bounds what
hiding its exponentials better could gain. With ``exp_poly`` (:data:`EXP_POLY`; right numbers) the plain and
pipelined bf16 forwards at H = 128 try one lever towards that bound: 25 % or 50 % of each score tile's columns go
through a cubic on the FMA units instead of ``MUFU.EX2`` (:mod:`~attention_tutorial.kernels.mosaic.exp2`, whose count
of issue slots balances the two units near 23 % and has the FMA side the bottleneck again by 50 %). Each kernel and
variant is timed right after cuDNN on the same inputs, in ``ROUNDS`` rounds over all of them, so that a drift of the
GPU's clock moves both sides of a pair alike.

Kernels (:data:`KERNELS`): the plain and the pipelined bf16 forward at H = 128 and 256, without a mask and causal,
against cuDNN (``jax.nn.dot_product_attention``, bf16); our FP8 forward with p in registers against cuDNN's FP8
forward (P scale 448), both masks. Shape: B = 4, T = S = 8192, N = K = 16.

Records (grid ``"ablations"``, written by ``python -m attention_tutorial record --grids --extras ablations``): the
usual record fields (impl, batch, seq_q, seq_kv, heads, kv_heads, head_dim, dtype, causal, pass "fwd", status,
median_ms, p10_ms, p90_ms, tflops, compile_s, pct_peak, ...) plus

* ``variant``: one of :data:`VARIANTS` — the kernel's variant (:data:`DESCRIPTIONS`); a cuDNN record carries the
  variant of the kernel it was timed beside (cuDNN itself always runs as it is);
* ``round``: 1, 2, ...;
* ``pair``: the impl of our kernel in the pair (``"mosaic"``, ``"mosaic_pipe"``, ``"mosaic_fp8_regs"``), on our
  kernel's record and on its cuDNN record alike (``impl`` tells them apart: ``"cudnn"`` or ``"cudnn_fp8_s448"``);
* ``experiment``: ``"ablation"``.

So each kernel record has exactly one cuDNN record with the same pair, variant, round, head_dim and causal: the
one timed right before it. :func:`ablation_ratios` reads them back as speed ratios. The grid's provenance is every
grid's (versions, date, seconds, the command).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from ..inputs import AttentionShape, make_qkv
from .flops import attention_flops
from .sweep import Point, empty_record, failure_fields, timed_record
from .timing import time_fn

GRID = "ablations"
EXP_POLY = {"exp_poly_25": 0.25, "exp_poly_50": 0.5}  # variant: the fraction of score columns on the FMA units
VARIANTS = ("as_is", "no_exp", *EXP_POLY)
DESCRIPTIONS = {
    "as_is": "as they are",
    "no_exp": "taken out (wrong numbers)",
    **{name: f"{100 * f:.0f} % of p's by a polynomial on the FMA units" for name, f in EXP_POLY.items()},
}
ROUNDS = 2
SHAPE = (4, 8192, 16)  # B, T = S, N (= K)
TIMING = {"repeats": 10, "warmup": 2, "max_seconds": 0.4}  # per timing: ~1-4 ms calls, 112 timings in all


@dataclasses.dataclass(frozen=True)
class AblationKernel:
    """One kernel of the ablations: our ``impl`` at head dim ``head_dim``, with or without the causal mask, timed
    against ``baseline``."""

    impl: str
    head_dim: int
    causal: bool
    baseline: str

    @property
    def dtype(self) -> str:
        """The dtype its records carry: the kernel's arithmetic (the inputs are bfloat16 either way)."""
        return "float8_e4m3fn" if self.impl == "mosaic_fp8_regs" else "bfloat16"


KERNELS = tuple(
    [
        AblationKernel(impl, H, causal, "cudnn")
        for H in (128, 256)
        for impl in ("mosaic", "mosaic_pipe")
        for causal in (False, True)
    ]
    + [AblationKernel("mosaic_fp8_regs", 128, causal, "cudnn_fp8_s448") for causal in (False, True)]
)


def kernel_variants(kernel: AblationKernel) -> tuple[str, ...]:
    """The variants ``kernel`` is timed in: as it is and without exp2, and for the plain and pipelined bf16
    forwards at H = 128 also with :data:`EXP_POLY`'s fractions (a budget of about 3 minutes for the whole run)."""
    if kernel.impl in ("mosaic", "mosaic_pipe") and kernel.head_dim == 128:
        return VARIANTS
    return ("as_is", "no_exp")


def kernel_fn(kernel: AblationKernel, variant: str):
    """Our kernel as a function of (q, k, v), as it is (``"as_is"``), without its exponentials (``"no_exp"``) or
    with part of them on the FMA units (``"exp_poly_25"``, ``"exp_poly_50"``)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}; got {variant!r}.")
    from ..kernels.mosaic.budget import Probe, default_config

    probe = Probe(no_exp=variant == "no_exp", exp_poly=EXP_POLY.get(variant, 0.0))
    if kernel.impl == "mosaic_fp8_regs":
        from ..kernels.mosaic.fp8 import mosaic_fp8_attention

        return functools.partial(mosaic_fp8_attention, is_causal=kernel.causal, p_via="registers", probe=probe)
    if kernel.impl not in ("mosaic", "mosaic_pipe"):
        raise ValueError(f"kernel.impl must be 'mosaic', 'mosaic_pipe' or 'mosaic_fp8_regs'; got {kernel.impl!r}.")
    from ..kernels.mosaic.attention import mosaic_flash_attention

    config = default_config(kernel.head_dim, pipeline=kernel.impl == "mosaic_pipe")
    return functools.partial(mosaic_flash_attention, is_causal=kernel.causal, config=config, probe=probe)


def baseline_fn(kernel: AblationKernel):
    """cuDNN's forward that ``kernel`` is timed against, as a function of (q, k, v)."""
    if kernel.baseline == "cudnn_fp8_s448":
        from .fp8 import cudnn_fp8_attention

        return functools.partial(cudnn_fp8_attention, is_causal=kernel.causal, scale_s=448.0)
    if kernel.baseline != "cudnn":
        raise ValueError(f"kernel.baseline must be 'cudnn' or 'cudnn_fp8_s448'; got {kernel.baseline!r}.")
    from ..kernels.fused import dot_product_attention

    return functools.partial(dot_product_attention, implementation="cudnn", is_causal=kernel.causal)


def why_not(kernel: AblationKernel, shape: AttentionShape) -> str | None:
    """Why ``kernel`` cannot run at ``shape`` here (our kernel's reason; cuDNN's is found by running it), or None."""
    from ..kernels.mosaic import attention, fp8

    if kernel.impl == "mosaic_fp8_regs":
        return fp8.why_not(shape, jnp.bfloat16, kernel.causal)
    check = attention.pipelined_why_not if kernel.impl == "mosaic_pipe" else attention.why_not
    return check(shape, jnp.bfloat16, kernel.causal)


def ablation_records(
    *, kernels=KERNELS, shape=SHAPE, rounds: int = ROUNDS, variants=None, peak_tflops=None, progress=False, **timing
) -> list[dict]:
    """Time every kernel of ``kernels`` in each of its variants (:func:`kernel_variants`, or ``variants`` for
    every kernel) beside its cuDNN baseline, ``rounds`` times over; the records of the module docstring. A pair that
    cannot run or fails is recorded with its status and reason, both sides, in every round."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int; got {rounds!r}.")
    if variants is not None and (isinstance(variants, str) or not variants or set(variants) - set(VARIANTS)):
        raise ValueError(f"variants must be a non-empty sequence of {VARIANTS}; got {variants!r}.")
    B, T, N = shape
    timing = {**TIMING, **timing}
    failed: dict[tuple[str, str], dict]  # the fields of a pair's failure
    inputs, compiled, failed = {}, {}, {}
    pairs = [(kernel, variant) for kernel in kernels for variant in (variants or kernel_variants(kernel))]

    def args(H):
        if H not in inputs:
            inputs[H] = make_qkv(B, T, N, H, dtype=jnp.bfloat16, seed=H)
        return inputs[H]

    def executable(key, fn, H):  # compiled once, timed in every round
        if key not in compiled:
            compiled[key] = jax.jit(fn).lower(*args(H)).compile()
        return compiled[key]

    records = []
    for rnd in range(1, rounds + 1):
        for kernel, variant in pairs:
            H = kernel.head_dim
            point = AttentionShape(B, T, T, N, N, H)
            fields = {"variant": variant, "round": rnd, "pair": kernel.impl, "experiment": "ablation"}
            reason = failed.get((kernel, variant))
            if reason is None and (why := why_not(kernel, point)):
                reason = {"status": "unsupported", "reason": why}
            flops = attention_flops(B, T, T, N, H, causal=kernel.causal)
            out = []
            # cuDNN first, then ours: each compiled once (cuDNN once per head dim and mask)
            for impl, key, make in (
                (kernel.baseline, (kernel.baseline, H, kernel.causal), baseline_fn),
                (kernel.impl, (kernel, variant), functools.partial(kernel_fn, variant=variant)),
            ):
                base = {**empty_record(Point(impl, *point, dtype=kernel.dtype, causal=kernel.causal)), **fields}
                if reason:
                    out.append({**base, **reason})
                    continue
                try:
                    fn = make(kernel)
                    t = time_fn(fn, *args(H), compiled=executable(key, fn, H), **timing)
                    out.append(timed_record(base, t, flops=flops, peak_tflops=peak_tflops, **fields))
                except Exception as err:  # one failing pair leaves the others standing; its later rounds say why
                    reason = failed[(kernel, variant)] = failure_fields(err)
                    out = [{**r, **NO_TIMES, **reason} for r in out] + [{**base, **reason}]
            if progress:
                print(_progress_line(out), flush=True)
            records += out
    return records


NO_TIMES = {"median_ms": None, "p10_ms": None, "p90_ms": None, "tflops": None, "pct_peak": None, "compile_s": None}


def _progress_line(pair_records) -> str:
    ours = pair_records[-1]
    if all(r["status"] == "ok" for r in pair_records):
        ratio = pair_records[0]["median_ms"] / ours["median_ms"]
        return (
            f"ablations round {ours['round']}: {ours['impl']} H={ours['head_dim']} causal={ours['causal']} "
            f"{ours['variant']}: {100 * ratio:.1f} % of {pair_records[0]['impl']}"
        )
    return f"ablations round {ours['round']}: {ours['impl']} {ours['variant']}: {ours['status']} ({ours.get('reason')})"


@dataclasses.dataclass(frozen=True)
class AblationRatio:
    """One kernel in one variant against cuDNN: ``per_round`` speed ratios (cuDNN's median time over ours, so
    1.05 means ours is 5 % faster), and their range over rounds, ``low`` (our 90th-percentile time against cuDNN's
    10th, the worst round) to ``high`` (our 10th against cuDNN's 90th, the best round)."""

    impl: str
    variant: str
    head_dim: int
    causal: bool
    baseline: str
    per_round: tuple[float, ...]
    low: float
    high: float

    @property
    def median(self) -> float:
        """The median of the per-round ratios."""
        values = sorted(self.per_round)
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def ablation_ratios(records) -> list[AblationRatio]:
    """Each kernel and variant of the ``"ablations"`` grid in ``records`` against its cuDNN record, round by round
    (pairs where either side is not ok are left out; a kernel with no ok pair gives no entry). Ordered by impl, head
    dim, mask, variant."""
    grid = [r for r in records if r.get("grid", GRID) == GRID and "pair" in r and "variant" in r]
    baselines = {_pair_key(r): r for r in grid if r["impl"] != r["pair"]}
    rounds: dict[tuple[str, str, int, bool, str], list] = {}
    for ours in (r for r in grid if r["impl"] == r["pair"]):
        theirs = baselines.get(_pair_key(ours))
        if theirs is None or ours["status"] != "ok" or theirs["status"] != "ok":
            continue
        key = (ours["impl"], ours["variant"], ours["head_dim"], ours["causal"], theirs["impl"])
        rounds.setdefault(key, []).append((ours["round"], ours, theirs))
    out = []
    for key, found in sorted(rounds.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][3], VARIANTS.index(kv[0][1]))):
        found.sort(key=lambda x: x[0])
        per_round = tuple(theirs["median_ms"] / ours["median_ms"] for _, ours, theirs in found)
        low = min(theirs["p10_ms"] / ours["p90_ms"] for _, ours, theirs in found)
        high = max(theirs["p90_ms"] / ours["p10_ms"] for _, ours, theirs in found)
        out.append(AblationRatio(*key, per_round=per_round, low=low, high=high))
    return out


def _pair_key(rec) -> tuple:
    return (
        rec["pair"],
        rec["variant"],
        rec["round"],
        rec["head_dim"],
        rec["causal"],
        rec["batch"],
        rec["seq_q"],
        rec["heads"],
    )
