import subprocess

import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial import env
from attention_tutorial.measure import race


def test_mixed_lengths_fill_the_row_within_bounds():
    for seed in range(5):
        lengths = race.mixed_lengths(8192, low=256, high=4096, seed=seed)
        assert sum(lengths) == 8192
        assert all(n <= 4096 for n in lengths) and all(n >= 256 for n in lengths[:-1]) and lengths[-1] > 0


def test_document_ids_number_each_rows_documents_in_order():
    ids = race.document_ids(6, [[2, 4], [1, 2, 3]])
    np.testing.assert_array_equal(ids, [[0, 0, 1, 1, 1, 1], [0, 1, 1, 2, 2, 2]])
    with pytest.raises(ValueError, match="row 1's document lengths must add up to seq = 6; got 5"):
        race.document_ids(6, [[6], [2, 3]])


def test_kept_scores_count_the_mask():
    assert race.kept_scores(2, 8, 8) == 2 * 64
    assert race.kept_scores(1, 8, 8, is_causal=True) == 8 * 9 / 2
    seg = race.document_ids(8, [[4, 4]])
    assert race.kept_scores(1, 8, 8, is_causal=True, segment_ids=seg) == 2 * 4 * 5 / 2


def test_every_group_builds_its_cases_and_unknown_groups_are_refused():
    names = {(c.group, c.name) for c in race.cases()}
    assert {g for g, _ in names} == set(race.GROUPS) - {"schedule"}  # schedule: the pipelined kernel beside
    assert all("ours, pipelined" in c.contenders for c in race.cases(("schedule",)))
    assert not any("ours, pipelined" in c.contenders for c in race.cases(("forward",)))
    heavy = {c.name for c in race.cases(("schedule",)) if "ours, heavy first" in c.contenders}
    assert heavy == {"H=128 causal", "H=256 causal"}  # without a mask every block weighs the same
    backward = race.cases(("backward",))
    for case in backward:  # the backward's two orders of the score-sized products (H = 256: always together)
        if case.shape[-1] <= 128:
            assert not case.contenders["ours"].__wrapped__.keywords["config"].bwd_together
            assert case.contenders["ours, S and dP together"].__wrapped__.keywords["config"].bwd_together
    assert {c.name for c in backward if c.shape[-1] == 256} == {"H=256 no mask", "H=256 causal"}
    for case in race.cases(("masks", "masks_backward")):
        assert case.baseline in case.contenders and "ours" in case.contenders
    with pytest.raises(ValueError, match="unknown race groups"):
        race.cases(("masks", "fastest"))


def test_a_race_times_the_right_contenders_and_reports_the_wrong_one_untimed():
    case = race.Case(
        "masks",
        "tiny",
        (1, 16, 16, 2, 2, 8),
        {"is_causal": True},
        {
            "XLA": race.xla(is_causal=True),
            "same": race.xla(is_causal=True),
            "wrong": race.xla(is_causal=False),
            "plain, causal": race.xla(is_causal=False),
        },
        "fwd",
        "XLA",
    )
    rec = race.run_case(case, rounds=2, repeats=2, max_seconds=0.05)
    rows = {r["contender"]: r for r in rec["rows"]}
    assert rows["XLA"]["speed"] == 1.0 and rows["XLA"]["error"] is None
    assert rows["same"]["error"] < 1e-6 and len(rows["same"]["rounds_ms"]) == 2
    assert rows["wrong"]["error"] > race.MAX_ERROR and rows["wrong"]["median_ms"] is None
    assert rows["plain, causal"]["error"] is None and rows["plain, causal"]["median_ms"] > 0  # other work: not checked
    assert rec["flops"] == 4.0 * 2 * 8 * (16 * 17 / 2)
    assert {"commit", "dirty", "created", "clocks_before", "clocks_after"} <= set(rec)


def test_code_version_takes_the_environment_first_then_git(monkeypatch):
    monkeypatch.setenv("ATTENTION_TUTORIAL_COMMIT", "abc123")  # a copied tree: its copier knows its commit
    monkeypatch.setenv("ATTENTION_TUTORIAL_DIRTY", "0")
    assert env.code_version() == {"commit": "abc123", "dirty": False}
    monkeypatch.setenv("ATTENTION_TUTORIAL_DIRTY", "1")
    assert env.code_version() == {"commit": "abc123", "dirty": True}
    monkeypatch.delenv("ATTENTION_TUTORIAL_COMMIT")
    monkeypatch.delenv("ATTENTION_TUTORIAL_DIRTY")
    here = env.code_version()  # this checkout
    assert here["commit"] is None or len(here["commit"]) == 40

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert env.code_version() == {"commit": None, "dirty": None}


def test_masks_words_keep_document_lengths_and_prefixes():
    m = {"is_causal": True, "segment_ids": race.document_ids(4, [[1, 3]]), "prefix_length": jnp.array([2])}
    assert race._mask_words(m) == {"is_causal": True, "document_lengths": [[1, 3]], "prefix_length": [2]}


def test_the_short_races_time_persistent_ctas_at_the_papers_short_lengths():
    short = race.cases(("short",))
    assert [c.shape[1] for c in short] == [512, 512, 1024, 1024, 2048, 2048]
    for case in short:
        B, T, S, N, K, H = case.shape
        assert (B * T, N * H) == (16 * 1024, 2048)
        config = case.contenders["ours, persistent"].keywords["config"]
        assert config.persistent and config.heavy_first == case.mask["is_causal"]
        assert ("ours, heavy first" in case.contenders) == case.mask["is_causal"]


def test_the_fa3_grid_keeps_its_paper_shapes():
    grid = race.cases(("fa3",))
    assert len(grid) == 3 * 6 * 2
    for case in grid:
        B, T, S, N, K, H = case.shape
        assert (B * T, N * H, T, K) == (16 * 1024, 2048, S, N) and set(case.contenders) == {"cuDNN", "ours"}
    assert {c.shape[1] for c in grid} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {c.shape[-1] for c in grid} == {64, 128, 256}
