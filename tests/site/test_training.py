"""The training page: its loss figure and table rows, and the numbers its cells computed in the last docs build."""

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from attention_tutorial.results import store
from attention_tutorial.site import claims
from attention_tutorial.site import training as page
from tests.built_pages import glued


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


def test_steady_rows_leave_out_the_rerun_and_runs_without_a_steady_state():
    rows = page.steady_rows(
        [
            _summary("cudnn", 20.0, 1000.0, 990.0, 1010.0),
            _summary("cudnn_twin", 20.1, 995.0, 985.0, 1005.0),
            _summary("mosaic", 19.0, 1050.0, 1040.0, 1060.0, mfu_measured_pct=None),
            {"impl": "te", "status": "error"},
            {"impl": "old", "status": "ok", "median_ms": 3.0},  # no steady state recorded
        ]
    )
    assert [r["implementation"] for r in rows] == ["cuDNN", "our Pallas kernel (Mosaic GPU)"]
    assert rows[0]["tokens/s"] == "1,000 (990–1,010)" and rows[0]["ms per step"] == "20.0 (19.6–20.4)"
    assert (rows[0]["MFU, % of datasheet"], rows[1]["MFU, % of measured matmul"]) == ("40.0", "–")


def _steps(impl, losses):
    return [{"impl": impl, "kind": "step", "step": 10 * i, "loss": v, "status": "ok"} for i, v in enumerate(losses)]


def test_loss_gaps_and_their_figure():
    recs = (
        _steps("cudnn", [5.0, 4.0, 3.0, 2.5])
        + _steps("mosaic", [5.0, 4.01, 2.98, 2.5])
        + _steps("xla", [5.0, 4.0, 3.0])  # one logged step fewer
        + _steps("cudnn_twin", [5.0, 4.05, 2.96, 2.52])
    )
    fig = page.loss_gap_figure(recs, title="synthetic")
    left, right = fig.axes[:2]
    assert np.allclose(left.lines[0].get_ydata(), [5.0, 4.0, 3.0, 2.5])  # the first implementation's loss
    drawn = {line.get_label(): line for line in right.lines}
    assert list(drawn)[1:] == ["our Pallas kernel (Mosaic GPU)", "XLA", "cuDNN, weights nudged by one rounding"]
    assert np.allclose(drawn["our Pallas kernel (Mosaic GPU)"].get_ydata(), [0.0, 0.01, -0.02, 0.0])
    assert list(drawn["XLA"].get_xdata()) == [0, 10, 20]  # the steps both logged
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
    times = {(r["impl"], r["command_buffers"], r["waiting"]): r for r in recs if r["status"] == "ok"}
    rows = page.dispatch_rows(times)
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
    got = page.bias_rows({(r["impl"], r["bias"]): r for r in rows if r["status"] == "ok"})
    assert [r["step with biases (ms)"] for r in got] == ["13.00 (12.90–13.20)", "13.10 (13.00–13.30)"]
    assert [r["step without (ms)"] for r in got] == ["12.50 (12.40–12.70)", "–"]
    assert got[0]["MFU without (%)"] == f"{530 / 12.5:.1f}" and got[1]["MFU without (%)"] == "–"
    assert page.bias_rows({}) == []


# --- the built page: what its cells computed from the recording -------------------------------------------------------


@pytest.fixture(scope="module")
def built():
    """What the page's cells glued in the last docs build, as Python values (Markdown as its text)."""
    return glued("training")


def _recorded(grid):
    return store.select(store.recorded()["records"], grid=grid)


def test_the_steady_state_verdict_follows_the_two_runs_ranges(built):
    runs = {r["impl"]: r for r in _recorded("train") if r["kind"] == "summary" and r["status"] == "ok"}
    ours, cudnn = runs["mosaic"], runs["cudnn"]
    assert built["mosaic_vs_cudnn"] == f"{ours['steady_tokens_per_s'] / cudnn['steady_tokens_per_s']:.2f}"
    apart = (ours["steady_tokens_per_s_p10"] > cudnn["steady_tokens_per_s_p90"]) or (
        ours["steady_tokens_per_s_p90"] < cudnn["steady_tokens_per_s_p10"]
    )
    assert (built["mosaic_word"] == "on par") != apart
    assert built["mosaic_ranges"] == ("do not overlap" if apart else "overlap")
    # the measured peak the MFU divides by: TFLOP/s over MFU
    assert built["peak_measured"] == f"{100 * ours['steady_tflops'] / ours['mfu_measured_pct']:.0f}"


def test_the_noise_floor_is_set_against_the_losss_own_motion(built):
    y = claims.loss_yardstick([r for r in _recorded("train") if r["kind"] == "step"])
    assert built["rec_floor"] == f"{y.limit:.1e}" and built["rec_share"] == f"{100 * y.limit / y.motion:.2g} %"


def test_the_step_profile_splits_the_step_as_recorded(built):
    prof = {(r["impl"], r["embedding"]): r for r in _recorded("train_profile") if r["status"] == "ok"}
    gather, onehot = prof["cudnn", "gather"], prof["cudnn", "onehot"]
    assert built["scatter_ms"] == f"{gather['groups_us']['embedding gradient'] / 1000:.1f}"
    assert built["attention_share"] == f"{100 * onehot['groups_us']['attention'] / 1000 / onehot['device_ms']:.0f}"
    parts = [float(built[k]) for k in ("onehot_device_ms", "onehot_idle_ms", "onehot_outside_ms")]
    assert sum(parts) == pytest.approx(float(built["onehot_host_ms"]), abs=0.051)  # the parts add up to the step


def test_the_bias_numbers_come_from_the_tuning_table(built):
    step = {(r["impl"], r["bias"]): r["step_ms"] for r in store.tuning("train")["rows"]}
    assert (built["b_with"], built["b_without"]) == (f"{step['mosaic', True]:.2f}", f"{step['mosaic', False]:.2f}")
    assert built["tune_train"] == "NVIDIA H200, commit unknown"  # measured before tables carried a commit


def test_the_memory_sentence_reads_the_fit(built):
    assert built["mem_naive_word"] == "grows quadratically in T"
    assert float(built["mem_naive"]) > 4 * float(built["mem_blockwise"])  # T × 4: the naive's grew far more
