"""Measuring attention: timing, compiled-program inspection, ceilings, FLOP/byte models, grids and sweeps.

Modules: :mod:`~attention_tutorial.measure.timing` (one measurement), :mod:`~attention_tutorial.measure.compiled`
(what XLA compiled: kernels, temporaries), :mod:`~attention_tutorial.measure.ceilings` (matmul and memory peaks),
:mod:`~attention_tutorial.measure.flops` (FLOP and byte models), :mod:`~attention_tutorial.measure.grids` (named
sweeps), :mod:`~attention_tutorial.measure.sweep` (grid → records), :mod:`~attention_tutorial.measure.kernel_code`
(instruction counts from machine code) and :mod:`~attention_tutorial.measure.fp8` (the FP8 experiments),
:mod:`~attention_tutorial.measure.profile` (device time from a profiler trace),
:mod:`~attention_tutorial.measure.roofline` (a call's bytes and FLOPs against a roof),
:mod:`~attention_tutorial.measure.context_parallel` (the ring on one GPU),
:mod:`~attention_tutorial.measure.ring_cost` (the ring's cost from its records),
:mod:`~attention_tutorial.measure.race` (our kernels raced against cuDNN, interleaved) and
:mod:`~attention_tutorial.measure.lessons` (TF32, cuDNN's refusals, GQA = MHA, input data and clocks).
This layer may import :mod:`attention_tutorial.kernels` and the top-level modules, never ``results``.
"""
