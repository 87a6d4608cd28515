import matplotlib

matplotlib.use("Agg")

from attention_tutorial.results.plotting import markdown_table, plot_records

RECS = [
    {
        "impl": "xla",
        "seq_q": 64,
        "status": "ok",
        "tflops": 1.0,
        "median_ms": 2.0,
        "p10_ms": 1.5,
        "p90_ms": 2.5,
        "causal": False,
    },
    {
        "impl": "xla",
        "seq_q": 128,
        "status": "ok",
        "tflops": 2.0,
        "median_ms": 3.0,
        "p10_ms": 2.5,
        "p90_ms": 3.5,
        "causal": False,
    },
    {
        "impl": "cudnn",
        "seq_q": 64,
        "status": "unsupported",
        "reason": "needs a GPU | really",
        "tflops": None,
        "causal": False,
    },
]


def test_markdown_table_formats_and_explains_failures():
    text = markdown_table(RECS, ["impl", "seq_q", "tflops", "reason"])
    lines = text.splitlines()
    assert lines[0] == "| implementation | T | TFLOP/s | why not |"  # human names, not field names
    assert len(lines) == 2 + 3
    assert "| XLA | 64 | 1 | – |" in text
    assert "*unsupported*" in lines[4] and "needs a GPU \\| really" in lines[4]
    # said once: in the status column when there is one, else in the first missing value only
    two = markdown_table(RECS[-1:], ["impl", "median_ms", "tflops"]).splitlines()[2]
    assert two.count("*unsupported*") == 1 and two.endswith("| – |")
    with_status = markdown_table(RECS[-1:], ["impl", "status", "median_ms", "tflops"]).splitlines()[2]
    assert "*unsupported*" not in with_status and with_status.count("| – ") == 2


def test_plot_one_line_per_series_and_a_peak_line():
    fig = plot_records(RECS, y="tflops", hline=10.0, hline_label="peak")
    ax = fig.axes[0]
    assert len(ax.lines) == 2  # xla (cudnn has no ok point) + the peak
    assert list(ax.lines[0].get_xdata()) == [64, 128]
    assert ax.get_ylabel() == "TFLOP/s"


def test_ms_plot_draws_the_spread_band():
    fig = plot_records(RECS, y="median_ms")
    assert len(fig.axes[0].collections) == 1


def test_markdown_table_formats_fp8_fields():
    rec = {"impl": "te_dense_fp8", "rel_error": 0.046918544367176226, "fp8_types_in_hlo": ["f8e4m3fn", "f8e5m2"]}
    plain = {"impl": "te_dense_bf16", "rel_error": 0.0016615716735139908, "fp8_types_in_hlo": []}
    text = markdown_table([rec, plain], ["impl", "rel_error", "fp8_types_in_hlo"])
    assert "| TE DenseGeneral, FP8 (autocast) | 0.0469 | f8e4m3fn, f8e5m2 |" in text
    assert "| TE DenseGeneral, bf16 | 0.00166 | none |" in text


def test_colour_follows_the_implementation_and_line_style_the_rest():
    recs = [
        {"impl": impl, "seq_q": t, "causal": causal, "status": "ok", "tflops": i + causal / 2 + t / 1000}
        for i, impl in enumerate(("xla", "cudnn"))
        for causal in (False, True)
        for t in (64, 128)
    ]
    lines = plot_records(recs, y="tflops", by=("impl", "causal")).axes[0].lines
    style = {line.get_label(): (line.get_color(), line.get_linestyle()) for line in lines}
    assert style["XLA, no mask"][0] == style["XLA, causal"][0] != style["cuDNN, no mask"][0]
    assert style["XLA, no mask"][1] == style["cuDNN, no mask"][1] != style["XLA, causal"][1]


def test_an_implementation_keeps_its_colour_on_every_plot():
    one = [{"impl": "cudnn", "seq_q": 64, "status": "ok", "tflops": 1.0}]
    two = [
        {"impl": impl, "seq_q": 64, "status": "ok", "tflops": 1.0 + i}
        for i, impl in enumerate(("naive", "xla", "cudnn"))
    ]
    colour = {line.get_label(): line.get_color() for line in plot_records(two, y="tflops").axes[0].lines}
    assert plot_records(one, y="tflops").axes[0].lines[0].get_color() == colour["cuDNN"]
    assert len(set(colour.values())) == 3


def test_more_than_six_lines_split_into_panels():
    recs = [
        {"impl": impl, "seq_q": 64, "causal": causal, "status": "ok", "tflops": 1.0 + i}
        for i, impl in enumerate(("naive", "xla", "cudnn", "pallas"))
        for causal in (False, True)
    ]
    fig = plot_records(recs, y="tflops", by=("impl", "causal"))
    assert len(fig.axes) == 2 and all(len(ax.lines) == 4 for ax in fig.axes)
    assert {ax.get_title() for ax in fig.axes} == {"causal", "no mask"}


def test_table_cells_escape_what_markdown_would_eat():
    text = markdown_table([{"impl": "xla", "reason": "__cublas$lt$matmul\nline two | x"}], ["impl", "reason"])
    assert "\\$lt\\$" in text and "\\|" in text and "\n" not in text.splitlines()[2]


def test_long_legends_go_beside_the_axes():
    recs = [{"impl": f"impl{i}", "seq_q": 64, "status": "ok", "tflops": 1.0 + i} for i in range(8)]
    fig = plot_records(recs, y="tflops")
    ax = fig.axes[0]
    legend = ax.get_legend()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert len(legend.get_texts()) == 8
    assert legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1  # right of the axes
    short = plot_records(recs[:2], y="tflops")  # a short legend stays off the data too
    short.canvas.draw()
    r2 = short.canvas.get_renderer()
    assert short.axes[0].get_legend().get_window_extent(r2).x0 >= short.axes[0].get_window_extent(r2).x1


def test_size_text_picks_a_readable_unit():
    from attention_tutorial.results.plotting import size_text

    assert size_text(512) == "512 B"
    assert size_text(14.1 * 2**10) == "14.1 KiB"
    assert size_text(36 * 2**20) == "36 MiB"
    assert size_text(12288 * 2**20) == "12 GiB"
    assert size_text(768.1 * 2**20) == "768 MiB"
    assert size_text(3 * 2**40) == "3,072 GiB"


def test_identical_series_are_drawn_once_under_both_names():
    naive = [{**r, "impl": "naive"} for r in RECS[:2]]
    other = [{**RECS[0], "impl": "blockwise", "tflops": 1.5}, {**RECS[1], "impl": "blockwise"}]
    fig = plot_records(RECS + naive + other, y="tflops")
    names = fig.axes[0].get_legend_handles_labels()[1]
    assert names == ["XLA = naive (from scratch) (identical)", "blockwise JAX (online softmax)"]
    assert len(fig.axes[0].lines) == 2  # one line for the identical pair, one for the one that differs at T=64


def test_show_table_defaults_to_the_first_records_fields():
    from attention_tutorial.results.plotting import show_table

    text = show_table([{"impl": "xla", "seq_q": 64}]).data
    assert text.splitlines()[0] == "| implementation | T |" and "| XLA | 64 |" in text
    assert show_table([]).data == "*(no rows)*"


def test_temporaries_are_plotted_in_mib():
    recs = [{"impl": "xla", "seq_q": t, "status": "ok", "temp_bytes": t * 2**20} for t in (64, 128)]
    ax = plot_records(recs, y="temp_bytes").axes[0]
    assert list(ax.lines[0].get_ydata()) == [64, 128] and ax.get_ylabel() == "compiled temporaries (MiB)"


def test_oom_reasons_lose_the_allocator_tags():
    rec = {
        "impl": "naive",
        "status": "oom",
        "reason": "JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
        "trying to allocate 64.00GiB. [tf-allocator-allocation-error=''] [executable_name='jit_forward']",
    }
    text = markdown_table([rec], ["impl", "reason"])
    assert "| out of memory (64.00 GiB requested) |" in text and "tf-allocator" not in text and "RESOURCE" not in text
    other = {**rec, "reason": "JaxRuntimeError: INTERNAL: a different failure [executable_name='jit_forward']"}
    assert "| JaxRuntimeError: INTERNAL: a different failure |" in markdown_table([other], ["impl", "reason"])
    refused = {"impl": "cudnn", "status": "unsupported", "reason": "Unsupported: cuDNN attention cannot run this."}
    assert "| cuDNN attention cannot run this. |" in markdown_table([refused], ["impl", "reason"])


def test_series_that_overlap_on_the_plot_are_drawn_once_and_say_how_close():
    """The H200's memory plot: naive and XLA differ by about 2 MiB of 3 GiB (0.07 %), one line hid the other."""
    xla = [
        {"impl": "xla", "seq_q": t, "status": "ok", "temp_bytes": b}
        for t, b in ((1024, 3221225744), (2048, 6442451216))
    ]
    naive = [{**r, "impl": "naive", "temp_bytes": b} for r, b in zip(xla, (3223322640, 6444548112))]
    apart = [{**r, "impl": "blockwise", "temp_bytes": r["temp_bytes"] * 1.02} for r in xla]  # 2 %: its own line
    fig = plot_records(xla + naive + apart, y="temp_bytes")
    names = fig.axes[0].get_legend_handles_labels()[1]
    assert names == ["XLA = naive (from scratch) (within 0.5 %)", "blockwise JAX (online softmax)"]


def test_loss_curves_turn_the_near_merge_off_but_still_join_identical_ones():
    """Training loss curves 0.1 % apart are the point of the plot: with overlap=0 each keeps its line; an identical
    pair is still drawn once under both names."""
    xla = [{"impl": "xla", "step": s, "status": "ok", "loss": x} for s, x in enumerate((5.0, 4.0, 3.5))]
    near = [{**r, "impl": "pallas", "loss": r["loss"] * 1.001} for r in xla]  # 0.1 %: merged on a speed plot
    same = [{**r, "impl": "cudnn"} for r in xla]
    merged = plot_records(xla + near, x="step", y="loss", logx=False).axes[0]
    assert merged.get_legend_handles_labels()[1] == ["XLA = our Pallas kernel (Triton) (within 0.5 %)"]
    ax = plot_records(xla + near + same, x="step", y="loss", logx=False, overlap=0).axes[0]
    names = ax.get_legend_handles_labels()[1]
    assert names == ["XLA = cuDNN (identical)", "our Pallas kernel (Triton)"] and len(ax.lines) == 2


def _shape(impl="xla", t=1024, **kw):
    return {
        "impl": impl,
        "batch": 4,
        "seq_q": t,
        "seq_kv": t,
        "heads": 16,
        "kv_heads": 4,
        "head_dim": 128,
        "dtype": "bfloat16",
        "causal": False,
        "mask": "none",
        "pass": "fwd",
        "status": "ok",
        "tflops": t / 100,
        **kw,
    }


def test_shape_words_name_what_is_fixed_and_say_when_batch_moves_with_t():
    from attention_tutorial.results.plotting import shape_words

    fixed = [_shape(t=t) for t in (1024, 2048)]
    assert shape_words(fixed) == "B = 4, S = T, N = 16, K = 4, H = 128, dtype bfloat16, mask none, forward, no mask"
    tokens = [_shape(t=t, batch=8192 // t) for t in (1024, 4096, 2048)]
    assert "B·T = 8192 fixed (B 8–2 as T grows)" in shape_words(tokens, by=("impl", "causal"))
    loose = [_shape(t=1024, batch=1), _shape(t=2048, batch=4)]  # varies, but not with B·T fixed: a range
    assert shape_words(loose).startswith("B = 1–4, S = T")
    assert "S = 512" in shape_words([_shape(t=t, seq_kv=512) for t in (1024, 2048)])


def test_series_fields_split_lines_that_would_join_different_shapes():
    from attention_tutorial.results.plotting import series_fields

    recs = [_shape(t=t, dtype=d, batch=8192 // t) for t in (1024, 2048) for d in ("bfloat16", "float32")]
    assert series_fields(recs, by=("impl", "causal")) == ("impl", "causal", "dtype")  # batch tied to T: no split
    assert series_fields([_shape(t=1024, heads=h) for h in (8, 16)]) == ("impl", "heads")
    assert series_fields([_shape(t=t) for t in (1024, 2048)]) == ("impl",)


def test_differences_name_each_field_that_is_not_like_for_like():
    from attention_tutorial.results.plotting import differences

    cpu = [_shape(t=t, dtype="float32") for t in (256, 2048)]
    gpu = [_shape(t=t) for t in (1024, 32768)]
    assert differences(cpu, gpu) == ["dtype float32 vs bfloat16", "T 256–2048 vs 1024–32768"]  # S = T: said once
    assert differences(gpu, gpu) == []
    shorter = [_shape(t=t, seq_kv=512, batch=8192 // t) for t in (1024, 2048)]
    longer = [_shape(t=t, batch=32768 // t) for t in (1024, 2048)]
    assert differences(shorter, longer) == ["B·T 8192 vs 32768", "S 512 vs 1024–2048"]


def test_bad_plot_and_table_arguments_name_the_argument():
    import pytest

    with pytest.raises(ValueError, match="x='step': a record to plot has no such field"):
        plot_records(RECS, x="step")
    with pytest.raises(TypeError, match="by must be a tuple of record field names"):
        plot_records(RECS, by="impl")
    with pytest.raises(TypeError, match="columns must be a tuple of record field names"):
        markdown_table(RECS, "impl")
