"""What the compiled kernels are made of: counts of the GPU instructions that decide attention's speed.

A kernel's speed on Hopper depends first on *which* instructions it was compiled to: warpgroup matmuls
(``wgmma`` in PTX, ``HGMMA`` in SASS) or the older per-warp ``mma.sync`` (``HMMA``); tiles copied by the Tensor
Memory Accelerator (``cp.async.bulk.tensor``, ``UTMALDG``) or by per-thread asynchronous copies
(``cp.async``, ``LDGSTS``). ``kernel_code(impl, ...)`` compiles and runs one registry implementation in a fresh
process and counts those instructions in its machine code (static counts: instructions in the code, not
executions): for Mosaic GPU kernels from the PTX/SASS that Mosaic GPU's dump switches write; for everything XLA
compiles itself — Triton-lowered Pallas kernels included — from the cubins inside the serialised executable
(Snappy blocks decoded with ``cramjam``, ELF objects cut out with ``pyelftools``), disassembled with the CUDA
toolkit's ``cuobjdump``. The recorder runs it on a GPU; the counting is plain text processing, tested
on the CPU.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

# Instruction families, as (PTX pattern, SASS pattern).
FAMILIES = {
    "wgmma (warpgroup matmul)": (r"\bwgmma\.mma_async", r"\b[HQI]GMMA\b"),  # SASS: 16-bit, FP8, int8
    "mma.sync (per-warp matmul)": (r"\bmma\.sync", r"\bHMMA\b"),
    "TMA copy (cp.async.bulk.tensor)": (r"\bcp\.async\.bulk\.tensor", r"\bUTMALDG\b"),
    "cp.async (per-thread async copy)": (r"\bcp\.async\.c[ag]\b", r"\bLDGSTS\b"),
    "ldmatrix (shared -> registers)": (r"\bldmatrix\b", r"\bLDSM\b"),
    "ex2 (exp2 on the special-function unit)": (r"\bex2\.approx", r"\bMUFU\.EX2\b"),
    "mbarrier (async barriers)": (r"\bmbarrier\.", r"\bSYNCS\b"),
    "setmaxnreg (per-warpgroup registers)": (r"\bsetmaxnreg\b", r"\bUSETMAXREG\b"),
}
_REGISTERS = re.compile(r"Used (\d+) registers")
# ptxas -v: per function, "Function properties for NAME" then "S bytes stack frame, A bytes spill stores, B bytes
# spill loads": registers that did not fit go to local memory (the stack), at a load or store each time they move.
_SPILLS = re.compile(
    r"Function properties for (\S+)\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
# ptxas's performance warnings (e.g. C7513/C7515, "wgmma.mma_async instructions are serialized due to ..."): a
# warpgroup matmul that waits for itself loses the overlap a Hopper kernel is built around.
_SERIALISED = re.compile(r"\((C75\d\d)\)[^\n]*?wgmma[^\n]*?serialized due to ([^\n]*?)(?: in the function|$)", re.M)


def kind_of(text: str) -> str | None:
    """'ptx', 'sass' or None for a dumped file's text."""
    if re.search(r"/\*[0-9a-f]{4}\*/\s+[A-Z@]", text):  # instruction addresses: SASS (which has a .target too)
        return "sass"
    if re.search(r"^\s*\.target\s+sm_", text, re.M):
        return "ptx"
    return None


def count_instructions(text: str, kind: str) -> dict[str, int]:
    """How many instructions of each family ``FAMILIES`` names appear in PTX or SASS ``text``."""
    column = {"ptx": 0, "sass": 1}[kind]
    return {name: len(re.findall(patterns[column], text)) for name, patterns in FAMILIES.items()}


def spills_in(text: str) -> dict[str, dict[str, int]]:
    """ptxas's spill report of each function in ``text`` (its ``-v`` output): {function: {"stack", "stores",
    "loads"}} in bytes per thread (0, 0, 0: every value stayed in registers)."""
    return {
        name: {"stack": int(stack), "stores": int(stores), "loads": int(loads)}
        for name, stack, stores, loads in _SPILLS.findall(text)
    }


def summarise_dump(folder: Path) -> dict:
    """Instruction counts over every PTX and SASS file under ``folder``, plus the registers ptxas reported, its
    spills per function (:func:`spills_in`) and its warnings that it serialised warpgroup matmuls
    (``wgmma_serialised``: 'C7513: <why>', empty when none)."""
    totals: dict[str, dict[str, int]] = {}
    registers: set[int] = set()
    serialised: set[str] = set()
    spills: dict[str, dict[str, int]] = {}
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        text = path.read_text(errors="replace")
        registers.update(int(n) for n in _REGISTERS.findall(text))
        serialised.update(f"{code}: {why.strip()}" for code, why in _SERIALISED.findall(text))
        spills.update(spills_in(text))
        kind = kind_of(text)
        if kind is None:
            continue
        counts = count_instructions(text, kind)
        into = totals.setdefault(kind, dict.fromkeys(FAMILIES, 0))
        for name, n in counts.items():
            into[name] += n
    return {
        "counts": totals,
        "registers": sorted(registers),
        "wgmma_serialised": sorted(serialised),
        "spills": dict(sorted(spills.items())),
    }


def elf_images(blob: bytes) -> list[bytes]:
    """The ELF objects (cubins) lying in ``blob``, each cut to the length its own headers give (read with
    pyelftools): where its section or program header table ends, or its last section, whichever is furthest."""
    images, start = [], blob.find(b"\x7fELF")
    while start >= 0:
        size = _elf_size(blob, start)
        if size:
            images.append(blob[start : start + size])
        start = blob.find(b"\x7fELF", start + (size or 4))
    return images


def _elf_size(blob: bytes, start: int) -> int | None:
    """The length of the ELF object at ``blob[start]`` by its headers, or None where they do not describe one that
    fits in ``blob``."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        elf = ELFFile(io.BytesIO(blob[start:]))
        h = elf.header
        ends = [h.e_ehsize, h.e_shoff + h.e_shnum * h.e_shentsize, h.e_phoff + h.e_phnum * h.e_phentsize]
        ends += [s["sh_offset"] + s["sh_size"] for s in elf.iter_sections() if s["sh_type"] != "SHT_NOBITS"]
    except (ELFError, ValueError, TypeError, KeyError, struct.error, OverflowError):
        return None
    size = max(ends)
    return size if size <= len(blob) - start else None


def snappy_blocks(blob: bytes, *, min_size: int = 1024) -> list[bytes]:
    """The raw Snappy blocks that ``blob`` holds as length-prefixed bytes, decoded (cramjam), each of at least
    ``min_size`` bytes once decoded.

    XLA compresses serialised GPU executables with Snappy (cubins inside, twice over) and embeds the blocks as bytes
    fields: of a protobuf message (a varint length before them) or of a pickle (a 4- or 8-byte little-endian length).
    A raw block records its decoded size but not its own length, so the length before it is what says where it ends:
    each length found in ``blob`` is tried, and what decodes is a block.
    """
    import cramjam
    import numpy as np

    n = len(blob)
    data = np.frombuffer(blob, np.uint8)
    value, size = _varints(data)
    pos = np.arange(n, dtype=np.int64)
    starts, lengths = [np.array([0]), pos[size > 0] + size[size > 0]], [np.array([n]), value[size > 0]]  # whole, varint
    for width in (4, 8):  # little-endian fixed-width lengths
        if n >= width:
            fixed = sum(data[k : n - width + 1 + k].astype(np.uint64) << np.uint64(8 * k) for k in range(width))
            starts.append(pos[: n - width + 1] + width)
            lengths.append(np.minimum(fixed, np.uint64(1 << 40)).astype(np.int64))
    j, length = np.concatenate(starts), np.concatenate(lengths)
    fits = (length >= 16) & (j + length <= n)
    j, length = j[fits], length[fits]
    declared = np.where(size[j] > 0, value[j], -1)  # a block opens with its decoded size
    plausible = (declared >= np.maximum(min_size, length * 6 // 7 - 32)) & (declared <= 22 * length)  # ~22× at most
    view, found = memoryview(blob), []
    for start, stop in sorted(set(zip(j[plausible].tolist(), (j + length)[plausible].tolist()))):
        try:
            found.append(bytes(cramjam.snappy.decompress_raw(view[start:stop])))
        except cramjam.DecompressionError:
            continue
    return found


def _varints(data):
    """(value, size) of the base-128 varint (at most 5 bytes) starting at each byte of ``data``; size 0 where none
    ends within 5 bytes."""
    import numpy as np

    n = len(data)
    value, size = np.zeros(n, np.int64), np.zeros(n, np.int64)
    reading = np.ones(n, bool)  # still inside this position's varint
    for k in range(5):
        byte = np.full(n, 0x80, np.int64)  # past the end: never ends a varint
        byte[: n - k] = data[k:]
        value = np.where(reading, value | ((byte & 0x7F) << (7 * k)), value)
        ends = reading & (byte < 0x80)
        size[ends] = k + 1
        reading &= ~ends
    return value, size


def cubins_in(blob: bytes, depth: int = 3) -> list[bytes]:
    """The cubins in ``blob``, looking inside its Snappy blocks (up to ``depth`` deep) when none lies in the open."""
    images = elf_images(blob)
    if images or depth == 0:
        return images
    for inner in snappy_blocks(blob):
        if b"\x7fELF" in inner and (found := cubins_in(inner, depth - 1)):
            return found
    return []


def _cuda_tool(name: str) -> str | None:
    """Where the CUDA binary tool ``name`` (nvdisasm, cuobjdump) is: PATH, the CUDA toolkit, or Triton's copy."""
    import glob
    import shutil

    found = shutil.which(name)
    if found:
        return found
    patterns = [
        "/usr/local/cuda*/bin/",
        f"{sys.prefix}/lib/python3*/site-packages/triton/backends/nvidia/bin/",
        f"{sys.prefix}/lib/python3*/site-packages/nvidia/cu*/bin/",
    ]
    hits = [h for p in patterns for h in sorted(glob.glob(p + name))]
    return hits[0] if hits else None


def _child(spec: dict, folder: str) -> None:
    """In a fresh process: switch Mosaic GPU's dumps on, compile and run one implementation, and write the SASS
    of every cubin in XLA's compiled executable (where Triton-lowered kernels end up) to ``folder``."""
    nvdisasm = _cuda_tool("nvdisasm")
    if nvdisasm:  # Mosaic GPU calls nvdisasm for its SASS dump
        os.environ["PATH"] = f"{os.path.dirname(nvdisasm)}:{os.environ['PATH']}"
    Path(folder, "mosaic").mkdir(parents=True, exist_ok=True)
    os.environ.update(
        {
            "MOSAIC_GPU_DUMP_TO": f"{folder}/mosaic",
            "MOSAIC_GPU_DUMP_PTX": "1",
            "MOSAIC_GPU_DUMP_SASS": "1",
            "MOSAIC_GPU_DUMP_PTXAS": "1",
        }
    )
    import functools

    import jax
    from jax.experimental.serialize_executable import serialize

    from ..inputs import make_qkv
    from ..registry import get

    q, k, v = make_qkv(spec["batch"], spec["seq_q"], spec["heads"], spec["head_dim"], dtype=spec["dtype"])
    if spec["impl"] in FP8_PATHS:  # our FP8 forward, not a registry entry: bf16 in, quantised inside, bf16 out
        from ..kernels.mosaic.fp8 import mosaic_fp8_attention

        fn = functools.partial(mosaic_fp8_attention, p_via=FP8_PATHS[spec["impl"]])
    elif spec.get("config") is not None:  # our Mosaic kernel with some fields of its default config changed
        import dataclasses

        from ..kernels.mosaic import default_config, mosaic_flash_attention

        cfg = dataclasses.replace(default_config(spec["head_dim"]), **spec["config"])
        fn = functools.partial(mosaic_flash_attention, config=cfg)
    else:
        fn = get(spec["impl"]).fn
    fn = functools.partial(fn, is_causal=spec["causal"])
    if spec.get("grad"):  # the forward and the backward kernels: the gradients of sum(out)
        fn = jax.grad(lambda q, k, v, f=fn: f(q, k, v).astype(jax.numpy.float32).sum(), argnums=(0, 1, 2))
    compiled = jax.jit(fn).lower(q, k, v).compile()
    jax.block_until_ready(compiled(q, k, v))
    cuobjdump = _cuda_tool("cuobjdump")
    # XLA's own kernels hold a Triton-lowered kernel; beside our FP8 forward they are only its quantising passes,
    # which would stand in the table for the Mosaic kernel (whose code is in the dump): left out there
    images = [] if spec["impl"] in FP8_PATHS else cubins_in(serialize(compiled)[0])
    for i, image in enumerate(images):
        cubin = Path(folder, "xla", f"kernel_{i}.cubin")
        cubin.parent.mkdir(exist_ok=True)
        cubin.write_bytes(image)
        if cuobjdump:
            sass = subprocess.run([cuobjdump, "--dump-sass", str(cubin)], capture_output=True, text=True)
            cubin.with_suffix(".sass").write_text(sass.stdout)


def kernel_code(
    impl: str,
    *,
    batch=4,
    seq_q=4096,
    heads=16,
    head_dim=128,
    dtype="bfloat16",
    causal=False,
    config: dict | None = None,
    grad: bool = False,
) -> dict:
    """Compile ``impl`` in a fresh process with the code dumps on; its instruction counts as one record. ``config``:
    fields of our Mosaic kernel's default config to change (``impl`` "mosaic"); ``grad``: compile the gradient
    (forward and backward kernels) instead of the forward."""
    spec = {
        "impl": impl,
        "batch": batch,
        "seq_q": seq_q,
        "heads": heads,
        "head_dim": head_dim,
        "dtype": dtype,
        "causal": causal,
    }
    if config is not None:
        spec["config"] = dict(config)
    if grad:
        spec["grad"] = True
    with tempfile.TemporaryDirectory() as folder:
        run = subprocess.run(
            [sys.executable, "-m", "attention_tutorial.measure.kernel_code", json.dumps(spec), folder],
            capture_output=True,
            text=True,
            check=False,
        )
        summary = summarise_dump(Path(folder))
        if run.returncode:
            return {**spec, "status": "error", "reason": (run.stderr.strip().splitlines() or ["?"])[-1], **summary}
        # ptxas's register report goes to the Mosaic GPU dump or to stderr, depending on the version
        summary["registers"] = sorted({*summary["registers"], *map(int, _REGISTERS.findall(run.stderr))})
        summary["wgmma_serialised"] = sorted(
            {*summary["wgmma_serialised"], *(f"{c}: {w.strip()}" for c, w in _SERIALISED.findall(run.stderr))}
        )
        summary["spills"] = dict(sorted({**summary["spills"], **spills_in(run.stderr)}.items()))
    return {**spec, "status": "ok", **summary}


# Our FP8 forward by the names the race records it under (measure/fp8.py builds its variants from this): which way p
# reaches p·v.
FP8_PATHS = {"mosaic_fp8": "smem", "mosaic_fp8_regs": "registers"}

# The kernels the recorder inspects, (impl, input dtype, causal, H): our two and JAX's two, at one shape of the
# FlashAttention race; our pipelined Mosaic forward with and without the causal mask, beside the plain one
# causal; both at H = 256; and our FP8 forward, both ways of handing p to p·v.
INSPECTED = (
    ("pallas", "bfloat16", False, 128),
    ("jax_pallas", "bfloat16", False, 128),
    ("mosaic", "bfloat16", False, 128),
    ("jax_mosaic", "float16", False, 128),
    ("mosaic", "bfloat16", True, 128),
    ("mosaic_pipe", "bfloat16", False, 128),
    ("mosaic_pipe", "bfloat16", True, 128),
    ("mosaic", "bfloat16", False, 256),
    ("mosaic_pipe", "bfloat16", False, 256),
    ("mosaic", "bfloat16", True, 256),
    ("mosaic_pipe", "bfloat16", True, 256),
    ("mosaic_fp8_regs", "bfloat16", False, 128),
    ("mosaic_fp8", "bfloat16", False, 128),
    ("mosaic_fp8_regs", "bfloat16", True, 128),
)


def code_key(impl: str, dtype: str, causal: bool, head_dim: int = 128) -> str:
    """A ``kernel_code`` entry's key: 'impl dtype', ' causal' for the causal ones, ' H=256' where H is not 128 (the
    keys recorded before other head sizes were inspected stay valid)."""
    return f"{impl} {dtype}{' causal' if causal else ''}{f' H={head_dim}' if head_dim != 128 else ''}"


def kernel_code_records() -> dict[str, dict]:
    """``kernel_code`` for each of ``INSPECTED``, keyed by :func:`code_key` (the recorder stores them in
    provenance)."""
    return {
        code_key(impl, dtype, causal, H): kernel_code(impl, dtype=dtype, causal=causal, head_dim=H)
        for impl, dtype, causal, H in INSPECTED
    }


# Configurations of our Mosaic kernels whose spills the recorder reads before a default is chosen (the extra
# ``spills``), by name: (H, causal, gradient, fields of the default config changed). Causal: every kernel path
# (full and masked tiles) is compiled.
SPILL_CHECKS: dict[str, tuple[int, bool, bool, dict]] = {
    "forward H=128": (128, True, False, {}),
    "forward H=128, turns": (128, True, False, {"schedule": "turns"}),
    "forward H=128, 176 keys": (128, True, False, {"block_kv": 176}),
    "forward H=128, pipelined": (128, True, False, {"pipeline": True}),
    "forward H=256": (256, True, False, {}),
    "forward H=256, pipelined": (256, True, False, {"pipeline": True}),
    "forward H=256, 80 keys": (256, True, False, {"block_kv": 80}),
    "backward H=64 (dQ atomic)": (64, True, True, {}),
    "backward H=64, dQ pass": (64, True, True, {"bwd_dq": "pass"}),
    "backward H=128 (dQ pass)": (128, True, True, {}),
    "backward H=128, S and dP together": (128, True, True, {"bwd_together": True}),
    "backward H=128, dQ atomic": (128, True, True, {"bwd_dq": "atomic"}),
    "backward H=128, dQ atomic, together": (128, True, True, {"bwd_dq": "atomic", "bwd_together": True}),
    "backward H=128, dQ split": (128, True, True, {"bwd_dq": "split"}),
    "backward H=128, dQ split, together": (128, True, True, {"bwd_dq": "split", "bwd_together": True}),
    "backward H=128, 240 registers": (128, True, True, {"bwd_registers": 240}),
    "backward H=256 (head dim split)": (256, True, True, {}),
}


def spill_records() -> dict[str, dict]:
    """:func:`kernel_code` (spills, registers, instruction counts) of each of :data:`SPILL_CHECKS`, by its name."""
    return {
        name: kernel_code("mosaic", head_dim=H, causal=causal, grad=grad, config=changes)
        for name, (H, causal, grad, changes) in SPILL_CHECKS.items()
    }


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]), sys.argv[2])
