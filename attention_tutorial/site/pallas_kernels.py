"""What "What does a FlashAttention kernel look like on a GPU?" needs: each kernel's speed against cuDNN from the
records, what the recorded machine code holds, and the picture of the two warpgroups taking turns.

Speeds are cuDNN's time over the kernel's (1.0: as fast as cuDNN), as :func:`attention_tutorial.site.claims.compare`
computes them from the p10–p90 spreads; every recording of cuDNN at a point (any grid, any run) widens its spread.
"""

from __future__ import annotations

import dataclasses
import json
import re

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ..measure.kernel_code import FAMILIES
from ..results.plotting import GREY, PALETTE, impl_style, label
from .claims import POINT_FIELDS, Claim, compare, same_point, words_by_x

# --- the race: each kernel against a baseline, point by point ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Speed:
    """``impl``'s speed against ``baseline`` at each T both ran (H = ``head_dim``, one mask and dtype): per T the
    ratio of the medians (``Claim.value``), its range from the spreads (``low``, ``high``) and the word the
    spreads allow ("faster", "slower", "on par")."""

    impl: str
    baseline: str
    head_dim: int
    causal: bool
    dtype: str
    by_t: tuple[tuple[int, Claim], ...]

    @property
    def ts(self) -> list[int]:
        return [t for t, _ in self.by_t]

    @property
    def low(self) -> float:
        """The lowest median ratio over T."""
        return min(c.value for _, c in self.by_t)

    @property
    def high(self) -> float:
        """The highest median ratio over T."""
        return max(c.value for _, c in self.by_t)

    @property
    def spread_low(self) -> float:
        return min(c.low for _, c in self.by_t)

    @property
    def spread_high(self) -> float:
        return max(c.high for _, c in self.by_t)

    @property
    def verdict(self) -> str:
        """'on par' where every T agrees, else 'slower at T = 4096; on par at T = 16384, 32768'."""
        return words_by_x(dict(self.by_t))


def unique(records) -> list[dict]:
    """Each record once, by content: the same recording loaded twice (two reads of one result file) counts once."""
    return list({json.dumps(r, sort_keys=True, default=str): r for r in records}.values())


def claims_by_t(records, pool, want: dict, baseline: str, min_seq: int = 0, base=()) -> dict[int, Claim]:
    """{T: how the records matching ``want`` compare with ``baseline`` at T} (T >= ``min_seq``): ours from
    ``records`` (several recordings of a point pooled), the baseline's from every recording in ``pool`` at the same
    point, but for the fields in ``base`` (pairs of field and value, e.g. (("dtype", "bfloat16"),))."""
    at_t: dict[int, list] = {}
    for r in records:
        if all(r.get(f) == v for f, v in want.items()) and r["seq_q"] >= min_seq:
            at_t.setdefault(r["seq_q"], []).append(r)
    got = {}
    for t, mine in sorted(at_t.items()):
        if differ := [f for f in POINT_FIELDS if len({r.get(f) for r in mine}) > 1]:
            raise ValueError(
                f"{want.get('impl')}'s records at T = {t} differ in {', '.join(differ)}; pass records of one kind "
                f"only (filter them, say by {differ[0]}=...)."
            )
        if others := same_point(pool, mine[0], **dict(base, impl=baseline)):
            got[t] = compare(mine, others)
    return got


def race(
    records, everything=(), impls=("mosaic",), *, baseline: str = "cudnn", min_seq: int = 0, base=()
) -> list[Speed]:
    """One :class:`Speed` per implementation × H × dtype × mask in ``records`` that has the baseline beside it at
    T >= ``min_seq``; the baseline's spread pools every recording of the point in ``everything`` and ``records``.
    ``base``: fields on which the baseline's points differ from ours (pairs of field and value)."""
    if isinstance(impls, str):
        raise TypeError(f"race takes a tuple of implementation names; got the string {impls!r}: pass ({impls!r},).")
    pool = unique([*everything, *records])
    keys = sorted({(r.get("head_dim"), r.get("dtype")) for r in records if r.get("impl") in impls}, key=str)
    out = []
    for impl in impls:
        for head_dim, dtype in keys:
            for causal in (False, True):
                want = {"impl": impl, "head_dim": head_dim, "dtype": dtype, "causal": causal, "status": "ok"}
                got = claims_by_t(records, pool, want, baseline, min_seq, base)
                if got:
                    out.append(Speed(impl, baseline, head_dim, causal, dtype, tuple(got.items())))
    return out


def pick(speeds, **where) -> list[Speed]:
    """The speeds whose fields (impl, head_dim, causal, dtype, baseline) equal ``where``."""
    return [s for s in speeds if all(getattr(s, f) == v for f, v in where.items())]


def span(speeds) -> tuple[float, float] | None:
    """(lowest, highest) median ratio over ``speeds`` and their T; None when there are none."""
    if not speeds:
        return None
    return min(s.low for s in speeds), max(s.high for s in speeds)


def pct(pair, digits: int = 0) -> str:
    """(0.97, 1.01) -> '97–101 %'; one number when both ends print the same; '–' for None."""
    if pair is None:
        return "–"
    a, b = (f"{100 * x:.{digits}f}" for x in pair)
    return f"{a} %" if a == b else f"{a}–{b} %"


def speed_rows(speeds) -> list[dict]:
    """The race as table rows (for a folded table): implementation, dtype, H, mask, the range of the medians and of
    the spreads, and the verdict per T."""
    return [
        {
            "implementation": label(s.impl),
            "dtype": s.dtype,
            "H": s.head_dim,
            "mask": "causal" if s.causal else "none",
            f"speed vs {label(s.baseline)}": pct((s.low, s.high)),
            "range over runs": pct((s.spread_low, s.spread_high)),
            "verdict": s.verdict,
        }
        for s in speeds
    ]


def race_figure(speeds, *, title: str = ""):
    """% of the baseline's speed against T, one panel per mask, one line per implementation (and dtype), the range
    over runs as error bars and 100 % dashed; returns the figure."""
    masks = sorted({s.causal for s in speeds})
    fig, axes = plt.subplots(
        1,
        max(len(masks), 1),
        figsize=(5.4 * max(len(masks), 1), 3.9),
        sharey=True,
        squeeze=False,
        layout="constrained",
        facecolor="white",
    )
    axes = list(axes[0])
    for ax, causal in zip(axes, masks):
        for i, s in enumerate(pick(speeds, causal=causal)):
            colour, marker = impl_style(s.impl, i)
            ys = [100 * c.value for _, c in s.by_t]
            err = [[100 * (c.value - c.low) for _, c in s.by_t], [100 * (c.high - c.value) for _, c in s.by_t]]
            name = label(s.impl) + ("" if s.dtype == "bfloat16" else f", {s.dtype}")
            ax.errorbar(s.ts, ys, yerr=err, color=colour, marker=marker, capsize=3, linewidth=1.6, label=name)
        ax.axhline(100, color=GREY, linestyle=(0, (6, 3)), linewidth=1.1)
        ax.set_xscale("log", base=2)
        ts = sorted({t for s in speeds for t in s.ts})
        ax.set_xticks(ts, [f"{t // 1024}k" if t >= 1024 else str(t) for t in ts])
        ax.minorticks_off()
        ax.set_xlabel("T (query length)")
        ax.set_title("causal" if causal else "no mask", fontsize=10)
        ax.grid(True, color="#dddddd", linewidth=0.8)
    axes[0].set_ylabel(f"% of {label(speeds[0].baseline) if speeds else 'cuDNN'}'s speed")
    if speeds:
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, fontsize=8, loc="outside lower center", ncol=min(len(labels), 3), frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


# --- the two warpgroups taking turns (a schematic) ----------------------------------------------------------------

MATMUL, SOFTMAX, COPY = PALETTE[0], PALETTE[1], PALETTE[2]


def pingpong_schedule(steps: int = 3, matmul: float = 2.0, softmax: float = 2.0) -> dict[str, list[tuple]]:
    """The ping-pong as FlashAttention-3 draws it: {row: [(start, length, kind, text)]} for two compute warpgroups
    that take turns on the tensor cores ("matmul": p·v of one block and q·kᵀ of the next, back to back), each
    running its softmax ("softmax") while the other's matmuls run, and the copy warpgroup ("copy") landing each
    block's k and v tiles before the first warpgroup needs them. Warpgroup 1 starts one matmul later; a warpgroup
    whose softmax is shorter than the other's matmuls waits for its turn. A schematic: lengths in arbitrary units,
    not measured."""
    if steps < 1 or matmul <= 0 or softmax <= 0:
        raise ValueError(f"pingpong_schedule needs steps >= 1 and positive lengths; got {steps}, {matmul}, {softmax}")
    period, copy = max(matmul + softmax, 2 * matmul), 0.8 * matmul  # a warpgroup waits for its turn
    rows = {"warpgroup 0": [], "warpgroup 1": [], "copy warpgroup": []}
    for wg in (0, 1):
        for j in range(steps):
            t = copy + wg * matmul + j * period
            text = "q·kᵀ 0" if j == 0 else f"p·v {j - 1}, q·kᵀ {j}"
            rows[f"warpgroup {wg}"] += [(t, matmul, "matmul", text), (t + matmul, softmax, "softmax", f"softmax {j}")]
    rows["copy warpgroup"] = [(j * period, copy, "copy", f"k, v {j}") for j in range(steps)]
    return rows


def tensor_core_busy(rows: dict[str, list[tuple]]) -> float:
    """The share of the time from the first matmul to the last in which some warpgroup's matmul runs."""
    spans = sorted((s, s + n) for row in rows.values() for s, n, kind, _ in row if kind == "matmul")
    busy, end = 0.0, None
    for s, e in spans:
        if end is None or s >= end:
            busy, end = busy + e - s, e
        elif e > end:
            busy, end = busy + e - end, e
    return busy / (spans[-1][1] - spans[0][0])


def timeline_figure(rows: dict[str, list[tuple]], *, title: str = ""):
    """Boxes on a time axis, one row per entry of ``rows`` (as :func:`pingpong_schedule` returns them)."""
    colours = {"matmul": MATMUL, "softmax": SOFTMAX, "copy": COPY}
    names = list(rows)
    fig, ax = plt.subplots(figsize=(8.6, 0.65 * len(names) + 1.3), layout="constrained", facecolor="white")
    for i, name in enumerate(names):
        y = len(names) - 1 - i
        for start, length, kind, text in rows[name]:
            ax.broken_barh([(start, length)], (y - 0.35, 0.7), facecolors=colours[kind], edgecolor="white")
            ax.text(
                start + length / 2,
                y,
                text,
                ha="center",
                va="center",
                fontsize=7.5,
                color="white" if kind != "softmax" else "black",
            )
    ax.set_yticks(range(len(names)), reversed(names))
    ax.set_xlabel("time (schematic)")
    ax.set_xticks([])
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    kinds = {kind for row in rows.values() for _, _, kind, _ in row}
    names = {"matmul": "tensor cores (wgmma)", "softmax": "softmax (exp2)", "copy": "TMA copy"}
    fig.legend(
        handles=[Patch(color=colours[k], label=names[k]) for k in names if k in kinds],
        fontsize=8,
        loc="outside lower center",
        ncol=3,
        frameon=False,
    )
    if title:
        ax.set_title(title, fontsize=11)
    return fig


# --- what the compiled code holds ---------------------------------------------------------------------------------

CODE_NAMES = {
    "pallas": "our Triton-lowered",
    "jax_pallas": "JAX's Triton-lowered",
    "mosaic": "our Mosaic GPU",
    "jax_mosaic": "JAX's Mosaic GPU",
    "mosaic_pipe": "our Mosaic GPU, pipelined",
    "mosaic_fp8": "our Mosaic GPU, FP8, p via shared memory",
    "mosaic_fp8_regs": "our Mosaic GPU, FP8, p in registers",
}
SHORT = {family: family.split(" (")[0] for family in FAMILIES}  # 'wgmma (warpgroup matmul)' -> 'wgmma'


def code_name(key: str) -> str:
    """A ``kernel_code`` key ('mosaic_pipe bfloat16 causal H=256', see
    :func:`attention_tutorial.measure.kernel_code.code_key`) as a row name: 'our Mosaic GPU, pipelined, causal,
    H = 256'; the input dtype named only where it is not bf16 (our FP8 forward's inputs are bf16)."""
    impl, dtype, *rest = key.split()
    words = [CODE_NAMES.get(impl, impl), *([dtype] if dtype != "bfloat16" else [])]
    words += ["causal" if r == "causal" else r.replace("=", " = ") for r in rest]
    return ", ".join(words)


def code_counts(code: dict, key: str) -> dict[str, int] | None:
    """{short family name ('wgmma', 'TMA copy', ...): instructions in the code} of one recorded kernel, from its SASS
    where recorded, else its PTX; None when the recording has no counts for ``key``."""
    counts = code.get(key, {}).get("counts", {})
    kind = "sass" if counts.get("sass") else "ptx"
    if not counts.get(kind):
        return None
    return {SHORT[f]: counts[kind].get(f, 0) for f in FAMILIES}


def code_rows(code: dict, keys=None) -> list[dict]:
    """The recorded instruction counts as table rows (for a folded table): kernel, which code was read, one column
    per instruction family, the registers ``ptxas`` allocated and its serialisation warnings ('—': not read)."""
    rows = []
    for key in keys or code:
        rec = code.get(key, {})
        counts = code_counts(code, key) or {}
        kind = "SASS" if rec.get("counts", {}).get("sass") else "PTX" if counts else "—"
        read = bool(rec.get("registers"))  # ptxas's output was read (the Triton-lowered kernels compile inside XLA)
        rows.append(
            {
                "kernel": code_name(key),
                "code": kind,
                **{f: counts.get(f, "—") for f in SHORT.values()},
                "registers (ptxas)": ", ".join(map(str, rec.get("registers", []))) or "—",
                "matmuls serialised (ptxas)": "; ".join(rec.get("wgmma_serialised") or []) or ("no" if read else "—"),
            }
        )
    return rows


def code_shape(code: dict) -> dict | None:
    """{'B', 'T', 'N', 'H': sorted head sizes} the recorded kernels were compiled at; None when B, T or N differ."""
    shapes = {(rec.get("batch"), rec.get("seq_q"), rec.get("heads")) for rec in code.values()}
    heads = sorted({rec.get("head_dim") for rec in code.values()} - {None})
    if len(shapes) != 1 or None in (shape := next(iter(shapes))) or not heads:
        return None
    return {"B": shape[0], "T": shape[1], "N": shape[2], "H": heads}


@dataclasses.dataclass(frozen=True)
class Registers:
    """Registers per thread: what ``ptxas`` allocated for the whole kernel (None: not recorded), and what
    ``set_max_registers`` moves them to for each compute and each copy thread."""

    ptxas: int | None
    compute: int
    copy: int

    @property
    def average(self) -> float:
        """(2 · compute + copy) / 3: two compute warpgroups and one copy warpgroup share the register file."""
        return (2 * self.compute + self.copy) / 3


def register_split(config, code: dict | None = None, key: str = "mosaic bfloat16") -> Registers:
    """The register budgets a Mosaic kernel built with ``config`` (a ``MosaicConfig``) sets with
    ``set_max_registers`` (``config.registers`` for each compute thread, the rest of the pool for each copy thread)
    and the count ``ptxas`` reported for ``key`` in the recorded ``code``."""
    from ..kernels.mosaic.budget import copy_registers

    allocated = ((code or {}).get(key, {}).get("registers") or [None])[0]
    return Registers(allocated, config.registers, copy_registers(config.registers))


# --- listings: the code a page prints ---------------------------------------------------------------------------------

_LINT = re.compile(r"\s*# noqa\b.*$")


def listing(fn, start: str | None = None, end: str | None = None) -> str:
    """``fn``'s source as a page prints it: the linter's markers (``# noqa``) taken
    out, and with ``start``/``end`` only the lines from the first holding ``start`` to the first after it holding
    ``end`` (both kept), dedented. ``ValueError`` naming the marker that is not in the source."""
    import inspect
    import textwrap

    lines = inspect.getsource(fn).splitlines()
    first = 0
    if start is not None:
        first = next((i for i, line in enumerate(lines) if start in line), None)
        if first is None:
            raise ValueError(f"start={start!r} is not in the source of {fn.__qualname__}.")
    last = len(lines) - 1
    if end is not None:
        last = next((i for i in range(first, len(lines)) if end in lines[i]), None)
        if last is None:
            raise ValueError(f"end={end!r} is not in the source of {fn.__qualname__} after {start!r}.")
    return textwrap.dedent("\n".join(_LINT.sub("", line) for line in lines[first : last + 1])) + "\n"


def tensor_core_share(
    records, impl: str = "cudnn", *, head_dim: int = 128, min_seq: int = 4096, datasheet_tflops: float = 989.4
) -> tuple[float, float] | None:
    """The lowest and highest share of the tensor cores' datasheet bf16 rate that ``impl`` reached at T >=
    ``min_seq`` (its recorded TFLOP/s over ``datasheet_tflops``; None where none is recorded)."""
    shares = [
        r["tflops"] / datasheet_tflops
        for r in records
        if r.get("impl") == impl
        and r.get("head_dim") == head_dim
        and r.get("seq_q", 0) >= min_seq
        and r.get("status") == "ok"
        and r.get("tflops")
    ]
    return (min(shares), max(shares)) if shares else None
