import pytest

from attention_tutorial import registry
from attention_tutorial.measure.grids import GRID_NAMES, points


@pytest.mark.parametrize("gpu", [True, False])
def test_every_grid_exists_in_both_sizes_with_known_impls(gpu):
    for name in GRID_NAMES:
        pts = points(name, gpu=gpu)
        assert pts, name
        assert {p.impl for p in pts} <= set(registry.IMPLEMENTATIONS)


def test_gpu_sequence_sweep_reaches_32k_and_the_seed_shape_is_the_seed_shape():
    assert max(p.seq_q for p in points("seq_long", gpu=True)) >= 32 * 1024
    seed = points("seed_shape", gpu=True)
    assert {(p.batch, p.seq_q, p.heads, p.head_dim) for p in seed} == {(4, 128, 8, 64)}
    assert max(p.seq_kv for p in points("decode", gpu=True)) >= 128 * 1024


def test_unknown_grid():
    with pytest.raises(ValueError, match="unknown grid"):
        points("nope")


def test_live_gpu_subset_is_a_nonempty_subset():
    for name in GRID_NAMES:
        full, live = points(name, gpu=True), points(name, gpu=True, live=True)
        assert live and set(live) <= set(full), name
    assert len(points("flash", gpu=True, live=True)) < len(points("flash", gpu=True))
    assert points("seq_long", gpu=False, live=True) == points("seq_long", gpu=False)
