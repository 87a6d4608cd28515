"""The corpus is the stdlib's own source, read deterministically, split by file; batches are seeded windows."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import pytest

from attention_tutorial.train import data


@pytest.fixture(scope="module")
def corpus():
    return data.load_corpus()


def test_the_corpus_is_the_stdlib_source_text(corpus):
    # os.py, read here independently, sits whole in the split its path says
    os_src = Path(os.__file__).read_bytes()
    split = corpus.held_out if zlib.crc32(b"os.py") % data.HELD_OUT_EVERY == 0 else corpus.train
    assert split.tobytes().find(os_src) >= 0
    text = corpus.train.tobytes()
    assert text.count(b"\ndef ") > 1000 and text.count(b"import ") > 1000
    assert corpus.train.dtype == np.uint8 and corpus.train.size > 1_000_000
    assert 0 < corpus.held_out.size < corpus.train.size / 5


def test_reading_twice_gives_the_same_bytes(corpus):
    again = data.load_corpus.__wrapped__()
    assert again.sha256 == corpus.sha256
    np.testing.assert_array_equal(again.held_out, corpus.held_out)


def test_split_by_file_sorted_and_installed_packages_left_out(tmp_path):
    names = [f"m{i:02d}.py" for i in range(40)]
    for name in names:
        (tmp_path / name).write_bytes(f"# {name}\n".encode())
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "third_party.py").write_bytes(b"# not stdlib\n")
    (tmp_path / "notes.txt").write_bytes(b"not python\n")
    assert data.source_files(tmp_path) == names
    c = data.load_corpus(tmp_path)
    held = [n for n in names if zlib.crc32(n.encode()) % 20 == 0]
    assert 0 < len(held) < len(names)  # this set of names exercises both splits
    assert c.held_out.tobytes() == b"".join(f"# {n}\n".encode() for n in held)
    assert c.train.tobytes() == b"".join(f"# {n}\n".encode() for n in names if n not in held)
    assert (c.train_files, c.held_out_files) == (len(names) - len(held), len(held))


def test_batches_are_seeded_windows_of_the_stream():
    tokens = np.arange(1000, dtype=np.uint16) % 256
    a = data.batch_at(tokens, batch=3, seq_len=16, seed=5, step=7)
    assert a.shape == (3, 17) and a.dtype == np.int32
    for row in a:  # each row is a contiguous slice: consecutive values modulo 256
        assert np.all(np.diff(row) % 256 == 1)
    np.testing.assert_array_equal(a, data.batch_at(tokens, batch=3, seq_len=16, seed=5, step=7))
    assert not np.array_equal(a, data.batch_at(tokens, batch=3, seq_len=16, seed=5, step=8))
    assert not np.array_equal(a, data.batch_at(tokens, batch=3, seq_len=16, seed=6, step=7))


def test_too_short_a_stream_names_the_sizes():
    with pytest.raises(ValueError, match="seq_len"):
        data.batch_at(np.zeros(10, np.uint8), batch=1, seq_len=16, seed=0, step=0)
    with pytest.raises(ValueError, match=r"no \.py files"):
        data.load_corpus.__wrapped__("/nonexistent-dir-for-test")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tokens": [1, 2, 3] * 100}, "1-D NumPy array of integer ids"),
        ({"batch": 0}, "batch must be an integer"),
        ({"seq_len": -1}, "seq_len must be an integer"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"step": 1.5}, "step must be an integer >= 0"),
    ],
)
def test_batch_at_names_a_bad_argument(kwargs, match):
    args = {"tokens": np.zeros(100, np.uint8), "batch": 1, "seq_len": 4, "seed": 0, "step": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        data.batch_at(args.pop("tokens"), **args)
