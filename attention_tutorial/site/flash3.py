"""What "Toward FlashAttention-3: pipelining and H = 256" and its next page, on FP8 and the backward, need beside their
own cells: the goals judged against the records and their figure, the schematic of the pipelined loop, the recorded
races of the two ways the warpgroups take turns, the two ways of making dQ drawn, and the rows of their folded tables.

Speeds are a baseline's time over the kernel's, per T, from :func:`attention_tutorial.site.pallas_kernels.race`.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..results import store
from ..results.plotting import GREY, PALETTE, label
from .claims import same_point
from .pallas_kernels import Speed, pct, race, unique

# --- the goals --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Goal:
    """A speed goal: each of ``impls`` at ``target`` of ``baseline``'s speed or above (its time over ours) at every
    T >= ``min_seq`` of the records whose fields match ``where``, and, where both record one, with no larger error."""

    what: str
    impls: tuple[str, ...]
    baseline: str
    target: float
    min_seq: int
    where: dict


#: The verdicts of :class:`GoalResult`, best first: every T at or above the target in every run; the medians at or
#: above it but some run's range below; some T without the baseline; some T below the target, failed or less exact.
MET = ("yes", "not in every run", "not judged", "no")


@dataclasses.dataclass(frozen=True)
class GoalResult:
    """How far ``impl`` gets toward ``goal`` with one mask: its :class:`Speed` against the goal's baseline (None
    where no T has both), the T at which it failed or had no baseline beside it, and the error pairs (T, ours, the
    baseline's or None) against float32 wherever they were recorded."""

    goal: Goal
    impl: str
    causal: bool
    speed: Speed | None
    failed: tuple[int, ...] = ()
    unjudged: tuple[int, ...] = ()
    errors: tuple[tuple[int, float, float | None], ...] = ()

    @property
    def shortfall(self) -> str:
        """Why the goal is not met ("" when nothing falls short): how many T fall below the target and their medians'
        range, the T that failed, the T where our error is larger."""
        by_t = dict(self.speed.by_t) if self.speed else {}
        below = sorted(c.value for c in by_t.values() if c.value < self.goal.target)
        every = "every T" if len(below) == len(by_t) else f"{len(below)} of {len(by_t)} T"
        parts = [f"{every} below {100 * self.goal.target:.0f} %: {pct((below[0], below[-1]), 1)}"] if below else []
        worse = [t for t, ours, theirs in self.errors if theirs is not None and ours > theirs]
        why = (("failed", self.failed), ("larger error", worse))
        return "; ".join(parts + [f"{what} at T = {', '.join(f'{t:,}' for t in ts)}" for what, ts in why if ts])

    @property
    def met(self) -> str:
        if self.shortfall:
            return "no"
        if self.unjudged or self.speed is None:
            return "not judged"
        shaky = [t for t, c in (self.speed.by_t if self.speed else ()) if c.low < self.goal.target]
        return "not in every run" if shaky else "yes"


def goal_results(records, everything, goals) -> list[GoalResult]:
    """One :class:`GoalResult` per goal × implementation × mask with a record at T >= the goal's ``min_seq``; the
    baseline's spread pools every recording of a point in ``everything`` and ``records``."""
    pool = unique([*everything, *records])
    out = []
    for goal in goals:
        for impl, causal in itertools.product(goal.impls, (False, True)):
            where = {**goal.where, "impl": impl}
            every_t = [
                r for r in records if bool(r["causal"]) == causal and all(r.get(f) == v for f, v in where.items())
            ]
            mine = [r for r in every_t if r["seq_q"] >= goal.min_seq]
            if not mine:
                continue
            speeds = race(mine, pool, (impl,), baseline=goal.baseline, min_seq=goal.min_seq)
            if len(speeds) > 1:
                raise ValueError(f"goal {goal.what!r}: {impl}'s records span several H or dtypes; narrow its where=.")
            speed, ok = speeds[0] if speeds else None, {r["seq_q"] for r in mine if r["status"] == "ok"}
            errors = {}
            for r in every_t:  # accuracy is judged wherever it was measured, T below min_seq too
                if r["status"] == "ok" and r.get("rel_error") is not None:
                    theirs = [o.get("rel_error") for o in same_point(pool, r, impl=goal.baseline)]
                    errors[r["seq_q"]] = (r["rel_error"], max((e for e in theirs if e is not None), default=None))
            failed = tuple(sorted({r["seq_q"] for r in mine} - ok))
            unjudged = tuple(sorted(ok - set(speed.ts if speed else ())))
            errs = tuple((t, *e) for t, e in sorted(errors.items()))
            out.append(GoalResult(goal, impl, causal, speed, failed, unjudged, errs))
    return out


def standing(results) -> list[GoalResult]:
    """Per goal and mask, the result that comes closest: the best verdict, then the highest lowest median."""
    best: dict[tuple, GoalResult] = {}
    for r in results:
        now = best.get((r.goal, r.causal))
        if r.speed and (now is None or _rank(r) < _rank(now)):
            best[(r.goal, r.causal)] = r
    return list(best.values())


def _rank(r: GoalResult) -> tuple[int, float]:
    return MET.index(r.met), -(r.speed.low if r.speed else 0.0)


#: Which of a goal's kernels a line of :func:`standing_figure` shows, in a few words.
VARIANTS = {
    "mosaic": "default config",
    "mosaic_pipe": "pipelined",
    "mosaic_fp8_regs": "p in registers",
    "mosaic_fp8": "p through shared memory",
    "mosaic_atomic": "dQ by atomic adds",
}
STANDING_COLOURS = {"yes": PALETTE[2], "not in every run": PALETTE[1], "not judged": GREY, "no": PALETTE[0]}


def standing_figure(rows: list[GoalResult]):
    """One line per goal and mask (:func:`standing`): a thick bar from the lowest to the highest median over T, a
    thin line for the range over runs, a black tick at the goal, 100 % dashed; coloured by the verdict."""
    fig, ax = plt.subplots(figsize=(7.6, 0.55 * len(rows) + 1.5), layout="constrained", facecolor="white")
    for i, (r, s) in enumerate((r, r.speed) for r in rows if r.speed):
        colour = STANDING_COLOURS[r.met]
        ax.plot([100 * s.spread_low, 100 * s.spread_high], [i, i], color=colour, linewidth=1.2)
        ax.plot([100 * s.low, 100 * s.high], [i, i], color=colour, linewidth=7, solid_capstyle="butt")
        ax.plot([100 * r.goal.target] * 2, [i - 0.32, i + 0.32], color="black", linewidth=2)
    ax.axvline(100, color=GREY, linestyle=(0, (6, 3)), linewidth=1.1)
    cuDNN = {"xycoords": ("data", "axes fraction"), "xytext": (3, -10), "textcoords": "offset points"}
    ax.annotate("cuDNN", (100, 1.0), fontsize=8, color=GREY, **cuDNN)
    names = [
        f"{r.goal.what.rsplit(', T', 1)[0]}, {'causal' if r.causal else 'no mask'}\n({VARIANTS.get(r.impl, r.impl)})"
        for r in rows
    ]
    ax.set_yticks(range(len(rows)), names, fontsize=8)
    ax.invert_yaxis()
    fp8 = any(r.goal.baseline.startswith("cudnn_fp8") for r in rows)  # FP8 goals race cuDNN's FP8 path
    ax.set_xlabel("% of cuDNN's speed" + (" (FP8: of cuDNN FP8's, end to end)" if fp8 else ""))
    ax.grid(True, axis="x", color="#dddddd", linewidth=0.8)
    handles = [
        plt.Line2D([], [], color=STANDING_COLOURS[m], lw=7, label=f"medians over T (goal met: {m})") for m in MET
    ]
    handles = [h for h, m in zip(handles, MET) if any(r.met == m for r in rows)]
    handles += [plt.Line2D([], [], color=GREY, lw=1.2, label="range over runs"), plt.Line2D([], [], color="k", lw=2)]
    handles[-1].set_label("goal")
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncol=3, frameon=False)
    return fig


# --- the pipelined loop and the plain one ----------------------------------------------------------------------------


def pipeline_schedule(steps: int = 3, matmul: float = 1.0, softmax: float = 2.0) -> dict[str, list[tuple]]:
    """One warpgroup's loop, plain and pipelined, as {row: [(start, length, kind, text)]} for
    :func:`attention_tutorial.site.pallas_kernels.timeline_figure`. Plain: q·kᵀ, softmax, p·v, each waiting for the
    one before. Pipelined (FlashAttention-3's §3.2): after the first block, each step issues the next block's q·kᵀ and
    this block's p·v back to back and runs the next softmax while p·v still runs. A schematic: lengths in arbitrary
    units, not measured."""
    if steps < 2 or matmul <= 0 or softmax <= 0:
        raise ValueError(f"pipeline_schedule needs steps >= 2 and positive lengths; got {steps}, {matmul}, {softmax}")
    rows: dict[str, list[tuple]] = {
        f"{a}: {b}": [] for a in ("plain", "pipelined") for b in ("tensor cores", "softmax")
    }
    for j in range(steps):
        t = j * (2 * matmul + softmax)
        rows["plain: tensor cores"] += [
            (t, matmul, "matmul", f"q·kᵀ {j}"),
            (t + matmul + softmax, matmul, "matmul", f"p·v {j}"),
        ]
        rows["plain: softmax"].append((t + matmul, softmax, "softmax", f"softmax {j}"))
    rows["pipelined: tensor cores"].append((0.0, matmul, "matmul", "q·kᵀ 0"))
    rows["pipelined: softmax"].append((matmul, softmax, "softmax", "softmax 0"))
    t = matmul + softmax  # softmax 0 is done
    for j in range(steps - 1):  # q·k_{j+1}ᵀ, then p_j·v_j; softmax j+1 runs while p_j·v_j does
        rows["pipelined: tensor cores"] += [
            (t, matmul, "matmul", f"q·kᵀ {j + 1}"),
            (t + matmul, matmul, "matmul", f"p·v {j}"),
        ]
        rows["pipelined: softmax"].append((t + matmul, softmax, "softmax", f"softmax {j + 1}"))
        t += matmul + max(matmul, softmax)
    rows["pipelined: tensor cores"].append((t, matmul, "matmul", f"p·v {steps - 1}"))
    return rows


WORD_ORDER = ("faster", "on par", "slower")  # the verdicts a speed claim allows, best first


def words_over_t(words) -> str:
    """The verdicts a kernel got over T in words: "on par at every T", "faster at some T and on par at others"."""
    words = sorted(set(words), key=WORD_ORDER.index)
    if not words:
        return "not measured"
    if len(words) == 1:
        return f"{words[0]} at every T"
    return ", ".join(f"{w} at some T" for w in words[:-1]) + f" and {words[-1]} at others"


# --- the exponentials and the two ways of taking turns ----------------------------------------------------------------


def ablation_rows(ratios) -> list[dict]:
    """The ablation runs (:func:`attention_tutorial.measure.ablations.ablation_ratios`) as table rows: kernel, H,
    mask, the exponentials as they are or taken out, the baseline (FP8 pairs marked end to end: both calls quantise
    their bf16 inputs), the speed in each run and the range over runs (whole percents)."""
    return [
        {
            "kernel": label(a.impl),
            "H": a.head_dim,
            "mask": "causal" if a.causal else "none",
            "exponentials": "as they are" if a.variant == "as_is" else "taken out (wrong numbers)",
            "against": label(a.baseline) + (", end to end" if "fp8" in a.baseline else ""),
            "speed, each run": ", ".join(f"{100 * v:.0f} %" for v in a.per_round),
            "range over runs": pct((a.low, a.high)),
        }
        for a in ratios
    ]


def versus_races(provenance, *, group: str, base: str, other: str) -> list[dict]:
    """Every recorded race of ``group`` (:mod:`attention_tutorial.measure.race`) that timed both contenders
    ``base`` and ``other``, in the order they ran: the case, ``speed`` (base's median time over other's; above 1:
    ``other`` faster), the lowest and highest of the rounds' ratios, when it ran and the code it ran
    (:func:`attention_tutorial.results.store.code_words`, "not recorded" where not kept)."""
    out = []
    for rec in ((provenance or {}).get("race") or {}).values():
        rounds = {r["contender"]: r.get("rounds_ms") for r in rec.get("rows", ())}
        a, b = rounds.get(base), rounds.get(other)
        if rec.get("group") == group and a and b:
            ratios = [x / y for x, y in zip(a, b)]
            speed = statistics.median(a) / statistics.median(b)
            ran, code = str(rec.get("created") or "–")[:16], store.code_words(rec) or "not recorded"
            out.append(
                {"case": rec["case"], "speed": speed, "low": min(ratios), "high": max(ratios), "ran": ran, "code": code}
            )
    return out


def schedule_races(provenance) -> list[dict]:
    """:func:`versus_races` of the forward's rendezvous ("ours") against FlashAttention-3's turns ("ours,
    turns"): above 1, turns faster."""
    return versus_races(provenance, group="forward", base="ours", other="ours, turns")


# --- the tuning tables and the backward's dQ -------------------------------------------------------------------------


def config_speed(rows, configs, base, *, causal: bool | None = None) -> dict[tuple[int, bool, str], float | None]:
    """{(H, causal, config): its TFLOP/s over its base's at the same H and mask} for each of ``configs`` in a tuning
    table (:func:`attention_tutorial.results.store.tuning`; one mask only where ``causal`` is given); ``base``: the
    base configuration's label, or a function from a label to its base's. None where the config or its base did not
    run."""
    by = {(r["H"], r["causal"], r["config"]): r["tflops"] for r in rows}
    of = base if callable(base) else lambda _: base
    return {
        (h, c, cfg): tf / b if tf and (b := by.get((h, c, of(cfg)))) else None
        for (h, c, cfg), tf in by.items()
        if cfg in configs and causal in (None, c)
    }


def registers_gain(rows) -> dict[tuple[int, bool, str], float | None]:
    """{(H, causal, config at 232 registers): its TFLOP/s at 240 registers over at 232} for each configuration of a
    tuning table timed both ways ("…, 240 registers" beside "…, 232 registers" or the bare label); None where one did
    not run."""
    labels = {r["config"] for r in rows}

    def at_232(cfg):
        return cfg.replace("240", "232") if cfg.replace("240", "232") in labels else cfg.removesuffix(", 240 registers")

    gain = config_speed(rows, {c for c in labels if c.endswith(", 240 registers")}, at_232)
    return {(h, c, at_232(cfg)): v for (h, c, cfg), v in gain.items()}


def ratio_span(speeds) -> tuple[float, float] | None:
    """(lowest, highest) of the ratios of :func:`config_speed` that ran; None when none did."""
    ran = [v for v in speeds.values() if v is not None]
    return (min(ran), max(ran)) if ran else None


def tile_rows(rows, base: str, *, causal: bool = False) -> list[dict]:
    """One mask's rows of a tuning table as table rows: the configuration tried, TFLOP/s (one decimal; "did not fit"
    where it did not compile or fit) and its speed relative to ``base``'s (two decimals)."""
    mine = [r for r in rows if bool(r["causal"]) == causal]
    ref = next((r["tflops"] for r in mine if r["config"] == base), None)
    return [
        {
            "configuration": r["config"],
            "TFLOP/s": f"{r['tflops']:.1f}" if r["tflops"] else "did not fit",
            "relative speed": f"{r['tflops'] / ref:.2f}" if r["tflops"] and ref else "–",
        }
        for r in mine
    ]


#: The matrix products each pass of the backward computes for one pair of tiles (a query block, a key block), by the
#: way it makes dQ (``MosaicConfig.bwd_dq``): S = q·kᵀ and dP = dO·vᵀ (both recomputed), dV += Pᵀ·dO, dK += dSᵀ·q,
#: dQ += dS·k.
DQ_PRODUCTS = {
    "pass": (("pass 1, per key block: dK, dV", "S, dP, dV, dK"), ("pass 2, per query block: dQ", "S, dP, dQ")),
    "atomic": (("one pass, per key block", "S, dP, dV, dK, dQ"),),
}
DQ_WORDS = {"pass": "a pass of its own", "atomic": "atomic adds"}


def products(scheme: str) -> int:
    """How many matrix products one pair of tiles costs the backward that makes dQ by ``scheme``."""
    return sum(len(names.split(", ")) for _, names in DQ_PRODUCTS[scheme])


def dq_figure(blocks: int = 4):
    """The two ways of making dQ drawn on the grid of tile pairs (query blocks down, key blocks across): a pass of
    its own walks each query block's row again after the dK/dV pass walked each key block's column; atomic adds send
    each tile's share of dQ into a float32 dQ beside the grid while the one pass walks the columns."""
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.9), layout="constrained")
    col, row = 1, 2  # the key block and the query block the arrows follow
    for ax, scheme in zip(axes, ("pass", "atomic")):
        ax.set(xlim=(-0.6, blocks + 2.6), ylim=(blocks + 1.3, -1.0), aspect="equal")
        ax.axis("off")
        for i, j in itertools.product(range(blocks), repeat=2):
            ax.add_patch(Rectangle((j, i), 0.92, 0.92, facecolor="#EEEEEE", edgecolor=GREY, lw=0.6))
        ax.text(blocks / 2, -0.45, "key blocks →", ha="center", fontsize=8, color=GREY)
        ax.text(-0.3, blocks / 2, "query blocks →", rotation=-90, va="center", ha="center", fontsize=8, color=GREY)

        def arrow(a, b, colour, ax=ax, style="-|>"):
            ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=11, color=colour, lw=1.6))

        def caption(x, y, text, colour, ax=ax):
            ax.text(x, y, text, ha="center", fontsize=8, color=colour)

        arrow((col + 0.46, 0.1), (col + 0.46, blocks - 0.1), PALETTE[0])  # the dK/dV pass down one key column
        (first, names), *rest = DQ_PRODUCTS[scheme]
        caption(col + 0.46, blocks + 0.35, f"{first}: {names}", PALETTE[0])
        if rest:  # dQ by a pass of its own: along one query row
            arrow((0.1, row + 0.46), (blocks - 0.1, row + 0.46), PALETTE[1])
            caption(blocks / 2, blocks + 0.85, ": ".join(rest[0]), PALETTE[1])
            ax.add_patch(Rectangle((col, row), 0.92, 0.92, facecolor="none", edgecolor="black", lw=1.4))
            ax.text(blocks + 0.15, row + 0.46, "the boxed tile's\nS and dP: twice", va="center", fontsize=8)
        else:  # atomic adds: every tile of the column sends its share to dQ beside the grid
            x = blocks + 1.2
            ax.add_patch(Rectangle((x, 0), 0.7, blocks - 0.08, facecolor="#FFF2CC", edgecolor=GREY, lw=0.8))
            caption(x + 0.35, -0.45, "dQ (float32)", "black")
            for i in range(blocks):
                arrow((col + 0.92, i + 0.46), (x, i + 0.46), PALETTE[1], style="->")
            caption(x - 0.75, blocks + 0.85, "each tile adds dS·k (TMA reduce-add)", PALETTE[1])
        ax.set_title(f"dQ by {DQ_WORDS[scheme]}: {products(scheme)} products per tile pair", fontsize=10)
    return fig


def split_figure():
    """The backward's float32 dK and dV by warpgroup: up to H = 128 each compute warpgroup owns 64 keys of its own
    across the whole head dim; at H = 256 both own the same 64 keys, each one half of the head dim, and each makes
    the weights and dS of half the query tile, which both then read from shared memory."""
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.4), layout="constrained")
    colour = {0: PALETTE[0], 1: PALETTE[1]}

    def box(ax, x, y, w, h, wg, text):
        ax.add_patch(Rectangle((x, y), w, h, facecolor=colour[wg], alpha=0.25, edgecolor=colour[wg], lw=1.2))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8)

    for ax in axes:
        ax.set(xlim=(-1.6, 8.6), ylim=(5.0, -0.6), aspect="equal")
        ax.axis("off")
    left, right = axes
    for wg in (0, 1):  # H = 128: two key blocks, the whole head dim each
        box(left, 1.0, 0.4 + 2.2 * wg, 5.0, 2.0, wg, f"warpgroup {wg}\nkeys {64 * wg}–{64 * wg + 63} × H 0–127")
    left.text(3.5, 4.85, "dK, dV: each warpgroup its own keys", ha="center", fontsize=8, color=GREY)
    left.set_title("H = 128", fontsize=10)
    for wg in (0, 1):  # H = 256: one key block; shared memory above, the head dim split below
        box(right, 0.5 + 3.6 * wg, 0.0, 3.4, 1.2, wg, f"Pᵀ, dSᵀ of queries {32 * wg}–{32 * wg + 31}\n(warpgroup {wg})")
        box(right, 0.0 + 4.1 * wg, 2.6, 3.9, 2.0, wg, f"warpgroup {wg}\nkeys 0–63 × H {128 * wg}–{128 * wg + 127}")
        for to in (0, 1):
            start, end = (2.2 + 3.6 * wg, 1.25), (1.95 + 4.1 * to, 2.55)
            right.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=10, color=colour[wg], lw=1.2))
    right.text(-1.5, 0.6, "shared\nmemory", va="center", fontsize=8, color=GREY)
    right.text(4.0, 4.85, "dK, dV: the same keys, half the head dim each", ha="center", fontsize=8, color=GREY)
    right.set_title("H = 256", fontsize=10)
    return fig
