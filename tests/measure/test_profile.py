import re
import time

import jax
import jax.numpy as jnp
import pytest

from attention_tutorial.measure import profile
from attention_tutorial.measure.profile import Kernel, compare, device_kernels, device_ms, kernel_table
from attention_tutorial.measure.sweep import check_record
from attention_tutorial.measure.timing import Timing

ON_CPU = jax.default_backend() == "cpu"
cpu_only = pytest.mark.skipif(not ON_CPU, reason="the CPU trace holds host ops; the GPU tests cover the device plane")


def _sleepy(ms):
    """x -> sin(2·callback(x)) @ x where the callback sleeps ``ms``: an op of known duration among XLA's own."""

    def host(x):
        time.sleep(ms / 1e3)
        return x

    return lambda x: jnp.sin(jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x) * 2.0) @ x


@cpu_only
def test_parser_reads_a_real_cpu_trace(tmp_path):
    x = jnp.ones((64, 64))
    compiled = jax.jit(_sleepy(1.0)).lower(x).compile()
    path = profile.trace(compiled, (x,), repeats=3, log_dir=tmp_path)
    assert path.name.endswith(".xplane.pb") and path.stat().st_size > 0
    evts, where = profile.events(path)
    assert where == "host"  # a CPU trace has no device plane
    hlo = compiled.as_text()
    names = {name for name, _, _ in evts}
    assert names and all(re.search(rf"%{re.escape(n)} = ", hlo) for n in names), names  # each is an op of ours
    assert all(kind == profile.HOST_KIND and ns > 0 for _, kind, ns in evts)
    assert len(evts) % 4 == 0  # the same ops in each of the three timed calls and the one before them


@cpu_only
def test_table_units_are_microseconds_per_call():
    x = jnp.ones((64, 64))
    rows = device_kernels(_sleepy(5.0), x, repeats=4)
    assert all(isinstance(r, Kernel) and r.kind == profile.HOST_KIND for r in rows)
    assert [r.device_us for r in rows] == sorted((r.device_us for r in rows), reverse=True)
    assert all(r.count == 1.0 for r in rows)  # every op runs once per call
    assert 4_800 <= rows[0].device_us <= 15_000  # the 5 ms sleep, in µs per call (not summed over the 4 calls)
    assert 4.8 <= device_ms(rows) <= 16.0


def test_kernel_table_sums_per_name_and_divides_by_calls():
    evts = [("a", "kernel", 1000.0), ("b", "memcpy", 500.0), ("a", "kernel", 3000.0), ("a", "other", 7.0)]
    rows = kernel_table(evts, repeats=2)
    assert rows == [
        Kernel("a", 2.0, 1.0, "kernel"),
        Kernel("b", 0.25, 0.5, "memcpy"),
        Kernel("a", 0.0035, 0.5, "other"),
    ]
    assert device_ms(rows) == pytest.approx(2.25e-3)  # "other" (say, a CUDA graph span) is listed, not summed
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        kernel_table(evts, repeats=0)


def test_compare_record_fields_and_ratio():
    t = Timing(median_ms=2.1, p10_ms=2.0, p90_ms=2.3, repeats=10, inner=5, compile_s=0.5, single_call_ms=2.4)
    rows = [
        Kernel("fmha", 1500.0, 1.0, "kernel"),
        Kernel("transpose", 500.0, 2.0, "kernel"),
        Kernel("graph", 9999.0, 1.0, "other"),
    ]
    rec = compare(t, rows, profiled_calls=10)
    assert rec["device_ms"] == pytest.approx(2.0)
    assert rec["device_ratio"] == pytest.approx(1.05)
    assert profile.agreement_pct(rec) == pytest.approx(5.0)
    assert rec["dispatch_ms"] == pytest.approx(0.3)
    assert (rec["median_ms"], rec["p10_ms"], rec["p90_ms"]) == (2.1, 2.0, 2.3)
    assert rec["time_source"] == "device" and rec["profiled_calls"] == 10
    assert [k["name"] for k in rec["kernels"]] == ["fmha", "transpose", "graph"]
    host = compare(t, [Kernel("fusion", 1000.0, 1.0, profile.HOST_KIND)], profiled_calls=3)
    assert host["time_source"] == "host" and host["device_ratio"] == pytest.approx(2.1)
    assert compare(t, [], profiled_calls=1)["device_ratio"] is None
    assert profile.agreement_pct({"device_ratio": None}) is None
    same = compare(t, rows, profiled_calls=10, traced_wall_ms=2.06, device_span_ms=2.05)
    assert same["span_ratio"] == pytest.approx(2.06 / 2.05)
    assert profile.same_calls_ratio(same) == pytest.approx(1.03) and profile.agreement_pct(same) == pytest.approx(3.0)
    assert profile.occupancy(same) == pytest.approx(2.0 / 2.05)  # the kernels' 2.0 ms of the 2.05 ms span
    assert compare(t, rows, profiled_calls=10, traced_wall_ms=2.0, device_span_ms=None)["span_ratio"] is None


def test_busy_span_leaves_out_the_untimed_call_and_counts_gaps():
    # two events per call, 3 calls (the first untimed): call i runs [10i, 10i+3] and [10i+4, 10i+8] µs
    spans = [(10_000 * i + a, 10_000 * i + b) for i in range(3) for a, b in ((0, 3_000), (4_000, 8_000))]
    # timed calls 1 and 2: from 10 µs to 28 µs = 18 µs over 2 calls (the 1 µs gaps inside count, the 2 µs after not)
    assert profile.busy_span_ms(spans, calls=2) == pytest.approx(9e-3)
    assert profile.busy_span_ms(spans[:-1], calls=2) is None  # 5 events do not split into 3 calls
    assert profile.busy_span_ms([], calls=2) is None


def test_profile_records_follow_the_schema():
    recs = profile.profile_records(
        ("xla", "cudnn"),
        batch=1,
        seq=128,
        heads=2,
        head_dim=32,
        dtype="float32",
        causal=(True,),
        repeats=3,
        max_seconds=0.2,
        min_sample_ms=2.0,
        profiled_calls=2,
    )
    assert [(r["impl"], r["causal"]) for r in recs] == [("xla", True), ("cudnn", True)]
    assert all(check_record(r) == [] for r in recs), [check_record(r) for r in recs]
    xla = recs[0]
    assert xla["status"] == "ok" and xla["device_ms"] > 0 and xla["kernels"]
    assert xla["device_ratio"] == pytest.approx(xla["median_ms"] / xla["device_ms"])
    assert xla["time_source"] == ("host" if ON_CPU else "device")
    if ON_CPU:
        assert recs[1]["status"] == "unsupported" and "GPU" in recs[1]["reason"]


@pytest.mark.gpu
def test_device_time_agrees_with_pipelined_time_for_a_long_cudnn_call():
    from attention_tutorial.inputs import make_qkv
    from attention_tutorial.kernels.fused import dot_product_attention

    q, k, v = make_qkv(4, 8192, 16, 128, dtype="bfloat16")
    rec = profile.compare_with_timing(
        lambda q, k, v: dot_product_attention(q, k, v, implementation="cudnn"), q, k, v, repeats=20
    )
    assert rec["time_source"] == "device"
    assert any(k["kind"] == "kernel" for k in rec["kernels"])
    assert rec["device_ms"] >= 1.0, rec
    assert profile.same_calls_ratio(rec) is not None, rec  # host and kernel time of the very same calls
    assert profile.occupancy(rec) > 0.97, rec  # one cuDNN kernel: the GPU idles hardly at all between calls
    assert profile.agreement_pct(rec) <= 3.0, rec


def _rec(impl, ratio, dev_ms, source="device", causal=False):
    return {
        "impl": impl,
        "causal": causal,
        "status": "ok",
        "device_ratio": ratio,
        "device_ms": dev_ms,
        "time_source": source,
    }


def test_kernel_rows_format_records():
    rec = {
        **_rec("cudnn", 1.0123, 2.5),
        "median_ms": 2.53,
        "p10_ms": 2.5,
        "p90_ms": 2.6,
        "dispatch_ms": 0.012,
        "kernels": [
            {"name": "k" * 200, "us": 12345.6, "count": 1.0, "kind": "kernel"},
            {"name": "fmha", "us": 99.94, "count": 2.0, "kind": "kernel"},
        ],
    }
    rows = profile.kernel_rows([rec, {"status": "unsupported"}], top=2)
    assert [r["µs per call"] for r in rows] == ["12346", "99.94"] and rows[1]["launches per call"] == "2"
    assert len(rows[0]["kernel or op"]) == 110 and rows[0]["kernel or op"].endswith("…")


FMHA = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0"


def _prof(kernels, causal=False, wall=None):
    """A profiled record whose device_ms is the sum of its (name, µs, count, kind) kernels."""
    ks = [{"name": n, "us": us, "count": c, "kind": kind} for n, us, c, kind in kernels]
    return {
        "impl": "x",
        "status": "ok",
        "causal": causal,
        "kernels": ks,
        "traced_wall_ms": wall,
        "device_ms": sum(us for _, us, _, kind in kernels if kind in profile.DEVICE_KINDS) / 1e3,
    }


def test_same_kernel_compares_full_names_past_the_table_cut():
    a = _prof([(FMHA, 873.2, 1, "kernel"), ("Memset 3", 0.9, 1, "memset"), ("graph", 9e4, 1, "graph")])
    b = _prof([("Memset 3", 900.0, 3, "memset"), (FMHA, 835.9, 1, "kernel")])  # the longest *kernel*, not memset
    other = _prof([(FMHA[:-1] + "1", 835.9, 1, "kernel")])  # differs only in the last character
    assert profile.main_kernel(b)["us"] == 835.9 and profile.main_kernel(a)["name"] == FMHA
    assert profile.same_kernel(a, b) is True and profile.same_kernel(a, other) is False
    # the table shows cuDNN's whole names (they differ only past character 100), so the two rows differ there too
    assert profile.kernel_rows([a], top=1)[0]["kernel or op"] == FMHA
    assert profile.kernel_rows([other], top=1)[0]["kernel or op"] != FMHA
    assert profile.same_kernel(a, _prof([("Memset 3", 1.0, 1, "memset")])) is None  # no kernel to compare
    assert profile.main_kernel({}) is None


def test_extra_kernels_are_those_beside_the_main_one():
    te = _prof(
        [
            (FMHA, 873.2, 1, "kernel"),
            ("rng_state", 1.2, 1, "kernel"),
            ("Memset 3", 0.9, 1, "memset"),
            ("loop_broadcast_fusion", 0.7, 1, "kernel"),
            ("graph", 5.0, 1, "graph"),
        ]
    )
    jax_cudnn = _prof([(FMHA, 835.9, 1, "kernel"), ("Memset 3", 17.6, 3, "memset")])
    assert [k["name"] for k in profile.extra_kernels(te)] == ["rng_state", "Memset 3", "loop_broadcast_fusion"]
    assert profile.listed_all(te) and profile.listed_all(jax_cudnn)
    assert sum(k["us"] for k in profile.extra_kernels(te)) == pytest.approx(2.8)
    cut = {**jax_cudnn, "device_ms": 1.0}  # the record listed fewer kernels than it summed
    assert not profile.listed_all(cut)
    alone = _prof([(FMHA, 500.0, 1, "kernel")])
    assert profile.extra_kernels(alone) == []
