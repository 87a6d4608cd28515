"""What the pages use to show results: the live run of this build beside the recorded GPU reference.

Every benchmark section of the site calls ``show_live`` (runs a named grid here, now) and ``show_recorded``
(reads ``attention_tutorial/results/data/<gpu>.json``, written by the recorder on the GPU), and each output is labelled with the
hardware, versions and date it came from. No number is typed into a page.
"""

from __future__ import annotations

import jax
import matplotlib.pyplot as plt

from ..env import environment
from ..measure.grids import points
from ..measure.sweep import run_sweep
from . import store
from .plotting import markdown_table, plot_records

REFERENCE_GPU = "nvidia-h200"


def live_label() -> str:
    """One line naming this build's device and versions."""
    env = environment()
    device = env["gpu"] or f"CPU ({env['cpu']})"
    cudnn = f", cuDNN {env['cudnn']}" if env["cudnn"] else ""
    return f"**Live, this build:** {device}, JAX {env['jax']}{cudnn}, {env['created'][:10]}"


def timing_options() -> dict:
    """Repeats and time caps for live page runs: full on a GPU, brief on a CPU build."""
    if jax.default_backend() == "gpu":
        return {"repeats": 10, "max_seconds": 0.3}
    return {"repeats": 5, "max_seconds": 0.3, "min_sample_ms": 5.0}


def run_live(grid_name: str, **where) -> list[dict]:
    """Run the grid ``grid_name`` (its live size for this backend), keeping points that match ``where``."""
    pts = [p for p in points(grid_name, live=True) if all(getattr(p, k) == v for k, v in where.items())]
    return run_sweep(pts, **timing_options())


def reference(grid_name: str | None = None, **where):
    """(records, provenance) of the recorded reference, filtered; (None, None) when no file is committed."""
    data = store.recorded(REFERENCE_GPU)
    if data is None:
        return None, None
    recs = data["records"] if grid_name is None else store.select(data["records"], grid=grid_name)
    return store.select(recs, **where), data["provenance"]


def _show(records, columns, plot, title):
    from IPython.display import Markdown, display

    display(Markdown(markdown_table(records, columns)))
    if plot:
        fig = plot_records(records, title=title, **plot)
        display(fig)
        plt.close(fig)


def show_live(records, columns, *, plot=None, title="") -> None:
    """Display live records (table, then the plot ``plot`` describes), under the live label."""
    from IPython.display import Markdown, display

    display(Markdown(live_label()))
    _show(records, columns, plot, f"{title} — live, {environment()['gpu'] or 'CPU'}")


def show_recorded(grid_name, columns, *, plot=None, title="", peak_line=False, include=None, **where) -> list[dict]:
    """Display the recorded reference for ``grid_name`` under a label naming its GPU, versions and date.

    ``include`` ({other grid: {field: value}}) adds records of other grids measured at the same shapes (say, the
    naive and XLA baselines of ``seq_long`` to the FlashAttention race), filtered by ``where`` too.
    """
    from IPython.display import Markdown, display

    recs, prov = reference(grid_name, **where)
    if recs is not None:
        for other, fields in (include or {}).items():
            recs = reference(other, **{**where, **fields})[0] + recs
    if recs is None:
        display(Markdown("*No recorded GPU results are committed yet (`python -m attention_tutorial record`).*"))
        return []
    display(Markdown(f"**Recorded on the GPU:** {store.describe(prov, grid_name)}."))
    if plot and peak_line:
        peak = prov.get("grids", {}).get(grid_name, {}).get("matmul_bf16_tflops", prov["matmul_bf16_tflops"])
        plot = {**plot, "hline": peak if plot.get("y") == "tflops" else 100.0,
                "hline_label": "bf16 matmul peak (measured in that run)"}  # fmt: skip
    _show(recs, columns, plot, f"{title} — recorded, {prov['gpu']}")
    return recs
