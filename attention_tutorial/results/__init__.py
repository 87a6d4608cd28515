"""Keeping and showing results: result files, the recorder, what pages call, plots and tables.

Modules: :mod:`~attention_tutorial.results.store` (result files: provenance, save/load/validate, selection),
:mod:`~attention_tutorial.results.record` (the recorder), :mod:`~attention_tutorial.results.report` (live runs and
recorded references for the pages), :mod:`~attention_tutorial.results.plotting` (figures and tables),
:mod:`~attention_tutorial.results.claims` (words from data) and :mod:`~attention_tutorial.results.lesson_tables` (the
small lessons' tables).
The store's functions are re-exported here: ``from attention_tutorial import results; results.load(path)``.
This layer may import everything below it (``kernels``, ``measure`` and the top-level modules).
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
