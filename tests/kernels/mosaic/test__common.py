"""What the kernels share, where it can be read on a CPU: the profiler's regions and the scale check."""

import contextlib

import jax
import pytest

from attention_tutorial.kernels.mosaic._common import REGIONS, on_hopper, positive_scale, regions


def test_regions_are_named_scopes_only_when_profiling_and_only_known_names():
    assert isinstance(regions(False)("softmax"), contextlib.nullcontext)
    assert not isinstance(regions(True)("softmax"), contextlib.nullcontext)

    def traced(x):
        with regions(True)("softmax"):
            return x * 2

    eqn = jax.make_jaxpr(traced)(1.0).jaxpr.eqns[0]
    assert [scope.name for scope in eqn.source_info.name_stack.stack] == ["softmax"]
    for on in (False, True):
        with pytest.raises(ValueError, match=r"region name must be one of .*got 'exp'"):
            regions(on)("exp")
    assert set(REGIONS) == {"qk", "softmax", "pv", "wait", "copy", "grads", "dq_add"}


def test_positive_scale_resolves_the_default_and_refuses_the_rest():
    assert positive_scale(None, 64) == pytest.approx(0.125)
    with pytest.raises(ValueError, match=r"positive softmax scale; got 0\.0"):
        positive_scale(0.0, 64)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU answer")
def test_on_hopper_names_the_gpu_it_needs():
    assert "H100/H200" in on_hopper()
