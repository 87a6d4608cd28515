"""The figures of the page on masks (``docs/kernel_masks.md``) that take more than a few lines: what each mask of
``jax.nn.dot_product_attention`` leaves of the score matrix, and what each costs.

The numbers and the sentences are in the page, computed there from the records.
Shape legend: B batch, T query length, S key length, N query heads, K kv heads, H head dim.
"""

from __future__ import annotations

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

from ..inputs import AttentionShape
from ..kernels import masks
from ..kernels.reference import reference_attention
from ..results.plotting import impl_style, label
from ..results.store import select

MASK_PICTURE = {"seq": 16, "window": 4}  # the size the mask pictures are drawn at
ALIBI_HEADS = 8  # heads of the pictures' problem: ALiBi gives head 0 the steepest slope, 2**-(8/N)


def mask_weights(kind: str, *, seq: int = 16, window: int = 4, head: int = 0) -> np.ndarray:
    """The (T, S) causal attention weights mask ``kind`` leaves when every score is equal (q = 0), computed by the
    float64 reference with v = the identity: each row spreads evenly over the keys the mask keeps (a bias tilts
    it). Of the two batch rows, the one that keeps fewer positions (for the padding kind, the padded one)."""
    shape = AttentionShape(2, seq, seq, ALIBI_HEADS, ALIBI_HEADS, seq)
    kw = masks.mask_args(kind, shape, jnp.float32, causal=True, window=window)
    q = np.zeros((2, seq, ALIBI_HEADS, seq))
    v = np.broadcast_to(np.eye(seq)[None, :, None, :], q.shape)
    arrays = {n: np.asarray(a) if hasattr(a, "shape") else a for n, a in kw.items()}  # the window stays a tuple
    out = reference_attention(q, q, v, is_causal=True, **arrays)[:, :, head]
    return out[np.argmin((out > 0).sum(axis=(1, 2)))]


def masks_figure(kinds=masks.MASK_KINDS, *, seq: int = MASK_PICTURE["seq"], window: int = MASK_PICTURE["window"]):
    """One panel per mask kind (causal, as a decoder uses them): :func:`mask_weights`, each query row (down) over the
    keys (across). White: masked out."""
    names = {"none": "causal (is_causal)", "padding": "padding (a short row)", "window": f"window of {window}"}
    names |= {"dense": "dense boolean mask", "bias": "ALiBi bias"}
    fig, axes = plt.subplots(1, len(kinds), figsize=(2.3 * len(kinds), 2.7), layout="constrained", squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        w = mask_weights(kind, seq=seq, window=window)
        ax.imshow(np.ma.masked_where(w == 0, w), vmin=0, vmax=None if kind == "bias" else 1, interpolation="nearest")
        ax.set(title=names.get(kind, kind), xticks=[], yticks=[], xlabel="keys →")
    axes[0][0].set_ylabel("← queries")
    return fig


#: Tick labels of :func:`masks_cost_figure`: the dense mask is the causal triangle as a matrix.
MASK_COST_NAMES = {"dense": "dense\n(causal matrix)"}


def masks_cost_figure(records, title: str = ""):
    """Median time per mask kind: one panel per causal setting, a bar per implementation; a point that did not run
    is named by its status instead of a bar."""
    kinds = [k for k in masks.MASK_KINDS if any(r.get("mask") == k for r in records)]
    impls = list(dict.fromkeys(r["impl"] for r in records))
    colours = {impl: impl_style(impl, i)[0] for i, impl in enumerate(impls)}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), layout="constrained", sharey=True)
    width = 0.8 / len(impls)
    for ax, causal in zip(axes, (True, False)):
        for i, impl in enumerate(impls):
            for x, kind in enumerate(kinds):
                pos = x + (i - (len(impls) - 1) / 2) * width
                for r in select(records, impl=impl, causal=causal, mask=kind):
                    if r["status"] == "ok":
                        ax.bar(pos, r["median_ms"], width * 0.92, color=colours[impl], edgecolor="black", lw=0.5)
                    else:
                        ax.text(pos, 0, r["status"], rotation=90, ha="center", va="bottom", color=colours[impl])
        ax.set_xticks(range(len(kinds)), [MASK_COST_NAMES.get(k, k) for k in kinds], fontsize=8)
        ax.set_title("causal" if causal else "no causal mask", fontsize=10)
        ax.grid(True, axis="y", color="#dddddd")
    axes[0].set_ylabel("ms per call (median)")
    handles = [Patch(color=c, label=label(impl)) for impl, c in colours.items()]
    axes[1].legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title, fontsize=11)
    return fig


def race_rows(provenance, groups=("masks", "masks_backward")) -> list[dict]:
    """One row per recorded race of ``groups`` (:mod:`attention_tutorial.measure.race`), in the order they ran: the
    mask (``mask``), ``pass``, our median ms (``ms``), our TFLOP/s on the kept scores (``tflops``), the baseline
    (``against``) and our speed against it (its time over ours, ``speed``); where our kernel also ran with the plain
    causal mask over the whole row: its ms (``causal_ms``), how much faster ours ran (``vs_causal``) and our rate
    over the causal kernel's own rate on the causal triangle's kept scores (``rate_vs_causal``). None where a
    contender was not timed (``error`` says why, for ours)."""
    from ..measure.flops import attention_flops

    rows = []
    for race in ((provenance or {}).get("race") or {}).values():
        if race.get("group") not in groups:
            continue
        by = {r["contender"]: r for r in race["rows"]}
        ours, causal = by.get("ours") or {}, by.get("ours, causal") or {}
        ms, causal_ms = ours.get("median_ms"), causal.get("median_ms")
        row = {
            "mask": race["case"],
            "pass": race["pass"],
            "ms": ms,
            "tflops": ours.get("tflops"),
            "against": race["baseline"],
            "speed": ours.get("speed"),
            "causal_ms": causal_ms,
            "vs_causal": causal_ms / ms if ms and causal_ms else None,
            "rate_vs_causal": None,
            "error": ours.get("error") if isinstance(ours.get("error"), str) else None,
        }
        if ms and causal_ms:
            B, T, S, N, _, H = race["shape"]
            causal_tflops = attention_flops(B, T, S, N, H, causal=True, pass_=race["pass"]) / causal_ms / 1e9
            row["rate_vs_causal"] = ours["tflops"] / causal_tflops
        rows.append(row)
    return rows
