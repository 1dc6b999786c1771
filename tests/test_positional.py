"""Positional encodings: shared checks, NumPy references of each formula, errors."""

import functools

import keras
import numpy as np
import pytest

from keras_attn import ScaledDotAttention
from keras_attn.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    TokenAndPositionEmbedding,
)
from layer_checks import check_layer

# ---------------------------------------------------------------------------
# NumPy references, written from the formulas
# ---------------------------------------------------------------------------


def np_sinusoidal(positions, depth, max_wavelength=10000):
    """`PE(pos, 2i) = sin(pos / w^(2i/d))`, `PE(pos, 2i+1) = cos(...)`, by loops."""
    out = np.zeros((len(positions), depth))
    for t, pos in enumerate(positions):
        for channel in range(depth):
            i = channel // 2
            angle = pos / max_wavelength ** (2 * i / depth)
            out[t, channel] = np.sin(angle) if channel % 2 == 0 else np.cos(angle)
    return out


def np_rotary(x, positions, max_wavelength=10000, scaling_factor=1.0):
    """Rotates each pair `(x_2i, x_2i+1)` by `pos / scaling_factor * theta_i`."""
    x = np.asarray(x, np.float64)
    depth = x.shape[-1]
    out = np.empty_like(x)
    for t, pos in enumerate(positions):
        for i in range(depth // 2):
            angle = pos / scaling_factor * max_wavelength ** (-2 * i / depth)
            rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
            pair = x[:, t, ..., 2 * i : 2 * i + 2]  # (B, [H,] 2)
            out[:, t, ..., 2 * i : 2 * i + 2] = pair @ rotation.T
    return out


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def padded_ids(rng, batch=3, length=7, vocab=20):
    ids = rng.integers(1, vocab, size=(batch, length)).astype("int32")
    for b in range(batch):
        ids[b, length - 2 - b :] = 0  # 2, 3, 4 padded steps at the end
    return ids


# ---------------------------------------------------------------------------
# The shared layer checks
# ---------------------------------------------------------------------------


def test_sinusoidal_check_layer(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 5)).astype("float32")  # odd d
    check_layer(
        functools.partial(SinusoidalPositionalEncoding, max_wavelength=100),
        {"inputs": x},
        call_kwargs={"start_index": 3},
        expect_trainable=False,
        tmp_path=tmp_path,
    )


def test_learned_check_layer(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 6, 4)).astype("float32")
    check_layer(
        functools.partial(LearnedPositionalEmbedding, sequence_length=10),
        {"inputs": x},
        call_kwargs={"start_index": 2},
        tmp_path=tmp_path,
    )


@pytest.mark.parametrize("shape", [(2, 6, 8), (2, 5, 3, 4)])
def test_rotary_check_layer(tmp_path, shape):
    rng = np.random.default_rng(2)
    x = rng.normal(size=shape).astype("float32")
    check_layer(
        functools.partial(RotaryEmbedding, max_wavelength=100, scaling_factor=2.0),
        {"inputs": x},
        call_kwargs={"start_index": 1},
        expect_trainable=False,
        tmp_path=tmp_path,
    )


@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_token_and_position_check_layer(tmp_path, position):
    ids = padded_ids(np.random.default_rng(3))
    check_layer(
        functools.partial(
            TokenAndPositionEmbedding,
            vocab_size=20,
            sequence_length=10,
            embedding_dim=6,
            position=position,
        ),
        {"inputs": ids},
        tmp_path=tmp_path,
    )


# ---------------------------------------------------------------------------
# Sinusoidal
# ---------------------------------------------------------------------------


def test_sinusoidal_hand_computed():
    out = to_numpy(SinusoidalPositionalEncoding()(np.zeros((1, 2, 4), "float32")))
    expected = [np.sin(1.0), np.cos(1.0), np.sin(1 / 100), np.cos(1 / 100)]
    np.testing.assert_allclose(out[0, 1], expected, atol=1e-6)
    np.testing.assert_allclose(out[0, 0], [0, 1, 0, 1], atol=1e-7)


@pytest.mark.parametrize("depth", [1, 4, 7, 16])
def test_sinusoidal_matches_numpy(depth):
    x = np.random.default_rng(4).normal(size=(3, 11, depth)).astype("float32")
    out = to_numpy(SinusoidalPositionalEncoding(max_wavelength=500)(x))
    assert out.shape == x.shape and out.dtype == np.float32
    expected = np_sinusoidal(range(11), depth, max_wavelength=500)
    np.testing.assert_allclose(out, np.broadcast_to(expected, x.shape), atol=1e-5)


@pytest.mark.parametrize("as_tensor", [False, True])
def test_sinusoidal_start_index_slices_longer_encoding(as_tensor):
    layer = SinusoidalPositionalEncoding()
    full = to_numpy(layer(np.zeros((1, 20, 6), "float32")))
    start = keras.ops.convert_to_tensor(13) if as_tensor else 13
    part = to_numpy(layer(np.zeros((1, 4, 6), "float32"), start_index=start))
    np.testing.assert_allclose(part, full[:, 13:17], atol=1e-5)
    np.testing.assert_allclose(part[0], np_sinusoidal(range(13, 17), 6), atol=1e-5)


def test_sinusoidal_dynamic_length():
    inputs = keras.Input(shape=(None, 5))
    model = keras.Model(inputs, SinusoidalPositionalEncoding()(inputs))
    for length in (1, 4, 9):
        out = to_numpy(model(np.zeros((2, length, 5), "float32")))
        np.testing.assert_allclose(out[1], np_sinusoidal(range(length), 5), atol=1e-5)


def test_output_dtype_follows_policy():
    x = np.ones((2, 3, 4), "float32")
    for layer in (SinusoidalPositionalEncoding, RotaryEmbedding):
        assert layer(dtype="mixed_float16")(x).dtype == "float16"
        assert layer(dtype="bfloat16")(x).dtype == "bfloat16"


# ---------------------------------------------------------------------------
# Learned
# ---------------------------------------------------------------------------


def test_learned_equals_table_rows():
    layer = LearnedPositionalEmbedding(sequence_length=9)
    x = np.random.default_rng(5).normal(size=(2, 4, 3)).astype("float32")
    out = to_numpy(layer(x))
    table = to_numpy(layer.embeddings)
    assert table.shape == (9, 3)
    np.testing.assert_allclose(out, np.broadcast_to(table[:4], x.shape), atol=1e-6)
    for start in (3, keras.ops.convert_to_tensor(5)):
        out = to_numpy(layer(x, start_index=start))
        s = int(to_numpy(start))
        np.testing.assert_allclose(out[1], table[s : s + 4], atol=1e-6)


def test_learned_dynamic_length():
    inputs = keras.Input(shape=(None, 3))
    layer = LearnedPositionalEmbedding(sequence_length=8)
    model = keras.Model(inputs, layer(inputs))
    out = to_numpy(model(np.zeros((1, 5, 3), "float32")))
    np.testing.assert_allclose(out[0], to_numpy(layer.embeddings)[:5], atol=1e-6)


# ---------------------------------------------------------------------------
# Rotary
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 9, 6), (2, 7, 3, 8)])
def test_rotary_matches_pairwise_rotation(shape):
    x = np.random.default_rng(6).normal(size=shape).astype("float32")
    layer = RotaryEmbedding(max_wavelength=1000, scaling_factor=2.0)
    out = to_numpy(layer(x, start_index=4))
    expected = np_rotary(x, range(4, 4 + shape[1]), 1000, scaling_factor=2.0)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    np.testing.assert_allclose(
        to_numpy(RotaryEmbedding()(x)), np_rotary(x, range(shape[1])), atol=1e-5
    )


def test_rotary_preserves_norms_and_is_relative():
    rng = np.random.default_rng(7)
    q, k = rng.normal(size=(2, 16)).astype("float32")
    length = 12
    layer = RotaryEmbedding()
    # The same q (and k) at every position: scores[m, n] = <R(m) q, R(n) k>.
    rq = to_numpy(layer(np.tile(q, (1, length, 1))))[0]  # (T, d)
    rk = to_numpy(layer(np.tile(k, (1, length, 1))))[0]
    np.testing.assert_allclose(
        np.linalg.norm(rq, axis=-1), np.full(length, np.linalg.norm(q)), rtol=1e-5
    )
    scores = rq @ rk.T
    for offset in range(-length + 1, length):
        diagonal = np.diagonal(scores, offset)  # all (m, n) with n - m = offset
        np.testing.assert_allclose(diagonal, diagonal[0], atol=1e-4)
    assert np.ptp(np.diagonal(scores, 0)) < 1e-4 and np.ptp(scores) > 1e-2


# ---------------------------------------------------------------------------
# TokenAndPositionEmbedding
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_token_and_position_equals_lookup_plus_encoding(position):
    ids = padded_ids(np.random.default_rng(8))
    layer = TokenAndPositionEmbedding(20, 10, 6, position=position)
    out = to_numpy(layer(ids, start_index=2))
    table = to_numpy(layer.token_embedding.embeddings)
    if position == "learned":
        encoding = to_numpy(layer.position_embedding.embeddings)[2:9]
    else:
        encoding = np_sinusoidal(range(2, 9), 6)
    np.testing.assert_allclose(out, table[ids] + encoding, atol=1e-5)
    np.testing.assert_array_equal(to_numpy(layer.compute_mask(ids)), ids != 0)


@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_token_and_position_mask_reaches_attention(position):
    ids = padded_ids(np.random.default_rng(9))
    inputs = keras.Input(shape=(None,), dtype="int32")
    x = TokenAndPositionEmbedding(20, 10, 6, position=position)(inputs)
    _, weights = ScaledDotAttention()(x, x, return_attention_scores=True)
    weights = to_numpy(keras.Model(inputs, weights)(ids))  # (B, T, T)
    padded_keys = np.broadcast_to((ids == 0)[:, None, :], weights.shape)
    assert np.all(weights[padded_keys] == 0.0)
    visible_rows = ids != 0
    np.testing.assert_allclose(weights.sum(-1)[visible_rows], 1.0, atol=1e-6)


def test_token_and_position_without_mask_zero():
    layer = TokenAndPositionEmbedding(20, 10, 6, mask_zero=False)
    ids = padded_ids(np.random.default_rng(10))
    assert layer.compute_mask(ids) is None
    _, weights = ScaledDotAttention()(*[layer(ids)] * 2, return_attention_scores=True)
    assert np.all(to_numpy(weights)[ids[:, None, :].repeat(7, 1) == 0] > 0)


@pytest.mark.parametrize(
    "make",
    [SinusoidalPositionalEncoding, RotaryEmbedding, lambda: LearnedPositionalEmbedding(9)],
)
def test_positional_layers_pass_the_mask_through(make):
    ids = padded_ids(np.random.default_rng(11))
    inputs = keras.Input(shape=(7,), dtype="int32")
    x = keras.layers.Embedding(20, 4, mask_zero=True)(inputs)
    # The encoding's own output carries the mask (a plain `x + pe(x)` would drop
    # it: Keras ops do not propagate masks, `keras.layers.Add` does).
    x = make()(x)
    _, weights = ScaledDotAttention()(x, x, return_attention_scores=True)
    weights = to_numpy(keras.Model(inputs, weights)(ids))
    assert np.all(weights[np.broadcast_to((ids == 0)[:, None, :], weights.shape)] == 0)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: SinusoidalPositionalEncoding(max_wavelength=-1), "max_wavelength=-1"),
        (lambda: LearnedPositionalEmbedding(sequence_length=-4), "sequence_length=-4"),
        (lambda: LearnedPositionalEmbedding(sequence_length=2.5), "sequence_length=2.5"),
        (lambda: RotaryEmbedding(max_wavelength=0), "max_wavelength=0"),
        (lambda: RotaryEmbedding(scaling_factor=-2.0), "scaling_factor=-2.0"),
        (lambda: TokenAndPositionEmbedding(-1, 10, 4), "vocab_size=-1"),
        (lambda: TokenAndPositionEmbedding(20, 0, 4), "sequence_length=0"),
        (lambda: TokenAndPositionEmbedding(20, 10, -8), "embedding_dim=-8"),
        (lambda: TokenAndPositionEmbedding(20, 10, 4, position="rope"), "position='rope'"),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_rotary_odd_depth():
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding()(np.zeros((1, 3, 5), "float32"))


def test_learned_too_long():
    with pytest.raises(ValueError, match="length=9, start_index=0, sequence_length=8"):
        LearnedPositionalEmbedding(sequence_length=8)(np.zeros((1, 9, 4), "float32"))
    layer = LearnedPositionalEmbedding(sequence_length=8)
    layer(np.zeros((1, 8, 4), "float32"))
    with pytest.raises(ValueError, match=r"length=4, start_index=5, sequence_length=8"):
        layer(np.zeros((1, 4, 4), "float32"), start_index=5)
    with pytest.raises(ValueError, match="sequence_length=6"):
        TokenAndPositionEmbedding(20, 6, 4, position="learned")(np.ones((1, 7), "int32"))


def test_bad_ranks():
    with pytest.raises(ValueError, match="rank 3"):
        SinusoidalPositionalEncoding()(np.zeros((2, 4), "float32"))
    with pytest.raises(ValueError, match="rank 3 or 4"):
        RotaryEmbedding()(np.zeros((2, 4), "float32"))
    with pytest.raises(ValueError, match="rank 2"):
        TokenAndPositionEmbedding(20, 10, 4)(np.zeros((2, 4, 1), "int32"))
