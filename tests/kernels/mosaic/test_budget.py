"""The config and the budgets: bad sizes refused, shared memory and registers counted by hand, each misfit naming its
fix."""

import dataclasses
import functools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from attention_tutorial.inputs import AttentionShape
from attention_tutorial.kernels.mosaic import mosaic_flash_attention
from attention_tutorial.kernels.mosaic.budget import (
    LAUNCH_REGISTERS,
    SMEM_BYTES,
    TILE_REGISTERS,
    WARPGROUPS,
    MosaicConfig,
    Probe,
    bwd_smem_bytes,
    bwd_split_smem_bytes,
    bwd_tile_registers,
    copy_registers,
    default_config,
    fp8_problem,
    problem,
    profile_bytes,
    q_tiles,
    smem_bytes,
    smem_bytes_fp8,
    tile_registers,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("shape", "dtype", "expected"),
    [
        (AttentionShape(1, 256, 256, 4, 4, 128), jnp.float32, "bfloat16 or float16"),
        (AttentionShape(1, 256, 256, 4, 4, 320), jnp.bfloat16, "head_dim must be at most 256; got 320"),
        (AttentionShape(1, 256, 256, 4, 4, 96), jnp.bfloat16, None),  # runs as H = 128
        (AttentionShape(1, 256, 256, 4, 4, 192), jnp.bfloat16, "320.5 KiB of shared memory"),  # as H = 256
        (AttentionShape(1, 256, 256, 4, 4, 256), jnp.bfloat16, "320.5 KiB of shared memory"),
        (AttentionShape(1, 200, 256, 4, 4, 64), jnp.bfloat16, None),  # any T and S
        (AttentionShape(1, 1, 200, 4, 4, 64), jnp.float16, None),
        (AttentionShape(1, 256, 384, 4, 2, 128), jnp.float16, None),
    ],
)
def test_problem_checks_name_the_fix(shape, dtype, expected):
    reason = problem(shape, dtype, MosaicConfig())
    assert reason is None if expected is None else expected in reason


def test_only_the_pipelined_forward_needs_whole_tiles():
    reason = problem(AttentionShape(1, 200, 256, 4, 4, 128), jnp.bfloat16, MosaicConfig(pipeline=True))
    assert "multiple of 2·block_q = 128" in reason and "pipeline=False" in reason


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("block_kv", 0, "must be a positive integer"),
        ("bwd_stages", -1, "must be a positive integer"),
        ("bwd_block_q", 96, "must be a multiple of 64"),
        ("block_kv", 72, "must be a multiple of 16"),
        ("block_q", 2.0, "must be a positive integer"),
    ],
)
def test_config_refuses_bad_sizes(field, value, expected):
    with pytest.raises(ValueError, match=f"MosaicConfig.{field} {expected}"):
        MosaicConfig(**{field: value})


@pytest.mark.parametrize("block_kv", [160, 176])
def test_a_key_tile_of_odd_multiples_of_16_or_32_keys_takes_a_narrower_swizzle_and_lowers(block_kv):
    """wgmma contracts p·v over the key tile in runs of swizzle / 2 rows: 160 keys need the 64-byte swizzle, 176
    (FlashAttention-3's tile at H = 128) the 32-byte one."""
    from attention_tutorial.kernels.mosaic._common import rows_swizzle

    assert [rows_swizzle(n) for n in (64, 128, 96, 160, 48, 176)] == [128, 128, 64, 64, 32, 32]
    q = jax.ShapeDtypeStruct((1, 700, 2, 128), jnp.bfloat16)
    for causal in (False, True):
        fn = functools.partial(mosaic_flash_attention, is_causal=causal, config=MosaicConfig(block_kv=block_kv))
        hlo = jax.jit(fn).trace(q, q, q).lower(lowering_platforms=("cuda",)).as_text()
        assert "mosaic_gpu" in hlo


H256 = MosaicConfig(block_kv=64)  # the default's block_kv=128 does not fit H = 256's tiles in shared memory

CONFIGS = [
    (64, MosaicConfig(pipeline=True)),
    (128, MosaicConfig(pipeline=True)),
    (256, H256),
    (256, MosaicConfig(block_kv=64, pipeline=True)),
    (256, MosaicConfig(block_kv=80)),  # FlashAttention-3's tile: fits once no memory is set aside for reductions
]


def test_budgets_by_hand():
    # q/out 2·64×256, k and v (2) × 2 stages × 64 × 256, 2 bytes each, plus 2·64 float32 lse rows: 192.5 KiB
    assert smem_bytes(H256, 256, jnp.bfloat16) == (2 * 64 * 256 + 2 * 2 * 64 * 256) * 2 + 512 == 197120
    assert smem_bytes(MosaicConfig(), 128, jnp.float16) == (128 * 128 + 4 * 128 * 128) * 2 + 512  # 160.5 KiB
    # per thread of 128: acc 64·H/128 float32, s 64·block_kv/128 float32, p 64·block_kv/256 (two 16-bit per register)
    assert tile_registers(H256, 256) == 128 + 32 + 16
    assert tile_registers(MosaicConfig(block_kv=64, pipeline=True), 256) == 128 + 32 + 2 * 16
    assert tile_registers(MosaicConfig(pipeline=True), 128) == 64 + 64 + 2 * 32


@pytest.mark.parametrize(
    ("head_dim", "cfg", "expected"),
    [
        (256, H256, None),
        (256, MosaicConfig(block_kv=64, pipeline=True), None),
        (128, MosaicConfig(pipeline=True), None),
        (128, MosaicConfig(stages=3), None),  # 224.5 KiB: still fits (it ran on the H200)
        (128, MosaicConfig(stages=3, pipeline=True), "224.5 KiB of shared memory, more than the 223 KiB"),
        (256, MosaicConfig(block_kv=64, stages=3), "256.5 KiB of shared memory"),
        (128, MosaicConfig(stages=4), "288.5 KiB of shared memory, more than the 227 KiB a Hopper CTA leaves"),
        (256, MosaicConfig(block_kv=128, stages=1), "need 224 registers per thread"),
        (128, MosaicConfig(block_kv=256, stages=1, pipeline=True), "with pipeline=True the forward's tiles need 320"),
    ],
)
def test_h256_and_pipeline_budgets_name_the_fix(head_dim, cfg, expected):
    reason = problem(AttentionShape(1, 512, 512, 4, 4, head_dim), jnp.bfloat16, cfg)
    assert reason is None if expected is None else (expected in reason and "block_kv=64" in reason)


def test_backward_budget_by_hand_and_its_refusal():
    # k and v of both warpgroups 2·2·64×H, 2 stages of q and dO 2·64×H (2 bytes each) with 2·64 float32 rows
    plain = MosaicConfig()
    assert bwd_smem_bytes(plain, 128, jnp.bfloat16) == 4 * 64 * 128 * 2 + 2 * (2 * 64 * 128 * 2 + 2 * 64 * 4)
    # dQ by atomics adds each warpgroup's dS (64×64, 2 bytes) and float32 dQ share (64×H): 209 KiB at H = 128
    atomic = MosaicConfig(bwd_dq="atomic")
    assert (
        bwd_smem_bytes(atomic, 128, jnp.bfloat16) - bwd_smem_bytes(plain, 128, jnp.bfloat16)
        == 2 * (64 * 64 * 2 + 64 * 128 * 4)
        == 80 * 1024
    )
    shape = AttentionShape(1, 512, 512, 4, 4, 128)
    assert problem(shape, jnp.bfloat16, atomic) is None
    reason = problem(shape, jnp.bfloat16, MosaicConfig(bwd_dq="atomic", bwd_stages=3))
    assert "with bwd_dq='atomic' the dK/dV kernel needs 241.5 KiB" in reason and "bwd_stages=2" in reason
    assert problem(shape._replace(head_dim=64), jnp.bfloat16, MosaicConfig(bwd_dq="atomic", bwd_stages=3)) is None


def test_h256_backward_budget_by_hand_and_its_refusal():
    # the dK/dV kernel: k and v 64×256, 2 stages of q and dO 64×256 with 2·64 float32 rows, Pᵀ and dSᵀ 64×64
    cfg = MosaicConfig(block_kv=64)
    dkv = 2 * 64 * 256 * 2 + 2 * (2 * 64 * 256 * 2 + 2 * 64 * 4) + 2 * 64 * 64 * 2
    assert bwd_split_smem_bytes(cfg, 256, jnp.bfloat16) == dkv == 209 * 1024
    shape = AttentionShape(1, 512, 512, 4, 4, 256)
    assert problem(shape, jnp.bfloat16, cfg) is None
    reason = problem(shape, jnp.bfloat16, MosaicConfig(block_kv=64, bwd_stages=3))
    assert "at H=256, bwd_stages=3 the backward's kernels need 273.5 KiB" in reason and "bwd_stages=2" in reason
    with pytest.raises(
        ValueError, match=r"MosaicConfig\.bwd_dq must be one of \('pass', 'atomic', 'split'\); got 'atomics'"
    ):
        MosaicConfig(bwd_dq="atomics")


def test_backward_tile_registers_by_hand():
    # per thread of 128: dK and dV 64·H/128 each, S and dP 64·64/128 each, dQ's share 64·H/128
    atomic = MosaicConfig(bwd_dq="atomic")
    assert bwd_tile_registers(MosaicConfig(), 128) == 64 + 64 + 32 + 32 == TILE_REGISTERS
    assert bwd_tile_registers(atomic, 128) == 192 + 64 > TILE_REGISTERS
    assert (bwd_tile_registers(MosaicConfig(), 64), bwd_tile_registers(atomic, 64)) == (128, 160)


@pytest.mark.parametrize("bad", [0, -64, True, 128.0])
def test_default_config_refuses_a_head_dim_that_is_not_a_positive_int(bad):
    with pytest.raises(ValueError, match="head_dim must be a positive int"):
        default_config(bad)


def test_pipeline_flag_must_be_bool():
    with pytest.raises(ValueError, match=r"MosaicConfig\.pipeline must be True or False; got 'yes'"):
        MosaicConfig(pipeline="yes")


def test_persistent_ctas_are_a_flag_of_the_plain_forward():
    with pytest.raises(ValueError, match=r"MosaicConfig\.persistent must be True or False; got 1"):
        MosaicConfig(persistent=1)
    with pytest.raises(ValueError, match=r"persistent=True runs the plain forward.*Set one of them to False"):
        MosaicConfig(persistent=True, pipeline=True)
    assert MosaicConfig(persistent=True, heavy_first=True, schedule="turns").persistent


def test_persistent_ctas_keep_a_second_q_tile_where_it_fits():
    """The next block's q loads early where 2 · block_q × H more fits: H = 128 in 16 bits (160.5 + 32 KiB) and in
    FP8, not H = 256 (its k/v ring already takes 160 KiB at 80 keys)."""
    on, h256 = MosaicConfig(persistent=True), MosaicConfig(persistent=True, block_kv=80)
    assert q_tiles(on, smem_bytes(on, 128, jnp.bfloat16), 128, 2) == 2
    assert q_tiles(on, smem_bytes_fp8(on, 128), 128, 1) == 2
    assert q_tiles(h256, smem_bytes(h256, 256, jnp.bfloat16), 256, 2) == 1
    assert q_tiles(MosaicConfig(), smem_bytes(MosaicConfig(), 128, jnp.bfloat16), 128, 2) == 1  # a grid: one each


def test_h256_fits_only_with_half_the_key_block():
    """With H = 128's key block, H = 256's tiles overflow shared memory at two stages and the tile registers at any
    number of stages; the pipelined tiles fill the tile registers at H = 256 as at H = 128."""
    wide = MosaicConfig()  # H = 128's tiles
    assert wide.stages == 2 and smem_bytes(wide, 256, jnp.bfloat16) > SMEM_BYTES
    assert tile_registers(wide, 256) > TILE_REGISTERS
    # "at any number of stages": the stages are buffers in shared memory, so the tiles' registers do not change
    assert len({tile_registers(MosaicConfig(stages=stages), 256) for stages in (1, 2, 3)}) == 1
    assert smem_bytes(MosaicConfig(stages=1), 256, jnp.bfloat16) <= SMEM_BYTES  # one stage would fit in memory
    assert 2 * default_config(256).block_kv == wide.block_kv == default_config(128).block_kv
    full = (default_config(256, pipeline=True), 256), (default_config(128, pipeline=True), 128)
    assert [tile_registers(cfg, H) for cfg, H in full] == [TILE_REGISTERS] * 2
    assert TILE_REGISTERS == 192 and SMEM_BYTES == 227 * 1024


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"no_exp": 1}, ValueError, r"Probe\.no_exp must be True or False; got 1"),
        ({"profile_space": 64}, ValueError, r"profile_space and profile_dir go together .*profile_dir=''"),
        ({"profile_dir": "/tmp/t"}, ValueError, r"go together .*profile_space=0, profile_dir='/tmp/t'"),
        ({"profile_space": -8, "profile_dir": "/t"}, ValueError, "profile_space must be a positive integer"),
        ({"profile_space": 64, "profile_dir": 3}, TypeError, r"profile_dir must be a str \(a folder\); got 3"),
    ],
)
def test_the_measuring_switches_refuse_what_they_cannot_mean(kwargs, error, match):
    with pytest.raises(error, match=match):
        Probe(**kwargs)


def test_the_tuning_config_holds_no_measuring_switch():
    """A config is a shape of the kernel only: what a measurement switches on lives in a Probe."""
    fields = {f.name for f in dataclasses.fields(MosaicConfig)}
    assert not fields & {f.name for f in dataclasses.fields(Probe)}


def test_the_profilers_buffer_counts_in_shared_memory():
    # three warpgroups, two events of two 32-bit words for each region
    probe = Probe(profile_space=128, profile_dir="/t")
    assert profile_bytes(probe) == 3 * 128 * 2 * 2 * 4 and profile_bytes(Probe()) == 0
    shape = AttentionShape(1, 1024, 1024, 2, 2, 128)
    assert problem(shape, jnp.bfloat16, MosaicConfig(), probe) is None  # 160.5 + 6 KiB
    big = MosaicConfig(stages=3)  # 224.5 + 6 KiB
    assert problem(shape, jnp.bfloat16, big) is None
    assert "profile_space=128 adds 6.0 KiB" in problem(shape, jnp.bfloat16, big, probe)


def test_fp8_budget_refuses_profiling_and_takes_no_exp():
    shape = AttentionShape(1, 1024, 1024, 2, 2, 128)
    assert fp8_problem(shape, MosaicConfig(), Probe(no_exp=True)) is None
    assert "no profiler regions" in fp8_problem(shape, MosaicConfig(), Probe(profile_space=8, profile_dir="/t"))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"exp_poly": 1.5}, ValueError, r"exp_poly must be a fraction of the score columns in \[0, 1\]; got 1\.5"),
        ({"exp_poly": -0.25}, ValueError, r"in \[0, 1\]; got -0\.25"),
        ({"exp_poly": True}, TypeError, r"exp_poly must be a real number .*; got True"),
        ({"exp_poly": "0.25"}, TypeError, r"exp_poly must be a real number .*; got '0\.25'"),
        ({"exp_poly": 0.25, "no_exp": True}, ValueError, r"exp_poly=0\.25 and no_exp=True exclude each other"),
    ],
)
def test_exp_poly_refuses_what_is_not_a_fraction(kwargs, error, match):
    with pytest.raises(error, match=match):
        Probe(**kwargs)


@pytest.mark.parametrize(
    ("poly", "block_kv", "match"),
    [
        (0.3, 128, r"8-column groups of block_kv = 128 .*multiple of 0\.0625; got 0\.3: try 0\.25 or 0\.3125"),
        (0.0625, 64, r"multiple of 0\.125; got 0\.0625: try 0 or 0\.125"),
    ],
)
def test_exp_poly_refuses_fractions_the_tile_layout_cannot_split(poly, block_kv, match):
    with pytest.raises(ValueError, match=match):
        Probe(exp_poly=poly).poly_columns(block_kv)
    shape = AttentionShape(1, 1024, 1024, 2, 2, 128)
    assert re.search(match, problem(shape, jnp.bfloat16, MosaicConfig(block_kv=block_kv), Probe(exp_poly=poly)))


@pytest.mark.parametrize(("poly", "block_kv", "columns"), [(0, 128, 0), (0.25, 128, 32), (1, 128, 128), (0.125, 64, 8)])
def test_exp_poly_counts_whole_groups_of_eight_columns(poly, block_kv, columns):
    assert Probe(exp_poly=poly).poly_columns(block_kv) == columns


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"registers": 236}, ValueError, "registers must be a multiple of 8 from 168 to 240"),
        ({"bwd_registers": 248}, ValueError, "bwd_registers must be a multiple of 8 from 168 to 240.*got 248"),
        ({"registers": 160}, ValueError, "got 160"),
        ({"registers": 240.0}, TypeError, "registers must be an int"),
        ({"bwd_registers": True}, TypeError, "bwd_registers must be an int"),
    ],
)
def test_registers_refuse_what_setmaxnreg_cannot_give(kwargs, error, match):
    with pytest.raises(error, match=match):
        MosaicConfig(**kwargs)


def test_the_copy_warpgroup_keeps_what_the_compute_ones_leave():
    # the CTA's pool: 3 warpgroups × 128 threads × 168 registers; 2 × 232 + 40 and 2 × 240 + 24 use it all
    assert WARPGROUPS * LAUNCH_REGISTERS * 128 <= 64 * 1024
    assert (copy_registers(232), copy_registers(240), copy_registers(168)) == (40, 24, 168)
    assert MosaicConfig().tile_budget == TILE_REGISTERS and MosaicConfig(registers=240).tile_budget == 200
    # the tile check follows the budget: 200 registers take what 192 refuse (pipelined H = 128 at block_kv = 128
    # needs 64 + 64 + 2·32 = 192; a profile of the same at 184 is refused)
    shape = AttentionShape(1, 256, 256, 4, 4, 128)
    assert problem(shape, jnp.bfloat16, MosaicConfig(pipeline=True, registers=240)) is None
    assert "more than the 184" in problem(shape, jnp.bfloat16, MosaicConfig(pipeline=True, registers=224))
