"""What the Mosaic GPU kernels share: how the two compute warpgroups take turns (:class:`Schedule`), the steps a
warpgroup skips, the copy warpgroup's ring of shared-memory slots, the call that launches one warp-specialised
kernel, and the named regions the in-kernel profiler records.

Every kernel here is one CTA of three warpgroups: two compute, one copies tiles by TMA. Legend: B batch, T query
length, S key length, N heads, K kv heads, H head dim.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
        raise ValueError(
            f"our Mosaic GPU kernels take a positive softmax scale; got {value}. For a negative one, "
            "negate q and pass its absolute value."
        )
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


def query_cta(cfg, T: int, rows: int):
    """The query block a CTA owns (``rows`` query rows each): its grid index, or with ``cfg.heavy_first`` counted
    from the end, so that the blocks a causal mask leaves the most keys start first and a short one ends the
    kernel (FlashAttention-3's longest-first order)."""
    return launch_order(lax.axis_index("q_seq"), padded_rows(T, rows) // rows, cfg.heavy_first)


def launch_order(index, blocks: int, heavy_first: bool):
    """The query block at ``index`` of ``blocks`` in launch order: from the last with ``heavy_first``."""
    return blocks - 1 - index if heavy_first else index


INTERPRETED_CTAS = 3  # persistent CTAs off a GPU (the interpreter): few, so that each walks several query blocks


def sm_count() -> int:
    """The GPU's streaming multiprocessors (132 on an H100 SXM or an H200): how many persistent CTAs a kernel
    launches, one per SM; off a GPU (the interpreter), :data:`INTERPRETED_CTAS`."""
    device = jax.devices()[0]
    return int(getattr(device, "core_count", 0) or 0) if device.platform == "gpu" else INTERPRETED_CTAS


@dataclasses.dataclass(frozen=True)
class Items:
    """The query blocks a forward call computes, ``blocks`` per (batch, head), and the CTAs that compute them.

    ``ctas=0``: a grid, one CTA per block (a CTA's first step waits for its q and k tiles, its last for its stores).
    ``ctas=n``: ``n`` persistent CTAs, one per SM, each walking blocks ``cta, cta + n, …`` of the list ordered by
    query block (outermost) then batch and head, so that its copy warpgroup fetches the next block's keys while
    the compute warpgroups finish the last one's. ``heavy_first``: query blocks counted from the end (under a
    causal mask, those with the most keys first)."""

    heads: int
    blocks: int
    batch: int
    heavy_first: bool = False
    ctas: int = 0

    @property
    def grid(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The launch grid and its axis names."""
        if self.ctas:
            return (self.ctas,), ("cta",)
        return (self.heads, self.blocks, self.batch), ("heads", "q_seq", "batch")

    def each(self, body, carry):
        """``body(batch, head, block, carry, then) -> carry`` for each query block this CTA owns, in order;
        ``then``: the CTA's next block, ``(any, batch, head, block)`` (persistent CTAs), or None (a grid)."""
        import jax.experimental.pallas as pl

        if not self.ctas:
            block = launch_order(lax.axis_index("q_seq"), self.blocks, self.heavy_first)
            return body(lax.axis_index("batch"), lax.axis_index("heads"), block, carry, None)
        rows, total = self.heads * self.batch, self.blocks * self.heads * self.batch  # blocks per query block, in all

        def at(w):  # block w of the launch: (batch, head, query block)
            block, row = lax.div(w, i32(rows)), lax.rem(w, i32(rows))
            return (
                lax.div(row, i32(self.heads)),
                lax.rem(row, i32(self.heads)),
                launch_order(block, self.blocks, self.heavy_first),
            )

        def item(w, carry):
            then = w + self.ctas
            return body(*at(w), carry, (then < total, *at(jnp.minimum(then, total - 1))))

        return pl.loop(lax.axis_index("cta"), i32(total), step=self.ctas, init_carry=carry)(item)


def padded_rows(T: int, rows: int) -> int:
    """T rounded up to a multiple of ``rows``: the length of a per-row vector ((B, N, T): lse, D) that a kernel
    stores or loads ``rows`` at a time by TMA. A vector's last tile must not run past its end: TMA clips a slice of
    the innermost dimension only at the end of the whole array, so rows past T would land on the next head's."""
    return -(-T // rows) * rows


ROW_QUANTUM = 8  # Mosaic GPU copies tiles of an array whose rows (T or S) are a multiple of 8, its tiles' height


def pad_rows(x, axis: int = 1, mode: str = "constant"):
    """``x`` with rows along ``axis`` up to a multiple of :data:`ROW_QUANTUM` (zeros, or ``mode="edge"``: the last
    row repeated); as is when already one. The kernels' masks stop at the true T and S, so a padded key is never
    kept and a padded query's output row is dropped."""
    n = x.shape[axis]
    pad = -n % ROW_QUANTUM
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths, mode=mode)


def i32(x):
    """An int32 scalar (loop bounds stay int32 also under JAX_ENABLE_X64=1)."""
    return jnp.asarray(x, jnp.int32)


def slot_of(t, stages: int):
    """The ring slot of pipeline step ``t``."""
    return lax.rem(i32(t), i32(stages))


def skip_steps(start, stop, stages: int, frees, schedule: Schedule | None = None, readies=()):
    """Steps ``[start, stop)`` of a warpgroup that computes none of them: release each slot (``frees``: the
    barriers the copy warpgroup waits on) after waiting for the copies into it (``readies``: needed when the
    warpgroup will wait on those barriers again, so that it sees every phase), and take the turns of each step, in
    a computed step's order: the first part (k) and q·kᵀ's turn, then the others (v) and p·v's. (With one slot,
    waiting for v before releasing k would wait on the other warpgroup's p·v, which waits for this one's turn.)"""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    def wait(i, slot):
        if i < len(readies):
            plgpu.barrier_wait(readies[i].at[slot])

    @pl.loop(start, stop)
    def _(t):
        slot = slot_of(t, stages)
        wait(0, slot)
        if schedule is not None:
            schedule.before_qk()
            schedule.after_qk()
            schedule.softmax_done()
        plgpu.barrier_arrive(frees[0].at[slot])
        for i in range(1, len(frees)):
            wait(i, slot)
        if schedule is not None:
            schedule.before_pv()
        for free in frees[1:]:
            plgpu.barrier_arrive(free.at[slot])


class Walk:
    """The tiles one CTA walks, and each compute warpgroup's steps over them: by a band's arithmetic
    (:func:`~.masks.band_steps`, pipeline step t is tile ``cta_lo + t``) or by the CTA's tile list
    (:func:`~.masks.tile_lists`, copied into ``scratch.tiles``). ``own``: rows per compute warpgroup (queries, or
    keys in the dK/dV kernel); ``visit``: rows per tile walked; ``mask``: as the kernel walks (a band is
    transposed for the dK/dV kernel). ``shared``: both warpgroups own the same rows (the CTA owns ``own`` rows, not
    2·``own``) and walk the same steps. ``again``: the CTA walks the ring again after this block (persistent CTAs),
    so a warpgroup waits for the copies of every step, also of those it skips after its last tile."""

    def __init__(
        self,
        mask,
        scratch,
        cta_rows,
        *,
        own: int,
        visit: int,
        stages: int,
        padded: int,
        shared: bool = False,
        again: bool = False,
    ):
        from . import masks as M

        self.M, self.mask, self.scratch, self.again = M, mask, scratch, again
        self.own, self.visit, self.stages, self.padded = own, visit, stages, padded
        self.cta_own = own if shared else 2 * own  # rows a CTA owns
        self.lists = mask.has_arrays
        if self.lists:
            self.cta_lo = i32(0)
        else:
            band = [M.band_steps(mask, cta_rows + w * (self.cta_own - own), own, visit) for w in (0, 1)]
            self.cta_lo, self.cta_hi = band[0].lo, jnp.maximum(band[1].hi, band[0].hi)

    @property
    def n_steps(self):
        """The CTA's pipeline steps (tiles walked); with lists, read it only once the list has landed (:meth:`scalars`
        or :meth:`copy_steps` wait for it)."""
        return self.scratch.tiles[1] if self.lists else self.cta_hi - self.cta_lo

    def block_of(self, t):
        """The tile (its index in the array) of pipeline step ``t``."""
        return self.scratch.tiles[self.M.HEADER + t] if self.lists else self.cta_lo + t

    def state_of(self, t, w):
        return self.scratch.tiles[self.M.HEADER + (1 + w) * self.padded + t]

    def scalars(self):
        """(prefix, q_len, kv_len) of this batch row from the tile list (waiting for it), or None."""
        import jax.experimental.pallas.mosaic_gpu as plgpu

        if not self.lists:
            return None
        plgpu.barrier_wait(self.scratch.tiles_ready)
        tiles = self.scratch.tiles
        return tiles[2], tiles[3], tiles[4]

    def copy_steps(self, tiles_ref, batch, cta):
        """The copy warpgroup: copy the CTA's tile list in (lists); the number of tiles to walk."""
        import jax.experimental.pallas as pl
        import jax.experimental.pallas.mosaic_gpu as plgpu

        if self.lists:
            for start, size in self.M.list_copies(self.padded):  # TMA copies at most 256 elements a row
                span = pl.ds(start, size)
                plgpu.copy_gmem_to_smem(
                    tiles_ref.at[batch, cta, span], self.scratch.tiles.at[span], self.scratch.tiles_ready
                )
            plgpu.barrier_wait(self.scratch.tiles_ready)
        return self.n_steps

    def loops(
        self,
        step,
        carry,
        row0,
        *,
        frees,
        readies,
        trailing_readies=(),
        schedule=None,
        wait_own=None,
        offset=0,
        ragged_owner=False,
    ):
        """One compute warpgroup's steps (pipeline steps ``offset + t``): ``step(t, carry, masked=…,
        look_ahead=…)`` over the tiles it keeps wholly (unmasked) or in part (masked); the tiles it keeps nothing of
        are skipped (slots released, ``schedule``'s turns taken; ``readies`` waited where the warpgroup waits on
        them again, ``trailing_readies`` after its last tile). ``wait_own(t)``: the steps wait for each other's
        data (a step waits for step t + 1's while it finishes, ``look_ahead`` bounding it), so the first step of
        each run waits through it; without it every step waits for its own. ``ragged_owner``: the warpgroup
        holding the last, partly filled own tile masks every step."""
        import jax.experimental.pallas as pl

        M, mask, stages = self.M, self.mask, self.stages
        wg = lax.axis_index("wg")

        def skip(lo, hi, waits):
            skip_steps(offset + lo, offset + hi, stages, frees, schedule, waits)

        if self.lists:
            tiles = self.scratch.tiles
            n_full, n_total = tiles[0], tiles[1]
            if wait_own is not None:
                pl.when(n_full > 0)(functools.partial(wait_own, offset))
            carry = lax.fori_loop(0, n_full, functools.partial(step, look_ahead=n_full), carry)

            def partial_step(t, carry):  # masked, or skipped by this warpgroup
                def compute(carry):
                    if wait_own is not None:
                        wait_own(offset + t)
                    return step(t, carry, masked=True)

                def nothing(carry):
                    skip(t, t + 1, readies)
                    return carry

                return lax.cond(self.state_of(t, wg) == M.EMPTY, nothing, compute, carry)

            return lax.fori_loop(n_full, n_total, partial_step, carry)
        n = self.n_steps
        band = M.band_steps(mask, row0, self.own, self.visit)
        lo, full_lo, full_hi, hi = (jnp.clip(x - self.cta_lo, 0, n) for x in band)
        if ragged_owner:  # the last own tile's rows past the end: every step masks
            whole = row0 + self.own <= mask.seq_q
            full_lo, full_hi = jnp.where(whole, full_lo, lo), jnp.where(whole, full_hi, lo)
        if mask.left is not None:  # tiles before this warpgroup's band
            skip(0, lo, readies)
        if wait_own is not None:
            pl.when(lo < hi)(functools.partial(wait_own, offset + lo))
        masked = functools.partial(step, masked=True, look_ahead=hi)
        if mask.left is not None:
            carry = lax.fori_loop(lo, full_lo, masked, carry)
        carry = lax.fori_loop(full_lo, full_hi, functools.partial(step, look_ahead=hi), carry)
        if mask.right is not None or mask.seq_kv % self.visit or ragged_owner:
            carry = lax.fori_loop(full_hi, hi, masked, carry)
        if mask.right is not None or mask.seq_q % self.cta_own:  # tiles past it (warpgroup 0 ends early)
            skip(hi, n, readies if self.again else trailing_readies)
        return carry


def copy_ring(parts, *, stages: int, steps, region, guard: bool = False, after=None, pending=None):
    """A copy warpgroup's ring of ``stages`` shared-memory slots over ``steps`` pipeline steps. ``parts``: pairs
    (free, copy): ``copy(t, slot)`` starts the TMA copies of step t into ``slot``, and ``free`` is the barrier both
    compute warpgroups release that slot's part on (k and v apart, so that k's refill need not wait for p·v). The
    first ``stages`` steps fill the ring (``guard``: only those that exist, when ``steps`` may be fewer).
    ``after(t)``: what the copy warpgroup does for step t once its slot is refilled (the last ``stages`` steps after
    the ring), every step in order: the backward's stores of what the compute warpgroups staged.

    ``pending`` (persistent CTAs, a ring run once per query block): the slots below it still hold a release the
    copy warpgroup has not waited for (the last use of each slot by the blocks before), so filling one waits for it
    first. Returns the ``pending`` of the next block (None without one)."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    def fill(i):
        for free, copy in parts:
            if pending is not None:  # the slot's last use by the block before must be over
                with region("wait"):
                    pl.when(i < pending)(lambda free=free: plgpu.barrier_wait(free.at[i]))
            with region("copy"):
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
        if after is not None:
            after(t)

    if after is not None:
        pl.loop(jnp.maximum(steps - stages, 0), steps)(after)
    if pending is None:
        return None
    return jnp.maximum(pending, jnp.minimum(i32(steps), i32(stages)))


def regions(profile: bool):
    """``region(name)``: a context naming the instructions traced inside it for Pallas Mosaic GPU's in-kernel
    profiler (``jax.named_scope``; the profiler stamps the SM clock where a region starts and ends, per warpgroup).
    Without ``profile`` it does nothing, so the kernel traces exactly as it would without it."""

    def region(name: str):
        if name not in REGIONS:
            raise ValueError(f"region name must be one of {REGIONS}; got {name!r}.")
        return jax.named_scope(name) if profile else contextlib.nullcontext()

    return region


def swizzled_tiles(swizzle: int = 128):
    """16-bit shared-memory tiles in 8 × (swizzle / 2) tiles with a ``swizzle``-byte swizzle: the layout wgmma and
    TMA read without bank conflicts at 128 bytes. wgmma reads a right operand whose rows are its contraction (v in
    p·v) in runs of swizzle / 2 rows: a key tile of 32 · odd keys needs the 64-byte swizzle, of 16 · odd keys (176:
    FlashAttention-3's tile at H = 128) the 32-byte one (:func:`rows_swizzle`)."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    return (plgpu.TilingTransform((8, swizzle // 2)), plgpu.SwizzleTransform(swizzle))


def rows_swizzle(rows: int) -> int:
    """The widest swizzle (bytes) of a 16-bit tile whose ``rows`` wgmma contracts over: 128 for a multiple of 64
    rows, 64 for a multiple of 32, 32 for a multiple of 16 (wgmma's contraction step in 16 bits)."""
    return 128 if rows % 64 == 0 else 64 if rows % 32 == 0 else 32


def load_vector(ref, layout):
    """A whole shared-memory vector into registers in ``layout`` (jax 0.11 takes no index; jax 0.10 needs ``()``)."""
    import inspect

    import jax.experimental.pallas.mosaic_gpu as plgpu

    idx = inspect.signature(plgpu.load).parameters.get("idx")
    if idx is not None and idx.default is inspect.Parameter.empty:
        return plgpu.load(ref, (), layout=layout)
    return plgpu.load(ref, layout=layout)


def compiler_params(profile_space: int = 0, profile_dir: str = ""):
    """What every kernel of ours compiles with: exp2 as the hardware's ``ex2.approx``; no shared memory set aside
    for reductions across warps (Pallas keeps 2 KiB for them by default: the kernels reduce only along a row of
    wgmma's layout, which stays within a warp, and those 2 KiB let H = 256 take 80-key tiles); the profiler when
    ``profile_space`` is set."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    profile = {"profile_space": profile_space, "profile_dir": profile_dir} if profile_space else {}
    return plgpu.CompilerParams(approx_math=True, reduction_scratch_bytes=0, **profile)


def call(body, out_type, scratch, grid, grid_names, *args, profile_space: int = 0, profile_dir: str = ""):
    """One warp-specialised Mosaic GPU kernel: two compute warpgroups and one copy warpgroup per CTA
    (:func:`compiler_params`). With ``profile_space`` (regions per warpgroup) and ``profile_dir``, Pallas's
    in-kernel profiler writes each call's per-warpgroup trace (Chrome trace JSON) into ``profile_dir``."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    return plgpu.kernel(
        _entry(body, scratch),
        out_type=out_type,
        grid=grid,
        grid_names=grid_names,
        num_threads=3,  # warpgroups per CTA: two compute, one copy
        thread_name="wg",
        compiler_params=compiler_params(profile_space, profile_dir),
    )(*args)


def call_into(body, args, outs, scratch, grid, grid_names, *, profile_space: int = 0, profile_dir: str = ""):
    """:func:`call` for a kernel that adds into its outputs: ``outs`` (arrays: their starting values, zeros for a sum)
    come into the kernel as refs after ``args`` and go out with what the kernel wrote; returns them."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    mesh = plgpu.Mesh(grid=grid, grid_names=grid_names, num_threads=3, thread_name="wg")
    refs = [jax.new_ref(x) for x in outs]
    kernel = pl.kernel(
        _entry(body, scratch), out_type=(), mesh=mesh, compiler_params=compiler_params(profile_space, profile_dir)
    )
    kernel(*args, *refs)
    return tuple(r[...] for r in refs)


def _entry(body, scratch):
    """The kernel's entry: ``body(*refs, scoped)`` with the ``scratch`` (a pytree of shared memory and barriers:
    ``scoped`` has its structure) allocated once for the CTA's three warpgroups."""
    import jax.experimental.pallas as pl

    def entry(*refs):
        pl.run_scoped(lambda scoped: body(*refs, scoped), scratch, collective_axes="wg")

    entry.__name__ = getattr(body, "func", body).__name__  # the kernel's name in dumps, traces and profiles
    return entry
