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


def test_the_masked_triangle_is_grey_and_labelled():
    fig = qkv.score_matrix_figure(seqs=(1024, 2048))
    image = fig.axes[0].get_images()[0]
    data = image.get_array()
    assert np.array_equal(np.ma.getmaskarray(data), np.triu(np.ones(data.shape, bool), k=1))
    assert image.cmap.get_bad().tolist() == list(qkv.MASKED_GREY)  # grey, not the white of a small weight
    assert any(t.get_text().replace("\n", " ") == qkv.MASKED_LABEL for t in fig.axes[0].texts)


def test_matrices_per_head_and_row_steps():
    assert qkv.matrices_per_head(2 * 8 * 128 * 128 * 4, seq=128, heads=8, itemsize=4) == 2.0
    assert qkv.matrices_per_head(3 * 4 * 8 * 64 * 64 * 2, seq=64, heads=8, itemsize=2, batch=4) == 3.0
    assert qkv.row_steps([128, 512, 2048], [1, 16, 256]) == ([4.0, 4.0], [16.0, 16.0])
    with pytest.raises(ValueError, match="row_steps"):
        qkv.row_steps([128], [1])


def test_recorded_naive_memory_keeps_one_grid_and_counts_matrices():
    rec = dict(
        impl="naive",
        grid="seq_short",
        **{"pass": "fwd"},
        mask="none",
        causal=False,
        status="ok",
        seq_q=64,
        seq_kv=64,
        batch=4,
        heads=8,
        head_dim=64,
        dtype="bfloat16",
        temp_bytes=3 * 4 * 8 * 64 * 64 * 2,
    )
    other = [dict(rec, causal=True), dict(rec, impl="xla"), dict(rec, grid="seq_long"), dict(rec, status="oom")]
    rows = qkv.recorded_naive_memory([dict(rec, seq_q=128, seq_kv=128, temp_bytes=4 * rec["temp_bytes"]), rec, *other])
    assert [r["T"] for r in rows] == [64, 128]
    assert [r["T × T matrices per head"] for r in rows] == [3.0, 3.0]


def test_difference_note_names_the_backend():
    assert "exactly 0" in qkv.difference_note(0.0, "cpu") and "CPU" in qkv.difference_note(0.0, "cpu")
    assert "TF32" in qkv.difference_note(3e-4, "gpu") and "3.0e-04" in qkv.difference_note(3e-4, "gpu")
