"""The masks-inside-the-kernel page: the tile maps' figure and the recorded masks races as rows."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..kernels.mosaic.masks import EMPTY, FULL, PARTIAL

COLOURS = {EMPTY: "#ffffff", PARTIAL: "#f4a261", FULL: "#2a9d8f"}
NAMES = {EMPTY: "skipped", PARTIAL: "masked in the tile", FULL: "computed whole"}


def tile_counts(grid) -> dict[str, int]:
    """How many tiles of ``grid`` (query tiles, key tiles) are computed whole, masked in the tile and skipped."""
    counts = np.bincount(np.asarray(grid).ravel(), minlength=3)
    return {NAMES[FULL]: int(counts[FULL]), NAMES[PARTIAL]: int(counts[PARTIAL]), NAMES[EMPTY]: int(counts[EMPTY])}


def tiles_figure(grids: dict, *, block: int, columns: int = 3):
    """One panel per mask: its tiles (query tiles down, key tiles across) coloured by what the kernel does."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    rows = -(-len(grids) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 3.1 * rows), squeeze=False)
    cmap = ListedColormap([COLOURS[EMPTY], COLOURS[PARTIAL], COLOURS[FULL]])
    for ax, (name, grid) in zip(axes.flat, grids.items(), strict=False):
        g = np.asarray(grid)
        ax.imshow(g, cmap=cmap, vmin=0, vmax=2, interpolation="nearest")
        ax.set_xticks(np.arange(-0.5, g.shape[1], 1), minor=True)
        ax.set_yticks(np.arange(-0.5, g.shape[0], 1), minor=True)
        ax.grid(which="minor", color="#cccccc", linewidth=0.4)
        ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
        skipped = float((g == EMPTY).mean())
        ax.set_title(f"{name}\n{100 * skipped:.0f} % of tiles skipped", fontsize=9)
    for ax in list(axes.flat)[len(grids) :]:
        ax.axis("off")
    handles = [Patch(facecolor=COLOURS[s], edgecolor="#999999", label=NAMES[s]) for s in (FULL, PARTIAL, EMPTY)]
    fig.legend(handles=handles, loc="lower center", ncol=3, frameon=False, fontsize=9)
    fig.suptitle(f"tiles of {block} queries × {block} keys: queries down, keys across", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


class MaskRace(NamedTuple):
    """One recorded masks race: our kernel against its baseline and against the plain causal kernel."""

    case: str
    pass_: str
    baseline: str
    ours_ms: float | None
    ours_tflops: float | None  # on the kept scores
    vs_baseline: float | None  # baseline's time / ours
    causal_ms: float | None  # our plain causal kernel on the same shape (computing every causal score)
    causal_tflops: float | None  # on the causal triangle's kept scores
    vs_causal: float | None  # causal kernel's time / ours

    @property
    def kept_rate(self) -> float | None:
        """Our TFLOP/s on this mask's kept scores ÷ the causal kernel's on its own: near 1, the skipped tiles cost
        nothing and the partial tiles little."""
        return self.ours_tflops / self.causal_tflops if self.ours_tflops and self.causal_tflops else None


def mask_races(provenance: dict | None) -> list[MaskRace]:
    """The recorded races of the masks groups (forward and backward), in the order they ran."""
    out = []
    for rec in ((provenance or {}).get("race") or {}).values():
        if rec.get("group") not in ("masks", "masks_backward"):
            continue
        rows = {r["contender"]: r for r in rec["rows"]}
        ours, causal = rows.get("ours", {}), rows.get("ours, causal", {})
        ms, c_ms = ours.get("median_ms"), causal.get("median_ms")
        out.append(
            MaskRace(
                case=rec["case"],
                pass_=rec["pass"],
                baseline=rec["baseline"],
                ours_ms=ms,
                ours_tflops=ours.get("tflops"),
                vs_baseline=ours.get("speed"),
                causal_ms=c_ms,
                causal_tflops=_causal_tflops(rec, c_ms),
                vs_causal=c_ms / ms if ms and c_ms else None,
            )
        )
    return out


def _causal_tflops(rec: dict, ms: float | None) -> float | None:
    """The plain causal kernel's TFLOP/s counted on the causal triangle's kept scores."""
    if not ms:
        return None
    B, T, S, N, _, H = rec["shape"]
    kept = B * sum(min(S, r + 1) for r in range(T))
    return 4.0 * N * H * kept * (3.5 if rec["pass"] == "fwd+bwd" else 1.0) / ms / 1e9


def race_table(races: list[MaskRace]) -> list[dict]:
    """The races as table rows (text)."""
    fmt = lambda x, f: "–" if x is None else format(x, f)  # noqa: E731
    return [
        {
            "mask": r.case,
            "pass": r.pass_,
            "ours (ms)": fmt(r.ours_ms, ".2f"),
            "ours TFLOP/s (kept scores)": fmt(r.ours_tflops, ".0f"),
            "speed against": f"{fmt(r.vs_baseline, '.2f')}× {r.baseline}",
            "causal kernel (ms)": fmt(r.causal_ms, ".2f"),
            "faster than causal": fmt(r.vs_causal, ".2f") + "×" if r.vs_causal else "–",
        }
        for r in races
    ]


def skip_words(race: MaskRace | None) -> str | None:
    """The packed-documents verdict as a sentence's second half, or None when not recorded."""
    if race is None or race.kept_rate is None or race.vs_causal is None:
        return None
    cost = "next to nothing" if race.kept_rate >= 0.9 else f"{100 * (1 - race.kept_rate):.0f} % of the rate"
    return (
        f"our kernel runs {race.vs_causal:.1f}× faster than the causal kernel over the whole row and "
        f"{race.vs_baseline:.0f}× faster than {race.baseline}; on the scores it keeps it runs at "
        f"{race.ours_tflops:.0f} TFLOP/s, {100 * race.kept_rate:.0f} % of the causal kernel's rate on its own: "
        f"the skipped tiles and the masked tiles at each document's edge cost {cost}"
    )
