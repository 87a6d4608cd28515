"""The page "TransformerEngine and FP8": TE against JAX's cuDNN path, FP8 against bf16, and the formats drawn.

Functions return rows and small summaries (ratios with their range over runs, verdict counts); the page's markdown
holds the sentences.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import matplotlib.pyplot as plt

from ..measure import profile
from ..results.plotting import GREY, PALETTE
from . import claims


@dataclass(frozen=True)
class Versus:
    """A's speed against B's at several points: B's time / A's time (above 1: A faster)."""

    low: float  # the smallest median ratio over the points
    high: float  # the largest
    words: dict  # verdict ("faster", "on par", "slower") -> number of points
    points: int

    @property
    def verdict(self) -> str:
        """One word for all points: the common verdict, or "mixed"."""
        return next(iter(self.words)) if len(self.words) == 1 else "mixed"


def _summary(rows) -> Versus | None:
    if not rows:
        return None
    ratios = [r["ratio"] for r in rows]
    return Versus(min(ratios), max(ratios), dict(Counter(r["word"] for r in rows)), len(rows))


def te_vs_cudnn(te_records, all_records) -> list[dict]:
    """One row per ok TE record that JAX's cuDNN path also measured at the same point: the ratio cuDNN time / TE
    time (median), its range from the two p10–p90 spreads, and the verdict word (:func:`claims.compare`)."""
    rows = []
    for r in te_records or []:
        if r.get("impl") != "te" or r.get("status") != "ok":
            continue
        same = claims.same_point(all_records, r, impl="cudnn")
        if same:
            c = claims.compare([r], same)
            rows.append({**r, "ratio": c.value, "low": c.low, "high": c.high, "word": c.word})
    return rows


@dataclass(frozen=True)
class AroundKernel:
    """One profiled call: its main kernel's time and everything else it launched, in µs per call."""

    impl: str
    causal: bool
    main_us: float
    other_us: float
    other: tuple  # (name, µs per call) of the other kernels, memsets and copies, longest first


def around_kernel(device_time_records) -> list[AroundKernel]:
    """What each profiled call (``device_time`` records) spends on its main kernel and on everything around it."""
    out = []
    for r in device_time_records or []:
        kernels = [k for k in r.get("kernels") or [] if k.get("kind") != "op"]
        if r.get("status") != "ok" or not kernels:
            continue
        main = max(kernels, key=lambda k: k["us"])
        rest = sorted((k for k in kernels if k is not main), key=lambda k: -k["us"])
        out.append(AroundKernel(r["impl"], r["causal"], main["us"], sum(k["us"] for k in rest),
                                tuple((k["name"], k["us"]) for k in rest)))  # fmt: skip
    return out


@dataclass(frozen=True)
class DevicePair:
    """Two implementations' device-time profiles at one point, side by side (one profile each: a mean over its
    calls, no spread). Times in µs per call; ``host``: ``a``'s pipelined time against ``b``'s (:func:`claims.compare`
    over their spreads, from the separate timing in the same recording)."""

    causal: bool
    same_kernel: bool
    a_kernel: str
    b_kernel: str
    a_kernel_us: float
    b_kernel_us: float
    a_device_us: float
    b_device_us: float
    a_ms: float
    b_ms: float
    host: claims.Claim

    @property
    def host_gap_outside_kernels(self) -> bool:
        """Whether the host's verdict points against the device's: ``a`` faster (slower) on the host, outside the
        spreads, while its GPU work is the longer (shorter) one, so the gap lies outside the kernels."""
        if self.host.word == "on par" or self.a_device_us == self.b_device_us:
            return False
        return (self.host.word == "faster") == (self.a_device_us > self.b_device_us)


def device_pairs(device_time_records, a_impl: str = "te", b_impl: str = "cudnn") -> list[DevicePair]:
    """:class:`DevicePair` at each point where both implementations were profiled (same shape, mask, dtype)."""
    out = []
    for a in device_time_records or []:
        if a["impl"] != a_impl or a.get("status") != "ok" or not a.get("device_ms") or not profile.main_kernel(a):
            continue
        for b in claims.same_point(device_time_records, a, impl=b_impl):
            if not b.get("device_ms") or not profile.main_kernel(b):
                continue
            ka, kb = profile.main_kernel(a), profile.main_kernel(b)
            out.append(DevicePair(a["causal"], bool(profile.same_kernel(a, b)), ka["name"], kb["name"], ka["us"],
                                  kb["us"], 1e3 * a["device_ms"], 1e3 * b["device_ms"], a["median_ms"],
                                  b["median_ms"], claims.compare([a], [b])))  # fmt: skip
    return out


def device_pair_rows(pairs, a_name: str = "TE", b_name: str = "JAX") -> list[dict]:
    """Table rows of :func:`device_pairs`: per mask, the main kernels' and the summed device times, the host's."""
    return [{"mask": "causal" if p.causal else "none", "same main kernel": "yes" if p.same_kernel else "no",
             f"{a_name} kernel (µs)": f"{p.a_kernel_us:.1f}", f"{b_name} kernel (µs)": f"{p.b_kernel_us:.1f}",
             f"{a_name} all GPU work (µs)": f"{p.a_device_us:.1f}", f"{b_name} all GPU work (µs)": f"{p.b_device_us:.1f}",
             f"{a_name} / {b_name} host (ms)": f"{p.a_ms:.4f} / {p.b_ms:.4f}", f"{a_name} on the host": p.host.word}
            for p in pairs]  # fmt: skip


# TE's fused-attention backends (``NVTE_Fused_Attn_Backend``) in words
BACKENDS = {
    "NVTE_F16_arbitrary_seqlen": "cuDNN's flash-attention backend",
    "NVTE_F16_max512_seqlen": "cuDNN's backend for sequences up to 512",
    "NVTE_FP8": "cuDNN's FP8 backend",
    "NVTE_No_Backend": "no fused backend (TE falls back to unfused attention)",
}


def backend_words(te_records) -> tuple[str, int, bool] | None:
    """The backend TE chose over its ok records, in words (several joined), the number of records, and whether one
    backend served them all; None without any recorded backend."""
    names = [r.get("backend") for r in te_records or [] if r.get("status") == "ok" and r.get("backend")]
    if not names:
        return None
    kinds = sorted(set(names))
    return "; ".join(BACKENDS.get(n, n) for n in kinds), len(names), len(kinds) == 1


def less_time(ratio: float) -> float:
    """Percent less time TE takes than the other path, from the other's time over TE's (negative: TE takes longer)."""
    return 100.0 * (1.0 - 1.0 / ratio)


def gap_by_length(rows) -> list[dict]:
    """Rows of :func:`te_vs_cudnn` per T: the least and most percent less time TE takes there (:func:`less_time`),
    and whether every point there is "on par" (within the range over runs)."""
    out = []
    for t in sorted({r["seq_q"] for r in rows}):
        at = [r for r in rows if r["seq_q"] == t]
        pct = [less_time(r["ratio"]) for r in at]
        out.append({"seq_q": t, "least": min(pct), "most": max(pct), "on_par": all(r["word"] == "on par" for r in at)})
    return out


def pays_from(rows, causal: bool) -> int | None:
    """The shortest T from which FP8 is faster at every recorded longer T (rows of :func:`fp8_speedups`), or None."""
    rs = sorted((r for r in rows if r["causal"] == causal), key=lambda r: r["seq_q"])
    first = None
    for r in reversed(rs):
        if r["word"] != "faster":
            break
        first = r["seq_q"]
    return first


def same_error(a: float, b: float, tolerance: float = 0.01) -> bool:
    """Whether two relative errors agree within ``tolerance`` of the larger (1 %: the same error for a reader)."""
    return abs(a - b) <= tolerance * max(abs(a), abs(b))


# TE's DotProductAttention as the package calls it, spelled out (te_config gives these arguments; a test checks it)
TE_CALL = """\
import math
import transformer_engine.jax.flax as te_flax

# q: (B, T, N, H); k, v: (B, S, K, H); bf16
attention = te_flax.DotProductAttention(
    head_dim=H,
    num_attention_heads=N,
    num_gqa_groups=K,  # the codelab's kv heads
    attn_mask_type="causal",  # or "no_mask"
    qkv_layout="bshd_bshd_bshd",  # three arrays, batch first
    transpose_batch_sequence=False,
    scale_factor=1 / math.sqrt(H),  # the codelab's scale
    attention_dropout=0.0,
)
out = attention.apply({}, q, k, v, deterministic=True)  # no parameters
"""


def te_vs_cudnn_figure(rows):
    """TE's speed over JAX's cuDNN path's (cuDNN time / TE time) against T, one line per pass and head size, the
    range over runs as error bars; 1 = the same speed."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    series = sorted({(r["pass"], r["head_dim"]) for r in rows})
    for i, (p, h) in enumerate(series):
        rs = sorted((r for r in rows if (r["pass"], r["head_dim"]) == (p, h)), key=lambda r: r["seq_q"])
        err = [[r["ratio"] - r["low"] for r in rs], [r["high"] - r["ratio"] for r in rs]]
        ax.errorbar([r["seq_q"] for r in rs], [r["ratio"] for r in rs], yerr=err, marker="o", capsize=3,
                    color=PALETTE[i % len(PALETTE)], linestyle="-" if p == "fwd" else "--",
                    label=f"{'forward' if p == 'fwd' else 'forward + backward'}, H = {h}")  # fmt: skip
    ax.axhline(1.0, color=GREY, linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("T = S (B·T fixed)")
    ax.set_ylabel("TE's speed / cuDNN's")
    ax.set_title("TE against JAX's cuDNN path, causal (above 1: TE faster)", fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def table_rows(rows, fields=("seq_q", "head_dim", "pass")) -> list[dict]:
    """Rows of :func:`te_vs_cudnn` or :func:`fp8_speedups` for a table: the point, the ratio to 2 decimals, its
    range over runs as one cell, the verdict."""
    return [{**{f: r[f] for f in fields if f in r}, "ratio": f"{r['ratio']:.2f}",
             "range over runs": f"{r['low']:.2f}–{r['high']:.2f}", "verdict": r["word"]} for r in rows]  # fmt: skip


def summary(rows) -> Versus | None:
    """The rows of :func:`te_vs_cudnn` or :func:`fp8_speedups` in one :class:`Versus` (None without rows)."""
    return _summary(rows)


def fp8_speedups(fp8_records, fp8_impl: str = "cudnn_fp8_s448", base: str = "cudnn") -> list[dict]:
    """bf16 cuDNN's time over FP8 cuDNN's at every (T, mask) both recorded: above 1, FP8 is faster."""
    ok = [r for r in fp8_records or [] if r.get("status") == "ok"]
    rows = []
    for f in (r for r in ok if r["impl"] == fp8_impl):
        b = [r for r in ok if r["impl"] == base and r["seq_q"] == f["seq_q"] and r["causal"] == f["causal"]]
        if b:
            c = claims.compare([f], b)
            rows.append({"seq_q": f["seq_q"], "causal": f["causal"], "ratio": c.value, "low": c.low,
                         "high": c.high, "word": c.word})  # fmt: skip
    return sorted(rows, key=lambda r: (r["causal"], r["seq_q"]))


def fp8_speedup_figure(rows):
    """bf16 time / FP8 time against T, one line per mask, the range over runs as error bars; 1 = the same speed. The
    FP8 times are end to end: each call quantises its bf16 inputs."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for causal in (False, True):
        rs = [r for r in rows if r["causal"] == causal]
        if not rs:
            continue
        x = [r["seq_q"] for r in rs]
        y = [r["ratio"] for r in rs]
        err = [[r["ratio"] - r["low"] for r in rs], [r["high"] - r["ratio"] for r in rs]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, color=PALETTE[3 if causal else 0],
                    linestyle="--" if causal else "-", label="causal" if causal else "no mask")  # fmt: skip
    ax.axhline(1.0, color=GREY, linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("T = S")
    ax.set_ylabel("bf16 time / FP8 time (end to end)")
    ax.set_title("cuDNN's FP8 attention against its bf16 attention", fontsize=10)
    ax.legend(frameon=False)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


# (sign, exponent, stored mantissa) bits and the largest finite value of each format
FORMATS = {
    "float32": (1, 8, 23, 3.4028235e38),
    "bfloat16": (1, 8, 7, 3.3895314e38),
    "float16": (1, 5, 10, 65504.0),
    "FP8 E4M3": (1, 4, 3, 448.0),
    "FP8 E5M2": (1, 5, 2, 57344.0),
}


def formats_figure(names=("bfloat16", "float16", "FP8 E4M3", "FP8 E5M2")):
    """The bit fields of each format, one row each: sign, exponent (range), stored mantissa (precision)."""
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(names) + 0.6))
    colours = {"sign": "#7F7F7F", "exponent": PALETTE[0], "mantissa": PALETTE[1]}
    for row, name in enumerate(reversed(names)):
        sign, exp, man, largest = FORMATS[name]
        start = 0
        for part, width in (("sign", sign), ("exponent", exp), ("mantissa", man)):
            ax.barh(row, width, left=start, color=colours[part], edgecolor="white")
            start += width
        ax.text(start + 0.3, row, f"max {largest:.4g}", va="center", fontsize=9)
    ax.set_yticks(range(len(names)), list(reversed(names)))
    ax.set_xlabel("bits")
    ax.set_xlim(0, 22)
    ax.set_xticks(range(0, 17, 4))
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, ["sign", "exponent: range", "stored mantissa: precision"], frameon=False, ncol=3,
              loc="upper center", bbox_to_anchor=(0.5, 1.35), fontsize=9)  # fmt: skip
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig
