"""Our Pallas kernel: in Pallas's interpreter on the CPU, compiled through Triton on the GPU; forward and gradients."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_tutorial.inputs import AttentionShape
from attention_tutorial.kernels import pallas_flash as pf
from attention_tutorial.kernels.pallas_flash import (
    HOPPER_SMEM_BYTES,
    _bundled_why_not_here,
    _why_not_here,
    flash_attention,
    jax_bundled_mha,
    smem_bytes,
)
from attention_tutorial.kernels.reference import naive_attention, reference_attention
from attention_tutorial.measure.compiled import kernels_used
from tests.kernels.test_reference import normal_qkv


def reference_grads(q, k, v, d_out, *, is_causal=False, scale=None):
    """dq, dk, dv of softmax(q kᵀ · scale, masked) v against d_out: float64 NumPy written from the math, loops over
    heads (independent of every kernel and of JAX's autodiff)."""
    q, k, v, d_out = (np.asarray(x, np.float64) for x in (q, k, v, d_out))
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(H) if scale is None else scale
    allowed = np.arange(S)[None, :] <= np.arange(T)[:, None] if is_causal else np.ones((T, S), bool)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(B):
        for n in range(N):
            h = n // (N // K)
            s = np.where(allowed, q[b, :, n] @ k[b, :, h].T * scale, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            dp = d_out[b, :, n] @ v[b, :, h].T  # dL/dp
            ds = p * (dp - (p * dp).sum(axis=1, keepdims=True))  # through the softmax's Jacobian
            dv[b, :, h] += p.T @ d_out[b, :, n]
            dq[b, :, n] = ds @ k[b, :, h] * scale
            dk[b, :, h] += ds.T @ q[b, :, n] * scale
    return dq, dk, dv


def reference_lse(q, k, *, is_causal=False):
    """Each row's natural log-sum-exp of the scaled, masked scores, (B, N, T), float64."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    T, N, H, S, K = q.shape[1], q.shape[2], q.shape[3], k.shape[1], k.shape[2]
    s = np.einsum("btnh,bsnh->bnts", q, np.repeat(k, N // K, axis=2)) / np.sqrt(H)
    if is_causal:
        s = np.where(np.arange(S)[None, :] <= np.arange(T)[:, None], s, -np.inf)
    m = s.max(axis=-1)
    return m + np.log(np.exp(s - m[..., None]).sum(axis=-1))


def assert_grads_close(fn, q, k, v, *, causal, tol):
    """jax.vjp through ``fn`` against :func:`reference_grads` with a random output gradient."""
    d_out = jnp.asarray(np.random.default_rng(7).standard_normal(q.shape, np.float32), q.dtype)
    _, vjp = jax.vjp(fn, q, k, v)
    assert_grads_match(jax.jit(vjp)(d_out), q, k, v, d_out, causal=causal, tol=tol)


def assert_grads_match(grads, q, k, v, d_out, *, causal, tol):
    """(dq, dk, dv) computed for the output gradient ``d_out`` against :func:`reference_grads`."""
    for name, got, want in zip(("dq", "dk", "dv"), grads, reference_grads(q, k, v, d_out, is_causal=causal)):
        got = np.asarray(got, np.float64)
        assert got.shape == want.shape and np.isfinite(got).all(), name
        np.testing.assert_allclose(got, want, atol=tol, rtol=tol, err_msg=name)


@pytest.mark.parametrize(
    ("t", "s", "n", "k", "causal", "bq", "bk"),
    [
        (64, 64, 2, 2, False, 32, 16),
        (64, 64, 4, 1, True, 16, 16),
        (32, 96, 2, 1, True, 16, 32),
        (96, 32, 2, 2, True, 32, 16),
    ],
)
def test_interpreted_kernel_matches_reference(t, s, n, k, causal, bq, bk):
    q, kk, v = normal_qkv(1, t, n, 16, seq_kv=s, kv_heads=k, seed=t + s)
    out, lse = flash_attention(q, kk, v, is_causal=causal, block_q=bq, block_k=bk, interpret=True, return_lse=True)
    np.testing.assert_allclose(out, reference_attention(q, kk, v, is_causal=causal), atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse, reference_lse(q, kk, is_causal=causal), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("t", "s", "n", "k", "causal"),
    [(64, 64, 2, 2, False), (64, 32, 4, 2, True), (32, 64, 4, 1, True)],  # MHA, GQA with T > S, MQA with T < S
)
def test_interpreted_gradients_match_float64(t, s, n, k, causal):
    q, kk, v = normal_qkv(1, t, n, 16, seq_kv=s, kv_heads=k, seed=t * s)

    def fn(q, k, v):
        return flash_attention(q, k, v, is_causal=causal, block_q=16, block_k=16, interpret=True)

    assert_grads_close(fn, q, kk, v, causal=causal, tol=2e-5)


@settings(max_examples=3, deadline=None)
@given(
    t_blocks=st.integers(1, 3),
    s_blocks=st.integers(1, 3),
    groups=st.sampled_from([(2, 2), (2, 1), (4, 2)]),
    causal=st.booleans(),
    seed=st.integers(0, 99),
)
def test_interpreted_gradients_property(t_blocks, s_blocks, groups, causal, seed):
    n, k = groups
    q, kk, v = normal_qkv(1, 16 * t_blocks, n, 16, seq_kv=16 * s_blocks, kv_heads=k, seed=seed)

    def fn(q, k, v):
        return flash_attention(q, k, v, is_causal=causal, block_q=16, block_k=16, interpret=True)

    assert_grads_close(fn, q, kk, v, causal=causal, tol=5e-5)


def chained_grad_text(attention, q, k, v, calls: int) -> str:
    """The lowered gradient of ``calls`` attention calls in a row at the same shapes (a model's layers)."""

    def loss(q, k, v):
        x = q
        for _ in range(calls):
            x = attention(x, k, v)
        return jnp.sum(x.astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).as_text()


def test_calls_at_the_same_shapes_share_one_lowering():
    """Three layers' calls: one forward and one backward function in the program, each called three times (a copy per
    call would lower and compile the kernel again for every layer)."""
    q, k, v = normal_qkv(1, 32, 2, 16, seed=1)
    attention = lambda q, k, v: flash_attention(q, k, v, is_causal=True, block_q=16, block_k=16, interpret=True)  # noqa: E731
    text = chained_grad_text(attention, q, k, v, calls=3)
    for fn in ("_forward", "_backward"):
        assert len(re.findall(rf"func\.func private @{fn}\b", text)) == 1, fn
        assert len(re.findall(rf"call @{fn}\b", text)) == 3, fn


def test_lse_cotangent_reaches_the_inputs():
    """A loss on the returned log-sum-exp differentiates too (context parallelism merges partials with it)."""
    q, k, v = normal_qkv(1, 32, 2, 16, seed=4)

    def loss(q, k):
        return flash_attention(q, k, v, is_causal=True, block_q=16, block_k=16, interpret=True, return_lse=True)[
            1
        ].sum()

    def loss64(q, k):  # the same loss in float64 NumPy: d lse_i / d s_ij = scale · p_ij
        q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
        s = np.einsum("tnh,snh->nts", q[0], k[0]) / 4.0
        s = np.where(np.arange(32)[None, :] <= np.arange(32)[:, None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return np.einsum("nts,snh->tnh", p, k[0])[None] / 4.0, np.einsum("nts,tnh->snh", p, q[0])[None] / 4.0

    dq, dk = jax.grad(loss, argnums=(0, 1))(q, k)
    want_dq, want_dk = loss64(q, k)
    np.testing.assert_allclose(dq, want_dq, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(dk, want_dk, atol=2e-5, rtol=2e-5)


def test_runs_with_x64_enabled():
    """JAX_ENABLE_X64=1 turns Python ints into int64: the loop bounds must stay int32."""
    q, k, v = normal_qkv(1, 32, 2, 16, seed=2)
    with jax.enable_x64(True):
        out = flash_attention(q, k, v, is_causal=True, block_q=16, block_k=16, interpret=True)
        dq = jax.grad(lambda q: flash_attention(q, k, v, is_causal=True, block_q=16, block_k=16).sum())(q)
    np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=True), atol=2e-5, rtol=2e-5)
    assert dq.dtype == q.dtype and np.isfinite(np.asarray(dq)).all()


def test_block_divisibility_error():
    q, k, v = normal_qkv(1, 48, 1, 16)
    with pytest.raises(ValueError, match="multiples of block_q"):
        flash_attention(q, k, v, block_q=32, interpret=True)


@pytest.mark.parametrize(("option", "value"), [("block_q", 0), ("block_k", -16), ("num_warps", 0)])
def test_non_positive_sizes_are_refused(option, value):
    q, k, v = normal_qkv(1, 32, 1, 16)
    with pytest.raises(ValueError, match=f"{option} must be a positive integer"):
        flash_attention(q, k, v, interpret=True, **{option: value})


def test_bad_scale_is_refused():
    q, k, v = normal_qkv(1, 32, 1, 16)
    with pytest.raises(ValueError, match="scale must be finite"):
        flash_attention(q, k, v, scale=float("nan"), interpret=True)


def test_why_not_names_dtype_and_head_dim():
    def why(head_dim, dtype=jnp.bfloat16, t=128):
        return _why_not_here(AttentionShape(1, t, t, 1, 1, head_dim), dtype, HOPPER_SMEM_BYTES)

    assert "bfloat16" in why(64, jnp.float32)
    for head_dim in (100, 4, 264, 512):
        assert "head_dim must be a multiple of 8 between 8 and 256" in why(head_dim)
    for head_dim in (8, 64, 80, 96, 128, 192, 256):
        assert why(head_dim) is None and why(head_dim, t=4096) is None


def check_head_dim_case(head_dim, causal, *, t=32, s=32, n=2, kv=1, block=16):
    """Values, log-sum-exp and gradients of the interpreted kernel at ``head_dim`` (padded inside) against float64."""
    q, k, v = normal_qkv(1, t, n, head_dim, seq_kv=s, kv_heads=kv, seed=head_dim + causal)

    def fn(q, k, v):
        return flash_attention(q, k, v, is_causal=causal, block_q=block, block_k=block, interpret=True)

    out, lse = flash_attention(q, k, v, is_causal=causal, block_q=block, block_k=block, interpret=True, return_lse=True)
    assert out.shape == q.shape
    np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=causal), atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse, reference_lse(q, k, is_causal=causal), atol=1e-5, rtol=1e-5)
    assert_grads_close(fn, q, k, v, causal=causal, tol=5e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [80, 96])
def test_interpreted_padded_head_dims_match_float64(head_dim, causal):
    """80 and 96 run zero-padded to 128 with the scale 1/sqrt(head_dim): values, lse and gradients (GQA, T > S)."""
    check_head_dim_case(head_dim, causal, t=32, s=16)


@pytest.mark.parametrize("causal", [False, True])
def test_interpreted_head_dim_192_matches_float64(causal):
    """192 runs padded to 256, where the default forward and backward drop to two stages."""
    check_head_dim_case(192, causal)


@pytest.mark.parametrize("head_dim", [4, 20, 100, 264, 512])
def test_head_dims_the_kernel_cannot_take_are_refused(head_dim):
    q, k, v = normal_qkv(1, 32, 1, head_dim)
    with pytest.raises(ValueError, match=rf"head_dim must be a multiple of 8 between 8 and 256; got {head_dim}"):
        flash_attention(q, k, v, interpret=True)


def test_padded_head_dims():
    assert [pf.padded_head_dim(h) for h in (8, 16, 64, 80, 96, 128, 136, 192, 256)] == [
        16,
        16,
        64,
        128,
        128,
        128,
        256,
        256,
        256,
    ]


def test_smem_arithmetic_matches_what_the_compiler_reported():
    """The H200's compiler asked for 262144 bytes for the forward at H = 256, blocks (128, 64), 3 stages, bfloat16:
    q once (128 x 256) and k, v (64 x 256 each) three times, two bytes each; Hopper allows 232448."""
    assert smem_bytes("forward", 128, 64, 256, 3) == 2 * 256 * (128 + 3 * 2 * 64) == 262144 > HOPPER_SMEM_BYTES
    assert HOPPER_SMEM_BYTES == 232448 == 227 * 1024
    assert smem_bytes("forward", 128, 128, 128, 3) == 229376 <= HOPPER_SMEM_BYTES  # the tuned H = 128 forward fits
    assert smem_bytes("backward dK/dV", 32, 64, 256, 2) == 2 * 256 * (2 * 64 + 2 * 2 * 32)
    assert smem_bytes("backward dQ", 32, 64, 256, 2) == 2 * 256 * (2 * 32 + 2 * 2 * 64)
    assert smem_bytes("forward", 64, 64, 128, 3, itemsize=4) == 2 * smem_bytes("forward", 64, 64, 128, 3)
    with pytest.raises(ValueError, match="kernel must be one of"):
        smem_bytes("backward", 64, 64, 128, 3)


def test_a_config_that_overflows_shared_memory_is_refused_before_compiling():
    q, k, v = normal_qkv(1, 128, 1, 256, dtype=jnp.bfloat16)
    with pytest.raises(
        ValueError,
        match=r"num_stages=3: the forward kernel .* needs 262144 bytes .* 232448 .*"
        r"q \(1, 128, 1, 256\).* Pass num_stages=2",
    ):
        flash_attention(q, k, v, block_q=128, block_k=64, num_stages=3, interpret=True)
    q, k, v = normal_qkv(1, 256, 1, 256, dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match=r"block_q=256, block_k=256 \(even at one stage\).*393216.*Pass block_k=64"):
        flash_attention(q, k, v, block_q=256, block_k=256, interpret=True)


def test_blocks_left_to_the_kernel_shrink_until_they_fit():
    """The forward's blocks the caller did not choose, and the backward's (never the caller's), are halved until
    the stages fit; here num_stages=4 at H = 192 (padded to 256)."""
    plan = pf._configure(
        1024,
        1024,
        192,
        jnp.bfloat16,
        block_q=128,
        block_k=None,
        num_warps=None,
        num_stages=4,
        limit=HOPPER_SMEM_BYTES,
        shapes="",
    )
    assert (plan["block_q"], plan["block_k"], plan["num_stages"], plan["bwd_stages"]) == (128, 32, 4, 4)
    assert smem_bytes("forward", 128, 32, 256, 4) <= HOPPER_SMEM_BYTES < smem_bytes("forward", 128, 64, 256, 4)
    for name in pf.KERNELS[1:]:
        assert smem_bytes(name, plan["bwd_q"], plan["bwd_k"], 256, 4) <= HOPPER_SMEM_BYTES
    with pytest.raises(ValueError, match=r"num_stages=4: the forward kernel .* Pass num_stages=2 .* or block_k=32"):
        pf._configure(
            1024,
            1024,
            192,
            jnp.bfloat16,
            block_q=128,
            block_k=64,
            num_warps=None,
            num_stages=4,
            limit=HOPPER_SMEM_BYTES,
            shapes="",
        )


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_default_configs_fit_hopper_at_every_head_dim(dtype):
    """Every head dim the kernel takes gets blocks and stages whose every kernel fits 227 KiB, with 3 stages
    wherever they fit; at 192 and 256 (padded) the forward and backward drop to 2 stages."""
    size = jnp.dtype(dtype).itemsize
    for head_dim in range(8, 257, 8):
        hp = pf.padded_head_dim(head_dim)
        plan = pf._configure(
            4096,
            4096,
            head_dim,
            dtype,
            block_q=None,
            block_k=None,
            num_warps=None,
            num_stages=None,
            limit=HOPPER_SMEM_BYTES,
            shapes="",
        )
        fwd = [("forward", plan["block_q"], plan["block_k"], plan["num_stages"])]
        bwd = [(name, plan["bwd_q"], plan["bwd_k"], plan["bwd_stages"]) for name in pf.KERNELS[1:]]
        for name, bq, bk, stages in fwd + bwd:
            assert smem_bytes(name, bq, bk, hp, stages, size) <= HOPPER_SMEM_BYTES, (head_dim, name)
            deeper = stages + 1 <= pf.MAX_STAGES and smem_bytes(name, bq, bk, hp, stages + 1, size) <= HOPPER_SMEM_BYTES
            assert not deeper or name != "forward", (head_dim, name)  # the forward takes every stage that fits
    if dtype != jnp.float32:
        plan = pf._configure(
            4096,
            4096,
            256,
            dtype,
            block_q=None,
            block_k=None,
            num_warps=None,
            num_stages=None,
            limit=HOPPER_SMEM_BYTES,
            shapes="",
        )
        assert (plan["block_q"], plan["block_k"], plan["num_stages"], plan["bwd_stages"]) == (128, 64, 2, 2)


def test_jax_bundled_kernel_check_refuses_what_does_not_fit():
    shape = AttentionShape(1, 1024, 1024, 4, 4, 256)
    assert "327680 bytes of shared memory" in _bundled_why_not_here(shape, jnp.bfloat16, HOPPER_SMEM_BYTES)
    assert _bundled_why_not_here(shape._replace(head_dim=128), jnp.bfloat16, HOPPER_SMEM_BYTES) is None
    assert "power of two" in _bundled_why_not_here(shape._replace(head_dim=96), jnp.bfloat16, HOPPER_SMEM_BYTES)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gpu_kernel_matches_reference(causal, head_dim, dtype):
    for b, t, n, k in ((2, 1024, 8, 8), (1, 2048, 8, 2)):
        q, kk, v = normal_qkv(b, t, n, head_dim, kv_heads=k, dtype=dtype, seed=t)
        fn = jax.jit(lambda q, k, v: flash_attention(q, k, v, is_causal=causal))
        out = np.asarray(fn(q, kk, v), np.float32)
        ref = reference_attention(q[:, :256], kk, v, is_causal=causal)  # check the first 256 rows in float64
        np.testing.assert_allclose(out[:, :256], ref, atol=1e-2, rtol=1e-2)
        assert np.isfinite(out).all()
        assert not any(t.startswith("__cudnn") for t in kernels_used(fn, q, kk, v))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gpu_gradients_match_float64(causal, head_dim, dtype):
    for b, t, s, n, k in ((1, 512, 512, 4, 4), (1, 256, 512, 4, 2), (1, 512, 256, 4, 1)):  # MHA, GQA T<S, MQA T>S
        q, kk, v = normal_qkv(b, t, n, head_dim, seq_kv=s, kv_heads=k, dtype=dtype, seed=t + s)

        def fn(q, k, v):
            return flash_attention(q, k, v, is_causal=causal)

        assert_grads_close(fn, q, kk, v, causal=causal, tol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [80, 96, 192, 256])
def test_gpu_head_dims_match_float64(head_dim, causal):
    """The compiled kernel at its default blocks and stages: 80 and 96 padded to 128, 192 padded to 256, and 256
    (two stages), forward and backward, against float64 (GQA; T = S, then T < S)."""
    for t, s in ((256, 256), (128, 256)):
        q, k, v = normal_qkv(1, t, 4, head_dim, seq_kv=s, kv_heads=2, dtype=jnp.bfloat16, seed=head_dim + t)
        fn = jax.jit(lambda q, k, v: flash_attention(q, k, v, is_causal=causal))
        out = np.asarray(fn(q, k, v), np.float32)
        assert out.shape == q.shape and np.isfinite(out).all()
        np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=causal), atol=1e-2, rtol=1e-2)
        assert_grads_close(lambda q, k, v: flash_attention(q, k, v, is_causal=causal), q, k, v, causal=causal, tol=3e-2)


def compiler_request(kernel, block_q, block_k, head_dim, stages):
    """The shared memory the GPU's compiler reports for one of our kernels at these blocks and stages, by compiling
    it past our check (None when it fits)."""
    x = jnp.zeros((1, 256, 1, head_dim), jnp.bfloat16)
    row = jnp.zeros((1, 1, 256), jnp.float32)
    plan = pf._Plan(
        causal=False,
        scale=0.1,
        block_q=block_q,
        block_k=block_k,
        bwd_q=block_q,
        bwd_k=block_k,
        num_warps=4,
        num_stages=stages,
        bwd_stages=stages,
        interpret=False,
    )
    try:
        if kernel == "forward":
            jax.block_until_ready(pf._forward(x, x, x, plan))
        else:
            jax.block_until_ready(pf._backward(x, x, x, x, row, row, plan))
    except Exception as e:  # XLA's compile error: "Shared memory size limit exceeded: requested N, available: M"
        found = re.search(r"requested (\d+), available: (\d+)", str(e))
        assert found, str(e)[-2000:]
        return int(found[1]), int(found[2])
    return None


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("kernel", "block_q", "block_k", "head_dim", "stages"),
    [
        ("forward", 128, 64, 256, 3),
        ("forward", 256, 64, 256, 3),
        ("forward", 64, 128, 256, 2),
        ("forward", 128, 128, 128, 4),
        ("backward dK/dV", 64, 32, 256, 4),  # only dK/dV overflows at these blocks
        ("backward dQ", 32, 64, 256, 4),  # only dQ overflows
    ],
)
def test_gpu_compiler_asks_for_the_estimated_shared_memory(kernel, block_q, block_k, head_dim, stages):
    """Configurations past the limit, compiled past our check: the compiler asks for exactly :func:`smem_bytes`."""
    want = smem_bytes(kernel, block_q, block_k, head_dim, stages)
    assert want > HOPPER_SMEM_BYTES
    request = compiler_request(kernel, block_q, block_k, head_dim, stages)
    assert request is not None and request[0] == want, (request, want)
    if jax.devices()[0].compute_capability == "9.0":
        assert request[1] == HOPPER_SMEM_BYTES


@pytest.mark.gpu
def test_jax_bundled_kernel_matches_reference():
    q, k, v = normal_qkv(2, 512, 4, 64, kv_heads=2, dtype=jnp.bfloat16)
    out = np.asarray(jax_bundled_mha(q, k, v, is_causal=True), np.float32)
    np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=True), atol=1e-2, rtol=1e-2)


def test_a_huge_scale_gives_no_nan_in_the_interpreted_kernel():
    q, k, v = normal_qkv(1, 32, 2, 16, seed=3)
    out = flash_attention(q, k, v, scale=1e30, block_q=16, block_k=16, interpret=True)
    ref = naive_attention(q, k, v, scale=1e30)  # clamps the scores the same way: the hard maximum per row
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)


@pytest.mark.parametrize("flag", ["no", "False", 0, 1, None])
def test_is_causal_must_be_a_bool(flag):
    q, k, v = normal_qkv(1, 32, 2, 16, seed=3)
    with pytest.raises(ValueError, match="is_causal must be True or False"):
        flash_attention(q, k, v, is_causal=flag, interpret=True)
