"""Figures and tables from records: TFLOP/s, % of peak, GB/s, milliseconds, memory.

Figures draw on an opaque white card with the Okabe–Ito colour-blind-safe palette, so they read the same in the
site's light and dark modes. Each implementation keeps one colour and one marker on every page (``IMPL_STYLE``);
line styles tell the other key (causal or not, forward or backward) apart. More than six lines on one axes are
split into panels. Tables come out as Markdown, with human names and units in their headers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import matplotlib.pyplot as plt

from .. import registry
from ..train import TWIN

GREY = "#555555"  # reference lines and quiet labels
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.")
# one fixed colour and marker per implementation, the same on every page
IMPL_STYLE = {
    "naive": (PALETTE[7], "o"),
    "xla": (PALETTE[0], "s"),
    "default": (PALETTE[5], "v"),
    "cudnn": (PALETTE[3], "D"),
    "blockwise": ("#7F7F7F", "P"),
    "pallas": (PALETTE[1], "^"),
    "jax_pallas": (PALETTE[5], "X"),
    "mosaic": (PALETTE[2], "*"),
    "mosaic_pipe": ("#005A3C", "d"),
    "mosaic_atomic": ("#7CAE00", "*"),
    "jax_mosaic": (PALETTE[4], "h"),
    "te": (PALETTE[4], "p"),
    "cudnn_fp8_s1": (PALETTE[1], "<"),
    "cudnn_fp8_s448": (PALETTE[2], ">"),
    "mosaic_fp8": ("#8B4513", "8"),
    "mosaic_fp8_regs": ("#B8860B", "H"),
}
# names for the implementations of the FP8 experiments, which are not in the registry
EXTRA_LABELS = {
    "cudnn_fp8_s1": "cuDNN FP8 (P scale 1)",
    "cudnn_fp8_s448": "cuDNN FP8 (P scale 448)",
    "mosaic_fp8": "our Pallas kernel (Mosaic GPU), FP8, p via shared memory",
    "mosaic_fp8_regs": "our Pallas kernel (Mosaic GPU), FP8, p in registers",
    "te_autocast": "TransformerEngine under te.autocast",
    "te_dense_bf16": "TE DenseGeneral, bf16",
    "te_dense_fp8": "TE DenseGeneral, FP8 (autocast)",
    "cp_local": "local step alone (one call)",
    "cp_ring_1dev": "ring code on a one-device mesh",
    "cp_emulated_P2": "2 ring steps, emulated on one device",
    "cp_emulated_P4": "4 ring steps, emulated on one device",
    "cp_emulated_P8": "8 ring steps, emulated on one device",
}
MAX_LINES_PER_AXES = 6
SCALE = {"temp_bytes": 2**20}  # plotted in the unit of its axis label (bytes as MiB)
YLABELS = {
    "tflops": "TFLOP/s",
    "pct_peak": "% of the bf16 matmul measured on this GPU",
    "pct_datasheet": "% of datasheet dense bf16 peak",
    "gbps": "GB/s (fewest bytes / time)",
    "median_ms": "ms per call (median)",
    "temp_bytes": "compiled temporaries (MiB)",
}
XLABELS = {
    "seq_q": "T (query length)",
    "seq_kv": "S (key length)",
    "batch": "B (batch)",
    "head_dim": "H (head dim)",
    "kv_heads": "K (kv heads)",
}


def label(impl: str) -> str:
    """The display name of an implementation (the registry's label, or the name itself)."""
    if impl in registry.IMPLEMENTATIONS:
        return registry.IMPLEMENTATIONS[impl].label
    if impl.endswith(TWIN) and impl.removesuffix(TWIN) in registry.IMPLEMENTATIONS:  # a training run's twin
        return f"{registry.IMPLEMENTATIONS[impl.removesuffix(TWIN)].label}, weights nudged by one rounding"
    return EXTRA_LABELS.get(impl, impl)


def impl_style(impl: str, fallback: int = 0) -> tuple[str, str]:
    """(colour, marker) of an implementation: fixed for the known ones (a twin run in black), from the palette
    otherwise."""
    if impl.endswith(TWIN):
        return ("#000000", ".")
    return IMPL_STYLE.get(impl, (PALETTE[fallback % len(PALETTE)], MARKERS[fallback % len(MARKERS)]))


def plot_records(
    records,
    *,
    x="seq_q",
    y="tflops",
    by=("impl",),
    ax=None,
    title=None,
    logx=True,
    logy=False,
    hline=None,
    hline_label=None,
    overlap=None,
):
    """One line per distinct ``by`` tuple, ``y`` against ``x``, from ok records; p10–p90 as a band for ms plots.

    ``hline`` draws a reference level (e.g. the bf16 matmul measured in the run). With more than six lines and a second ``by`` field, one
    panel per value of that field. Series whose points agree within ``overlap`` (relative; default
    :data:`OVERLAP`, meant for speed and memory plots) are drawn once under both names; ``overlap=0`` merges only
    identical series (loss curves, whose small differences are the point). Returns the figure.
    """
    by = _check_fields(by, "by")
    ok = [r for r in records if r.get("status") == "ok" and r.get(y) is not None]
    if any(x not in r for r in ok):
        fields = sorted(next(r for r in ok if x not in r))
        raise ValueError(f"x={x!r}: a record to plot has no such field; pick one it has, e.g. one of {fields[:14]}")
    series: dict[tuple, list] = {}
    for r in ok:
        series.setdefault(tuple(r.get(b) for b in by), []).append(r)
    rests = list(dict.fromkeys(key[1:] for key in series))
    split = ax is None and len(series) > MAX_LINES_PER_AXES and len(rests) > 1
    if ax is None:
        n = len(rests) if split else 1
        fig, axes = plt.subplots(
            1,
            n,
            figsize=(5.2 * n if split else 7.0, 4.2),
            facecolor="white",
            layout="constrained",
            sharey=True,
            squeeze=False,
        )
        axes = list(axes[0])
    else:
        fig, axes = ax.figure, [ax]
    firsts = list(dict.fromkeys(key[0] for key in series))
    for rs in series.values():
        rs.sort(key=lambda r: r[x])
    tol = OVERLAP if overlap is None else overlap
    same = _identical_series(series, x, y, split, tol)
    for key, rs in series.items():
        if key in same and same[key] is None:
            continue  # drawn as part of an identical series, under a joint name
        j = rests.index(key[1:])
        target = axes[j] if split else axes[0]
        xs, ys = [r[x] for r in rs], [r[y] / SCALE.get(y, 1) for r in rs]
        if by[0] == "impl":
            colour, marker = impl_style(key[0], firsts.index(key[0]))
        else:
            colour, marker = PALETTE[firsts.index(key[0]) % len(PALETTE)], MARKERS[firsts.index(key[0]) % len(MARKERS)]
        shown = 1 if split else len(by)  # in a panel, the panel's title names the other fields
        name = ", ".join(label(k) if b == "impl" else _fmt_key(b, k) for b, k in list(zip(by, key))[:shown])
        if same.get(key):  # other series with exactly these points: one line, both names
            others = [
                ", ".join(label(k) if b == "impl" else _fmt_key(b, k) for b, k in list(zip(by, o))[:shown])
                for o in same[key]
            ]
            exact = all([(r[x], r[y]) for r in series[o]] == [(r[x], r[y]) for r in rs] for o in same[key])
            name = " = ".join([name, *others]) + (" (identical)" if exact else f" (within {100 * tol:g} %)")
        style = "-" if split else LINESTYLES[j % len(LINESTYLES)]
        if split:
            target.set_title(", ".join(_fmt_key(b, k) for b, k in zip(by[1:], key[1:])), fontsize=10)
        target.plot(xs, ys, marker=marker, color=colour, linestyle=style, label=name, linewidth=1.8, markersize=5)
        if y == "median_ms" and all("p10_ms" in r for r in rs):
            target.fill_between(
                xs, [r["p10_ms"] for r in rs], [r["p90_ms"] for r in rs], color=colour, alpha=0.2, linewidth=0
            )
    for a in axes:
        a.set_facecolor("white")
        if hline:
            a.axhline(hline, color=GREY, linestyle=(0, (6, 3)), linewidth=1.2, label=hline_label)
        if logx:
            a.set_xscale("log", base=2)
        if logy:
            a.set_yscale("log")
        a.set_xlabel(XLABELS.get(x, x))
        a.grid(True, which="major", color="#dddddd", linewidth=0.8)
    axes[0].set_ylabel(YLABELS.get(y, y))
    if title:
        fig.suptitle(title, fontsize=11) if split else axes[0].set_title(title, fontsize=11)
    _legend(fig, axes, split)
    return fig


# The fields that set a point's shape, in the order the shape legend names them.
SHAPE_FIELDS = ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim", "dtype", "mask", "pass", "causal")


def _values(records, field) -> list:
    return list(dict.fromkeys(r.get(field) for r in records if field in r))


def _tokens(records, x) -> int | None:
    """B·T when batch changes with ``x`` = seq_q and their product stays one number, else None."""
    if x != "seq_q" or len(_values(records, "batch")) < 2:
        return None
    products = {r["batch"] * r["seq_q"] for r in records if "batch" in r and "seq_q" in r}
    return products.pop() if len(products) == 1 else None


def series_fields(records, *, x="seq_q", by=("impl",)) -> tuple[str, ...]:
    """``by`` plus every shape field that varies among ``records`` (other than ``x``, and batch where B·T is fixed):
    so that a line never joins points of different shapes."""
    by = _check_fields(by, "by")
    tied = {"batch"} if _tokens(records, x) else set()
    varies = [f for f in SHAPE_FIELDS if f not in (x, *by, *tied) and len(_values(records, f)) > 1]
    if "seq_kv" in varies and all(r.get("seq_kv") == r.get("seq_q") for r in records):
        varies.remove("seq_kv")  # S = T: it varies with T, said in the shape words
    return (*by, *varies)


def _span(values) -> str:
    nums = sorted(v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool))
    if len(nums) == len(values) and len(nums) > 1:
        return f"{nums[0]:g}–{nums[-1]:g}"
    return "/".join(_fmt_value(v) for v in values)


def _fmt_value(v) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def shape_words(records, *, x="seq_q", by=("impl",)) -> str:
    """What ``records`` hold (their ok points), in the shape legend: 'B = 4, S = T, N = 8, K = 8, H = 64, bfloat16,
    forward'. A field that varies but is neither ``x`` nor in ``by`` gives its range; a batch that falls as T grows
    with B·T fixed says so ('B·T = 8192 fixed (B 8–1)')."""
    recs = [r for r in records if r.get("status", "ok") == "ok"] or list(records)
    words = []
    tokens = _tokens(recs, x)
    for field in SHAPE_FIELDS:
        values = _values(recs, field)
        if field in (x, *by) or not values:
            continue
        if field == "batch" and tokens:
            batches = [r["batch"] for r in sorted(recs, key=lambda r: r["seq_q"])]
            words.append(f"B·T = {tokens} fixed (B {batches[0]}–{batches[-1]} as T grows)")
        elif field == "seq_kv" and all(r.get("seq_kv") == r.get("seq_q") for r in recs):
            words.append("S = T")
        elif field in ("dtype", "mask", "pass", "causal") and len(values) == 1:
            words.append(_fmt_key(field, values[0]) if field in ("pass", "causal") else f"{field} {values[0]}")
        else:
            words.append(f"{COLUMNS.get(field, (field,))[0]} = {_span(values)}")
    return ", ".join(words)


def differences(
    mine, theirs, *, fields=("dtype", "seq_q", "seq_kv", "batch", "heads", "kv_heads", "head_dim", "mask", "pass")
) -> list[str]:
    """How two sets of records differ in what they measured: ['dtype float32 vs bfloat16', 'T 256–2048 vs
    1024–32768', ...] (empty when like is set against like); ok points only."""
    a = [r for r in mine if r.get("status", "ok") == "ok"]
    b = [r for r in theirs if r.get("status", "ok") == "ok"]
    out, skip = [], set()
    if all(r.get("seq_kv") == r.get("seq_q") for r in a + b):
        skip.add("seq_kv")  # S = T on both sides: the T range says it
    ta, tb = _tokens(a, "seq_q"), _tokens(b, "seq_q")
    if ta and tb:  # batch moves with T on both sides: compare B·T instead
        skip.add("batch")
        if ta != tb:
            out.append(f"B·T {ta} vs {tb}")
    for field in fields:
        if field in skip:
            continue
        va, vb = _values(a, field), _values(b, field)
        if va and vb and sorted(map(str, va)) != sorted(map(str, vb)):
            name = field if field in ("dtype", "mask", "pass") else COLUMNS.get(field, (field,))[0]
            out.append(f"{name} {_span(va)} vs {_span(vb)}")
    return out


def _check_fields(fields, name) -> tuple[str, ...]:
    """``fields`` as a tuple of names; a ``TypeError`` naming ``name`` for a bare string or a non-name."""
    out = () if isinstance(fields, str) else tuple(fields)
    if isinstance(fields, str) or not all(isinstance(f, str) for f in out):
        raise TypeError(f"{name} must be a tuple of record field names, e.g. ('impl', 'causal'); got {fields!r}")
    return out


OVERLAP = 0.005  # series within this relative difference at every x overlap on a plot: drawn once, both named


def _overlapping(pa, pb, tol) -> bool:
    return [p[0] for p in pa] == [p[0] for p in pb] and all(
        abs(ya - yb) <= tol * max(abs(ya), abs(yb)) for (_, ya), (_, yb) in zip(pa, pb)
    )


def _identical_series(series, x, y, split, tol) -> dict:
    """{first key: [later keys with its points], later key: None} for series drawn on one axes whose (x, y) points
    agree within ``tol`` (relative) — drawn once, or the later line would hide the first and its legend entry lie."""
    out: dict = {}
    keys = list(series)
    for i, a in enumerate(keys):
        if a in out:
            continue
        pa = [(r[x], r[y]) for r in series[a]]
        for b in keys[i + 1 :]:
            pb = [(r[x], r[y]) for r in series[b]]
            if b not in out and (not split or a[1:] == b[1:]) and _overlapping(pa, pb, tol):
                out.setdefault(a, []).append(b)
                out[b] = None
    return out


def _legend(fig, axes, split):
    """One legend for the figure, beside the last axes, never over the data."""
    handles, names = {}, []
    for a in axes:
        for h, n in zip(*a.get_legend_handles_labels()):
            if n not in handles:
                handles[n] = h
                names.append(n)
    if not names:
        return
    if not split and len(names) > MAX_LINES_PER_AXES:
        fig.set_size_inches(10.0, 4.6)
    axes[-1].legend(
        [handles[n] for n in names],
        names,
        fontsize=8,
        frameon=True,
        facecolor="white",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )


def _fmt_key(field, value):
    if field == "causal":
        return "causal" if value else "no mask"
    if field == "pass":
        return {"fwd": "forward", "fwd+bwd": "forward + backward"}.get(value, value)
    return f"{COLUMNS.get(field, (field,))[0]} = {value}"


COLUMNS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "impl": ("implementation", label),
    "batch": ("B", str),
    "seq_q": ("T", str),
    "seq_kv": ("S", str),
    "heads": ("N", str),
    "kv_heads": ("K", str),
    "head_dim": ("H", str),
    "dtype": ("dtype", str),
    "causal": ("causal", lambda c: "yes" if c else "no"),
    "status": ("status", str),
    "median_ms": ("median (ms)", lambda v: f"{v:.4g}"),
    "p10_ms": ("p10 (ms)", lambda v: f"{v:.4g}"),
    "p90_ms": ("p90 (ms)", lambda v: f"{v:.4g}"),
    "single_call_ms": ("one waited call (ms)", lambda v: f"{v:.4g}"),
    "dispatch_ms": ("dispatch (ms)", lambda v: f"{v:.3g}"),
    "compile_s": ("compile (s)", lambda v: f"{v:.2f}"),
    "tflops": ("TFLOP/s", lambda v: f"{v:.4g}"),
    "pct_peak": ("% of measured matmul", lambda v: f"{v:.1f}"),
    "pct_datasheet": ("% of datasheet peak", lambda v: f"{v:.1f}"),
    "gbps": ("GB/s", lambda v: f"{v:.4g}"),
    "pct_read": ("% read ceiling", lambda v: f"{v:.1f}"),
    "temp_bytes": ("temporaries", lambda v: size_text(v)),
    "per_t2": ("bytes per T²", lambda v: f"{v:.1f}"),
    "matrices": ("float32 T×T matrices per head", lambda v: f"{v:.2f}"),
    "recorded_ms": ("recorded median (ms)", lambda v: f"{v:.4g}"),
    "live_over_recorded": ("live / recorded time", lambda v: f"{v:.2f}"),
    "window": ("window (keys)", str),
    "mask": ("mask", str),
    "pass": ("pass", lambda v: {"fwd": "forward", "fwd+bwd": "forward + backward"}.get(v, v)),
    "kernel": ("kernel that ran", str),
    "custom_calls": ("custom calls in the compiled program", str),
    "local": ("local step", lambda v: {"mosaic": "our Mosaic GPU kernel", "blockwise": "blockwise JAX"}.get(v, v)),
    "vs_local": ("time / local step's", lambda v: f"{v:.3g}"),
    "reason": ("why not", lambda r: reason_text(r)),
    "backend": ("backend chosen", str),
    "rel_error": ("relative error vs float32", lambda v: f"{v:.3g}"),
    "max_abs_diff_vs_bf16": ("max abs. difference from bf16", lambda v: f"{v:.3g}"),
    "fp8_types_in_hlo": ("FP8 types in HLO", lambda v: ", ".join(v) or "none"),
}


def size_text(nbytes) -> str:
    """Bytes in the unit that reads best: '512 B', '14.1 KiB', '36.0 MiB', '12.0 GiB' (binary units)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}" if nbytes / size < 100 else f"{nbytes / size:,.0f} {unit}"
    return f"{nbytes:.0f} B"


def reason_text(text) -> str:
    """A failure's reason for a table: XLA's allocator tags (``[tf-allocator-allocation-error='']``, …) left out, an
    allocator's out-of-memory report said in a few words, and the ``Unsupported:`` the status already says dropped."""
    text = re.sub(r"\s*\[[a-z_-]+='[^']*'\]", "", str(text)).strip()
    if oom := re.search(r"RESOURCE_EXHAUSTED: Out of memory while trying to allocate ([\d.]+) ?([KMGT]i?B)", text):
        return f"out of memory ({oom[1]} {oom[2]} requested)"
    return text.removeprefix("Unsupported: ")


def cell(text) -> str:
    """Text safe inside a Markdown table cell: no pipes, newlines or dollar signs (MyST reads $…$ as math)."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("$", "\\$")


def markdown_table(records, columns) -> str:
    """A Markdown table of ``records`` with the given fields; a point that did not run says its status once (in the
    status column, else in its first missing value) and "–" in the other value columns."""
    columns = _check_fields(columns, "columns")
    head = [cell(COLUMNS.get(c, (c, str))[0]) for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(columns)]
    values = ("median_ms", "tflops", "gbps", "pct_peak", "pct_datasheet")
    for r in records:
        cells = []
        said = "status" in columns  # the status column says it already
        for c in columns:
            v = r.get(c)
            if v is None and c in values and r.get("status") != "ok" and not said:
                cells.append(f"*{r.get('status')}*")
                said = True
            elif v is None:
                cells.append("–")
            else:
                cells.append(cell(COLUMNS.get(c, (c, str))[1](v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def show_table(records, columns=None):
    """``markdown_table`` as a notebook Markdown object (display it, or end a cell with it); ``columns`` default to
    the first record's fields."""
    from IPython.display import Markdown

    if not records:
        return Markdown("*(no rows)*")
    return Markdown(markdown_table(records, list(columns or records[0])))
