"""The corpus: the Python standard library's own source files, as bytes (vocabulary 256), split by file.

Every Python installation ships it, so nothing is downloaded. Files are read in sorted order of their path
relative to ``sysconfig.get_paths()["stdlib"]`` (installed packages under site-packages/dist-packages and caches
are left out); a file is held out for evaluation when the CRC-32 of its relative path is divisible by
``HELD_OUT_EVERY``, so the split does not move when files are added elsewhere. Batches are random windows drawn
by a generator seeded with (seed, step): the same seed gives the same batches, in any order of asking.
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..inputs import check_int

VOCAB = 256  # byte-level tokens
HELD_OUT_EVERY = 20  # about one file in twenty is held out
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True)
class Corpus:
    """Training and held-out bytes (uint8 arrays), where they came from, and a digest of their contents."""

    train: np.ndarray
    held_out: np.ndarray
    root: str
    train_files: int
    held_out_files: int
    sha256: str

    def describe(self) -> dict:
        """The corpus as record fields (sizes, file counts, digest; no arrays)."""
        return {"corpus": "python-stdlib", "corpus_root": self.root, "corpus_sha256": self.sha256,
                "train_bytes": int(self.train.size), "held_out_bytes": int(self.held_out.size),
                "train_files": self.train_files, "held_out_files": self.held_out_files}  # fmt: skip


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
    return Corpus(train, held, str(root), len(parts[False]), len(parts[True]), digest.hexdigest())


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
    starts = np.random.default_rng((seed, step)).integers(0, tokens.size - seq_len - 1, size=batch)
    return np.stack([tokens[s : s + seq_len + 1] for s in starts]).astype(np.int32)
