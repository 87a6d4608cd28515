"""Packed documents: the batches, a packed row's logits against each document alone, the loss, and the training run
through each attention (ours interpreted on a CPU, compiled on a GPU)."""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.measure.sweep import check_record
from attention_tutorial.train.data import document_starts, load_corpus, packed_batch_at
from attention_tutorial.train.loop import init_params
from attention_tutorial.train.model import GPT, TINY, document_positions
from attention_tutorial.train.packed import kept_fraction, packed_loss, packed_records

BF16 = dataclasses.replace(TINY, dtype="bfloat16")  # our kernel takes 16-bit inputs


def test_a_source_file_splits_at_its_top_level_definitions_with_their_decorators():
    src = b'"""doc"""\nimport os\n\n@cache\n@wraps(f)\ndef f():\n    def g(): pass\n\nclass A:\n    pass\n'
    cuts = document_starts(src)
    assert [src[c : c + 6] for c in cuts] == [b'"""doc', b"@cache", b"class "]
    assert document_starts(b"x = 1\n").tolist() == [0]


def test_packed_rows_hold_whole_documents_one_after_another():
    tokens = np.arange(1, 101, dtype=np.int32)  # ten documents of 10, each byte its own number
    starts = np.arange(0, 100, 10)
    rows, ids = packed_batch_at(tokens, starts, batch=3, seq_len=24, seed=1, step=2)
    assert rows.shape == ids.shape == (3, 25)
    for row, seg in zip(rows, ids):
        assert seg[0] == 0 and np.all(np.diff(seg) >= 0) and np.all(np.diff(seg) <= 1)
        for d in np.unique(seg):
            piece = row[seg == d]
            assert piece[0] % 10 == 1  # every document starts at its start
            assert np.all(np.diff(piece) == 1)  # and runs on unbroken
            if d < seg[-1]:
                assert piece.size == 10  # whole, but the last one, cut at the row's end
    again = packed_batch_at(tokens, starts, batch=3, seq_len=24, seed=1, step=2)
    np.testing.assert_array_equal(again[0], rows)
    assert not np.array_equal(packed_batch_at(tokens, starts, batch=3, seq_len=24, seed=1, step=3)[0], rows)


@pytest.mark.parametrize("starts", [np.array([5, 10]), np.array([0, 10, 5]), np.array([], int), np.array([0, 100])])
def test_bad_document_starts_are_refused(starts):
    with pytest.raises(ValueError, match="starts must be"):
        packed_batch_at(np.arange(100, dtype=np.int32), starts, batch=1, seq_len=8, seed=0, step=0)


def test_the_corpus_packs_several_documents_into_a_row():
    corpus = load_corpus()
    _, ids = packed_batch_at(corpus.train, corpus.train_starts, batch=8, seq_len=2048, seed=0, step=0)
    assert ids.max(axis=1).mean() + 1 >= 2


def test_positions_count_from_each_documents_start():
    ids = jnp.array([[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(document_positions(ids), [[0, 1, 2, 0, 1, 0], [0, 0, 1, 2, 3, 4]])


def test_a_packed_row_gives_each_document_the_logits_it_gives_alone():
    params = init_params(TINY, 0)
    lengths = [20, 7, 37]
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 256, n).astype(np.int32) for n in lengths]
    row = jnp.asarray(np.concatenate(docs))[None]
    ids = jnp.asarray(np.repeat(np.arange(3), lengths))[None]
    model = GPT(TINY, "xla")
    packed = np.asarray(model.apply({"params": params}, row, ids))[0]
    alone = np.concatenate([np.asarray(model.apply({"params": params}, jnp.asarray(d)[None]))[0] for d in docs])
    np.testing.assert_allclose(packed, alone, atol=2e-5, rtol=2e-5)
    crossing = np.asarray(model.apply({"params": params}, row))[0]  # without the ids: documents see each other
    assert np.abs(crossing[20:] - alone[20:]).max() > 1e-3


def test_the_loss_skips_the_byte_after_a_document_ends():
    params = init_params(TINY, 0)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 256, (1, 11)), jnp.int32)
    ids = jnp.asarray([[0] * 6 + [1] * 5])
    model = GPT(TINY, "xla")
    logits = model.apply({"params": params}, tokens[:, :-1], ids[:, :-1])[0]
    nll = -jax.nn.log_softmax(logits)[jnp.arange(10), tokens[0, 1:]]
    want = np.mean(np.delete(np.asarray(nll), 5))  # byte 5 ends document 0: its next byte opens document 1
    assert float(packed_loss(model, params, tokens, ids)) == pytest.approx(want, rel=1e-5)


def test_kept_fraction_counts_causal_pairs_within_documents():
    assert kept_fraction(np.zeros((1, 8), int)) == 1.0
    assert kept_fraction(np.array([[0, 0, 1, 1]])) == pytest.approx(6 / 10)


def test_packed_records_train_through_each_attention_or_say_why_not():
    recs = packed_records(("xla", "mosaic"), steps=3, config=TINY, wait_every=2)
    steps = [r for r in recs if r["kind"] == "step"]
    assert [r["step"] for r in steps if r["impl"] == "xla"] == [0, 1, 2]
    assert all(np.isfinite(r["loss"]) for r in steps)
    summary = {r["impl"]: r for r in recs if r["kind"] == "summary"}
    assert summary["xla"]["status"] == "ok" and summary["xla"]["median_ms"] > 0
    assert 0 < summary["xla"]["kept_of_causal"] <= 1 and summary["xla"]["documents_per_row"] >= 1
    if jax.default_backend() != "gpu":
        assert summary["mosaic"]["status"] == "unsupported" and "Hopper" in summary["mosaic"]["reason"]
    assert [p for r in recs for p in check_record({**r, "grid": "train_packed"})] == []  # the result file takes them
    assert summary["xla"]["tflops"] > 0 and steps[0]["median_ms"] == steps[1]["median_ms"]  # one dispatch group
    with pytest.raises(ValueError, match="take no segment ids"):
        packed_records(("naive",), steps=2)


def _ours_against_xla(run):
    """The packed loss and its gradients through our kernel against XLA given the same documents as a mask."""
    params = init_params(BF16, 0)
    corpus = load_corpus()
    tokens, ids = (
        jnp.asarray(x)
        for x in packed_batch_at(corpus.train, corpus.train_starts, batch=2, seq_len=BF16.seq_len, seed=0, step=0)
    )
    ids = ids.at[:, 30:].add(1)  # a document boundary in every row, whatever was drawn
    got = {}
    for impl in ("xla", "mosaic"):
        with run() if impl == "mosaic" else contextlib.nullcontext():
            model = GPT(BF16, impl)
            got[impl] = jax.value_and_grad(lambda p, model=model: packed_loss(model, p, tokens, ids))(params)
    assert float(got["mosaic"][0]) == pytest.approx(float(got["xla"][0]), abs=2e-2)
    for a, b in zip(jax.tree.leaves(got["mosaic"][1]), jax.tree.leaves(got["xla"][1])):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=3e-2, rtol=1e-1)


@pytest.mark.slow
def test_interpreted_kernel_trains_on_packed_documents_as_xla_does():
    from attention_tutorial.kernels.mosaic.interpret import interpret

    if jax.default_backend() == "gpu":
        pytest.skip("the GPU test compiles the kernel instead")
    _ours_against_xla(interpret)


@pytest.mark.gpu
def test_gpu_kernel_trains_on_packed_documents_as_xla_does():
    from attention_tutorial.inputs import AttentionShape
    from attention_tutorial.kernels.mosaic import why_not

    if reason := why_not(AttentionShape(2, 64, 64, 4, 4, 16), jnp.bfloat16, True):
        pytest.skip(reason)
    _ours_against_xla(contextlib.nullcontext)
