"""Result files: records plus the provenance that says where they came from; save, load, validate, find.

A result file is JSON with two keys. ``provenance``: backend ("gpu" when absent, or "cpu"), gpu, driver, jax,
jaxlib, cudnn, transformer_engine, python, created, command, and the reference rates matmul_bf16_tflops and copy_gbps
measured in the same run (null when not measured; gpu, driver and cudnn are null on a CPU), plus per-grid details
under ``grids``, instruction counts of the Pallas kernels under ``kernel_code``, the small lessons of
:mod:`~attention_tutorial.measure.lessons` under ``lessons``, the tables of ``tools/tune.py`` under ``tuning`` (see
:func:`tuning`) and what scripts did to the file under ``history``.
``records``: one dict per measured point, built and checked by :mod:`attention_tutorial.measure.sweep` (the one
owner of the record schema), each tagged with its ``grid``.

Files are written atomically (a temporary file in the same folder, flushed and fsynced, then ``os.replace``): a
write killed at any moment leaves the previous file whole, and the next save removes the temporary file it left.
Saves to one file are serialised by a lock (``fcntl.flock`` on a lock file beside it, where the OS has it), so
processes saving at once keep every point. An existing file is merged into, never silently replaced: one that is
not a result file is never merged into, nor one of another device, nor one whose records would be relabelled with
this run's versions (:class:`ResultFileError`). A symlink is followed (its target is written, the link kept); a
read-only file is refused. JSON is written strict: a NaN or infinity becomes null, and a ``note`` beside it says so.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import math
import os
import re
import stat
import tempfile
from pathlib import Path

from ..measure.sweep import check_record, point_key

try:
    import fcntl
except ImportError:  # no advisory locks on this OS (Windows): saves to one file are not serialised there
    fcntl = None  # type: ignore[assignment]

PROVENANCE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "gpu": str,
    "driver": str,
    "jax": str,
    "jaxlib": str,
    "cudnn": str,
    "transformer_engine": (str, type(None)),
    "python": str,
    "created": str,
    "command": str,
}
GPU_ONLY = ("gpu", "driver", "cudnn")  # null on a CPU
CEILINGS = ("matmul_bf16_tflops", "copy_gbps")  # reference rates, present in every file; null when not measured
# Provenance entries a later run adds to instead of replacing: per-grid details, kernel instruction counts, history.
MERGED_PROVENANCE = ("grids", "kernel_code", "spills", "lessons", "timeline", "timeline_backward", "race", "tuning")
# What a record is labelled with (the top-level provenance, or its grid's entry where that names them): a merge
# that would change any of these for an old record is refused.
LABEL_FIELDS = ("backend", "gpu", "cpu", "driver", "jax", "jaxlib", "cudnn", "transformer_engine", "python")
REFERENCE_GPU = "nvidia-h200"
RESULTS_DIR = Path(os.environ.get("ATTENTION_TUTORIAL_RESULTS", Path(__file__).resolve().parent / "data"))


class ResultFileError(ValueError):
    """A file that is not a valid result file (empty, truncated, not JSON, not results, breaking the schema)."""


def slug(gpu_name: str) -> str:
    """A file name for a GPU: 'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def _bad_date(value) -> bool:
    try:
        dt.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return True
    return False


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_provenance(prov: dict) -> list[str]:
    out = []
    backend = prov.get("backend", "gpu")
    if not isinstance(backend, str) or not backend:
        out.append(f"provenance 'backend' must be a name such as 'gpu' or 'cpu'; got {backend!r}")
    for field, types in PROVENANCE_FIELDS.items():
        nullable = backend != "gpu" and field in GPU_ONLY
        if field not in prov:
            out.append(f"provenance lacks {field!r}")
        elif not isinstance(prov[field], types) and not (nullable and prov[field] is None):
            out.append(f"provenance {field!r} has type {type(prov[field]).__name__}")
    if isinstance(prov.get("created"), str) and _bad_date(prov["created"]):
        out.append(f"provenance 'created' is not an ISO date: {prov['created']!r}")
    for field in CEILINGS:
        if field not in prov:
            out.append(f"provenance lacks {field!r} (null when not measured)")
        elif prov[field] is not None and not (_is_number(prov[field]) and prov[field] > 0):
            out.append(f"provenance {field!r} must be a positive number or null; got {prov[field]!r}")
    tuning = prov.get("tuning", {})
    if not isinstance(tuning, dict):
        out.append(f"provenance 'tuning' must be an object of kernel name -> table; got {type(tuning).__name__}")
    for name, entry in tuning.items() if isinstance(tuning, dict) else ():
        if not (isinstance(entry, dict) and isinstance(entry.get("rows"), list)):
            out.append(f"provenance tuning table {name!r} must be an object with a list of 'rows'")
    grids = prov.get("grids", {})
    if not isinstance(grids, dict):
        return [*out, f"provenance 'grids' must be an object of grid name -> details; got {type(grids).__name__}"]
    for name, entry in grids.items():
        if not isinstance(entry, dict):
            out.append(f"provenance grid {name!r} must be an object; got {type(entry).__name__}")
            continue
        if _bad_date(entry.get("created")):
            out.append(f"provenance grid {name!r} has no ISO 'created' date: {entry.get('created')!r}")
        if "seconds" in entry and not (_is_number(entry["seconds"]) and entry["seconds"] >= 0):
            out.append(f"provenance grid {name!r} 'seconds' must be a number >= 0; got {entry['seconds']!r}")
        peak = entry.get("matmul_bf16_tflops")
        if peak is not None and not (_is_number(peak) and peak > 0):
            out.append(f"provenance grid {name!r} 'matmul_bf16_tflops' must be positive; got {peak!r}")
    return out


def validate(data) -> list[str]:
    """Every way ``data`` breaks the result-file schema, as messages; an empty list means it is valid."""
    if not isinstance(data, dict):
        return [f"the top level is a {type(data).__name__}, not an object with 'provenance' and 'records'"]
    prov = data.get("provenance")
    if not isinstance(prov, dict):
        return ["missing top-level 'provenance' object"]
    problems = _check_provenance(prov)
    records = data.get("records")
    held = any(prov.get(key) for key in MERGED_PROVENANCE if key != "grids")  # races, lessons, timelines, ...
    if not isinstance(records, list) or not (records or held):
        return [*problems, "'records' must be a non-empty list (or the provenance must hold what was measured)"]
    grids = prov.get("grids") if isinstance(prov.get("grids"), dict) else None
    for i, rec in enumerate(records):
        problems += [f"record {i} {p}" for p in check_record(rec)]
        if grids is not None and isinstance(rec, dict) and "grid" in rec and rec["grid"] not in grids:
            problems.append(f"record {i} belongs to grid {rec.get('grid')!r}, which the provenance's grids lack")
    return problems


def _check_path(path) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file name (a str or a Path); got {type(path).__name__} {path!r}")


FILE_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in FILE_KINDS if test(mode)), "not a regular file")


def load(path) -> dict:
    """Read and validate a result file; :class:`ResultFileError` (a ``ValueError``) names the file and what is
    wrong with it (not a regular file, empty, truncated or not JSON, not a result file, or each way it breaks the
    schema). A named pipe or a device is refused without reading from it (it could block forever)."""
    _check_path(path)
    path = Path(path)
    try:  # non-blocking: opening a named pipe must not wait for a writer
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        if err.errno == errno.ENXIO:  # a socket
            raise ResultFileError(f"{path} is a socket, not a regular file; name a result file (.json).") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ResultFileError(f"{path} is {_kind(mode)}, not a regular file; name a result file (.json).")
    with os.fdopen(fd, "rb") as f:
        raw = f.read()
    if not raw.strip():
        raise ResultFileError(f"{path} is empty ({len(raw)} bytes), not a result file.") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ResultFileError(
            f"{path} is not UTF-8 text ({err.reason} at byte {err.start}), not a result file."
        ) from None
    except json.JSONDecodeError as err:
        cut = err.msg.startswith("Unterminated") or err.pos >= len(raw.rstrip()) - 1
        end = " (it ends early: truncated?)" if cut else ""
        raise ResultFileError(
            f"{path} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno} of {len(raw)} bytes{end}."
        ) from None
    except RecursionError:
        raise ResultFileError(f"{path} nests its JSON too deeply to read; it is not a result file.") from None
    except ValueError as err:  # an integer too long to convert (Python's digit limit)
        raise ResultFileError(f"{path} holds a number JSON cannot be read as: {str(err).split(';')[0]}.") from None
    if not isinstance(data, dict) or not {"provenance", "records"} <= set(data):
        found = sorted(data)[:8] if isinstance(data, dict) else type(data).__name__
        raise ResultFileError(
            f"{path} is JSON but not a result file: it needs 'provenance' and 'records' at the top; found {found}."
        )
    problems = validate(data)
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ResultFileError(f"{path} is not a valid result file: " + "; ".join(problems[:5]) + more)
    return data


def _value(prov: dict, field: str):
    return prov.get(field, "gpu" if field == "backend" else None)


def _label(prov: dict, grid) -> dict:
    """What a record of ``grid`` is labelled with in a file of provenance ``prov`` (as :func:`describe` reads it)."""
    entry = prov.get("grids", {}).get(grid) if isinstance(grid, str) else None
    p = {**prov, "transformer_engine": None, **entry} if entry else prov
    return {f: _value(p, f) for f in LABEL_FIELDS}


def _device(prov: dict) -> str:
    """The device results were measured on: the GPU's name, or the backend and processor off a GPU."""
    backend = _value(prov, "backend")
    return str(prov.get("gpu")) if backend == "gpu" else f"{str(backend).upper()} ({prov.get('cpu')})"


def _same_device(before: dict, provenance: dict, path) -> None:
    if _device(before) != _device(provenance):
        raise ResultFileError(
            f"refusing to merge into {path}: it holds results of {_device(before)}, this run is on "
            f"{_device(provenance)}; write another file (results of one device per file)."
        )


def _merge(old: dict, provenance: dict, records: list[dict], replace_grids: bool, path) -> tuple[dict, list[dict]]:
    """(provenance, records) of ``old`` with the new ones merged in (see :func:`save`); :class:`ResultFileError`
    where the merge would put another device's results beside these, or relabel an old record."""
    before = old["provenance"]
    _same_device(before, provenance, path)
    if replace_grids:
        new_grids = {r.get("grid") for r in records}
        keep = [r for r in old["records"] if r.get("grid") not in new_grids]
    else:
        new_points = {point_key(r) for r in records}
        keep = [r for r in old["records"] if point_key(r) not in new_points]
    prov = {**provenance}
    for key in MERGED_PROVENANCE:
        merged = {**before.get(key, {}), **provenance.get(key, {})}
        if merged:
            prov[key] = merged
    # an old grid entry that does not name the versions it ran with was labelled by the old top level: keep that
    for name, entry in before.get("grids", {}).items():
        if name not in provenance.get("grids", {}) and isinstance(entry, dict):
            filled = {
                f: _value(before, f)
                for f in LABEL_FIELDS
                if f != "transformer_engine" and f not in entry and _value(before, f) != _value(provenance, f)
            }
            if filled:
                prov["grids"][name] = {**entry, **filled}
    moved = [r for r in keep if _label(before, r.get("grid")) != _label(prov, r.get("grid"))]
    if moved:
        was, now = _label(before, moved[0].get("grid")), _label(prov, moved[0].get("grid"))
        diff = ", ".join(f"{f} {was[f]} -> {now[f]}" for f in LABEL_FIELDS if was[f] != now[f])
        grids = sorted({str(r.get("grid", "no grid")) for r in moved})
        raise ResultFileError(
            f"refusing to merge into {path}: {len(moved)} of its records ({', '.join(grids)}) were measured in "
            f"another environment and would be relabelled with this run's ({diff}); save to another file, or "
            "re-measure them here (overwrite=True, --force on the command line, replaces the file)."
        )
    history = before.get("history", []) + [
        h for h in provenance.get("history", []) if h not in before.get("history", [])
    ]
    if history:
        prov["history"] = history
    return prov, keep + records


def check_target(path) -> list[str]:
    """What would stop :func:`save` writing ``path``, checked before anything is measured: an empty name or one
    not ending in .json, a folder, device or pipe, a folder that is not writable, a read-only file. Messages
    start with what is wrong (the caller names the argument)."""
    try:
        _check_path(path)
        real = Path(os.path.realpath(path)) if os.fspath(path).strip() else None
        if real is not None:
            _check_name(real)
        if real is not None and real.exists() and not real.is_file():
            return [f"{real} is {_kind(real.stat().st_mode)}, not a regular file; name a .json file"]
        target = _target(path)
    except (TypeError, ValueError) as err:
        return [str(err)]
    except OSError as err:
        return [f"cannot use {path} ({err.strerror}); choose another path"]
    folder = target.parent
    if folder.is_dir():
        try:  # the one sure test (a read-only mount, /proc, root's rights): make a file there and remove it
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as err:
            return [f"cannot write in the folder {folder} ({err.strerror}); choose a folder you can write"]
    if target.is_file() and _read_only(target):
        return [f"{target} is read-only; make it writable (chmod u+w {target}) or choose another path"]
    return []


def check_merge(path, provenance: dict) -> str | None:
    """Why saving this run's results (``provenance``) into the existing ``path`` would be refused, or None: checked
    before measuring, as if no old point were measured again (each old record keeps its label)."""
    target = _target(path)
    if not target.is_file():
        return None
    try:
        _merge(load(target), provenance, [], False, path)
    except ResultFileError as err:
        return str(err).removeprefix(f"refusing to merge into {path}: ")
    return None


def _target(path) -> Path:
    """The file a save to ``path`` writes: a .json name, through any symlink to its target."""
    _check_path(path)
    if not os.fspath(path).strip():
        raise ValueError("the path is empty; name a result file such as results.json")
    if os.fspath(path).endswith(("/", os.sep)):
        raise ValueError(f"{os.fspath(path)!r} ends in a slash, which names a folder; name the file without it")
    path = Path(path)
    if path.suffix.lower() != ".json":
        raise ValueError(
            f"{str(path)!r} does not end in .json: a result file is JSON; name it e.g. "
            f"{str(path.with_name(path.stem + '.json'))!r}"
        )
    return _check_name(Path(os.path.realpath(path)))


NAME_MAX = 255  # bytes in one file name on Linux and macOS file systems
NAME_ROOM = len(".") + len(".abcd1234.tmp")  # what the temporary and lock files beside a result file add


def _check_name(target: Path) -> Path:
    """``target``, or ``ValueError`` when its name leaves no room for the temporary file written beside it."""
    size, most = len(os.fsencode(target.name)), NAME_MAX - NAME_ROOM
    if size > most:
        raise ValueError(
            f"the file name is too long ({size} bytes; at most {most}, room is kept for the temporary "
            f"file beside it); choose a shorter name"
        )
    return target


def _read_only(target: Path) -> bool:
    """True for a file nobody may write (no write bit: refused even for root, whom ``os.access`` always lets)."""
    return not target.stat().st_mode & 0o222 or not os.access(target, os.W_OK)


def save(path, provenance: dict, records: list[dict], *, replace_grids=False, overwrite=False) -> dict:
    """Write a result file atomically and return what was written.

    An existing result file is merged into, never replaced: every old record is kept except one for the very same
    point as a new record (see ``point_key``), which its new measurement replaces; with ``replace_grids`` (the
    recorder, which measures grids whole) the grids in ``records`` replace all of those grids' old records. A file
    that is not a valid result file, holds another device's results, or whose records would be relabelled with
    this run's versions is refused (``ResultFileError``) unless ``overwrite``, which then writes ``provenance`` and
    ``records`` alone (a file that can be merged into is merged into even then: two runs replacing one file keep
    each other's points). ``replace_grids`` and ``overwrite`` must be bools. ``path`` must end in .json; a symlink is followed; a read-only file is refused
    (``PermissionError``). Invalid data is never written; a NaN or infinity outside the checked fields is written
    as null with a ``note``. Processes saving to one file at once are serialised by a lock.
    """
    target = _target(path)
    for name, flag in (("replace_grids", replace_grids), ("overwrite", overwrite)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False; got {type(flag).__name__} {flag!r}")
    if not isinstance(provenance, dict):
        raise TypeError(f"provenance must be a dict (the run's provenance); got {type(provenance).__name__}")
    if not isinstance(records, (list, tuple)):
        raise TypeError(f"records must be a list of record dicts; got {type(records).__name__}")
    records = list(records)
    with _locked(target):
        _check_writable(target)
        if target.exists():
            try:
                provenance, records = _merge(_load_any(target, path), provenance, records, replace_grids, path)
            except ResultFileError:
                if not overwrite:  # a file that cannot be merged into is replaced only when told to
                    raise
        return _write_valid(target, {"provenance": provenance, "records": records}, path)


def save_entry(path, key: str, name: str, entry: dict, provenance: dict) -> dict:
    """Put ``entry`` at ``provenance[key][name]`` of the result file ``path``, atomically, and return what was
    written: the file's records and the rest of its provenance stay as they are (a file not there yet starts from
    ``provenance``, this run's, and no records). ``key`` is one of :data:`MERGED_PROVENANCE`, which a later
    :func:`save` keeps. Refused as :func:`save` refuses: a file that is not a result file or holds another device's
    results (:class:`ResultFileError`), a read-only one (``PermissionError``)."""
    if key not in MERGED_PROVENANCE or key == "grids":
        raise ValueError(f"save_entry keeps entries under {', '.join(MERGED_PROVENANCE[1:])}; got {key!r}")
    target = _target(path)
    with _locked(target):
        _check_writable(target)
        data: dict = {"provenance": dict(provenance), "records": []}
        if target.exists():
            data = _load_any(target, path)
            _same_device(data["provenance"], provenance, path)
        prov = data["provenance"]
        prov[key] = {**prov.get(key, {}), name: entry}
        return _write_valid(target, data, path)


def _check_writable(target: Path) -> None:
    if target.is_file() and _read_only(target):
        raise PermissionError(
            f"refusing to write {target}: it is read-only; make it writable (chmod u+w) or save to another path"
        )
    if target.exists() and not target.is_file():
        raise ResultFileError(f"refusing to write {target}: it is {_kind(target.stat().st_mode)}, not a file")


def _write_valid(target: Path, data: dict, path) -> dict:
    """Write ``data`` to ``target`` under its lock, strict and atomically; never an invalid result file."""
    problems = validate(data)
    if problems:
        raise ValueError(f"refusing to write an invalid result file to {path}: " + "; ".join(problems[:5]))
    data, _ = _strict(data, "")
    _write(target, json.dumps(data, indent=1, allow_nan=False) + "\n")
    return data


def _load_any(target: Path, path) -> dict:
    """The result file at ``target``, or :class:`ResultFileError` naming ``path`` as one that cannot be merged into."""
    try:
        return load(target)
    except ResultFileError as err:
        raise ResultFileError(f"refusing to merge into {path}: {err}") from None


def _strict(value, where: str):
    """``value`` as strict JSON: each NaN or infinity becomes None, named in a ``note`` of the object that held it;
    NumPy scalars and arrays become numbers and lists. Returns (value, [(path below value, original)])."""
    if hasattr(value, "tolist") and type(value).__module__.split(".")[0] in ("numpy", "jax", "jaxlib"):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None, [("", value)]
    if value is None or isinstance(value, (str, int, float)):
        return value, []
    if isinstance(value, (list, tuple)):
        items, nulled = [], []
        for i, v in enumerate(value):
            clean, bad = _strict(v, f"{where}[{i}]")
            items.append(clean)
            nulled += [(f"[{i}]{p}", x) for p, x in bad]
        return items, nulled
    if isinstance(value, dict):
        out, nulled = {}, []
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(
                    f"{where or 'the data'} has a key {k!r} of type {type(k).__name__}; JSON keys are "
                    "strings: convert it with str()"
                )
            out[k], bad = _strict(v, f"{where}.{k}" if where else k)
            nulled += [(f"{k}{p}" if not p or p[0] == "[" else f"{k}.{p}", x) for p, x in bad]
        if nulled:
            words = "not finite, written as null: " + ", ".join(f"{p} ({x})" for p, x in nulled)
            key = "note" if isinstance(out.get("note", ""), str) else "note_not_finite"
            out[key] = f"{out[key]}; {words}" if out.get(key) else words
        return out, []
    raise TypeError(
        f"{where or 'the data'} is a {type(value).__name__}, which a result file (JSON) cannot hold; "
        "convert it to a number, string, list or dict"
    )


@contextlib.contextmanager
def _locked(target: Path):
    """Hold an exclusive lock for saving ``target``: ``flock`` on the lock file ``.<name>.lock`` beside it, removed
    by its holder (a waiter that then holds a removed file's lock takes the new one). Without fcntl: no lock."""
    if fcntl is None:
        yield
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.with_name(f".{target.name}.lock")
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except IsADirectoryError:
            raise IsADirectoryError(
                errno.EISDIR,
                f"the lock file {lock} is a folder; remove it (it guards saves to {target.name}) and save again",
            ) from None
        except OSError as err:
            raise OSError(
                err.errno,
                f"cannot write in the folder {target.parent} ({err.strerror}); save to a folder you can write",
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                held = os.stat(lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                held = False
        except BaseException:
            os.close(fd)
            raise
        if held:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def _write(target: Path, text: str) -> None:
    """Write under the lock: stale temporary files of ``target`` removed, then atomically replaced."""
    target.parent.mkdir(parents=True, exist_ok=True)
    stale = re.compile(rf"\.{re.escape(target.name)}\.[a-z0-9_]{{8}}\.tmp")  # tempfile's names, from a killed write
    for entry in os.scandir(target.parent):
        if stale.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    mode = target.stat().st_mode & 0o777 if target.exists() else 0o644
    data = text.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            raise OSError(
                err.errno,
                f"no space left on the disk of {target.parent} to write {target.name} "
                f"({len(data) / 2**20:.1f} MiB); the file is unchanged: free some space, or save to "
                "another disk",
            ) from None
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the OS allows it
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def recorded(gpu: str = REFERENCE_GPU, directory=None) -> dict | None:
    """The recorded reference results for ``gpu`` (a slug, e.g. 'nvidia-h200'), or None if none is committed."""
    path = Path(directory or RESULTS_DIR) / f"{slug(gpu)}.json"
    return load(path) if path.exists() else None


def tuning(kernel: str, gpu: str = REFERENCE_GPU, directory=None) -> dict:
    """The tuning table ``tools/tune.py KERNEL`` recorded on ``gpu`` (a slug), from its result file: ``rows`` (kernel,
    B, T, N, H, causal, config: the tiles tried or the baseline's name, and tflops: None where it did not compile or
    fit; some tables add fields of their own) and how they were measured, as every record is stamped: gpu, driver,
    versions, ``commit`` and ``dirty`` (None where not known), ``created``, ``command``, the SM clock before and
    after (``clocks_before``, ``clocks_after``) and a ``note`` where something is not known."""
    data = recorded(gpu, directory)
    tables = data["provenance"].get("tuning", {}) if data else {}
    if kernel not in tables:
        held = ", ".join(sorted(tables)) or "none"
        raise LookupError(
            f"no tuning table for {kernel!r} is recorded for {gpu} (recorded: {held}); measure it on that GPU "
            f"with `bash tools/gpu.sh tune {kernel}`."
        )
    return tables[kernel]


def result_files(directory=None) -> list[Path]:
    """Every committed result file, the reference GPU's (the H200) first, then by name."""
    files = sorted(Path(directory or RESULTS_DIR).glob("*.json"))
    return sorted(files, key=lambda p: p.stem != REFERENCE_GPU)


def select(records, **where) -> list[dict]:
    """Records whose fields equal every ``where`` item (``pass_`` matches 'pass'); a value may be a tuple or list of
    choices."""
    if not isinstance(records, (list, tuple)) or not all(isinstance(r, dict) for r in records):
        raise TypeError(f"records must be a list of record dicts (a result file's 'records'); got {records!r:.60}")
    where = {("pass" if k == "pass_" else k): v for k, v in where.items()}

    def ok(rec):
        return all(rec.get(k) in (tuple(v) if isinstance(v, (tuple, list)) else (v,)) for k, v in where.items())

    return [r for r in records if ok(r)]


def code_words(entry: dict | None) -> str:
    """The code a run measured, in words, from its ``commit`` and ``dirty`` (a grid's entry, a race's record, or a
    file's top-level provenance): "commit 1a2b3c4", with ", uncommitted changes" or ", no uncommitted changes" where
    the dirty flag was kept; "" where the run kept no commit (it predates keeping them)."""
    commit = (entry or {}).get("commit")
    if not commit:
        return ""
    dirty = (entry or {}).get("dirty")
    state = "" if dirty is None else ", uncommitted changes" if dirty else ", no uncommitted changes"
    return f"commit {str(commit)[:7]}{state}"


def describe(provenance: dict, grid: str | None = None, *, code: bool = False) -> str:
    """One line naming where results came from: GPU, driver, JAX, cuDNN, TE, date — of ``grid``'s own run where
    the file records it (each grid keeps the versions it was measured with), else of the latest run. ``code=True``
    adds the commit and dirty flag of that run's code (:func:`code_words`) where the run kept them: for the folded
    evidence, not the open text."""
    if not isinstance(provenance, dict):
        raise TypeError(f"provenance must be a result file's provenance dict; got {type(provenance).__name__}")
    entry = provenance.get("grids", {}).get(grid) if grid else None
    # a grid entry written before per-grid versions were kept does not say whether TE was there, nor which code
    # ran: name none
    blank = {"transformer_engine": None, "commit": None, "dirty": None}
    p = {**provenance, **blank, **entry} if entry else provenance
    te = f", TransformerEngine {p['transformer_engine']}" if p.get("transformer_engine") else ""
    device = f"{p['gpu']} (driver {p['driver']})" if p.get("gpu") else f"{p.get('backend', 'gpu').upper()}"
    if p.get("cpu") and not p.get("gpu"):
        device += f" ({p['cpu']})"
    cudnn = f", cuDNN {p['cudnn']}" if p.get("cudnn") else ""
    words = code_words(p) if code else ""
    return (
        f"{device}, JAX {p.get('jax')} / jaxlib {p.get('jaxlib')}{cudnn}{te}, Python {p.get('python')}, "
        f"recorded {str(p.get('created'))[:10]}" + (f", {words}" if words else "")
    )
