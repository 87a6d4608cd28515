"""Counting instruction families in PTX and SASS text (the GPU dump itself runs in the recorder)."""

import os
import sys
from pathlib import Path

import cramjam
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_tutorial.measure import kernel_code as kc
from attention_tutorial.measure.kernel_code import (
    FAMILIES,
    count_instructions,
    cubins_in,
    elf_images,
    kind_of,
    snappy_blocks,
    summarise_dump,
)

PTX = """
.version 8.7
.target sm_90a
.address_size 64
    wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%f1}, %rd1, %rd2, 1, 1, 1, 0, 1;
    wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%f2}, %rd1, %rd2, 1, 1, 1, 0, 1;
    cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd3, {%r2, %r3}], [%r4];
    mbarrier.try_wait.parity.shared::cta.b64 %p1, [%r4], %r5;
    ex2.approx.ftz.f32 %f3, %f4;
    setmaxnreg.inc.sync.aligned.u32 232;
"""
SASS = """
	code for sm_90a
	.target	sm_90a

        Function : our_flash_forward
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0020*/                   HMMA.16816.F32.BF16 R4, R8, R14, R4 ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R2], desc[UR4][R6.64] ;
        /*0040*/                   LDSM.16.M88.4 R8, [R3] ;
        /*0050*/                   MUFU.EX2 R5, R5 ;
"""


def test_kinds_are_told_apart():
    assert kind_of(PTX) == "ptx"
    assert kind_of(SASS) == "sass"
    assert kind_of("ptxas info    : Used 168 registers") is None


def test_ptx_counts():
    counts = count_instructions(PTX, "ptx")
    assert counts["wgmma (warpgroup matmul)"] == 2
    assert counts["mma.sync (per-warp matmul)"] == 0
    assert counts["TMA copy (cp.async.bulk.tensor)"] == 1
    assert counts["cp.async (per-thread async copy)"] == 0  # the bulk tensor copy is not a per-thread one
    assert counts["mbarrier (async barriers)"] == 1
    assert counts["ex2 (exp2 on the special-function unit)"] == 1
    assert counts["setmaxnreg (per-warpgroup registers)"] == 1


def test_sass_counts():
    counts = count_instructions(SASS, "sass")
    assert counts["mma.sync (per-warp matmul)"] == 2
    assert counts["wgmma (warpgroup matmul)"] == 0
    assert counts["cp.async (per-thread async copy)"] == 1
    assert counts["ldmatrix (shared -> registers)"] == 1
    assert counts["ex2 (exp2 on the special-function unit)"] == 1
    with pytest.raises(KeyError):
        count_instructions(SASS, "cubin")


def test_summarise_dump_adds_files_and_reads_registers(tmp_path):
    (tmp_path / "xla").mkdir()
    (tmp_path / "xla" / "a.ptx").write_text(PTX)
    (tmp_path / "b.ptx").write_text(PTX)
    (tmp_path / "k.sass").write_text(SASS)
    (tmp_path / "ptxas.log").write_text("ptxas info    : Used 168 registers, 0 bytes smem\nUsed 40 registers")
    summary = summarise_dump(tmp_path)
    assert summary["counts"]["ptx"]["wgmma (warpgroup matmul)"] == 4
    assert summary["counts"]["sass"]["mma.sync (per-warp matmul)"] == 2
    assert set(summary["counts"]["ptx"]) == set(FAMILIES)
    assert summary["registers"] == [40, 168]
    assert summary["wgmma_serialised"] == []


def test_summarise_dump_reports_serialised_wgmma(tmp_path):
    # the warning ptxas printed for our pipelined Mosaic forward on the H200
    (tmp_path / "ptxas.log").write_text(
        "ptxas info    : (C7513) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non "
        "wgmma instructions defining input registers of a wgmma between start and end of the pipeline stage in the "
        "function 'entry_mosaic_gpu_kernel'\nptxas info    : Used 168 registers"
    )
    summary = summarise_dump(tmp_path)
    assert summary["wgmma_serialised"] == [
        "C7513: non wgmma instructions defining input registers of a wgmma between start and end of the pipeline stage"
    ]


def _real_elf() -> bytes:
    """An ELF object a linker wrote: the Python interpreter running the tests (its section headers end the file)."""
    return Path(sys.executable).resolve().read_bytes()


def _field(data: bytes) -> bytes:
    """``data`` as a protobuf bytes field (field 2: tag 0x12, varint length), as XLA's serialised protos hold it."""
    n, prefix = len(data), bytearray()
    while True:
        prefix.append((n & 0x7F) | (0x80 if n >= 0x80 else 0))
        n >>= 7
        if not n:
            return b"\x12" + bytes(prefix) + data


def _pickled(data: bytes) -> bytes:
    """``data`` as pickle's BINBYTES (opcode B, 4-byte little-endian length), as jax's serialize pickles it."""
    return b"B" + len(data).to_bytes(4, "little") + data


def test_elf_images_cuts_each_object_out_of_a_blob_by_its_own_headers():
    elf = _real_elf()
    assert elf_images(elf) == [elf]
    blob = b"serialised executable..." + elf + b"\x00" * 7 + elf + b"...\x7fELF truncated" + elf[:200]
    assert elf_images(blob) == [elf, elf]  # the cut-off copy at the end is not an object
    assert elf_images(b"no objects here") == []


@given(st.binary(max_size=3000), st.integers(0, 50), st.sampled_from([_field, _pickled]))
def test_snappy_blocks_decode_what_an_independent_encoder_wrote_between_other_bytes(data, junk, frame):
    block = bytes(cramjam.snappy.compress_raw(data * 3))  # repeats give the encoder copies to emit
    blob = b"\xff" * junk + frame(block) + b"trailing bytes"
    assert (data * 3 in snappy_blocks(blob, min_size=0)) == (len(block) >= 16)
    assert snappy_blocks(b"\x12\x05\x07\x01\x02\x03\x04", min_size=0) == []


def test_cubins_in_finds_an_elf_inside_two_snappy_layers():
    cubin = _real_elf()
    inner = bytes(cramjam.snappy.compress_raw(b"proto header " * 90 + cubin + b" tail" * 50))
    outer = bytes(cramjam.snappy.compress_raw(b"executable " * 100 + _field(inner) + b" more"))
    blob = b"pickle..." + _pickled(outer) + b"...end"
    assert cubins_in(blob) == [cubin]
    assert cubins_in(blob, depth=1) == []  # one layer is not enough


def test_code_keys_stay_those_recorded_at_h128_and_name_other_head_sizes():
    assert kc.code_key("mosaic", "bfloat16", False) == "mosaic bfloat16"
    assert kc.code_key("mosaic_pipe", "bfloat16", True, 128) == "mosaic_pipe bfloat16 causal"
    assert kc.code_key("mosaic_pipe", "bfloat16", True, 256) == "mosaic_pipe bfloat16 causal H=256"
    keys = [kc.code_key(*spec) for spec in kc.INSPECTED]
    assert len(set(keys)) == len(keys)


def test_inspected_fp8_kernels_are_our_fp8_forward_and_the_rest_registry_entries():
    from attention_tutorial.registry import IMPLEMENTATIONS

    for impl, dtype, causal, head_dim in kc.INSPECTED:
        assert impl in kc.FP8_PATHS or impl in IMPLEMENTATIONS, impl
        assert head_dim in (128, 256) and isinstance(causal, bool) and dtype in ("bfloat16", "float16")
    from attention_tutorial.kernels.mosaic.fp8 import P_VIA
    from attention_tutorial.results.plotting import label

    assert sorted(kc.FP8_PATHS.values()) == sorted(P_VIA)
    for impl, p_via in kc.FP8_PATHS.items():  # each name means the path its label tells the reader
        assert ("p in registers" in label(impl)) == (p_via == "registers")
        assert ("p via shared memory" in label(impl)) == (p_via == "smem")


@pytest.mark.parametrize("impl", ["mosaic_fp8", "mosaic_fp8_regs"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_code_child_compiles_our_fp8_forward_with_its_path_and_mask_and_no_xla_kernels(
    impl, causal, tmp_path, monkeypatch
):
    import jax.experimental.serialize_executable as se

    import attention_tutorial.kernels.mosaic.fp8 as mf

    for name in ("MOSAIC_GPU_DUMP_TO", "MOSAIC_GPU_DUMP_PTX", "MOSAIC_GPU_DUMP_SASS", "MOSAIC_GPU_DUMP_PTXAS", "PATH"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # _child sets them: put back after the test
    calls = []

    def fake(q, k, v, *, p_via, is_causal):
        calls.append((p_via, is_causal))
        return q * 2

    monkeypatch.setattr(mf, "mosaic_fp8_attention", fake)
    monkeypatch.setattr(se, "serialize", lambda *a: pytest.fail("XLA's kernels read beside our FP8 forward"))
    spec = {"impl": impl, "batch": 1, "seq_q": 128, "heads": 2, "head_dim": 128, "dtype": "bfloat16", "causal": causal}
    kc._child(spec, str(tmp_path))
    assert calls == [(kc.FP8_PATHS[impl], causal)] and not (tmp_path / "xla").exists()


def test_fp8_warpgroup_matmuls_count_in_sass():
    sass = "/*0a10*/ QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24 ;\n/*0a20*/ HGMMA.64x64x16.F32.BF16 R0, gdesc[UR8], R0 ;"
    assert count_instructions(sass, "sass")["wgmma (warpgroup matmul)"] == 2


PTXAS_V = """ptxas info    : Compiling entry function 'dkv_kernel_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for dkv_kernel_mosaic_gpu_kernel
    24 bytes stack frame, 20 bytes spill stores, 36 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers
ptxas info    : Function properties for dq_kernel_mosaic_gpu_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""


def test_spills_are_read_per_function_from_ptxas_report(tmp_path):
    assert kc.spills_in(PTXAS_V) == {
        "dkv_kernel_mosaic_gpu_kernel": {"stack": 24, "stores": 20, "loads": 36},
        "dq_kernel_mosaic_gpu_kernel": {"stack": 0, "stores": 0, "loads": 0},
    }
    (tmp_path / "ptxas.log").write_text(PTXAS_V)
    summary = summarise_dump(tmp_path)
    assert summary["spills"]["dkv_kernel_mosaic_gpu_kernel"]["loads"] == 36 and summary["registers"] == [168]
    assert kc.spills_in("ptxas info    : Used 40 registers") == {}


def test_every_spill_check_is_a_config_our_kernel_takes():
    import dataclasses

    from attention_tutorial.kernels.mosaic import default_config

    assert any(grad for _, _, grad, _ in kc.SPILL_CHECKS.values())
    for name, (H, causal, grad, changes) in kc.SPILL_CHECKS.items():
        cfg = dataclasses.replace(default_config(H), **changes)  # a field that does not exist would raise here
        assert f"H={H}" in name and isinstance(causal, bool) and isinstance(grad, bool), name
        assert all(getattr(cfg, field) == value for field, value in changes.items())


def test_the_code_child_compiles_the_gradient_of_our_kernel_with_its_config(tmp_path, monkeypatch):
    import jax.numpy as jnp

    import attention_tutorial.kernels.mosaic as mosaic

    for name in ("MOSAIC_GPU_DUMP_TO", "MOSAIC_GPU_DUMP_PTX", "MOSAIC_GPU_DUMP_SASS", "MOSAIC_GPU_DUMP_PTXAS", "PATH"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    configs = []

    def fake(q, k, v, *, config, is_causal):
        configs.append((config, is_causal))
        return jnp.sin(q) * k

    monkeypatch.setattr(mosaic, "mosaic_flash_attention", fake)
    spec = {"impl": "mosaic", "batch": 1, "seq_q": 128, "heads": 2, "head_dim": 128, "dtype": "bfloat16"}
    kc._child({**spec, "causal": True, "config": {"bwd_together": True}, "grad": True}, str(tmp_path))
    (cfg, causal), *_ = configs
    assert cfg.bwd_together and cfg.bwd_dq == "pass" and causal
