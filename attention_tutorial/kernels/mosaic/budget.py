"""Tiles and what they cost: the kernels' frozen config, Hopper's shared-memory and register budgets, and the check
that a problem and a config fit them (with the fix named when they don't).

A Hopper CTA may use 227 KiB of shared memory; each compute thread of our kernels gets 232 registers by default
(``set_max_registers``; ``MosaicConfig.registers``), of which 192 are set aside for tiles. The counts are ours, by
hand, not ``ptxas``'s.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax.numpy as jnp

from ...inputs import AttentionShape, check_block_size, check_flag
from .exp2 import COLUMN_GROUP

SMEM_BYTES = 227 * 1024  # shared memory one CTA may use on Hopper (H100, H200)
SMEM_RESERVE = 4 * 1024  # on top of the tiles, where not measured otherwise: the pipelined forward with 3 stages at
# H = 128 asked the H200 for 232,568 B against the 229,888 counted (the plain one with 3 stages compiled and ran)
WARPGROUPS = 3  # per CTA: two compute, one copy
# A CTA of three warpgroups starts with 168 registers per thread (64K registers hold 384 threads × 170, in steps of
# 8); set_max_registers then moves registers from the copy warpgroup to the two compute ones within that pool.
LAUNCH_REGISTERS = 168
REGISTERS = 232  # a compute thread's by default (MosaicConfig.registers), leaving the copy warpgroup 40
MIN_COPY_REGISTERS = 24  # the fewest set_max_registers gives a thread
TILE_REGISTERS = 192  # of the default 232, for tiles; the other 40: indices, max, sum, addresses, ...
PROFILE_BYTES_PER_REGION = 16  # the in-kernel profiler: two events (start, end) of two 32-bit words each
BWD_DQ = ("pass", "atomic", "split")  # how the backward makes dQ (MosaicConfig.bwd_dq)
SCHEDULES = ("rendezvous", "turns")  # how the two compute warpgroups share the tensor cores (MosaicConfig.schedule)
KERNEL_HEAD_DIMS = (64, 128, 256)  # the head dims the kernels' tiles are laid out for; others are padded up to one


def kernel_head_dim(head_dim: int) -> int | None:
    """The head dim the kernels run for ``head_dim``: the smallest of :data:`KERNEL_HEAD_DIMS` at least as large
    (q, k and v get zero columns up to it, which change no score and give output columns that are dropped), or
    None above 256."""
    return next((h for h in KERNEL_HEAD_DIMS if head_dim <= h), None)


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
    """Tile sizes: ``block_q`` rows per compute warpgroup (wgmma's M is 64), ``block_kv`` keys per step (a multiple
    of 16: p·v contracts over it, in runs of 64 keys at the 128-byte swizzle, of 32 at the 64-byte one, of 16 at
    the 32-byte one), and ``stages`` k/v slots in flight; ``bwd_*`` the same for the backward kernels (both blocks
    64: each compute warpgroup there holds two float32 accumulators, dK and dV or dQ, plus two score-sized tiles).
    ``bwd_dq`` says how the backward makes dQ (:data:`BWD_DQ`): ``"pass"``, a kernel of its own that recomputes
    q·kᵀ and dO·vᵀ (seven matrix products per tile pair in all, deterministic); ``"atomic"``, the dK/dV kernel adds
    each step's share dS·k into a float32 dQ in global memory (TMA reduce-add, FlashAttention-2's way, which
    FlashAttention-3 keeps: five products, float32 traffic, a summation order that varies from run to run, so dQ is
    not the same bits twice); ``"split"``, atomic adds as FlashAttention-3 makes them: both warpgroups walk every
    query tile together, hand their dS over through shared memory, and each makes half the head dim of the CTA's
    share (one add per element a step instead of two, half the registers), staged in shared memory for the copy
    warpgroup to add. ``schedule`` says how the two compute warpgroups share the tensor cores
    (:data:`SCHEDULES`, :class:`~attention_tutorial.kernels.mosaic._common.Schedule`).
    ``registers`` and ``bwd_registers``: 32-bit registers per compute thread in the forward and in the backward
    kernels (``set_max_registers``; a multiple of 8 from 168 to 240). The copy warpgroup gets what the two compute
    ones leave of the CTA's pool (:func:`copy_registers`): 40 at 232, 24 at 240 (FlashAttention-3's split).
    ``pipeline=True`` adds FlashAttention-3's intra-warpgroup pipelining to the forward
    (:func:`~attention_tutorial.kernels.mosaic.pipelined.pipelined_steps`). H = 256 needs ``block_kv=64`` (see
    :func:`smem_bytes`). ``bwd_together=True`` issues the backward's two score-sized products (q·kᵀ and dO·vᵀ)
    together and waits for the first alone, so the weights are recomputed while dO·vᵀ runs (FlashAttention-3's
    order); the dK/dV kernel then issues dV's product with dK's (and dQ's share) after dS, one wait for them all.
    ``heavy_first=True`` starts the query blocks from the last (under a causal mask, the ones with the most keys)
    in the forward and the dQ kernel (the dK/dV kernel's first key blocks are already its heaviest).
    ``persistent=True`` launches the forward as one CTA per SM, each walking query blocks in turn
    (:class:`~attention_tutorial.kernels.mosaic._common.Items`): its copy warpgroup fetches the next block's first
    k and v while the compute warpgroups finish the last block, and where shared memory holds a second q tile
    (:func:`q_tiles`) the next block's q loads while this one runs (FlashAttention-3's persistent kernel, for
    short sequences, where a CTA's start and end are a large part of its time); masks computed from positions alone.

    Ways to look inside the kernels (no exponentials, exponentials on the FMA units, the in-kernel profiler) are
    not part of the config: see :class:`Probe`."""

    block_q: int = 64
    block_kv: int = 128
    stages: int = 2
    bwd_block_q: int = 64
    bwd_block_kv: int = 64
    bwd_stages: int = 2
    bwd_dq: str = "pass"
    registers: int = REGISTERS
    bwd_registers: int = REGISTERS
    pipeline: bool = False
    schedule: str = "rendezvous"
    bwd_together: bool = False
    heavy_first: bool = False
    persistent: bool = False

    def __post_init__(self):
        check_flag("MosaicConfig.pipeline", self.pipeline)
        check_flag("MosaicConfig.bwd_together", self.bwd_together)
        check_flag("MosaicConfig.heavy_first", self.heavy_first)
        check_flag("MosaicConfig.persistent", self.persistent)
        if self.persistent and self.pipeline:
            raise ValueError(
                "MosaicConfig: persistent=True runs the plain forward's steps, not the pipelined forward's "
                "(pipeline=True). Set one of them to False."
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(f"MosaicConfig.schedule must be one of {SCHEDULES}; got {self.schedule!r}.")
        if self.bwd_dq not in BWD_DQ:
            raise ValueError(f"MosaicConfig.bwd_dq must be one of {BWD_DQ}; got {self.bwd_dq!r}.")
        for name in ("block_q", "block_kv", "stages", "bwd_block_q", "bwd_block_kv", "bwd_stages"):
            check_block_size(f"MosaicConfig.{name}", getattr(self, name))
        for name in ("block_q", "bwd_block_q", "bwd_block_kv"):
            if getattr(self, name) % 64:
                raise ValueError(
                    f"MosaicConfig.{name} must be a multiple of 64 (wgmma's tile); got {getattr(self, name)}."
                )
        if self.block_kv % 16:  # p·v contracts over the key tile: wgmma reads it in runs of 16 rows at least
            raise ValueError(
                f"MosaicConfig.block_kv must be a multiple of 16 (p·v's contraction, at a 32-byte swizzle); got "
                f"{self.block_kv}."
            )
        for name in ("registers", "bwd_registers"):
            check_registers(f"MosaicConfig.{name}", getattr(self, name))

    @property
    def tile_budget(self) -> int:
        """Registers per compute thread of the forward set aside for tiles: ``registers`` less the 40 that
        indices, maxima and sums take (:data:`TILE_REGISTERS` at the default)."""
        return self.registers - (REGISTERS - TILE_REGISTERS)


@dataclasses.dataclass(frozen=True)
class Probe:
    """Ways to look inside the kernels, for measuring them (never for training).

    ``no_exp=True`` replaces every exp2 of the forward's softmax by the identity (wrong numbers: a timing bound with
    the exponentials' cost removed). ``exp_poly``: the fraction of each score tile's columns whose exponentials the
    forward computes with a polynomial on the FMA units instead of ``exp2`` on the multi-function unit
    (:func:`~attention_tutorial.kernels.mosaic.exp2.exp2_split`; the numbers stay right, within bfloat16's rounding
    of p); 0 to 1 in steps of 8 columns of the key tile. ``profile_space`` regions per warpgroup with
    ``profile_dir`` switch Pallas's in-kernel profiler on in every kernel of the call, forward and backward (each
    kernel's trace goes to ``profile_dir``; the event buffer takes ``profile_space`` × 16 B of shared memory per
    warpgroup)."""

    no_exp: bool = False
    exp_poly: float = 0.0
    profile_space: int = 0
    profile_dir: str = ""

    def __post_init__(self):
        check_flag("Probe.no_exp", self.no_exp)
        f = self.exp_poly
        if isinstance(f, bool) or not isinstance(f, numbers.Real):
            raise TypeError(f"Probe.exp_poly must be a real number (a fraction of the score columns); got {f!r}.")
        if not 0 <= f <= 1:
            raise ValueError(f"Probe.exp_poly must be a fraction of the score columns in [0, 1]; got {f!r}.")
        if f and self.no_exp:
            raise ValueError(
                f"Probe.exp_poly={f!r} and no_exp=True exclude each other: no_exp removes the "
                "exponentials exp_poly would compute. Set one of them."
            )
        if not isinstance(self.profile_dir, str):
            raise TypeError(f"Probe.profile_dir must be a str (a folder); got {self.profile_dir!r}.")
        if self.profile_space:
            check_block_size("Probe.profile_space", self.profile_space)
        if bool(self.profile_space) != bool(self.profile_dir):
            raise ValueError(
                f"Probe.profile_space and profile_dir go together (both set to profile, neither otherwise); "
                f"got profile_space={self.profile_space!r}, profile_dir={self.profile_dir!r}."
            )

    @property
    def profiling(self) -> bool:
        """Whether the in-kernel profiler is on."""
        return bool(self.profile_space)

    def poly_columns(self, block_kv: int) -> int:
        """How many of a score tile's ``block_kv`` columns go through the polynomial: a whole number of
        :data:`~attention_tutorial.kernels.mosaic.exp2.COLUMN_GROUP`-column groups, or a ValueError naming the
        nearest fractions."""
        f = self.exp_poly
        groups, step = f * block_kv / COLUMN_GROUP, COLUMN_GROUP / block_kv
        if abs(groups - round(groups)) > 1e-9:
            raise ValueError(
                f"Probe.exp_poly must be a whole number of {COLUMN_GROUP}-column groups of block_kv = {block_kv} "
                f"(wgmma's register layout), a multiple of {step:g}; got {f!r}: try {math.floor(groups) * step:g} or "
                f"{math.ceil(groups) * step:g}."
            )
        return round(f * block_kv)


NO_PROBE = Probe()


def check_registers(name: str, value) -> None:
    """A compute warpgroup's registers per thread: a multiple of 8 (``setmaxnreg``'s step) from the
    :data:`LAUNCH_REGISTERS` a thread starts with up to what leaves the copy warpgroup :data:`MIN_COPY_REGISTERS`."""
    most = (WARPGROUPS * LAUNCH_REGISTERS - MIN_COPY_REGISTERS) // (WARPGROUPS - 1) // 8 * 8
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (registers per thread); got {value!r}.")
    if value % 8 or not LAUNCH_REGISTERS <= value <= most:
        raise ValueError(
            f"{name} must be a multiple of 8 from {LAUNCH_REGISTERS} to {most} (the two compute warpgroups take "
            f"their registers from the copy warpgroup's, which keeps at least {MIN_COPY_REGISTERS}); got {value!r}."
        )


def copy_registers(registers: int) -> int:
    """Registers per thread the copy warpgroup keeps when each compute thread takes ``registers``: what is left of
    the CTA's pool, ``3 × 168 − 2 × registers`` (40 at 232, 24 at 240)."""
    return WARPGROUPS * LAUNCH_REGISTERS - (WARPGROUPS - 1) * registers


def smem_bytes(cfg: MosaicConfig, head_dim: int, dtype) -> int:
    """Bytes of shared memory the forward allocates: both compute warpgroups' q/output tiles (2·block_q × H),
    the k and v rings (stages·block_kv × H each) and the log-sum-exp rows. H = 256 in 16 bits: 64 KiB of q with
    2×64 rows, and k + v take 2·stages·block_kv·512 B: block_kv = 128 with 2 stages needs 256 KiB more (too much),
    block_kv = 64 with 2 stages 128 KiB (192.5 KiB in all)."""
    item = jnp.dtype(dtype).itemsize
    return (2 * cfg.block_q + 2 * cfg.stages * cfg.block_kv) * head_dim * item + 2 * cfg.block_q * 4


def q_tiles(cfg: MosaicConfig, smem: int, head_dim: int, itemsize: int) -> int:
    """q tiles per compute warpgroup in the forward: 2 for persistent CTAs where shared memory holds a second beside
    ``smem`` bytes of the other tiles (the next block's q then loads while this block runs: H = 128 in 16 bits,
    160.5 + 32 KiB), else 1."""
    second = 2 * cfg.block_q * head_dim * itemsize
    return 2 if cfg.persistent and smem + second + SMEM_RESERVE <= SMEM_BYTES else 1


def bwd_smem_bytes(cfg: MosaicConfig, head_dim: int, dtype) -> int:
    """Bytes of shared memory the dK/dV kernel allocates (the larger of the two backward kernels): each compute
    warpgroup's k and v (2 × 2·bwd_block_kv × H), the ring of q and dO tiles (bwd_stages × 2·bwd_block_q × H) with
    their log-sum-exp and D rows; with dQ by atomics also each warpgroup's dS (bwd_block_kv × bwd_block_q) and its
    float32 share of dQ (bwd_block_q × H) on its way out."""
    item, bq, bkv = jnp.dtype(dtype).itemsize, cfg.bwd_block_q, cfg.bwd_block_kv
    total = 2 * 2 * bkv * head_dim * item + cfg.bwd_stages * (2 * bq * head_dim * item + 2 * bq * 4)
    if cfg.bwd_dq in ("atomic", "split"):  # split: two buffers of half the head dim each
        total += 2 * (bkv * bq * item + bq * head_dim * 4)
    return total


def bwd_split_smem_bytes(cfg: MosaicConfig, head_dim: int, dtype) -> int:
    """Bytes of shared memory the larger of the backward kernels above H = 128 allocates
    (:mod:`~attention_tutorial.kernels.mosaic.backward_split`, both warpgroups on the same rows): the dK/dV kernel's
    k and v (bwd_block_kv × H each), its ring of q and dO tiles with their log-sum-exp and D rows, and Pᵀ and dSᵀ
    (bwd_block_kv × bwd_block_q each); or the dQ kernel's q and dO, its ring of k and v tiles and dS."""
    item, bq, bkv, stages = jnp.dtype(dtype).itemsize, cfg.bwd_block_q, cfg.bwd_block_kv, cfg.bwd_stages
    dkv = 2 * bkv * head_dim * item + stages * (2 * bq * head_dim * item + 2 * bq * 4) + 2 * bkv * bq * item
    dq = 2 * bq * head_dim * item + 2 * bq * 4 + stages * 2 * bkv * head_dim * item + bq * bkv * item
    return max(dkv, dq)


def smem_bytes_fp8(cfg: MosaicConfig, head_dim: int) -> int:
    """Shared memory the FP8 forward allocates: q (E4M3) and the bfloat16 output per compute warpgroup, the k and vᵀ
    rings in E4M3, p in E4M3 per warpgroup, the log-sum-exp rows and the two factors."""
    bq, bkv = cfg.block_q, cfg.block_kv
    return 2 * bq * head_dim * (1 + 2) + 2 * cfg.stages * bkv * head_dim + 2 * bq * bkv + 2 * bq * 4 + 2 * 128 * 4


def profile_bytes(probe: Probe) -> int:
    """Shared memory the in-kernel profiler's event buffer takes (0 when it is off)."""
    return WARPGROUPS * probe.profile_space * PROFILE_BYTES_PER_REGION


def tile_registers(cfg: MosaicConfig, head_dim: int, *, p_bits: int = 16) -> int:
    """32-bit registers per compute thread for the forward's tiles, each spread over a warpgroup's 128 threads: the
    float32 accumulator (block_q × H: 128 at H = 256), the float32 scores s (block_q × block_kv) and p in
    ``p_bits`` (16: two to a register; FP8's 8: four) — twice when pipelined (block j's p feeds the running p·v
    while block j+1's is made)."""
    regs = lambda cols, bits: cfg.block_q * cols * bits // 32 // 128  # noqa: E731
    return regs(head_dim, 32) + regs(cfg.block_kv, 32) + regs(cfg.block_kv, p_bits) * (2 if cfg.pipeline else 1)


def bwd_tile_registers(cfg: MosaicConfig, head_dim: int) -> int:
    """32-bit registers per compute thread for the float32 tiles of the dK/dV kernel's step, each spread over a
    warpgroup's 128 threads: dK and dV (bwd_block_kv × H each), the scores and dP (bwd_block_kv × bwd_block_q each),
    and with dQ by atomics the step's share of dQ (bwd_block_q × H). An upper bound: not all are live at once."""
    bq, bkv = cfg.bwd_block_q, cfg.bwd_block_kv
    share = {"pass": 0, "atomic": bq * head_dim, "split": bq * head_dim // 2}[cfg.bwd_dq]
    tiles = 2 * bkv * head_dim + 2 * bkv * bq + share
    return tiles // 128


def default_config(head_dim: int, *, pipeline: bool = False) -> MosaicConfig:
    """The tiles used when no config is given: ``MosaicConfig()`` (block_kv = 128, 2 stages); at H = 256 block_kv =
    64, since 128 would need more shared memory (:func:`smem_bytes`) and registers (:func:`tile_registers`). At
    H = 64 the backward makes dQ by atomic adds (``bwd_dq="atomic"``): there its float32 share fits the registers, and
    on the H200 it ran faster than a pass of its own; at H = 128 and 256 it would not fit as well, and dQ gets its own
    pass."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ValueError(f"head_dim must be a positive int; got {head_dim!r}.")
    head_dim = kernel_head_dim(head_dim) or head_dim
    return MosaicConfig(
        block_kv=64 if head_dim > 128 else 128, pipeline=pipeline, bwd_dq="atomic" if head_dim <= 64 else "pass"
    )


def problem(shape: AttentionShape, dtype, cfg: MosaicConfig, probe: Probe = NO_PROBE) -> str | None:
    """Why the 16-bit kernels cannot take this problem with these tiles (and this probe), naming the fix, or None."""
    name = jnp.dtype(dtype).name
    if name not in ("bfloat16", "float16"):
        return f"it takes bfloat16 or float16 inputs, not {name}."
    H = kernel_head_dim(shape.head_dim)
    if H is None:
        return (
            f"head_dim must be at most 256; got {shape.head_dim} (the kernels' tiles are laid out for H = 64, 128 "
            "and 256, and a smaller head dim runs padded with zeros to the next of these)."
        )
    reserve = SMEM_RESERVE if cfg.pipeline else 0
    if (need := smem_bytes(cfg, H, dtype)) + reserve > SMEM_BYTES:
        return (
            f"at H={H}, block_kv={cfg.block_kv} and stages={cfg.stages} the forward's tiles need {need / 1024:.1f} "
            f"KiB of shared memory, more than the {(SMEM_BYTES - reserve) // 1024} KiB a Hopper CTA leaves for them: "
            f"pick a smaller block_kv or "
            f"fewer stages (H=256 fits with config=MosaicConfig(block_kv=64, stages=2), or block_kv=80, or pass no config)."
        )
    if probe.exp_poly:
        try:
            probe.poly_columns(cfg.block_kv)
        except ValueError as e:
            return str(e)
    if probe.profiling and (need := smem_bytes(cfg, H, dtype) + reserve + profile_bytes(probe)) > SMEM_BYTES:
        return (
            f"profile_space={probe.profile_space} adds {profile_bytes(probe) / 1024:.1f} KiB of shared memory to the "
            f"forward's tiles ({need / 1024:.1f} KiB in all, more than {SMEM_BYTES // 1024} KiB): pick a smaller "
            "profile_space or a shorter S (fewer key blocks, fewer regions per warpgroup)."
        )
    if (H > 128 or cfg.pipeline) and (regs := tile_registers(cfg, H)) > cfg.tile_budget:
        return (
            f"at H={H}, block_kv={cfg.block_kv}{' with pipeline=True' if cfg.pipeline else ''} the forward's tiles "
            f"need {regs} registers per thread, more than the {cfg.tile_budget} this kernel budgets: pick "
            f"block_kv=64 (e.g. config=MosaicConfig(block_kv=64, stages=2{', pipeline=True' if cfg.pipeline else ''}))."
        )
    if cfg.pipeline and (shape.seq_q % (2 * cfg.block_q) or shape.seq_kv % cfg.block_kv):
        return (
            f"the pipelined forward needs T a multiple of 2·block_q = {2 * cfg.block_q} and S of block_kv = "
            f"{cfg.block_kv}; got T={shape.seq_q}, S={shape.seq_kv}: pass pipeline=False (any T and S)."
        )
    if H <= 128 and (need := bwd_smem_bytes(cfg, H, dtype)) + SMEM_RESERVE > SMEM_BYTES:
        return (
            f"at H={H}, bwd_block_q={cfg.bwd_block_q}, bwd_block_kv={cfg.bwd_block_kv}, bwd_stages={cfg.bwd_stages}"
            f"{'' if cfg.bwd_dq == 'pass' else f' with bwd_dq={cfg.bwd_dq!r}'} the dK/dV kernel needs {need / 1024:.1f} KiB "
            f"of shared memory, more than the {(SMEM_BYTES - SMEM_RESERVE) // 1024} KiB a Hopper CTA leaves for its "
            "tiles: pick bwd_stages=2 or smaller bwd blocks."
        )
    split_tiles = (cfg.bwd_block_q, cfg.bwd_block_kv) == (64, 64)  # others: refused by the backward, naming them
    if H > 128 and split_tiles and (need := bwd_split_smem_bytes(cfg, H, dtype)) + SMEM_RESERVE > SMEM_BYTES:
        return (
            f"at H={H}, bwd_stages={cfg.bwd_stages} the backward's kernels need {need / 1024:.1f} KiB of shared "
            f"memory, more than the {(SMEM_BYTES - SMEM_RESERVE) // 1024} KiB a Hopper CTA leaves for their tiles: "
            "pick bwd_stages=2."
        )
    if (
        probe.profiling
        and H <= 128
        and (need := bwd_smem_bytes(cfg, H, dtype) + SMEM_RESERVE + profile_bytes(probe)) > SMEM_BYTES
    ):
        return (
            f"profile_space={probe.profile_space} adds {profile_bytes(probe) / 1024:.1f} KiB of shared memory to the dK/dV "
            f"kernel's tiles ({need / 1024:.1f} KiB in all, more than {SMEM_BYTES // 1024} KiB): pick a smaller "
            "profile_space or a shorter T (fewer query blocks, fewer regions per warpgroup)."
        )
    return None


FP8_HEAD_DIMS = (128,)  # 128-byte rows of E4M3: the 128-byte swizzle the tiles use


def fp8_problem(shape: AttentionShape, cfg: MosaicConfig, probe: Probe = NO_PROBE) -> str | None:
    """Why the FP8 forward cannot take this problem with these tiles (naming the fix), or None."""
    if cfg.pipeline or cfg.block_q != 64 or cfg.block_kv % 64:
        return (
            f"the FP8 forward takes pipeline=False, block_q=64 and block_kv a multiple of 64 (E4M3 p's rows in whole "
            f"64- or 128-byte swizzles); got pipeline={cfg.pipeline}, block_q={cfg.block_q}, block_kv={cfg.block_kv}."
        )
    if probe.exp_poly:
        try:
            probe.poly_columns(cfg.block_kv)
        except ValueError as e:
            return str(e)
    if probe.profiling:
        return "the FP8 forward has no profiler regions: profile the 16-bit forward (profile_space=0 here)."
    if (regs := tile_registers(cfg, shape.head_dim, p_bits=8)) > cfg.tile_budget:
        return (
            f"at block_kv={cfg.block_kv} the FP8 forward's tiles need {regs} registers per thread, more "
            f"than the {cfg.tile_budget} the kernel budgets: use block_kv=128 or 192."
        )
    if (need := smem_bytes_fp8(cfg, shape.head_dim)) + SMEM_RESERVE > SMEM_BYTES:
        return (
            f"at block_kv={cfg.block_kv} and stages={cfg.stages} the FP8 forward needs {need / 1024:.1f} KiB of "
            f"shared memory, more than the {(SMEM_BYTES - SMEM_RESERVE) // 1024} KiB a Hopper CTA leaves beside "
            "barriers: use fewer stages."
        )
    if shape.head_dim not in FP8_HEAD_DIMS:
        return f"the FP8 forward takes H = 128 (128-byte rows of E4M3); got H={shape.head_dim}."
    return None
