"""`RotaryEmbedding`'s scaling: `"linear"` (positions divided by `scaling_factor`) and Llama 3's
(`rope_type="llama3"`: the frequencies scaled by wavelength), against Meta's formula written
here, transformers' own functions where it is installed, and the shared layer checks."""

import functools

import keras
import numpy as np
import pytest

from keras_attn.rotary import RotaryEmbedding, llama3_inverse_frequencies
from layer_checks import check_layer
from numpy_reference import llama3_scaling

rng = np.random.default_rng(3)
LLAMA31 = dict(
    scaling_factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)


def np_(x):
    return keras.ops.convert_to_numpy(x).astype("float64")


def np_rotate_half(x, positions, frequencies):
    """`(B, T, h, d)`: channel pairs `(j, j + d/2)` rotated by `position * frequency_j`."""
    angles = np.asarray(positions, "float64")[:, None] * frequencies
    cos, sin = np.cos(angles)[None, :, None], np.sin(angles)[None, :, None]
    a, b = np.split(x.astype("float64"), 2, axis=-1)
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


@pytest.mark.parametrize("depth", [8, 64, 128])
@pytest.mark.parametrize("theta", [10000, 500000])
def test_llama3_frequencies_are_metas(depth, theta):
    base = theta ** -(np.arange(0, depth, 2) / depth)
    expected = llama3_scaling(base, 8.0, 1.0, 4.0, 8192)
    got = llama3_inverse_frequencies(theta, depth, 8.0, 1.0, 4.0, 8192)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    if depth == 128:  # Llama 3.1 8B's heads: all three bands are there
        kept, divided = np.isclose(got, base), np.isclose(got, base / 8)
        assert kept.any() and divided.any() and (~kept & ~divided).any()


@pytest.mark.parametrize("start", [0, 5])
def test_llama3_rotation_matches_numpy(start):
    x = rng.normal(size=(2, 6, 3, 16)).astype("float32")
    layer = RotaryEmbedding(
        500, rope_type="llama3", scaling_factor=4.0, original_max_position_embeddings=64
    )
    frequencies = llama3_scaling(500.0 ** -(np.arange(0, 16, 2) / 16), 4.0, 1.0, 4.0, 64)
    expected = np_rotate_half(x, range(start, start + 6), frequencies)
    np.testing.assert_allclose(np_(layer(x, start_index=start)), expected, atol=1e-5)
    # Positions are not divided by the factor (that is "linear"), and a tensor start works.
    start = keras.ops.convert_to_tensor(start)
    np.testing.assert_allclose(np_(layer(x, start_index=start)), expected, atol=1e-5)


def test_linear_is_the_default_and_divides_positions():
    x = rng.normal(size=(1, 5, 2, 8)).astype("float32")
    layer = RotaryEmbedding(100, scaling_factor=2.5)
    assert layer.rope_type == "linear"
    expected = np_rotate_half(x, np.arange(5) / 2.5, 100.0 ** -(np.arange(0, 8, 2) / 8))
    np.testing.assert_allclose(np_(layer(x)), expected, atol=1e-5)


def test_llama3_check_layer(tmp_path):
    check_layer(
        functools.partial(
            RotaryEmbedding,
            rope_type="llama3",
            scaling_factor=4.0,
            original_max_position_embeddings=32,
        ),
        {"inputs": rng.normal(size=(2, 5, 2, 8)).astype("float32")},
        call_kwargs={"start_index": 3},
        expect_trainable=False,
        tmp_path=tmp_path,
    )


def test_configs():
    layer = RotaryEmbedding(500000, rope_type="llama3", **LLAMA31)
    config = layer.get_config()
    assert config["rope_type"] == "llama3" and config["original_max_position_embeddings"] == 8192
    assert RotaryEmbedding.from_config(config).get_config() == config
    default = RotaryEmbedding().get_config()  # a config written before rope_type loads as linear
    new = ("rope_type", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    old = {k: v for k, v in default.items() if k not in new}
    assert RotaryEmbedding.from_config(old).get_config() == default


def test_bad_scaling_arguments():
    with pytest.raises(ValueError, match="rope_type"):
        RotaryEmbedding(rope_type="yarn")
    with pytest.raises(ValueError, match="high_freq_factor"):
        RotaryEmbedding(rope_type="llama3", low_freq_factor=4.0, high_freq_factor=4.0)
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        RotaryEmbedding(rope_type="llama3", original_max_position_embeddings=0)
    with pytest.raises(ValueError, match="low_freq_factor"):
        RotaryEmbedding(low_freq_factor=-1.0)


@pytest.mark.parametrize("rope_type", ["linear", "llama3"])
def test_frequencies_equal_transformers(rope_type):
    """transformers' `ROPE_INIT_FUNCTIONS[rope_type]` (modeling_rope_utils.py), on its config."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    parameters = {"rope_type": rope_type, "factor": 8.0, "rope_theta": 500000.0}
    if rope_type == "llama3":
        parameters.update(
            low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
        )
    config = transformers.LlamaConfig(
        hidden_size=512, num_attention_heads=4, rope_parameters=parameters
    )
    theirs, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    assert attention_factor == 1.0
    layer = RotaryEmbedding(500000.0, scaling_factor=8.0, rope_type=rope_type)
    ours = np_(layer._frequencies(128))
    if rope_type == "linear":  # ours divides the positions instead: the same angles
        ours = ours / 8.0
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6)
