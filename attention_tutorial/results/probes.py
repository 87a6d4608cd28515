"""The machine-code probes of issue 17 (``scripts/gpu_issue17_probe.py``), read for the pages.

A probe file holds entries, one per kernel variant and mask, each compiled and timed in a fresh process on the GPU
(the first probes compiled both masks in one process, an entry per variant with a row per mask; they are read as
one entry per mask):
``{"variant", "mask", "code": {"ptxas_wgmma": [ptxas's serialisation warnings], "spill_lines", ...}, "rows":
[{"ours": [median, slow, fast], "cudnn": [...], "ours2": [...], "cudnn2": [...], "max_abs_diff_vs_cudnn"}]}``, in
TFLOP/s (slow and fast from the 90th and 10th percentile times), where "ours"/"cudnn" and "ours2"/"cudnn2" are two
alternating runs in the same process. The files written before provenance was kept are a bare list of entries;
later ones are ``{"provenance": {...}, "entries": [...]}``. The ratio that counts is ours over cuDNN's median
within a run; the percentiles give its spread.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .store import _is_number, describe

# The probe's problem (scripts/gpu_issue17_probe.py), named on the page beside its ratios.
PROBE_SHAPE = "B = 4, T = S = 8192, N = 16, H = 128, bfloat16"

VARIANTS = {  # what each variant is, in words; "wrong numbers" marks diagnostics that are not attention
    "plain": "our Mosaic GPU kernel",
    "pipe": "pipelined",
    "pipe_dyn": "pipelined, its loop bound hidden from the compiler (the same value)",
    "pipe_static": "pipelined, every causal loop run to T / block_kv steps, those past its bound skipped (the fix's "
    "first form)",
    "pipe_unroll2": "pipelined, its loops unrolled by two",
    "pipe_nowhere": "pipelined, every mask dropped (wrong numbers)",
    "plain_noexp": "our Mosaic GPU kernel without its exponentials (wrong numbers)",
    "pipe_noexp": "pipelined, without its exponentials (wrong numbers)",
    "fp8": "our FP8 forward, p via shared memory, against cuDNN's FP8",
    "fp8_regs": "our FP8 forward, p in registers, against cuDNN's FP8",
    "fp8_regs_noexp": "our FP8 forward, p in registers, without its exponentials (wrong numbers), against cuDNN's FP8",
}


def probe_dir() -> Path | None:
    """The repository's ``scripts/`` folder, where the probe files are kept, or None in an installed package."""
    folder = Path(__file__).resolve().parents[2] / "scripts"
    return folder if (folder / "gpu_issue17_probe.py").is_file() else None


def _read(path):
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not a probe file: not JSON ({err}).") from None


def load_probe(path) -> list[dict]:
    """One probe file's entries (either layout); a file that is not a probe's is an error that names it."""
    data = _read(path)
    entries = data.get("entries") if isinstance(data, dict) else data
    if isinstance(entries, list) and entries and all(
        isinstance(e, dict) and "mask" not in e and {"variant", "code"} <= set(e) and isinstance(e.get("rows"), list)
        and e["rows"] for e in entries
    ):  # fmt: skip
        # the first probes compiled both masks in one process: an entry per variant, a row per mask
        entries = [{**e, "mask": "causal" if r.get("causal") else "noncausal", "rows": [r],
                    **({"code_of": "both masks"} if len(e["rows"]) > 1 else {})}
                   for e in entries for r in e["rows"]]  # fmt: skip
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and {"variant", "mask", "code", "rows"} <= set(e) for e in entries
    ):
        raise ValueError(f"{path} is not a probe file (entries with variant, mask, code and rows).")
    return entries


def find(entries, variant: str, mask: str) -> dict | None:
    """The last entry of ``variant`` with ``mask`` ("causal" or "noncausal"), or None."""
    hits = [e for e in entries if e["variant"] == variant and e["mask"] == mask]
    return hits[-1] if hits else None


def _row(entry) -> dict | None:
    """The entry's one timed row, or None where it did not run or a timing is not a positive finite number."""
    rows = [r for r in entry.get("rows", []) if "error" not in r]
    if entry.get("rc") or len(rows) != 1 or not all(k in rows[0] for k in ("ours", "cudnn", "ours2", "cudnn2")):
        return None
    timings = [x for k in ("ours", "cudnn", "ours2", "cudnn2") for x in rows[0][k]]
    return rows[0] if all(_is_number(x) and x > 0 for x in timings) else None


def ratios(entry) -> tuple[float, float] | None:
    """Ours over cuDNN's median TFLOP/s in each of the entry's two runs, or None where it did not run."""
    r = _row(entry)
    return None if r is None else (r["ours"][0] / r["cudnn"][0], r["ours2"][0] / r["cudnn2"][0])


def spread(entry) -> tuple[float, float] | None:
    """The ratio's range over both runs from the percentiles: (our slow over cuDNN's fast, our fast over cuDNN's
    slow), or None where it did not run."""
    r = _row(entry)
    if r is None:
        return None
    runs = (("ours", "cudnn"), ("ours2", "cudnn2"))
    return min(r[o][1] / r[c][2] for o, c in runs), max(r[o][2] / r[c][1] for o, c in runs)


def ptxas_warnings(entry) -> list[str]:
    """ptxas's codes for the warpgroup-matmul serialisation it reported (e.g. ['C7513']), sorted."""
    return sorted({m for line in entry["code"].get("ptxas_wgmma", []) for m in re.findall(r"\((C75\d\d)\)", line)})


def spills(entry) -> bool:
    """Whether ptxas reported any local-memory spill."""
    return any(re.search(r"[1-9]\d* bytes spill", line) for line in entry["code"].get("spill_lines", []))


def probe_line(entry, source: str, what: str | None = None) -> str:
    """One markdown bullet: the variant in words (``what``, else :data:`VARIANTS`), its mask, ours/cuDNN in both
    runs, ptxas's verdict, the file."""
    what = what or VARIANTS.get(entry["variant"], entry["variant"])
    mask = "causal" if entry["mask"] == "causal" else "no mask"
    r, band = ratios(entry), spread(entry)
    speed = (f"{100 * r[0]:.0f} % and {100 * r[1]:.0f} % of cuDNN's speed (spread {100 * band[0]:.0f}–"
             f"{100 * band[1]:.0f} %)" if r else "did not run")  # fmt: skip
    warned = ptxas_warnings(entry)
    ptxas = f"`ptxas` warning {', '.join(warned)}" if warned else "no serialisation warning"
    if entry.get("code_of") == "both masks":  # one ptxas run for both kernels: whose warning, it does not say
        ptxas += " (ptxas's output covers both masks' kernels, compiled together)"
    if spills(entry):
        ptxas += ", registers spilled"
    row = _row(entry) or {}
    diff, errors = row.get("max_abs_diff_vs_cudnn"), (row.get("rel_error_ours"), row.get("rel_error_cudnn_fp8"))
    wrong = "wrong numbers" in VARIANTS.get(entry["variant"], "") or "wrong numbers" in what
    if "rel_error_ours" in row and not wrong:  # FP8: each against float32 (cuDNN's own output is E4M3-rounded)
        ours_ = f"{errors[0]:.3f}" if _is_number(errors[0]) else "not a finite number (wrong numbers)"
        ptxas += f"; relative error against float32 {ours_}" + (
            f" (cuDNN's FP8: {errors[1]:.3f})" if _is_number(errors[1]) else " (cuDNN's FP8: not recorded)"
        )
    elif _is_number(diff) and not wrong:  # NaN: a diagnostic's wrong numbers
        ptxas += f"; largest difference from cuDNN's output {diff:.1e}"
    elif not wrong and "max_abs_diff_vs_cudnn" in row:  # a kernel that should be right, whose output is not finite
        ptxas += "; its output is not finite (wrong numbers)"
    return f"- {what}, {mask}: {speed}; {ptxas} (`scripts/{source}`)"


_NOT_INSTALLED = "*The probe files live in the repository's `scripts/` folder, not in the installed package.*"


def _reader(folder: Path):
    """``pick(name, variant, mask) -> (the file's entries or None where it is missing, the entry or None)``, each file
    of ``folder`` read once; and the cache, {name: entries or None}, in the order first asked."""
    cache: dict[str, list | None] = {}

    def pick(name, variant, mask):
        if name not in cache:
            cache[name] = load_probe(folder / name) if (folder / name).is_file() else None
        entries = cache[name]
        return entries, (find(entries, variant, mask) if entries is not None else None)

    return pick, cache


def ceiling_words(kernel, ceiling, target: float, what: str = "it") -> str:
    """What a kernel's probe entry and its ceiling without exponentials (``*_noexp``: wrong numbers, the same
    matmuls, copies and barriers) say about reaching ``target`` (ours over cuDNN, e.g. 1.05), by the medians of both
    runs and the ceiling's spread, hedged wherever the two runs or the spread fall either side: one clause, ``what``
    naming the kernel, as 'pipelined, causal: with its exponentials …'."""
    pct = f"{100 * target:.0f} %"
    k, c = (ratios(kernel) if kernel else None), (ratios(ceiling) if ceiling else None)
    if k is None or c is None:
        return f"{what}: {'the kernel' if k is None else 'its ceiling'} did not run, so these records do not bound it"
    if min(k) >= target:
        return f"{what}: by the medians it reaches {pct} already, exponentials and all ({_pcts(k, target)})"
    if max(k) >= target:
        return (f"{what}: with its exponentials the two runs' medians fall either side of {pct} "
                f"({_pcts(k, target)}): not settled")  # fmt: skip
    if max(c) <= min(k):
        return (f"{what}: without the exponentials it runs no faster ({_pcts(c, target)} against {_pcts(k, target)}), "
                "so this ceiling bounds nothing")  # fmt: skip
    low, high = spread(ceiling)
    if max(c) < target:
        hedge = ("" if high < target else
                 "; the ceiling's spread reaches it, though, so these records do not settle it")  # fmt: skip
        return (f"{what}: even without the exponentials the medians stay below {pct} ({_pcts(c, target)}), so by the "
                f"medians more than the exponentials stands between it and {pct}{hedge}")  # fmt: skip
    if min(c) < target:
        return (f"{what}: without the exponentials the two runs' medians fall either side of {pct} "
                f"({_pcts(c, target)}): not settled")  # fmt: skip
    tail = ("the ceiling's spreads clear it too" if low >= target else
            "but the ceiling's spreads reach below it, so whether hiding every exponential would reach it these "
            "records do not settle")  # fmt: skip
    return (f"{what}: with its exponentials the medians stay below {pct} ({_pcts(k, target)}), without them they "
            f"clear it ({_pcts(c, target)}), so by the medians the exponentials it does not hide are what keeps it "
            f"below {pct}; {tail}")  # fmt: skip


def _pcts(pair, target: float) -> str:
    """'96 % and 99 %'; with as many decimals (up to 3) as it takes to print each value on its own side of
    ``target``."""
    for digits in range(4):
        if all((round(100 * x, digits) >= round(100 * target, digits)) == (x >= target) for x in pair):
            break
    return " and ".join(f"{100 * x:.{digits}f} %" for x in pair)


def head_gain_words(small, large, small_h: int, large_h: int) -> str:
    """How cuDNN's and our speed change from head size ``small_h`` to ``large_h``, from two probe entries of the same
    kernel and mask: each side's median TFLOP/s in both runs, and which gains more, said only where the ranges from
    the percentiles (the slow run of one head size against the fast of the other) do not overlap."""
    rows = _row(small), _row(large)
    if None in rows:
        return "one of the two probes did not run, so these records do not compare the head sizes"

    def gain(side):  # (low, high) of large over small from the percentiles, and the two medians' words
        a, b = rows
        low = min(b[k][1] for k in (side, f"{side}2")) / max(a[k][2] for k in (side, f"{side}2"))
        high = max(b[k][2] for k in (side, f"{side}2")) / min(a[k][1] for k in (side, f"{side}2"))
        speeds = (f"{a[side][0]:.0f} and {a[f'{side}2'][0]:.0f} TFLOP/s at H = {small_h}, "
                  f"{b[side][0]:.0f} and {b[f'{side}2'][0]:.0f} at H = {large_h}")  # fmt: skip
        return low, high, speeds

    theirs, ours = gain("cudnn"), gain("ours")
    if theirs[0] > ours[1]:
        verdict = "cuDNN gains more from the larger head than ours does"
    elif ours[0] > theirs[1]:
        verdict = "ours gains more from the larger head than cuDNN does"
    else:
        verdict = "within the spreads the two gain alike"
    return f"cuDNN runs at {theirs[2]}; ours at {ours[2]}: {verdict}"


def head_gain_lines(pairs, small_h: int, large_h: int, mask: str = "noncausal", folder=None) -> str:
    """Markdown bullets of :func:`head_gain_words`, one per ``(what, (file, variant) at small_h, (file, variant) at
    large_h)`` from ``folder`` (the repository's ``scripts/``), each ending with its files."""
    folder = Path(folder) if folder is not None else probe_dir()
    if folder is None:
        return _NOT_INSTALLED
    pick, _ = _reader(folder)
    lines = []
    for what, small, large in pairs:
        (small_f, small_e), (large_f, large_e) = pick(*small, mask), pick(*large, mask)
        files = ", ".join(f"`scripts/{name}`" for name, _ in (small, large))
        if missing := [
            f"`scripts/{name}` is missing" for (name, _), f in ((small, small_f), (large, large_f)) if f is None
        ]:
            lines.append(f"- {what}: {'; '.join(missing)}")
            continue
        lines.append(f"- {what}: {head_gain_words(small_e or {}, large_e or {}, small_h, large_h)} ({files})")
    return "\n".join(lines)


def ceiling_lines(pairs, target: float, folder=None) -> str:
    """Markdown bullets of :func:`ceiling_words`, one per ``(what, kernel pick, ceiling pick)``, each pick a (file
    name, variant, mask) in ``folder`` (the repository's ``scripts/``), each line ending with its file(s); says so
    where a file is missing or an entry is not in it."""
    folder = Path(folder) if folder is not None else probe_dir()
    if folder is None:
        return _NOT_INSTALLED
    pick, loaded = _reader(folder)
    lines = []
    for what, kernel, ceiling in pairs:
        (_, k), (_, c) = pick(*kernel), pick(*ceiling)
        files = " and ".join(f"`scripts/{name}`" for name in dict.fromkeys((kernel[0], ceiling[0])))
        missing = [f"`scripts/{p[0]}` is missing" if loaded[p[0]] is None else
                   f"`scripts/{p[0]}` has no {p[1]}, {'causal' if p[2] == 'causal' else 'no mask'}"
                   for p, e in ((kernel, k), (ceiling, c)) if e is None]  # fmt: skip
        lines.append(f"- {what}: not in the probe files ({'; '.join(dict.fromkeys(missing))})" if missing else
                     f"- {ceiling_words(k, c, target, what)} ({files})")  # fmt: skip
    return "\n".join(lines)


def _committed(path: Path) -> str | None:
    """The author day of the commit that first added ``path`` (following renames; the author date survives rebases
    and cherry-picks), or None outside a git checkout, in a shallow one (whose oldest commit seems to add every
    file), without git, or when git prints no day."""
    import subprocess

    try:
        shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=path.parent,
                                 capture_output=True, text=True, timeout=30)  # fmt: skip
        if shallow.returncode or shallow.stdout.strip() != "false":
            return None
        run = subprocess.run(["git", "log", "--follow", "--diff-filter=A", "--format=%as", "--", path.name], cwd=path.parent,
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    days = run.stdout.split() if run.returncode == 0 else []
    return days[-1] if days and re.fullmatch(r"\d{4}-\d\d-\d\d", days[-1]) else None


def sources_digest(root) -> str:
    """A digest of the code a probe runs — the package's and ``scripts/``' Python files under ``root`` (the
    repository), names and contents in sorted order — that needs no git: the GPU machine's copy of the tree can
    carry a git history older than its files (probe 4 saw commit 466af4d while it ran a later tree)."""
    import hashlib

    root, digest = Path(root), hashlib.sha256()
    for path in sorted([*root.glob("attention_tutorial/**/*.py"), *root.glob("scripts/*.py")]):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def provenance_words(paths) -> str:
    """Where the probe files at ``paths`` come from: each file's GPU, versions, date, and the code it ran (the
    sources' digest, :func:`sources_digest`, where it kept one, else the commit its machine's git reported); the
    files written before the probe kept its provenance named as such."""
    said, bare = [], []
    for path in map(Path, paths):
        data = _read(path)
        prov = data.get("provenance") if isinstance(data, dict) else None
        if prov:
            if prov.get("sources_sha256"):
                commit = f", sources sha256 {prov['sources_sha256'][:12]}"
            elif prov.get("commit"):  # the machine's git, which may be older than the tree it ran
                commit = (f", the code it ran not recorded (the GPU machine's git reported commit {prov['commit'][:7]}"
                          f"{' with changes' if prov.get('dirty') else ''}, which can be older than its files)")  # fmt: skip
            else:
                commit = ""
            machine = describe(prov) if {"jax", "jaxlib", "python", "created"} <= set(prov) else "its versions unread"
            said.append(f"`scripts/{path.name}`: {machine}{commit}")
        else:
            day = _committed(path)
            bare.append(f"`scripts/{path.name}`" + (f" (committed {day})" if day else ""))
    if bare:
        were = "was" if len(bare) == 1 else "were"
        said.append(f"{', '.join(bare)} {were} written before the probe kept its provenance: the GPU's driver and "
                    "versions were not saved with them")  # fmt: skip
    return "; ".join(said) + "." if said else ""


def probe_lines(picks, folder=None) -> str:
    """Markdown bullets for ``picks`` — (file name, variant, mask) or (file name, variant, mask, words for the
    variant) — read from ``folder`` (the repository's ``scripts/``), then where the files come from
    (:func:`provenance_words`); says so where the files are not there (an installed package) or an entry is
    missing."""
    folder = Path(folder) if folder is not None else probe_dir()
    if folder is None:
        return _NOT_INSTALLED
    pick, loaded = _reader(folder)
    lines = []
    for name, variant, mask, *what in picks:
        entries, entry = pick(name, variant, mask)
        if entry is None:
            missing = f"not in `scripts/{name}`" if entries is not None else f"`scripts/{name}` is missing"
            words = "causal" if mask == "causal" else "no mask"  # as probe_line says it
            lines.append(f"- {(what or [VARIANTS.get(variant, variant)])[0]}, {words}: {missing}")
        else:
            lines.append(probe_line(entry, name, *what))
    found = [folder / name for name, entries in loaded.items() if entries is not None]
    origin = provenance_words(found)
    return "\n".join(lines) + (f"\n\nWhere they come from: {origin}" if origin else "")
