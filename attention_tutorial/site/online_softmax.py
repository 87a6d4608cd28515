"""What "How can softmax run one tile at a time?" needs: the online softmax traced step by step, the tiles a query
block walks, the compiled memory of the naive and the tiled versions, and the IO argument — the bytes each version
must move, computed from the shapes, set against the times the recorder measured.

Shapes as everywhere: B batch, T queries, S keys, N query heads, K kv heads, H head dim.
"""

from __future__ import annotations

import dataclasses
import itertools

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from ..measure.flops import attention_bytes, attention_flops, materialised_bytes
from ..results.claims import Claim, growth_terms
from ..results.plotting import PALETTE, impl_style, label

# --- the online softmax, one row ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OnlineStep:
    """The running state of one query row after a block of keys: keys seen so far, the running max ``m``, the sum
    carried over from earlier blocks rescaled to the new max (``carried``), this block's own sum (``added``),
    ``l = carried + added``, and the output ``acc / l`` so far."""

    keys_seen: int
    m: float
    carried: float
    added: float
    out: float

    @property
    def l(self) -> float:  # noqa: E743  (the name the papers and the kernels use)
        return self.carried + self.added


def online_softmax_steps(scores, values, block: int) -> list[OnlineStep]:
    """Walk one row's ``scores`` (S,) and ``values`` (S,) in blocks of ``block`` keys, as a FlashAttention kernel
    does, in float64: after each block, :class:`OnlineStep`. The last step's ``out`` is softmax(scores) · values."""
    s = np.asarray(scores, np.float64)
    v = np.asarray(values, np.float64)
    if s.ndim != 1 or s.shape != v.shape or not s.size:
        raise ValueError(f"online_softmax_steps takes one row: scores and values of one equal length (S,); got "
                         f"shapes {s.shape} and {v.shape}.")  # fmt: skip
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int (keys per block); got {block!r}.")
    m, l, acc, steps = -np.inf, 0.0, 0.0, []
    for start in range(0, s.size, block):
        sb, vb = s[start : start + block], v[start : start + block]
        m_new = max(m, float(sb.max()))
        rescale = float(np.exp(m - m_new))  # exp(-inf) = 0 before the first block
        p = np.exp(sb - m_new)
        carried, added = rescale * l, float(p.sum())
        l, acc, m = carried + added, rescale * acc + float(p @ vb), m_new
        steps.append(OnlineStep(start + sb.size, m, carried, added, acc / l))
    return steps


def online_softmax_figure(scores, values, block: int):
    """Two panels for one row walked in blocks: the scores with the running max after each block, and the running
    sum l after each block split into what was carried over (rescaled to the new max) and what the block added."""
    steps = online_softmax_steps(scores, values, block)
    s = np.asarray(scores, np.float64)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.6, 5.2), sharex=True, layout="constrained", facecolor="white")
    edges = [0, *[st.keys_seen for st in steps]]
    for i, (a, b) in enumerate(itertools.pairwise(edges)):
        for ax in (top, bottom):
            ax.axvspan(a - 0.5, b - 0.5, color="#f2f2f2" if i % 2 else "white", zorder=0)
        top.plot(range(a, b), s[a:b], "o", color=PALETTE[0], markersize=5, zorder=3)
        top.hlines(steps[i].m, a - 0.5, b - 0.5, color=PALETTE[3], linewidth=2.2, zorder=2)
        if i:
            top.vlines(a - 0.5, steps[i - 1].m, steps[i].m, color=PALETTE[3], linewidth=1.2, linestyle=":")
        mid = (a + b - 1) / 2
        bottom.bar(mid, steps[i].carried, width=0.8 * (b - a), color=PALETTE[5], zorder=2)
        bottom.bar(mid, steps[i].added, width=0.8 * (b - a), bottom=steps[i].carried, color=PALETTE[1], zorder=2)
    top.set_ylabel("score sⱼ")
    top.legend(handles=[plt.Line2D([], [], marker="o", linestyle="", color=PALETTE[0], label="scores of the row"),
                        plt.Line2D([], [], color=PALETTE[3], linewidth=2.2, label="running max m")],
               fontsize=8, loc="lower right")  # fmt: skip
    bottom.set_ylabel("running sum l")
    bottom.set_xlabel(f"key j (blocks of {block})")
    bottom.legend(handles=[Patch(color=PALETTE[5], label="carried over, × exp(m_old − m_new)"),
                           Patch(color=PALETTE[1], label="added by this block")], fontsize=8, loc="upper left")  # fmt: skip
    for ax in (top, bottom):
        ax.grid(True, axis="y", color="#dddddd", linewidth=0.8)
    return fig


# --- tiles walking the keys -----------------------------------------------------------------------------------------


def tile_walk(n_q: int, n_k: int, *, causal: bool) -> dict[tuple[int, int], str]:
    """{(query block, key block): 'full', 'masked' or 'skipped'} for square tiles: with a causal mask a key block
    wholly after the query block is skipped and the diagonal one masked; without one every block is 'full'."""
    if n_q < 1 or n_k < 1:
        raise ValueError(f"tile_walk needs at least one block each way; got {n_q} × {n_k}.")
    return {(i, j): ("full" if not causal or j < i else "masked" if j == i else "skipped")
            for i in range(n_q) for j in range(n_k)}  # fmt: skip


def tiles_figure(n_q: int = 6, n_k: int = 6, *, query_block: int = 3):
    """The T × S score matrix cut into tiles, without a mask and causal side by side: one query block's row of tiles
    numbered in the order its loop walks them; with the causal mask, the tiles it skips and the one it masks."""
    colours = {"full": PALETTE[0], "masked": PALETTE[1], "skipped": "#e6e6e6"}
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 4.3), layout="constrained", facecolor="white")
    for ax, causal in zip(axes, (False, True)):
        walk = tile_walk(n_q, n_k, causal=causal)
        step = 0
        for (i, j), kind in walk.items():
            active = i == query_block
            face = colours[kind] if active else ("#f7f7f7" if kind == "skipped" else "#c9d9ea")
            ax.add_patch(Rectangle((j, n_q - 1 - i), 1, 1, facecolor=face, edgecolor="white", linewidth=1.5))
            if active and kind != "skipped":
                step += 1
                ax.text(j + 0.5, n_q - 0.5 - i, str(step), ha="center", va="center", color="white", fontsize=10)
        ax.set_xlim(0, n_k)
        ax.set_ylim(0, n_q)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("keys (S) →")
        ax.set_ylabel("← queries (T)")
        ax.set_title("causal: skip what lies after the diagonal" if causal else "no mask: every tile", fontsize=10)
    fig.legend(handles=[Patch(color=colours["full"], label="tile computed (its number: the order of the loop)"),
                        Patch(color=colours["masked"], label="tile on the diagonal: computed with the mask"),
                        Patch(color="#f7f7f7", label="skipped: never computed")],
               loc="outside lower center", ncol=3, fontsize=8, frameon=False)  # fmt: skip
    return fig


# --- memory: what the compiler keeps ------------------------------------------------------------------------------


def memory_growth(records) -> dict[tuple[str, str], Claim]:
    """{(impl, pass): how its compiled temporaries grow with T} from records with impl, pass, seq_q, temp_bytes
    (:func:`attention_tutorial.results.claims.growth_terms`: the word, and the growth per doubling as value, low,
    high)."""
    out = {}
    for key in dict.fromkeys((r["impl"], r["pass"]) for r in records):
        rs = sorted((r for r in records if (r["impl"], r["pass"]) == key), key=lambda r: r["seq_q"])
        if len(rs) < 2:
            raise ValueError(f"memory_growth needs at least two T per (impl, pass); {key} has {len(rs)}.")
        out[key] = growth_terms([r["seq_q"] for r in rs], [r["temp_bytes"] for r in rs], var="T")
    return out


# --- the IO argument -------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class IOPoint:
    """One recorded point (no mask) of the naive attention and cuDNN's fused kernel at the same shape.

    ``naive_bytes``: the fewest bytes the naive version moves through HBM — q, k, v and the output once, plus the
    T × S matrix (:func:`~attention_tutorial.measure.flops.materialised_bytes`: the scores written and read back in
    float32, the weights in the inputs' dtype);
    ``fused_bytes``: q, k, v and the output once. ``*_floor_ms``: those bytes at the measured copy bandwidth;
    ``matmul_ms``: the forward's FLOPs at the measured bf16 matmul peak; ``naive_ms``, ``fused_ms``: the medians."""

    seq_q: int
    batch: int
    naive_bytes: int
    fused_bytes: int
    naive_floor_ms: float
    fused_floor_ms: float
    matmul_ms: float
    naive_ms: float
    fused_ms: float

    @property
    def traffic_ratio(self) -> float:
        return self.naive_bytes / self.fused_bytes

    @property
    def naive_share(self) -> float:
        """The share of the naive version's measured time its bytes need at the copy bandwidth."""
        return self.naive_floor_ms / self.naive_ms

    @property
    def fused_share(self) -> float:
        """The share of the fused kernel's measured time its matmuls need at the matmul peak."""
        return self.matmul_ms / self.fused_ms


def io_points(records, provenance: dict, *, naive: str = "naive", fused: str = "cudnn") -> list[IOPoint]:
    """:class:`IOPoint` at each recorded point (no mask, ok) where both ``naive`` and ``fused`` ran, by T; the
    bandwidth and the peak from the recording run of the records' grid (``provenance``'s, else the file's)."""
    by_point: dict[tuple, dict] = {}
    for r in records:
        if r.get("status") == "ok" and not r.get("causal") and r.get("impl") in (naive, fused):
            key = tuple(r.get(f) for f in ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim", "dtype"))
            by_point.setdefault(key, {})[r["impl"]] = r
    points = []
    for (b, t, s, n, k, h, dtype), pair in sorted(by_point.items(), key=lambda kv: kv[0][1]):
        if naive not in pair or fused not in pair:
            continue
        run = provenance.get("grids", {}).get(pair[fused].get("grid"), {})
        gbps = run.get("copy_gbps") or provenance["copy_gbps"]
        tflops = run.get("matmul_bf16_tflops") or provenance["matmul_bf16_tflops"]
        nb, fb = materialised_bytes(b, t, s, n, k, h, dtype), attention_bytes(b, t, s, n, k, h, dtype)
        points.append(IOPoint(t, b, nb, fb, nb / gbps / 1e6, fb / gbps / 1e6,
                              attention_flops(b, t, s, n, h) / tflops / 1e9,
                              pair[naive]["median_ms"], pair[fused]["median_ms"]))  # fmt: skip
    return points


def io_rows(points) -> list[dict]:
    """The IO points as table rows (for a folded table): GB each version moves, the time its bound gives, the time
    measured."""
    return [{"T": p.seq_q, "B": p.batch, "naive: GB moved": f"{p.naive_bytes / 1e9:.1f}",
             "fused: GB moved": f"{p.fused_bytes / 1e9:.2f}", "naive: its bytes' time (ms)": f"{p.naive_floor_ms:.2f}",
             "naive: measured (ms)": f"{p.naive_ms:.2f}", "cuDNN: its FLOPs' time (ms)": f"{p.matmul_ms:.2f}",
             "cuDNN: measured (ms)": f"{p.fused_ms:.2f}"} for p in points]  # fmt: skip


def io_figure(points, *, naive: str = "naive", fused: str = "cudnn"):
    """Measured time against T for the naive version and the fused kernel, each beside the bound the IO argument
    gives it: the naive version's bytes at the copy bandwidth, the fused kernel's matmuls at the matmul peak (and
    its own few bytes at the copy bandwidth)."""
    ts = [p.seq_q for p in points]
    fig, ax = plt.subplots(figsize=(7.2, 4.3), layout="constrained", facecolor="white")
    for impl, ys in ((naive, [p.naive_ms for p in points]), (fused, [p.fused_ms for p in points])):
        colour, marker = impl_style(impl)
        ax.plot(ts, ys, marker=marker, color=colour, linewidth=2, label=f"{label(impl)}: measured")
    ax.plot(ts, [p.naive_floor_ms for p in points], color=impl_style(naive)[0], linestyle="--", linewidth=1.4,
            label="its T × S traffic (and q, k, v, out) at the copy bandwidth")  # fmt: skip
    ax.plot(ts, [p.matmul_ms for p in points], color=impl_style(fused)[0], linestyle="--", linewidth=1.4,
            label="the matmuls' FLOPs at the matmul peak")  # fmt: skip
    ax.plot(ts, [p.fused_floor_ms for p in points], color=impl_style(fused)[0], linestyle=":", linewidth=1.4,
            label="q, k, v, out once at the copy bandwidth")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ts, [f"{t // 1024}k" if t >= 1024 else str(t) for t in ts])
    ax.set_xlabel("T = S (B · T fixed)")
    ax.set_ylabel("ms per call")
    ax.grid(True, which="major", color="#dddddd", linewidth=0.8)
    ax.legend(fontsize=8, loc="upper left")
    return fig
