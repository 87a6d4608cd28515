"""The corpus: the Python standard library's own source files, as bytes (vocabulary 256), split by file.

Documents: a file's opening (its docstring and imports) and each of its top-level definitions (``def``, ``class``,
with their decorators) are documents of their own, a few hundred bytes to a few KiB (median about 500).
:func:`packed_batch_at` gives the same windows as :func:`batch_at` with, for every byte, which document of its
window it belongs to (segment ids): documents packed into rows, as a model trained on packed documents sees them.

Every Python installation ships it, so nothing is downloaded. Files are read in sorted order of their path
relative to ``sysconfig.get_paths()["stdlib"]`` (installed packages under site-packages/dist-packages and caches
are left out); a file is held out for evaluation when the CRC-32 of its relative path is divisible by
``HELD_OUT_EVERY``, so the split does not move when files are added elsewhere. Batches are random windows drawn
by a generator seeded with (seed, step): the same seed gives the same batches, in any order of asking.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..inputs import check_int

VOCAB = 256  # byte-level tokens
HELD_OUT_EVERY = 20  # about one file in twenty is held out
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
# a document starts at a line that opens a top-level definition or its first decorator
DOCUMENT_START = re.compile(rb"(?<=\n)(?=(?:@|def |class |async def ))")


@dataclass(frozen=True)
class Corpus:
    """Training and held-out bytes (uint8 arrays), where they came from, and a digest of their contents."""

    train: np.ndarray
    held_out: np.ndarray
    root: str
    train_files: int
    held_out_files: int
    sha256: str
    train_starts: np.ndarray | None = None  # where each training document starts in ``train`` (see the module)

    def describe(self) -> dict:
        """The corpus as record fields (sizes, file counts, digest; no arrays)."""
        return {
            "corpus": "python-stdlib",
            "corpus_root": self.root,
            "corpus_sha256": self.sha256,
            "train_bytes": int(self.train.size),
            "held_out_bytes": int(self.held_out.size),
            "train_files": self.train_files,
            "held_out_files": self.held_out_files,
        }


def stdlib_root() -> Path:
    """The directory of this Python's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root=None) -> list[str]:
    """Relative paths (POSIX) of the ``.py`` files under ``root`` (default: the stdlib), sorted."""
    root = Path(root or stdlib_root())
    rels = (p.relative_to(root) for p in root.rglob("*.py") if p.is_file())
    return sorted(r.as_posix() for r in rels if not EXCLUDED_DIRS & set(r.parts))


def is_held_out(rel_path: str) -> bool:
    """Whether the file at ``rel_path`` belongs to the held-out split."""
    return zlib.crc32(rel_path.encode()) % HELD_OUT_EVERY == 0


@functools.lru_cache(maxsize=2)
def load_corpus(root=None) -> Corpus:
    """Read every source file under ``root`` (default: the stdlib) into the training and held-out splits."""
    root = Path(root or stdlib_root())
    files = source_files(root)
    if not files:
        raise ValueError(f"no .py files under {root}; pass root= a directory of Python sources.")
    digest = hashlib.sha256()
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    for rel in files:
        data = (root / rel).read_bytes()
        digest.update(rel.encode() + b"\0" + data)
        parts[is_held_out(rel)].append(data)
    train, held = (np.frombuffer(b"".join(parts[h]), dtype=np.uint8) for h in (False, True))
    offsets = np.cumsum([0] + [len(d) for d in parts[False][:-1]], dtype=np.int64)
    starts = np.concatenate([off + document_starts(d) for off, d in zip(offsets, parts[False])] or [[0]])
    return Corpus(train, held, str(root), len(parts[False]), len(parts[True]), digest.hexdigest(), starts)


def document_starts(source: bytes) -> np.ndarray:
    """Where the documents of one source file start (see the module): 0, then each line that opens a top-level
    definition, a decorated one at its first decorator."""
    cuts = [0]
    for m in DOCUMENT_START.finditer(source):
        line_before = source[source.rfind(b"\n", 0, m.start() - 1) + 1 : m.start()]
        if m.start() > 0 and not line_before.startswith(b"@"):  # a definition's decorators stay with it
            cuts.append(m.start())
    return np.asarray(cuts, np.int64)


def batch_at(tokens: np.ndarray, *, batch: int, seq_len: int, seed: int, step: int) -> np.ndarray:
    """Batch ``step`` of the stream for ``seed``: (batch, seq_len + 1) int32 windows of ``tokens`` (inputs are
    [:, :-1], targets [:, 1:])."""
    if not (isinstance(tokens, np.ndarray) and tokens.ndim == 1 and np.issubdtype(tokens.dtype, np.integer)):
        raise ValueError(
            f"tokens must be a 1-D NumPy array of integer ids (e.g. load_corpus().train); got {tokens!r:.60}."
        )
    batch, seq_len = check_int("batch", batch, minimum=1), check_int("seq_len", seq_len, minimum=1)
    seed, step = check_int("seed", seed, minimum=0), check_int("step", step, minimum=0)
    if tokens.size < seq_len + 2:
        raise ValueError(f"need more than seq_len + 1 = {seq_len + 1} tokens; got {tokens.size}.")
    return np.stack(
        [tokens[s : s + seq_len + 1] for s in _window_starts(tokens.size, batch, seq_len, seed, step)]
    ).astype(np.int32)


def _window_starts(size: int, batch: int, seq_len: int, seed: int, step: int) -> np.ndarray:
    return np.random.default_rng((seed, step)).integers(0, size - seq_len - 1, size=batch)


def packed_batch_at(tokens: np.ndarray, starts: np.ndarray, *, batch: int, seq_len: int, seed: int, step: int):
    """Batch ``step`` of packed documents for ``seed``: ((batch, seq_len + 1) int32 tokens, (batch, seq_len + 1)
    int32 segment ids). Each row holds documents drawn at random (each equally likely, whatever its length), whole,
    one after another; the last one is cut at the row's end. A byte's id is its document's place in the row (0, 1,
    ...). ``starts``: where each document starts in ``tokens`` (non-decreasing from 0; ``Corpus.train_starts``)."""
    if not (isinstance(tokens, np.ndarray) and tokens.ndim == 1 and np.issubdtype(tokens.dtype, np.integer)):
        raise ValueError(
            f"tokens must be a 1-D NumPy array of integer ids (e.g. load_corpus().train); got {tokens!r:.60}."
        )
    starts = np.asarray(starts)
    if (
        starts.ndim != 1
        or starts.size == 0
        or starts[0] != 0
        or np.any(np.diff(starts) < 0)
        or starts[-1] >= tokens.size
    ):
        raise ValueError(
            f"starts must be the documents' non-decreasing start offsets in tokens, from 0 "
            f"(Corpus.train_starts); got {starts!r:.80}."
        )
    batch, seq_len = check_int("batch", batch, minimum=1), check_int("seq_len", seq_len, minimum=1)
    seed, step = check_int("seed", seed, minimum=0), check_int("step", step, minimum=0)
    ends = np.append(starts[1:], tokens.size)
    docs = np.flatnonzero(ends > starts)  # empty files make empty documents
    rng = np.random.default_rng((seed, step, 1))
    out, ids = np.empty((batch, seq_len + 1), np.int32), np.empty((batch, seq_len + 1), np.int32)
    for row in range(batch):
        filled, n = 0, 0
        while filled < seq_len + 1:
            d = docs[rng.integers(docs.size)]
            piece = tokens[starts[d] : min(ends[d], starts[d] + seq_len + 1 - filled)]
            out[row, filled : filled + piece.size], ids[row, filled : filled + piece.size] = piece, n
            filled, n = filled + piece.size, n + 1
    return out, ids
