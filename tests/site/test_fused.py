import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_tutorial.kernels.masks import causal_args, causal_mask
from attention_tutorial.site import fused


def test_alignment_figure_draws_both_masks():
    fig = fused.alignment_figure(3, 6)
    drawn = [ax.get_images()[0].get_array() for ax in fig.axes]
    np.testing.assert_array_equal(drawn[0], np.tril(np.ones((3, 6)), 0))  # query i sees keys j <= i
    np.testing.assert_array_equal(drawn[1], np.tril(np.ones((3, 6)), 3))  # query i sees keys j <= i + (S - T)
    np.testing.assert_array_equal(drawn[1], np.asarray(causal_mask(3, 6, alignment="bottom_right"), int))
    assert [ax.get_title() for ax in fig.axes] == ["top-left (is_causal=True)", "bottom-right (what decoding needs)"]


def test_alignment_figure_labels_rows_by_position_and_draws_the_diagonal():
    fig = fused.alignment_figure(3, 6)
    rows = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert rows == ["query 0 (position 3)", "query 1 (position 4)", "query 2 (position 5)"]
    for ax in fig.axes:
        (line,) = ax.get_lines()
        # through the cells (i, S - T + i): from the top-left corner of (0, 3) to the bottom-right corner of (2, 5)
        assert list(line.get_xdata()) == [2.5, 5.5] and list(line.get_ydata()) == [-0.5, 2.5]
    assert fused.query_labels(1, 4) == ["query 0 (position 3)"]
    with pytest.raises(ValueError, match="need T <= S"):
        fused.alignment_figure(4, 2)


@pytest.mark.parametrize("T, S", [(1, 4), (3, 6), (5, 5), (2, 9)])
def test_the_pages_one_line_mask_is_the_packages_bottom_right_mask(T, S):
    mask = jnp.tril(jnp.ones((T, S), bool), k=S - T)[None, None]  # the line docs/fused_attention.md shows
    want = causal_args(T, S, alignment="bottom_right")
    np.testing.assert_array_equal(
        mask, want["mask"] if "mask" in want else jnp.tril(jnp.ones((T, S), bool))[None, None]
    )
    np.testing.assert_array_equal(mask[0, 0], causal_mask(T, S, alignment="bottom_right"))


def test_tf32_rounding_is_the_change_from_rounding_to_ten_mantissa_bits():
    assert fused.tf32_rounding(jnp.array([1.0, 0.5, -2.0])) == 0.0  # exact in TF32
    step = 2.0**-10  # TF32's spacing at 1.0
    assert fused.tf32_rounding(jnp.array([1.0 + step / 4])) == pytest.approx(step / 4)
    assert fused.tf32_rounding(jnp.array([1.0 + 3 * step / 4])) == pytest.approx(step / 4)  # rounds up, to 1 + step
    x = jax.random.normal(jax.random.key(0), (1000,))
    assert 0 < fused.tf32_rounding(x) <= float(jnp.max(jnp.abs(x))) * 2.0**-11


def test_both_within_judges_every_error_against_the_tolerance():
    assert fused.both_within({"naive": 5e-7, "xla": 5e-7}, "float32")
    assert not fused.both_within({"naive": 5e-7, "xla": 2e-5}, "float32")  # float32's tolerance is 1e-5
    assert fused.both_within({"naive": 1e-3}, "tf32")
    with pytest.raises(ValueError, match="no tolerance"):
        fused.both_within({"a": 0.0}, "int8")
    with pytest.raises(ValueError, match="at least one"):
        fused.both_within({}, "float32")


def test_mask_effect_sets_the_change_against_the_outputs_size():
    big = fused.mask_effect(np.array([0.5, -0.2]), np.array([0.0, 0.1]))
    assert (big.diff, big.size, big.ratio) == pytest.approx((0.5, 0.5, 1.0))
    assert big.word == "of the same order as the outputs themselves"
    small = fused.mask_effect(np.array([1.0, 2.0]), np.array([1.0, 2.01]))
    assert small.ratio == pytest.approx(0.01 / 2.01) and small.word == "small beside the outputs"
    assert fused.mask_effect(np.zeros(3), np.zeros(3)).ratio == 0.0
    with pytest.raises(ValueError, match="one shape"):
        fused.mask_effect(np.zeros(3), np.zeros(4))
