import copy
import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from attention_tutorial import results
from attention_tutorial.measure.flops import peak_for
from attention_tutorial.results import store

RESULTS = Path(__file__).resolve().parents[2] / "attention_tutorial" / "results" / "data"

GOOD = {
    "provenance": {
        "gpu": "NVIDIA H200",
        "driver": "580.1",
        "jax": "0.11.2",
        "jaxlib": "0.11.2",
        "cudnn": "9.19.0",
        "transformer_engine": None,
        "python": "3.12.3",
        "created": "2026-12-02T00:00:00+00:00",
        "command": "python -m attention_tutorial record",
        "matmul_bf16_tflops": 780.0,
        "copy_gbps": 3300.0,
    },
    "records": [
        {
            "impl": "cudnn",
            "batch": 1,
            "seq_q": 8,
            "seq_kv": 8,
            "heads": 1,
            "kv_heads": 1,
            "head_dim": 64,
            "dtype": "bfloat16",
            "causal": False,
            "pass": "fwd",
            "status": "ok",
            "median_ms": 1.0,
            "p10_ms": 0.9,
            "p90_ms": 1.1,
            "tflops": 1.0,
        },
        {
            "impl": "naive",
            "batch": 1,
            "seq_q": 8,
            "seq_kv": 8,
            "heads": 1,
            "kv_heads": 1,
            "head_dim": 64,
            "dtype": "bfloat16",
            "causal": True,
            "pass": "fwd+bwd",
            "status": "oom",
            "reason": "RESOURCE_EXHAUSTED",
            "median_ms": None,
            "p10_ms": None,
            "p90_ms": None,
            "tflops": None,
        },
    ],
}


def _ms(value):
    """Timings of a record measured at ``value`` ms (p10 = median = p90)."""
    return {"median_ms": value, "p10_ms": value, "p90_ms": value}


def test_good_file_validates():
    assert results.validate(GOOD) == []


def test_a_file_of_races_alone_validates():
    """A file that holds only what its provenance measured (a race, here) needs no records; an empty one does."""
    data = copy.deepcopy(GOOD)
    data["records"] = []
    data["provenance"]["race"] = {"masks": {"rows": [{"contender": "ours", "ms": 1.0}]}}
    assert results.validate(data) == []
    data["provenance"]["race"] = {}
    assert any("non-empty" in p for p in results.validate(data))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["provenance"].pop("cudnn"), "lacks 'cudnn'"),
        (lambda d: d["provenance"].update(matmul_bf16_tflops="780"), "matmul_bf16_tflops"),
        (lambda d: d.pop("provenance"), "provenance"),
        (lambda d: d.update(records=[]), "non-empty"),
        (lambda d: d["records"][0].pop("impl"), "lacks 'impl'"),
        (lambda d: d["records"][0].update(status="slow"), "unknown status"),
        (lambda d: d["records"][0].update(batch=1.5), "'batch' has type float"),
        (lambda d: d["records"][0].update(causal=1), "'causal' has type int"),
        (lambda d: d["records"][0].update(tflops=None), "no median_ms/p10_ms/p90_ms/tflops"),
        (lambda d: d["records"][1].pop("reason"), "no reason"),
        (lambda d: d["records"][1].update({"pass": "bwd"}), "unknown pass"),
        (lambda d: d["records"][0].update(median_ms=math.nan), "'median_ms' must be a finite number"),
        (lambda d: d["records"][0].update(p10_ms=-0.5), "'p10_ms' must be a finite number >= 0"),
        (lambda d: d["records"][0].update(tflops=math.inf), "'tflops' must be a finite number"),
        (lambda d: d["records"][0].update(**_ms(0.0)), "median_ms is 0.0"),
        (lambda d: d["records"][0].update(p90_ms=0.5), "out of order"),
        (lambda d: d["records"][0].update(seq_kv=0), "'seq_kv' must be positive"),
        (lambda d: d["records"][0].update(heads=-4), "'heads' must be positive"),
        (lambda d: d["records"][0].update(heads=3, kv_heads=2), "not a multiple of kv_heads"),
        (lambda d: d["records"][0].update(mask="stripes"), "unknown mask"),
        (lambda d: d["records"][0].update(problem="conv"), "unknown problem"),
        (lambda d: d["records"][1].update(**_ms(1.0)), "carries timings"),
        (lambda d: d["records"].append("not a record"), "not an object"),
        (lambda d: d["provenance"].update(created="yesterday"), "'created' is not an ISO date"),
        (lambda d: d["provenance"].pop("copy_gbps"), "lacks 'copy_gbps'"),
        (lambda d: d["provenance"].update(copy_gbps=-1.0), "'copy_gbps' must be a positive number or null"),
        (lambda d: d["provenance"].update(gpu=None), "'gpu' has type NoneType"),
        (lambda d: d["provenance"].update(grids=["a"]), "'grids' must be an object"),
        (lambda d: d["provenance"].update(grids={"a": 3}), "grid 'a' must be an object"),
        (lambda d: d["provenance"].update(grids={"a": {"created": "soon"}}), "grid 'a' has no ISO 'created'"),
        (lambda d: d["provenance"].update(grids={"a": {"created": "2026-01-01", "seconds": -1}}), "'seconds'"),
        (
            lambda d: (
                d["provenance"].update(grids={"a": {"created": "2026-12-02"}}),
                d["records"][0].update(grid="b"),
            ),
            "which the provenance's grids lack",
        ),
        (lambda d: d["records"][0].update(grid=""), "malformed grid name"),
    ],
)
def test_each_defect_is_reported(mutate, message):
    bad = copy.deepcopy(GOOD)
    mutate(bad)
    assert any(message in p for p in results.validate(bad)), results.validate(bad)


def test_each_defect_is_reported_on_top_of_a_valid_file_with_grids():
    # the grid rules need a provenance with grids; the other cases hold with or without them
    data = copy.deepcopy(GOOD)
    data["provenance"]["grids"] = {"a": {"created": "2026-12-02T00:00:00+00:00", "seconds": 1.0}}
    for rec in data["records"]:
        rec["grid"] = "a"
    assert results.validate(data) == []


def test_a_cpu_file_with_no_ceilings_is_valid_and_described():
    cpu = copy.deepcopy(GOOD)
    cpu["provenance"].update(
        backend="cpu", gpu=None, driver=None, cudnn=None, cpu="x86_64", matmul_bf16_tflops=None, copy_gbps=None
    )
    assert results.validate(cpu) == []
    assert results.describe(cpu["provenance"]).startswith("CPU (x86_64), JAX 0.11.2")


def test_a_gemm_record_has_its_own_sizes():
    gemm = {
        "impl": "te_dense_fp8",
        "problem": "gemm",
        "m": 32768,
        "k": 4096,
        "n": 4096,
        "dtype": "float8",
        "pass": "fwd",
        "status": "ok",
        "median_ms": 1.0,
        "p10_ms": 0.9,
        "p90_ms": 1.1,
        "tflops": 1100.0,
    }
    assert results.validate({**GOOD, "records": [gemm]}) == []
    bad = {**gemm, "k": 0, "seq_kv": 4096}
    assert any("'k' must be positive" in p for p in results.validate({**GOOD, "records": [bad]}))


def test_save_keeps_other_grids_and_refuses_invalid(tmp_path):
    path = tmp_path / "gpu.json"
    a = [dict(GOOD["records"][0], grid="a")]
    b = [dict(GOOD["records"][0], grid="b", **_ms(2.0))]
    results.save(path, GOOD["provenance"], a)
    results.save(path, GOOD["provenance"], b)
    assert sorted(r["grid"] for r in results.load(path)["records"]) == ["a", "b"]
    results.save(path, GOOD["provenance"], [dict(b[0], **_ms(3.0))])
    assert [r["median_ms"] for r in results.load(path)["records"] if r["grid"] == "b"] == [3.0]
    with pytest.raises(ValueError, match="invalid result file"):
        results.save(tmp_path / "new.json", {}, a)
    assert not (tmp_path / "new.json").exists()


def test_select_and_slug_and_describe():
    recs = GOOD["records"]
    assert results.select(recs, impl="cudnn") == [recs[0]]
    assert results.select(recs, pass_="fwd+bwd") == [recs[1]]
    assert results.select(recs, causal=(True, False)) == recs
    assert results.select(recs, impl=["naive", "cudnn"]) == recs  # a list of choices as a tuple
    with pytest.raises(TypeError, match="records must be a list"):
        results.select(None, impl="xla")
    assert results.slug("NVIDIA H200") == "nvidia-h200"
    assert "NVIDIA H200" in results.describe(GOOD["provenance"]) and "2026-12-02" in results.describe(
        GOOD["provenance"]
    )


def test_recorded_missing_is_none(tmp_path):
    assert results.recorded("nvidia-b200", directory=tmp_path) is None


def test_the_h200_reference_file_is_committed():
    assert (RESULTS / "nvidia-h200.json").exists(), "run `python -m attention_tutorial record` on the H200"


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_committed_result_files_validate(path):
    data = json.loads(path.read_text())
    assert results.validate(data) == []
    assert data["provenance"]["gpu"] and data["provenance"]["matmul_bf16_tflops"] > 0


def test_describe_names_each_grid_s_own_run():
    prov = {
        **GOOD["provenance"],
        "transformer_engine": "2.20.2",
        "grids": {
            "te": {"created": "2026-12-01T10:00:00+00:00", "transformer_engine": "2.19.0"},
            "old": {"created": "2026-11-30T10:00:00+00:00"},
        },
    }
    assert "TransformerEngine 2.20.2" in results.describe(prov)
    assert "TransformerEngine 2.19.0" in results.describe(prov, "te") and "2026-12-01" in results.describe(prov, "te")
    old = results.describe(prov, "old")  # written before grids kept their versions: TE unknown, not claimed
    assert "TransformerEngine" not in old and "2026-11-30" in old
    assert results.describe(prov, "missing") == results.describe(prov)


def test_describe_names_the_code_a_run_measured_only_where_it_kept_it_and_when_asked():
    prov = {
        **GOOD["provenance"],
        "commit": "fedcba9876543210",
        "dirty": False,
        "grids": {
            "new": {"created": "2026-12-05T10:00:00+00:00", "commit": "0123456789abcdef", "dirty": True},
            "old": {"created": "2026-11-30T10:00:00+00:00"},
        },
    }
    assert "commit" not in results.describe(prov, "new")  # the open text names no commit
    assert results.describe(prov, "new", code=True).endswith(", commit 0123456, uncommitted changes")
    assert "commit" not in results.describe(prov, "old", code=True)  # a grid that kept none: not the file's latest
    assert results.describe(prov, code=True).endswith(", commit fedcba9, no uncommitted changes")
    assert store.code_words({"commit": "abcdef0123", "dirty": None}) == "commit abcdef0"
    assert store.code_words({}) == store.code_words(None) == ""


# --- writing files that survive faults -------------------------------------------------------------------------


def _rec(grid, **kw):
    return dict(GOOD["records"][0], grid=grid, **kw)


def test_a_failed_write_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "gpu.json"
    results.save(path, GOOD["provenance"], [_rec("a")])
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    for target in ("replace", "fsync"):
        with monkeypatch.context() as m:
            m.setattr(store.os, target, boom)
            with pytest.raises(OSError, match="disk full"):
                results.save(path, GOOD["provenance"], [_rec("b")])
        assert path.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu.json"]  # no temporary file left behind
    with monkeypatch.context() as m:
        m.setattr(store.json, "dumps", boom)
        with pytest.raises(OSError):
            results.save(path, GOOD["provenance"], [_rec("b")])
    assert path.read_bytes() == before


KILLED_WRITER = """
import os, sys, time
from attention_tutorial.results import store
def slow_fsync(fd):  # the new contents are in the temporary file: stall here, before the rename
    print("writing", flush=True)
    time.sleep(60)
store.os.fsync = slow_fsync
store.save(sys.argv[1], {prov!r}, [{rec!r}])
"""


def test_a_writer_killed_mid_write_leaves_the_previous_file_whole(tmp_path):
    path = tmp_path / "gpu.json"
    results.save(path, GOOD["provenance"], [_rec("a")])
    before = path.read_bytes()
    code = KILLED_WRITER.format(prov=GOOD["provenance"], rec=_rec("b", **_ms(9.0)))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "JAX_PLATFORMS": "cpu"}
    with subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, env=env, text=True) as proc:
        try:
            assert proc.stdout.readline().strip() == "writing"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert path.read_bytes() == before and [r["grid"] for r in results.load(path)["records"]] == ["a"]
    (left,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # the killed write's temporary file
    assert left.stat().st_size > 100
    results.save(path, GOOD["provenance"], [_rec("c")])  # the next save removes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu.json"]
    assert [r["grid"] for r in results.load(path)["records"]] == ["a", "c"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"   \n", "is empty"),
        (json.dumps(GOOD).encode()[:200], "not valid JSON"),
        (b"\xff\xfe\x00", "not UTF-8"),
        (b"[1, 2, 3]", "not a result file"),
        (b'{"name": "my notes"}', "not a result file"),
        (json.dumps({**GOOD, "records": [dict(GOOD["records"][0], median_ms=-1.0)]}).encode(), "not a valid result"),
    ],
    ids=["empty", "blank", "truncated", "binary", "list", "other-json", "schema"],
)
def test_loading_a_broken_file_says_which_and_what(tmp_path, content, message):
    path = tmp_path / "broken.json"
    path.write_bytes(content)
    with pytest.raises(results.ResultFileError, match=message) as err:
        results.load(path)
    assert str(path) in str(err.value)
    # and nothing is merged into it: the file stays as it was
    with pytest.raises(results.ResultFileError, match="refusing to merge"):
        results.save(path, GOOD["provenance"], [_rec("a")])
    assert path.read_bytes() == content
    results.save(path, GOOD["provenance"], [_rec("a")], overwrite=True)  # only when told to
    assert results.load(path)["records"][0]["grid"] == "a"


def test_overwrite_replaces_only_a_file_that_cannot_be_merged(tmp_path):
    path = tmp_path / "same.json"
    path.write_text('{"my": "notes"}')
    # two runs told to replace the file: the first replaces the notes, the second merges into what the first wrote
    results.save(path, GOOD["provenance"], [_rec("a")], overwrite=True)
    results.save(path, GOOD["provenance"], [_rec("b")], overwrite=True)
    assert sorted(r["grid"] for r in results.load(path)["records"]) == ["a", "b"]
    other = {**GOOD["provenance"], "gpu": "NVIDIA A100"}  # another device's file cannot be merged: replaced
    results.save(path, other, [_rec("c")], overwrite=True)
    assert [r["grid"] for r in results.load(path)["records"]] == ["c"]


@pytest.mark.parametrize("flag", ["overwrite", "replace_grids"])
@pytest.mark.parametrize("value", ["no", "false", 0, None])
def test_save_flags_must_be_bools(tmp_path, flag, value):
    path = tmp_path / "gpu.json"
    results.save(path, GOOD["provenance"], [_rec("a", seq_q=s, seq_kv=s) for s in (8, 16)])
    before = path.read_bytes()
    with pytest.raises(TypeError, match=flag):
        results.save(path, {**GOOD["provenance"], "gpu": "NVIDIA A100"}, [_rec("a")], **{flag: value})
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "nests"),
        (json.dumps(GOOD).replace('"median_ms": 1.0', '"median_ms": ' + "9" * 5000), "number"),
    ],
    ids=["deep", "long-int"],
)
def test_json_python_cannot_read_is_a_result_file_error(tmp_path, text, message):
    path = tmp_path / "odd.json"
    path.write_text(text)
    with pytest.raises(results.ResultFileError, match=message) as err:
        results.load(path)
    assert str(path) in str(err.value)


def test_names_the_save_cannot_use_are_refused_up_front(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    for name, message in [("n" * 242 + ".json", "too long"), ("n" * 251 + ".json", "too long"), ("x.json/", "slash")]:
        path = f"{folder}/{name}"
        assert message in store.check_target(path)[0]
        with pytest.raises(ValueError, match=message):
            results.save(path, GOOD["provenance"], [_rec("a")])
    results.save(folder / ("n" * 236 + ".json"), GOOD["provenance"], [_rec("a")])  # the longest that fits
    (folder / ".lk.json.lock").mkdir()
    with pytest.raises(OSError, match="lock file"):
        results.save(folder / "lk.json", GOOD["provenance"], [_rec("a")])
    assert sorted(p.name for p in folder.iterdir()) == [".lk.json.lock", "n" * 236 + ".json"]


def test_truncation_is_named(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(GOOD, indent=1)[:-40])
    with pytest.raises(results.ResultFileError, match="truncated"):
        results.load(path)


def test_merge_modes_never_drop_records_they_were_not_asked_to(tmp_path):
    path = tmp_path / "gpu.json"
    a1, a2 = _rec("a", impl="xla"), _rec("a", impl="cudnn")
    results.save(path, GOOD["provenance"], [a1, a2, _rec("b")])
    # point merge: only the very same point is replaced; a new point is added; nothing else moves
    results.save(path, GOOD["provenance"], [dict(a1, **_ms(5.0)), _rec("c")], replace_grids=False)
    recs = results.load(path)["records"]
    assert sorted((r["grid"], r["impl"], r["median_ms"]) for r in recs) == [
        ("a", "cudnn", 1.0),
        ("a", "xla", 5.0),
        ("b", "cudnn", 1.0),
        ("c", "cudnn", 1.0),
    ]
    # grid merge (the recorder): grid a is re-measured as a whole, b and c stay
    results.save(path, GOOD["provenance"], [dict(a2, **_ms(7.0))], replace_grids=True)
    recs = results.load(path)["records"]
    assert sorted((r["grid"], r["impl"], r["median_ms"]) for r in recs) == [
        ("a", "cudnn", 7.0),
        ("b", "cudnn", 1.0),
        ("c", "cudnn", 1.0),
    ]


def test_merge_keeps_provenance_history_and_refuses_another_device(tmp_path):
    path = tmp_path / "gpu.json"
    note = {"created": "2026-12-02T00:00:00+00:00", "script": "x", "what": "y"}
    results.save(path, {**GOOD["provenance"], "history": [note]}, [_rec("a")])
    results.save(path, GOOD["provenance"], [_rec("b")])
    assert results.load(path)["provenance"]["history"] == [note]
    other = {**GOOD["provenance"], "gpu": "NVIDIA L4"}
    with pytest.raises(results.ResultFileError, match="holds results of"):
        results.save(path, other, [_rec("c")])
    assert {r["grid"] for r in results.load(path)["records"]} == {"a", "b"}


def test_result_files_list_the_reference_first(tmp_path):
    for name in ("nvidia-a100", "nvidia-h200", "nvidia-l4"):
        (tmp_path / f"{name}.json").write_text("{}")
    assert [p.stem for p in results.result_files(tmp_path)] == ["nvidia-h200", "nvidia-a100", "nvidia-l4"]
    assert results.result_files()[0].name == "nvidia-h200.json"


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_no_committed_record_exceeds_its_own_peak(path):
    """tflops is consistent with the FLOP model's peak for its dtype (FP8: 2 x bf16), and never above 100 %."""
    data = results.load(path)
    grids = data["provenance"].get("grids", {})
    for rec in data["records"]:
        if rec["status"] != "ok" or rec.get("pct_peak") is None:
            continue
        bf16 = grids.get(rec.get("grid"), {}).get("matmul_bf16_tflops") or data["provenance"]["matmul_bf16_tflops"]
        peak, basis = peak_for(rec["dtype"], bf16)
        where = f"{rec.get('grid')} {rec['impl']} {rec['dtype']} mask={rec.get('mask')} T={rec.get('seq_q')}"
        assert rec["peak_basis"] == basis, where
        assert rec["pct_peak"] == pytest.approx(100 * rec["tflops"] / peak, rel=1e-9), where
        assert rec["pct_peak"] <= 100, where


# --- what save and load refuse, and what they keep ---------------------------------------------------------------


def test_save_replaces_only_the_points_it_is_given(tmp_path):
    path = tmp_path / "gpu.json"
    grid = [_rec("a", seq_q=8 * (i + 1)) for i in range(30)]
    results.save(path, GOOD["provenance"], grid)
    results.save(path, GOOD["provenance"], [dict(grid[4], **_ms(2.0))])
    recs = results.load(path)["records"]
    assert len(recs) == 30 and sorted(r["median_ms"] for r in recs) == [1.0] * 29 + [2.0]
    results.save(path, GOOD["provenance"], [dict(grid[4], **_ms(3.0))], replace_grids=True)  # the recorder's way
    assert [r["median_ms"] for r in results.load(path)["records"]] == [3.0]


SAVER = """
import sys, time
from pathlib import Path
from attention_tutorial.results import store
path, go, me, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.002)
for i in range(n):
    store.save(path, {prov!r}, [dict({rec!r}, seq_q=me * 1000 + i + 1)])
"""


@pytest.mark.slow  # three processes import JAX: about 7 s on two cores
def test_processes_saving_to_one_file_at_once_keep_every_point(tmp_path):
    path, go, workers, each = tmp_path / "same.json", tmp_path / "go", 3, 12
    code = SAVER.format(prov=GOOD["provenance"], rec=_rec("a"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(path), str(go), str(w), str(each)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready"] * workers
        go.touch()  # all start saving at once
        assert [p.wait(timeout=120) for p in procs] == [0] * workers
    finally:
        for p in procs:
            p.kill()
            p.stdout.close()
    seqs = sorted(r["seq_q"] for r in results.load(path)["records"])
    assert seqs == sorted(w * 1000 + i + 1 for w in range(workers) for i in range(each))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["go", "same.json"]  # no lock or temporary file left


def test_load_refuses_what_is_not_a_regular_file_without_reading_it(tmp_path):
    import threading

    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    outcome = []

    def try_load():
        try:
            results.load(fifo)
        except results.ResultFileError as err:
            outcome.append(str(err))

    reader = threading.Thread(target=try_load, daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # it blocked on the pipe: release it before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("load() blocked on a named pipe")
    assert len(outcome) == 1 and "named pipe" in outcome[0] and str(fifo) in outcome[0]
    for path, kind in ((tmp_path, "a folder"), (Path("/dev/null"), "a device")):
        with pytest.raises(results.ResultFileError, match=kind):
            results.load(path)
    with pytest.raises(TypeError, match="path must be a file name"):
        results.load(None)


def test_a_read_only_file_is_refused_and_kept(tmp_path):
    path = tmp_path / "gpu.json"
    results.save(path, GOOD["provenance"], [_rec("a")])
    path.chmod(0o444)
    before = path.read_bytes()
    assert "read-only" in store.check_target(path)[0]
    for overwrite in (False, True):
        with pytest.raises(PermissionError, match="read-only"):
            results.save(path, GOOD["provenance"], [_rec("b")], overwrite=overwrite)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["gpu.json"]
    if Path("/proc/self").is_dir():  # a folder nobody can create files in, whatever os.access says for root
        assert "cannot write in the folder /proc" in store.check_target("/proc/x.json")[0]


def test_saving_through_a_symlink_writes_its_target_and_keeps_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    target, link = tmp_path / "real" / "gpu.json", tmp_path / "link.json"
    results.save(target, GOOD["provenance"], [_rec("a")])
    link.symlink_to(target)
    results.save(link, GOOD["provenance"], [_rec("b")])
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert sorted(r["grid"] for r in results.load(target)["records"]) == ["a", "b"]


@pytest.mark.parametrize(
    ("name", "message"),
    [("", "the path is empty"), ("   ", "the path is empty"), ("x.png", "'x.json'"), ("results", "'results.json'")],
)
def test_a_save_path_must_name_a_json_file(tmp_path, monkeypatch, name, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=message):
        results.save(name, GOOD["provenance"], [_rec("a")])
    assert message in store.check_target(name)[0]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TypeError, match="path must be a file name"):
        results.save(3, GOOD["provenance"], [_rec("a")])


def _cpu(**changes):
    return {
        **GOOD["provenance"],
        "backend": "cpu",
        "gpu": None,
        "driver": None,
        "cudnn": None,
        "cpu": "x86_64",
        "matmul_bf16_tflops": None,
        "copy_gbps": None,
        **changes,
    }


def test_merging_results_of_another_environment_never_relabels_the_old_records(tmp_path):
    path = tmp_path / "cpu.json"
    old, new = _cpu(jax="0.10.2"), _cpu(jax="0.11.2", created="2026-12-03T00:00:00+00:00")
    results.save(path, old, [_rec("a")])
    before = path.read_bytes()
    for prov, message in ((new, "jax 0.10.2 -> 0.11.2"), (_cpu(cpu="aarch64"), "holds results of CPU (x86_64)")):
        with pytest.raises(results.ResultFileError, match=re.escape(message)):
            results.save(path, prov, [_rec("b")])
        assert message in store.check_merge(path, prov)
    assert path.read_bytes() == before
    assert store.check_merge(path, _cpu(jax="0.10.2", created="2026-12-05T00:00:00+00:00")) is None  # same one
    # the same point measured again in the new environment: nothing old is left to relabel
    results.save(path, new, [dict(_rec("a"), **_ms(2.0))])
    assert results.load(path)["provenance"]["jax"] == "0.11.2"


def test_old_grids_keep_the_versions_they_were_measured_with(tmp_path):
    path = tmp_path / "gpu.json"
    created = {"created": "2026-12-01T00:00:00+00:00"}  # an entry that names no versions: the top level's hold
    old = {**GOOD["provenance"], "jax": "0.10.2", "grids": {"a": created}}
    results.save(path, old, [_rec("a")])
    new = {**GOOD["provenance"], "grids": {"b": {**created, "jax": "0.11.2"}}}
    results.save(path, new, [_rec("b")])
    prov = results.load(path)["provenance"]
    assert prov["jax"] == "0.11.2" and prov["grids"]["a"]["jax"] == "0.10.2"
    assert "JAX 0.10.2" in results.describe(prov, "a") and "JAX 0.11.2" in results.describe(prov, "b")
    assert "TransformerEngine" not in results.describe(prov, "a")  # still not claimed for the old entry


def test_json_is_written_strict_with_a_note_where_a_value_was_not_finite(tmp_path):
    path = tmp_path / "gpu.json"
    prov = {**GOOD["provenance"], "read_gbps": math.inf, "lessons": {"x": [{"ratio": [1.0, math.nan]}]}}
    rec = _rec("a", max_abs_diff_vs_bf16=math.nan, note="from a test")
    results.save(path, prov, [rec])

    def refuse(constant):
        raise AssertionError(f"{constant} in the file")

    data = json.loads(path.read_text(), parse_constant=refuse)
    (saved,) = data["records"]
    assert saved["max_abs_diff_vs_bf16"] is None and saved["note"].startswith("from a test; ")
    assert "max_abs_diff_vs_bf16 (nan)" in saved["note"]
    assert data["provenance"]["read_gbps"] is None and "read_gbps (inf)" in data["provenance"]["note"]
    row = data["provenance"]["lessons"]["x"][0]
    assert row["ratio"] == [1.0, None] and "ratio[1] (nan)" in row["note"]
    assert results.load(path)["records"][0]["median_ms"] == 1.0
    with pytest.raises(ValueError, match="'tflops' must be a finite number"):  # a checked field is refused instead
        results.save(path, GOOD["provenance"], [_rec("b", tflops=math.nan)])
    with pytest.raises(TypeError, match=r"records\[0\]\.when is a datetime"):
        results.save(
            tmp_path / "other.json", GOOD["provenance"], [_rec("b", when=__import__("datetime").datetime.now())]
        )


def test_a_full_disk_says_so_and_leaves_the_file(tmp_path, monkeypatch):
    import errno

    path = tmp_path / "gpu.json"
    results.save(path, GOOD["provenance"], [_rec("a")])
    before = path.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.os, "fsync", full)
    with pytest.raises(OSError, match="no space left on the disk of") as err:
        results.save(path, GOOD["provenance"], [_rec("b")])
    assert err.value.errno == errno.ENOSPC and "\n" not in str(err.value)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["gpu.json"]


def _table(kernel, *tflops, **stamp):
    rows = [{"kernel": kernel, "H": 128, "causal": False, "config": f"c{i}", "tflops": t} for i, t in enumerate(tflops)]
    return {"gpu": "NVIDIA H200", "commit": "0123abc", "dirty": False, **stamp, "rows": rows}


def test_save_entry_adds_a_table_and_keeps_the_records_and_the_rest_of_the_provenance(tmp_path):
    path = tmp_path / "gpu.json"
    before = results.save(path, {**GOOD["provenance"], "race": {"r": {"rows": []}}}, [_rec("a")])
    store.save_entry(path, "tuning", "pipe", _table("pipe", 500.0), GOOD["provenance"])
    store.save_entry(path, "tuning", "fp8", _table("fp8", 900.0, None), GOOD["provenance"])
    store.save_entry(path, "tuning", "pipe", _table("pipe", 510.0, 520.0), GOOD["provenance"])  # a new run: whole
    data = results.load(path)
    assert data["records"] == before["records"]
    assert {k: v for k, v in data["provenance"].items() if k != "tuning"} == before["provenance"]
    assert [r["tflops"] for r in data["provenance"]["tuning"]["pipe"]["rows"]] == [510.0, 520.0]
    assert [r["tflops"] for r in data["provenance"]["tuning"]["fp8"]["rows"]] == [900.0, None]
    results.save(path, GOOD["provenance"], [_rec("b")])  # the recorder's next save keeps the tables
    assert set(results.load(path)["provenance"]["tuning"]) == {"pipe", "fp8"}


def test_save_entry_starts_a_file_and_refuses_another_device_a_broken_file_and_an_unknown_key(tmp_path):
    path = tmp_path / "new.json"
    store.save_entry(path, "tuning", "pipe", _table("pipe", 1.0), GOOD["provenance"])
    assert results.load(path)["records"] == [] and results.load(path)["provenance"]["gpu"] == "NVIDIA H200"
    with pytest.raises(results.ResultFileError, match="holds results of NVIDIA H200"):
        store.save_entry(path, "tuning", "pipe", _table("pipe", 2.0), {**GOOD["provenance"], "gpu": "NVIDIA L4"})
    with pytest.raises(ValueError, match="must be an object with a list of 'rows'"):
        store.save_entry(path, "tuning", "fp8", {"gpu": "NVIDIA H200"}, GOOD["provenance"])
    with pytest.raises(ValueError, match="got 'records'"):
        store.save_entry(path, "records", "x", {}, GOOD["provenance"])
    assert [r["tflops"] for r in store.tuning("pipe", "new", tmp_path)["rows"]] == [1.0]
    broken = tmp_path / "broken.json"
    broken.write_text("[1, 2]")
    with pytest.raises(results.ResultFileError, match="refusing to merge into"):
        store.save_entry(broken, "tuning", "pipe", _table("pipe", 1.0), GOOD["provenance"])
    assert broken.read_text() == "[1, 2]"


def test_a_failed_entry_write_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "gpu.json"
    store.save_entry(path, "tuning", "pipe", _table("pipe", 1.0), GOOD["provenance"])
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(store.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        store.save_entry(path, "tuning", "pipe", _table("pipe", 1.0, 2.0), GOOD["provenance"])
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu.json"]


def test_tuning_reads_one_table_and_says_what_is_recorded_where_it_is_not(tmp_path):
    store.save_entry(tmp_path / "nvidia-h200.json", "tuning", "pipe", _table("pipe", 3.0), GOOD["provenance"])
    table = store.tuning("pipe", directory=tmp_path)
    assert table["commit"] == "0123abc" and [r["config"] for r in table["rows"]] == ["c0"]
    with pytest.raises(LookupError, match=r"'fp8' .* \(recorded: pipe\); .*bash tools/gpu\.sh tune fp8"):
        store.tuning("fp8", directory=tmp_path)
    with pytest.raises(LookupError, match=r"recorded: none"):
        store.tuning("pipe", gpu="nvidia-b200", directory=tmp_path)
    assert results.validate({**GOOD, "provenance": {**GOOD["provenance"], "tuning": []}})


#: The tables tools/tune.py kept as loose files, moved into the shipped file: rows per kernel and a digest of them
#: (sha256 of the rows as sorted-key JSON) taken from the loose files as they were moved.
MOVED_TABLES = {
    "bwd_dq": (24, "563f86a3c1bf58db"),
    "bwd_tiles": (32, "8bdace36f8af0ad2"),
    "fp8": (16, "d84fba0cdae8bf2e"),
    "mosaic": (20, "25c4becb251b643b"),
    "pallas": (36, "e4f0634a29022a0a"),
    "pipe": (14, "00b4a66e700491ad"),
    "registers": (20, "ffa6d8afda6b3c2f"),
    "train": (4, "2d1a00dd6c8a751b"),
}


def test_the_moved_tuning_tables_are_whole_in_the_shipped_file_with_their_commit_unknown():
    import hashlib

    tables = results.recorded()["provenance"]["tuning"]
    assert set(MOVED_TABLES) <= set(tables)
    for kernel, (n, digest) in MOVED_TABLES.items():
        t = tables[kernel]
        rows = t["rows"]
        assert (len(rows), hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]) == (n, digest)
        assert {r["kernel"] for r in rows} == {kernel} and t["gpu"] == "NVIDIA H200"
        assert t["commit"] is None and t["dirty"] is None and "commit unknown" in t["note"]
        assert store.tuning(kernel) == t
    assert not (RESULTS / "tuning").exists()  # no loose table is left beside the store
