import numpy as np

from attention_tutorial.kernels.masks import causal_mask
from attention_tutorial.site import fused


def test_alignment_figure_draws_both_masks():
    fig = fused.alignment_figure(3, 6)
    drawn = [ax.get_images()[0].get_array() for ax in fig.axes]
    np.testing.assert_array_equal(drawn[0], np.tril(np.ones((3, 6)), 0))  # query i sees keys j <= i
    np.testing.assert_array_equal(drawn[1], np.tril(np.ones((3, 6)), 3))  # query i sees keys j <= i + (S - T)
    np.testing.assert_array_equal(drawn[1], np.asarray(causal_mask(3, 6, alignment="bottom_right"), int))
    assert [ax.get_title() for ax in fig.axes] == ["top-left", "bottom-right"]
