"""What a ring costs in compute, read from the one-GPU context-parallel records.

:func:`~attention_tutorial.measure.context_parallel.cp_records` runs, on one GPU, the local step alone
(``cp_local``), the ring code on a one-device mesh (``cp_ring_1dev``) and the ring steps of P devices one after
another (``cp_emulated``). :func:`ring_costs` sets each emulated ring against the local call at the same point:
:class:`RingCost`. The records come in two forms: the ring steps in the implementation's name (``cp_emulated_P4``,
``devices`` = 4) or in their own fields (``ring_steps``, ``gpus``); both are read.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..kernels import context_parallel as cp

#: The least speed-up over one call that counts as one: below it, P devices would finish about as late as one.
SPEEDUP_MIN = 1.1

#: The fields that say two records measured the same problem (with the local step).
POINT = ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim", "dtype", "causal", "pass", "mask", "local")


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


def local_calls(devices: int, *, causal: bool, layout: str = "zigzag") -> int:
    """Local calls the busiest device makes over a ring of P steps: P without a mask (one per K/V block); under a
    causal mask one per pair of (query chunk, key chunk) that is not wholly hidden."""
    if devices < 1:
        raise ValueError(f"devices must be at least 1; got {devices}.")
    if not causal:
        return devices
    return max(
        sum(
            j <= i
            for src in range(devices)
            for i in cp.device_chunks(d, devices, layout)
            for j in cp.device_chunks(src, devices, layout)
        )
        for d in range(devices)
    )


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
    """:class:`RingCost` for every ok emulated ring in ``records`` with a local step at the same point (the median
    where several were recorded), sorted by (T, causal, pass, P)."""
    ok = [r for r in records or () if kind(r) and r.get("status") == "ok" and gpus(r) == 1]

    def ms(k, rec):
        same = [
            x["median_ms"]
            for x in ok
            if kind(x) == k
            and all(x.get(f) == rec.get(f) for f in POINT)
            and (k != "emulated" or x["impl"] == rec["impl"])
        ]
        return statistics.median(same) if same else None

    out = []
    for r in ok:
        if kind(r) != "emulated" or (base := ms("local", r)) is None:
            continue
        p = ring_steps(r)
        per = cp.chunks_per_device(layout) if r["causal"] else 1  # without a mask one call per block
        out.append(
            RingCost(
                seq=r["seq_q"],
                causal=r["causal"],
                pass_=r.get("pass", "fwd"),
                local=r.get("local", "blockwise"),
                steps=p,
                chunk=r["seq_q"] // (p * per),
                calls=local_calls(p, causal=r["causal"], layout=layout),
                local_ms=base,
                emulated_ms=r["median_ms"],
                ring_1dev_ms=ms("ring_1dev", r),
            )
        )
    return sorted(out, key=lambda c: (c.seq, c.causal, c.pass_, c.steps, c.local))
