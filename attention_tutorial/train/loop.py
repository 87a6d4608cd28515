"""Training: AdamW steps on the stdlib corpus, timed one by one, returned as result records.

``train_records(impl, steps=..., config=..., seed=...)`` trains a fresh model with the attention ``impl`` and
returns one record per logged step (loss, step time, tokens/s, TFLOP/s, peak device memory) and a summary. The
same seed gives the same initial parameters and the same batches whatever the attention, so runs compare
directly. Timing: the train step is compiled first (``compile_s``, the parameters and optimizer state donated: each
step updates them in place) and run once on a throw-away copy of the state (warm-up). Then ``wait_every`` steps at a
time are dispatched back to back and waited for once (``block_until_ready``), their batches already on the device;
each of them is given the group's time over its size. With ``wait_every=1`` that is each step's own time; with more,
the host queues the next step while the device runs the current one, as a training loop that does not read every
loss at once does. The summary's steady state leaves out the learning-rate
warm-up's steps (at most half the run): its step time (median, p10, p90), tokens/s with the same spread, and the
model FLOP utilisation (MFU) against the datasheet's dense bf16 peak and a measured bf16 matmul (a reference on
this card), from the
FLOPs per token the model's shapes give (:func:`flops_per_token`).

A run whose loss turns NaN or infinite stops there: its summary has status "error", the step (``failed_step``)
and the loss, and no timings.
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import registry
from ..inputs import check_int, check_number
from ..measure.compiled import compile_stats
from ..measure.flops import attention_flops, datasheet_peak, peak_for
from ..measure.timing import summarize
from . import TWIN
from .data import Corpus, batch_at, load_corpus
from .model import GPT, TINY, Config, matmul_flops_per_token


class TrainResult(NamedTuple):
    """Per-step records and the run's summary record."""

    records: list[dict]
    summary: dict


def loss_fn(model, params, tokens):
    """Mean next-byte cross-entropy (nats) of ``tokens`` (B, T + 1)."""
    if np.ndim(tokens) != 2 or np.shape(tokens)[1] < 2:
        raise ValueError(f"tokens must be (B, T + 1) with T >= 1 (inputs and the next bytes); got {np.shape(tokens)}.")
    logits = model.apply({"params": params}, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def optimizer(config: Config, steps: int):
    """AdamW with linear warm-up and cosine decay to a tenth, gradients clipped to norm 1."""
    steps = check_int("steps", steps, minimum=1, example="200")
    warmup = min(config.warmup_steps, max(steps - 1, 0))
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, warmup, max(steps, warmup + 1), end_value=config.learning_rate / 10
    )
    return optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=config.weight_decay)
    )


def init_params(config: Config, seed: int):
    """The model's initial parameters for ``seed`` (independent of the attention implementation)."""
    return _init(config, jax.random.key(check_int("seed", seed, minimum=0)))


@functools.partial(jax.jit, static_argnums=0)  # one program: run op by op, every initialiser would compile apart
def _init(config: Config, key):
    return GPT(config).init(key, jnp.zeros((1, config.seq_len), jnp.int32))["params"]


def rounding_step(dtype) -> float:
    """The relative size of one step of ``dtype``'s rounding grid: its machine epsilon, 2^-(stored mantissa bits)
    (half of it can round straight back to the value it started from)."""
    try:
        floating = jnp.issubdtype(jnp.dtype(dtype), jnp.floating)
    except TypeError:
        floating = False
    if not floating:
        raise ValueError(f"dtype must be a floating type such as 'bfloat16'; got {dtype!r:.60}.")
    return float(jnp.finfo(jnp.dtype(dtype)).eps)


def perturb_params(params, rel: float, seed: int):
    """``params`` with each entry nudged up or down by ``rel`` times itself, the signs drawn at random from ``seed``: a
    difference of the size one rounding makes, to see how far rounding alone moves a training run."""
    rel = check_number("rel", rel, non_negative=True, example="2**-7")
    return _perturb(params, rel, jax.random.key(check_int("seed", seed, minimum=0)))


@jax.jit
def _perturb(params, rel, key):
    leaves, tree = jax.tree.flatten(params)
    signs = jax.random.rademacher(key, (sum(x.size for x in leaves),), jnp.float32)  # one draw for all: one sampler
    ends = np.cumsum([x.size for x in leaves])
    signs = [s.reshape(x.shape).astype(x.dtype) for s, x in zip(jnp.split(signs, ends[:-1]), leaves)]
    return jax.tree.unflatten(tree, [x * (1 + rel * s) for x, s in zip(leaves, signs)])


def make_step(model, opt):
    """(params, opt_state, tokens) -> (params, opt_state, loss): one AdamW step."""

    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(model, p, tokens))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def flops_per_token(config: Config) -> dict:
    """Model FLOPs per trained token (forward + backward), from the model's shapes.

    ``matmul``: 3 × the forward's 2 FLOPs per weight used (:func:`~.model.matmul_flops_per_token`: the blocks'
    projections and MLP and the output layer; the token embedding is a lookup, no FLOPs — its one-hot gradient is
    the implementation's cost, not the model's). ``attention``: per layer, the score and value matmuls, 4·N·H per
    (query, key) pair the causal mask keeps, ×3.5 for forward + backward; the mask keeps T(T+1)/2 of the T² pairs
    (about half), and only those are counted. ``total`` is their sum: the numerator of MFU.
    """
    c = _config(config)
    attn = (
        c.layers
        * attention_flops(c.batch, c.seq_len, c.seq_len, c.heads, c.head_dim, causal=True, pass_="fwd+bwd")
        / (c.batch * c.seq_len)
    )
    matmul = 3.0 * matmul_flops_per_token(c)
    return {"matmul": matmul, "attention": attn, "total": matmul + attn}


def step_flops(config: Config) -> float:
    """Model FLOPs of one training step: 3 × the forward matmuls (forward + backward) plus causal attention."""
    config = _config(config)
    return flops_per_token(config)["total"] * config.batch * config.seq_len


def peak_bytes() -> int | None:
    """The device's peak bytes in use so far in this process (None where the backend does not report it)."""
    stats = jax.devices()[0].memory_stats()
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


_jit_loss = jax.jit(loss_fn, static_argnums=0)


def evaluate(model, params, tokens: np.ndarray, config: Config, *, seed: int, batches: int) -> float:
    """Mean loss over ``batches`` fixed batches of ``tokens`` (the held-out split)."""
    batches = check_int("batches", batches, minimum=1, example="4")
    losses = [
        _jit_loss(model, params, batch_at(tokens, batch=config.batch, seq_len=config.seq_len, seed=seed, step=i))
        for i in range(batches)
    ]
    return float(np.mean([float(x) for x in losses]))


def check_args(impl, *, steps, config, seed, log_every, eval_batches, peak_tflops, perturb, wait_every=1) -> dict:
    """The arguments of :func:`train_records` checked (``ValueError`` naming the argument, the value and the fix)
    and normalised (Python ints and floats)."""
    if not isinstance(impl, str) or not impl:
        raise ValueError(f"impl must be an implementation name such as 'xla'; got {type(impl).__name__} {impl!r:.60}.")
    if not isinstance(config, Config):
        raise ValueError(f"config must be a train.model.Config (e.g. model.TINY); got {type(config).__name__}.")
    return {
        "steps": check_int("steps", steps, minimum=1, example="200"),
        "seed": check_int("seed", seed, minimum=0, example="0"),
        "log_every": check_int("log_every", log_every, minimum=1, example="5"),
        "eval_batches": check_int("eval_batches", eval_batches, minimum=0, example="4 (0: no held-out loss)"),
        "peak_tflops": None if peak_tflops is None else check_number("peak_tflops", peak_tflops, positive=True),
        "perturb": check_number("perturb", perturb, non_negative=True, example="2**-7"),
        "wait_every": check_int("wait_every", wait_every, minimum=1, example="10 (1: wait after every step)"),
    }


def check_corpus(corpus: Corpus, config: Config) -> None:
    """Refuse a corpus whose token ids fall outside [0, config.vocab), or too short for one sequence."""
    for split in ("train", "held_out"):
        ids = getattr(corpus, split)
        if not (isinstance(ids, np.ndarray) and ids.ndim == 1 and np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"corpus.{split} must be a 1-D NumPy array of integer token ids; got {ids!r:.60}.")
        if ids.size < config.seq_len + 2:
            raise ValueError(
                f"corpus.{split} has {ids.size} tokens; one batch needs seq_len + 2 = {config.seq_len + 2}."
            )
        safe = ids.dtype.itemsize == 1 and not np.issubdtype(ids.dtype, np.signedinteger) and config.vocab >= 256
        if not safe and (int(ids.min()) < 0 or int(ids.max()) >= config.vocab):
            raise ValueError(
                f"corpus.{split} holds token ids from {int(ids.min())} to {int(ids.max())}, outside the vocabulary "
                f"[0, {config.vocab}); build the model with Config(vocab=...) that covers them."
            )


def step_fields(config: Config) -> dict:
    """The record fields every record of a training step carries: the attention problem each layer solves (B, T = S,
    N = K, H, dtype, causal, fwd+bwd) and the whole config as ``cfg_*``."""
    c = config
    return {
        "batch": c.batch,
        "seq_q": c.seq_len,
        "seq_kv": c.seq_len,
        "heads": c.heads,
        "kv_heads": c.heads,
        "head_dim": c.head_dim,
        "dtype": c.dtype,
        "causal": True,
        "pass": "fwd+bwd",
        **{f"cfg_{k}": v for k, v in c.fields().items()},
    }


def _base(impl: str, config: Config, seed: int, steps: int, perturb: float = 0.0) -> dict:
    twin = {"impl": impl + TWIN, "perturb": perturb} if perturb else {"impl": impl}
    return {**twin, **step_fields(config), "seed": seed, "steps": steps}


def train_records(
    impl: str,
    *,
    steps: int,
    config: Config = TINY,
    seed: int = 0,
    log_every: int = 1,
    eval_batches: int = 4,
    corpus=None,
    peak_tflops: float | None = None,
    perturb: float = 0.0,
    wait_every: int = 1,
) -> TrainResult:
    """Train ``steps`` AdamW steps with attention ``impl`` and return the per-step records and a summary.

    A step record (``kind`` "step", one every ``log_every`` steps and at the last) holds the loss of that step's
    batch before its update and the median/p10/p90 step time since the previous record. The summary (``kind``
    "summary") holds the held-out loss before and after training (over ``eval_batches`` batches; None with 0),
    the median step time over all steps, compile time, compiled temporaries and footprint, peak device memory,
    which attention kernel the compiled step calls, and ``pct_peak`` given the measured bf16 matmul
    ``peak_tflops``. When the registry says ``impl`` cannot run this shape here, the summary alone comes back with
    status "unsupported". ``perturb`` > 0 nudges the initial weights by that relative amount
    (:func:`perturb_params`): the run is then a *twin*, its records marked ``perturb``, the yardstick of how far
    rounding alone moves the loss curve. A loss that turns NaN or infinite ends the run: the summary then has
    status "error", ``failed_step`` and the loss in its ``reason``, no timings. ``wait_every``: how many steps are
    dispatched before the host waits for the device (see the module's docstring); the records say it.
    """
    a = check_args(
        impl,
        steps=steps,
        config=config,
        seed=seed,
        log_every=log_every,
        eval_batches=eval_batches,
        peak_tflops=peak_tflops,
        perturb=perturb,
        wait_every=wait_every,
    )
    steps, seed, log_every, eval_batches = a["steps"], a["seed"], a["log_every"], a["eval_batches"]
    peak_tflops, perturb, wait_every = a["peak_tflops"], a["perturb"], a["wait_every"]
    c = config
    base = {**_base(impl, c, seed, steps, perturb), "wait_every": wait_every}
    reason = registry.why_not(impl, c.attention_shape(), c.dtype, causal=True)
    if reason:
        return TrainResult(
            [],
            {
                **base,
                "kind": "summary",
                "status": "unsupported",
                "reason": reason,
                "median_ms": None,
                "p10_ms": None,
                "p90_ms": None,
                "tflops": None,
            },
        )
    corpus = corpus or load_corpus()
    check_corpus(corpus, c)
    model, opt = GPT(c, impl), optimizer(c, steps)
    params = init_params(c, seed)
    if perturb:
        params = perturb_params(params, perturb, seed + 1)
    opt_state = jax.jit(opt.init)(params)  # one program (op by op, a GPU compiles each zeros_like apart)
    batch = lambda s: jax.device_put(batch_at(corpus.train, batch=c.batch, seq_len=c.seq_len, seed=seed, step=s))  # noqa: E731

    def held_out(p):  # the mean loss over eval_batches held-out batches; None with 0
        return evaluate(model, p, corpus.held_out, c, seed=seed, batches=eval_batches) if eval_batches else None

    eval_before = held_out(params)
    stats = _step_program(c, impl, steps, model, opt, params, opt_state, batch(0), donate=True)
    jax.block_until_ready(stats.compiled(*_copy((params, opt_state)), batch(0)))  # warm-up on a copy, thrown away
    flops, tokens = step_flops(c), c.batch * c.seq_len
    records, times, since_log = [], [], []
    for start in range(0, steps, wait_every):
        group = jax.block_until_ready([batch(s) for s in range(start, min(start + wait_every, steps))])
        t0 = time.perf_counter()
        losses = []
        for tokens_in in group:  # dispatched back to back; the device runs them in order
            params, opt_state, loss = stats.compiled(params, opt_state, tokens_in)
            losses.append(loss)
        jax.block_until_ready((params, opt_state, losses))
        ms = (time.perf_counter() - t0) * 1e3 / len(group)
        for s, loss in enumerate((float(x) for x in losses), start):
            if not np.isfinite(loss):  # diverged: the run stops here, a failure with the step
                reason = (
                    f"the loss became {loss} at step {s} of {steps}: training diverged. Lower "
                    f"Config.learning_rate (now {c.learning_rate:g}) or lengthen Config.warmup_steps (now "
                    f"{c.warmup_steps})."
                )
                return TrainResult(
                    records,
                    {
                        **base,
                        "kind": "summary",
                        "status": "error",
                        "reason": reason,
                        "failed_step": s,
                        "eval_loss_init": eval_before,
                        "median_ms": None,
                        "p10_ms": None,
                        "p90_ms": None,
                        "tflops": None,
                    },
                )
            times.append(ms)
            since_log.append(ms)
            if s % log_every == 0 or s == steps - 1:
                records.append(
                    _timed({**base, "kind": "step", "step": s, "loss": loss}, since_log, flops, tokens, peak_tflops)
                )
                since_log = []
    eval_after = held_out(params)
    summary = _timed(
        {
            **base,
            "kind": "summary",
            "final_loss": records[-1]["loss"],
            "eval_loss_init": eval_before,
            "eval_loss": eval_after,
            "compile_s": stats.compile_s,
            "temp_bytes": stats.temp_bytes,
            "attention_kernel": stats.attention_kernel,
            "params": _count(params),
            "step_bytes": _footprint(stats.compiled),
            "step_flops": flops,
            **corpus.describe(),
        },
        times,
        flops,
        tokens,
        peak_tflops,
    )
    return TrainResult(records, {**summary, **steady_state(times, c, peak_tflops)})


def steady_state(times_ms, config: Config, peak_tflops: float | None = None, *, gpu: str | None = None) -> dict:
    """Summary fields of the steady state: the steps after the learning-rate warm-up (at most the first half of the
    run is left out; ``steady_from`` says where it starts). Step time and tokens/s as median, p10 and p90 over those
    steps (the tokens/s percentiles are those of each step's own tokens/s), the model FLOPs per token
    (:func:`flops_per_token`), and the MFU at the median step time: ``mfu_datasheet_pct`` against the datasheet's
    dense bf16 peak of ``gpu`` (default: this device; None on a CPU or an unlisted GPU) and ``mfu_measured_pct``
    against ``peak_tflops``, a measured bf16 matmul's rate (a reference on this card; None without it)."""
    c = _config(config)
    if len(times_ms) == 0:
        raise ValueError("times_ms must hold at least one step time (ms).")
    start = min(c.warmup_steps, len(times_ms) // 2)
    steady = np.asarray(times_ms[start:], np.float64)
    tokens = c.batch * c.seq_len
    median, p10, p90 = summarize(steady)
    tps, tps_p10, tps_p90 = summarize(tokens / (steady / 1e3))
    per_token = flops_per_token(c)
    achieved = per_token["total"] * tokens / (median / 1e3) / 1e12  # TFLOP/s at the median step
    gpu = jax.devices()[0].device_kind if gpu is None else gpu
    sheet, sheet_basis = datasheet_peak(gpu, c.dtype)
    return {
        "steady_from": start,
        "steady_steps": int(steady.size),
        "steady_median_ms": median,
        "steady_p10_ms": p10,
        "steady_p90_ms": p90,
        "steady_tokens_per_s": tps,
        "steady_tokens_per_s_p10": tps_p10,
        "steady_tokens_per_s_p90": tps_p90,
        "flops_per_token": per_token["total"],
        "matmul_flops_per_token": per_token["matmul"],
        "attention_flops_per_token": per_token["attention"],
        "steady_tflops": achieved,
        "datasheet_tflops": sheet,
        "datasheet_basis": sheet_basis,
        "mfu_datasheet_pct": 100 * achieved / sheet if sheet else None,
        "mfu_measured_pct": 100 * achieved / peak_tflops if peak_tflops else None,
    }


def profile_step(
    impl: str, *, config: Config = TINY, seed: int = 0, trained_steps: int = 0, repeats: int = 5, corpus=None
) -> tuple[list, float, float | None]:
    """What one training step runs on the device: :func:`~attention_tutorial.measure.profile.device_profile` of the
    compiled step (kernel rows, longest first, µs per step; host ms per step; the device's busy span per step),
    from the initial parameters, or after ``trained_steps`` steps (the same batches as :func:`train_records`)."""
    from ..measure.profile import device_profile

    a = check_args(
        impl,
        steps=max(trained_steps, 1),
        config=config,
        seed=seed,
        log_every=1,
        eval_batches=1,
        peak_tflops=None,
        perturb=0.0,
    )
    trained_steps = check_int("trained_steps", trained_steps, minimum=0)
    c, seed = config, a["seed"]
    if reason := registry.why_not(impl, c.attention_shape(), c.dtype, causal=True):
        raise ValueError(f"{impl} cannot run this model here: {reason}")
    corpus = corpus or load_corpus()
    check_corpus(corpus, c)
    model, opt = GPT(c, impl), optimizer(c, max(trained_steps, 1))
    params = init_params(c, seed)
    opt_state = jax.jit(opt.init)(params)  # one program (op by op, a GPU compiles each zeros_like apart)
    batch = lambda s: jax.device_put(batch_at(corpus.train, batch=c.batch, seq_len=c.seq_len, seed=seed, step=s))  # noqa: E731
    # not donated: the profiler calls the step again and again on the same arguments
    stats = _step_program(c, impl, max(trained_steps, 1), model, opt, params, opt_state, batch(0), donate=False)
    for s in range(trained_steps):
        params, opt_state, _ = stats.compiled(params, opt_state, batch(s))
    return device_profile(None, params, opt_state, batch(trained_steps), repeats=repeats, compiled=stats.compiled)


_STEP_PROGRAMS: dict = {}  # (config, impl, steps, donate) -> CompileStats of the train step, the latest few


def _step_program(config: Config, impl: str, steps: int, model, opt, params, opt_state, tokens, *, donate: bool):
    """The compiled train step of ``impl`` for ``config`` over ``steps`` (the learning-rate schedule's length): one
    program for all of them, so a run that repeats another's (the twin, from nudged weights) is not compiled again.
    Its ``compile_s`` is that of the first compilation. ``donate``: the step consumes the parameters and optimizer
    state it is given (updated in place; the caller must use the ones it returns)."""
    key = (config, impl, steps, donate)
    if key not in _STEP_PROGRAMS:
        while len(_STEP_PROGRAMS) >= 2:  # the executables hold device memory: keep the last two
            _STEP_PROGRAMS.pop(next(iter(_STEP_PROGRAMS)))
        _STEP_PROGRAMS[key] = compile_stats(
            make_step(model, opt), params, opt_state, tokens, donate_argnums=(0, 1) if donate else ()
        )
    return _STEP_PROGRAMS[key]


def _copy(tree):
    """Fresh device buffers holding ``tree``'s values: what a donating step may consume without touching ``tree``."""
    return jax.tree.map(jnp.copy, tree)


def _config(config) -> Config:
    if not isinstance(config, Config):
        raise ValueError(f"config must be a train.model.Config (e.g. model.TINY); got {type(config).__name__}.")
    return config


def _timed(rec: dict, samples_ms, flops: float, tokens: int, peak_tflops: float | None) -> dict:
    median, p10, p90 = summarize(samples_ms)
    tflops = flops / (median / 1e3) / 1e12
    peak, basis = peak_for(rec["dtype"], peak_tflops)  # a measured bf16 matmul's rate, a reference (x2 for FP8)
    pct = {"pct_peak": 100 * tflops / peak, "peak_basis": basis} if peak else {}
    return {
        **rec,
        "status": "ok",
        "median_ms": median,
        "p10_ms": p10,
        "p90_ms": p90,
        "step_ms": median,
        "tokens_per_s": tokens / (median / 1e3),
        "tflops": tflops,
        **pct,
        "peak_bytes": peak_bytes(),
    }


def _footprint(compiled) -> int | None:
    """Bytes the compiled step needs on the device: its arguments, outputs and temporaries (None if unknown)."""
    try:
        m = compiled.memory_analysis()
        return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)
    except (AttributeError, NotImplementedError, TypeError):
        return None


def _count(params) -> int:
    return int(sum(np.size(x) for x in jax.tree.leaves(params)))
