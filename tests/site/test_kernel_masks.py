import numpy as np
import pytest

from attention_tutorial.kernels.mosaic.masks import EMPTY, FULL, PARTIAL, make_mask, tile_grid
from attention_tutorial.site import kernel_masks as page


def _race(ours_ms, causal_ms, xla_ms, T=256):
    rows = [
        {"contender": "XLA", "median_ms": xla_ms, "tflops": 1.0, "speed": 1.0},
        {"contender": "ours", "median_ms": ours_ms, "tflops": 100.0, "speed": xla_ms / ours_ms},
        {"contender": "ours, causal", "median_ms": causal_ms, "tflops": None, "speed": None},
    ]
    return {
        "group": "masks",
        "case": "packed documents of 256-4096, causal",
        "pass": "fwd",
        "baseline": "XLA",
        "shape": [1, T, T, 1, 1, 8],
        "rows": rows,
    }


def test_tile_counts_and_a_band_alone_gives_one_grid():
    mask, arrays = make_mask(3, 512, 512, is_causal=True)
    grid = tile_grid(mask, arrays, block_q=128, block_kv=128)
    assert grid.shape == (1, 4, 4)  # a band: the same tiles for every batch row
    assert page.tile_counts(grid[0]) == {"computed whole": 6, "masked in the tile": 4, "skipped": 6}
    assert page.tile_counts(np.array([[EMPTY, PARTIAL], [FULL, FULL]]))["computed whole"] == 2


def test_mask_races_read_the_masks_groups_and_the_causal_rate():
    prov = {"race": {"a": _race(1.0, 2.0, 50.0), "b": {**_race(1.0, 1.0, 1.0), "group": "forward"}}}
    (r,) = page.mask_races(prov)
    assert r.vs_causal == 2.0 and r.vs_baseline == 50.0
    kept = sum(min(256, i + 1) for i in range(256))
    assert r.causal_tflops == pytest.approx(4.0 * 8 * kept / 2.0 / 1e9)
    assert r.kept_rate == pytest.approx(100.0 / r.causal_tflops)
    assert page.mask_races(None) == [] and page.mask_races({}) == []


def test_skip_words_judge_the_rate_and_say_nothing_unrecorded():
    r = page.mask_races({"race": {"a": _race(1.0, 2.0, 50.0)}})[0]
    fast = r._replace(ours_tflops=0.95 * r.causal_tflops)
    slow = r._replace(ours_tflops=0.5 * r.causal_tflops)
    assert "cost next to nothing" in page.skip_words(fast) and "2.0× faster" in page.skip_words(fast)
    assert "cost 50 % of the rate" in page.skip_words(slow)
    assert page.skip_words(None) is None and page.skip_words(r._replace(causal_ms=None, vs_causal=None)) is None
