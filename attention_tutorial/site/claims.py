"""Verdicts the pages read from measurements: each function returns a value and the word the data allow.

A page never types "faster", "exactly" or "grows with T²" by hand: it asks one of these functions, which looks at
the data (and its spread) and picks the word. ``tests/site/test_claims.py`` checks the words against the committed
result files.

- :func:`compare` — is A faster than B? Only when their timing ranges do not overlap; otherwise "on par".
- :func:`growth`, :func:`growth_terms` — how a quantity grows with x: "stays flat", "grows linearly", ...
- :func:`agreement` — do two results agree, to the rounding of their dtype (tolerances in :data:`TOLERANCES`)?
- :func:`loss_agreement` — do training runs through different implementations trace the same loss curve?
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

import numpy as np

from ..results import store
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


def relative(claim: Claim, other: str) -> str:
    """A :func:`compare` claim as a phrase about ``other``: "faster than X", "slower than X" or "on par with X"."""
    return f"on par with {other}" if claim.word == "on par" else f"{claim.word} than {other}"


def growth(xs, ys, var: str = "x") -> Claim:
    """How ``ys`` grows per doubling of ``xs``: value = the factor per doubling of a least-squares fit in log-log,
    low/high = the smallest and largest factor between neighbouring points (scaled to one doubling). The word names
    the exponent p of y ∝ x**p: "stays flat", "grows linearly", "grows quadratically", or "grows as x^p"."""
    pts = sorted((x, y) for x, y in zip(xs, ys) if x and y)
    if len(pts) < 2:
        raise ValueError(f"growth needs two points with positive x and y; got {list(zip(xs, ys))}")
    lx, ly = np.log2([x for x, _ in pts]), np.log2([y for _, y in pts])
    if lx[0] == lx[-1]:
        raise ValueError("growth needs at least two distinct x values")
    p = float(((lx - lx.mean()) * (ly - ly.mean())).sum() / ((lx - lx.mean()) ** 2).sum())  # least squares
    apart = np.diff(lx) > 0
    steps = 2 ** (np.diff(ly)[apart] / np.diff(lx)[apart])
    named = {0: "stays flat", 1: "grows linearly", 2: "grows quadratically"}
    word = next(
        (w for e, w in named.items() if abs(p - e) < 0.3), f"{'shrinks' if p < 0 else 'grows'} as {var}^{p:.1f}"
    )
    return Claim(2**p, float(steps.min()), float(steps.max()), word)


FIT_TOLERANCE = 0.05  # growth_terms: a fit is good enough when its rms error is at most 5 % of the largest y


def growth_terms(xs, ys, var: str = "x") -> Claim:
    """How ``ys`` grows, as the parts of the best fit y = a + b·x + c·x² with non-negative a, b, c that make at least
    10 % of y at the largest x: 'stays flat', 'grows linearly', 'grows quadratically', or a sum such as 'is a
    constant part plus one linear in T'. Of the fits within :data:`FIT_TOLERANCE`, the one with the lowest power
    and fewest terms is taken. A power law (:func:`growth`) calls 14 → 21 MiB over T ×8 "flat" although
    the increments double with T; this names the constant and the linear part. Value, low, high as :func:`growth`."""
    g = growth(xs, ys, var)
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    powers = {"constant": 0, "linear": 1, "quadratic": 2}
    fits = []  # (rms error / largest y, highest power, number of terms, {term: its part of y at the largest x})
    for k in (1, 2, 3):
        for names in itertools.combinations(powers, k):
            a = np.stack([x ** powers[n] for n in names], axis=1)
            coef = np.linalg.lstsq(a, y, rcond=None)[0]
            if np.all(coef >= 0):
                rms = float(np.sqrt(np.mean((a @ coef - y) ** 2))) / (float(np.abs(y).max()) or 1.0)
                fits.append((rms, powers[names[-1]], k, {n: c * x.max() ** powers[n] for n, c in zip(names, coef)}))
    if not fits:  # no non-negative fit (falling data): the power law's word
        return g
    # The simplest fit that is good enough, else the closest: a dip at one point must not turn a linear series into
    # a "quadratic" one (4.0, 3.8, 4.8, 6.8 MiB over T ×8); never much worse than the closest (an exact fit wins).
    closest = min(f[0] for f in fits)
    good = [f for f in fits if f[0] <= min(FIT_TOLERANCE, 2 * closest + 0.005)]
    share = (min(good, key=lambda f: (f[1], f[2], f[0])) if good else min(fits, key=lambda f: f[0]))[3]
    parts = [n for n, s in share.items() if s >= 0.1 * (sum(share.values()) or 1.0)]
    if len(parts) == 1:
        word = {"constant": "stays flat", "linear": f"grows linearly in {var}"}.get(
            parts[0], f"grows quadratically in {var}"
        )
    else:
        said = [{"constant": "a constant part"}.get(n, f"one {n} in {var}") for n in parts]
        word = "is " + " plus ".join([said[0].replace("one ", "a part "), *said[1:]])
    first, last = np.argmin(x), np.argmax(x)
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
    runs: list[tuple[str, list]] = []  # (word, neighbouring x that share it)
    for x, c in claims_at.items():
        if runs and runs[-1][0] == c.word:
            runs[-1][1].append(x)
        else:
            runs.append((c.word, [x]))
    if len({w for w, _ in runs}) == 1:
        return runs[0][0]
    said: dict[str, list[str]] = {}
    for w, xs in runs:
        said.setdefault(w, []).append(f"{xs[0]}–{xs[-1]}" if len(xs) >= 3 else ", ".join(map(str, xs)))
    return "; ".join(f"{w} at T = {', '.join(s)}" for w, s in said.items())


def versus(records, impl: str, baseline: str = "cudnn", *, min_seq: int = 0, **where) -> dict[int, Claim]:
    """{T: how ``impl`` compares with ``baseline`` at T} over the ok records matching ``where`` (T >= ``min_seq``);
    every record of the baseline at the same point (any grid, any recording run) widens its spread."""
    out = {}
    for r in store.select(records, impl=impl, status="ok", **where):
        if r["seq_q"] >= min_seq and (others := same_point(records, r, impl=baseline)):
            out[r["seq_q"]] = compare([r], others)
    return dict(sorted(out.items()))


LOSS_ULPS = 4  # the noise floor is never below this many float32 steps of the largest loss compared: a difference
# of one step is the last bit of the loss itself, not a kernel's doing
COARSE = 0.5  # a noise floor at least this fraction of the loss's step-to-step movement is too coarse to tell
# small differences apart (a kernel off by half a step's movement would still pass)


def _losses(step_records) -> dict[str, dict[int, float]]:
    by: dict[str, dict[int, float]] = {}
    for r in step_records:
        by.setdefault(r["impl"], {})[r["step"]] = r["loss"]
    return by


@dataclass(frozen=True)
class LossYardstick:
    """What :func:`loss_agreement` judges a training run's loss curves against. ``first``: the implementation the
    others are compared with, over ``steps`` logged steps; ``noise``: the largest loss gap between it and its twin
    (the same run from weights nudged by one rounding step; None without a twin); ``limit``: the largest distance
    that counts as rounding noise (``noise``, at least ``floor``; None without a twin); ``floor``: :data:`LOSS_ULPS`
    float32 steps of the largest loss; ``motion``: how much ``first``'s loss moves from one logged step to the next
    (the median over the second half of training), for scale."""

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
        return bool(self.noise) and self.motion is not None and self.limit >= COARSE * self.motion


def loss_yardstick(step_records) -> LossYardstick | None:
    """:class:`LossYardstick` of ``step_records`` (kind "step" records of one training run); None without any."""
    by = _losses(step_records)
    first = next((i for i in by if not i.endswith(TWIN)), None)
    if first is None:
        return None
    base, twin = by[first], by.get(first + TWIN, {})
    shared = set(base) & set(twin)
    noise = max(abs(base[s] - twin[s]) for s in shared) if shared else None
    floor = LOSS_ULPS * float(np.spacing(np.float32(max(abs(r["loss"]) for r in step_records))))
    losses = [base[s] for s in sorted(base)]
    moves = [abs(b - a) for a, b in itertools.pairwise(losses[len(losses) // 2 :])]
    limit = None if noise is None else max(noise, floor)
    return LossYardstick(first, len(base), noise, limit, floor, statistics.median(moves) if moves else None)


def loss_agreement(step_records, dtype: str) -> dict[str, Claim]:
    """Per implementation after the first one in ``step_records`` (kind "step" records of one training run): its
    largest loss difference from the first one's at the same logged steps, judged against rounding.

    With a twin run (see :class:`LossYardstick`) a run is measured against the nearer of the two curves rounding
    alone produced (the first one and its twin: a spike of the first run's own is then not held against the others):
    within the yardstick's ``limit`` it reads "agree within rounding noise", else "differ by more than rounding
    noise" (the claim's value is that nearer distance, ``high`` the limit). Without a twin, or where the twin did not
    log a step the run did, the attention-output tolerance of ``dtype`` judges (:func:`agreement`)."""
    y = loss_yardstick(step_records)
    if y is None:
        return {}
    by = _losses(step_records)
    base, twin = by[y.first], by.get(y.first + TWIN, {})
    out = {}
    for impl, losses in by.items():
        steps = set(losses) & set(base)
        if impl == y.first or impl.endswith(TWIN) or not steps:
            continue
        diff = max(abs(losses[s] - base[s]) for s in steps)
        if y.limit is None or not steps <= set(twin):
            out[impl] = agreement(diff, dtype)
            continue
        diff = min(diff, max(abs(losses[s] - twin[s]) for s in steps))
        word = "agree within rounding noise" if diff <= y.limit else "differ by more than rounding noise"
        out[impl] = Claim(float(diff), 0.0, y.limit, word)
    return out
