"""The IO argument as code: a recorded forward call's FLOPs and the fewest HBM bytes its path moves, set against a
roof (a matmul peak and a read bandwidth measured on one GPU).

A path that writes the T × S scores to HBM (:data:`~attention_tutorial.measure.grids.MATERIALISE_SCORES`) moves
:func:`~attention_tutorial.measure.flops.materialised_bytes`; a fused kernel moves
:func:`~attention_tutorial.measure.flops.attention_bytes`. Their FLOPs per byte place a call left of the ridge
(memory sets its speed) or right of it (the tensor cores do).
"""

from __future__ import annotations

from dataclasses import dataclass

from .flops import attention_bytes, attention_flops, materialised_bytes
from .grids import MATERIALISE_SCORES


@dataclass(frozen=True)
class IOPoint:
    """One recorded forward call seen by the IO argument: its FLOPs, the fewest HBM bytes its path moves, and what
    it measured."""

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
    flops = attention_flops(
        rec["batch"], rec["seq_q"], rec["seq_kv"], rec["heads"], rec["head_dim"], causal=rec["causal"]
    )
    return IOPoint(
        rec["impl"],
        rec.get("grid", ""),
        rec["batch"],
        rec["seq_q"],
        rec["head_dim"],
        flops,
        moved,
        rec["median_ms"],
        flops / (rec["median_ms"] * 1e-3) / 1e12,
    )


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
