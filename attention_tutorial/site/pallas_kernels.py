"""What "What does a FlashAttention kernel look like on a GPU?" needs, and the kernel pages after it: each kernel's
speed against a baseline from the records (:func:`race`), the picture of the two warpgroups taking turns
(:func:`pingpong_schedule`, :func:`timeline_figure`), what the recorded machine code holds (:func:`code_counts`) and
the code a page prints (:func:`listing`).

Speeds are the baseline's time over the kernel's (1.0: as fast as the baseline), as
:func:`attention_tutorial.site.claims.compare` computes them from the p10–p90 spreads; every recording of the
baseline at a point (any grid, any run) widens its spread.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import textwrap

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ..measure.kernel_code import FAMILIES
from ..results.plotting import GREY, PALETTE, impl_style, label
from .claims import POINT_FIELDS, Claim, compare, same_point, words_by_x

# --- the race: each kernel against a baseline, point by point ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Speed:
    """``impl``'s speed against ``baseline`` at each T both ran (H = ``head_dim``, one mask and dtype): per T the
    ratio of the medians (``Claim.value``), its range from the spreads (``Claim.low``, ``Claim.high``) and the word
    the spreads allow ("faster", "slower", "on par")."""

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


def race(records, everything=(), impls=("mosaic",), *, baseline: str = "cudnn", min_seq: int = 0) -> list[Speed]:
    """One :class:`Speed` per implementation × H × dtype × mask in ``records`` that has the baseline beside it at
    T >= ``min_seq``: ours from ``records`` (several recordings of a point pooled), the baseline's from every
    recording of the point in ``everything`` and ``records``."""
    if isinstance(impls, str):
        raise TypeError(f"race takes a tuple of implementation names; got the string {impls!r}: pass ({impls!r},).")
    pool = unique([*everything, *records])
    out = []
    for impl in impls:
        ours = [r for r in records if r.get("impl") == impl and r.get("status") == "ok" and r["seq_q"] >= min_seq]
        for kind in sorted({(r["head_dim"], r["dtype"], r["causal"]) for r in ours}, key=str):
            by_t = {}
            for t in sorted({r["seq_q"] for r in ours}):
                mine = [r for r in ours if (r["head_dim"], r["dtype"], r["causal"]) == kind and r["seq_q"] == t]
                if differ := [f for f in POINT_FIELDS if len({r.get(f) for r in mine}) > 1]:
                    raise ValueError(
                        f"{impl}'s records at T = {t} differ in {', '.join(differ)}; pass records of one kind only "
                        f"(filter them, say by {differ[0]}=...)."
                    )
                if mine and (theirs := same_point(pool, mine[0], impl=baseline)):
                    by_t[t] = compare(mine, theirs)
            if by_t:
                head_dim, dtype, causal = kind
                out.append(Speed(impl, baseline, head_dim, causal, dtype, tuple(by_t.items())))
    return out


def pick(speeds, **where) -> list[Speed]:
    """The speeds whose fields (impl, head_dim, causal, dtype, baseline) equal ``where``."""
    return [s for s in speeds if all(getattr(s, f) == v for f, v in where.items())]


def span(speeds) -> tuple[float, float] | None:
    """(lowest, highest) median ratio over ``speeds`` and their T; None when there are none."""
    return (min(s.low for s in speeds), max(s.high for s in speeds)) if speeds else None


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
    masks = sorted({s.causal for s in speeds}) or [False]
    size = (5.4 * len(masks), 3.9)
    fig, axes = plt.subplots(1, len(masks), figsize=size, sharey=True, squeeze=False, layout="constrained")
    ts = sorted({t for s in speeds for t in s.ts})
    for ax, causal in zip(axes[0], masks):
        for i, s in enumerate(pick(speeds, causal=causal)):
            colour, marker = impl_style(s.impl, i)
            ys = [100 * c.value for _, c in s.by_t]
            err = [[100 * (c.value - c.low) for _, c in s.by_t], [100 * (c.high - c.value) for _, c in s.by_t]]
            name = label(s.impl) + ("" if s.dtype == "bfloat16" else f", {s.dtype}")
            ax.errorbar(s.ts, ys, yerr=err, color=colour, marker=marker, capsize=3, linewidth=1.6, label=name)
        ax.axhline(100, color=GREY, linestyle=(0, (6, 3)), linewidth=1.1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ts, [f"{t // 1024}k" if t >= 1024 else str(t) for t in ts])
        ax.minorticks_off()
        ax.set_xlabel("T (query length)")
        ax.set_title("causal" if causal else "no mask", fontsize=10)
        ax.grid(True, color="#dddddd", linewidth=0.8)
    axes[0, 0].set_ylabel(f"% of {label(speeds[0].baseline) if speeds else 'cuDNN'}'s speed")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="outside lower center", ncol=min(len(labels), 3) or 1, frameon=False)
    fig.suptitle(title, fontsize=11)
    return fig


# --- the two warpgroups taking turns (a schematic) ----------------------------------------------------------------

COLOURS = {"matmul": PALETTE[0], "softmax": PALETTE[1], "copy": PALETTE[2]}
KINDS = {"matmul": "tensor cores (wgmma)", "softmax": "softmax (exp2)", "copy": "TMA copy"}


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


def timeline_figure(rows: dict[str, list[tuple]], *, title: str = ""):
    """Boxes on a time axis, one row per entry of ``rows`` (as :func:`pingpong_schedule` returns them), top down."""
    fig, ax = plt.subplots(figsize=(8.6, 0.65 * len(rows) + 1.3), layout="constrained", facecolor="white")
    for y, boxes in enumerate(rows.values()):
        for start, length, kind, text in boxes:
            ax.broken_barh([(start, length)], (y - 0.35, 0.7), facecolors=COLOURS[kind], edgecolor="white")
            colour = "black" if kind == "softmax" else "white"
            ax.text(start + length / 2, y, text, ha="center", va="center", fontsize=7.5, color=colour)
    ax.set_yticks(range(len(rows)), list(rows))
    ax.invert_yaxis()
    ax.set(xlabel="time (schematic)", xticks=[])
    ax.set_title(title, fontsize=11)
    ax.spines[["top", "right"]].set_visible(False)
    kinds = {kind for boxes in rows.values() for _, _, kind, _ in boxes}
    handles = [Patch(color=COLOURS[k], label=text) for k, text in KINDS.items() if k in kinds]
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncol=3, frameon=False)
    return fig


# --- what the compiled code holds, and the code a page prints ---------------------------------------------------


def code_counts(code: dict, key: str) -> dict[str, int] | None:
    """{short family name ('wgmma', 'TMA copy', ...): instructions in the code} of one recorded kernel (``key``, see
    :func:`attention_tutorial.measure.kernel_code.code_key`), from its SASS where recorded, else its PTX; None when
    the recording has no counts for ``key``."""
    counts = code.get(key, {}).get("counts", {})
    kind = "sass" if counts.get("sass") else "ptx"
    if not counts.get(kind):
        return None
    return {family.split(" (")[0]: counts[kind].get(family, 0) for family in FAMILIES}


def listing(fn, start: str | None = None, end: str | None = None) -> str:
    """``fn``'s source as a page prints it: the linter's markers (``# noqa``) taken out, and with ``start``/``end``
    only the lines from the first holding ``start`` to the first after it holding ``end`` (both kept), dedented.
    ``ValueError`` naming the marker that is not in the source."""
    lines = [re.sub(r"\s*# noqa\b.*$", "", line) for line in inspect.getsource(fn).splitlines()]
    first = 0 if start is None else next((i for i, line in enumerate(lines) if start in line), None)
    if first is None:
        raise ValueError(f"start={start!r} is not in the source of {fn.__qualname__}.")
    last = len(lines) - 1 if end is None else next((i for i in range(first, len(lines)) if end in lines[i]), None)
    if last is None:
        raise ValueError(f"end={end!r} is not in the source of {fn.__qualname__} after {start!r}.")
    return textwrap.dedent("\n".join(lines[first : last + 1])) + "\n"
