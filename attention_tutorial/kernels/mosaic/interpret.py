"""Our Mosaic GPU kernels run on a CPU: Pallas's GPU interpreter, with what our kernels use that it lacks.

Pallas ships an interpreter for Mosaic GPU kernels (``InterpretGPUParams``): every warpgroup of every CTA runs as a
host thread over simulated global and shared memory, with real barriers, so a kernel's indexing, masking, step counts
and barrier protocol run exactly as written — slowly, and with each asynchronous operation completing at once (it
checks what a kernel computes, not its timing or every race). It is young, and some things our kernels do are not in
it yet; :func:`interpret` adds them, each in terms of what the GPU does:

* ``pl.run_state`` (an accumulator carried in registers across steps): its refs are allocated, run, read back;
* ``wgmma`` with a transposed shared-memory operand (``k_smem.T``) or its left operand in registers (p);
* ``plgpu.load`` (a vector from shared memory in a register layout) and ``plgpu.layout_cast`` (no-ops on values);
* TMA's edges: a load that reaches past the array's end gets zeros there, a store drops what lies past it, and a
  store with ``reduction_op="add"`` (dQ by atomic adds) adds, under a lock; a store of a slice of the innermost axis
  (all other axes fixed) past that axis's end is refused: on the GPU it lands on the next row; so is a load of more
  than 256 elements along any axis, or of a number of bytes not a multiple of 128, as Mosaic GPU refuses them;
* ``plgpu.inline_mgpu`` (registers rearranged by hand): its function's ``logical`` attribute, the same rearrangement
  on a plain array, stands in.

Everything here touches JAX's private modules, in this one place; the tests run it on every supported JAX. Use::

    with interpret():
        out = mosaic_flash_attention(q, k, v, is_causal=True)  # on a CPU

Each warpgroup runs as a computation launched from inside the kernel's own computation. A program that queues many
small computations behind a running kernel (a model run op by op, outside ``jax.jit``) can fill every slot the CPU
client allows in flight, and the warpgroups then wait for a slot only the kernel's end would free. Run such programs
with ``jax.config.update("jax_cpu_enable_async_dispatch", False)`` before JAX's first computation, as the tests do.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

_PATCHED = False
DEADLOCK_SECONDS = 20.0  # a barrier wait that sees no arrival this long: the warpgroups wait on each other
_WAITING = threading.local()  # where this thread waits (for the deadlock's message)
_TMA = threading.local()  # whether this thread is inside a TMA load (whose reads past the array give zeros)
_LOCK = threading.Lock()  # the reduce-add's read and write, atomic as on the GPU


def why_not() -> str | None:
    """Why this JAX cannot interpret our kernels, or None."""
    try:
        _private()
    except (ImportError, AttributeError) as e:  # pragma: no cover - depends on the installed JAX
        return f"this JAX ({jax.__version__}) has no Mosaic GPU interpreter we know how to extend: {e}."
    return None


@contextlib.contextmanager
def interpret():
    """Every Mosaic GPU kernel traced inside runs in Pallas's GPU interpreter (on any backend, a CPU included)."""
    if reason := why_not():
        raise RuntimeError(f"interpret(): {reason}")
    p = _private()
    _patch()
    try:
        with p.params.force_gpu_interpret_mode(p.params.InterpretGPUParams()):
            yield
    except BaseException:
        p.interpret_pallas_call.reset_gpu_interpret_mode_state()  # the interpreter asks for it after an error
        raise


@functools.cache
def _private():
    """JAX's private modules this file uses, imported once."""
    import types

    from jax._src import core as jax_core
    from jax._src import source_info_util
    from jax._src.interpreters import mlir
    from jax._src.pallas.mosaic.interpret import utils as interpret_utils
    from jax._src.pallas.mosaic_gpu import core as mgpu_core
    from jax._src.pallas.mosaic_gpu import primitives as mgpu_primitives
    from jax._src.pallas.mosaic_gpu.interpret import (
        gpu_callbacks,
        interpret_pallas_call,
        jaxpr_interpret,
        params,
        shared_memory,
    )
    from jax._src.state import discharge as state_discharge
    from jax._src.state import types as state_types

    for name in (
        "call_get",
        "call_swap",
        "call_allocate_buffer",
        "call_deallocate_buffer",
        "call_make_allocation_request_array",
        "copy_smem_to_gmem",
        "wgmma",
        "get_memory_space_idx",
        "HostAllocationKey",
    ):
        getattr(gpu_callbacks, name)
    jaxpr_interpret.JaxprInterpreter.interpret  # noqa: B018 - fail here, not mid-kernel
    shared_memory.Barrier.deallocate  # noqa: B018
    return types.SimpleNamespace(
        jax_core=jax_core,
        source_info_util=source_info_util,
        mlir=mlir,
        interpret_utils=interpret_utils,
        mgpu_core=mgpu_core,
        mgpu_primitives=mgpu_primitives,
        gpu_callbacks=gpu_callbacks,
        interpret_pallas_call=interpret_pallas_call,
        jaxpr_interpret=jaxpr_interpret,
        params=params,
        shared_memory=shared_memory,
        state_discharge=state_discharge,
        state_types=state_types,
    )


def _patch():
    global _PATCHED
    with _LOCK:
        if _PATCHED:
            return
        p = _private()
        cls = p.jaxpr_interpret.JaxprInterpreter
        original = cls.interpret
        cls.interpret = lambda self, jaxpr, token, *args: _interpret(self, original, jaxpr, token, *args)
        cls._interpret_wgmma_ref_p = _wgmma_eqn
        p.gpu_callbacks.copy_smem_to_gmem = _tma_store
        transfer = p.gpu_callbacks.DeviceLocalMemoryTransfer
        execute, out_of_bounds = transfer.execute, p.gpu_callbacks._handle_out_of_bounds_read

        def tma_load(self, token):
            _TMA.loading = True
            try:
                out = execute(self, token)
            finally:
                _TMA.loading = False
            _refuse_long_copy(self.data)
            _refuse_ragged_copy(self.data)
            return out

        def zero_fill(ret, full_read_shape, shape, dtype, *args, **kw):
            if not getattr(_TMA, "loading", False):
                return out_of_bounds(ret, full_read_shape, shape, dtype, *args, **kw)
            out = np.zeros(full_read_shape, dtype)  # TMA fills what lies past the array with zeros
            if ret is not None:
                out[tuple(slice(n) for n in ret.shape)] = ret
            return out

        transfer.execute, p.gpu_callbacks._handle_out_of_bounds_read = tma_load, zero_fill
        is_gmem = p.gpu_callbacks.is_gmem_memory_space  # a kernel's ref argument (jax.new_ref) has no memory space

        p.gpu_callbacks.is_gmem_memory_space = lambda space: space is None or is_gmem(space)
        p.shared_memory.Barrier.deallocate = _deallocate_barrier
        barrier_init, barrier_wait = p.shared_memory.Barrier.__init__, p.shared_memory.Barrier.wait

        def init(barrier, *args, **kw):
            barrier_init(barrier, *args, **kw)
            barrier.cv = _Deadline()

        def wait(barrier, device_id, local_thread_id, logging_info=None):
            _WAITING.where = logging_info
            return barrier_wait(barrier, device_id, local_thread_id, logging_info=logging_info)

        p.shared_memory.Barrier.__init__, p.shared_memory.Barrier.wait = init, wait
        for prim in (p.mgpu_core.layout_cast_p,):
            p.mlir.register_lowering(prim, lambda ctx, x, **kw: [x], platform="cpu")
        _PATCHED = True


class DeadlockError(RuntimeError):
    """An interpreted kernel's warpgroups wait on each other: a barrier wait saw no arrival for
    :data:`DEADLOCK_SECONDS` (on the GPU the kernel would hang)."""


class _Deadline(threading.Condition):
    """A barrier's condition whose untimed wait gives up after :data:`DEADLOCK_SECONDS`, naming the wait."""

    def wait(self, timeout=None):
        if timeout is not None:
            return super().wait(timeout)
        if not super().wait(DEADLOCK_SECONDS):
            info = getattr(_WAITING, "where", None)
            where = f"thread {info.thread_id} of CTA {info.grid_point_coords}" if info is not None else "a thread"
            line = ""
            if info is not None and info.source_info is not None:
                line = f" at {_kernel_line(info.source_info)}"
            raise DeadlockError(
                f"{where} waited {DEADLOCK_SECONDS:g} s on a barrier{line} with no arrival: the "
                "kernel's warpgroups wait on each other (on a GPU it would hang)."
            )
        return True


def _kernel_line(source_info) -> str:
    """The innermost line of our kernels in a traced equation's traceback (file:line), else JAX's summary."""
    siu = _private().source_info_util
    for frame in siu.user_frames(source_info.traceback):
        if "kernels" in frame.file_name:
            return siu._summarize_frame(frame)
    return siu.summarize(source_info)


def _deallocate_barrier(barrier):
    """A barrier's end, without the interpreter's check that each thread that waited on it waited on every phase: a
    ring's producer never waits for the last release of a slot, and a warpgroup that has run out of key blocks
    stops waiting for their copies — both right on the GPU, since neither waits on that barrier again. (A wait on a
    phase already past still fails, as it should.)"""
    with barrier.cv:
        barrier.ref_count -= 1


# --- the interpreter's walk over a kernel's equations, with the primitives it lacks --------------------------------


def _special(p):
    return {
        p.state_discharge.run_state_p: _run_state,
        p.mgpu_primitives.load_p: _load,
        p.mgpu_primitives.inline_mgpu_p: _inline,
        p.mgpu_primitives.wgmma_accumulator_store_p: _store_acc,
    }


def _interpret(self, original, jaxpr, token, *args):
    """JAX's interpreter over ``jaxpr``, handing the equations it has no rule for to ours: runs of ordinary equations
    go to it as sub-jaxprs, ours are run here, in order."""
    p = _private()
    special = _special(p)
    if not any(e.primitive in special for e in jaxpr.eqns):
        return original(self, jaxpr, token, *args)
    env = dict(zip(jaxpr.constvars + jaxpr.invars, args))
    read = lambda v: v.val if isinstance(v, p.jax_core.Literal) else env[v]  # noqa: E731
    run: list = []

    def flush(token):
        if not run:
            return token
        ins, made = [], set()
        for e in run:
            ins += [v for v in e.invars if isinstance(v, p.jax_core.Var) and v not in made and v not in ins]
            made.update(e.outvars)
        outs = [v for e in run for v in e.outvars]
        effects = p.jax_core.join_effects(*(e.effects for e in run))
        sub = p.jax_core.Jaxpr([], ins, outs, list(run), effects, debug_info=jaxpr.debug_info.with_unknown_names())
        token, values = original(self, sub, token, *[env[v] for v in ins])
        env.update(zip(outs, values))
        run.clear()
        return token

    for e in jaxpr.eqns:
        if e.primitive not in special:
            run.append(e)
            continue
        token = flush(token)
        with p.source_info_util.user_context(e.source_info.traceback, name_stack=e.source_info.name_stack):
            token, outs = special[e.primitive](self, e, token, [read(v) for v in e.invars])
        env.update(zip(e.outvars, outs))
    token = flush(token)
    return token, [read(v) for v in jaxpr.outvars]


def _where(self):
    return dict(
        device_id=jnp.int32(self.device_info.device_id),
        grid_point_coords=self.grid_point_coords,
        thread_id=self.thread_id,
    )


def _run_state(self, eqn, token, invals):
    """``run_state``: a buffer per value (an accumulator lives in registers), the body run over them, each read
    back; refs from outside pass through."""
    p = _private()
    gc, jaxpr = p.gpu_callbacks, eqn.params["jaxpr"]
    if not all(eqn.params["is_initialized"]):
        raise NotImplementedError("run_state with uninitialized refs")
    where = _where(self)
    args, owned = [], []
    for outer, inner, value in zip(eqn.invars, jaxpr.invars, invals):
        if isinstance(outer.aval, p.state_types.AbstractRef):
            args.append(value)
            owned.append(None)
            continue
        space = p.mgpu_core.MemorySpace.REGS  # private to this thread: outside the CTA's shared allocations
        token, request = gc.call_make_allocation_request_array(
            token=token,
            device_id=where["device_id"],
            memory_space_id=gc.get_memory_space_idx(space),
            thread_id=jnp.int32(self.thread_id),
            initial_ref_count=1,
        )
        token, key = gc.call_allocate_buffer(
            token=token, allocation_request_as_array=request, value=value, source_info=eqn.source_info, **where
        )
        args.append(key)
        owned.append(inner)
    token, _ = self.interpret(jaxpr, token, *args)
    outs = []
    for inner, key, value in zip(owned, args, invals):
        if inner is None:
            outs.append(value)
            continue
        aval = inner.aval.inner_aval
        token, out = gc.call_get(
            token=token,
            result_shape_and_dtype=p.jax_core.ShapedArray(aval.shape, aval.dtype),
            allocation_key_as_array=key,
            transforms=(),
            source_info=eqn.source_info,
            **where,
        )
        token = gc.call_deallocate_buffer(
            token=token, allocation_key_as_array=key, source_info=eqn.source_info, **where
        )
        outs.append(out)
    return token, outs


def _load(self, eqn, token, invals):
    """``plgpu.load``: a read of the ref through its transforms (the layout is the registers', not the value's)."""
    p = _private()
    aval = eqn.outvars[0].aval
    token, out = p.gpu_callbacks.call_get(
        token=token,
        result_shape_and_dtype=p.jax_core.ShapedArray(aval.shape, aval.dtype),
        allocation_key_as_array=invals[0],
        transforms=eqn.params["tree"].unflatten(invals[1:]),
        source_info=eqn.source_info,
        **_where(self),
    )
    return token, [out]


def _store_acc(self, eqn, token, invals):
    """``acc_ref[...] = value`` on a wgmma accumulator: the value into its buffer."""
    p = _private()
    acc, value = invals
    aval = eqn.outvars[0].aval
    token, _ = p.gpu_callbacks.call_swap(
        token=token,
        result_shape_and_dtype=p.jax_core.ShapedArray(aval.shape, aval.dtype),
        allocation_key_as_array=acc,
        transforms=(),
        val=value,
        mask=None,
        source_info=eqn.source_info,
        **_where(self),
    )
    return token, [value]


def _inline(self, eqn, token, invals):
    """``plgpu.inline_mgpu``: its function's ``logical`` twin on the values (refs are not supported)."""
    fn = eqn.params["mgpu_fn"]
    logical = getattr(fn, "logical", None)
    if logical is None:
        raise NotImplementedError(f"inline_mgpu function {fn!r} has no `logical` attribute to interpret it by.")
    out = logical(*invals[: len(eqn.params["flat_arg_types"])])
    return token, list(out) if isinstance(out, (tuple, list)) else [out]


# --- wgmma with a transposed or register operand; the TMA reduce-add -----------------------------------------------


def _wgmma_eqn(self, eqn, token, get_invals):
    p = _private()
    acc, a, b, *leaves = get_invals()
    empty = jax.tree.structure([])
    acc_t, a_t, b_t = jax.tree.unflatten(
        jax.tree_util.treedef_tuple(tuple(eqn.params[f"{n}_transforms_tree"] or empty for n in ("acc", "a", "b"))),
        leaves,
    )
    a_in_registers = not isinstance(eqn.invars[1].aval, p.state_types.AbstractRef)
    callback = functools.partial(
        _wgmma, acc_dtype=eqn.invars[0].aval.dtype, a_in_registers=a_in_registers, source_info=eqn.source_info
    )
    token = io_callback(
        callback, p.gpu_callbacks.TOKEN_SHAPE_DTYPE, token, acc, acc_t, a, a_t, b, b_t, ordered=True, **_where(self)
    )
    return token, []


def _read(memory, key, transforms, thread, info):
    """A buffer's content through its transforms: indexers first (as a range), then transposes."""
    p = _private()
    transforms = p.gpu_callbacks._remove_noop_transforms(transforms)
    index = [t for t in transforms if not isinstance(t, p.state_types.TransposeTransform)]
    perms = [t.permutation for t in transforms if isinstance(t, p.state_types.TransposeTransform)]
    if perms and any(isinstance(t, p.state_types.TransposeTransform) for t in transforms[: len(index)]):
        raise NotImplementedError("an index after a transpose")
    index = jax.tree.map(int, tuple(index))
    value, _, _ = memory.get_buffer_content(
        p.gpu_callbacks.HostAllocationKey.from_array(key), p.interpret_utils.to_range(index), thread, logging_info=info
    )
    for perm in perms:
        value = np.transpose(value, perm)
    return value


def _wgmma(
    token,
    acc,
    acc_t,
    a,
    a_t,
    b,
    b_t,
    *,
    device_id,
    grid_point_coords,
    thread_id,
    acc_dtype,
    a_in_registers,
    source_info,
):
    p = _private()
    gc = p.gpu_callbacks
    memory = gc._get_shared_memory()
    thread = memory.get_global_thread_id(int(device_id), int(thread_id))
    info = p.interpret_utils.GPULoggingInfo(
        device_id=int(device_id),
        thread_id=int(thread_id),
        grid_point_coords=tuple(int(x) for x in grid_point_coords),
        source_info=source_info,
    )
    lhs = np.asarray(a) if a_in_registers else _read(memory, a, a_t, thread, info)
    rhs = _read(memory, b, b_t, thread, info)
    acc_t = jax.tree.map(int, gc._remove_noop_transforms(acc_t))
    acc_range = p.interpret_utils.to_range(acc_t)
    key = gc.HostAllocationKey.from_array(acc)
    old, _, _ = memory.get_buffer_content(key, acc_range, thread, logging_info=info)
    new = old + np.matmul(lhs.astype(np.float32), rhs.astype(np.float32)).astype(acc_dtype)
    memory.store_buffer_content(key, acc_range, new, thread, logging_info=info)
    return token


def _tma_store(
    *,
    token,
    device_id,
    grid_point_coords,
    thread_id,
    src_allocation_key_as_array,
    src_transforms,
    dst_allocation_key_as_array,
    dst_transforms,
    predicate,
    source_info,
    commit_group,
    reduction_op,
):
    """A TMA store from shared to global memory: what lies past the array's end is dropped (as the copy engine
    does), and ``reduction_op="add"`` adds into global memory, atomically."""
    p = _private()
    gc = p.gpu_callbacks
    if predicate is not None or reduction_op not in (None, "add"):
        raise NotImplementedError(f"TMA store with reduction_op={reduction_op!r}, predicate={predicate!r}")
    memory = gc._get_shared_memory()
    thread = memory.get_global_thread_id(int(device_id), int(thread_id))
    info = p.interpret_utils.GPULoggingInfo(
        device_id=int(device_id),
        thread_id=int(thread_id),
        grid_point_coords=tuple(int(x) for x in grid_point_coords),
        source_info=source_info,
    )
    value = _read(memory, src_allocation_key_as_array, src_transforms, thread, info)
    key = gc.HostAllocationKey.from_array(dst_allocation_key_as_array)
    dst_range = p.interpret_utils.to_range(jax.tree.map(int, gc._remove_noop_transforms(dst_transforms)))
    with _LOCK:
        whole, _, _ = memory.get_buffer_content(key, (), thread, logging_info=info)
        _refuse_folded_overrun(dst_range, whole.shape, info)
        clipped, kept = _clip(dst_range, whole.shape)
        if clipped is None:  # wholly past the end
            return token
        value = value[kept]
        if reduction_op == "add":
            old, _, _ = memory.get_buffer_content(key, clipped, thread, logging_info=info)
            value = old + value
        memory.store_buffer_content(key, clipped, value, thread, logging_info=info)
    return token


TMA_AXIS_LIMIT = 256  # elements a TMA copy moves along one axis at most


def _refuse_long_copy(data):
    """A TMA load of more than 256 elements along an axis: Mosaic GPU refuses it when it compiles the kernel."""
    shape = tuple(getattr(data, "shape", ()))
    if any(n > TMA_AXIS_LIMIT for n in shape):
        raise ValueError(
            f"Async copies only support copying <={TMA_AXIS_LIMIT} elements along each dimension, got "
            f"{shape} (split the copy: a GPU refuses it)"
        )


COPY_BYTES_QUANTUM = 128  # bytes: a copy into shared memory moves a multiple of this (one per warpgroup thread)


def _refuse_ragged_copy(data):
    """A TMA load of a number of bytes that is not a multiple of 128: Mosaic GPU refuses it when it compiles the
    kernel (every thread of the warpgroup arrives on the barrier with its share of the bytes)."""
    nbytes = int(getattr(data, "nbytes", 0))
    if nbytes % COPY_BYTES_QUANTUM:
        raise ValueError(
            f"Only copies transferring a number of bytes divisible by {COPY_BYTES_QUANTUM} are supported; got "
            f"{nbytes} bytes of shape {tuple(data.shape)} (pad the copy: a GPU refuses it)"
        )


def _refuse_folded_overrun(index, shape, info):
    """A store of a slice of the innermost axis, every other axis fixed, that runs past that axis's end: on the GPU
    the copy sees one flat run of memory there, and what lies past the end lands on the next row (another head's
    or batch row's), so it is refused here rather than clipped."""
    if len(index) != len(shape) or not isinstance(index[-1], slice):
        return
    if not all(isinstance(i, int) for i in index[:-1]) or len(shape) < 2:
        return
    last = index[-1]
    if last.stop is not None and last.stop > shape[-1]:
        where = _kernel_line(info.source_info) if getattr(info, "source_info", None) else "in the kernel"
        raise ValueError(
            f"a TMA store of {index} into an array of shape {tuple(shape)} runs past the end of its "
            f"innermost axis ({last.stop} > {shape[-1]}, {where}): on the GPU it would land on the next "
            "row. Pad that axis to a whole number of tiles."
        )


def _clip(index, shape):
    """An index (ints and slices over ``shape``'s leading axes) cut to the array: (the cut index, the slice of the
    stored value that lands inside), or (None, None) when nothing does."""
    cut, kept = [], []
    for i, n in zip(index, shape):
        if isinstance(i, int):
            if not 0 <= i < n:
                return None, None
            cut.append(i)
            continue
        start, stop = i.start or 0, min(i.stop if i.stop is not None else n, n)
        if start >= stop:
            return None, None
        cut.append(slice(start, stop))
        kept.append(slice(0, stop - start))
    kept += [slice(None)] * (len(shape) - len(index))
    return tuple(cut), tuple(kept)
