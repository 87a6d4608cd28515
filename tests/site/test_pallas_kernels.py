"""The Pallas-kernel page's numbers: speeds against a baseline from synthetic records a wrong verdict would fail, the
ping-pong schedule's overlap, and what the recorded machine code holds."""

import itertools

import pytest

from attention_tutorial.site import pallas_kernels as page


def r(impl, T, ms, lo, hi, *, H=128, causal=False, grid="flash", dtype="bfloat16", status="ok"):
    return {
        "grid": grid,
        "impl": impl,
        "batch": 65536 // T,
        "seq_q": T,
        "seq_kv": T,
        "heads": 16,
        "kv_heads": 16,
        "head_dim": H,
        "dtype": dtype,
        "causal": causal,
        "pass": "fwd",
        "mask": None,
        "status": status,
        "median_ms": ms,
        "p10_ms": lo,
        "p90_ms": hi,
    }


RECS = [
    r("cudnn", 8192, 1.00, 0.99, 1.01),
    r("mosaic", 8192, 0.90, 0.89, 0.91),
    r("cudnn", 16384, 2.00, 1.98, 2.02),
    r("mosaic", 16384, 2.01, 1.99, 2.03),
    r("cudnn", 2048, 0.2, 0.2, 0.2),
    r("mosaic", 2048, 0.1, 0.1, 0.1),
    r("mosaic", 8192, 3.0, 2.9, 3.1, H=256, causal=True),
]  # no cuDNN at H = 256 causal: no speed


def test_race_gives_each_t_the_baseline_time_over_ours_and_its_verdict():
    (speed,) = page.race(RECS, RECS, ("mosaic",), min_seq=4096)
    assert (speed.impl, speed.head_dim, speed.causal, speed.dtype) == ("mosaic", 128, False, "bfloat16")
    assert speed.ts == [8192, 16384]  # T = 2048 is below min_seq
    assert speed.low == pytest.approx(2.00 / 2.01) and speed.high == pytest.approx(1.00 / 0.90)
    assert speed.spread_low == pytest.approx(1.98 / 2.03) and speed.spread_high == pytest.approx(1.01 / 0.89)
    assert dict(speed.by_t)[8192].word == "faster" and dict(speed.by_t)[16384].word == "on par"
    assert speed.verdict == "faster at T = 8192; on par at T = 16384"
    assert len(page.race(RECS, RECS, ("mosaic",))) == 1  # min_seq 0 adds T = 2048 to the same speed
    assert page.race(RECS, RECS, ("mosaic",))[0].ts == [2048, 8192, 16384]


def test_every_recording_of_the_baseline_widens_its_range():
    other_run = [r("cudnn", 8192, 0.88, 0.87, 0.89, grid="seq_long")]  # cuDNN faster in another run
    (speed,) = page.race(RECS, [*RECS, *other_run], ("mosaic",), min_seq=4096)
    got = dict(speed.by_t)[8192]
    assert got.value == pytest.approx(0.94 / 0.90)  # the median of cuDNN's two recordings
    assert got.word == "on par"  # 0.89–0.91 lies inside cuDNN's pooled 0.87–1.01
    # the same recording loaded twice counts once
    (twice,) = page.race(RECS, [*RECS, *[dict(x) for x in RECS], *other_run], ("mosaic",), min_seq=4096)
    assert dict(twice.by_t)[8192].value == pytest.approx(got.value)


def test_race_refuses_mixed_points_and_a_bare_string():
    f16 = {**r("mosaic", 8192, 0.9, 0.9, 0.9), "batch": 4}
    with pytest.raises(ValueError, match="differ in batch"):
        page.race([*RECS, f16], RECS, ("mosaic",))
    with pytest.raises(TypeError, match="tuple of implementation names"):
        page.race(RECS, RECS, "mosaic")


def test_span_and_pct_read_the_extremes():
    speeds = page.race(RECS, RECS, ("mosaic",), min_seq=4096)
    assert page.span(speeds) == (pytest.approx(2.00 / 2.01), pytest.approx(1.00 / 0.90))
    assert page.pct(page.span(speeds)) == "100–111 %"
    assert page.pct((0.974, 0.9749)) == "97 %" and page.pct(None) == "–"
    assert page.span([]) is None
    assert page.pick(speeds, causal=True) == [] and page.pick(speeds, impl="mosaic") == speeds


def test_the_race_figure_draws_each_ratio_with_its_range():
    speeds = page.race(RECS, RECS, ("mosaic",), min_seq=4096)
    ax = page.race_figure(speeds).axes[0]
    line = ax.containers[0].lines[0]  # the errorbar's data line
    assert list(line.get_xdata()) == [8192, 16384]
    assert list(line.get_ydata()) == pytest.approx([100 * 1.0 / 0.9, 100 * 2.0 / 2.01])
    rows = page.speed_rows(speeds)
    assert rows[0]["verdict"] == speeds[0].verdict and rows[0]["H"] == 128


@pytest.mark.parametrize(("matmul", "softmax"), [(2.0, 2.0), (1.0, 1.0), (2.0, 3.0), (3.0, 1.0)])
def test_the_pingpong_never_shares_the_tensor_cores(matmul, softmax):
    rows = page.pingpong_schedule(steps=4, matmul=matmul, softmax=softmax)
    mm = sorted((s, s + n) for row in rows.values() for s, n, kind, _ in row if kind == "matmul")
    assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(mm))  # one warpgroup on the tensor cores at a time
    for wg in ("warpgroup 0", "warpgroup 1"):  # within a warpgroup, each box follows the last
        boxes = rows[wg]
        assert all(a[0] + a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(boxes))
    # steady state: two matmuls per period of matmul + softmax, or always busy when the softmax is the shorter
    busy = sum(b - a for a, b in mm) / (mm[-1][1] - mm[0][0])  # the matmuls never overlap (above)
    assert busy == pytest.approx(1.0) if softmax <= matmul else busy < 1.0
    # the copy warpgroup lands block j's tiles before warpgroup 0's step j starts
    for (start, length, *_), (mm_start, *_) in zip(rows["copy warpgroup"], rows["warpgroup 0"][::2]):
        assert start + length <= mm_start
    with pytest.raises(ValueError, match="steps >= 1"):
        page.pingpong_schedule(steps=0)


def test_the_timeline_figure_draws_every_box_row_by_row_top_down():
    rows = page.pingpong_schedule(steps=2)
    ax = page.timeline_figure(rows).axes[0]
    assert len(ax.collections) == sum(len(row) for row in rows.values())
    assert [t.get_text() for t in ax.get_yticklabels()] == list(rows) and ax.yaxis_inverted()
    first = ax.collections[0].get_paths()[0].get_extents()  # warpgroup 0's first matmul, on the top row (y = 0)
    start, length, *_ = rows["warpgroup 0"][0]
    assert (first.x0, first.x1, first.y0, first.y1) == pytest.approx((start, start + length, -0.35, 0.35))


CODE = {
    "pallas bfloat16": {
        "batch": 4,
        "seq_q": 4096,
        "heads": 16,
        "head_dim": 128,
        "registers": [],
        "counts": {"sass": {"wgmma (warpgroup matmul)": 16, "cp.async (per-thread async copy)": 48}},
    },
    "mosaic_pipe bfloat16 causal H=256": {
        "batch": 4,
        "seq_q": 4096,
        "heads": 16,
        "head_dim": 256,
        "registers": [168],
        "wgmma_serialised": ["C7513: serialised"],
        "counts": {"ptx": {"wgmma (warpgroup matmul)": 60}},
    },
}


def test_code_counts_read_sass_where_recorded_else_ptx():
    assert page.code_counts(CODE, "pallas bfloat16")["wgmma"] == 16
    assert page.code_counts(CODE, "pallas bfloat16")["cp.async"] == 48
    assert page.code_counts(CODE, "pallas bfloat16")["TMA copy"] == 0  # a family not counted is none
    assert page.code_counts(CODE, "mosaic_pipe bfloat16 causal H=256")["wgmma"] == 60  # PTX only
    assert page.code_counts(CODE, "absent") is None


def test_the_recorded_code_holds_what_the_page_says():
    """On the committed recording: both kernels use wgmma; only the Mosaic one copies by TMA and specialises its
    warps; the Triton one copies per thread."""
    from attention_tutorial.site.report import reference

    _, prov = reference("flash")
    code = prov["kernel_code"]
    tri, mos = page.code_counts(code, "pallas bfloat16"), page.code_counts(code, "mosaic bfloat16")
    assert tri["wgmma"] > 0 and mos["wgmma"] > 0
    assert mos["TMA copy"] > 0 and mos["cp.async"] == 0 and tri["cp.async"] > 0 and tri["TMA copy"] == 0
    assert mos["setmaxnreg"] > 0 and tri["setmaxnreg"] == 0


def test_the_recorded_race_puts_the_mosaic_kernel_near_cudnn_and_triton_below():
    from attention_tutorial.site.report import reference

    flash, _ = reference("flash", dtype="bfloat16")
    everything, _ = reference()
    speeds = page.race(flash, everything, ("pallas", "mosaic"), min_seq=4096)
    low, high = page.span(page.pick(speeds, impl="mosaic", head_dim=128))
    assert 0.9 < low <= high < 1.1
    assert page.span(page.pick(speeds, impl="pallas", head_dim=128))[1] < low


def _sample(a, b):
    f = lambda t: t + b  # noqa: E731
    x = f(a)
    y = x * 2
    return y


def test_listing_drops_lint_markers_and_cuts_between_markers():
    whole = page.listing(_sample)
    assert "fmt: skip" not in whole and "noqa" not in whole and whole.startswith("def _sample(a, b):")
    assert page.listing(_sample, start="y = x", end="return") == "y = x * 2\nreturn y\n"
    with pytest.raises(ValueError, match="start='z = ' is not in the source of _sample"):
        page.listing(_sample, start="z = ")
    with pytest.raises(ValueError, match="end='nothing' is not in the source"):
        page.listing(_sample, start="x =", end="nothing")


def test_the_printed_kernel_excerpts_hold_what_the_page_says():
    """The page's listings (``literalinclude`` of the kernels' source) cut where its text says they do."""
    import re
    from pathlib import Path
    from types import SimpleNamespace

    from sphinx.directives.code import LiteralIncludeReader

    docs = Path(__file__).resolve().parents[2] / "docs"
    listings = []
    for path, opts in re.findall(
        r"```\{literalinclude\} (\S+)\n((?::[^\n]*\n)*)", (docs / "pallas_kernels.md").read_text()
    ):
        options = dict(re.match(r":([\w-]+):\s*(.*)", line).groups() for line in opts.splitlines())
        options = {k: (None if k == "dedent" else v) for k, v in options.items()}
        reader = LiteralIncludeReader(docs / path, options, SimpleNamespace(source_encoding="utf-8-sig"))
        listings.append(reader.read()[0])
    launch, kernel, step, whole = listings
    assert launch.startswith("call = pl.pallas_call(") and launch.rstrip().endswith("jnp.float32)],")
    assert "grid=(T // bq, B, N)" in launch and launch.count("pl.BlockSpec(") == 5 and "n // G" in launch
    assert kernel.startswith("def _kernel(") and "jnp.exp2(" in kernel
    assert step.startswith("def step(") and "schedule.after_qk()" in step and "plgpu.wgmma(acc_ref, p_op" in step
    assert step.rstrip().endswith("return acc, m_new, l") and all(line in whole for line in step.splitlines())
    # the open excerpt of the step keeps the online softmax and leaves out what the text says it leaves out
    assert "m_new = jnp.maximum(m, " in step and "p = exp2_tile(" in step and "l = l * alpha + " in step
    assert "tile_kept(" not in step and "optimization_barrier" not in step and "look_ahead)" not in step
