"""Claims the pages make about measurements, computed from records: each returns its value and its wording.

A page never types "faster", "exactly" or "grows with T²" by hand: it asks one of these functions, which looks at
the data (and its spread) and picks the word. ``tests/site/test_claims.py`` checks every word against the
committed result files.

- :func:`compare` — is A faster than B? Only when their timing spreads do not overlap; otherwise "on par".
- :func:`growth` — how a quantity grows per doubling of x: "stays flat", "grows linearly", "grows quadratically".
- :func:`agreement` — do two results agree, to the rounding of their dtype (tolerances in :data:`TOLERANCES`)?
- :func:`loss_agreement` — do training runs through different implementations trace the same loss curve?
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

import numpy as np

from ..train import TWIN  # the suffix of a twin run's implementation name

#: Largest max-abs difference between two attention outputs (unit-variance inputs) that is still rounding, per dtype
#: of the computation. "tf32" is float32 whose matmuls run on TF32 tensor cores (10 stored mantissa bits), the
#: default for float32 matmuls on NVIDIA GPUs in JAX.
TOLERANCES = {"float64": 1e-12, "float32": 1e-5, "tf32": 2e-3, "float16": 2e-3, "bfloat16": 2e-2, "float8": 0.25}
#: Stored mantissa bits (the leading 1 is implicit and not counted), one convention for every format on the site.
MANTISSA_BITS = {"float32": 23, "tf32": 10, "float16": 10, "bfloat16": 7, "float8_e4m3fn": 3, "float8_e5m2": 2}


@dataclass(frozen=True)
class Claim:
    """A measured value, its plausible range (low, high) and the word the data allow."""

    value: float
    low: float
    high: float
    word: str

    def __str__(self) -> str:
        return self.word


def spread_ms(records) -> tuple[float, float, float]:
    """(median, low, high) of the time of one point: the median of the records' medians, and the widest p10–p90
    over them (several records of one point, from several grids or recording runs, widen the range)."""
    recs = [r for r in records if r.get("status", "ok") == "ok" and r.get("median_ms") is not None]
    if not recs:
        raise ValueError("spread_ms needs at least one ok record with median_ms; got none")
    meds = [r["median_ms"] for r in recs]
    if not all(isinstance(m, (int, float)) and math.isfinite(m) and m > 0 for m in meds):
        raise ValueError(f"spread_ms needs positive finite medians; got {meds}")
    meds.sort()
    low = min(r.get("p10_ms") or r["median_ms"] for r in recs)
    high = max(r.get("p90_ms") or r["median_ms"] for r in recs)
    return statistics.median(meds), min(low, meds[0]), max(high, meds[-1])


def compare(a_records, b_records) -> Claim:
    """How fast A is against B: value = B's time / A's time (above 1: A faster), low/high from the spreads.

    The word is "faster" or "slower" only when A's and B's time ranges (p10–p90, over every record given for the
    point) do not overlap, else "on par".
    """
    a, a_lo, a_hi = spread_ms(a_records)
    b, b_lo, b_hi = spread_ms(b_records)
    word = "faster" if a_hi < b_lo else "slower" if a_lo > b_hi else "on par"
    return Claim(b / a, b_lo / a_hi, b_hi / a_lo, word)


def paired_compare(a_records, b_records, key: str = "step") -> Claim:
    """How fast A is against B, pairing records that share ``key`` (say, the same logged window of two training
    runs): value = the median of B's time / A's time over the pairs (above 1: A faster), low/high = its p10/p90.
    The word is "faster" or "slower" only when at least 90 % of the pairs say so, else "on par". Pairing keeps a
    drift that both runs share (a GPU's clock, a step time growing over a run) out of the comparison."""
    b_by = {r[key]: r["median_ms"] for r in b_records if r.get("status", "ok") == "ok" and r.get("median_ms")}
    ratios = sorted(
        b_by[r[key]] / r["median_ms"]
        for r in a_records
        if r.get("status", "ok") == "ok" and r.get("median_ms") and r[key] in b_by
    )
    if not ratios:
        raise ValueError(f"paired_compare needs records of A and B sharing {key!r}; got none")
    lo, mid, hi = (float(x) for x in np.percentile(ratios, [10, 50, 90]))
    word = "faster" if lo > 1 else "slower" if hi < 1 else "on par"
    return Claim(mid, lo, hi, word)


def relative(claim: Claim, other: str) -> str:
    """A :func:`compare` claim as a phrase about ``other``: "faster than X", "slower than X" or "on par with X"."""
    return f"on par with {other}" if claim.word == "on par" else f"{claim.word} than {other}"


def exponent_word(p: float, var: str = "x") -> str:
    """Name a growth exponent (y ∝ x**p): 'stays flat', 'grows linearly', 'grows quadratically', or 'grows as x^p'."""
    if abs(p) < 0.3:
        return "stays flat"
    if abs(p - 1) < 0.3:
        return "grows linearly"
    if abs(p - 2) < 0.3:
        return "grows quadratically"
    return f"{'shrinks' if p < 0 else 'grows'} as {var}^{p:.1f}"


def growth(xs, ys, var: str = "x") -> Claim:
    """How ``ys`` grows per doubling of ``xs``: value = the factor per doubling of a least-squares fit in log-log,
    low/high = the smallest and largest factor between neighbouring points (scaled to one doubling)."""
    pts = sorted((x, y) for x, y in zip(xs, ys) if x and y)
    if len(pts) < 2:
        raise ValueError(f"growth needs two points with positive x and y; got {list(zip(xs, ys))}")
    lx, ly = [math.log2(x) for x, _ in pts], [math.log2(y) for _, y in pts]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((u - mx) ** 2 for u in lx)
    if den == 0:
        raise ValueError("growth needs at least two distinct x values")
    p = sum((u - mx) * (w - my) for u, w in zip(lx, ly)) / den
    steps = [2 ** ((ly[i + 1] - ly[i]) / (lx[i + 1] - lx[i])) for i in range(len(pts) - 1) if lx[i + 1] > lx[i]]
    return Claim(2**p, min(steps), max(steps), exponent_word(p, var))


FIT_TOLERANCE = 0.05  # growth_terms: a fit is good enough when its rms error is at most 5 % of the largest y


def growth_terms(xs, ys, var: str = "x") -> Claim:
    """How ``ys`` grows, as the parts of the best fit y = a + b·x + c·x² with non-negative a, b, c that make at least
    10 % of y at the largest x: 'stays flat', 'grows linearly', 'grows quadratically', or a sum such as 'is a
    constant part plus one linear in T'. Of the fits within :data:`FIT_TOLERANCE`, the one with the lowest power
    and fewest terms is taken. A power law (:func:`growth`) calls 14 → 21 MiB over T ×8 "flat" although
    the increments double with T; this names the constant and the linear part. Value, low, high as :func:`growth`."""
    g = growth(xs, ys, var)
    x = np.asarray([float(v) for v in xs])
    y = np.asarray([float(v) for v in ys])
    cols = {"constant": np.ones_like(x), "linear": x, "quadratic": x**2}
    fits = []  # (rms error / largest y, highest power, number of terms, {term: coefficient})
    for k in range(1, 4):
        for names in itertools.combinations(cols, k):
            a = np.stack([cols[n] for n in names], axis=1)
            coef, *_ = np.linalg.lstsq(a, y, rcond=None)
            if np.all(coef >= 0):
                rms = float(np.sqrt(np.mean((a @ coef - y) ** 2))) / (float(np.abs(y).max()) or 1.0)
                fits.append((rms, max(list(cols).index(n) for n in names), k, dict(zip(names, coef))))
    if not fits:  # no non-negative fit (falling data): the power law's word
        return g
    # The simplest fit that is good enough (within FIT_TOLERANCE of the largest y), else the closest: a dip at
    # one point must not turn a linear series into a "quadratic" one (4.0, 3.8, 4.8, 6.8 MiB over T ×8).
    closest = min(f[0] for f in fits)  # ... and never much worse than the closest fit (an exact one must win)
    good = [f for f in fits if f[0] <= min(FIT_TOLERANCE, 2 * closest + 0.005)]
    best = min(good, key=lambda f: (*f[1:3], f[0])) if good else min(fits, key=lambda f: f[0])
    best = (best[0], best[3])
    at = x.max()
    share = {n: c * (1 if n == "constant" else at if n == "linear" else at**2) for n, c in best[1].items()}
    total = sum(share.values()) or 1.0
    parts = [n for n in ("constant", "linear", "quadratic") if share.get(n, 0) >= 0.1 * total]
    single = {
        "constant": "stays flat",
        "linear": f"grows linearly in {var}",
        "quadratic": f"grows quadratically in {var}",
    }
    if len(parts) == 1:
        word = single[parts[0]]
    else:
        named = {
            "constant": "a constant part",
            "linear": f"one linear in {var}",
            "quadratic": f"one quadratic in {var}",
        }
        word = "is " + " plus ".join(
            named[n] if i else named[n].replace("one ", "a part ") for i, n in enumerate(parts)
        )
    first, last = int(np.argmin(x)), int(np.argmax(x))
    if y[first] > 0 and y[last] / y[first] > 1.1 * (x[last] / x[first]) ** 2:
        word += f" (faster than {var}² over this range: ×{y[last] / y[first]:.1f} for {var} ×{x[last] / x[first]:g})"
    return Claim(g.value, g.low, g.high, word)


def agreement(diff: float, dtype: str) -> Claim:
    """Whether a max-abs difference between two results is rounding in ``dtype`` (see :data:`TOLERANCES`).

    Words: "are exactly equal" (0), "agree to within {dtype} rounding", or "differ by more than {dtype} rounding".
    """
    if dtype not in TOLERANCES:
        raise ValueError(f"no tolerance for dtype {dtype!r}; choose from {sorted(TOLERANCES)}")
    tol = TOLERANCES[dtype]
    if diff == 0:
        word = "are exactly equal"
    elif diff <= tol:
        word = f"agree to within {dtype} rounding"
    else:
        word = f"differ by more than {dtype} rounding"
    return Claim(float(diff), 0.0, tol, word)


def fmt_range(low: float, high: float, fmt: str = ".2f", unit: str = "") -> str:
    """'1.10–1.30×' or '1.20×' when both ends print the same."""
    a, b = format(low, fmt), format(high, fmt)
    return f"{a}{unit}" if a == b else f"{a}–{b}{unit}"


POINT_FIELDS = ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim", "dtype", "causal", "pass", "mask")


def same_point(records, rec, **override) -> list[dict]:
    """The ok records (of any grid or recording run) measured at ``rec``'s exact problem, with ``override`` fields."""
    want = {f: rec.get(f) for f in POINT_FIELDS} | override
    return [r for r in records if r.get("status") == "ok" and all(r.get(f) == v for f, v in want.items())]


def words_by_x(claims_at: dict) -> str:
    """One phrase for several claims keyed by x (in order): 'on par' when all agree, else e.g. 'slower at
    T = 1024–16384; on par at T = 32768' (three or more neighbouring x with one word read as a range)."""
    xs = list(claims_at)
    groups: dict[str, list[list]] = {}
    for i, x in enumerate(xs):
        word = claims_at[x].word
        runs = groups.setdefault(word, [])
        if runs and xs.index(runs[-1][-1]) == i - 1:
            runs[-1].append(x)  # the neighbour of the run before
        else:
            runs.append([x])
    if len(groups) == 1:
        return next(iter(groups))

    def said(run):
        return f"{run[0]}–{run[-1]}" if len(run) >= 3 else ", ".join(map(str, run))

    return "; ".join(f"{w} at T = {', '.join(said(r) for r in runs)}" for w, runs in groups.items())


def versus(records, impl: str, baseline: str = "cudnn", *, min_seq: int = 0, **where) -> dict[int, Claim]:
    """{T: how ``impl`` compares with ``baseline`` at T} over the ok records matching ``where`` (T >= ``min_seq``);
    every record of the baseline at the same point (any grid, any recording run) widens its spread."""
    out = {}
    for r in records:
        if r.get("impl") != impl or r.get("status") != "ok" or r["seq_q"] < min_seq:
            continue
        if any(r.get(f) != v for f, v in where.items()):
            continue
        others = same_point(records, r, impl=baseline)
        if others:
            out[r["seq_q"]] = compare([r], others)
    return dict(sorted(out.items()))


TWIN_FACTOR = 1.0  # a loss difference up to this many times the twin's counts as rounding noise (nudging every
# weight by one rounding step already moves the curve more than a kernel's rounding does: no margin on top). The
# reference and its twin are two samples of the same noise, so a run is judged by the nearer of the two.


LOSS_ULPS = 4  # the yardstick is never below this many float32 steps of the largest loss compared: a difference
# of one step is the last bit of the loss itself, not a kernel's doing


def loss_floor(step_records) -> float:
    """:data:`LOSS_ULPS` float32 steps (``np.spacing``) of the largest loss in ``step_records``."""
    top = max((abs(r["loss"]) for r in step_records), default=1.0)
    return LOSS_ULPS * float(np.spacing(np.float32(top)))


def _losses(step_records) -> dict[str, dict[int, float]]:
    by: dict[str, dict[int, float]] = {}
    for r in step_records:
        by.setdefault(r["impl"], {})[r["step"]] = r["loss"]
    return by


def _max_diff(a: dict, b: dict) -> float | None:
    common = set(a) & set(b)
    return max(abs(a[s] - b[s]) for s in common) if common else None


def loss_noise(step_records) -> float | None:
    """The rounding-noise yardstick of a training comparison: the largest loss difference between the first
    implementation and its twin (the same run from weights nudged by one rounding step); None without a twin."""
    by = _losses(step_records)
    plain = [i for i in by if not i.endswith(TWIN)]
    if not plain or plain[0] + TWIN not in by:
        return None
    return _max_diff(by[plain[0]], by[plain[0] + TWIN])


def _twin_covers(by, impl: str, first: str) -> bool:
    """Whether ``first``'s twin logged every step that ``impl`` and ``first`` both logged (so it can judge them)."""
    return set(by[impl]) & set(by[first]) <= set(by.get(first + TWIN, {}))


def loss_agreement(step_records, dtype: str) -> dict[str, Claim]:
    """Per implementation after the first one in ``step_records`` (kind "step" records of one training run): its
    largest loss difference from the first one's at the same logged steps, judged against rounding.

    With a twin run (see :func:`loss_noise`) the yardstick is how far rounding alone moved the curve, and a run is
    measured against the nearer of the two curves rounding alone produced (the first one and its twin: a spike of
    the first run's own is then not held against the others): up to :data:`TWIN_FACTOR` times the twin's difference
    reads "agree within rounding noise", more "differ by more than rounding noise" (``high`` is that limit; the
    claim's value is that nearer distance; a run within the yardstick of the twin may sit up to twice it from the
    first). All three distances run over the same logged steps; without a twin, or where the twin did not log a
    step the run did, the attention-output tolerance of ``dtype`` (:func:`agreement`)."""
    by = _losses(step_records)
    plain = [i for i in by if not i.endswith(TWIN)]
    if not plain:
        return {}
    first, *others = plain
    noise = loss_noise(step_records)  # over the steps the first run and its twin share
    out = {}
    for o in others:
        diff = _max_diff(by[o], by[first])
        if diff is None:
            continue
        if noise is not None and _twin_covers(by, o, first):  # all three distances over the same logged steps
            twin = by[first + TWIN]
            on = {s_: (by[o][s_], by[first][s_], twin[s_]) for s_ in set(by[o]) & set(by[first])}  # (run, first, twin)
            diff = min(max(abs(a - b) for a, b, _ in on.values()), max(abs(a - t) for a, _, t in on.values()))
            limit = max(TWIN_FACTOR * noise, loss_floor(step_records))
            word = "agree within rounding noise" if diff <= limit else "differ by more than rounding noise"
            out[o] = Claim(float(diff), 0.0, limit, word)
        else:
            out[o] = agreement(diff, dtype)
    return out


def loss_motion(step_records, impl: str) -> float | None:
    """How much ``impl``'s loss moves from one logged step to the next (median over the second half of training):
    the yardstick a loss difference between implementations is read against."""
    losses = [r["loss"] for r in sorted((r for r in step_records if r["impl"] == impl), key=lambda r: r["step"])]
    half = losses[len(losses) // 2 :]
    moves = [abs(b - a) for a, b in itertools.pairwise(half)]
    return statistics.median(moves) if moves else None


COARSE = 0.5  # a twin yardstick at least this fraction of the loss's step-to-step movement is too coarse to tell
# small differences apart (a kernel off by half a step's movement would still pass)


@dataclass(frozen=True)
class LossYardstick:
    """What :func:`loss_agreement` judged a training run's loss curves against, with the loss's own movement for
    scale. ``first``: the implementation the others are compared with, over ``steps`` logged steps; ``noise``: how
    far its twin's curve strayed from its own (None without a twin); ``limit``: the largest distance that counts as
    rounding noise (:data:`TWIN_FACTOR` × noise, at least ``floor``; None without a twin); ``floor``:
    :data:`LOSS_ULPS` float32 steps of the loss; ``motion``: :func:`loss_motion` of ``first``."""

    first: str
    steps: int
    noise: float | None
    limit: float | None
    floor: float
    motion: float | None

    @property
    def coarse(self) -> bool:
        """Whether the limit is at least :data:`COARSE` × the loss's step-to-step movement (a loss that does not
        move included): too coarse to tell small differences apart. False without a twin that moved."""
        if not self.noise or self.motion is None:
            return False
        return self.limit >= COARSE * self.motion


def loss_yardstick(step_records) -> LossYardstick | None:
    """:class:`LossYardstick` of ``step_records`` (kind "step" records of one training run); None without any."""
    plain = [i for i in _losses(step_records) if not i.endswith(TWIN)]
    if not plain:
        return None
    first, noise, floor = plain[0], loss_noise(step_records), loss_floor(step_records)
    steps = len({r["step"] for r in step_records if r["impl"] == first})
    limit = None if noise is None else max(TWIN_FACTOR * noise, floor)
    return LossYardstick(first, steps, noise, limit, floor, loss_motion(step_records, first))


def device_speed_ratios(records, impl: str, base: str) -> dict[bool, tuple[float, float]]:
    """Per causal flag, ``impl``'s speed as a fraction of ``base``'s at the same point of a ``device_time`` grid:
    (on the summed kernel time the profiler measured, on the host's pipelined median). Points where either did not
    run are left out; a grid with two points of one flag is refused (one ratio per flag would hide one of them)."""
    out = {}
    for r in records:
        if r["impl"] != impl or r.get("status") != "ok" or not r.get("device_ms"):
            continue
        other = [o for o in same_point(records, r, impl=base) if o.get("device_ms")]
        if other:
            o = other[0]
            if r["causal"] in out:
                raise ValueError(
                    f"device_speed_ratios: {impl} has two device-time points with causal={r['causal']}; "
                    "two recordings or two shapes; pass one recording of one shape."
                )
            out[r["causal"]] = (o["device_ms"] / r["device_ms"], o["median_ms"] / r["median_ms"])
    return out
