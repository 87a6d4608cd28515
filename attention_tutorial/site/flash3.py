"""What "Toward FlashAttention-3: pipelining, H = 256 and FP8" needs: the goals and how far each kernel gets, the
pipelined loop against the plain one, FP8's speed (end to end) and error, what the exponentials cost (the arithmetic,
and the kernels timed without them), the recorded races of the two ways the compute warpgroups take turns, the tuning
tables the page cites, and the picture of the pipelined loop.

Speeds are a baseline's time over the kernel's, per T, from :func:`attention_tutorial.site.pallas_kernels.race`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from ..measure.flops import DATASHEET
from ..results import store
from ..results.plotting import GREY, PALETTE, label
from .claims import same_point
from .pallas_kernels import Speed, pct, race, unique

# --- the goals --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Goal:
    """A speed goal: each of ``impls`` against ``baseline`` (same points, T >= ``min_seq``, records matching
    ``where``) at ``target`` or above (the baseline's time over ours), and, where both carry one, no larger error."""

    what: str
    impls: tuple[str, ...]
    baseline: str
    target: float
    min_seq: int = 0
    where: tuple[tuple[str, object], ...] = ()


# Set by FlashAttention-3's report of its kernels ahead of cuDNN's on the H100 at long sequences. FP8 is timed end to
# end, as recorded: each call quantises q, k and v from bf16 and returns bf16 (cuDNN FP8's calls alike).
GOALS = (
    Goal(
        "bf16, H = 128, T ≥ 8192",
        ("mosaic", "mosaic_pipe"),
        "cudnn",
        1.05,
        8192,
        (("grid", "beyond"), ("head_dim", 128)),
    ),
    Goal(
        "bf16, H = 256, T ≥ 8192",
        ("mosaic", "mosaic_pipe"),
        "cudnn",
        1.00,
        8192,
        (("grid", "beyond"), ("head_dim", 256)),
    ),
    Goal(
        "FP8 end to end, H = 128, T ≥ 8192",
        ("mosaic_fp8_regs", "mosaic_fp8"),
        "cudnn_fp8_s448",
        1.00,
        8192,
        (("grid", "fp8"),),
    ),
    Goal(
        "fwd+bwd bf16, H = 128, T ≥ 4096",
        ("mosaic", "mosaic_atomic"),
        "cudnn",
        1.00,
        4096,
        (("grid", "backward"), ("head_dim", 128), ("dtype", "bfloat16"), ("kv_heads", 16)),
    ),
    Goal(
        "fwd+bwd bf16, H = 64, T ≥ 4096",
        ("mosaic", "mosaic_atomic"),
        "cudnn",
        0.95,
        4096,
        (("grid", "backward"), ("head_dim", 64), ("dtype", "bfloat16"), ("kv_heads", 16)),
    ),
)
#: The verdicts of :class:`GoalResult`, best first: every T at or above the target in every run; the medians at or
#: above it but some run's range below; some T without the baseline; some T below the target, failed or less exact.
MET = ("yes", "not in every run", "not judged", "no")


@dataclasses.dataclass(frozen=True)
class GoalResult:
    """How far ``impl`` gets toward ``goal`` with one mask: its :class:`Speed` against the goal's baseline (None
    where no T has both), the T at which it failed, had no baseline beside it, or had the larger error, and the
    error pairs (T, ours, the baseline's or None) against float32 where recorded."""

    goal: Goal
    impl: str
    causal: bool
    speed: Speed | None
    failed: tuple[int, ...] = ()
    unjudged: tuple[int, ...] = ()
    errors: tuple[tuple[int, float, float | None], ...] = ()

    @property
    def below(self) -> list[int]:
        return [t for t, c in (self.speed.by_t if self.speed else ()) if c.value < self.goal.target]

    @property
    def shaky(self) -> list[int]:
        """The T whose median reaches the target but whose range over runs reaches below it."""
        return [t for t, c in (self.speed.by_t if self.speed else ()) if c.value >= self.goal.target > c.low]

    @property
    def worse_error(self) -> list[int]:
        return sorted(t for t, ours, theirs in self.errors if theirs is not None and ours > theirs)

    @property
    def shortfall(self) -> str:
        """Why the goal is not met ("" when nothing falls short): the T below the target with their medians, the T
        that failed, the T where our error is larger."""
        medians = dict(self.speed.by_t) if self.speed else {}
        below = [100 * medians[t].value for t in self.below]
        if len(below) > 1:
            every = "every T" if len(below) == len(medians) else f"{len(below)} of {len(medians)} T"
            parts = [f"{every} below {100 * self.goal.target:.0f} %: {min(below):.1f}–{max(below):.1f} %"]
        else:
            parts = [f"T = {t:,} at {b:.1f} %" for t, b in zip(self.below, below)]
        parts += [f"T = {t:,} failed" for t in self.failed]
        parts += [f"T = {t:,}: larger error" for t in self.worse_error]
        return "; ".join(parts)

    @property
    def met(self) -> str:
        if self.below or self.failed or self.worse_error:
            return "no"
        if self.unjudged or self.speed is None:
            return "not judged"
        return "not in every run" if self.shaky else "yes"


def goal_results(records, everything=(), goals=GOALS) -> list[GoalResult]:
    """One :class:`GoalResult` per goal × implementation × mask that has a record (T >= the goal's ``min_seq``; the
    errors at every T that has one); the baseline's spread pools every recording of a point in ``everything`` and
    ``records``."""
    pool = unique([*everything, *records])
    out = []
    for goal in goals:
        mine_all = [r for r in records if all(r.get(f) == v for f, v in goal.where)]
        for impl in goal.impls:
            for causal in (False, True):
                every_t = [r for r in mine_all if r.get("impl") == impl and bool(r.get("causal")) == causal]
                mine = [r for r in every_t if r["seq_q"] >= goal.min_seq]
                if not mine:
                    continue
                speeds = [
                    s
                    for s in race(mine, pool, (impl,), baseline=goal.baseline, min_seq=goal.min_seq)
                    if s.causal == causal
                ]
                if len(speeds) > 1:
                    raise ValueError(
                        f"goal {goal.what!r}: {impl}'s records span several H or dtypes; narrow the "
                        f"goal's where= (now {goal.where})."
                    )
                ok_t = {r["seq_q"] for r in mine if r["status"] == "ok"}
                speed = speeds[0] if speeds else None
                errors = {}
                for r in every_t:  # accuracy is judged wherever it was measured, T below min_seq too
                    if r["status"] == "ok" and r.get("rel_error") is not None:
                        theirs = [
                            o["rel_error"]
                            for o in same_point(pool, r, impl=goal.baseline)
                            if o.get("rel_error") is not None
                        ]
                        errors[r["seq_q"]] = (r["rel_error"], max(theirs) if theirs else None)
                out.append(
                    GoalResult(
                        goal,
                        impl,
                        causal,
                        speed,
                        tuple(sorted({r["seq_q"] for r in mine} - ok_t)),
                        tuple(sorted(ok_t - set(speed.ts if speed else ()))),
                        tuple((t, *e) for t, e in sorted(errors.items())),
                    )
                )
    return out


def closest(results, goal: Goal, causal: bool) -> GoalResult | None:
    """The result for ``goal`` and the mask that comes closest: the best verdict, then the highest lowest median."""
    mine = [r for r in results if r.goal == goal and r.causal == causal]
    return min(mine, key=lambda r: (MET.index(r.met), -(r.speed.low if r.speed else 0.0)), default=None)


WORD_ORDER = ("faster", "on par", "slower")  # the verdicts a speed claim allows, best first


def words_over_t(words) -> str:
    """The verdicts a kernel got over T in words: "on par at every T", "faster at some T and on par at others"."""
    words = sorted(set(words), key=WORD_ORDER.index)
    if not words:
        return "not measured"
    if len(words) == 1:
        return f"{words[0]} at every T"
    return ", ".join(f"{w} at some T" for w in words[:-1]) + f" and {words[-1]} at others"


def standing_rows(results, goals=GOALS) -> list[dict]:
    """Per goal and mask, the kernel that comes closest (:func:`closest`): ``goal``, ``causal``, ``impl``, its lowest
    and highest median over T (``low``, ``high``), the range over runs (``spread``), the target and the verdict."""
    rows = []
    for goal in goals:
        for causal in (False, True):
            r = closest(results, goal, causal)
            if r is None or r.speed is None:
                continue
            rows.append(
                {
                    "goal": goal,
                    "causal": causal,
                    "impl": r.impl,
                    "low": r.speed.low,
                    "high": r.speed.high,
                    "spread": (r.speed.spread_low, r.speed.spread_high),
                    "target": goal.target,
                    "met": r.met,
                }
            )
    return rows


def goal_verdicts(rows) -> dict:
    """{goal: the worse verdict of its two masks} over :func:`standing_rows` (a goal is met only if both are)."""
    out = {}
    for r in rows:
        now = out.get(r["goal"])
        out[r["goal"]] = r["met"] if now is None else max(now, r["met"], key=MET.index)
    return out


#: Which of a goal's kernels a line of :func:`standing_figure` shows, in a few words.
VARIANTS = {
    "mosaic": "default config",
    "mosaic_pipe": "pipelined",
    "mosaic_fp8_regs": "p in registers",
    "mosaic_fp8": "p through shared memory",
    "mosaic_atomic": "dQ by atomic adds",
}
STANDING_COLOURS = {"yes": PALETTE[2], "not in every run": PALETTE[1], "not judged": GREY, "no": PALETTE[0]}


def standing_figure(rows, *, title: str = ""):
    """One line per goal and mask (:func:`standing_rows`): a thick bar from the lowest to the highest median over
    T, a thin line for the range over runs, a black tick at the goal, 100 % dashed; coloured by the verdict."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.6, 0.55 * len(rows) + 1.5), layout="constrained", facecolor="white")
    for i, r in enumerate(rows):
        colour = STANDING_COLOURS[r["met"]]
        ax.plot([100 * x for x in r["spread"]], [i, i], color=colour, linewidth=1.2, solid_capstyle="butt")
        ax.plot([100 * r["low"], 100 * r["high"]], [i, i], color=colour, linewidth=7, solid_capstyle="butt")
        ax.plot([100 * r["target"]] * 2, [i - 0.32, i + 0.32], color="black", linewidth=2)
    ax.axvline(100, color=GREY, linestyle=(0, (6, 3)), linewidth=1.1)
    ax.annotate(
        "cuDNN",
        (100, 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(3, -10),
        textcoords="offset points",
        fontsize=8,
        color=GREY,
    )
    names = [
        f"{r['goal'].what.rsplit(', T', 1)[0]}, {'causal' if r['causal'] else 'no mask'}\n"
        f"({VARIANTS.get(r['impl'], r['impl'])})"
        for r in rows
    ]
    ax.set_yticks(range(len(rows)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("% of cuDNN's speed (FP8: of cuDNN FP8's, end to end)")
    ax.grid(True, axis="x", color="#dddddd", linewidth=0.8)
    met = dict.fromkeys(r["met"] for r in rows)
    handles = [
        plt.Line2D([], [], color=STANDING_COLOURS[m], linewidth=7, label=f"medians over T (goal met: {m})") for m in met
    ]
    handles.append(plt.Line2D([], [], color=STANDING_COLOURS[next(iter(met))], linewidth=1.2, label="range over runs"))
    handles.append(plt.Line2D([], [], color="black", linewidth=2, label="goal"))
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncol=min(len(handles), 3), frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
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
    plain_mm, plain_sm, t = [], [], 0.0
    for j in range(steps):
        plain_mm.append((t, matmul, "matmul", f"q·kᵀ {j}"))
        plain_sm.append((t + matmul, softmax, "softmax", f"softmax {j}"))
        plain_mm.append((t + matmul + softmax, matmul, "matmul", f"p·v {j}"))
        t += 2 * matmul + softmax
    pipe_mm, pipe_sm = [(0.0, matmul, "matmul", "q·kᵀ 0")], [(matmul, softmax, "softmax", "softmax 0")]
    t = matmul + softmax
    for j in range(steps):
        if j + 1 < steps:
            pipe_mm.append((t, matmul, "matmul", f"q·kᵀ {j + 1}"))
            pipe_sm.append((t + matmul, softmax, "softmax", f"softmax {j + 1}"))  # runs while p·v j does
        start = t + (matmul if j + 1 < steps else 0.0)
        pipe_mm.append((start, matmul, "matmul", f"p·v {j}"))
        t = max(start + matmul, t + matmul + softmax) if j + 1 < steps else start + matmul
    return {
        "plain: tensor cores": plain_mm,
        "plain: softmax": plain_sm,
        "pipelined: tensor cores": pipe_mm,
        "pipelined: softmax": pipe_sm,
    }


def schedule_length(rows: dict[str, list[tuple]], prefix: str) -> float:
    """Where the last box of the rows whose name starts with ``prefix`` ends."""
    return max(s + n for name, row in rows.items() if name.startswith(prefix) for s, n, *_ in row)


# --- the exponentials -----------------------------------------------------------------------------------------------

#: FlashAttention-3's figure for an H100 SXM5's exponential throughput (its multi-function units), TFLOP/s.
EXP_TFLOPS = 3.9


def exp_share(head_dim: int, *, matmul_tflops: float | None = None, exp_tflops: float = EXP_TFLOPS) -> float:
    """The exponentials' time over the matmuls' time for one score: one exponential against 4·H matmul FLOPs
    (q·kᵀ and p·v, a multiply-add each per H), at ``matmul_tflops`` (default: the H100/H200 datasheet's dense bf16)
    and ``exp_tflops``: matmul_tflops / (exp_tflops · 4H)."""
    if not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"head_dim must be a positive int; got {head_dim!r}.")
    rate = DATASHEET["NVIDIA H200"].bf16_tflops if matmul_tflops is None else matmul_tflops
    return rate / (exp_tflops * 4 * head_dim)


@dataclasses.dataclass(frozen=True)
class ExpBound:
    """What the ablation runs say about one goal: the range of the kernels' median speeds against cuDNN as they are
    (``as_is``) and without their exponentials (``no_exp``), whether every run without them clears the target
    (``clears``: the lowest ``low`` of the ranges over runs at or above it) and whether some kernel as it is falls
    short of it (``short``: a median below it)."""

    as_is: tuple[float, float]
    no_exp: tuple[float, float]
    clears: bool
    short: bool


def exp_bound(ratios, target: float, *, head_dim: int = 128, impls=("mosaic", "mosaic_pipe")) -> ExpBound | None:
    """:class:`ExpBound` from :func:`attention_tutorial.measure.ablations.ablation_ratios`' entries of ``impls`` at
    ``head_dim`` (both masks); None unless both variants are there."""
    mine = [a for a in ratios if a.impl in impls and a.head_dim == head_dim]
    as_is, no_exp = ([a for a in mine if a.variant == v] for v in ("as_is", "no_exp"))
    if not (as_is and no_exp):
        return None

    def span(entries):
        return min(a.median for a in entries), max(a.median for a in entries)

    return ExpBound(
        span(as_is), span(no_exp), min(a.low for a in no_exp) >= target, min(a.median for a in as_is) < target
    )


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


# --- how the two compute warpgroups take turns ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScheduleRace:
    """One recorded forward race (:mod:`attention_tutorial.measure.race`, group "forward") of our kernel with
    FlashAttention-3's turn-passing schedule against the same kernel with the default rendezvous: ``speed`` is the
    rendezvous's median time over the turns' (above 1: turns faster), ``low``/``high`` the lowest and highest of the
    rounds' ratios, with when it ran and the commit and dirty flag of the code it ran (None where not kept)."""

    case: str
    speed: float
    low: float
    high: float
    created: str | None
    commit: str | None
    dirty: bool | None


def schedule_races(provenance) -> list[ScheduleRace]:
    """The :class:`ScheduleRace` of every recorded forward race that timed both "ours" and "ours, turns", in the
    order they ran; [] without any."""
    out = []
    for rec in ((provenance or {}).get("race") or {}).values():
        if rec.get("group") != "forward":
            continue
        rows = {r["contender"]: r for r in rec.get("rows", ())}
        plain, turns = rows.get("ours"), rows.get("ours, turns")
        if not (plain and turns and plain.get("rounds_ms") and turns.get("rounds_ms")):
            continue
        rounds = [a / b for a, b in zip(plain["rounds_ms"], turns["rounds_ms"])]
        speed = statistics.median(plain["rounds_ms"]) / statistics.median(turns["rounds_ms"])
        out.append(
            ScheduleRace(
                rec["case"], speed, min(rounds), max(rounds), rec.get("created"), rec.get("commit"), rec.get("dirty")
            )
        )
    return out


def schedule_rows(races) -> list[dict]:
    """:class:`ScheduleRace` entries as table rows: the case, the speed of turns against the rendezvous and its
    range over rounds, when it ran and the code it ran (:func:`attention_tutorial.results.store.code_words`)."""
    return [
        {
            "case": r.case,
            "turns against rendezvous": f"{100 * r.speed:.1f} %",
            "range over rounds": pct((r.low, r.high)),
            "ran": str(r.created or "–")[:16],
            "code": store.code_words({"commit": r.commit, "dirty": r.dirty}) or "not recorded",
        }
        for r in races
    ]


# --- FP8's error -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FP8Error:
    """At one point: our FP8 kernel's relative error against float32 (bf16 output), the same with the error of
    rounding the output to E4M3 added in quadrature (as cuDNN's FP8 path writes it), and cuDNN FP8's error."""

    seq_q: int
    causal: bool
    ours: float
    ours_rounded: float
    theirs: float

    @property
    def word(self) -> str:
        """'alike' within 10 %, else 'smaller' or 'larger' (ours with the rounding, against theirs)."""
        x = self.ours_rounded / self.theirs if self.theirs else math.inf
        return "alike" if abs(x - 1) <= 0.1 else "smaller" if x < 0.9 else "larger"


def fp8_errors(records, rounding: float, *, ours: str = "mosaic_fp8_regs", theirs: str = "cudnn_fp8_s448"):
    """:class:`FP8Error` at each point where both recorded a finite error (several recordings of a point pooled by
    their median), by mask then T. ``rounding``: the error of rounding the exact output to E4M3 alone
    (:func:`attention_tutorial.measure.fp8.output_rounding_error`)."""

    def ok(r, impl):
        return r.get("impl") == impl and r.get("status") == "ok" and store._is_number(r.get("rel_error"))

    points: dict[tuple, dict] = {}
    for r in records:
        if ok(r, ours) and (got := [o["rel_error"] for o in same_point(records, r, impl=theirs) if ok(o, theirs)]):
            key = (bool(r["causal"]), r["seq_q"])
            points.setdefault(key, {"ours": [], "theirs": got})["ours"].append(r["rel_error"])
    out = []
    for (causal, t), p in sorted(points.items()):
        mine = statistics.median(p["ours"])
        out.append(FP8Error(t, causal, mine, math.hypot(mine, rounding), statistics.median(p["theirs"])))
    return out


# --- the tuning tables ---------------------------------------------------------------------------------------------


def config_speed(rows, configs, base: str, *, causal: bool | None = None) -> dict[tuple[int, bool, str], float | None]:
    """{(H, causal, config): its TFLOP/s over ``base``'s at the same H and mask} for each of ``configs`` (one mask
    only where ``causal`` is given); None where the config did not run (or ``base`` did not)."""
    by = {(r["H"], r["causal"], r["config"]): r["tflops"] for r in rows}
    return {
        (h, c, cfg): (by[(h, c, cfg)] / by[(h, c, base)] if by[(h, c, cfg)] and by.get((h, c, base)) else None)
        for (h, c, cfg) in by
        if cfg in configs and causal in (None, c)
    }


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


DQ_SCHEMES = {"pass": "a pass of its own", "atomic": "atomic adds"}  # MosaicConfig.bwd_dq, in words
#: The ways of making dQ the tuning tables hold: the two the kernel offers, and dS passed between the warpgroups
#: through shared memory (each adding half of dQ's columns for both), timed and not kept.
DQ_TIMED = {**DQ_SCHEMES, "atomic_shared": "atomic adds, dS shared"}


#: The matrix products each pass of the backward computes for one pair of tiles (a query block, a key block), by the
#: way it makes dQ: S = q·kᵀ and dP = dO·vᵀ (both recomputed), dV += Pᵀ·dO, dK += dSᵀ·q, dQ += dS·k.
DQ_PRODUCTS = {
    "pass": (
        ("pass 1, per key block: dK, dV", ("S", "dP", "dV", "dK")),
        ("pass 2, per query block: dQ", ("S", "dP", "dQ")),
    ),
    "atomic": (("one pass, per key block", ("S", "dP", "dV", "dK", "dQ")),),
}


def products(scheme: str) -> int:
    """How many matrix products one pair of tiles costs the backward that makes dQ by ``scheme``."""
    return sum(len(names) for _, names in DQ_PRODUCTS[scheme])


def dq_figure(blocks: int = 4):
    """The two ways of making dQ drawn on the grid of tile pairs (query blocks down, key blocks across): a pass of
    its own walks each query block's row again after the dK/dV pass walked each key block's column; atomic adds send
    each tile's share of dQ into a float32 dQ beside the grid while the one pass walks the columns."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    from ..results.plotting import GREY, PALETTE

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.9), layout="constrained")
    col, row = 1, 2  # the key block and the query block the arrows follow
    for ax, scheme in zip(axes, ("pass", "atomic")):
        ax.set_xlim(-0.6, blocks + 2.6)
        ax.set_ylim(blocks + 1.3, -1.0)
        ax.set_aspect("equal")
        ax.axis("off")
        for i in range(blocks):
            for j in range(blocks):
                ax.add_patch(Rectangle((j, i), 0.92, 0.92, facecolor="#EEEEEE", edgecolor=GREY, lw=0.6))
        ax.text(blocks / 2, -0.45, "key blocks →", ha="center", fontsize=8, color=GREY)
        ax.text(-0.3, blocks / 2, "query blocks →", rotation=-90, va="center", ha="center", fontsize=8, color=GREY)

        def arrow(a, b, colour, style="-|>", ax=ax):
            ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=11, color=colour, lw=1.6))

        arrow((col + 0.46, 0.1), (col + 0.46, blocks - 0.1), PALETTE[0])  # the dK/dV pass down one key column
        (first, names), *rest = DQ_PRODUCTS[scheme]
        ax.text(col + 0.46, blocks + 0.35, f"{first}: {', '.join(names)}", ha="center", fontsize=8, color=PALETTE[0])
        if scheme == "pass":
            ((second, names2),) = rest
            arrow((0.1, row + 0.46), (blocks - 0.1, row + 0.46), PALETTE[1])  # the dQ pass along one query row
            ax.text(
                blocks / 2, blocks + 0.85, f"{second}: {', '.join(names2)}", ha="center", fontsize=8, color=PALETTE[1]
            )
            ax.add_patch(Rectangle((col, row), 0.92, 0.92, facecolor="none", edgecolor="black", lw=1.4))
            ax.text(blocks + 0.15, row + 0.46, "the boxed tile's\nS and dP: twice", va="center", fontsize=8)
        else:
            x = blocks + 1.2
            ax.add_patch(Rectangle((x, 0), 0.7, blocks - 0.08, facecolor="#FFF2CC", edgecolor=GREY, lw=0.8))
            ax.text(x + 0.35, -0.45, "dQ (float32)", ha="center", fontsize=8)
            for i in range(blocks):
                arrow((col + 0.92, i + 0.46), (x, i + 0.46), PALETTE[1], style="->")
            ax.text(
                x - 0.75,
                blocks + 0.85,
                "each tile adds dS·k (TMA reduce-add)",
                ha="center",
                fontsize=8,
                color=PALETTE[1],
            )
        ax.set_title(f"dQ by {DQ_SCHEMES[scheme]}: {products(scheme)} products per tile pair", fontsize=10)
    return fig


def dq_speeds(rows, *, tiles: str = "bwd 64x64 stages 2") -> dict[tuple[int, bool, str], float | None]:
    """{(H, causal, scheme): forward + backward speed over cuDNN's} for each way of making dQ (:data:`DQ_TIMED`)
    at ``tiles`` in a ``bwd_tiles`` tuning table (``tools/tune.py`` labels "pass" by the tiles alone); None where the
    scheme did not run."""
    configs = {(tiles if scheme == "pass" else f"{tiles} dQ {scheme}"): scheme for scheme in DQ_TIMED}
    return {(h, c, configs[cfg]): v for (h, c, cfg), v in config_speed(rows, configs, "cuDNN").items()}


def dq_table_speeds(rows, *, registers: int = 232) -> dict[tuple[int, bool, str], float | None]:
    """{(H, causal, scheme): forward + backward speed over cuDNN's} for each way of making dQ in a ``bwd_dq`` tuning
    table ("dQ pass", "dQ atomic", "dQ atomic shared"; with ", 240 registers" for ``registers=240``)."""
    suffix = "" if registers == 232 else f", {registers} registers"
    configs = {f"dQ {scheme.replace('_', ' ')}{suffix}": scheme for scheme in DQ_TIMED}
    return {(h, c, configs[cfg]): v for (h, c, cfg), v in config_speed(rows, configs, "cuDNN").items()}


def registers_gain(rows) -> dict[tuple[int, bool, str], float | None]:
    """{(H, causal, config): its TFLOP/s at 240 registers over at 232} for each configuration of a tuning table timed
    both ways (labelled "…, 240 registers" beside "…, 232 registers" or beside the bare label); None where one did
    not run."""
    by = {(r["H"], r["causal"], r["config"]): r["tflops"] for r in rows}
    out = {}
    for (h, c, cfg), tf in by.items():
        if not cfg.endswith(", 240 registers"):
            continue
        bare = cfg.removesuffix(", 240 registers")
        base = next((b for b in (f"{bare}, 232 registers", bare) if (h, c, b) in by), None)
        if base is not None:
            out[(h, c, base)] = tf / by[(h, c, base)] if tf and by[(h, c, base)] else None
    return out


def dq_verdict(speeds, head_dim: int) -> str:
    """How atomic adds compare with a pass of its own at ``head_dim`` over both masks of :func:`dq_speeds`:
    "faster" or "slower" where the two ranges do not overlap, "about as fast" where they do, "" without both."""
    ranges = {}
    for scheme in ("pass", "atomic"):
        ran = [v for (h, _, sch), v in speeds.items() if h == head_dim and sch == scheme and v is not None]
        if not ran:
            return ""
        ranges[scheme] = (min(ran), max(ran))
    if ranges["atomic"][0] > ranges["pass"][1]:
        return "faster"
    return "slower" if ranges["atomic"][1] < ranges["pass"][0] else "about as fast"


def dq_rows(speeds) -> list[dict]:
    """:func:`dq_speeds` as table rows: H, mask, and each scheme's speed as a percentage of cuDNN's ("–" where it
    did not run or does not apply)."""
    out = []
    ran = {sch for (_, _, sch), v in speeds.items() if v is not None}
    for h, c in sorted({(h, c) for h, c, _ in speeds}):
        row = {"H": h, "mask": "causal" if c else "none"}
        for scheme, words in ((k, w) for k, w in DQ_TIMED.items() if k in ran):
            v = speeds.get((h, c, scheme))
            row[f"dQ by {words}"] = f"{100 * v:.0f} %" if v else "–"
        out.append(row)
    return out


def fp8_error_rows(errors) -> list[dict]:
    """:class:`FP8Error` entries as table rows: errors to three decimals, the verdict word."""
    return [
        {
            "mask": "causal" if e.causal else "none",
            "T": e.seq_q,
            "ours": f"{e.ours:.3f}",
            "ours, output rounded to E4M3": f"{e.ours_rounded:.3f}",
            "cuDNN FP8's": f"{e.theirs:.3f}",
            "ours against cuDNN's": e.word,
        }
        for e in errors
    ]
