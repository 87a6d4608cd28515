"""Context parallelism on simulated CPU devices (tests/conftest.py sets 8): values and gradients against the
float64 reference, load balance, communication model, errors, and the collectives in the compiled program."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.inputs import make_qkv
from attention_tutorial.kernels import context_parallel as cp
from attention_tutorial.kernels.reference import naive_attention, reference_attention

needs8 = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (XLA_FLAGS host device count)")


def _cp(mesh, **opts):
    return jax.jit(lambda q, k, v: cp.context_parallel_attention(q, k, v, mesh=mesh, **opts))


@needs8
@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize("strategy", cp.STRATEGIES)
@pytest.mark.parametrize("layout", cp.LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_values_match_float64_reference(devices, strategy, layout, causal):
    q, k, v = make_qkv(2, 32, 4, 8, kv_heads=2, seed=devices)  # GQA: 2 query heads per kv head
    out = _cp(cp.sequence_mesh(devices), strategy=strategy, layout=layout, is_causal=causal)(q, k, v)
    np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=causal), atol=2e-5, rtol=2e-5)


def test_non_causal_key_length_may_differ():
    q, k, v = make_qkv(1, 16, 2, 8, seq_kv=24, seed=3)
    out = _cp(cp.sequence_mesh(2), layout="contiguous")(q, k, v)
    np.testing.assert_allclose(out, reference_attention(q, k, v), atol=2e-5)


def _grad_reference(q, k, v, d_out, causal):
    """Gradients by autodiff of the naive attention in float64."""
    with jax.enable_x64(True):
        f = lambda q, k, v: naive_attention(q, k, v, is_causal=causal)  # noqa: E731
        _, vjp = jax.vjp(f, *(jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, v)))
        return [np.asarray(g) for g in vjp(jnp.asarray(np.asarray(d_out), jnp.float64))]


@needs8
@pytest.mark.parametrize(
    ("devices", "strategy", "layout", "causal"),
    [
        (4, "ring", "zigzag", True),
        (8, "ring", "zigzag", True),
        (2, "ring", "zigzag", False),
        (4, "ring", "contiguous", True),
        (4, "allgather", "zigzag", True),
        (2, "allgather", "contiguous", False),
    ],
)
def test_gradients_match_float64_autodiff(devices, strategy, layout, causal):
    q, k, v = make_qkv(1, 32, 4, 8, kv_heads=2, seed=7)
    d_out = jax.random.normal(jax.random.key(1), q.shape, q.dtype)
    f = lambda q, k, v: cp.context_parallel_attention(  # noqa: E731
        q, k, v, mesh=cp.sequence_mesh(devices), strategy=strategy, layout=layout, is_causal=causal
    )
    got = jax.jit(lambda q, k, v, d: jax.vjp(f, q, k, v)[1](d))(q, k, v, d_out)
    for g, want in zip(got, _grad_reference(q, k, v, d_out, causal)):
        np.testing.assert_allclose(g, want, atol=5e-5, rtol=5e-5)


@needs8
def test_autodiff_path_for_a_local_step_without_backward():
    # a local step given without local_bwd: JAX's autodiff through the ring instead of the ring's own backward
    q, k, v = make_qkv(1, 32, 4, 8, kv_heads=2, seed=7)
    d_out = jax.random.normal(jax.random.key(1), q.shape, q.dtype)
    f = lambda q, k, v: cp.context_parallel_attention(  # noqa: E731
        q, k, v, mesh=cp.sequence_mesh(4), is_causal=True, local=functools.partial(cp.blockwise_local, block=8)
    )
    got = jax.jit(lambda q, k, v, d: jax.vjp(f, q, k, v)[1](d))(q, k, v, d_out)
    for g, want in zip(got, _grad_reference(q, k, v, d_out, True)):
        np.testing.assert_allclose(g, want, atol=5e-5, rtol=5e-5)


def test_local_backward_contributions_add_up():
    # the ring backward's building block: each key block's share, from the merged out and lse, sums to the whole
    q, k, v = make_qkv(1, 12, 2, 8, seq_kv=20, seed=4)
    d_out = jax.random.normal(jax.random.key(2), q.shape, q.dtype)
    out, lse = cp.blockwise_local(q, k, v, is_causal=False, scale=0.3)
    parts = [
        cp.blockwise_local_bwd(q, k[:, s], v[:, s], out, lse, d_out, is_causal=False, scale=0.3, block=4)
        for s in (slice(0, 7), slice(7, 20))
    ]
    f = lambda q, k, v: naive_attention(q, k, v, scale=0.3)  # noqa: E731
    dq, dk, dv = jax.vjp(f, q, k, v)[1](d_out)
    np.testing.assert_allclose(parts[0][0] + parts[1][0], dq, atol=2e-5)
    np.testing.assert_allclose(np.concatenate([parts[0][1], parts[1][1]], axis=1), dk, atol=2e-5)
    np.testing.assert_allclose(np.concatenate([parts[0][2], parts[1][2]], axis=1), dv, atol=2e-5)


@pytest.mark.parametrize(("causal", "layout"), [(True, "zigzag"), (True, "contiguous"), (False, "zigzag")])
def test_emulated_ring_matches_reference(causal, layout):
    q, k, v = make_qkv(1, 12, 2, 8, seed=2)
    out = jax.jit(lambda q, k, v: cp.emulate_ring(q, k, v, devices=3, is_causal=causal, layout=layout))(q, k, v)
    np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=causal), atol=2e-5)


def test_merge_of_two_halves_is_the_whole():
    q, k, v = make_qkv(1, 8, 2, 8, seq_kv=12, seed=5)
    local = lambda q, k, v: cp.blockwise_local(q, k, v, is_causal=False, scale=8**-0.5)  # noqa: E731
    out, lse = cp.merge(local(q, k[:, :5], v[:, :5]), local(q, k[:, 5:], v[:, 5:]))
    whole_out, whole_lse = local(q, k, v)
    np.testing.assert_allclose(out, whole_out, atol=1e-6)
    np.testing.assert_allclose(lse, whole_lse, atol=1e-6)


def test_merge_with_an_empty_part_keeps_the_other_and_has_finite_gradients():
    q, k, v = make_qkv(1, 8, 2, 8, seed=5)
    part = cp.blockwise_local(q, k, v, is_causal=True, scale=0.3)
    empty = (jnp.zeros(q.shape), jnp.full((1, 2, 8), -jnp.inf))
    out, lse = cp.merge(empty, part)
    np.testing.assert_allclose(out, part[0], atol=1e-7)
    both_empty = cp.merge(empty, empty)
    assert (np.asarray(both_empty[0]) == 0).all() and np.isneginf(np.asarray(both_empty[1])).all()
    g = jax.grad(lambda q: cp.merge(empty, cp.blockwise_local(q, k, v, is_causal=True, scale=0.3))[0].sum())(q)
    assert np.isfinite(np.asarray(g)).all()


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_causal_work_counts_and_balance(devices):
    T = 16 * devices
    for layout in cp.LAYOUTS:
        work = cp.causal_work(T, devices, layout)
        assert work.shape == (devices, devices)
        assert work.sum() == T * (T + 1) // 2  # every kept (query, key) pair once
    naive, zigzag = cp.causal_work(T, devices, "contiguous"), cp.causal_work(T, devices, "zigzag")
    assert (zigzag == zigzag[:, :1]).all()  # every device does the same work at every step
    assert naive[1:, 0].sum() == 0 and naive[:, -1].sum() > naive[:, 0].sum()  # device 0 idles after step 0


@needs8
def test_without_reorder_the_data_stays_in_layout_order():
    q, k, v = make_qkv(1, 16, 2, 8, seed=9)
    perm = cp.layout_permutation(16, 4, "zigzag")
    out = _cp(cp.sequence_mesh(4), is_causal=True, reorder=False)(q[:, perm], k[:, perm], v[:, perm])
    np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=True)[:, perm], atol=2e-5)


def test_layout_permutation():
    np.testing.assert_array_equal(cp.layout_permutation(8, 2, "zigzag"), [0, 1, 6, 7, 2, 3, 4, 5])
    np.testing.assert_array_equal(cp.layout_permutation(4, 2, "contiguous"), [0, 1, 2, 3])


def test_communication_model():
    assert cp.ring_step_bytes(8192, 8, 8, 128, jnp.bfloat16, batch=2) == 2 * 2 * 1024 * 8 * 128 * 2
    # compute 4·N·H·c² / F equals transfer 2·c·K·H·itemsize / W at the returned chunk c
    c = cp.chunk_to_hide_transfer(32, 8, jnp.bfloat16, flops_per_s=5e14, bytes_per_s=4e11)
    assert 4 * 32 * 128 * c**2 / 5e14 == pytest.approx(2 * c * 8 * 128 * 2 / 4e11)


@needs8
@pytest.mark.parametrize(
    ("strategy", "present", "absent"),
    [("ring", "collective-permute", "all-gather"), ("allgather", "all-gather", "collective-permute")],
)
def test_compiled_program_holds_the_collectives(strategy, present, absent):
    q, k, v = make_qkv(1, 32, 2, 8)
    mesh = cp.sequence_mesh(4)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "seq"))
    f = lambda q, k, v: cp.context_parallel_attention(q, k, v, mesh=mesh, strategy=strategy, reorder=False)  # noqa: E731
    hlo = jax.jit(f).lower(*(jax.device_put(x, sharding) for x in (q, k, v))).compile().as_text()
    assert present in hlo and absent not in hlo
    counts = cp.collectives(hlo)
    if strategy == "ring":  # P - 1 = 3 steps pass K/V on (k and v may travel in one op or two)
        assert counts == {"all-gather": 0, "collective-permute": counts["collective-permute"]}
        assert counts["collective-permute"] in (3, 6)
    else:
        assert counts == {"all-gather": 2, "collective-permute": 0}  # k and v


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        ({"strategy": "tree"}, "strategy must be one of"),
        ({"layout": "striped"}, "layout must be one of"),
        ({"axis": "data"}, "mesh has no axis 'data'"),
        ({"devices": 3}, r"T=32 must be a multiple of 6"),
    ],
)
def test_bad_arguments(opts, match):
    q, k, v = make_qkv(1, 32, 2, 8)
    mesh = cp.sequence_mesh(opts.pop("devices", 2))
    with pytest.raises(ValueError, match=match):
        cp.context_parallel_attention(q, k, v, mesh=mesh, **opts)


def test_causal_needs_equal_lengths():
    q, k, v = make_qkv(1, 16, 2, 8, seq_kv=32)
    with pytest.raises(ValueError, match="T == S"):
        cp.context_parallel_attention(q, k, v, mesh=cp.sequence_mesh(2), is_causal=True)


def test_too_many_devices_says_how_to_simulate():
    with pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
        cp.sequence_mesh(len(jax.devices()) + 1)


def test_bad_mesh_and_truthy_is_causal_are_refused():
    q, k, v = make_qkv(1, 32, 2, 8, seed=0)
    with pytest.raises(ValueError, match="sequence_mesh"):
        cp.context_parallel_attention(q, k, v, mesh=None)
    with pytest.raises(ValueError, match="is_causal must be True or False"):
        cp.context_parallel_attention(q, k, v, mesh=cp.sequence_mesh(2), is_causal="no", block=8)


def test_local_steps_by_name():
    local, local_bwd = cp.local_steps("blockwise", block=8)
    q, k, v = make_qkv(1, 16, 2, 8, seed=6)
    out, lse = local(q, k, v, is_causal=True, scale=8**-0.5)
    np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=True), atol=2e-5)
    assert lse.shape == (1, 2, 16)
    assert cp.local_steps("mosaic") == (cp.mosaic_local, cp.mosaic_local_bwd)
    with pytest.raises(ValueError, match="local step must be one of"):
        cp.local_steps("cudnn")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_mosaic_local_step_in_the_ring(causal):
    # our Mosaic kernel as the local step: 4 emulated ring steps (values), and the ring on a one-device mesh with
    # the Mosaic backward from the merged out and lse (gradients), against float64 NumPy
    from attention_tutorial.inputs import AttentionShape
    from attention_tutorial.kernels.mosaic import why_not
    from tests.kernels.test_pallas_flash import assert_grads_match

    if reason := why_not(AttentionShape(1, 1024, 1024, 4, 2, 128), jnp.bfloat16, causal):
        pytest.skip(reason)
    q, k, v = make_qkv(1, 1024, 4, 128, kv_heads=2, dtype=jnp.bfloat16, seed=11)
    local, local_bwd = cp.local_steps("mosaic")
    out = jax.jit(lambda q, k, v: cp.emulate_ring(q, k, v, devices=4, is_causal=causal, local=local))(q, k, v)
    want = reference_attention(q, k, v, is_causal=causal)
    np.testing.assert_allclose(np.asarray(out, np.float64), want, atol=2e-2, rtol=2e-2)
    d_out = jax.random.normal(jax.random.key(3), q.shape, jnp.float32).astype(q.dtype)
    f = lambda q, k, v: cp.context_parallel_attention(  # noqa: E731
        q, k, v, mesh=cp.sequence_mesh(1), is_causal=causal, local=local, local_bwd=local_bwd
    )
    got = jax.jit(lambda q, k, v, d: jax.vjp(f, q, k, v)[1](d))(q, k, v, d_out)
    assert_grads_match(got, q, k, v, d_out, causal=causal, tol=3e-2)


@pytest.mark.parametrize("devices", [0, -1, 2.0, True, None])
def test_emulated_and_real_rings_refuse_what_is_no_device_count(devices):
    q, k, v = make_qkv(1, 16, 2, 8, seed=3)
    with pytest.raises(ValueError, match="devices must be an integer >= 1"):
        cp.emulate_ring(q, k, v, devices=devices)
    for fn in (cp.sequence_mesh, lambda p: cp.layout_permutation(16, p, "zigzag")):
        with pytest.raises(ValueError, match="devices must be an integer >= 1"):
            fn(devices if devices is not None else 0)


@pytest.mark.parametrize(
    ("local", "said"),
    [
        (lambda q, k, v, **kw: q, "it returned shape"),
        (lambda q, k, v, **kw: (q, q, q), "a tuple of 3"),
        (lambda q, k, v, **kw: (q, q), "lse (1, 2, "),
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_a_local_step_breaking_its_contract_is_named(local, said, causal):
    q, k, v = make_qkv(1, 16, 2, 8, seed=4)
    for run in (
        lambda: cp.emulate_ring(q, k, v, devices=2, is_causal=causal, local=local),
        lambda: cp.context_parallel_attention(q, k, v, mesh=cp.sequence_mesh(2), is_causal=causal, local=local),
    ):
        with pytest.raises(ValueError, match=r"local must return \(out, lse\)") as err:
            run()
        assert said in str(err.value)


def test_a_local_backward_breaking_its_contract_is_named():
    q, k, v = make_qkv(1, 16, 2, 8, seed=5)

    def ring(q):
        bad = lambda *a, **kw: a[0]  # noqa: E731
        return cp.context_parallel_attention(q, k, v, mesh=cp.sequence_mesh(2), block=4, local_bwd=bad).sum()

    with pytest.raises(ValueError, match=r"local_bwd must return \(dq, dk, dv\)"):
        jax.grad(ring)(q)
    with pytest.raises(ValueError, match="local must be a function or None; got int"):
        cp.emulate_ring(q, k, v, devices=2, local=3)


def test_flags_and_sizes_of_the_helpers_are_checked():
    q, k, v = make_qkv(1, 16, 2, 8, seed=6)
    with pytest.raises(ValueError, match="reorder must be True or False"):
        cp.context_parallel_attention(q, k, v, mesh=cp.sequence_mesh(2), reorder="no")
    with pytest.raises(ValueError, match="is_causal must be True or False"):
        cp.emulate_ring(q, k, v, devices=2, is_causal="no")
    with pytest.raises(ValueError, match="T == S"):
        cp.emulate_ring(q, k[:, :8], v[:, :8], devices=2, is_causal=True)
    with pytest.raises(ValueError, match="seq must be an integer >= 1"):
        cp.causal_work(0, 2, "zigzag")
    with pytest.raises(ValueError, match="batch must be an integer >= 1"):
        cp.ring_step_bytes(16, 2, 1, 8, "bfloat16", batch=0)
    with pytest.raises(ValueError, match="bytes_per_s must be a finite number > 0"):
        cp.chunk_to_hide_transfer(2, 1, "bfloat16", flops_per_s=1e15, bytes_per_s=0)


def test_a_scale_that_would_overflow_the_merges_is_refused():
    q, k, v = make_qkv(1, 16, 2, 8, seed=7)
    with pytest.raises(ValueError, match=r"scale=1e\+38 can make scores up to .* log-sum-exp merges"):
        cp.emulate_ring(q, k, v, devices=2, scale=1e38)
    with pytest.raises(ValueError, match="log-sum-exp merges"):
        cp.context_parallel_attention(q, k, v, mesh=cp.sequence_mesh(2), scale=1e38)
    # a large scale that fits is computed, and matches the float64 reference
    out = cp.emulate_ring(q, k, v, devices=2, scale=1e3, block=4)
    np.testing.assert_allclose(out, reference_attention(q, k, v, scale=1e3), atol=1e-5)
