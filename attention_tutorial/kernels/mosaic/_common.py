"""What the Mosaic GPU kernels share: the causal block mask and step counts, the loop that lets a finished warpgroup
keep the others going, the k/v copy ring, the call that launches one warp-specialised kernel, and the named regions
the in-kernel profiler records.

Every kernel here is one CTA of three warpgroups: two compute, one copies tiles by TMA. Legend: B batch, T query
length, S key length, N heads, K kv heads, H head dim.
"""

from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from ...inputs import resolve_scale

LOG2E = math.log2(math.e)

# The regions a profiled kernel records, by the name the trace gives them (see ``regions``); the backward names its
# gradient matmuls "grads" and the sending out of dQ's share "dq_add"; "pv" is the forward's alone.
REGIONS = ("qk", "softmax", "pv", "wait", "copy", "grads", "dq_add")


def shared_lowering(*static: str):
    """A kernel's entry jitted with its options (``static``) static, so that every call with the same shapes and
    options in one program shares one lowering and one compiled kernel. Without it each call site (a model's
    layers, a ring's steps, the two passes of a twin run) lowers and compiles its own copy, seconds each."""
    return functools.partial(jax.jit, static_argnames=static)


def on_hopper() -> str | None:
    """Why this machine cannot run a Hopper (sm_90) kernel, or None."""
    if jax.default_backend() != "gpu":
        return "it is a Hopper (sm_90) kernel: it needs an NVIDIA H100/H200-class GPU."
    cc = getattr(jax.devices()[0], "compute_capability", "")
    if not str(cc).startswith("9"):
        return f"it uses Hopper-only instructions (wgmma, TMA): needs compute capability 9.x, this GPU has {cc}."
    return None


def positive_scale(scale, head_dim: int) -> float:
    """:func:`~attention_tutorial.inputs.resolve_scale`, refusing zero and negative scales: our kernels take each
    row's running maximum of the raw scores and multiply it by the scale, which is the maximum of the scaled ones only
    for a positive scale (a masked score is -inf, and -inf · 0 is NaN)."""
    value = resolve_scale(scale, head_dim)
    if value <= 0:
        raise ValueError(f"our Mosaic GPU kernels take a positive softmax scale; got {value}. For a negative one, "
                         "negate q and pass its absolute value.")  # fmt: skip
    return value


class Schedule:
    """How the two compute warpgroups share the tensor cores (``MosaicConfig.schedule``), as calls a step makes.

    ``"rendezvous"`` (after JAX's ``attention_mgpu``): one two-party barrier that both warpgroups meet at twice per
    step, once after issuing q·kᵀ and once between the softmax and p·v; warpgroup 1 starts half a step late.
    ``"turns"`` (FlashAttention-3's): each warpgroup waits on its own barrier before issuing q·kᵀ and arrives on
    the other's right after, so a turn passes from one to the other and neither waits for the other's softmax.
    """

    def __init__(self, kind: str, barriers, wg):
        self.kind, self.barriers, self.wg = kind, barriers, wg

    def _meet(self):
        import jax.experimental.pallas.mosaic_gpu as plgpu

        plgpu.barrier_arrive(self.barriers)
        plgpu.barrier_wait(self.barriers)

    def start(self):
        """Before the first step: warpgroup 1 starts half a step late (rendezvous) / lets warpgroup 0 go first."""
        import jax.experimental.pallas as pl
        import jax.experimental.pallas.mosaic_gpu as plgpu

        if self.kind == "rendezvous":
            pl.when(self.wg == 1)(self._meet)
        else:
            pl.when(self.wg == 1)(lambda: plgpu.barrier_arrive(self.barriers.at[0]))

    def before_qk(self):
        """Before issuing q·kᵀ: wait for our turn (turns only)."""
        import jax.experimental.pallas.mosaic_gpu as plgpu

        if self.kind == "turns":
            plgpu.barrier_wait(self.barriers.at[self.wg])

    def after_qk(self):
        """Right after issuing q·kᵀ: hand the tensor cores over."""
        import jax.experimental.pallas.mosaic_gpu as plgpu

        if self.kind == "rendezvous":
            self._meet()
        else:
            plgpu.barrier_arrive(self.barriers.at[1 - self.wg])

    def softmax_done(self):
        """After the softmax (rendezvous: the first half of the second meeting)."""
        import jax.experimental.pallas.mosaic_gpu as plgpu

        if self.kind == "rendezvous":
            plgpu.barrier_arrive(self.barriers)

    def before_pv(self):
        """Before issuing p·v (rendezvous: wait until the other warpgroup has issued its q·kᵀ)."""
        import jax.experimental.pallas.mosaic_gpu as plgpu

        if self.kind == "rendezvous":
            plgpu.barrier_wait(self.barriers)

    def skip(self):
        """A step this warpgroup does not compute: the same turns, no matmul."""
        self.before_qk()
        self.after_qk()
        self.softmax_done()
        self.before_pv()

    def finish(self):
        """After the last step: warpgroup 0 takes the turn warpgroup 1 left it."""
        import jax.experimental.pallas as pl
        import jax.experimental.pallas.mosaic_gpu as plgpu

        if self.kind == "rendezvous":
            pl.when(self.wg == 0)(self._meet)
        else:
            pl.when(self.wg == 0)(lambda: plgpu.barrier_wait(self.barriers.at[0]))


def schedule_barriers(kind: str):
    """The barriers a :class:`Schedule` of ``kind`` uses."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    return plgpu.Barrier(num_arrivals=2) if kind == "rendezvous" else plgpu.Barrier(num_arrivals=1, num_barriers=2)


def i32(x):
    """An int32 scalar (loop bounds stay int32 also under JAX_ENABLE_X64=1)."""
    return jnp.asarray(x, jnp.int32)


def slot_of(t, stages: int):
    """The ring slot of pipeline step ``t``."""
    return lax.rem(t, jnp.array(stages, jnp.int32))


def skip_steps(start, stop, stages: int, frees, schedule: Schedule | None = None, readies=()):
    """Steps ``[start, stop)`` of a warpgroup that computes none of them: release each slot (``frees``: the
    barriers the copy warpgroup waits on) after waiting for the copies into it (``readies``: needed when the
    warpgroup will wait on those barriers again, so that it sees every phase), and take the turns of each step."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    @pl.loop(start, stop)
    def _(t):
        slot = slot_of(t, stages)
        for ready in readies:
            plgpu.barrier_wait(ready.at[slot])
        for free in frees:
            plgpu.barrier_arrive(free.at[slot])
        if schedule is not None:
            schedule.skip()


def copy_ring(parts, *, stages: int, steps, region, guard: bool = False):
    """A copy warpgroup's ring of ``stages`` shared-memory slots over ``steps`` pipeline steps. ``parts``: pairs
    (free, copy): ``copy(t, slot)`` starts the TMA copies of step t into ``slot``, and ``free`` is the barrier both
    compute warpgroups release that slot's part on (k and v apart, so that k's refill need not wait for p·v). The
    first ``stages`` steps fill the ring (``guard``: only those that exist, when ``steps`` may be fewer)."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    def fill(i):
        with region("copy"):
            for _, copy in parts:
                copy(i32(i), i)

    for i in range(stages):
        if guard:
            pl.when(i < steps)(functools.partial(fill, i))
        else:
            fill(i)

    @pl.loop(0, steps - stages)
    def _(t):  # refill each part of a slot once both compute warpgroups are done with it
        slot = slot_of(t, stages)
        for free, copy in parts:
            with region("wait"):
                plgpu.barrier_wait(free.at[slot])
            with region("copy"):
                copy(t + stages, slot)


def regions(profile: bool):
    """``region(name)``: a context naming the instructions traced inside it for Pallas Mosaic GPU's in-kernel
    profiler (``jax.named_scope``; the profiler stamps the SM clock where a region starts and ends, per warpgroup).
    Without ``profile`` it does nothing, so the kernel traces exactly as it would without it."""

    def region(name: str):
        if name not in REGIONS:
            raise ValueError(f"region name must be one of {REGIONS}; got {name!r}.")
        return jax.named_scope(name) if profile else contextlib.nullcontext()

    return region


def swizzled_tiles():
    """Shared-memory tiles in 8×64 tiles with a 128-byte swizzle: the layout wgmma and TMA read without bank
    conflicts."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    return (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))


def load_vector(ref, layout):
    """A whole shared-memory vector into registers in ``layout`` (jax 0.11 takes no index; jax 0.10 needs ``()``)."""
    import inspect

    import jax.experimental.pallas.mosaic_gpu as plgpu

    idx = inspect.signature(plgpu.load).parameters.get("idx")
    if idx is not None and idx.default is inspect.Parameter.empty:
        return plgpu.load(ref, (), layout=layout)
    return plgpu.load(ref, layout=layout)


def call(body, out_type, scratch, grid, grid_names, *args, profile_space: int = 0, profile_dir: str = ""):
    """One warp-specialised Mosaic GPU kernel: two compute warpgroups and one copy warpgroup per CTA, exp2 as the
    hardware's ``ex2.approx``. With ``profile_space`` (regions per warpgroup) and ``profile_dir``, Pallas's
    in-kernel profiler writes each call's per-warpgroup trace (Chrome trace JSON) into ``profile_dir``."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    profile = {"profile_space": profile_space, "profile_dir": profile_dir} if profile_space else {}
    return plgpu.kernel(
        _entry(body, scratch),
        out_type=out_type,
        grid=grid,
        grid_names=grid_names,
        num_threads=3,  # warpgroups per CTA: two compute, one copy
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True, **profile),
    )(*args)


def call_into(body, args, outs, scratch, grid, grid_names, *, profile_space: int = 0, profile_dir: str = ""):
    """:func:`call` for a kernel that adds into its outputs: ``outs`` (arrays: their starting values, zeros for a sum)
    come into the kernel as refs after ``args`` and go out with what the kernel wrote; returns them."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    mesh = plgpu.Mesh(grid=grid, grid_names=grid_names, num_threads=3, thread_name="wg")
    refs = [jax.new_ref(x) for x in outs]
    profile = {"profile_space": profile_space, "profile_dir": profile_dir} if profile_space else {}
    kernel = pl.kernel(_entry(body, scratch), out_type=(), mesh=mesh,
                       compiler_params=plgpu.CompilerParams(approx_math=True, **profile))  # fmt: skip
    kernel(*args, *refs)
    return tuple(r[...] for r in refs)


def _entry(body, scratch):
    """The kernel's entry: ``body(*refs, scoped)`` with the ``scratch`` (a pytree of shared memory and barriers:
    ``scoped`` has its structure) allocated once for the CTA's three warpgroups."""
    import jax.experimental.pallas as pl

    def entry(*refs):
        pl.run_scoped(lambda scoped: body(*refs, scoped), scratch, collective_axes="wg")

    return entry
def causal_steps(row0, block_q: int, block_kv: int, n_kv: int):
    """How many key blocks a warpgroup whose ``block_q`` rows start at ``row0`` sees under a top-left causal mask:
    those holding a key at or below its last row, ``cdiv(row0 + block_q, block_kv)``, at most the ``n_kv`` there are.
    """
    return jnp.minimum(lax.div(jnp.asarray(row0, jnp.int32) + (block_q + block_kv - 1), jnp.int32(block_kv)), n_kv)


def causal_block_mask(s, row0, key0, *, keys_axis: int = 1):
    """A score tile in wgmma's layout with -inf wherever a key lies past its query row (top-left causal): query rows
    count from ``row0`` and keys from ``key0`` along ``keys_axis`` (1: s is (rows, keys); 0: sᵀ, (keys, rows))."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    first = (row0, key0) if keys_axis == 1 else (key0, row0)
    a = plgpu.broadcasted_iota(jnp.int32, s.shape, 0, layout=plgpu.Layout.WGMMA) + first[0]
    b = plgpu.broadcasted_iota(jnp.int32, s.shape, 1, layout=plgpu.Layout.WGMMA) + first[1]
    rows, keys = (a, b) if keys_axis == 1 else (b, a)
    return jnp.where(keys <= rows, s, -jnp.inf)


def drain(start, stop, stages: int, frees, take_turn=None):
    """Steps ``[start, stop)`` of a warpgroup that has run out of key blocks before its partner (under a causal mask
    warpgroup 0's rows end first): keep releasing each slot (``frees``: the barriers the copy warpgroup waits on) and,
    with ``take_turn``, keep taking both turns of each step, so that the copy warpgroup and the other compute
    warpgroup go on."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    @pl.loop(start, stop)
    def _(j):
        slot = lax.rem(j, jnp.array(stages, j.dtype))
        for free in frees:
            plgpu.barrier_arrive(free.at[slot])
        if take_turn is not None:
            take_turn()
            take_turn()


def copy_kv_ring(k_ref, v_ref, k_smem, v_smem, barriers, *, k_tile, v_tile, stages: int, steps, region):
    """The copy warpgroup of a forward: fill the ring of ``stages`` k/v slots by TMA, then refill each slot as soon
    as both compute warpgroups have released it, for ``steps`` key blocks. ``k_tile(j)``/``v_tile(j)`` index block j
    of ``k_ref``/``v_ref``; ``barriers`` are (k_ready, v_ready, k_free, v_free)."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    k_ready, v_ready, k_free, v_free = barriers
    with region("copy"):
        for i in range(stages):  # fill the ring
            plgpu.copy_gmem_to_smem(k_ref.at[k_tile(i)], k_smem.at[i], k_ready.at[i])
            plgpu.copy_gmem_to_smem(v_ref.at[v_tile(i)], v_smem.at[i], v_ready.at[i])

    @pl.loop(0, steps - stages)
    def _(j):  # refill each slot once both compute warpgroups are done with it
        slot = lax.rem(j, jnp.array(stages, j.dtype))
        with region("wait"):
            plgpu.barrier_wait(k_free.at[slot])
        with region("copy"):
            plgpu.copy_gmem_to_smem(k_ref.at[k_tile(j + stages)], k_smem.at[slot], k_ready.at[slot])
        with region("wait"):
            plgpu.barrier_wait(v_free.at[slot])
        with region("copy"):
            plgpu.copy_gmem_to_smem(v_ref.at[v_tile(j + stages)], v_smem.at[slot], v_ready.at[slot])


