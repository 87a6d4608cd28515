import json

import jax
import pytest

from attention_tutorial.cli import main


def test_env_prints_json(capsys):
    assert main(["env"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["backend"] == jax.default_backend() and env["jax"] == jax.__version__


def test_bench_prints_table_and_saves(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    code = main(["bench", "--impl", "xla", "naive", "--seq", "32", "64", "-B", "1", "-N", "2", "-H", "16",
                 "--dtype", "float32", "--repeats", "3", "--save", str(out), "--plot", str(png)])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "| XLA |" in text and "TFLOP/s" in text
    recs = json.loads(out.read_text())["records"]
    assert len(recs) == 4 and all(r["status"] == "ok" for r in recs)
    assert png.stat().st_size > 1000


def test_record_refuses_without_gpu(capsys):
    if jax.default_backend() == "gpu":
        pytest.skip("on a GPU record would run")
    assert main(["record", "--grids", "seed_shape", "--out", "/nonexistent/x.json"]) == 2
    assert "GPU" in capsys.readouterr().err


def test_bad_arguments_exit_with_usage():
    with pytest.raises(SystemExit):
        main(["bench", "--impl", "flash9"])
