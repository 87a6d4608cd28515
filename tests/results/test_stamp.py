"""The "last executed" stamp names the device, the versions and the date, from the environment report."""

import datetime as dt

import jax
import pytest

from attention_tutorial.results.stamp import last_executed

H200 = {
    "backend": "gpu",
    "gpu": "NVIDIA H200",
    "driver": "580.82.07",
    "cpu": "x86_64",
    "jax": "0.11.2",
    "jaxlib": "0.11.2",
    "cudnn": "9.19.0",
    "transformer_engine": "2.20.0",
    "python": "3.12.3",
    "created": "2026-12-02T21:05:09+00:00",
}


def test_a_gpu_stamp_names_gpu_driver_versions_and_date():
    s = last_executed(H200, runtime_s=41.6)
    assert s == (
        "Last executed 2026-12-02 21:05 UTC in 42 s on NVIDIA H200 (driver 580.82.07) with JAX 0.11.2 "
        "(jaxlib 0.11.2), cuDNN 9.19.0, TransformerEngine 2.20.0, Python 3.12.3."
    )


def test_a_cpu_stamp_leaves_out_what_is_missing():
    env = {**H200, "backend": "cpu", "gpu": None, "driver": None, "cudnn": None, "transformer_engine": None}
    s = last_executed(env)
    assert s.startswith("Last executed 2026-12-02 21:05 UTC on CPU (x86_64) with JAX 0.11.2")
    assert "cuDNN" not in s and "TransformerEngine" not in s and "None" not in s and " in " not in s


@pytest.mark.parametrize(
    "executed",
    [dt.datetime(2026, 12, 3, 1, 30, tzinfo=dt.timezone(dt.timedelta(hours=2))), 1796254200.0, "2026-12-02T23:30:00Z"],
)
def test_the_execution_time_is_given_in_utc(executed):
    # 1796254200 = 2026-12-02 23:30:00 UTC (date -u -d @1796254200)
    assert "Last executed 2026-12-02 23:30 UTC" in last_executed(H200, executed=executed)


def test_a_bad_time_names_what_is_accepted():
    with pytest.raises(ValueError, match="datetime, a POSIX timestamp or an ISO string"):
        last_executed(H200, executed=[2026])


def test_without_an_environment_it_reports_this_process():
    s = last_executed()
    assert f"JAX {jax.__version__}" in s
    assert jax.devices()[0].platform.upper() in s or jax.devices()[0].device_kind in s
    assert dt.datetime.now(dt.UTC).strftime("%Y-%m-%d") in s
