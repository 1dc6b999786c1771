"""The position layers and TokenAndPositionEmbedding refuse bad arguments and inputs by name."""

import numpy as np
import pytest

from keras_attn.embeddings import TokenAndPositionEmbedding
from keras_attn.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from keras_attn.rotary import RotaryEmbedding


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: SinusoidalPositionalEncoding(max_wavelength=-1), ValueError, "max_wavelength=-1"),
        (lambda: LearnedPositionalEmbedding(sequence_length=-4), ValueError, "sequence_length=-4"),
        (
            lambda: LearnedPositionalEmbedding(sequence_length=2.5),
            ValueError,
            "sequence_length=2.5",
        ),
        (lambda: RotaryEmbedding(max_wavelength=0), ValueError, "max_wavelength=0"),
        (lambda: RotaryEmbedding(scaling_factor=-2.0), ValueError, "scaling_factor=-2.0"),
        (lambda: RotaryEmbedding(layout="pairs"), ValueError, "layout='pairs'"),
        (lambda: RotaryEmbedding(sequence_axis="1"), TypeError, "sequence_axis='1'"),
        (lambda: RotaryEmbedding(feature_axis=1.0), TypeError, "feature_axis=1.0"),
        (lambda: RotaryEmbedding(sequence_axis=2, feature_axis=2), ValueError, "feature_axis=2"),
        (lambda: TokenAndPositionEmbedding(-1, 10, 4), ValueError, "vocabulary_size=-1"),
        (lambda: TokenAndPositionEmbedding(20, 0, 4), ValueError, "sequence_length=0"),
        (lambda: TokenAndPositionEmbedding(20, 10, -8), ValueError, "embedding_dim=-8"),
        (
            lambda: TokenAndPositionEmbedding(20, 10, 4, position="rope"),
            ValueError,
            "position='rope'",
        ),
        (
            lambda: TokenAndPositionEmbedding(20, 10, 4, tie_weights="no"),
            TypeError,
            "tie_weights='no'",
        ),
        (lambda: TokenAndPositionEmbedding(20, 10, 4, mask_zero=1), TypeError, "mask_zero=1"),
    ],
)
def test_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_rotary_bad_axes_and_widths():
    with pytest.raises(ValueError, match="must be known and even"):
        RotaryEmbedding()(np.zeros((1, 3, 5), "float32"))
    with pytest.raises(ValueError, match=r"`sequence_axis` must be an axis .*sequence_axis=3"):
        RotaryEmbedding(sequence_axis=3)(np.zeros((1, 3, 4), "float32"))
    with pytest.raises(ValueError, match="must be different axes"):  # 2 and -1 of a rank-3 input
        RotaryEmbedding(sequence_axis=2)(np.zeros((1, 3, 4), "float32"))


@pytest.mark.parametrize(
    "layer", [SinusoidalPositionalEncoding(), RotaryEmbedding(), LearnedPositionalEmbedding(8)]
)
def test_bad_positions(layer):
    x = np.zeros((2, 3, 4), "float32")
    with pytest.raises(ValueError, match=r"positions.shape=\(2,\)"):
        layer(x, positions=np.array([0, 1]))
    with pytest.raises(ValueError, match=r"positions.shape=\(1, 2, 3\)"):
        layer(x, positions=np.zeros((1, 2, 3), "int32"))
    with pytest.raises(ValueError, match="not both.*start_index=2"):
        layer(x, start_index=2, positions=np.array([0, 1, 2]))


def test_learned_bad_positions():
    layer = LearnedPositionalEmbedding(sequence_length=8)
    x = np.zeros((1, 3, 4), "float32")
    with pytest.raises(
        ValueError, match=r"\[0, sequence_length=8\)\. Received: positions from 0 to 8"
    ):
        layer(x, positions=np.array([0, 8, 1]))
    with pytest.raises(ValueError, match="positions from -1 to 2"):
        layer(x, positions=np.array([[-1, 2, 1]]))
    with pytest.raises(TypeError, match="positions.dtype=float32"):
        layer(x, positions=np.array([0.0, 1.0, 2.0], "float32"))


def test_learned_too_long():
    with pytest.raises(ValueError, match="length=9, start_index=0, sequence_length=8"):
        LearnedPositionalEmbedding(sequence_length=8)(np.zeros((1, 9, 4), "float32"))
    layer = LearnedPositionalEmbedding(sequence_length=8)
    layer(np.zeros((1, 8, 4), "float32"))
    with pytest.raises(ValueError, match=r"length=4, start_index=5, sequence_length=8"):
        layer(np.zeros((1, 4, 4), "float32"), start_index=5)
    with pytest.raises(ValueError, match="sequence_length=6"):
        TokenAndPositionEmbedding(20, 6, 4)(np.ones((1, 7), "int32"))


def test_bad_ranks():
    with pytest.raises(ValueError, match=r"rank >= 3\. Received: inputs.shape=\(2, 4\)"):
        SinusoidalPositionalEncoding()(np.zeros((2, 4), "float32"))
    with pytest.raises(ValueError, match=r"rank >= 3\. Received: inputs.shape=\(2, 4\)"):
        RotaryEmbedding()(np.zeros((2, 4), "float32"))
    with pytest.raises(ValueError, match=r"rank >= 2\. Received: inputs.shape=\(4,\)"):
        TokenAndPositionEmbedding(20, 10, 4)(np.zeros((4,), "int32"))
