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


def test_footprint_matches_the_h200_s_compiled_temporaries():
    # seq_long on the H200: naive at B=1, T=32k, N=16 compiled to 96 GiB of temporaries (recorded temp_bytes)
    from attention_tutorial.measure.grids import footprint
    from attention_tutorial.measure.sweep import Point

    need = footprint(Point("naive", 1, 32768, 32768, 16, 16, 128, "bfloat16"))
    assert 96 * 2**30 <= need <= 97 * 2**30
    assert footprint(Point("cudnn", 1, 32768, 32768, 16, 16, 128, "bfloat16")) == 4 * 32768 * 16 * 128 * 2


@pytest.mark.parametrize(("gib", "runs_naive_32k"), [(24, False), (80, False), (105, True)])
def test_plan_sizes_a_grid_to_the_device_s_memory(gib, runs_naive_32k):
    from attention_tutorial.measure.grids import plan
    from attention_tutorial.measure.sweep import check_record

    run, skipped = plan("seq_long", gpu=True, memory=gib * 2**30)
    assert len(run) + len(skipped) == len(points("seq_long", gpu=True))
    assert all(r["impl"] != "cudnn" for r in skipped)  # cuDNN never holds the scores: every point fits
    assert any(p.impl == "naive" and p.seq_q == 32768 for p in run) == runs_naive_32k
    for rec in skipped:
        assert rec["status"] == "oom" and f"{gib:.1f} GiB" in rec["reason"] and check_record(rec) == []
    run, skipped = plan("decode", gpu=True, memory=16 * 2**30)  # a 128k-token cache of 32 kv heads needs 32 GiB
    assert {(r["seq_kv"], r["kv_heads"]) for r in skipped} == {(128 * 1024, 32)}
    assert plan("seq_long", gpu=True, memory=None)[1] == []
