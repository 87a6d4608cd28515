"""Keeping results: result files, the recorder, and the plots and tables that show records (the CLI's too).

Modules: :mod:`~attention_tutorial.results.store` (result files: provenance, save/load/validate, selection),
:mod:`~attention_tutorial.results.record` (the recorder), :mod:`~attention_tutorial.results.stamp` (the "last
executed" line) and :mod:`~attention_tutorial.results.plotting` (figures and tables of records). What the pages read
from the records (verdicts, live runs beside the recording) lives in :mod:`attention_tutorial.site`.
The store's functions are re-exported here: ``from attention_tutorial import results; results.load(path)``.
This layer may import everything below it (``kernels``, ``measure``, ``train`` and the top-level modules).
"""

from .store import (
    RESULTS_DIR,
    ResultFileError,
    describe,
    load,
    recorded,
    result_files,
    save,
    select,
    slug,
    validate,
)

__all__ = [
    "RESULTS_DIR",
    "ResultFileError",
    "describe",
    "load",
    "recorded",
    "result_files",
    "save",
    "select",
    "slug",
    "validate",
]
