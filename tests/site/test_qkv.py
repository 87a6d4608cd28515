import numpy as np
import pytest

from attention_tutorial.site import qkv


def test_head_bytes_counts_the_matrix_and_the_four_tensors():
    b = qkv.head_bytes(4096, head_dim=128, itemsize=2)
    assert b.matrix == 4096 * 4096 * 2
    assert b.tensors == 4 * 4096 * 128 * 2
    assert b.ratio == pytest.approx(4096 / (4 * 128))  # the matrix outgrows the tensors linearly in T


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, None])
def test_head_bytes_names_a_bad_length(bad):
    with pytest.raises(ValueError, match="seq"):
        qkv.head_bytes(bad)
    with pytest.raises(ValueError, match="seq"):
        qkv.causal_weights(seq=bad)
    with pytest.raises(ValueError, match="head_dim"):
        qkv.causal_weights(head_dim=bad)


def test_causal_weights_are_rows_of_a_causal_softmax():
    w = qkv.causal_weights(seq=10, head_dim=4, seed=3)
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    assert np.all(np.triu(w, k=1) == 0) and np.all(w[np.tril_indices(10)] > 0)


def test_the_figure_plots_the_counted_bytes():
    fig = qkv.score_matrix_figure(seqs=(1024, 2048))
    lines = fig.axes[1].get_lines()
    assert np.allclose(lines[0].get_ydata(), [qkv.head_bytes(t).matrix / 2**20 for t in (1024, 2048)])
    assert np.allclose(lines[1].get_ydata(), [qkv.head_bytes(t).tensors / 2**20 for t in (1024, 2048)])
