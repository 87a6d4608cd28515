import numpy as np
import pytest

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
        "mfu_measured_pct": 57.0,
        "steady_from": 30,
        **extra,
    }


def test_steady_states_and_the_tokens_verdict():
    states = page.steady(
        [
            _summary("cudnn", 20.0, 1000.0, 990.0, 1010.0),
            _summary("mosaic", 19.0, 1050.0, 1040.0, 1060.0),
            _summary("xla", 30.0, 1005.0, 995.0, 1015.0),
            {"impl": "te", "status": "error"},
            {"impl": "old", "status": "ok", "median_ms": 3.0},
        ]
    )  # no steady state recorded
    assert [s.impl for s in states] == ["cudnn", "mosaic", "xla"]
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
