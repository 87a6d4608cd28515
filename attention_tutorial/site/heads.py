"""Numbers, verdicts and figures for the page on shared keys and values: MHA, GQA, MQA, decoding and masks.

Each function reads records (the recorded GPU's or this build's live ones) and returns numbers, a
:class:`~attention_tutorial.site.claims.Claim` or a small dataclass, or draws a figure; the sentences that say
them are in ``docs/heads_decode_masks.md``.

Shape legend: B batch, T query length, S key length, N query heads, K kv heads, H head dim.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from itertools import pairwise

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from ..inputs import AttentionShape, make_qkv
from ..kernels import masks
from ..kernels.fused import dot_product_attention
from ..kernels.reference import reference_attention
from ..measure.flops import attention_flops, kv_cache_bytes
from ..measure.sweep import Point
from ..registry import IMPLEMENTATIONS
from ..results.plotting import GREY, MARKERS, PALETTE, impl_style, label
from .claims import TOLERANCES, Claim, agreement, compare, growth, same_point

#: Streaming multiprocessors per GPU (NVIDIA's datasheets), by the name a result file records.
SMS = {"NVIDIA H200": 132, "NVIDIA H100 80GB HBM3": 132, "NVIDIA A100-SXM4-80GB": 108, "NVIDIA A100-SXM4-40GB": 108}

# --- GQA is MHA with repeated kv heads


def kv_head_of(heads: int, kv_heads: int) -> np.ndarray:
    """The kv head each of the N query heads reads: query head n reads kv head n // (N / K)."""
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a positive multiple of kv_heads ({kv_heads}); e.g. 8 and 2.")
    return np.arange(heads) // (heads // kv_heads)


LAYOUTS = (("MHA", 8), ("GQA", 2), ("MQA", 1))  # (name, K) for N = 8 query heads


def sharing_figure(heads: int = 8, layouts=LAYOUTS):
    """One panel per layout: the N query heads on top, the K kv heads below, a line from each query head to the kv
    head it reads (coloured by kv head)."""
    fig, axes = plt.subplots(1, len(layouts), figsize=(3.2 * len(layouts), 2.4), facecolor="white",
                             layout="constrained")  # fmt: skip
    for ax, (name, kv) in zip(np.atleast_1d(axes), layouts):
        owner = kv_head_of(heads, kv)
        kv_x = (np.arange(kv) + 0.5) * heads / kv - 0.5  # each kv head centred under its group
        for n, j in enumerate(owner):
            ax.plot([n, kv_x[j]], [1, 0], color=PALETTE[j % len(PALETTE)], linewidth=1.2)
        ax.scatter(np.arange(heads), np.ones(heads), s=140, marker="s", c=[PALETTE[j % len(PALETTE)] for j in owner],
                   edgecolors="black", linewidths=0.6, zorder=3)  # fmt: skip
        ax.scatter(kv_x, np.zeros(kv), s=260, marker="o", c=[PALETTE[j % len(PALETTE)] for j in range(kv)],
                   edgecolors="black", linewidths=0.6, zorder=3)  # fmt: skip
        ax.set(title=f"{name}: N = {heads}, K = {kv}", xlim=(-0.8, heads - 0.2), ylim=(-0.45, 1.45),
               yticks=[0, 1], yticklabels=["k, v heads", "query heads"], xticks=[])  # fmt: skip
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    return fig


def gqa_table(rows) -> list[dict]:
    """Display rows of :func:`~attention_tutorial.measure.lessons.gqa_rows`, each difference judged against the
    tolerance of the precision it was computed in."""
    out = []
    for r in rows:
        row = {"implementation": IMPLEMENTATIONS[r["impl"]].label, "status": r["status"]}
        if r["status"] == "ok":
            row["max |GQA − MHA|"] = f"{r['max_abs_diff']:.1e}"
            word, tol = agreement(r["max_abs_diff"], r["computed_in"]).word, TOLERANCES[r["computed_in"]]
            row["verdict"] = f"{word} (tolerance {tol:.0e})"
        else:
            row["max |GQA − MHA|"], row["verdict"] = "—", r["reason"]
        out.append(row)
    return out


@dataclass(frozen=True)
class GqaCheck:
    """How the implementations that ran compare GQA with repeated-head MHA."""

    ran: int  # implementations that ran
    agree: int  # of those, how many agree within their precision's rounding (or exactly)
    exact: int  # of those, how many give identical bits
    largest: float  # the largest difference of any of them
    computed_in: str  # the precision of the one with the largest difference
    exact_impls: tuple[str, ...] = ()  # the implementations that give identical bits
    close_impls: tuple[str, ...] = ()  # those that agree to within rounding, not exactly
    differ_impls: tuple[str, ...] = ()  # those that differ by more than rounding
    largest_close: float = 0.0  # the largest difference among ``close_impls``

    @property
    def word(self) -> str:
        """The verdict: "agree" when every implementation that ran agrees, else "differ"."""
        return "agree" if self.agree == self.ran else "differ"


def gqa_check(rows) -> GqaCheck | None:
    """:class:`GqaCheck` over the ok rows of :func:`~attention_tutorial.measure.lessons.gqa_rows`; None if none ran."""
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return None
    worst = max(ok, key=lambda r: r["max_abs_diff"])
    verdicts = [r["max_abs_diff"] <= TOLERANCES[r["computed_in"]] for r in ok]
    exact = tuple(r["impl"] for r in ok if r["max_abs_diff"] == 0)
    close = [r for r, fine in zip(ok, verdicts) if fine and r["max_abs_diff"] > 0]
    return GqaCheck(ran=len(ok), agree=sum(verdicts), exact=len(exact), largest=worst["max_abs_diff"],
                    computed_in=worst["computed_in"], exact_impls=exact, close_impls=tuple(r["impl"] for r in close),
                    differ_impls=tuple(r["impl"] for r, fine in zip(ok, verdicts) if not fine),
                    largest_close=max((r["max_abs_diff"] for r in close), default=0.0))  # fmt: skip


def names(impls) -> str:
    """The implementations' labels as a list in words: "cuDNN", "naive and XLA", "A, B and C" ("" for none)."""
    words = [label(i) for i in impls]
    return " and ".join(words) if len(words) < 3 else ", ".join(words[:-1]) + " and " + words[-1]


# --- The KV cache

#: A Llama-like decoder: 32 layers of 32 query heads of H = 128, cached in bf16.
MODEL = {"layers": 32, "heads": 32, "head_dim": 128, "dtype": "bfloat16"}


def kv_cache_gib(kv_heads: int, tokens: int, model=MODEL) -> float:
    """GiB of the KV cache of ``model`` for one sequence of ``tokens`` tokens with ``kv_heads`` kv heads per layer."""
    return kv_cache_bytes(kv_heads, model["head_dim"], model["dtype"], tokens=tokens, layers=model["layers"]) / 2**30


@dataclass(frozen=True)
class KvCache:
    """The KV cache of :data:`MODEL` at one context length, and what sharing heads saves."""

    tokens: int
    mha_gib: float  # K = N
    gqa_factor: float  # MHA's bytes / GQA's
    mqa_factor: float  # MHA's bytes / MQA's
    gpu: str | None  # the recorded GPU, and its memory in GiB (None where the record does not say)
    memory_gib: float | None

    @property
    def pct_of_memory(self) -> float | None:
        """MHA's cache as a percentage of the recorded GPU's memory."""
        return 100 * self.mha_gib / self.memory_gib if self.memory_gib else None


def gpu_memory_gib(provenance) -> float | None:
    """The recorded GPU's memory in GiB (as ``nvidia-smi`` reported it in the recording run), or None."""
    mib = ((provenance or {}).get("environment") or {}).get("gpu_memory_mib")
    return mib / 1024 if mib else None


def kv_cache(provenance=None, *, tokens: int = 131072, gqa: int = 8, mqa: int = 1, model=MODEL) -> KvCache:
    """:class:`KvCache` of ``model`` at ``tokens``, with GQA's ``gqa`` and MQA's ``mqa`` kv heads."""
    mha = kv_cache_gib(model["heads"], tokens, model)
    return KvCache(tokens=tokens, mha_gib=mha, gqa_factor=mha / kv_cache_gib(gqa, tokens, model),
                   mqa_factor=mha / kv_cache_gib(mqa, tokens, model), gpu=(provenance or {}).get("gpu"),
                   memory_gib=gpu_memory_gib(provenance))  # fmt: skip


def kv_cache_figure(provenance=None, *, kv_heads=(32, 8, 1), contexts=tuple(2**i for i in range(11, 18)),
                    model=MODEL):  # fmt: skip
    """KV cache GiB against context length, one line per kv-head count, and the recorded GPU's memory (dashed)."""
    fig, ax = plt.subplots(figsize=(7, 3.8), facecolor="white", layout="constrained")
    for i, k in enumerate(kv_heads):
        name = "MHA" if k == model["heads"] else "MQA" if k == 1 else "GQA"
        ax.plot(contexts, [kv_cache_gib(k, c, model) for c in contexts], marker="o", color=PALETTE[i],
                label=f"{name}, K = {k}")  # fmt: skip
    if mem := gpu_memory_gib(provenance):
        ax.axhline(mem, color=GREY, linestyle="--", label=f"{provenance['gpu']} memory ({mem:.0f} GiB)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    title = f"{model['layers']} layers, N = {model['heads']}, H = {model['head_dim']}, {model['dtype']}"
    ax.set(xlabel="context length (tokens), one sequence", ylabel="KV cache (GiB)", title=title)
    ax.grid(True, color="#dddddd")
    ax.legend(fontsize=8, loc="upper left")
    return fig


# --- Decoding


def live_points(section: str, *, gpu: bool) -> list[Point]:
    """The few points this page times live: on a GPU, points of the recorded grids (so they can be set against the
    recording); on a CPU, small ones. ``section``: "decode", "prefill" or "masks"."""
    if gpu:
        shapes = {"decode": [dict(impl="cudnn", batch=16, seq_q=1, seq_kv=131072, heads=32, kv_heads=k, head_dim=128)
                             for k in (32, 1)],
                  "prefill": [dict(impl="cudnn", batch=4, seq_q=4096, seq_kv=4096, heads=32, kv_heads=k, head_dim=128)
                              for k in (32, 1)],
                  "masks": [dict(impl="cudnn", batch=4, seq_q=4096, seq_kv=4096, heads=16, kv_heads=16, head_dim=128,
                                 causal=True, mask=m) for m in ("none", "dense")]}  # fmt: skip
    else:
        shapes = {"decode": [dict(impl="xla", batch=1, seq_q=1, seq_kv=4096, heads=8, kv_heads=k, head_dim=64,
                                  dtype="float32") for k in (8, 1)],
                  "prefill": [dict(impl="xla", batch=1, seq_q=256, seq_kv=256, heads=8, kv_heads=k, head_dim=64,
                                   dtype="float32") for k in (8, 1)],
                  "masks": [dict(impl="xla", batch=2, seq_q=256, seq_kv=256, heads=4, kv_heads=4, head_dim=64,
                                 dtype="float32", causal=True, mask=m) for m in ("none", "dense")]}  # fmt: skip
    if section not in shapes:
        raise ValueError(f"section must be one of {sorted(shapes)}; got {section!r}.")
    return [Point(**s) for s in shapes[section]]


@dataclass(frozen=True)
class Bandwidth:
    """One decode call read as bandwidth: the fewest bytes it must move over its time."""

    impl: str
    seq_kv: int
    kv_heads: int
    median_ms: float
    gbps: float
    pct_read: float | None  # of the read ceiling measured in its recording run


def _bandwidth(r) -> Bandwidth:
    return Bandwidth(r["impl"], r["seq_kv"], r["kv_heads"], r["median_ms"], r["gbps"], r.get("pct_read"))


def _ok(records, **where) -> list[dict]:
    return [r for r in records or () if r.get("status") == "ok" and all(r.get(k) == v for k, v in where.items())]


def best_bandwidth(records, impl: str) -> Bandwidth | None:
    """``impl``'s decode call with the highest GB/s, or None without one."""
    ok = [r for r in _ok(records, impl=impl) if r.get("gbps")]
    return _bandwidth(max(ok, key=lambda r: r["gbps"])) if ok else None


@dataclass(frozen=True)
class SharedCache:
    """One kv head against K = N at the longest context both ran: bytes, time and bandwidth."""

    seq_kv: int
    kv_full: int  # the largest K recorded (MHA)
    bytes_ratio: float  # bytes moved with K = kv_full / with K = 1
    speedup: Claim  # K = 1 against K = kv_full (value: K = kv_full's time / K = 1's; word from the spreads)
    one: Bandwidth
    full: Bandwidth
    near: Bandwidth  # the call of another K whose time is closest to K = 1's
    near_vs_one: Claim  # that call against K = 1's (value: K = 1's time / its time)
    streams_one: int  # separate k/v streams the K = 1 call reads: B × K
    streams_full: int  # and the K = kv_full call


def shared_cache(records, impl: str = "cudnn") -> SharedCache | None:
    """:class:`SharedCache` of ``impl``'s decode records; None without K = 1 and K = N at a common context."""
    ok = _ok(records, impl=impl)
    if not ok:
        return None
    full = max(r["kv_heads"] for r in ok)
    both = {r["seq_kv"] for r in ok if r["kv_heads"] == 1} & {r["seq_kv"] for r in ok if r["kv_heads"] == full}
    if full == 1 or not both:
        return None
    s = max(both)
    one, mha = _ok(ok, kv_heads=1, seq_kv=s), _ok(ok, kv_heads=full, seq_kv=s)
    moved = lambda r: r["gbps"] * r["median_ms"]  # noqa: E731 — bytes, up to a constant
    near = min((r for r in ok if r["kv_heads"] != 1), key=lambda r: abs(r["median_ms"] - one[0]["median_ms"]))
    return SharedCache(seq_kv=s, kv_full=full, bytes_ratio=moved(mha[0]) / moved(one[0]), speedup=compare(one, mha),
                       one=_bandwidth(one[0]), full=_bandwidth(mha[0]), near=_bandwidth(near),
                       near_vs_one=compare([near], one), streams_one=one[0]["batch"] * one[0]["kv_heads"],
                       streams_full=mha[0]["batch"] * full)  # fmt: skip


@dataclass(frozen=True)
class Floor:
    """Short decode calls whose time stops following their bytes: one implementation's K = 1 calls below the
    longest context, and another implementation at the same points."""

    impl: str
    seq_kv: tuple[int, ...]
    ms_low: float
    ms_high: float
    per_doubling: Claim  # time per doubling of S (growth)
    ideal_ms: float  # the longest of these calls' bytes at the read ceiling
    other: str
    # (S, impl's ms, other's ms, other against impl: value impl's time / other's) where both ran
    other_vs: tuple[tuple[int, float, float, Claim], ...]

    @property
    def own(self) -> bool:
        """Whether the floor is ``impl``'s own: the other implementation is faster, outside the spreads, somewhere."""
        return any(c.word == "faster" for *_, c in self.other_vs)


def decode_floor(records, ceiling: float | None, *, impl: str = "cudnn", kv_heads: int = 1,
                 other: str = "xla") -> Floor | None:  # fmt: skip
    """:class:`Floor` of ``impl``'s ``kv_heads`` calls below the longest context; None with fewer than two or
    without a ceiling."""
    calls = _ok(records, impl=impl, kv_heads=kv_heads)
    if not calls or not ceiling:
        return None
    longest = max(r["seq_kv"] for r in calls)
    short = sorted((r for r in calls if r["seq_kv"] < longest), key=lambda r: r["seq_kv"])
    if len(short) < 2:
        return None
    ms = [r["median_ms"] for r in short]
    ideal = max(r["gbps"] * r["median_ms"] for r in short) / ceiling
    vs = []
    for r in short:
        if o := same_point(records, r, impl=other):
            vs.append((r["seq_kv"], r["median_ms"], statistics.median(x["median_ms"] for x in o), compare(o, [r])))
    return Floor(impl=impl, seq_kv=tuple(r["seq_kv"] for r in short), ms_low=min(ms), ms_high=max(ms),
                 per_doubling=growth([r["seq_kv"] for r in short], ms, var="S"), ideal_ms=ideal, other=other,
                 other_vs=tuple(vs))  # fmt: skip


def bandwidth_by_context(records, impl: str, kv_heads: int) -> tuple[tuple[int, float], ...]:
    """((S, GB/s), ...) of ``impl``'s ``kv_heads`` decode calls, shortest context first."""
    return tuple(sorted((r["seq_kv"], r["gbps"]) for r in _ok(records, impl=impl, kv_heads=kv_heads)))


@dataclass(frozen=True)
class Drop:
    """Where one decode curve (an implementation and a kv-head count) loses the most bandwidth from one context to
    the next longer one."""

    impl: str
    kv_heads: int
    seq_from: int
    gbps_from: float
    seq_to: int
    gbps_to: float

    @property
    def ratio(self) -> float:
        """GB/s before the fall over GB/s after it (above 1: it fell)."""
        return self.gbps_from / self.gbps_to


def largest_drop(records, *, at_least: float = 1.2) -> Drop | None:
    """The largest fall in GB/s between neighbouring contexts of any decode curve, or None where no curve falls by
    ``at_least`` times (so a dip within noise is not named)."""
    ok = [r for r in _ok(records) if r.get("gbps")]
    drops = []
    for impl, k in dict.fromkeys((r["impl"], r["kv_heads"]) for r in ok):
        pts = bandwidth_by_context(ok, impl, k)
        drops += [Drop(impl, k, s0, g0, s1, g1) for (s0, g0), (s1, g1) in pairwise(pts)]
    worst = max(drops, key=lambda d: d.ratio, default=None)
    return worst if worst and worst.ratio >= at_least else None


@dataclass(frozen=True)
class DecodeStep:
    """One kv-head count's decode attention at one context: ms per layer, and per decode step of a whole model."""

    name: str  # "MHA" (the largest K recorded), "GQA" or "MQA" (K = 1)
    kv_heads: int
    layer_ms: float  # one attention call: one layer, one new token for each of the batch's sequences
    step_ms: float  # layer_ms × layers: the attention part of one decode step
    batch: int


def decode_steps(records, seq_kv: int, *, impl: str = "cudnn", layers: int = MODEL["layers"]) -> list[DecodeStep]:
    """:class:`DecodeStep` of each kv-head count ``impl`` ran at context ``seq_kv``, most kv heads first."""
    ok = sorted(_ok(records, impl=impl, seq_kv=seq_kv), key=lambda r: -r["kv_heads"])
    if not ok:
        return []
    full = ok[0]["kv_heads"]
    name = lambda k: "MQA" if k == 1 else "MHA" if k == full else "GQA"  # noqa: E731
    return [DecodeStep(name(r["kv_heads"]), r["kv_heads"], r["median_ms"], r["median_ms"] * layers, r["batch"])
            for r in ok]  # fmt: skip


def decode_figure(records, *, read_gbps: float | None = None, title: str = ""):
    """Decode bandwidth (GB/s of the fewest bytes) against the context S: a solid line per implementation (colour)
    and kv-head count (marker), with the measured read ceiling as a dashed grey line without markers."""
    fig, ax = plt.subplots(figsize=(7.4, 4.0), facecolor="white", layout="constrained")
    ok = [r for r in _ok(records) if r.get("gbps")]
    ks = sorted({r["kv_heads"] for r in ok}, reverse=True)
    for i, impl in enumerate(dict.fromkeys(r["impl"] for r in ok)):
        colour = impl_style(impl, i)[0]
        for j, k in enumerate(ks):
            pts = bandwidth_by_context(ok, impl, k)
            if pts:
                ax.plot(*zip(*pts), color=colour, marker=MARKERS[j % len(MARKERS)], linestyle="-",
                        label=f"{label(impl)}, K = {k}")  # fmt: skip
    if read_gbps:
        ax.axhline(read_gbps, color=GREY, linestyle="--", label=f"read ceiling ({read_gbps:.0f} GB/s)")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="S (tokens in the cache)", ylabel="GB/s (fewest bytes / time)", ylim=(0, None), title=title)
    ax.grid(True, color="#dddddd")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


# --- Live against recorded

RANGE = "p10–p90 (ms)"  # the column :func:`with_range` adds


def with_range(records) -> list[dict]:
    """``records`` (copies) with their p10–p90 spread as one column, :data:`RANGE` ('0.1723–0.1730'), for a table;
    "–" where a record has no spread."""
    out = []
    for r in records or ():
        lo, hi = r.get("p10_ms"), r.get("p90_ms")
        out.append({**r, RANGE: f"{lo:.4g}–{hi:.4g}" if lo is not None and hi is not None else "–"})
    return out


def live_check(live, recorded) -> list[dict]:
    """For each ok live record that the recording also measured (same implementation, every point field equal):
    the live record with ``recorded_ms``, ``live_over_recorded`` and ``verdict`` (the live call "faster",
    "slower" or "on par" against the recording, from both spreads)."""
    rows = []
    for r in _ok(live):
        if same := same_point(recorded or [], r, impl=r["impl"]):
            c = compare([r], same)
            rows.append({**r, "recorded_ms": statistics.median(s["median_ms"] for s in same),
                         "live_over_recorded": 1 / c.value, "verdict": c.word})  # fmt: skip
    return rows


# --- Prefill


@dataclass(frozen=True)
class PrefillHeads:
    """One implementation's prefill with one kv head against K = N."""

    impl: str
    kv_full: int
    ms_full: float
    ms_one: float
    change: Claim  # K = 1 against K = N (value: K = N's time / K = 1's; above 1, one kv head is faster)


def prefill_heads(records, impl: str) -> PrefillHeads | None:
    """:class:`PrefillHeads` of ``impl``, or None without both K = 1 and K = N."""
    ok = _ok(records, impl=impl)
    if not ok:
        return None
    full = max(r["kv_heads"] for r in ok)
    one, mha = _ok(ok, kv_heads=1), _ok(ok, kv_heads=full)
    if full == 1 or not one or not mha:
        return None
    return PrefillHeads(impl, full, mha[0]["median_ms"], one[0]["median_ms"], compare(one, mha))


def prefill_figure(records, title: str = ""):
    """Prefill time (median, p10–p90 as error bars) per kv-head count, one group of bars per implementation."""
    ok = _ok(records)
    impls = list(dict.fromkeys(r["impl"] for r in ok))
    ks = sorted({r["kv_heads"] for r in ok}, reverse=True)
    fig, ax = plt.subplots(figsize=(6.4, 3.4), facecolor="white", layout="constrained")
    width = 0.8 / max(len(ks), 1)
    for j, k in enumerate(ks):
        for i, impl in enumerate(impls):
            rs = _ok(ok, impl=impl, kv_heads=k)
            if rs:
                r = rs[0]
                lo, hi = r.get("p10_ms", r["median_ms"]), r.get("p90_ms", r["median_ms"])
                err = [[r["median_ms"] - lo], [hi - r["median_ms"]]]
                ax.bar(i + (j - (len(ks) - 1) / 2) * width, r["median_ms"], width * 0.92, yerr=err, capsize=3,
                       color=impl_style(impl, i)[0], alpha=1.0 - 0.3 * j, edgecolor="black", linewidth=0.5,
                       label=f"K = {k}" if i == 0 else None)  # fmt: skip
                ax.annotate(f"K={k}", (i + (j - (len(ks) - 1) / 2) * width, r["median_ms"]), ha="center",
                            va="bottom", fontsize=7, xytext=(0, 3), textcoords="offset points")  # fmt: skip
    ax.set_xticks(range(len(impls)), [label(i) for i in impls])
    ax.set(ylabel="ms per call (median)", title=title)
    ax.grid(True, axis="y", color="#dddddd")
    return fig


# --- Masks


MASK_PICTURE = {"seq": 16, "window": 4}  # the size the mask pictures are drawn at
ALIBI_HEADS = 8  # heads of the pictures' problem: ALiBi gives head 0 the steepest slope, 2**-(8/N)


def mask_weights(kind: str, *, seq: int = 16, window: int = 4, causal: bool = True, batch_row: int | None = None,
                 head: int = 0) -> np.ndarray:  # fmt: skip
    """The (T, S) attention weights mask ``kind`` leaves when every score is equal (q = 0), computed by the
    float64 reference with v = the identity: each row spreads evenly over the keys the mask keeps (a bias tilts
    it), and a row with no key left is all zeros. ``batch_row`` None picks the batch row that keeps the fewest
    positions (for the padding kind, the padded one)."""
    shape = AttentionShape(2, seq, seq, ALIBI_HEADS, ALIBI_HEADS, seq)
    kw = masks.mask_args(kind, shape, jnp.float32, causal=causal, window=window)
    q = k = np.zeros((2, seq, ALIBI_HEADS, seq))
    v = np.broadcast_to(np.eye(seq)[None, :, None, :], (2, seq, ALIBI_HEADS, seq))
    out = reference_attention(q, k, v, is_causal=causal, **{n: np.asarray(a) if hasattr(a, "shape") else a
                                                             for n, a in kw.items()})  # fmt: skip
    if batch_row is None:
        batch_row = int(np.argmin((out[:, :, head, :] > 0).sum(axis=(1, 2))))
    return out[batch_row, :, head, :]


def masks_figure(kinds=masks.MASK_KINDS, *, seq: int = MASK_PICTURE["seq"], window: int = MASK_PICTURE["window"]):
    """One panel per mask kind (causal, as a decoder uses them): the attention weights each query row (down) gives
    each key (across) when all scores are equal. White: masked out."""
    fig, axes = plt.subplots(1, len(kinds), figsize=(2.3 * len(kinds), 2.7), facecolor="white", layout="constrained")
    names = {"none": "causal (is_causal)", "padding": "padding (a short row)", "window": f"window of {window}",
             "dense": "dense boolean mask", "bias": "ALiBi bias"}  # fmt: skip
    for ax, kind in zip(np.atleast_1d(axes), kinds):
        w = mask_weights(kind, seq=seq, window=window)
        shown = np.ma.masked_where(w == 0, w)
        ax.imshow(shown, cmap="viridis", vmin=0, vmax=1 if kind != "bias" else None, interpolation="nearest")
        ax.set(title=names.get(kind, kind), xticks=[], yticks=[], xlabel="keys →")
        ax.set_facecolor("white")
        for side in ax.spines.values():
            side.set_color("#999999")
    np.atleast_1d(axes)[0].set_ylabel("← queries")
    return fig


def mask_accuracy(impl: str = "xla", *, seq: int = 128, window: int = 16, computed_in: str = "float32") -> list[dict]:
    """Each mask kind (causal) through ``impl`` against the float64 reference, B = 2, T = S = ``seq``, N = 4,
    H = 32, float32: rows {impl, mask, max_abs_error, verdict} (the verdict against ``computed_in``'s rounding:
    "tf32" where float32 matmuls run on TF32 tensor cores)."""
    q, k, v = make_qkv(2, seq, 4, 32, seed=4)
    shape = AttentionShape(2, seq, seq, 4, 4, 32)
    rows = []
    for kind in masks.MASK_KINDS:
        kw = masks.mask_args(kind, shape, q.dtype, causal=True, window=window)
        arrays, static = masks.split_static(kw)
        attend = jax.jit(lambda q, k, v, arrays, static=static: dot_product_attention(
            q, k, v, implementation=impl, is_causal=True, **static, **arrays))  # fmt: skip
        out = attend(q, k, v, arrays)
        ref = reference_attention(q, k, v, is_causal=True, **{n: np.asarray(a) if hasattr(a, "shape") else a
                                                              for n, a in kw.items()})  # fmt: skip
        diff = float(np.max(np.abs(np.asarray(out, np.float64) - ref)))
        rows.append({"impl": impl, "mask": kind, "max_abs_error": diff, "verdict": agreement(diff, computed_in).word})
    return rows


def kept_tflops(records, provenance) -> list[dict]:
    """``records`` with TFLOP/s and % of peak recomputed from the score positions each mask keeps (this build's
    FLOP model), against the bf16 matmul peak of the masks grid's recording run (else the file's)."""
    prov = provenance or {}
    peak = prov.get("grids", {}).get("masks", {}).get("matmul_bf16_tflops") or prov.get("matmul_bf16_tflops")
    out = []
    for r in records or ():
        r = dict(r)
        if r.get("status") == "ok":
            f = attention_flops(r["batch"], r["seq_q"], r["seq_kv"], r["heads"], r["head_dim"], causal=r["causal"],
                                mask=r.get("mask", "none"))  # fmt: skip
            r["tflops"] = f / (r["median_ms"] * 1e-3) / 1e12
            r["pct_peak"] = 100 * r["tflops"] / peak if peak else None
        out.append(r)
    return out


def dense_vs_causal(records, impl: str = "cudnn") -> Claim | None:
    """``impl`` with ``is_causal`` against the same causal mask given as a dense boolean matrix (value: the dense
    mask's time / is_causal's; word "faster" when is_causal is faster outside the spreads); None without both."""
    causal = _ok(records, impl=impl, mask="none", causal=True)
    dense = _ok(records, impl=impl, mask="dense", causal=False)  # the dense mask is the causal triangle itself
    return compare(causal, dense) if causal and dense else None


@dataclass(frozen=True)
class MaskCosts:
    """One implementation's times on the masks grid (ms, medians; None where the point did not run)."""

    impl: str
    plain_ms: float | None  # no mask at all
    causal_ms: float | None  # is_causal and nothing else
    masked_low: float | None  # the fastest and slowest of every point with is_causal (alone or with another mask)
    masked_high: float | None
    dense_ms: float | None  # the causal triangle as a dense boolean matrix, without is_causal
    window_ms: float | None  # a causal window
    dense_vs_causal: Claim | None  # is_causal against that dense matrix (see :func:`dense_vs_causal`)


def mask_costs(records, impl: str) -> MaskCosts:
    """:class:`MaskCosts` of ``impl`` on the masks grid."""

    def ms(**where):
        rs = _ok(records, impl=impl, **where)
        return rs[0]["median_ms"] if rs else None

    masked = [r["median_ms"] for r in _ok(records, impl=impl, causal=True)]
    return MaskCosts(impl, ms(mask="none", causal=False), ms(mask="none", causal=True), min(masked, default=None),
                     max(masked, default=None), ms(mask="dense", causal=False), ms(mask="window", causal=True),
                     dense_vs_causal(records, impl))  # fmt: skip


def failed(records) -> list[dict]:
    """The records that did not run (unsupported, oom, error)."""
    return [r for r in records or () if r.get("status") != "ok"]


def over_peak(records) -> list[dict]:
    """The ok records above 100 % of the peak (a FLOP model that credits work the mask removed would show here)."""
    return [r for r in _ok(records) if (r.get("pct_peak") or 0) > 100]


#: Tick labels of :func:`masks_cost_figure`: the dense mask is the causal triangle as a matrix, with or without
#: ``is_causal``.
MASK_COST_NAMES = {"dense": "dense\n(causal matrix)"}


def masks_cost_figure(records, title: str = ""):
    """Median time per mask kind: one panel per causal setting, a bar per implementation; a point that did not
    run is marked with its status instead of a bar."""
    ok_or_not = [r for r in records or () if "mask" in r]
    kinds = [k for k in masks.MASK_KINDS if any(r["mask"] == k for r in ok_or_not)]
    impls = list(dict.fromkeys(r["impl"] for r in ok_or_not))
    settings = sorted({r["causal"] for r in ok_or_not}, reverse=True)
    fig, axes = plt.subplots(1, len(settings), figsize=(5.0 * len(settings), 3.4), facecolor="white",
                             layout="constrained", sharey=True, squeeze=False)  # fmt: skip
    width = 0.8 / max(len(impls), 1)
    handles = {}
    for ax, causal in zip(axes[0], settings):
        for i, impl in enumerate(impls):
            colour = impl_style(impl, i)[0]
            for x, kind in enumerate(kinds):
                rs = [r for r in ok_or_not if r["impl"] == impl and r["mask"] == kind and r["causal"] == causal]
                pos = x + (i - (len(impls) - 1) / 2) * width
                if rs and rs[0].get("status") == "ok":
                    bar = ax.bar(pos, rs[0]["median_ms"], width * 0.92, color=colour, edgecolor="black", linewidth=0.5)
                    handles.setdefault(label(impl), bar)
                elif rs:
                    ax.text(pos, 0, rs[0]["status"], rotation=90, ha="center", va="bottom", fontsize=7, color=colour)
        ax.set_xticks(range(len(kinds)), [MASK_COST_NAMES.get(k, k) for k in kinds], fontsize=8)
        ax.set_title("causal" if causal else "no causal mask", fontsize=10)
        ax.grid(True, axis="y", color="#dddddd")
    axes[0][0].set_ylabel("ms per call (median)")
    if handles:
        axes[0][-1].legend(list(handles.values()), list(handles), fontsize=8, loc="upper left",
                           bbox_to_anchor=(1.01, 1.0))  # fmt: skip
    if title:
        fig.suptitle(title, fontsize=11)
    return fig
