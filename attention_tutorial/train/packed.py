"""Training on packed documents: several documents in each row, each attending to itself only.

Each row of a batch holds documents one after another (:func:`~.data.packed_batch_at`), with segment ids that say
which document a byte belongs to. The model gives them to its attention (``segment_ids=``): our kernel skips the
tiles between documents; XLA and cuDNN get them as a (B, 1, T, T) mask (:func:`~attention_tutorial.kernels.fused.
dot_product_attention`). :func:`packed_loss` counts the bytes whose next byte is in the same document (a document's
first byte is not predicted from the end of another). :func:`packed_records` trains the same model from the same
seed on the same batches through each attention and returns each step's loss and a summary per attention: the
step time over the steps after the learning-rate warm-up, and how much of the causal score matrix the documents
keep.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import registry
from ..inputs import check_int
from ..measure.compiled import compile_stats
from .data import Corpus, load_corpus, packed_batch_at
from .loop import _copy, _timed, check_corpus, init_params, optimizer, step_fields, step_flops
from .model import GPT, TINY, Config

PACKED_IMPLS = ("xla", "default", "cudnn", "mosaic", "mosaic_atomic")  # the attentions that take segment_ids


def packed_loss(model, params, tokens, segment_ids):
    """Mean next-byte cross-entropy (nats) of ``tokens`` (B, T + 1) over the bytes whose next byte lies in the same
    document (``segment_ids`` (B, T + 1))."""
    logits = model.apply({"params": params}, tokens[:, :-1], segment_ids[:, :-1])
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
    same = (segment_ids[:, :-1] == segment_ids[:, 1:]).astype(ce.dtype)
    return (ce * same).sum() / jnp.maximum(same.sum(), 1.0)


def packed_batch(corpus: Corpus, config: Config, *, seed: int, step: int):
    """Batch ``step`` of packed documents for ``seed`` as device arrays: tokens and segment ids, (B, T + 1) int32."""
    if corpus.train_starts is None:
        raise ValueError("corpus.train_starts is None: packing needs where each document starts (load_corpus sets it).")
    tokens, ids = packed_batch_at(
        corpus.train, corpus.train_starts, batch=config.batch, seq_len=config.seq_len, seed=seed, step=step
    )
    return jax.device_put(tokens), jax.device_put(ids)


def kept_fraction(segment_ids) -> float:
    """The share of the causal (query, key) pairs of ``segment_ids`` (B, T) that the documents keep."""
    ids = np.asarray(segment_ids)
    T = ids.shape[1]
    same = (ids[:, :, None] == ids[:, None, :]) & np.tri(T, dtype=bool)
    return float(same.sum() / (ids.shape[0] * T * (T + 1) / 2))


UNTIMED = dict.fromkeys(("median_ms", "p10_ms", "p90_ms", "tflops"))  # a run that did not train has no timings


def packed_records(
    impls=("xla", "cudnn", "mosaic"),
    *,
    steps: int = 60,
    config: Config = TINY,
    seed: int = 0,
    corpus: Corpus | None = None,
    wait_every: int = 10,
    peak_tflops: float | None = None,
) -> list[dict]:
    """Train ``steps`` steps on packed documents through each of ``impls`` (:data:`PACKED_IMPLS`), from the same
    initial parameters on the same batches: records of ``kind`` "step" (each step's loss before its update) and one
    "summary" per implementation (status; the steady steps' median, p10 and p90 ms and tokens/s; the mean number of
    documents per row and the share of causal pairs they keep, over the run's batches). A step's time is its
    dispatch group's (``wait_every`` steps queued, then waited for once), its TFLOP/s the model's (as the training
    grid counts them; its share of ``peak_tflops`` where given). An implementation that cannot run here, or fails,
    gives a summary with the reason."""
    unknown = [i for i in impls if i not in PACKED_IMPLS]
    if unknown:
        raise ValueError(f"impls {unknown} take no segment ids; choose from {', '.join(PACKED_IMPLS)}.")
    steps = check_int("steps", steps, minimum=2, example="60")
    seed = check_int("seed", seed, minimum=0)
    wait_every = check_int("wait_every", wait_every, minimum=1, example="10")
    corpus = corpus or load_corpus()
    check_corpus(corpus, config)
    batches = [packed_batch(corpus, config, seed=seed, step=s) for s in range(steps)]
    ids = [np.asarray(b[1][:, :-1]) for b in batches]
    docs = {
        "documents_per_row": float(np.mean([r.max() + 1 for i in ids for r in i])),
        "kept_of_causal": float(np.mean([kept_fraction(i) for i in ids])),
    }
    out = []
    for impl in impls:
        base = {
            "impl": impl,
            **step_fields(config),
            "seed": seed,
            "steps": steps,
            "wait_every": wait_every,
            "packed": True,
            **docs,
        }
        if reason := registry.why_not(impl, config.attention_shape(), config.dtype, causal=True):
            out.append({**base, "kind": "summary", "status": "unsupported", "reason": reason, **UNTIMED})
            continue
        try:
            out += _train(impl, config, seed, steps, wait_every, batches, base, peak_tflops)
        except Exception as e:  # reported in the record, the other implementations still run
            out.append(
                {
                    **base,
                    "kind": "summary",
                    "status": "error",
                    **UNTIMED,
                    "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                }
            )
    return out


def _train(impl, config, seed, steps, wait_every, batches, base, peak_tflops) -> list[dict]:
    model, opt = GPT(config, impl), optimizer(config, steps)
    params = init_params(config, seed)
    opt_state = jax.jit(opt.init)(params)

    def step(params, opt_state, tokens, segment_ids):
        loss, grads = jax.value_and_grad(lambda p: packed_loss(model, p, tokens, segment_ids))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    stats = compile_stats(step, params, opt_state, *batches[0], donate_argnums=(0, 1))
    jax.block_until_ready(stats.compiled(*_copy((params, opt_state)), *batches[0]))  # warm-up, thrown away
    records, times = [], []
    flops, tokens = step_flops(config), config.batch * config.seq_len
    for start in range(0, steps, wait_every):
        group = range(start, min(start + wait_every, steps))
        t0, losses = time.perf_counter(), []
        for s in group:  # dispatched back to back
            params, opt_state, loss = stats.compiled(params, opt_state, *batches[s])
            losses.append(loss)
        jax.block_until_ready((params, opt_state, losses))
        ms = (time.perf_counter() - t0) * 1e3 / len(group)
        times += [ms] * len(group)
        records += [
            _timed({**base, "kind": "step", "step": s, "loss": float(x)}, [ms], flops, tokens, peak_tflops)
            for s, x in zip(group, losses)
        ]
    steady = times[min(config.warmup_steps, steps // 2) :]
    summary = {
        **_timed({**base, "kind": "summary"}, steady, flops, tokens, peak_tflops),
        "final_loss": records[-1]["loss"],
        "compile_s": stats.compile_s,
        "attention_kernel": stats.attention_kernel,
    }
    return [*records, summary]
