"""keras_attn.plotting: every plot renders to a real PNG; bad inputs name the argument."""

import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from keras_attn import plotting  # noqa: E402
from keras_attn.models import hierarchical_attention_network, rnn_seq2seq  # noqa: E402
from keras_attn.models.datasets import convex_hull_indices  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_png(path, min_bytes=3000):
    """A PNG file of non-trivial size whose pixels are not all one colour."""
    from matplotlib import image

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > min_bytes, len(data)
    pixels = image.imread(path)
    assert pixels.ndim == 3 and min(pixels.shape[:2]) > 100
    assert pixels.reshape(-1, pixels.shape[-1]).std(axis=0).max() > 0.01  # something drawn


def rendered(fig, tmp_path, name):
    path = tmp_path / f"{name}.png"
    assert plotting.save_figure(fig, path) == path
    check_png(path)
    return path


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------


def test_plot_attention_renders_a_seq2seq_alignment(tmp_path):
    model = rnn_seq2seq(20, 20, embedding_dim=8, units=8, return_attention=True)
    source = np.array([[4, 7, 9, 3, 0, 0]], "int32")  # two padded positions
    target_in = np.array([[1, 5, 6, 2]], "int32")
    out = model({"encoder_inputs": source, "decoder_inputs": target_in})
    weights = np.asarray(out["attention"])[0]  # (T, S)
    fig = plotting.plot_attention(
        weights,
        source_labels=["o", "gato", "dorme", ".", "", ""],
        target_labels=["the", "cat", "sleeps", "."],
        title="rnn_seq2seq alignment",
    )
    assert type(fig).__name__ == "Figure"
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()][:3] == ["o", "gato", "dorme"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["the", "cat", "sleeps", "."]
    rendered(fig, tmp_path, "alignment")


def test_plot_attention_draws_on_a_given_axes(tmp_path):
    fig = plotting._new_figure(6, 3)
    left, right = fig.subplots(1, 2)
    assert plotting.plot_attention(np.eye(4), ax=left, title="left") is fig
    assert plotting.plot_attention(np.full((2, 5), 0.2), ax=right) is fig
    rendered(fig, tmp_path, "two_axes")


def test_plot_attention_accepts_tensors_and_long_sequences(tmp_path):
    import keras

    weights = keras.ops.softmax(keras.random.normal((40, 60), seed=0), axis=-1)
    rendered(plotting.plot_attention(weights), tmp_path, "long")


def test_plot_han_renders_model_weights(tmp_path):
    words = [
        "a slow film".split(),
        "but the acting is wonderful and the music is even better".split(),
        "see it",
    ]
    tokens = np.zeros((1, 4, 12), "int32")  # 3 real sentences, one padded sentence
    for i, sentence in enumerate(words):
        tokens[0, i, : len(sentence)] = np.arange(1, len(sentence) + 1)
    model = hierarchical_attention_network(
        vocab_size=20, embedding_dim=8, word_units=4, sentence_units=4, num_classes=2,
        max_sentences=4, max_words=12, return_attention=True,
    )  # fmt: skip
    out = model(tokens)
    word_weights = np.asarray(out["word_attention"])[0]  # (S, W)
    sentence_weights = np.asarray(out["sentence_attention"])[0]  # (S,)
    assert sentence_weights[3] == 0.0  # the padded sentence
    fig = plotting.plot_han(word_weights, sentence_weights, words, title="HAN", line_width=30)
    drawn = [t.get_text() for t in fig.axes[1].texts]
    assert drawn == [w for s in words for w in (s.split() if isinstance(s, str) else s)]
    rendered(fig, tmp_path, "han")


def test_plot_pointer_renders_a_hull_and_a_sort_order(tmp_path):
    rng = np.random.default_rng(0)
    points = rng.uniform(size=(15, 2))
    hull = convex_hull_indices(points)
    closed = np.concatenate([hull, hull[:1], [-1, -1]])  # closed, then padding
    fig = plotting.plot_pointer(points, closed, target=hull, title="convex hull")
    polygons = [p for p in fig.axes[0].patches if type(p).__name__ == "Polygon"]
    pointed = polygons[-1].get_xy()[:-1]  # matplotlib closes the path itself
    np.testing.assert_allclose(pointed, points[hull])
    rendered(fig, tmp_path, "hull")

    values = rng.uniform(size=(8, 1))
    order = np.argsort(values[:, 0])
    fig = plotting.plot_pointer(values, order, title="sorting")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [str(i) for i in order]
    rendered(fig, tmp_path, "sort")


def test_save_figure_creates_the_folder(tmp_path):
    path = tmp_path / "deep" / "er" / "plot.png"
    plotting.save_figure(plotting.plot_attention(np.eye(5)), str(path))
    check_png(path)


# ---------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"weights": np.ones((2, 3, 4))}, r"`weights` must have rank 2. .*shape=\(2, 3, 4\)"),
        ({"weights": np.ones(3)}, r"`weights` must have rank 2"),
        ({"weights": [[0.5, np.nan]]}, r"`weights` must be finite"),
        (
            {"weights": np.ones((2, 3)), "source_labels": ["a", "b"]},
            r"`source_labels` must have one label per position \(3\). .*len\(source_labels\)=2",
        ),
        (
            {"weights": np.ones((2, 3)), "target_labels": ["a", "b", "c"]},
            r"`target_labels` must have one label per position \(2\)",
        ),
        ({"weights": np.ones((2, 3)), "source_labels": "abc"}, r"`source_labels` must be a list"),
    ],
)
def test_plot_attention_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plotting.plot_attention(**kwargs)


@pytest.mark.parametrize(
    "args, match",
    [
        ((np.ones(3), [1.0], [["a"]]), r"`word_weights` must have rank 2"),
        ((np.ones((2, 3)), np.ones((2, 1)), [["a"]]), r"`sentence_weights` must have rank 1"),
        (
            (np.ones((2, 3)), np.ones(3), [["a"]]),
            r"`sentence_weights` must have one weight .*\(2\)",
        ),
        ((np.ones((2, 3)), np.ones(2), [["a"]] * 3), r"`words` must be a list of 1 to 2"),
        ((np.ones((2, 3)), np.ones(2), "a b"), r"`words` must be a list"),
        ((np.ones((2, 3)), np.ones(2), []), r"`words` must be a list"),
        ((np.ones((2, 3)), np.ones(2), [["a"], "a b c d"]), r"`words\[1\]` must have at most 3"),
    ],
)
def test_plot_han_bad_inputs(args, match):
    with pytest.raises(ValueError, match=match):
        plotting.plot_han(*args)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((np.ones((4, 3)), [0, 1]), {}, r"`points` must have shape \(N, 2\), .*\(4, 3\)"),
        ((np.ones((2, 4, 2)), [0, 1]), {}, r"`points` must have rank 1 or 2"),
        ((np.ones((4, 2)), [0, 4]), {}, r"`pointers` must hold positions in \[0, 4\)"),
        ((np.ones((4, 2)), [0, -1, 2]), {}, r"`pointers` must hold positions .*-1 only as"),
        ((np.ones((4, 2)), [0.0, 1.0]), {}, r"`pointers` must be a rank-1 integer array"),
        ((np.ones((4, 2)), [[0, 1]]), {}, r"`pointers` must be a rank-1 integer array"),
        ((np.ones((4, 2)), [0, 1, 2]), {"target": [0, 9]}, r"`target` must hold positions"),
    ],
)
def test_plot_pointer_bad_inputs(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plotting.plot_pointer(*args, **kwargs)


def test_non_numeric_weights_are_a_type_error():
    with pytest.raises(TypeError, match=r"`weights` must be an array of numbers. .*list"):
        plotting.plot_attention([["a", "b"]])
    with pytest.raises(TypeError, match=r"`sentence_weights` must be an array of numbers"):
        plotting.plot_han(np.ones((1, 2)), ["high"], [["a"]])
    with pytest.raises(TypeError, match=r"`points` must be an array of numbers"):
        plotting.plot_pointer({"x": 1}, [0])


def test_save_figure_bad_inputs(tmp_path):
    fig = plotting.plot_attention(np.eye(2))
    with pytest.raises(ValueError, match=r"`path` must end in '.png'. Received: path='.*a.pdf'"):
        plotting.save_figure(fig, str(tmp_path / "a.pdf"))
    with pytest.raises(TypeError, match=r"`fig` must be a matplotlib Figure. Received: fig="):
        plotting.save_figure(np.eye(2), str(tmp_path / "a.png"))


def test_missing_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    with pytest.raises(ImportError, match=r"pip install keras-attn\[plot\]"):
        plotting.plot_attention(np.eye(2))
