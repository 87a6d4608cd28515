"""Race our Mosaic GPU kernels against cuDNN (or XLA where cuDNN has no such mask), interleaved in one process.

Each case times every contender once per round, in turn, so clocks and heat fall on all alike; a contender's
number is the median of its rounds' medians, its spread the lowest and highest round. Before timing, each
contender's output (the forward's, or dQ with the backward) is checked against the baseline's: a wrong kernel is
reported with its error, not timed. TFLOP/s count the kept scores only (4·N·H per kept score, ×3.5 with the
backward). Every case carries the commit and dirty flag of the code (:func:`~attention_tutorial.env.code_version`),
our kernel's resolved config, the SM clock before and after it, and when it ran.

``python -m attention_tutorial record --grids --extras race`` keeps the cases in the result file's provenance
(``race``, by case name, saved after each); :func:`race_records` runs them without a file.
"""

from __future__ import annotations

import dataclasses
import functools
import subprocess
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from ..env import code_version, timestamp
from ..inputs import make_qkv
from .fp8 import rel_error
from .timing import time_fn

GROUPS = ("forward", "schedule", "short", "masks", "masks_backward", "backward", "fa3")
ROUNDS = 3
TOKENS = 32 * 1024  # B·T of each case at T = 8192
N = 16
T = 8192
# FlashAttention-3's forward benchmark grid (its paper's, arXiv 2407.08608): 16k tokens in a batch (B·T), hidden
# size 2048 (N·H), head dims 64/128/256, sequence lengths 512 to 16k, without a mask and causal.
FA3_TOKENS, FA3_HIDDEN = 16 * 1024, 2048
FA3_HEAD_DIMS, FA3_SEQ = (64, 128, 256), (512, 1024, 2048, 4096, 8192, 16384)
SHORT_SEQ = (512, 1024, 2048)  # the "short" group: persistent CTAs where a CTA's start and end weigh most
MAX_ERROR = 0.05  # relative error above which a contender is reported wrong and not timed


@dataclasses.dataclass(frozen=True)
class Case:
    """One race: a shape (B, T, S, N, K, H), our mask's keyword arguments, the contenders by label, the pass
    ("fwd" or "fwd+bwd") and the baseline's label (the others are checked against it and divided by it). A
    contender whose label ends in ", causal" computes the plain causal mask instead: timed beside, not checked."""

    group: str
    name: str
    shape: tuple[int, int, int, int, int, int]
    mask: dict
    contenders: dict
    pass_: str
    baseline: str


def clocks() -> str:
    """The SM clock, its maximum, temperature and power, as nvidia-smi says them ('' without nvidia-smi)."""
    try:
        q = "clocks.sm,clocks.max.sm,temperature.gpu,power.draw"
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def kept_scores(B, T, S, **mask_args) -> float:
    """How many (query, key) scores the mask keeps over the batch."""
    from ..kernels.mosaic.masks import dense, make_mask

    mask, arrays = make_mask(B, T, S, **mask_args)
    return float(dense(mask, arrays, B).sum())


def _config(head_dim, *, pipeline=False, **changes):
    from ..kernels.mosaic import default_config

    return dataclasses.replace(default_config(head_dim, pipeline=pipeline), **changes)


def ours(head_dim, *, pipeline=False, config: dict | None = None, **mask):
    """Our kernel with ``head_dim``'s default config, ``config`` changing some of its fields."""
    from ..kernels.mosaic import mosaic_flash_attention

    cfg = _config(head_dim, pipeline=pipeline, **(config or {}))
    return functools.partial(mosaic_flash_attention, config=cfg, **mask)


def cudnn(**mask):
    from ..kernels.fused import dot_product_attention

    return functools.partial(dot_product_attention, implementation="cudnn", **mask)


def xla(**mask):
    from ..kernels.fused import dot_product_attention

    return functools.partial(dot_product_attention, implementation="xla", **mask)


def with_grad(fn):
    """Forward and backward: the three gradients of sum(out · dO)."""

    def f(q, k, v, d_out):
        out, vjp = jax.vjp(fn, q, k, v)
        return vjp(d_out)

    f.__wrapped__ = fn  # the record keeps fn's kernel config
    return f


def document_ids(seq: int, rows: Iterable[Iterable[int]]) -> jax.Array:
    """(batch, seq) int32 segment ids: in each batch row, documents of that row's lengths packed one after another."""
    out = []
    for b, lengths in enumerate(rows):
        ids = np.repeat(np.arange(len(lengths := list(lengths)), dtype=np.int32), lengths)
        if ids.size != seq:
            raise ValueError(f"row {b}'s document lengths must add up to seq = {seq}; got {ids.size}")
        out.append(ids)
    return jnp.asarray(np.stack(out))


def mixed_lengths(seq: int, *, low: int = 256, high: int = 4096, seed: int = 0) -> list[int]:
    """Document lengths drawn uniformly from [low, high] until they fill ``seq`` (the last one cut to fit)."""
    rng, out = np.random.default_rng(seed), []
    while sum(out) < seq:
        out.append(int(rng.integers(low, high + 1)))
    out[-1] -= sum(out) - seq
    return out


def cases(groups=GROUPS) -> list[Case]:
    """The races of ``groups`` (see :data:`GROUPS`), at B·T = 32k tokens and N = 16 in bfloat16 (``fa3`` and
    ``short``: at FlashAttention-3's shapes, :data:`FA3_TOKENS` and :data:`FA3_HIDDEN`)."""
    unknown = set(groups) - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown race groups {sorted(unknown)}; choose from {', '.join(GROUPS)}")
    B, out = TOKENS // T, []
    if "forward" in groups or "schedule" in groups:
        for H in (128, 256):
            for causal in (False, True):
                m = {"is_causal": causal}
                race = {
                    "cuDNN": cudnn(**m),
                    "ours": ours(H, **m),
                    "ours, turns": ours(H, config={"schedule": "turns"}, **m),
                }
                if "schedule" in groups:
                    race["ours, pipelined"] = ours(H, pipeline=True, **m)
                    if causal:  # the blocks with the most keys first
                        race["ours, heavy first"] = ours(H, config={"heavy_first": True}, **m)
                    if H == 128:  # FlashAttention-3's longer key tiles: 176 keys at H = 128, 80 at H = 256
                        race["ours, 176 keys"] = ours(H, config={"block_kv": 176}, **m)
                    else:
                        race["ours, 80 keys"] = ours(H, config={"block_kv": 80}, **m)
                name = f"H={H} {'causal' if causal else 'no mask'}"
                out.append(Case("forward", name, (B, T, T, N, N, H), m, race, "fwd", "cuDNN"))
    if "short" in groups:  # persistent CTAs (under a causal mask heaviest first, as their static order needs)
        for T_ in SHORT_SEQ:
            for causal in (False, True):
                m, H = {"is_causal": causal}, 128
                race = {"cuDNN": cudnn(**m), "ours": ours(H, **m)}
                if causal:
                    race["ours, heavy first"] = ours(H, config={"heavy_first": True}, **m)
                race["ours, persistent"] = ours(H, config={"persistent": True, "heavy_first": causal}, **m)
                shape = (FA3_TOKENS // T_, T_, T_, FA3_HIDDEN // H, FA3_HIDDEN // H, H)
                name = f"H={H} T={T_} {'causal' if causal else 'no mask'}"
                out.append(Case("short", name, shape, m, race, "fwd", "cuDNN"))
    H = 128
    four = document_ids(T, [[T // 4] * 4] * B)
    mixed = document_ids(T, [mixed_lengths(T, seed=b) for b in range(B)])
    if "masks" in groups:
        ragged = 8000
        for name, shape, m in [
            ("causal, T=8000", (4, ragged, ragged, N, N, H), {"is_causal": True}),
            ("sliding window 1024, causal", (B, T, T, N, N, H), {"is_causal": True, "local_window_size": (1023, 0)}),
            ("GQA 16/2, causal", (B, T, T, N, 2, H), {"is_causal": True}),
        ]:
            race = {"cuDNN": cudnn(**m), "ours": ours(H, **m), "ours, causal": ours(H, is_causal=True)}
            if "window" not in name:  # the same mask: nothing to set beside
                del race["ours, causal"]
            out.append(Case("masks", name, shape, m, race, "fwd", "cuDNN"))
        for name, seg in (
            ("4 packed documents of 2048, causal", four),
            ("packed documents of 256-4096, causal", mixed),
        ):
            m = {"is_causal": True, "segment_ids": seg}
            race = {
                "XLA": xla(is_causal=True, mask=seg[:, None, :, None] == seg[:, None, None, :]),
                "ours": ours(H, **m),
                "ours, causal": ours(H, is_causal=True),
                "cuDNN, causal": cudnn(is_causal=True),
            }
            out.append(Case("masks", name, (B, T, T, N, N, H), m, race, "fwd", "XLA"))
        m = {"is_causal": True, "prefix_length": jnp.full((B,), 2048, jnp.int32)}
        pos = jnp.arange(T)
        prefix_lm = (pos[None, :] <= pos[:, None]) | (pos[None, :] < 2048)
        race = {"XLA": xla(mask=prefix_lm[None, None]), "ours": ours(H, **m), "ours, causal": ours(H, is_causal=True)}
        out.append(Case("masks", "prefix-LM, prefix 2048", (B, T, T, N, N, H), m, race, "fwd", "XLA"))
    if "masks_backward" in groups:
        m = {"is_causal": True, "local_window_size": (1023, 0)}
        race = {"cuDNN": with_grad(cudnn(**m)), "ours": with_grad(ours(H, **m))}
        out.append(
            Case("masks_backward", "sliding window 1024, causal", (B, T, T, N, N, H), m, race, "fwd+bwd", "cuDNN")
        )
        m = {"is_causal": True, "segment_ids": mixed}
        race = {
            "XLA": with_grad(xla(is_causal=True, mask=mixed[:, None, :, None] == mixed[:, None, None, :])),
            "ours": with_grad(ours(H, **m)),
            "ours, causal": with_grad(ours(H, is_causal=True)),
            "cuDNN, causal": with_grad(cudnn(is_causal=True)),
        }
        out.append(
            Case(
                "masks_backward", "packed documents of 256-4096, causal", (B, T, T, N, N, H), m, race, "fwd+bwd", "XLA"
            )
        )
    if "fa3" in groups:
        for H in FA3_HEAD_DIMS:
            for T_ in FA3_SEQ:
                for causal in (False, True):
                    m = {"is_causal": causal}
                    shape = (FA3_TOKENS // T_, T_, T_, FA3_HIDDEN // H, FA3_HIDDEN // H, H)
                    name = f"H={H} T={T_} {'causal' if causal else 'no mask'}"
                    out.append(Case("fa3", name, shape, m, {"cuDNN": cudnn(**m), "ours": ours(H, **m)}, "fwd", "cuDNN"))
    if "backward" in groups:
        for H in (64, 128):
            for causal in (False, True):
                m = {"is_causal": causal}
                race = {
                    "cuDNN": with_grad(cudnn(**m)),
                    "ours": with_grad(ours(H, **m)),
                    "ours, S and dP together": with_grad(ours(H, config={"bwd_together": True}, **m)),
                    "ours, together, heavy first": with_grad(
                        ours(H, config={"bwd_together": True, "heavy_first": True}, **m)
                    ),
                }
                if H == 128:  # FlashAttention-3's dQ: the head dim split between the warpgroups
                    race["ours, dQ split"] = with_grad(ours(H, config={"bwd_dq": "split"}, **m))
                    split_together = {"bwd_dq": "split", "bwd_together": True}
                    race["ours, dQ split, together"] = with_grad(ours(H, config=split_together, **m))
                name = f"H={H} {'causal' if causal else 'no mask'}"
                out.append(Case("backward", name, (B, T, T, N, N, H), m, race, "fwd+bwd", "cuDNN"))
        for causal in (False, True):  # H = 256: the two warpgroups split the head dim (backward_split)
            m = {"is_causal": causal}
            race = {"cuDNN": with_grad(cudnn(**m)), "ours": with_grad(ours(256, **m))}
            if causal:
                race["ours, heavy first"] = with_grad(ours(256, config={"heavy_first": True}, **m))
            name = f"H=256 {'causal' if causal else 'no mask'}"
            out.append(Case("backward", name, (B, T, T, N, N, 256), m, race, "fwd+bwd", "cuDNN"))
    return out


def _mask_words(m: dict) -> dict:
    """The mask's arguments as the record keeps them (segment ids by their document lengths)."""
    out = {}
    for key, value in m.items():
        if key == "segment_ids":
            out["document_lengths"] = [np.unique(np.asarray(row), return_counts=True)[1].tolist() for row in value]
        elif key == "prefix_length":
            out[key] = np.asarray(value).tolist()
        else:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


def run_case(case: Case, *, rounds: int = ROUNDS, repeats: int = 10, max_seconds: float = 1.0) -> dict:
    """Time ``case`` (see the module's docstring): its record."""
    B, T_, S, n, K, H = case.shape
    started, clocks_before = timestamp(), clocks()
    q, k, v = make_qkv(B, T_, n, H, seq_kv=S, kv_heads=K, dtype=jnp.bfloat16, seed=T_ + H)
    args = (q, k, v) if case.pass_ == "fwd" else (q, k, v, jnp.ones_like(q) * 0.01)
    flops = 4.0 * n * H * kept_scores(B, T_, S, **case.mask) * (3.5 if case.pass_ == "fwd+bwd" else 1.0)
    compiled, errors, want = {}, {}, None
    for label in [case.baseline, *(c for c in case.contenders if c != case.baseline)]:
        try:
            compiled[label] = jax.jit(case.contenders[label]).lower(*args).compile()
            got = compiled[label](*args)
            got = got if case.pass_ == "fwd" else got[0]
            want = got if label == case.baseline else want
            checked = label != case.baseline and want is not None and not label.endswith(", causal")
            errors[label] = rel_error(got, want) if checked else None
        except Exception as e:  # reported, not timed
            errors[label] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            compiled.pop(label, None)
        if isinstance(errors[label], float) and errors[label] > MAX_ERROR:
            compiled.pop(label, None)
    per_round = {label: [] for label in compiled}
    for _ in range(rounds):
        for label, c in compiled.items():
            t = time_fn(None, *args, compiled=c, repeats=repeats, max_seconds=max_seconds)
            per_round[label].append(t.median_ms)
    rows = []
    for label in case.contenders:
        ms = per_round.get(label) or []
        med = float(np.median(ms)) if ms else None
        rows.append(
            {
                "contender": label,
                "rounds_ms": ms,
                "median_ms": med,
                "tflops": flops / med / 1e9 if med else None,
                "error": errors.get(label),
            }
        )
    base = next((r["median_ms"] for r in rows if r["contender"] == case.baseline), None)
    for r in rows:
        r["speed"] = base / r["median_ms"] if base and r["median_ms"] else None
    unwrapped = {label: getattr(fn, "__wrapped__", fn) for label, fn in case.contenders.items()}
    configs = {
        label: dataclasses.asdict(fn.keywords["config"])
        for label, fn in unwrapped.items()
        if isinstance(fn, functools.partial) and "config" in fn.keywords
    }
    return {
        "group": case.group,
        "case": case.name,
        "shape": list(case.shape),
        "pass": case.pass_,
        "baseline": case.baseline,
        "mask": _mask_words(case.mask),
        "flops": flops,
        "rows": rows,
        "configs": configs,
        "rounds": rounds,
        "created": started,
        "clocks_before": clocks_before,
        "clocks_after": clocks(),
        **code_version(),
    }


def race_records(groups=GROUPS, *, progress=True, **timing) -> dict:
    """Every case of ``groups`` raced (:func:`run_case`), by ``"group: case"``."""
    out = {}
    for case in cases(groups):
        rec = run_case(case, **timing)
        out[f"{case.group}: {case.name}"] = rec
        if progress:
            print(format_case(rec), flush=True)
    return out


def format_case(rec: dict) -> str:
    """A race's record as a few lines of text."""
    B, T_, S, n, K, H = rec["shape"]
    lines = [f"{rec['group']}: {rec['case']}  (B,T,S,N,K,H)=({B},{T_},{S},{n},{K},{H})"]
    for r in rec["rows"]:
        tf = f"{r['tflops']:7.1f}" if r["tflops"] else "      -"
        ratio = f"{r['speed']:.3f}" if r["speed"] else "  -  "
        spread = f"{min(r['rounds_ms']):.3f}-{max(r['rounds_ms']):.3f} ms" if r["rounds_ms"] else ""
        err = r["error"] if isinstance(r["error"], str) else (f"err {r['error']:.1e}" if r["error"] else "")
        lines.append(f"  {r['contender']:16} {tf} TFLOP/s  {ratio} of {rec['baseline']}  {spread}  {err}")
    return "\n".join(lines)
