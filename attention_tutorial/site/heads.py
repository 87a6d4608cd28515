"""The figures of the page on shared keys and values (MHA, GQA, MQA, decoding and masks), and the few facts it
shares with other pages: the Llama-like model it sizes caches for, the recorded GPU's memory and its SM count.

The numbers and the sentences are in ``docs/heads_decode_masks.md``, computed there from the records.

Shape legend: B batch, T query length, S key length, N query heads, K kv heads, H head dim.
"""

from __future__ import annotations

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from ..inputs import AttentionShape
from ..kernels import masks
from ..kernels.reference import reference_attention
from ..measure.flops import kv_cache_bytes
from ..results.plotting import GREY, MARKERS, PALETTE, impl_style, label
from ..results.store import select

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
    fig, axes = plt.subplots(
        1, len(layouts), figsize=(3.2 * len(layouts), 2.4), facecolor="white", layout="constrained"
    )
    for ax, (name, kv) in zip(np.atleast_1d(axes), layouts):
        owner = kv_head_of(heads, kv)
        kv_x = (np.arange(kv) + 0.5) * heads / kv - 0.5  # each kv head centred under its group
        for n, j in enumerate(owner):
            ax.plot([n, kv_x[j]], [1, 0], color=PALETTE[j % len(PALETTE)], linewidth=1.2)
        ax.scatter(
            np.arange(heads),
            np.ones(heads),
            s=140,
            marker="s",
            c=[PALETTE[j % len(PALETTE)] for j in owner],
            edgecolors="black",
            linewidths=0.6,
            zorder=3,
        )
        ax.scatter(
            kv_x,
            np.zeros(kv),
            s=260,
            marker="o",
            c=[PALETTE[j % len(PALETTE)] for j in range(kv)],
            edgecolors="black",
            linewidths=0.6,
            zorder=3,
        )
        ax.set(
            title=f"{name}: N = {heads}, K = {kv}",
            xlim=(-0.8, heads - 0.2),
            ylim=(-0.45, 1.45),
            yticks=[0, 1],
            yticklabels=["k, v heads", "query heads"],
            xticks=[],
        )
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    return fig


# --- The KV cache

#: A Llama-like decoder: 32 layers of 32 query heads of H = 128, cached in bf16.
MODEL = {"layers": 32, "heads": 32, "head_dim": 128, "dtype": "bfloat16"}


def kv_cache_gib(kv_heads: int, tokens: int, model=MODEL) -> float:
    """GiB of the KV cache of ``model`` for one sequence of ``tokens`` tokens with ``kv_heads`` kv heads per layer."""
    return kv_cache_bytes(kv_heads, model["head_dim"], model["dtype"], tokens=tokens, layers=model["layers"]) / 2**30


def gpu_memory_gib(provenance) -> float | None:
    """The recorded GPU's memory in GiB (as ``nvidia-smi`` reported it in the recording run), or None."""
    mib = ((provenance or {}).get("environment") or {}).get("gpu_memory_mib")
    return mib / 1024 if mib else None


def kv_cache_figure(provenance=None, *, kv_heads=(32, 8, 1), contexts=tuple(2**i for i in range(11, 18)), model=MODEL):
    """KV cache GiB against context length, one line per kv-head count, and the recorded GPU's memory (dashed)."""
    fig, ax = plt.subplots(figsize=(7, 3.8), facecolor="white", layout="constrained")
    for i, k in enumerate(kv_heads):
        name = "MHA" if k == model["heads"] else "MQA" if k == 1 else "GQA"
        ax.plot(
            contexts,
            [kv_cache_gib(k, c, model) for c in contexts],
            marker="o",
            color=PALETTE[i],
            label=f"{name}, K = {k}",
        )
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


def decode_figure(records, *, read_gbps: float | None = None, title: str = ""):
    """Decode bandwidth (GB/s of the fewest bytes) against the context S: a solid line per implementation (colour)
    and kv-head count (marker), with the measured read ceiling as a dashed grey line without markers."""
    fig, ax = plt.subplots(figsize=(7.4, 4.0), facecolor="white", layout="constrained")
    ok = [r for r in select(records or [], status="ok") if r.get("gbps")]
    ks = sorted({r["kv_heads"] for r in ok}, reverse=True)
    for i, impl in enumerate(dict.fromkeys(r["impl"] for r in ok)):
        colour = impl_style(impl, i)[0]
        for j, k in enumerate(ks):
            pts = sorted((r["seq_kv"], r["gbps"]) for r in select(ok, impl=impl, kv_heads=k))
            if pts:
                ax.plot(
                    *zip(*pts),
                    color=colour,
                    marker=MARKERS[j % len(MARKERS)],
                    linestyle="-",
                    label=f"{label(impl)}, K = {k}",
                )
    if read_gbps:
        ax.axhline(read_gbps, color=GREY, linestyle="--", label=f"read ceiling ({read_gbps:.0f} GB/s)")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="S (tokens in the cache)", ylabel="GB/s (fewest bytes / time)", ylim=(0, None), title=title)
    ax.grid(True, color="#dddddd")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


# --- Prefill


def prefill_figure(records, title: str = ""):
    """Prefill time (median, p10–p90 as error bars) per kv-head count, one group of bars per implementation."""
    ok = select(records or [], status="ok")
    impls = list(dict.fromkeys(r["impl"] for r in ok))
    ks = sorted({r["kv_heads"] for r in ok}, reverse=True)
    fig, ax = plt.subplots(figsize=(6.4, 3.4), facecolor="white", layout="constrained")
    width = 0.8 / max(len(ks), 1)
    for j, k in enumerate(ks):
        for i, impl in enumerate(impls):
            rs = select(ok, impl=impl, kv_heads=k)
            if rs:
                r = rs[0]
                lo, hi = r.get("p10_ms", r["median_ms"]), r.get("p90_ms", r["median_ms"])
                err = [[r["median_ms"] - lo], [hi - r["median_ms"]]]
                ax.bar(
                    i + (j - (len(ks) - 1) / 2) * width,
                    r["median_ms"],
                    width * 0.92,
                    yerr=err,
                    capsize=3,
                    color=impl_style(impl, i)[0],
                    alpha=1.0 - 0.3 * j,
                    edgecolor="black",
                    linewidth=0.5,
                    label=f"K = {k}" if i == 0 else None,
                )
                ax.annotate(
                    f"K={k}",
                    (i + (j - (len(ks) - 1) / 2) * width, r["median_ms"]),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    xytext=(0, 3),
                    textcoords="offset points",
                )
    ax.set_xticks(range(len(impls)), [label(i) for i in impls])
    ax.set(ylabel="ms per call (median)", title=title)
    ax.grid(True, axis="y", color="#dddddd")
    return fig


# --- Masks


MASK_PICTURE = {"seq": 16, "window": 4}  # the size the mask pictures are drawn at
ALIBI_HEADS = 8  # heads of the pictures' problem: ALiBi gives head 0 the steepest slope, 2**-(8/N)


def mask_weights(
    kind: str, *, seq: int = 16, window: int = 4, causal: bool = True, batch_row: int | None = None, head: int = 0
) -> np.ndarray:
    """The (T, S) attention weights mask ``kind`` leaves when every score is equal (q = 0), computed by the
    float64 reference with v = the identity: each row spreads evenly over the keys the mask keeps (a bias tilts
    it), and a row with no key left is all zeros. ``batch_row`` None picks the batch row that keeps the fewest
    positions (for the padding kind, the padded one)."""
    shape = AttentionShape(2, seq, seq, ALIBI_HEADS, ALIBI_HEADS, seq)
    kw = masks.mask_args(kind, shape, jnp.float32, causal=causal, window=window)
    q = k = np.zeros((2, seq, ALIBI_HEADS, seq))
    v = np.broadcast_to(np.eye(seq)[None, :, None, :], (2, seq, ALIBI_HEADS, seq))
    out = reference_attention(
        q, k, v, is_causal=causal, **{n: np.asarray(a) if hasattr(a, "shape") else a for n, a in kw.items()}
    )
    if batch_row is None:
        batch_row = int(np.argmin((out[:, :, head, :] > 0).sum(axis=(1, 2))))
    return out[batch_row, :, head, :]


def masks_figure(kinds=masks.MASK_KINDS, *, seq: int = MASK_PICTURE["seq"], window: int = MASK_PICTURE["window"]):
    """One panel per mask kind (causal, as a decoder uses them): the attention weights each query row (down) gives
    each key (across) when all scores are equal. White: masked out."""
    fig, axes = plt.subplots(1, len(kinds), figsize=(2.3 * len(kinds), 2.7), facecolor="white", layout="constrained")
    names = {
        "none": "causal (is_causal)",
        "padding": "padding (a short row)",
        "window": f"window of {window}",
        "dense": "dense boolean mask",
        "bias": "ALiBi bias",
    }
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
    fig, axes = plt.subplots(
        1,
        len(settings),
        figsize=(5.0 * len(settings), 3.4),
        facecolor="white",
        layout="constrained",
        sharey=True,
        squeeze=False,
    )
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
        axes[0][-1].legend(
            list(handles.values()), list(handles), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0)
        )
    if title:
        fig.suptitle(title, fontsize=11)
    return fig
