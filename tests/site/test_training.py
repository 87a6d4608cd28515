import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from attention_tutorial.site import claims
from attention_tutorial.site import training as page


def _summary(impl, ms, tps, lo, hi, **extra):
    return {
        "impl": impl,
        "status": "ok",
        "steady_median_ms": ms,
        "steady_p10_ms": ms * 0.98,
        "steady_p90_ms": ms * 1.02,
        "steady_tokens_per_s": tps,
        "steady_tokens_per_s_p10": lo,
        "steady_tokens_per_s_p90": hi,
        "mfu_datasheet_pct": 40.0,
        "mfu_measured_pct": 57.0,  # of 700 TFLOP/s at 399 TFLOP/s
        "steady_from": 30,
        **extra,
    }


def test_steady_states_and_the_tokens_verdict():
    states = page.steady(
        [
            _summary("cudnn", 20.0, 1000.0, 990.0, 1010.0, steady_tflops=399.0, datasheet_tflops=989.4),
            _summary("cudnn_twin", 20.1, 995.0, 985.0, 1005.0),
            _summary("mosaic", 19.0, 1050.0, 1040.0, 1060.0),
            _summary("xla", 30.0, 1005.0, 995.0, 1015.0),
            {"impl": "te", "status": "error"},
            {"impl": "old", "status": "ok", "median_ms": 3.0},
        ]
    )  # no steady state recorded
    assert [s.impl for s in states] == ["cudnn", "mosaic", "xla"]  # the rerun from nudged weights left out
    assert states[0].datasheet_tflops == 989.4 and states[0].measured_tflops == pytest.approx(700.0)
    ratio, word = page.tokens_ratio(states, "mosaic")
    assert ratio == pytest.approx(1.05) and word == "faster"
    assert page.tokens_ratio(states, "xla")[1] == "on par"
    assert page.tokens_ratio(states, "te") is None
    row = page.steady_rows(states[:1])[0]
    assert row["tokens/s"] == "1,000 (990–1,010)" and row["MFU, % of datasheet"] == "40.0"


def test_profile_groups_and_figure():
    recs = [
        {
            "impl": "cudnn",
            "embedding": "gather",
            "status": "ok",
            "device_ms": 34.0,
            "groups_us": {"attention": 5000.0, "embedding gradient": 22000.0, "matmuls": 6000.0, "other": 1000.0},
        },
        {
            "impl": "cudnn",
            "embedding": "onehot",
            "status": "ok",
            "device_ms": 12.0,
            "groups_us": {"attention": 5000.0, "matmuls": 6200.0, "other": 800.0},
        },
        {"impl": "mosaic", "embedding": "onehot", "status": "unsupported"},
    ]
    rows = page.profile_groups(recs)
    assert [r["embedding gradient"] for r in rows] == [22.0, 0.0]
    fig = page.profile_figure(rows)
    widths = [p.get_width() for p in fig.axes[0].patches]
    assert np.allclose(widths, [5.0, 6.0, 22.0, 1.0, 5.0, 6.2, 0.0, 0.8])


def _steps(impl, losses):
    return [{"impl": impl, "kind": "step", "step": 10 * i, "loss": v, "status": "ok"} for i, v in enumerate(losses)]


def test_loss_gaps_and_their_figure():
    recs = (
        _steps("cudnn", [5.0, 4.0, 3.0, 2.5])
        + _steps("mosaic", [5.0, 4.01, 2.98, 2.5])
        + _steps("xla", [5.0, 4.0, 3.0])  # one logged step fewer
        + _steps("cudnn_twin", [5.0, 4.05, 2.96, 2.52])
    )
    gaps = page.loss_gaps(recs, "cudnn")
    assert list(gaps) == ["mosaic", "xla", "cudnn_twin"]
    assert gaps["xla"] == ([0, 10, 20], [0.0, 0.0, 0.0])
    assert np.allclose(gaps["mosaic"][1], [0.0, 0.01, -0.02, 0.0])
    fig = page.loss_gap_figure(recs, title="synthetic")
    left, right = fig.axes[:2]
    assert np.allclose(left.lines[0].get_ydata(), [5.0, 4.0, 3.0, 2.5])  # the first implementation's loss
    drawn = {line.get_label(): line for line in right.lines}
    assert np.allclose(drawn["our Pallas kernel (Mosaic GPU)"].get_ydata(), [0.0, 0.01, -0.02, 0.0])
    assert np.allclose(drawn["cuDNN, weights nudged by one rounding"].get_ydata(), [0.0, 0.05, -0.04, 0.02])
    band = right.collections[0].get_paths()[0].vertices
    assert np.isclose(band[:, 1].max(), 0.05) and np.isclose(band[:, 1].min(), -0.05)  # ± the rerun's largest gap
    assert (band[:, 0].min(), band[:, 0].max()) == (0, 30)
    assert right.get_legend() is not None and "noise floor" in right.get_legend().get_texts()[0].get_text()
    plt.close(fig)


def test_loss_gap_figure_without_a_rerun_draws_no_band():
    fig = page.loss_gap_figure(_steps("xla", [5.0, 4.0]) + _steps("blockwise", [5.0, 4.1]))
    assert not fig.axes[1].collections and len(fig.axes[1].lines) == 2  # the zero line and blockwise's gaps
    plt.close(fig)


def test_noise_share():
    y = claims.loss_yardstick(_steps("cudnn", [5.0, 4.0, 3.0, 2.5]) + _steps("cudnn_twin", [5.0, 4.05, 2.96, 2.52]))
    assert page.noise_share(y) == pytest.approx(y.limit / y.motion) and y.limit == pytest.approx(0.05)
    assert page.noise_share(claims.loss_yardstick(_steps("xla", [5.0, 4.0]))) is None  # no rerun
    assert page.noise_share(None) is None


def _dispatch(impl, cb, waiting, ms, queue, status="ok"):
    if status != "ok":
        return {"impl": impl, "command_buffers": cb, "waiting": waiting, "status": status, "median_ms": None}
    return {
        "impl": impl,
        "command_buffers": cb,
        "waiting": waiting,
        "status": status,
        "median_ms": ms,
        "p10_ms": ms - 0.1,
        "p90_ms": ms + 0.2,
        "queue_ms": queue,
        "steps_per_wait": 10 if waiting == "ahead" else 1,
        "mfu_datasheet_pct": 530.0 / ms,
    }


def test_dispatch_rows_set_waiting_after_each_step_beside_queuing_ahead_per_setting():
    recs = [
        _dispatch("cudnn", "XLA's default", "every step", 15.5, 3.2),
        _dispatch("cudnn", "XLA's default", "ahead", 13.2, 2.2),
        _dispatch("cudnn", "off", "every step", 16.5, 7.0),
        _dispatch("cudnn", "off", "ahead", 13.6, 13.2),
        _dispatch("mosaic", "off", "ahead", 0.0, 0.0, status="error"),
    ]
    times = page.dispatch_times(recs)
    assert set(times) == {("cudnn", cb, w) for cb in ("XLA's default", "off") for w in ("every step", "ahead")}
    rows = page.dispatch_rows(recs)
    assert [
        (
            r["command buffers"],
            r["waiting after each step (ms)"],
            r["10 steps queued, then one wait (ms)"],
            r["host time to queue a step (ms)"],
        )
        for r in rows
    ] == [
        ("XLA's default", "15.5 (15.4–15.7)", "13.2 (13.1–13.4)", "2.2"),
        ("off", "16.5 (16.4–16.7)", "13.6 (13.5–13.8)", "13.2"),
    ]
    assert rows[0]["MFU waiting / queued (% of datasheet)"] == f"{530 / 15.5:.1f} / {530 / 13.2:.1f}"


def _bias_row(impl, bias, ms, status="ok"):
    return {
        "kernel": "train",
        "impl": impl,
        "bias": bias,
        "config": f"{impl}, bias={bias}",
        "status": status,
        "step_ms": ms,
        "p10_ms": ms and ms - 0.1,
        "p90_ms": ms and ms + 0.2,
        "mfu_datasheet_pct": 530.0 / ms if ms else None,
    }


def test_bias_rows_set_the_step_with_and_without_biases_side_by_side():
    rows = [
        _bias_row("cudnn", True, 13.0),
        _bias_row("cudnn", False, 12.5),
        _bias_row("mosaic", True, 13.1),
        _bias_row("mosaic", False, None, status="error"),
    ]
    assert set(page.bias_times(rows)) == {("cudnn", True), ("cudnn", False), ("mosaic", True)}
    got = page.bias_rows(rows)
    assert [r["step with biases (ms)"] for r in got] == ["13.00 (12.90–13.20)", "13.10 (13.00–13.30)"]
    assert [r["step without (ms)"] for r in got] == ["12.50 (12.40–12.70)", "–"]
    assert got[0]["MFU without (%)"] == f"{530 / 12.5:.1f}" and got[1]["MFU without (%)"] == "–"
    assert page.bias_rows([]) == []
