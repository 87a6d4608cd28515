"""The registry's why_not agrees with what each implementation accepts: a reason for anything it would refuse."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial import registry
from attention_tutorial.inputs import AttentionShape, make_qkv
from attention_tutorial.kernels.reference import reference_attention

GOOD = AttentionShape(1, 16, 16, 4, 2, 16)
NAMES = sorted(registry.IMPLEMENTATIONS)

# Problems no implementation can run, and what the reason must say.
INVALID = {
    "int8": (GOOD, jnp.int8, "floating point"),
    "bool": (GOOD, jnp.bool_, "floating point"),
    "heads not a multiple of kv heads": (AttentionShape(1, 16, 16, 6, 4, 16), jnp.bfloat16, "multiple of kv_heads"),
    "empty sequence": (AttentionShape(1, 0, 16, 4, 2, 16), jnp.bfloat16, "at least 1"),
    "five sizes": ((1, 16, 16, 4, 16), jnp.bfloat16, "6 ints"),
    "not a dtype": (GOOD, "bf16", "floating dtype"),
}


@pytest.mark.parametrize("name", NAMES, ids=[f"impl={n}" for n in NAMES])
@pytest.mark.parametrize("case", sorted(INVALID))
def test_why_not_refuses_what_no_implementation_accepts(case, name):
    shape, dtype, message = INVALID[case]
    reason = registry.why_not(name, shape, dtype)
    assert reason is not None and message in reason
    assert registry.get(name).why_not(shape, dtype, False) == reason  # the sweep's direct call says the same


@pytest.mark.parametrize("name", ["xla", "default"])
def test_xla_refuses_fp8_as_jax_does(name):
    assert "float8_e4m3fn" in registry.why_not(name, GOOD, jnp.float8_e4m3fn)
    q = jnp.ones((1, 4, 1, 8), jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"cast with \.astype"):
        registry.get(name).fn(q, q, q)


@pytest.mark.parametrize("name", NAMES, ids=[f"impl={n}" for n in NAMES])
def test_can_run_means_it_runs_and_matches_the_reference(name):
    """Where why_not says None here, the implementation really runs this problem, and correctly."""
    dtype = jnp.float32
    if registry.why_not(name, GOOD, dtype, True) is not None:
        pytest.skip(f"{name} cannot run here: {registry.why_not(name, GOOD, dtype, True)}")
    q, k, v = make_qkv(1, 16, 4, 16, kv_heads=2, dtype=dtype, seed=21)
    out = registry.get(name).fn(q, k, v, is_causal=True)
    np.testing.assert_allclose(out, reference_attention(q, k, v, is_causal=True), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("name", [n for n in NAMES if registry.why_not(n, GOOD, jnp.float32) is None])
def test_what_why_not_refuses_the_function_refuses_too(name):
    q, k, v = make_qkv(1, 16, 4, 16, kv_heads=2)
    fn = registry.get(name).fn
    with pytest.raises(ValueError, match="floating point"):
        fn(q.astype(jnp.int8), k.astype(jnp.int8), v.astype(jnp.int8))
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        fn(q[:, :, :3], k, v)


def test_why_not_checks_its_own_arguments():
    with pytest.raises(ValueError, match="unknown implementation 'flash'; choose from"):
        registry.why_not("flash", GOOD, jnp.bfloat16)
    with pytest.raises(ValueError, match="causal must be True or False"):
        registry.why_not("naive", GOOD, jnp.bfloat16, "yes")
    assert registry.why_not("naive", tuple(GOOD), "bfloat16") is None  # a plain tuple and a dtype name are fine


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="this checks the CPU answers")
def test_gpu_only_implementations_say_so_on_cpu():
    for name in ("cudnn", "jax_pallas", "mosaic", "jax_mosaic", "te"):
        reason = registry.why_not(name, GOOD, jnp.bfloat16)
        assert reason is not None and ("GPU" in reason or "Hopper" in reason), (name, reason)


@pytest.mark.parametrize("name", [None, ["xla"], 3])
def test_a_name_that_is_no_string_is_refused_with_the_choices(name):
    with pytest.raises(ValueError, match=r"implementation name must be a str.*'xla'"):
        registry.get(name)
