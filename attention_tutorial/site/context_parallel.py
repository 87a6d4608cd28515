"""Numbers, verdicts and figures for the page on attention across several devices (context parallelism).

Each function returns numbers (small frozen dataclasses) or draws a figure; the sentences that say them are in
``docs/context_parallel.md``. The one-GPU records come from
:func:`~attention_tutorial.measure.context_parallel.cp_records` and are read in both of their forms: the ring steps
emulated in the implementation's name (``cp_emulated_P4``, ``devices`` = 4) or in their own fields (``ring_steps``,
``gpus``).

Shape legend: B batch, T sequence length, N query heads, K kv heads, H head dim, P devices.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..kernels import context_parallel as cp
from ..kernels.blockwise import blockwise_attention
from ..measure.flops import attention_flops
from ..results.plotting import GREY, PALETTE
from .claims import compare, same_point
from .heads import MODEL

#: NVLink bandwidth of an H200 per direction, from NVIDIA's specification (900 GB/s in total): not measured here.
NVLINK_SPEC_GBPS_PER_DIRECTION = 450
#: The least speed-up over one call that counts as one: below it, P devices would finish about as late as one.
SPEEDUP_MIN = 1.1

# --- why: work and memory per device


@dataclass(frozen=True)
class PerDevice:
    """One causal attention call's work and the q, k, v and output a device holds, with the sequence over P."""

    seq: int
    devices: int
    tflop: float  # TFLOP per device (the causal FLOP model, split evenly)
    gib: float  # q, k, v and out per device, one layer
    seconds: float | None  # the forward's time per device at ``flops_per_s``; None without a rate
    layers: int
    model_gib: float  # q, k, v and out per device for all ``layers`` layers


def per_device(seq: int, devices: int, *, heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
               dtype="bfloat16", flops_per_s: float | None = None,
               layers: int = MODEL["layers"]) -> PerDevice:  # fmt: skip
    """:class:`PerDevice` for B = 1: q and out have N heads, k and v K heads, each T / P tokens long; the time at
    ``flops_per_s`` and the memory of a model of ``layers`` such layers (32, as on the page on sharing keys)."""
    if devices < 1 or seq % devices:
        raise ValueError(f"seq ({seq}) must split evenly over devices ({devices}); pick P dividing T.")
    if layers < 1:
        raise ValueError(f"layers must be at least 1; got {layers}.")
    flops = attention_flops(1, seq, seq, heads, head_dim, causal=True) / devices
    held = (seq // devices) * (2 * heads + 2 * kv_heads) * head_dim * jnp.dtype(dtype).itemsize
    seconds = flops / flops_per_s if flops_per_s else None
    return PerDevice(seq, devices, flops / 1e12, held / 2**30, seconds, layers, layers * held / 2**30)


# --- the two strategies


def float64_reference(q, k, v, d_out, *, causal: bool = True):
    """Attention's output and its gradients (dq, dk, dv) for the cotangent ``d_out``, all in float64 on the CPU
    (whatever device holds the inputs; GQA and a top-left causal mask as in ``jax.nn.dot_product_attention``, whose
    own XLA path accumulates in float32): the reference a sharded run is checked against."""
    with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
        f64 = [jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, v, d_out)]
        out, grads = _f64_out_and_grads(*f64, causal=bool(causal))
        return np.asarray(out), tuple(np.asarray(g) for g in grads)


@functools.partial(jax.jit, static_argnames="causal")  # one program, not one per operation
def _f64_out_and_grads(q, k, v, d_out, *, causal: bool):
    out, vjp = jax.vjp(functools.partial(_attend, causal=causal), q, k, v)
    return out, vjp(d_out)


def _attend(q, k, v, *, causal: bool):  # (B, T, N, H), (B, S, K, H) -> (B, T, N, H)
    (b, t, n, h), (s, kv) = q.shape, k.shape[1:3]
    qg = q.reshape(b, t, kv, n // kv, h)
    scores = jnp.einsum("btkgh,bskh->bkgts", qg, k) / np.sqrt(h)
    if causal:
        scores = jnp.where(jnp.tril(jnp.ones((t, s), bool)), scores, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bkgts,bskh->btkgh", weights, v).reshape(b, t, n, h)


def max_error(got, want) -> float:
    """The largest absolute difference between ``got`` and ``want`` (arrays, or matching tuples of arrays)."""
    if isinstance(got, (tuple, list)):
        return max(max_error(g, w) for g, w in zip(got, want, strict=True))
    return float(np.max(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))))


def ring_attention(q, k, v, *, mesh, axis: str = "seq"):
    """Attention without a mask, the sequence of q, k, v split over the mesh axis ``axis``: a plain ring.

    No causal mask, no zig-zag layout, no overlap of transfer and compute, autodiff for the gradients; the
    package's context_parallel_attention adds them."""
    P = mesh.shape[axis]
    to_next = [(d, (d + 1) % P) for d in range(P)]  # device d sends to d + 1, the last one to the first

    def per_device(q, k, v):  # this device's T/P tokens of q, k and v
        out, lse = blockwise_attention(q, k, v, return_lse=True)  # its queries against its own keys
        for _ in range(P - 1):
            k, v = lax.ppermute((k, v), axis, to_next)  # receive the previous device's K/V block
            out2, lse2 = blockwise_attention(q, k, v, return_lse=True)
            new = jnp.logaddexp(lse, lse2)  # merge the two partial results
            w, w2 = (jnp.exp(x - new).transpose(0, 2, 1)[..., None] for x in (lse, lse2))  # (B, N, T) -> (B, T, N, 1)
            out, lse = w * out + w2 * out2, new
        return out

    split = PartitionSpec(None, axis)  # q, k, v and out: the sequence (axis 1) split over the devices
    ring = jax.shard_map(per_device, mesh=mesh, in_specs=(split, split, split), out_specs=split, check_vma=False)
    return ring(q, k, v)  # check_vma=False: blockwise_attention's loops start from zeros shared by all devices


def expected_collectives(strategy: str, devices: int) -> dict[str, int]:
    """The collectives one forward pass needs, as :func:`~attention_tutorial.kernels.context_parallel.collectives`
    counts them: the ring's P − 1 steps each permute K and V (2(P − 1) collective-permutes); the all-gather gathers
    K and V once each (2 all-gathers)."""
    if strategy not in cp.STRATEGIES:
        raise ValueError(f"strategy must be one of {cp.STRATEGIES}; got {strategy!r}.")
    if devices < 1:
        raise ValueError(f"devices must be at least 1; got {devices}.")
    ring = strategy == "ring"
    return {"all-gather": 0 if ring else 2, "collective-permute": 2 * (devices - 1) if ring else 0}


def ring_schedule(devices: int) -> np.ndarray:
    """(P steps, P devices): whose K/V block each device holds at each ring step, (d − s) mod P."""
    if devices < 1:
        raise ValueError(f"devices must be at least 1; got {devices}.")
    step, device = np.meshgrid(np.arange(devices), np.arange(devices), indexing="ij")
    return (device - step) % devices


def _block(ax, x, y, j, size=0.64, own=False):
    ax.add_patch(Rectangle((x - size / 2, y - size / 2), size, size, facecolor=PALETTE[j % len(PALETTE)],
                           edgecolor="black", linewidth=2.0 if own else 0.6))  # fmt: skip
    ax.text(x, y, f"K/V {j}", ha="center", va="center", fontsize=8, color="black",
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.85})  # fmt: skip


def _arrow(ax, start, end, **style):
    ax.add_patch(
        FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9, **{"color": GREY, "linewidth": 0.9, **style})
    )


#: The colour of the ring's wrap-around arrow, from the last device back to the first.
WRAP = "#c0392b"


def strategies_figure(devices: int = 4):
    """Both panels: one column per device. Left, all-gather: after one collective each device holds every K/V
    block at once (stacked). Right, ring: at each step (a row) each device holds one block, then passes it to the
    next device (grey arrows); the last device passes its block to the first (the red dashed arrow). A device's
    own block has a thick edge."""
    sched = ring_schedule(devices)
    fig, (ag, ring) = plt.subplots(1, 2, figsize=(10, 0.75 * devices + 1.6), facecolor="white",
                                   layout="constrained")  # fmt: skip
    for d in range(devices):
        for j in range(devices):
            _block(ag, d, j, j, own=j == d)
    ag.set_title("all-gather: every device holds all of K, V", pad=22)
    ag.set(ylabel="held at once, after one all-gather", yticks=[])
    for s in range(devices):
        for d in range(devices):
            _block(ring, d, s, int(sched[s, d]), own=s == 0)
            if s < devices - 1 and d < devices - 1:  # on to the next device, for the next step
                _arrow(ring, (d + 0.36, s + 0.12), (d + 0.64, s + 0.88))
        if s < devices - 1:  # the ring closes: the last device sends to the first
            _arrow(ring, (devices - 1 - 0.1, s + 0.37), (0.1, s + 0.63), color=WRAP, linestyle="--", linewidth=1.1)
    ring.set_title("ring: one block per step, passed on with ppermute", pad=22)
    ring.set(yticks=range(devices), yticklabels=[f"step {s}" for s in range(devices)])
    ring.legend(handles=[Line2D([], [], color=GREY, marker=">", label="to the next device"),
                         Line2D([], [], color=WRAP, linestyle="--", marker=">",
                                label=f"device {devices - 1} to device 0")],
                fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncols=2, frameon=False)  # fmt: skip
    for ax in (ag, ring):
        ax.set(xlim=(-0.55, devices - 0.45), ylim=(devices - 0.45, -0.55), xticks=range(devices),
               xticklabels=[f"device {d}" for d in range(devices)])  # fmt: skip
        ax.xaxis.tick_top()
        ax.set_aspect("equal")
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    return fig


# --- load balance under a causal mask


@dataclass(frozen=True)
class Balance:
    """How evenly a causal ring's work falls on P devices in one layout."""

    layout: str
    total: int  # score positions over all devices and steps
    ring_time: int  # the sum over steps of the busiest device's positions: what the ring waits for
    efficiency: float  # total / P / ring_time: 1 when every device is busy at every step
    chunk: int  # tokens per chunk: T / P (contiguous) or T / 2P (zig-zag)
    full_block: int  # a query chunk against an earlier key chunk: chunk² positions
    diagonal_block: int  # a chunk against itself under the mask, diagonal included: chunk(chunk + 1)/2


def balance(seq: int, devices: int, layout: str) -> Balance:
    """:class:`Balance` of :func:`~attention_tutorial.kernels.context_parallel.causal_work`."""
    work = cp.causal_work(seq, devices, layout)
    ring_time = int(work.max(axis=1).sum())
    c = seq // (devices * cp.chunks_per_device(layout))
    return Balance(layout, int(work.sum()), ring_time, float(work.sum() / devices / ring_time), c, c * c,
                   c * (c + 1) // 2)  # fmt: skip


def balance_figure(devices: int = 4, seq: int | None = None):
    """Score positions each device computes at each ring step (causal), one panel per layout, with the numbers."""
    seq = seq or 64 * devices
    fig, axes = plt.subplots(1, len(cp.LAYOUTS), figsize=(4.6 * len(cp.LAYOUTS), 3.4), facecolor="white",
                             layout="constrained", sharey=True)  # fmt: skip
    for ax, layout in zip(axes, cp.LAYOUTS):
        work = cp.causal_work(seq, devices, layout)
        ax.imshow(work, cmap="viridis", vmin=0, vmax=cp.causal_work(seq, devices, "contiguous").max())
        for (s, d), w in np.ndenumerate(work):
            ax.text(
                d, s, f"{w:,}", ha="center", va="center", fontsize=8, color="white" if w < work.max() / 2 else "black"
            )
        b = balance(seq, devices, layout)
        ax.set(title=f"{layout}: {b.efficiency:.0%} of devices' time busy", xlabel="device", xticks=range(devices),
               yticks=range(devices))  # fmt: skip
    axes[0].set_ylabel("ring step")
    return fig


# --- when the ring hides its transfers


@dataclass(frozen=True)
class LocalRate:
    """The compute rate of the recorded local step: forward, no mask, at its longest T."""

    tflops: float
    seq: int
    head_dim: int
    local: str  # which local step ("mosaic": our Mosaic GPU kernel; "blockwise")


def local_rate(records) -> LocalRate | None:
    """:class:`LocalRate` from the one-GPU records (``cp_local``, forward, no mask); None without one."""
    ok = [r for r in records or () if kind(r) == "local" and r.get("status") == "ok" and not r["causal"]
          and r.get("pass", "fwd") == "fwd" and r.get("tflops")]  # fmt: skip
    if not ok:
        return None
    best = max(ok, key=lambda r: (r["seq_q"], r["tflops"]))
    return LocalRate(best["tflops"], best["seq_q"], best["head_dim"], best.get("local", "blockwise"))


@dataclass(frozen=True)
class HideChunk:
    """The chunk T/P above which one ring step's compute outlasts its K/V transfer (bandwidth only)."""

    heads: int
    kv_heads: int
    chunk: float  # tokens per device, no mask
    chunk_causal: float  # a causal zig-zag step does half the work: twice the chunk
    step_mib: float  # what a device sends per step at that chunk
    step_us: float  # how long one step computes (and sends) at that chunk, in µs


def step_compute_s(chunk: float, *, heads: int, head_dim: int, flops_per_s: float) -> float:
    """Seconds one ring step computes at ``flops_per_s``: 4·N·H·c² FLOPs for a chunk of c tokens, no mask (B = 1)."""
    return 4 * heads * head_dim * chunk**2 / flops_per_s


def chunk_for_time(seconds: float, *, heads: int, head_dim: int = 128, flops_per_s: float) -> float:
    """The chunk c (tokens per device) whose ring step computes for ``seconds`` at ``flops_per_s``, no mask: the
    inverse of :func:`step_compute_s`."""
    if seconds <= 0 or flops_per_s <= 0:
        raise ValueError(f"seconds and flops_per_s must be positive; got {seconds} and {flops_per_s}.")
    return float(np.sqrt(seconds * flops_per_s / (4 * heads * head_dim)))


def hide_chunk(heads: int, kv_heads: int, *, flops_per_s: float, bytes_per_s: float, head_dim: int = 128,
               dtype="bfloat16") -> HideChunk:  # fmt: skip
    """:class:`HideChunk` from :func:`~attention_tutorial.kernels.context_parallel.chunk_to_hide_transfer`."""
    c = cp.chunk_to_hide_transfer(heads, kv_heads, dtype, flops_per_s=flops_per_s, bytes_per_s=bytes_per_s)
    sent = cp.ring_step_bytes(max(1, round(c)), 1, kv_heads, head_dim, dtype)  # one device's chunk of c tokens
    us = step_compute_s(c, heads=heads, head_dim=head_dim, flops_per_s=flops_per_s) * 1e6
    return HideChunk(heads, kv_heads, c, 2 * c, sent / 2**20, us)


def overlap_figure(*, flops_per_s: float, bytes_per_s: float, heads: int = 32, kv_heads=(32, 8, 1),
                   head_dim: int = 128, dtype="bfloat16", chunks=tuple(2**i for i in range(4, 16)),
                   shortest_us: float | None = None):  # fmt: skip
    """Time of one ring step against the chunk T/P: compute (4·N·H·c² FLOPs, no mask) and the K/V transfer for
    each kv-head count, with the chunk where the transfer hides marked; ``shortest_us``, where given, the shortest
    attention call measured (a dotted line)."""
    c = np.asarray(chunks, float)
    fig, ax = plt.subplots(figsize=(7, 3.8), facecolor="white", layout="constrained")
    ax.plot(c, step_compute_s(c, heads=heads, head_dim=head_dim, flops_per_s=flops_per_s) * 1e6, color="black",
            linewidth=2, label=f"compute, N = {heads}")  # fmt: skip
    for i, k in enumerate(kv_heads):
        sent = 2 * c * k * head_dim * jnp.dtype(dtype).itemsize / bytes_per_s * 1e6
        ax.plot(c, sent, color=PALETTE[i], linestyle="--", label=f"K/V transfer, K = {k}")
        h = hide_chunk(heads, k, flops_per_s=flops_per_s, bytes_per_s=bytes_per_s, head_dim=head_dim, dtype=dtype)
        ax.plot([h.chunk], [2 * h.chunk * k * head_dim * jnp.dtype(dtype).itemsize / bytes_per_s * 1e6], "o",
                color=PALETTE[i])  # fmt: skip
    if shortest_us:
        ax.axhline(shortest_us, color=GREY, linestyle=":", linewidth=1.5, label="shortest attention call measured")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="tokens per device, T / P", ylabel="µs per ring step")
    ax.grid(True, color="#dddddd")
    ax.legend(fontsize=8, loc="upper left")
    return fig


# --- the one-GPU records


def kind(rec) -> str | None:
    """The kind of a one-GPU record: "local" (the local step alone), "ring_1dev" (the ring code on a one-device
    mesh), "emulated" (ring steps run one after another on one device) or None (another experiment's record)."""
    impl = rec.get("impl", "")
    if impl == "cp_local":
        return "local"
    if impl == "cp_ring_1dev":
        return "ring_1dev"
    if impl.startswith("cp_emulated"):
        return "emulated"
    return None


def ring_steps(rec) -> int:
    """How many ring steps a record ran: its ``ring_steps`` field, else the P in its name (``cp_emulated_P4``),
    else its ``devices``; 1 for the local step and the one-device ring."""
    if rec.get("ring_steps"):
        return int(rec["ring_steps"])
    if kind(rec) != "emulated":
        return 1
    suffix = rec["impl"].removeprefix("cp_emulated").removeprefix("_P")
    if suffix.isdigit():
        return int(suffix)
    if rec.get("devices"):
        return int(rec["devices"])
    raise ValueError(f"record {rec['impl']!r} says neither ring_steps nor devices; re-record it.")


def gpus(rec) -> int:
    """How many GPUs a record ran on: its ``gpus`` field; else 1 for the one-device experiments (whose older
    records put the emulated ring steps in ``devices``), else ``devices``."""
    if rec.get("gpus"):
        return int(rec["gpus"])
    return 1 if kind(rec) else int(rec.get("devices", 1))


@dataclass(frozen=True)
class RingCost:
    """P ring steps emulated on one GPU against one call on the whole sequence."""

    seq: int
    causal: bool
    pass_: str
    local: str
    steps: int  # P
    chunk: int  # tokens per local call: T / P without a mask, T / 2P for a causal zig-zag
    calls: int  # local calls each device makes over the P steps (empty pairs skipped)
    local_ms: float
    emulated_ms: float
    ring_1dev_ms: float | None  # the ring code on a one-device mesh, where recorded

    @property
    def over_local(self) -> float:
        """The emulated ring's time over one call's."""
        return self.emulated_ms / self.local_ms

    @property
    def per_device(self) -> float:
        """What each of P devices would spend, over one call's time: the emulated time shared by P."""
        return self.over_local / self.steps

    @property
    def ideal(self) -> float:
        return 1 / self.steps

    @property
    def best_speedup(self) -> float:
        """The most P devices could gain over one call from this compute alone (transfers come on top)."""
        return 1 / self.per_device

    @property
    def verdict(self) -> str:
        """The verdict: "none" when P devices could gain less than :data:`SPEEDUP_MIN` over one call, else "some"."""
        return "none" if self.best_speedup < SPEEDUP_MIN else "some"


def ring_costs(records, layout: str = "zigzag") -> list[RingCost]:
    """:class:`RingCost` for every emulated ring in ``records`` with a local step at the same point, sorted by
    (T, causal, pass, P)."""
    ok = [r for r in records or () if kind(r) and r.get("status") == "ok" and gpus(r) == 1]

    def ms(k, r):
        same = [x for x in same_point(ok, r, impl=x_impl(k, r)) if kind(x) == k and x.get("local") == r.get("local")]
        return statistics.median(x["median_ms"] for x in same) if same else None

    out = []
    for r in ok:
        if kind(r) != "emulated" or (base := ms("local", r)) is None:
            continue
        p = ring_steps(r)
        per = cp.chunks_per_device(layout) if r["causal"] else 1  # without a mask one call per block
        out.append(RingCost(seq=r["seq_q"], causal=r["causal"], pass_=r.get("pass", "fwd"),
                            local=r.get("local", "blockwise"), steps=p, chunk=r["seq_q"] // (p * per),
                            calls=local_calls(p, causal=r["causal"], layout=layout), local_ms=base,
                            emulated_ms=r["median_ms"], ring_1dev_ms=ms("ring_1dev", r)))  # fmt: skip
    return sorted(out, key=lambda c: (c.seq, c.causal, c.pass_, c.steps, c.local))


def local_calls(devices: int, *, causal: bool, layout: str = "zigzag") -> int:
    """Local calls the busiest device makes over a ring of P steps: P without a mask (one per K/V block); under a
    causal mask one per pair of (query chunk, key chunk) that is not wholly hidden."""
    if devices < 1:
        raise ValueError(f"devices must be at least 1; got {devices}.")
    if not causal:
        return devices
    return max(sum(j <= i for src in range(devices) for i in cp.device_chunks(d, devices, layout)
                   for j in cp.device_chunks(src, devices, layout)) for d in range(devices))  # fmt: skip


def first_paying(records, *, steps: int = 4, causal: bool = True) -> RingCost | None:
    """The shortest T at which ``steps`` emulated ring steps (forward) could gain at least :data:`SPEEDUP_MIN`
    over one call (verdict "some"); None when no recorded T does."""
    found = [c for c in ring_costs(records) if c.steps == steps and c.causal == causal and c.pass_ == "fwd"
             and c.verdict == "some"]  # fmt: skip
    return min(found, key=lambda c: c.seq) if found else None


@dataclass(frozen=True)
class PayingChunk:
    """Where the recorded rings start to pay, by the tokens of each local call."""

    smallest_paying: int | None  # the smallest chunk of any emulated ring (forward) with verdict "some"
    largest_not: int | None  # the largest chunk of any with verdict "none"


def paying_chunk(records) -> PayingChunk:
    """:class:`PayingChunk` over every forward :class:`RingCost` in ``records``, masks and P together."""
    costs = [c for c in ring_costs(records) if c.pass_ == "fwd"]
    pays = [c.chunk for c in costs if c.verdict == "some"]
    not_ = [c.chunk for c in costs if c.verdict == "none"]
    return PayingChunk(min(pays) if pays else None, max(not_) if not_ else None)


def x_impl(k: str, rec) -> str:
    """The implementation name of kind ``k`` measured beside ``rec``."""
    return {"local": "cp_local", "ring_1dev": "cp_ring_1dev"}.get(k, rec["impl"])


def ring_cost(records, *, steps: int = 4, causal: bool = True, seq: int | None = None) -> RingCost | None:
    """The :class:`RingCost` of ``steps`` causal (or not) ring steps at ``seq`` (default: the shortest T
    recorded), forward; None when not recorded."""
    found = [c for c in ring_costs(records) if c.steps == steps and c.causal == causal and c.pass_ == "fwd"
             and (seq is None or c.seq == seq)]  # fmt: skip
    return min(found, key=lambda c: c.seq) if found else None


def ring_cost_figure(records, title: str = ""):
    """Per-device time of an emulated ring over one call's, for each T (groups) and P (bars), one panel per mask,
    with the ideal 1 / P marked on each bar."""
    costs = [c for c in ring_costs(records) if c.pass_ == "fwd"]
    masks = sorted({c.causal for c in costs}, reverse=True)
    fig, axes = plt.subplots(1, max(len(masks), 1), figsize=(4.8 * max(len(masks), 1), 3.6), facecolor="white",
                             layout="constrained", sharey=True, squeeze=False)  # fmt: skip
    for ax, causal in zip(axes[0], masks):
        here = [c for c in costs if c.causal == causal]
        seqs = sorted({c.seq for c in here})
        ps = sorted({c.steps for c in here})
        width = 0.8 / len(ps)
        for i, p in enumerate(ps):
            for x, t in enumerate(seqs):
                cs = [c for c in here if c.seq == t and c.steps == p]
                if not cs:
                    continue
                pos = x + (i - (len(ps) - 1) / 2) * width
                ax.bar(pos, cs[0].per_device, width * 0.9, color=PALETTE[i], edgecolor="black", linewidth=0.5,
                       label=f"P = {p}" if x == 0 else None)  # fmt: skip
                ax.plot([pos - width * 0.45, pos + width * 0.45], [1 / p, 1 / p], color="black", linewidth=1.5)
        ax.axhline(1.0, color=GREY, linestyle="--", linewidth=1)  # one call on one GPU
        ax.set_xticks(range(len(seqs)), [f"T = {t:,}" for t in seqs])
        ax.set_title("causal" if causal else "no mask", fontsize=10)
        ax.grid(True, axis="y", color="#dddddd")
    axes[0][0].set_ylabel("time per device / one call's time")
    handles, _ = axes[0][-1].get_legend_handles_labels()
    handles += [Line2D([], [], color="black", linewidth=1.5, label="ideal: 1 / P"),
                Line2D([], [], color=GREY, linestyle="--", linewidth=1, label="one GPU alone: 1")]  # fmt: skip
    axes[0][-1].legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def cost_rows(records) -> list[dict]:
    """Table rows of :func:`ring_costs`: T, mask, P, chunk, the three times and the ratios."""
    return [{"T": c.seq, "causal": c.causal, "P": c.steps, "chunk (tokens)": c.chunk, "calls per device": c.calls,
             "one call (ms)": f"{c.local_ms:.3f}", "ring, one device (ms)": "–" if c.ring_1dev_ms is None
             else f"{c.ring_1dev_ms:.3f}", "P steps emulated (ms)": f"{c.emulated_ms:.3f}",
             "emulated / one call": f"{c.over_local:.2f}", "per device": f"{c.per_device:.2f}",
             "ideal": f"{c.ideal:.2f}"} for c in ring_costs(records)]  # fmt: skip


def live_check(live, recorded) -> list[dict]:
    """For each ok live one-GPU record the recording also measured (same implementation, local step and point):
    {impl, seq_q, causal, median_ms, recorded_ms, live_over_recorded, verdict} with the verdict from both spreads
    ("faster": the live call is shorter)."""
    rows = []
    for r in live or ():
        if r.get("status") != "ok" or not kind(r):
            continue
        same = [x for x in same_point(recorded or [], r, impl=r["impl"]) if x.get("local") == r.get("local")]
        if same:
            c = compare([r], same)
            rows.append({"impl": r["impl"], "seq_q": r["seq_q"], "causal": r["causal"], "median_ms": r["median_ms"],
                         "recorded_ms": statistics.median(x["median_ms"] for x in same),
                         "live_over_recorded": 1 / c.value, "verdict": c.word})  # fmt: skip
    return rows
