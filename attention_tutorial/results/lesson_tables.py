"""Tables and words for the lessons of :mod:`attention_tutorial.measure.lessons`, live rows or recorded ones alike,
and :func:`recorded_lesson` to read the ones the recorder kept."""

from __future__ import annotations

import dataclasses
import math
import statistics

from ..measure.lessons import INPUT_KINDS
from . import store
from .claims import TOLERANCES, Claim, agreement, compare, fmt_range, relative, same_point

LESSONS = ("precision", "cudnn_refusals", "gqa", "inputs")


def recorded_lesson(name: str, directory=None) -> tuple[list[dict] | None, str | None]:
    """(rows, where they came from) of lesson ``name`` ("precision", "cudnn_refusals", "gqa", "inputs") in the
    reference GPU's result file (in ``directory``, default the committed ones); (None, None) when not recorded."""
    if name not in LESSONS:
        raise ValueError(f"unknown lesson {name!r}; choose from {', '.join(LESSONS)}")
    data = store.recorded(store.REFERENCE_GPU, directory)
    rows = (data or {}).get("provenance", {}).get("lessons", {}).get(name)
    if not rows:
        return None, None
    return rows, store.describe(data["provenance"], "lessons")


def _ms(row) -> str:
    return f"{row['median_ms']:#.3g} ({row['p10_ms']:#.3g}–{row['p90_ms']:#.3g})"


def precision_table(rows) -> list[dict]:
    """Display rows of :func:`~attention_tutorial.measure.lessons.precision_rows`: error with its verdict against the tolerance, time with spread."""
    return [{"precision": r["precision"], "matmuls in": r["matmuls_in"], "max |out − float64|": f"{r['max_abs_error']:.1e}",
             "verdict": f"{agreement(r['max_abs_error'], r['matmuls_in']).word} (tolerance {TOLERANCES[r['matmuls_in']]:.0e})",
             f"ms per call at {r['time_shape']} (p10–p90)": _ms(r)} for r in rows]  # fmt: skip


def highest_vs_default(rows):
    """A :class:`~attention_tutorial.results.claims.Claim`: how "highest" runs against the default (value: default
    time / highest time, so below 1 means "highest" is slower; word "faster", "slower" or "on par")."""
    by = {r["precision"]: r for r in rows}
    return compare([by["highest"]], [by["default"]])


def refusal_table(rows) -> list[dict]:
    """Display rows of :func:`~attention_tutorial.measure.lessons.cudnn_refusal_rows`."""
    return [{"H": r["head_dim"], "dtype": r["dtype"], "our check (cudnn_why_not)": r["why_not"] or "runs",
             "JAX when cuDNN is forced": r["forced"]} for r in rows]  # fmt: skip


def refusals_consistent(rows) -> bool:
    """Whether our check and JAX agree on every row: refused by both, or run by both."""
    return all((r["why_not"] is None) == (r["forced"] == "runs") for r in rows)


def input_table(rows) -> list[dict]:
    """Display rows of :func:`~attention_tutorial.measure.lessons.input_rows`: TFLOP/s and time with spread per input kind."""
    return [{"inputs": r["inputs"], "matmul": f"{r['n']}×{r['n']} @ {r['n']}×{r['n']}, bf16", "TFLOP/s": f"{r['tflops']:.3g}",
             "ms per call (p10–p90)": _ms(r)} for r in rows]  # fmt: skip


def inputs_vs_random(rows) -> dict:
    """{kind: Claim} for zeros and ones against random inputs (value: random's time / kind's time; above 1 the
    constant inputs run faster; the word is "faster" only outside the spreads)."""
    by = {r["inputs"]: r for r in rows}
    return {kind: compare([by[kind]], [by["random normal"]]) for kind in INPUT_KINDS if kind != "random normal"}


def inputs_words(rows) -> str:
    """:func:`inputs_vs_random` as a clause: "zeros ran faster than random data (1.21×); ones ran …"."""
    return "; ".join(
        f"{kind} ran {relative(c, 'random data')} ({c.value:.2f}×)" for kind, c in inputs_vs_random(rows).items()
    )


def _unique(records) -> list[dict]:
    """Each record once, by content: the same recording loaded twice (two reads of one result file) counts once."""
    import json

    return list({json.dumps(r, sort_keys=True, default=str): r for r in records}.values())


def _claims_by_t(
    records, pool, want: dict, baseline: str, min_seq: int, base=(), narrow: str = "add it to by="
) -> dict[int, Claim]:
    """{T: how the records matching ``want`` compare with ``baseline`` at T} (T >= ``min_seq``): ours from
    ``records`` (several recordings of a point pooled), the baseline's from every recording in ``pool``."""
    from .claims import POINT_FIELDS

    at_t: dict[int, list] = {}
    for r in records:
        if all(r.get(f) == v for f, v in want.items()) and r["seq_q"] >= min_seq:
            at_t.setdefault(r["seq_q"], []).append(r)
    got = {}
    for t, mine in sorted(at_t.items()):
        if differ := [f for f in POINT_FIELDS if len({r.get(f) for r in mine}) > 1]:
            raise ValueError(f"{want['impl']}'s records at T = {t} differ in {', '.join(differ)}; {narrow} or pass "
                             f"records of one kind only.")  # fmt: skip
        if others := same_point(pool, mine[0], **dict(base, impl=baseline)):
            got[t] = compare(mine, others)  # several recordings of the point: pooled, as the baseline
    return got


def race_rows(
    records, everything, impls, *, baseline: str = "cudnn", min_seq: int = 4096, by=("head_dim",)
) -> list[dict]:
    """One row per implementation × mask × each value of ``by`` (say, H): its speed against ``baseline`` at the
    same points, T >= ``min_seq`` (the baseline's time over its own: 100 % = as fast), the range of the medians
    and of the spreads, and the verdict per T from the spreads. Every recording of the baseline at a point
    (``everything``: any grid, any run) widens its spread. Points the baseline did not run are left out."""
    from .claims import words_by_x
    from .plotting import label

    if isinstance(impls, str):
        raise ValueError(f"race_rows takes a tuple of implementation names; got the string {impls!r}.")
    pool = _unique([*everything, *records])  # each baseline recording once
    rows = []
    keys = sorted({tuple(r.get(f) for f in by) for r in records if r.get("impl") in impls})
    for impl in impls:
        for key in keys:
            for causal in (False, True):
                want = dict(zip(by, key), impl=impl, causal=causal, status="ok")
                got = _claims_by_t(records, pool, want, baseline, min_seq,
                                   narrow=f"race_rows: add it to by= (now {by})")  # fmt: skip
                if not got:
                    continue
                low, high = min(c.value for c in got.values()), max(c.value for c in got.values())
                rows.append({"implementation": label(impl),
                             **{("H" if f == "head_dim" else f): v for f, v in zip(by, key)},
                             "mask": "causal" if causal else "none",
                             f"speed vs {label(baseline)}, medians": fmt_range(100 * low, 100 * high, ".0f", " %"),
                             "from the spreads": fmt_range(100 * min(c.low for c in got.values()),
                                                           100 * max(c.high for c in got.values()), ".0f", " %"),
                             "verdict": words_by_x(got)})  # fmt: skip
    return rows


def ratio_by_t_words(
    records, everything, impl: str, baseline: str, *, causal: bool, where=(), baseline_where=()
) -> str:
    """``impl``'s speed against ``baseline`` at each T, medians, as '96.1 % at T = 4096, …, 89.8 % at T = 65536' (the
    records matching ``where``, pairs of field and value; the baseline's from every recording in ``everything``, at
    the same point but for the fields in ``baseline_where``, e.g. (("dtype", "bfloat16"),) to set FP8 against
    bf16); 'not recorded' when no point has both."""
    want = dict(where, impl=impl, causal=causal, status="ok")
    got = _claims_by_t(records, _unique([*everything, *records]), want, baseline, 0, base=baseline_where,
                       narrow="ratio_by_t_words: narrow where= to one value of it")  # fmt: skip
    if not got:
        return "not recorded"
    return ", ".join(f"{100 * c.value:.1f} % at T = {t}" for t, c in got.items())


def slower_words(rows, word: str = "slower") -> str:
    """From :func:`race_rows`' rows, the H and masks whose verdict finds the kernel ``word`` ('slower' or 'faster')
    at some T, as 'H = 64 with no mask, H = 64 causal, H = 128 causal'; 'none' when no row does."""
    hits = [f"H = {r['H']} {_mask_words(r['mask'])}" if "H" in r else _mask_words(r["mask"])
            for r in rows if word in r["verdict"]]  # fmt: skip
    return ", ".join(hits) or "none"


def fp8_error_words(
    records, rounding: float, where: str, *, ours: str = "mosaic_fp8_regs", theirs: str = "cudnn_fp8_s448"
) -> str:
    """Whether ``ours`` (bf16 output) and ``theirs`` (cuDNN's FP8 path, E4M3 output) differ in error once the output
    format is set apart: ``rounding`` is the error of rounding the exact output to E4M3 alone (computed ``where``,
    from :func:`attention_tutorial.measure.fp8.output_rounding_error`); ours with it added in quadrature (the two
    taken as independent) is set beside theirs at each point where both recorded an error, each side's recordings
    of a point pooled by their median (non-finite errors skipped). Alike within 10 %; where the points disagree,
    each is named."""
    from .claims import POINT_FIELDS
    from .plotting import _fmt_key

    def ok(r, impl):
        return r.get("impl") == impl and r.get("status") == "ok" and store._is_number(r.get("rel_error"))

    points: dict[tuple, dict] = {}  # each point once: several recordings of a side pooled by their median
    for r in records:
        if ok(r, ours) and (got := [o["rel_error"] for o in same_point(records, r, impl=theirs) if ok(o, theirs)]):
            key = tuple(r.get(f) for f in POINT_FIELDS)
            points.setdefault(key, {"rec": r, "ours": [], "theirs": got})["ours"].append(r["rel_error"])
    head = (f"cuDNN's FP8 path writes its output in E4M3, ours in bf16. Rounding the exact output to E4M3 as cuDNN's "
            f"path does, and nothing else, costs a relative error of {rounding:.3f} (computed by this build on "
            f"{where})")  # fmt: skip
    if not points:
        return head + "; no recorded point has both kernels' errors to set it beside."
    # each point named by its mask, T and whatever else sets it apart from points of the same mask and T (B = 2, …)
    at_t: dict[tuple, list] = {}
    for key in points:
        at_t.setdefault((key[POINT_FIELDS.index("causal")], key[POINT_FIELDS.index("seq_q")]), []).append(key)
    differ = [f for i, f in enumerate(POINT_FIELDS) if any(len({k[i] for k in keys}) > 1 for keys in at_t.values())]
    pairs = []  # (where, ours raw, ours with the rounding, theirs), by mask then T
    for p in sorted(points.values(), key=lambda p: (bool(p["rec"]["causal"]), p["rec"]["seq_q"])):
        mine, theirs_ = statistics.median(p["ours"]), statistics.median(p["theirs"])
        extra = "".join(f", {_fmt_key(f, p['rec'].get(f))}" for f in differ)
        at = f"{_mask_words('causal' if p['rec']['causal'] else 'none')} (T = {p['rec']['seq_q']}{extra})"
        pairs.append((at, mine, math.hypot(mine, rounding), theirs_))
    each = "; ".join(f"{c:.3f} against {t:.3f} {at}" for at, _, c, t in pairs)

    def word(c, t):
        x = c / t if t else math.inf
        return "alike" if abs(x - 1) <= 0.1 else "smaller" if x < 0.9 else "larger"

    words = [word(c, t) for _, _, c, t in pairs]
    if set(words) == {"alike"}:
        verdict = ("so ours is smaller because it writes bf16: with the same output rounding the two errors are "
                   "alike") if all(m < t for _, m, _, t in pairs) else (
                   "with the same output rounding the two errors are alike")  # fmt: skip
    elif set(words) == {"smaller"}:
        verdict = "so ours is smaller even with the same output rounding"
    elif set(words) == {"larger"}:
        verdict = "so with the same output rounding ours would be the larger"
    else:  # the points disagree: each said
        by_word: dict[str, list] = {}
        for (at, *_), w in zip(pairs, words):
            by_word.setdefault(w, []).append(at)
        verdict = "so with the same output rounding ours is " + "; ".join(
            f"{'about as large as' if w == 'alike' else w + ' than'} cuDNN's {', '.join(ats)}"
            for w, ats in by_word.items()
        )
    return f"{head}. Ours with that rounding added, √(ours² + {rounding:.3f}²), against cuDNN's: {each} — {verdict}."


@dataclasses.dataclass(frozen=True)
class Goal:
    """A speed goal: each of ``impls`` against ``baseline`` (same points, T >= ``min_seq``, fields ``where``) at
    ``target`` or above (the baseline's time over ours), and, where both carry one, no larger error."""

    what: str
    impls: tuple[str, ...]
    baseline: str
    target: float
    min_seq: int = 0
    where: tuple[tuple[str, object], ...] = ()


GOALS = (  # the goals of "Toward FlashAttention-3" (bf16 at T >= 8k), each judged on its own grid
    Goal("bf16, H = 128, T ≥ 8192", ("mosaic", "mosaic_pipe"), "cudnn", 1.05, 8192,
         (("grid", "beyond"), ("head_dim", 128))),
    Goal("bf16, H = 256, T ≥ 8192", ("mosaic", "mosaic_pipe"), "cudnn", 1.00, 8192,
         (("grid", "beyond"), ("head_dim", 256))),
    Goal("FP8, H = 128", ("mosaic_fp8_regs", "mosaic_fp8"), "cudnn_fp8_s448", 0.90, 0, (("grid", "fp8"),)),
)  # fmt: skip
MET = ("yes", "by the medians", "not judged", "no")  # goal_rows' verdicts, best first


def goal_targets_words(goals=GOALS) -> str:
    """The goals as a phrase: 'bf16, H = 128, T ≥ 8192: 105 % of cuDNN's speed; …'."""
    from .plotting import label

    return "; ".join(f"{g.what}: {100 * g.target:.0f} % of the speed of {label(g.baseline)}" for g in goals)


def goal_rows(records, everything=(), goals=GOALS) -> list[dict]:
    """One row per goal × implementation × mask that has a record: the speed reached against the goal's baseline at
    each T (range of the medians and of the spreads), the worst error pair against float32 where recorded (ours /
    the baseline's, at the T where ours is worst against it), the verdict ("met") and why.

    Verdicts (:data:`MET`): "no" if at some T the median is below the target, ours failed, or ours has the larger
    error; else "not judged" if at some T the baseline did not run; else "by the medians" if some spread reaches
    below the target; else "yes"."""
    from .plotting import label

    pool = _unique([*everything, *records])
    rows = []
    for goal in goals:
        for impl in goal.impls:
            for causal in (False, True):
                where = dict(goal.where, impl=impl, causal=causal)
                all_mine = [r for r in records if all(r.get(f) == v for f, v in where.items())
                            and r["seq_q"] >= goal.min_seq]  # fmt: skip
                if not all_mine:
                    continue
                got = _claims_by_t(records, pool, {**where, "status": "ok"}, goal.baseline, goal.min_seq,
                                   narrow=f"goal_rows: narrow the goal's where= (now {goal.where})")  # fmt: skip
                ok_t = {r["seq_q"] for r in all_mine if r["status"] == "ok"}
                failed = sorted({r["seq_q"] for r in all_mine if r["seq_q"] not in ok_t})
                unjudged = sorted(ok_t - set(got))
                below = [t for t, c in got.items() if c.value < goal.target]
                shaky = [t for t, c in got.items() if c.value >= goal.target and c.low < goal.target]
                pairs = {}  # T: (our error, the baseline's or None)
                for r in all_mine:
                    if r["status"] == "ok" and r.get("rel_error") is not None:
                        theirs = [o["rel_error"] for o in same_point(pool, r, impl=goal.baseline)
                                  if o.get("rel_error") is not None]  # fmt: skip
                        pairs[r["seq_q"]] = (r["rel_error"], max(theirs) if theirs else None)
                worse = sorted(t for t, (a, b) in pairs.items() if b is not None and a > b)
                why = [*([f"below the target at T = {_ts(below)}"] if below else []),
                       *([f"failed at T = {_ts(failed)}"] if failed else []),
                       *([f"a larger error than {label(goal.baseline)}'s at T = {_ts(worse)}"] if worse else []),
                       *([f"no {label(goal.baseline)} recorded at T = {_ts(unjudged)}"] if unjudged else []),
                       *([f"the spread reaches below the target at T = {_ts(shaky)}"] if shaky else [])]  # fmt: skip
                met = ("no" if below or failed or worse else "not judged" if unjudged or not got
                       else "by the medians" if shaky else "yes")  # fmt: skip
                rows.append({"goal": goal.what, "implementation": label(impl), "mask": "causal" if causal else "none",
                             "against": label(goal.baseline), "target": f"≥ {100 * goal.target:.0f} %",
                             "reached (medians)": _pct_range([c.value for c in got.values()], goal.target),
                             "from the spreads": _pct_range([c.low for c in got.values()]
                                                            + [c.high for c in got.values()], goal.target),
                             "error vs float32 (ours / theirs)": _worst_pair(pairs),
                             "met": met, "why": "; ".join(why) or "–",
                             "_lowest": min((c.value for c in got.values()), default=0.0)})  # fmt: skip
    return rows


def _ts(ts) -> str:
    return ", ".join(str(t) for t in ts)


def _pct_range(values, target: float) -> str:
    """'97–101 %'; one decimal where whole percents would round a value across the target (89.6 % is not 90 %)."""
    if not values:
        return "–"
    low, high = min(values), max(values)
    crosses = any(round(100 * v) == round(100 * target) and v < target for v in (low, high))
    return fmt_range(100 * low, 100 * high, ".1f" if crosses else ".0f", " %")


def _worst_pair(pairs: dict) -> str:
    """The T where our error is largest against the baseline's ('0.053 / 0.059'), or ours alone ('0.050 / –')."""
    if not pairs:
        return "–"
    t = max(pairs, key=lambda t: (pairs[t][1] is None, pairs[t][0] / pairs[t][1] if pairs[t][1] else pairs[t][0]))
    ours, theirs = pairs[t]
    return f"{ours:.3f} / {theirs:.3f}" if theirs is not None else f"{ours:.3f} / –"


def goal_words(rows, goals=GOALS) -> str:
    """One line per goal: met or not for each mask (a mask with no record says so), the implementation that came
    closest (the best verdict, then the highest lowest median over T) with its range, and why it falls short."""
    out = []
    for goal in goals:
        mine = [r for r in rows if r["goal"] == goal.what]
        if not mine:
            out.append(f"**{goal.what}**: not judged, nothing recorded.")
            continue
        best = {}
        for mask in ("none", "causal"):
            if at := [r for r in mine if r["mask"] == mask]:
                best[mask] = min(at, key=lambda r: (MET.index(r["met"]), -r["_lowest"]))
        verdicts = {m: r["met"] for m, r in best.items()}
        missing = [m for m in ("none", "causal") if m not in best]
        if all(v == "yes" for v in verdicts.values()) and not missing:
            verdict = "met" + (" (by different kernels for the two masks)"
                               if len({r["implementation"] for r in best.values()}) > 1 else "")  # fmt: skip
        elif all(v in ("yes", "by the medians") for v in verdicts.values()) and not missing:
            verdict = "met by the medians, not clear of the spreads"
        elif any(v == "yes" for v in verdicts.values()):
            verdict = "met only " + " and ".join(_mask_words(m) for m, v in verdicts.items() if v == "yes")
        else:
            verdict = "not met"
        parts = [f"{_mask_words(m)}: {r['implementation']}, {r['reached (medians)']} of the speed of {r['against']}"
                 + ("" if r["why"] == "–" else f" ({r['why']})") for m, r in best.items()]  # fmt: skip
        parts += [f"{_mask_words(m)}: not judged, nothing recorded" for m in missing]
        out.append(f"**{goal.what}** (target {mine[0]['target']}): {verdict}. Closest: {'; '.join(parts)}.")
    return "\n".join(f"- {line}" for line in out)


def _mask_words(mask: str) -> str:
    return "with no mask" if mask == "none" else "causal"


def code_shape_words(code: dict) -> str:
    """The shape the recorded ``kernel_code`` entries were compiled at, 'B = 4, T = 4096, N = 16, H = 128' (or
    'H = 128 or 256' where the head sizes differ); '' when B, T or N differ or an entry does not say."""
    shapes = {(rec.get("batch"), rec.get("seq_q"), rec.get("heads")) for rec in code.values()}
    heads = sorted({rec.get("head_dim") for rec in code.values()}, key=lambda h: (h is None, h))
    if len(shapes) != 1 or None in (shape := next(iter(shapes))) or not heads or None in heads:
        return ""
    return "B = {}, T = {}, N = {}, H = {}".format(*shape, " or ".join(map(str, heads)))


CODE_NAMES = {"pallas": "our Triton-lowered", "jax_pallas": "JAX's Triton-lowered", "mosaic": "our Mosaic GPU",
              "jax_mosaic": "JAX's Mosaic GPU", "mosaic_pipe": "our Mosaic GPU, pipelined",
              "mosaic_fp8": "our Mosaic GPU, FP8, p via shared memory",
              "mosaic_fp8_regs": "our Mosaic GPU, FP8, p in registers"}  # fmt: skip


def code_name(key: str) -> str:
    """A ``kernel_code`` key ('mosaic_pipe bfloat16 causal H=256', see
    :func:`attention_tutorial.measure.kernel_code.code_key`) in words: 'our Mosaic GPU, pipelined, causal, H = 256';
    the input dtype named only where it is not bf16 (our FP8 forward's inputs are bf16: quantised inside)."""
    impl, dtype, *rest = key.split()
    words = [CODE_NAMES.get(impl, impl), *([dtype] if dtype != "bfloat16" else [])]
    words += ["causal" if r == "causal" else r.replace("=", " = ") for r in rest]
    return ", ".join(words)


def serialised_words(code: dict) -> str:
    """Which recorded kernels ``ptxas`` serialised (its C75xx warnings on the warpgroup matmuls), from the
    recorder's ``kernel_code`` entries ({"impl dtype[ causal]": {..., "wgmma_serialised": ["C7513: …"]}}); entries
    whose ``ptxas`` output was not read (no registers and no warning: recorded before the warnings were kept, or
    compiled inside XLA) say nothing either way and are left out. Names the shape when all entries share one, and
    each kernel as the code table does (:func:`code_name`)."""
    # an empty list says "no warning" only where ptxas's output was read, i.e. where it gave registers too (the
    # kernels compiled inside XLA, the Triton-lowered ones, keep neither: not known)
    known = {key: rec["wgmma_serialised"] for key, rec in code.items()
             if rec.get("wgmma_serialised") or ("wgmma_serialised" in rec and rec.get("registers"))}  # fmt: skip
    if not known:
        return "No recorded kernel says whether `ptxas` serialised its warpgroup matmuls."
    n = len(known)
    at = f" (all at {shape})" if (shape := code_shape_words({k: code[k] for k in known})) else ""
    kernels = f"{n} recorded kernel{'s' if n > 1 else ''} whose `ptxas` output was read{at}"
    bad = {key: sorted({w.split(":")[0] for w in warn}) for key, warn in known.items() if warn}
    if not bad:
        return (f"None of the {kernels} got a serialisation warning from `ptxas`." if n > 1 else
                f"The {kernels} got no serialisation warning from `ptxas`.")  # fmt: skip
    said = "; ".join(f"{code_name(key)} (warning {', '.join(codes)})" for key, codes in bad.items())
    return f"Of the {kernels}, `ptxas` serialised the warpgroup matmuls of {len(bad)}: {said}."
