"""What the scaling page needs: the few points a build runs live, the IO argument (bytes computed from the shapes
set against the recorded times, as a time budget and a roofline), and the numbers of each section (T, memory, B, H,
the backward pass). Numbers and verdicts only: the sentences are in ``docs/scaling.md``.

The IO argument is taught here, once: :func:`reference_roof` is the one roof (matmul peak, read bandwidth, ridge)
every page quotes, from the recording run of the sequence-length sweep (:data:`IO_GRID`).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

import jax
import matplotlib.pyplot as plt
import numpy as np

from ..measure import profile
from ..measure.flops import DATASHEET, attention_bytes, attention_flops, datasheet_peak, materialised_bytes
from ..measure.grids import MATERIALISE_SCORES, points
from ..measure.sweep import run_sweep
from ..results.plotting import impl_style, label, markdown_table
from ..results.store import select
from .claims import Claim, compare, versus, words_by_x
from .kernel_timeline import TENSOR_FLOPS_PER_CYCLE
from .report import live_label, live_vs_recorded, read_ceiling, reference, shapes, timing_options

# What a build runs live, per grid: (on a GPU, on a CPU) — a point or two; the recorded grids carry the sweeps.
LIVE = {
    "seq_long": ({"impl": ("xla", "cudnn"), "seq_q": (4096,), "causal": (False,)},
                 {"impl": ("xla",), "seq_q": (256,), "causal": (False,)}),
    "batch": ({"impl": ("cudnn",), "batch": (1, 16)}, {"impl": ("xla",), "batch": (1, 4)}),
    "head_dim": ({"impl": ("cudnn",), "head_dim": (64, 256)}, {"impl": ("xla",), "head_dim": (32, 128)}),
    "backward": ({"impl": ("cudnn",), "seq_q": (4096,), "head_dim": (128,), "heads": (16,),
                  "dtype": ("bfloat16",), "causal": (False,)},
                 {"impl": ("xla",), "seq_q": (256,), "causal": (False,)}),
}  # fmt: skip


def live_points(grid_name: str, *, gpu: bool | None = None):
    """The points of ``grid_name`` (in the size for this backend) that the page runs live: :data:`LIVE`."""
    if grid_name not in LIVE:
        raise ValueError(f"no live selection for grid {grid_name!r}; choose from {sorted(LIVE)}.")
    gpu = jax.default_backend() == "gpu" if gpu is None else gpu
    keep = LIVE[grid_name][0 if gpu else 1]
    chosen = [p for p in points(grid_name, gpu=gpu) if all(getattr(p, k) in v for k, v in keep.items())]
    if not chosen:
        raise ValueError(f"the live selection of {grid_name!r} matches no point of the grid; fix LIVE.")
    return chosen


def run_live(grid_name: str) -> list[dict]:
    """Run :func:`live_points` of ``grid_name`` here, now, with the page's timing options."""
    return run_sweep(live_points(grid_name), **timing_options())


def live_table(live, recorded, columns) -> str:
    """Markdown: this build's live records under the live label; on a GPU build, beside the recorded medians of the
    same points (their ratio says how far this GPU is from the recorded one)."""
    text = f"{live_label()}. Shapes: {shapes(live)}.\n\n" + markdown_table(live, columns)
    rows = live_vs_recorded(live, recorded or []) if jax.default_backend() == "gpu" else []
    if rows:
        keys = [c for c in columns if c not in ("status", "median_ms", "tflops", "reason", "dispatch_ms")]
        text += "\n\nAgainst the recording, the same points:\n\n" + markdown_table(
            rows, [*keys, "median_ms", "recorded_ms", "live_over_recorded"]
        )
    return text


# --- the IO argument ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IOPoint:
    """One recorded forward call seen by the IO argument: its FLOPs, the fewest HBM bytes its path moves
    (:func:`~attention_tutorial.measure.flops.materialised_bytes` for a path that writes the scores,
    :func:`~attention_tutorial.measure.flops.attention_bytes` for a fused kernel), and what it measured."""

    impl: str
    grid: str
    batch: int
    seq_q: int
    head_dim: int
    flops: float
    bytes: int
    median_ms: float
    tflops: float

    @property
    def intensity(self) -> float:
        """FLOPs per byte of HBM traffic."""
        return self.flops / self.bytes


def io_point(rec: dict) -> IOPoint:
    """:class:`IOPoint` of an ok forward record (its mask's FLOPs; the bytes do not shrink with a mask)."""
    if rec.get("status") != "ok" or rec.get("pass", "fwd") != "fwd":
        raise ValueError(f"io_point needs an ok forward record; got {rec.get('status')!r}, pass {rec.get('pass')!r}.")
    dims = (rec["batch"], rec["seq_q"], rec["seq_kv"], rec["heads"], rec["kv_heads"], rec["head_dim"], rec["dtype"])
    moved = materialised_bytes(*dims) if rec["impl"] in MATERIALISE_SCORES else attention_bytes(*dims)
    flops = attention_flops(rec["batch"], rec["seq_q"], rec["seq_kv"], rec["heads"], rec["head_dim"],
                            causal=rec["causal"])  # fmt: skip
    return IOPoint(rec["impl"], rec.get("grid", ""), rec["batch"], rec["seq_q"], rec["head_dim"], flops, moved,
                   rec["median_ms"], flops / (rec["median_ms"] * 1e-3) / 1e12)  # fmt: skip


@dataclass(frozen=True)
class Roof:
    """A roofline: the matmul peak (TFLOP/s) and the read bandwidth (GB/s) measured in one recording run, and the
    datasheet's figures for the same GPU (None where it has none).

    The bandwidth is the read ceiling (a sum over a large array), not the copy ceiling (read plus write): it is the
    fastest the recorder saw HBM move bytes, so a byte count taken at it gives a floor on the time, as the byte
    count is a floor on the traffic."""

    peak_tflops: float
    gbps: float
    datasheet_tflops: float | None = None
    datasheet_gbps: float | None = None

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the bandwidth line meets the peak: left of it, memory caps the speed."""
        return self.peak_tflops * 1e3 / self.gbps

    def cap(self, intensity: float) -> float:
        """The most TFLOP/s a call of this FLOPs per byte can reach under the measured roof."""
        return min(self.peak_tflops, intensity * self.gbps / 1e3)

    def bytes_ms(self, p: IOPoint) -> float:
        """The time ``p``'s bytes take at the measured read bandwidth."""
        return p.bytes / (self.gbps * 1e9) * 1e3

    def matmul_ms(self, p: IOPoint) -> float:
        """The time ``p``'s FLOPs take at the measured matmul peak."""
        return p.flops / (self.peak_tflops * 1e12) * 1e3


def roof(records, provenance: dict, grid_name: str) -> Roof:
    """The :class:`Roof` of ``grid_name``'s recording run: its measured bf16 matmul and read ceiling."""
    run = provenance.get("grids", {}).get(grid_name, {})
    peak = run.get("matmul_bf16_tflops") or provenance["matmul_bf16_tflops"]
    gbps, _ = read_ceiling(select(records, grid=grid_name), provenance)
    if not gbps:
        raise ValueError(f"no read ceiling recorded for grid {grid_name!r}.")
    sheet = DATASHEET.get(provenance.get("gpu"))
    return Roof(peak, gbps, sheet.bf16_tflops if sheet else None, sheet.hbm_gbps if sheet else None)


#: The grid whose recording run gives the roof every page quotes (peak, bandwidth, ridge).
IO_GRID = "seq_long"


def reference_roof(grid_name: str = IO_GRID) -> Roof | None:
    """The :class:`Roof` of the recorded reference's ``grid_name`` run: the one matmul peak, read bandwidth and ridge
    (``.ridge``) the pages quote; None where no result file is installed."""
    records, provenance = reference(grid_name)
    return roof(records, provenance, grid_name) if provenance else None


#: How the roofline marks each sweep's points: (marker, legend words). Filled for the T sweep, hollow for the H sweep.
SWEEP_STYLE = {"seq_long": ("o", "T sweep"), "head_dim": ("s", "H sweep")}


def _dodge(ps: list[IOPoint], *, close: float = 1.2, step: float = 4.0) -> list[float]:
    """Vertical label offsets (points) for ``ps``: 0, except that of two points at one FLOPs per byte whose TFLOP/s
    lie within a factor ``close``, the upper label moves up and the lower down by ``step``."""
    dy = [0.0] * len(ps)
    for x in {round(p.intensity, 6) for p in ps}:
        same = sorted((i for i, p in enumerate(ps) if round(p.intensity, 6) == x), key=lambda i: ps[i].tflops)
        for lo, hi in itertools.pairwise(same):
            if ps[hi].tflops / ps[lo].tflops < close:
                dy[lo], dy[hi] = dy[lo] - step, dy[hi] + step
    return dy


def io_figure(budget: list[IOPoint], cloud: list[IOPoint], r: Roof, *, title: str = ""):
    """Two panels. Left, a time budget: for each point of ``budget`` (one shape), the measured time beside the time
    its bytes take at the measured read bandwidth and the time its FLOPs take at the measured matmul peak. Right, a
    roofline: every point of ``cloud`` at its FLOPs per byte against its TFLOP/s, under the measured roof (solid)
    and the datasheet's (dashed); colour names the implementation, the marker its sweep (:data:`SWEEP_STYLE`:
    filled for the T sweep, hollow and labelled with its H for the H sweep)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.0, 4.2), facecolor="white", layout="constrained",
                                      width_ratios=(1, 1.25))  # fmt: skip
    kinds = (("measured time", 1.0), ("its bytes at the read ceiling", 0.55), ("its FLOPs at the matmul peak", 0.25))
    height = 0.26
    for i, p in enumerate(budget):
        colour = impl_style(p.impl)[0]
        values = (p.median_ms, r.bytes_ms(p), r.matmul_ms(p))
        for j, ((name, alpha), v) in enumerate(zip(kinds, values)):
            y = i + (1 - j) * height
            left.barh(y, v, height=height * 0.9, color=colour, alpha=alpha)
            left.text(v, y, f" {v:.2f} ms" + ("" if i else f"  {name}"), va="center", fontsize=7)
    left.set_yticks(range(len(budget)), [label(p.impl) for p in budget], fontsize=8)
    left.set_xlabel("ms per call")
    left.set_xlim(0, max(p.median_ms for p in budget) * 1.9)
    if budget:
        b = budget[0]
        left.set_title(f"time budget at B = {b.batch}, T = S = {b.seq_q}, H = {b.head_dim}", fontsize=10)
    xs = np.logspace(0, 4.5, 200)
    right.plot(xs, [r.cap(x) for x in xs], color="#333333", linewidth=1.6,
               label=f"measured roof: {r.peak_tflops:.0f} TFLOP/s, {r.gbps / 1e3:.2f} TB/s")  # fmt: skip
    if r.datasheet_tflops and r.datasheet_gbps:
        right.plot(xs, np.minimum(r.datasheet_tflops, xs * r.datasheet_gbps / 1e3), color="#999999",
                   linestyle=(0, (4, 3)), linewidth=1.2,
                   label=f"datasheet roof: {r.datasheet_tflops:.0f} TFLOP/s, {r.datasheet_gbps / 1e3:.1f} TB/s")  # fmt: skip
    for impl, grid in dict.fromkeys((p.impl, p.grid) for p in cloud):
        colour = impl_style(impl)[0]
        marker, sweep = SWEEP_STYLE.get(grid, (impl_style(impl)[1], grid))
        ps = [p for p in cloud if (p.impl, p.grid) == (impl, grid)]
        right.plot([p.intensity for p in ps], [p.tflops for p in ps], marker, color=colour,
                   label=f"{label(impl)}, {sweep}" if sweep else label(impl), markersize=6, linestyle="none",
                   markerfacecolor="none" if grid == "head_dim" else colour)  # fmt: skip
        if grid == "head_dim":  # the H sweep: each point named by its H, away from the T sweep's points
            for p, dy in zip(ps, _dodge(ps)):
                side = 1 if p.intensity > r.ridge else -1  # right of the ridge to the right, left of it to the left
                right.annotate(f"H={p.head_dim}", (p.intensity, p.tflops), xytext=(6 * side, dy),
                               textcoords="offset points", fontsize=6, color=colour, va="center",
                               ha="left" if side > 0 else "right")  # fmt: skip
    right.axvline(r.ridge, color="#bbbbbb", linewidth=0.8, label=f"ridge: {r.ridge:.0f} FLOPs per byte")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("FLOPs per byte of HBM traffic (from the shapes)")
    right.set_ylabel("TFLOP/s (recorded)")
    right.set_title("roofline: where each recorded call sits", fontsize=10)
    right.grid(True, which="major", color="#dddddd", linewidth=0.8)
    right.legend(fontsize=7, loc="lower right", frameon=True, facecolor="white")
    for a in (left, right):
        a.set_facecolor("white")
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


# --- sequence length, memory, batch, head dim ----------------------------------------------------------------------


def best(records, impl: str, **where) -> dict | None:
    """The ok record of ``impl`` (matching ``where``) with the most TFLOP/s; None without one."""
    ok = [r for r in select(records, status="ok", impl=impl, **where) if r.get("tflops")]
    return max(ok, key=lambda r: r["tflops"]) if ok else None


@dataclass(frozen=True)
class MaskSaving:
    """What a causal mask does to one implementation's time, point by point (``by_t``: T → the unmasked call
    compared with the causal one; value above 1: the causal call is faster): the verdict phrase over T
    (:func:`~attention_tutorial.site.claims.words_by_x`) and the range of the ratio."""

    by_t: dict
    words: str
    low: float
    high: float


def mask_saving(records, impl: str) -> MaskSaving | None:
    """:class:`MaskSaving` of ``impl`` over ``records`` (one sweep of T, both masks); None without a pair."""
    by_t = {}
    for r in select(records, status="ok", impl=impl, causal=True):
        full = select(records, status="ok", impl=impl, causal=False, seq_q=r["seq_q"], batch=r["batch"])
        if full:
            by_t[r["seq_q"]] = compare([r], full)
    if not by_t:
        return None
    values = [c.value for c in by_t.values()]
    return MaskSaving(dict(sorted(by_t.items())), words_by_x(by_t), min(values), max(values))


@dataclass(frozen=True)
class MaskProfile:
    """One implementation's profiled call without a mask and with a causal one (``device_time`` records): the
    longest kernel's time (``main_us``, for XLA the pass of the softmax over the scores) and the rest of the summed
    kernel time (``rest_us``, the matmuls and the small kernels), each as (no mask, causal), in µs per call, at T =
    ``seq_q``."""

    impl: str
    seq_q: int
    main_us: tuple[float, float]
    rest_us: tuple[float, float]
    main_names: tuple[str, str]

    @property
    def main_ratio(self) -> float:
        """The causal call's longest kernel against the unmasked one's (above 1: the mask makes it longer)."""
        return self.main_us[1] / self.main_us[0]

    @property
    def rest_ratio(self) -> float:
        """Everything else, causal against unmasked."""
        return self.rest_us[1] / self.rest_us[0]


def mask_profile(records, impl: str) -> MaskProfile | None:
    """:class:`MaskProfile` of ``impl`` from profiled records (both masks, ok, on a GPU); None without the pair."""
    pair = []
    for causal in (False, True):
        rs = [r for r in select(records, status="ok", impl=impl, causal=causal)
              if r.get("time_source") == "device" and r.get("device_ms") and profile.main_kernel(r)]  # fmt: skip
        if not rs:
            return None
        pair.append(rs[0])
    mains = [profile.main_kernel(r) for r in pair]
    rests = tuple(r["device_ms"] * 1e3 - m["us"] for r, m in zip(pair, mains))
    return MaskProfile(
        impl, pair[0]["seq_q"], (mains[0]["us"], mains[1]["us"]), rests, (mains[0]["name"], mains[1]["name"])
    )


def bytes_per_score(records, impl: str) -> tuple[float, float] | None:
    """(lowest, highest) compiled temporaries per (B, N, T, S) score over ``impl``'s ok records with
    ``temp_bytes``; None without any."""
    per = [r["temp_bytes"] / (r["batch"] * r["heads"] * r["seq_q"] * r["seq_kv"])
           for r in select(records, status="ok", impl=impl) if r.get("temp_bytes")]  # fmt: skip
    return (min(per), max(per)) if per else None


@dataclass(frozen=True)
class Floor:
    """The batch sweep of one implementation: its time at the smallest and largest B, the verdict of the largest
    against the smallest (:func:`~attention_tutorial.site.claims.compare`: "slower" means the larger batch takes
    measurably longer), and the fastest call of the whole sweep (every implementation), in ms."""

    impl: str
    small: dict
    large: dict
    claim: Claim
    fastest_ms: float

    @property
    def work_ratio(self) -> float:
        return self.large["batch"] / self.small["batch"]

    @property
    def time_ratio(self) -> float:
        return self.large["median_ms"] / self.small["median_ms"]

    @property
    def floor_us(self) -> float:
        """The fastest call in µs rounded down to 0.1 µs: no call of the sweep took less (39.85 µs -> 39.8)."""
        return math.floor(self.fastest_ms * 1e4 + 1e-6) / 10


def batch_floor(records, impl: str) -> Floor | None:
    """:class:`Floor` of ``impl`` in a batch sweep; None with fewer than two of its points."""
    mine = sorted(select(records, status="ok", impl=impl), key=lambda r: r["batch"])
    if len(mine) < 2:
        return None
    fastest = min(r["median_ms"] for r in select(records, status="ok"))
    return Floor(impl, mine[0], mine[-1], compare([mine[-1]], [mine[0]]), fastest)


@dataclass(frozen=True)
class HeadDim:
    """One implementation over head dims: the first and last H, how its TFLOP/s and its time change between them,
    and whether the time change lies outside the timing spreads (``time_claim``: "faster" means the first is
    faster, so the time rises)."""

    impl: str
    first: int
    last: int
    tflops_ratio: float
    time_ratio: float
    time_claim: Claim

    @property
    def work_ratio(self) -> float:
        return self.last / self.first


def head_dim_change(records, impl: str) -> HeadDim | None:
    """:class:`HeadDim` of ``impl`` over ``records`` of one head-dim sweep; None with fewer than two ok points."""
    rs = sorted(select(records, status="ok", impl=impl), key=lambda r: r["head_dim"])
    if len(rs) < 2:
        return None
    a, b = rs[0], rs[-1]
    return HeadDim(impl, a["head_dim"], b["head_dim"], b["tflops"] / a["tflops"], b["median_ms"] / a["median_ms"],
                   compare([a], [b]))  # fmt: skip


@dataclass(frozen=True)
class RaceRow:
    """One implementation and mask against ``base`` over T >= the race's smallest T: the (lowest, highest) speed as
    a fraction of ``base``'s (its median time / the implementation's) and the verdict phrase over T."""

    impl: str
    causal: bool
    low: float
    high: float
    words: str


def race(records, impls, base: str = "cudnn", *, min_seq: int = 0, **where) -> list[RaceRow]:
    """:class:`RaceRow` per implementation of ``impls`` and mask where it and ``base`` share points (T >=
    ``min_seq``, matching ``where``), every record of ``base`` at a point widening its range
    (:func:`~attention_tutorial.site.claims.versus`)."""
    rows = []
    for impl in impls:
        for causal in (False, True):
            by_t = versus(records, impl, base, min_seq=min_seq, causal=causal, **where)
            if by_t:
                values = [c.value for c in by_t.values()]
                rows.append(RaceRow(impl, causal, min(values), max(values), words_by_x(by_t)))
    return rows


def pct_both(rec: dict, gpu: str | None) -> tuple[float | None, float | None]:
    """A record's % of the measured peak and % of ``gpu``'s datasheet peak (None where it has none)."""
    peak, _ = datasheet_peak(gpu, rec.get("dtype") or "bfloat16")
    return rec.get("pct_peak"), (100 * rec["tflops"] / peak if peak and rec.get("tflops") else None)


# --- what the figures leave unsaid -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Doubling:
    """How one implementation's time grows over a sweep of T: the geometric mean, over consecutive points, of the
    time ratio and of the work ratio, each per doubling of T (``steps``: how many steps it averages)."""

    impl: str
    time_ratio: float
    work_ratio: float
    steps: int


def doubling(records, impl: str, *, causal: bool = False) -> Doubling | None:
    """:class:`Doubling` of ``impl`` over ``records`` (one sweep of T); None with fewer than two ok points."""
    rs = sorted(select(records, status="ok", impl=impl, causal=causal), key=lambda r: r["seq_q"])
    if len(rs) < 2:
        return None
    logs_t, logs_w, octaves = 0.0, 0.0, 0.0
    for a, b in itertools.pairwise(rs):
        work = [attention_flops(r["batch"], r["seq_q"], r["seq_kv"], r["heads"], r["head_dim"], causal=causal)
                for r in (a, b)]  # fmt: skip
        logs_t += math.log(b["median_ms"] / a["median_ms"])
        logs_w += math.log(work[1] / work[0])
        octaves += math.log2(b["seq_q"] / a["seq_q"])
    return Doubling(impl, math.exp(logs_t / octaves), math.exp(logs_w / octaves), len(rs) - 1)


@dataclass(frozen=True)
class Catch:
    """Where ``impl``'s time meets ``ref``'s over a sweep of T: from ``seq_q`` on, ``impl``'s median time is within
    the tolerance of ``ref``'s at every T; ``before`` and ``after`` are the (lowest, highest) ratio impl / ref below
    and from that T."""

    impl: str
    ref: str
    seq_q: int
    before: tuple[float, float]
    after: tuple[float, float]


def catches_up(records, impl: str, ref: str, *, within: float = 0.1, causal: bool = False) -> Catch | None:
    """:class:`Catch` of ``impl`` against ``ref`` (unmasked by default); None where ``impl`` is never within
    ``within`` of ``ref`` up to the last T, or already is at the first."""
    by_t = {}
    for r in select(records, status="ok", impl=impl, causal=causal):
        other = select(records, status="ok", impl=ref, causal=causal, seq_q=r["seq_q"], batch=r["batch"])
        if other:
            by_t[r["seq_q"]] = r["median_ms"] / other[0]["median_ms"]
    ts = sorted(by_t)
    close = [abs(by_t[t] - 1) <= within for t in ts]
    if not ts or not close[-1] or all(close):
        return None
    first = next(i for i in range(len(ts)) if all(close[i:]))
    before, after = [by_t[t] for t in ts[:first]], [by_t[t] for t in ts[first:]]
    return Catch(impl, ref, ts[first], (min(before), max(before)), (min(after), max(after)))


@dataclass(frozen=True)
class CausalPair:
    """One implementation at one T with and without a causal mask: ``share`` is the causal call's FLOPs (the kept
    (query, key) pairs only) over the unmasked call's, so its TFLOP/s can fall while its time falls too."""

    impl: str
    seq_q: int
    share: float
    full: dict
    causal: dict

    @property
    def speedup(self) -> float:
        """The unmasked call's median time over the causal one's (above 1: the causal call is faster)."""
        return self.full["median_ms"] / self.causal["median_ms"]


def causal_pair(records, impl: str, seq_q: int) -> CausalPair | None:
    """:class:`CausalPair` of ``impl`` at T = ``seq_q``; None without both masks there."""
    pair = [select(records, status="ok", impl=impl, causal=c, seq_q=seq_q) for c in (False, True)]
    if not all(pair):
        return None
    full, causal = pair[0][0], pair[1][0]
    dims = (full["batch"], full["seq_q"], full["seq_kv"], full["heads"], full["head_dim"])
    share = attention_flops(*dims, causal=True) / attention_flops(*dims)
    return CausalPair(impl, seq_q, share, full, causal)


#: ``exp2`` a Hopper SM completes per clock on its special-function unit (FlashAttention-3 §3): one per score.
EXP2_PER_CYCLE = 16


@dataclass(frozen=True)
class ExpBudget:
    """The softmax's exponentials set against the matmuls at one head dim H: each score costs 4·H matmul FLOPs
    (q·k and p·v) and one exponential, and in the time of one exponential the tensor cores do ``flops_per_exp``
    FLOPs (:data:`~attention_tutorial.site.kernel_timeline.TENSOR_FLOPS_PER_CYCLE` / :data:`EXP2_PER_CYCLE`)."""

    head_dim: int
    flops_per_score: int
    flops_per_exp: float

    @property
    def exp_over_matmul(self) -> float:
        """The exponentials' time over the matmuls' time at full rate on both units (above 1: the exponentials take
        longer, so the tensor cores wait unless both overlap perfectly)."""
        return self.flops_per_exp / self.flops_per_score


def exp_budget(head_dims) -> list[ExpBudget]:
    """:class:`ExpBudget` for each head dim of ``head_dims``, in order."""
    per_exp = TENSOR_FLOPS_PER_CYCLE / EXP2_PER_CYCLE
    return [ExpBudget(h, 4 * h, per_exp) for h in head_dims]


@dataclass(frozen=True)
class Skipped:
    """A point of a sweep that did not run: its status ('oom', 'unsupported', ...), the record's reason, and for
    a point skipped for memory the estimated need and the device's limit, in GiB (None otherwise)."""

    impl: str
    seq_q: int
    head_dim: int
    causal: bool
    status: str
    reason: str
    need_gib: float | None
    limit_gib: float | None


def not_run(records, impl: str) -> list[Skipped]:
    """:class:`Skipped` for each record of ``impl`` whose status is not ok, by T then mask."""
    out = []
    for r in sorted(records, key=lambda r: (r["seq_q"], r["head_dim"], r["causal"])):
        if r.get("impl") != impl or r.get("status") == "ok":
            continue
        reason = r.get("reason") or ""
        limit = re.search(r"lets XLA use ([0-9.]+) GiB", reason)
        need = r.get("estimated_bytes")
        out.append(Skipped(impl, r["seq_q"], r["head_dim"], r["causal"], r["status"], reason,
                           need / 2**30 if need else None, float(limit.group(1)) if limit else None))  # fmt: skip
    return out


def tokens_per_call(records) -> dict[int, list[tuple[int, int]]]:
    """B·T → the (T, B) of the ok points that run that many tokens per call, by T."""
    out: dict[int, list[tuple[int, int]]] = {}
    for r in sorted(select(records, status="ok"), key=lambda r: r["seq_q"]):
        pair = (r["seq_q"], r["batch"])
        if pair not in out.setdefault(r["batch"] * r["seq_q"], []):
            out[r["batch"] * r["seq_q"]].append(pair)
    return dict(sorted(out.items()))


#: Our own kernels in the backward race (the rest are cuDNN, JAX's and XLA's).
OWN = ("mosaic", "pallas")


def best_own(rows: list[RaceRow], own=OWN) -> str | None:
    """Of ``own``, the implementation whose slowest showing against the base (lowest ``low`` over its masks) is the
    fastest; None where none of them raced."""
    lows = {}
    for x in rows:
        if x.impl in own:
            lows[x.impl] = min(lows.get(x.impl, math.inf), x.low)
    return max(lows, key=lows.get) if lows else None


def batch_figure(records, *, title: str = ""):
    """The batch sweep in µs per call: one line per implementation (median), its p10–p90 band, the y axis from
    zero (the fixed cost per call is the point)."""
    fig, ax = plt.subplots(figsize=(7.0, 4.2), facecolor="white", layout="constrained")
    for i, impl in enumerate(dict.fromkeys(r["impl"] for r in select(records, status="ok"))):
        rs = sorted(select(records, status="ok", impl=impl), key=lambda r: r["batch"])
        colour, marker = impl_style(impl, i)
        xs = [r["batch"] for r in rs]
        ax.plot(xs, [r["median_ms"] * 1e3 for r in rs], marker=marker, color=colour, label=label(impl))
        if all(r.get("p10_ms") is not None and r.get("p90_ms") is not None for r in rs):
            ax.fill_between(xs, [r["p10_ms"] * 1e3 for r in rs], [r["p90_ms"] * 1e3 for r in rs], color=colour,
                            alpha=0.2, linewidth=0)  # fmt: skip
    ax.set_xscale("log", base=2)
    batches = sorted({r["batch"] for r in select(records, status="ok")})
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("B (batch)")
    ax.set_ylabel("µs per call (median; band: p10–p90)")
    ax.grid(True, which="major", color="#dddddd", linewidth=0.8)
    ax.set_facecolor("white")
    ax.legend(fontsize=8, frameon=True, facecolor="white", loc="lower right")
    if title:
        ax.set_title(title, fontsize=11)
    return fig
