"""The warpgroup timeline: traces written by Pallas's own profiler dumper from a buffer made here are read back into
the tracks they encode; the event buffer is sized for every step; off a Hopper GPU each kernel says why not."""

import dataclasses
import functools
import io
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import AttentionShape
from attention_tutorial.kernels.mosaic.budget import NO_PROBE, Probe, default_config, problem
from attention_tutorial.measure import timeline as tl


def _dumped(tracks_by_block, entries=64):
    """A Chrome trace from jax's ProfilerSpec.dump, for ``tracks_by_block``: per CTA, per warpgroup, (start_ns, sm,
    [(name, enter?, clock), ...]) — the buffer layout the kernel writes (start, SM, count, then tag/clock pairs)."""
    from jax.experimental.mosaic.gpu.profiler import ProfilerSpec

    spec = ProfilerSpec(entries, dump_path="/unused")
    buffer = np.zeros((len(tracks_by_block), 3, entries), np.uint32)
    for b, block in enumerate(tracks_by_block):
        for w, (start, sm, events) in enumerate(block):
            buffer[b, w, :3] = (start, sm, 2 * len(events))
            for i, (name, enter, clock) in enumerate(events):
                tag = spec.intern_name(name) | (0 if enter else ProfilerSpec.EXIT)
                buffer[b, w, 3 + 2 * i : 5 + 2 * i] = (tag, clock)
    out = io.StringIO()
    spec.dump(buffer.reshape(-1), out, grid=(len(tracks_by_block),), block=(3 * 128,))
    return json.loads(out.getvalue())


def _events(*regions):  # (name, start, end) at the top level, with ("wait", s, e) nested where given as 4-tuples
    out = []
    for r in regions:
        name, s, e, *inner = r
        out.append((name, True, s))
        for iname, is_, ie in inner:
            out += [(iname, True, is_), (iname, False, ie)]
        out.append((name, False, e))
    return out


def test_parse_trace_reads_back_the_regions_pallas_wrote_with_nesting_and_the_first_ctas():
    late = 5_000  # a CTA that started later (global timer, ns) is left out with ctas=1
    # one cycle between two events: the dumper's estimate of the profiler's own cost per event is then 0
    compute = _events(("qk", 100, 400, ("wait", 150, 300)), ("softmax", 401, 900), ("pv", 901, 1000))
    copy = _events(("copy", 100, 120), ("wait", 130, 800))
    trace = _dumped(
        [
            [(1000, 7, compute), (1000, 7, compute), (1000, 7, copy)],
            [(1000 + late, 9, compute), (1000 + late, 9, compute), (1000 + late, 9, copy)],
        ]
    )
    tracks = tl.parse_trace(trace, ctas=1)
    assert [(t["cta"], t["warpgroup"], t["sm"]) for t in tracks] == [(0, 0, 7), (0, 1, 7), (0, 2, 7)]
    # each track's first event sits at its start (the dumper subtracts the first clock); cycles after it
    assert tracks[0]["regions"] == [
        ["qk", 0, 300, 0],
        ["wait", 50, 200, 1],
        ["softmax", 301, 800, 0],
        ["pv", 801, 900, 0],
    ]
    assert tracks[2]["regions"] == [["copy", 0, 20, 0], ["wait", 30, 700, 0]]
    both = tl.parse_trace(trace, ctas=2)
    assert [t["cta"] for t in both] == [0, 0, 0, 1, 1, 1]
    assert both[3]["regions"][0][1] == late and both[3]["sm"] == 9  # later CTAs keep their offset


def test_parse_trace_refuses_what_is_not_a_trace_or_does_not_nest():
    with pytest.raises(ValueError, match="Chrome trace"):
        tl.parse_trace({"events": []})
    bad = {"traceEvents": [{"name": "qk", "ph": "E", "ts": 1.0, "pid": 1, "tid": 1}]}
    with pytest.raises(ValueError, match="region 'qk' ends without its start"):
        tl.parse_trace(bad)
    open_ = {"traceEvents": [{"name": "qk", "ph": "B", "ts": 1.0, "pid": 1, "tid": 1}]}
    with pytest.raises(ValueError, match=r"regions \['qk'\] never end"):
        tl.parse_trace(open_)
    with pytest.raises(ValueError, match="ctas must be a positive int"):
        tl.parse_trace({"traceEvents": []}, ctas=0)


def test_the_event_buffer_holds_every_step_and_fits_beside_the_tiles():
    shape = tl.SHAPE
    for pipeline in (False, True):
        cfg = default_config(shape.head_dim, pipeline=pipeline)
        space = tl.profile_space(shape, cfg.block_kv)
        assert space >= tl.REGIONS_PER_STEP * shape.seq_kv // cfg.block_kv
        assert problem(shape, jnp.bfloat16, cfg, Probe(profile_space=space, profile_dir="/t")) is None
    assert shape.batch * shape.heads * shape.seq_q // 128 <= 132  # one wave of CTAs on an H200


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU answer")
def test_off_hopper_each_kernel_says_why_with_what_it_would_have_run():
    got = tl.timeline_records(shape=AttentionShape(1, 256, 256, 2, 2, 128))
    assert set(got) == set(tl.KERNELS) == {"mosaic", "mosaic_turns", "mosaic_pipe"}
    for entry in got.values():
        assert entry["status"] == "unsupported" and "Hopper" in entry["reason"]
        assert entry["shape"]["seq_kv"] == 256 and entry["tiles"]["block_kv"] == 128 and entry["unit"] == "ns"


@pytest.mark.gpu
def test_gpu_profiled_forwards_give_tracks_of_every_warpgroup_with_each_region(tmp_path):
    from attention_tutorial.kernels.mosaic.attention import why_not

    if reason := why_not(tl.SHAPE, jnp.bfloat16, False):
        pytest.skip(reason)
    got = tl.timeline_records(ctas=1)
    for impl, entry in got.items():
        assert entry["status"] == "ok", (impl, entry.get("reason"))
        tracks = entry["tracks"]
        assert [t["warpgroup"] for t in tracks] == [0, 1, 2] and entry["ctas"] == 128
        for t in tracks[:2]:
            names = {r[0] for r in t["regions"]}
            assert {"qk", "softmax", "pv", "wait"} <= names
            assert all(0 <= s <= e for _, s, e, _ in t["regions"])
        assert {r[0] for r in tracks[2]["regions"]} <= {"copy", "wait", "Init"}  # Init: the profiler's own start


def test_the_backward_event_buffer_holds_every_step_and_fits_beside_the_tiles():
    shape = tl.BACKWARD_SHAPE
    for dq in tl.BACKWARD_KERNELS.values():
        cfg = dataclasses.replace(default_config(shape.head_dim), bwd_dq=dq)
        space = tl.backward_profile_space(shape, cfg)
        assert space >= tl.BACKWARD_REGIONS_PER_STEP * shape.seq_q // cfg.bwd_block_q
        assert problem(shape, jnp.bfloat16, cfg, Probe(profile_space=space, profile_dir="/t")) is None
    # 24 KiB of events fit beside the forward's 160.5 KiB of tiles, not beside the atomic dK/dV kernel's 209 (+ 4)
    big = dataclasses.replace(default_config(128), bwd_dq="atomic")
    assert "to the dK/dV kernel's tiles (237.0 KiB" in problem(
        AttentionShape(1, 256, 256, 2, 2, 128), jnp.bfloat16, big, Probe(profile_space=512, profile_dir="/t")
    )


def test_traces_are_taken_in_the_order_their_kernels_ran(tmp_path):
    before = set(tmp_path.glob("*.json"))
    for name in ("dkv_entry-2000000000000000010-trace.json", "entry-1999999999999999999-trace.json"):
        (tmp_path / name).write_text("{}")
    assert [p.name.split("-")[0] for p in tl._written(tmp_path, before, 2, "backward")] == ["entry", "dkv_entry"]
    with pytest.raises(RuntimeError, match=r"wrote 2 traces .* not 1"):
        tl._written(tmp_path, before, 1, "backward")


def _backward_jaxpr(cfg, causal, probe=NO_PROBE):
    from attention_tutorial.kernels.mosaic.attention import mosaic_flash_backward

    q = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 2, 256), jnp.float32)
    fn = functools.partial(mosaic_flash_backward, is_causal=causal, config=cfg, probe=probe)
    return jax.make_jaxpr(fn)(q, q, q, q, lse, q)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dq", ["pass", "atomic"])
def test_backward_regions_exist_only_when_profiling_and_add_no_operation(dq, causal):
    from tests.kernels.mosaic.test_forward import _scope_names

    plain = dataclasses.replace(default_config(64), bwd_dq=dq)
    profiled = Probe(profile_space=64, profile_dir="/tmp/trace")
    base = _scope_names(_backward_jaxpr(plain, causal).jaxpr)  # the kernels' entry, the einsum of rowsum(dO ∘ O)
    regions = {"qk", "softmax", "grads", "wait", "copy"} | ({"dq_add"} if dq == "atomic" else set())
    assert not base & regions and _scope_names(_backward_jaxpr(plain, causal, profiled).jaxpr) == base | regions
    a = str(_backward_jaxpr(plain, causal)).splitlines()
    b = str(_backward_jaxpr(plain, causal, profiled)).splitlines()
    differ = [(x, y) for x, y in zip(a, b) if x != y]
    assert len(a) == len(b) and len(differ) == (2 if dq == "pass" else 1)  # each kernel's compiler parameters
    assert all("profile_space=64" in y for _, y in differ)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU answer")
def test_off_hopper_each_backward_says_why_with_what_it_would_have_run():
    got = tl.backward_timeline_records(shape=AttentionShape(1, 256, 256, 2, 2, 64))
    assert set(got) == {"mosaic", "mosaic_atomic"}
    for impl, entry in got.items():
        assert entry["status"] == "unsupported" and "Hopper" in entry["reason"]
        assert entry["bwd_dq"] == tl.BACKWARD_KERNELS[impl] and entry["tiles"]["bwd_block_q"] == 64


@pytest.mark.gpu
def test_gpu_profiled_backwards_give_tracks_of_every_warpgroup_with_each_region():
    from attention_tutorial.kernels.mosaic.attention import why_not

    if reason := why_not(tl.BACKWARD_SHAPE, jnp.bfloat16, False):
        pytest.skip(reason)
    got = tl.backward_timeline_records(ctas=1)
    for impl, entry in got.items():
        assert entry["status"] == "ok", (impl, entry.get("reason"))
        kernels = [entry["tracks"], *([entry["dq_tracks"]] if impl == "mosaic" else [])]
        assert ("dq_tracks" in entry) == (impl == "mosaic")
        for tracks in kernels:
            assert [t["warpgroup"] for t in tracks] == [0, 1, 2]
            for t in tracks[:2]:
                assert {"qk", "softmax", "grads", "wait"} <= {r[0] for r in t["regions"]}
                assert all(0 <= s <= e for _, s, e, _ in t["regions"])
            assert {r[0] for r in tracks[2]["regions"]} <= {"copy", "wait", "Init"}
        atomic_adds = {r[0] for t in entry["tracks"][:2] for r in t["regions"]} & {"dq_add"}
        assert atomic_adds == ({"dq_add"} if impl == "mosaic_atomic" else set())
