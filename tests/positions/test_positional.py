"""Positional encodings: shared checks, NumPy references of each formula, keras-hub's
layers with copied weights, errors."""

import functools

import keras
import numpy as np
import pytest
from keras_hub import layers as hub

from keras_attn import ScaledDotAttention
from keras_attn.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from keras_attn.rotary import RotaryEmbedding
from layer_checks import check_layer, dtype_of

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


def np_rotary(x, positions, max_wavelength=10000, scaling_factor=1.0, layout="half"):
    """Rotates each channel pair of `x` `(B, T, ..., d)` by `pos / scaling_factor * theta_i`.

    Pairs: `(x_i, x_{i + d/2})` for "half", `(x_2i, x_2i+1)` for "interleaved".
    """
    x = np.asarray(x, np.float64)
    depth = x.shape[-1]
    out = np.empty_like(x)
    for t, pos in enumerate(positions):
        for i in range(depth // 2):
            a, b = (i, i + depth // 2) if layout == "half" else (2 * i, 2 * i + 1)
            angle = pos / scaling_factor * max_wavelength ** (-2 * i / depth)
            out[:, t, ..., a] = x[:, t, ..., a] * np.cos(angle) - x[:, t, ..., b] * np.sin(angle)
            out[:, t, ..., b] = x[:, t, ..., b] * np.cos(angle) + x[:, t, ..., a] * np.sin(angle)
    return out


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def padded_ids(rng, batch=3, length=7, vocab=20):
    ids = rng.integers(1, vocab, size=(batch, length)).astype("int32")
    for b in range(batch):
        ids[b, length - 2 - b :] = 0  # 2, 3, 4 padded steps at the end
    return ids


def normal(seed, *shape):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


# ---------------------------------------------------------------------------
# The shared layer checks (config round trip, symbolic/eager, .keras and
# SavedModel reload, a fit step, mixed precision)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 6, 5), (2, 3, 6, 4)])  # odd d; rank 4
def test_sinusoidal_check_layer(tmp_path, shape):
    check_layer(
        functools.partial(SinusoidalPositionalEncoding, max_wavelength=100),
        {"inputs": normal(0, *shape)},
        call_kwargs={"start_index": 3},
        expect_trainable=False,
        tmp_path=tmp_path,
    )


@pytest.mark.parametrize("shape", [(2, 6, 4), (2, 3, 6, 4)])
def test_learned_check_layer(tmp_path, shape):
    check_layer(
        functools.partial(LearnedPositionalEmbedding, sequence_length=10),
        {"inputs": normal(1, *shape)},
        call_kwargs={"start_index": 2},
        tmp_path=tmp_path,
    )


@pytest.mark.parametrize(
    "shape, options",
    [
        ((2, 6, 8), {}),
        ((2, 5, 3, 4), {"layout": "interleaved"}),
        ((2, 4, 5), {"sequence_axis": -1, "feature_axis": 1}),  # (B, d, T)
    ],
)
def test_rotary_check_layer(tmp_path, shape, options):
    check_layer(
        functools.partial(RotaryEmbedding, max_wavelength=100, scaling_factor=2.0, **options),
        {"inputs": normal(2, *shape)},
        call_kwargs={"start_index": 1},
        expect_trainable=False,
        tmp_path=tmp_path,
    )


@pytest.mark.filterwarnings("ignore:Gradients do not exist")  # an unused reverse table
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
    x = normal(4, 3, 11, depth)
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


def test_sinusoidal_positions_and_rank_4():
    # (B, X, T, d): the sequence is the second-to-last axis; positions (B, T) per example.
    x = np.zeros((2, 3, 4, 6), "float32")
    positions = np.array([[0, 5, 2, 9], [7, 7, 1, 0]])
    out = to_numpy(SinusoidalPositionalEncoding()(x, positions=positions))
    for b in range(2):
        expected = np.broadcast_to(np_sinusoidal(positions[b], 6), (3, 4, 6))
        np.testing.assert_allclose(out[b], expected, atol=1e-5)
    shared = to_numpy(SinusoidalPositionalEncoding()(x, positions=positions[0]))  # (T,)
    np.testing.assert_allclose(
        shared, np.broadcast_to(np_sinusoidal(positions[0], 6), x.shape), atol=1e-5
    )


@pytest.mark.parametrize("depth", [5, 8])
def test_sinusoidal_equals_keras_hub(depth):
    x = normal(12, 2, 3, 7, depth)
    ours, theirs = SinusoidalPositionalEncoding(max_wavelength=300), hub.SinePositionEncoding(300)
    for kwargs in ({}, {"start_index": 4}, {"positions": np.array([[3, 1, 4, 1, 5, 9, 2]] * 2)}):
        np.testing.assert_allclose(
            to_numpy(ours(x[:, 0], **kwargs)), to_numpy(theirs(x[:, 0], **kwargs)), atol=1e-5
        )
    np.testing.assert_allclose(to_numpy(ours(x)), to_numpy(theirs(x)), atol=1e-5)  # rank 4


def test_output_dtype_follows_policy():
    x = np.ones((2, 3, 4), "float32")
    for layer in (SinusoidalPositionalEncoding, RotaryEmbedding):
        assert dtype_of(layer(dtype="mixed_float16")(x)) == "float16"
        assert dtype_of(layer(dtype="bfloat16")(x)) == "bfloat16"


# ---------------------------------------------------------------------------
# Learned
# ---------------------------------------------------------------------------


def test_learned_equals_table_rows():
    layer = LearnedPositionalEmbedding(sequence_length=9)
    x = normal(5, 2, 4, 3)
    out = to_numpy(layer(x))
    table = to_numpy(layer.position_embeddings)
    assert table.shape == (9, 3) and [w.path for w in layer.weights] == [f"{layer.name}/embeddings"]
    np.testing.assert_allclose(out, np.broadcast_to(table[:4], x.shape), atol=1e-6)
    for start in (3, keras.ops.convert_to_tensor(5)):
        out = to_numpy(layer(x, start_index=start))
        s = int(to_numpy(start))
        np.testing.assert_allclose(out[1], table[s : s + 4], atol=1e-6)
    positions = np.array([[8, 0, 0, 3], [1, 2, 8, 7]])
    np.testing.assert_array_equal(to_numpy(layer(x, positions=positions)), table[positions])
    rank_4 = to_numpy(layer(normal(5, 2, 5, 4, 3), positions=positions))  # (B, X, T, d)
    np.testing.assert_array_equal(rank_4, np.broadcast_to(table[positions][:, None], (2, 5, 4, 3)))


def test_learned_dynamic_length():
    inputs = keras.Input(shape=(None, 3))
    layer = LearnedPositionalEmbedding(sequence_length=8)
    model = keras.Model(inputs, layer(inputs))
    out = to_numpy(model(np.zeros((1, 5, 3), "float32")))
    np.testing.assert_allclose(out[0], to_numpy(layer.position_embeddings)[:5], atol=1e-6)


def test_learned_equals_keras_hub_with_copied_weights():
    x = normal(13, 2, 3, 5, 4)  # rank 4; rank 3 is x[:, 0]
    theirs = hub.PositionEmbedding(sequence_length=8)
    theirs(x)
    ours = LearnedPositionalEmbedding(sequence_length=8)
    ours(x)
    ours.set_weights(theirs.get_weights())
    positions = np.array([[7, 0, 3, 3, 1], [2, 6, 5, 4, 0]])
    for inputs, kwargs in (
        (x, {}),
        (x[:, 0], {"start_index": 3}),
        (x[:, 0], {"positions": positions}),
    ):
        np.testing.assert_array_equal(
            to_numpy(ours(inputs, **kwargs)), to_numpy(theirs(inputs, **kwargs))
        )


# ---------------------------------------------------------------------------
# Rotary
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("shape", [(2, 9, 6), (2, 7, 3, 8)])
def test_rotary_matches_pairwise_rotation(shape, layout):
    x = normal(6, *shape)
    layer = RotaryEmbedding(max_wavelength=1000, scaling_factor=2.0, layout=layout)
    out = to_numpy(layer(x, start_index=4))
    expected = np_rotary(x, range(4, 4 + shape[1]), 1000, scaling_factor=2.0, layout=layout)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    np.testing.assert_allclose(
        to_numpy(RotaryEmbedding(layout=layout)(x)),
        np_rotary(x, range(shape[1]), layout=layout),
        atol=1e-5,
    )


def test_rotary_layouts_are_a_channel_permutation_of_each_other():
    # interleaved(x) = P^-1 half(P x), P taking channels (0, 2, 4, ..., 1, 3, 5, ...).
    x = normal(14, 2, 5, 3, 8)
    order = np.concatenate([np.arange(0, 8, 2), np.arange(1, 8, 2)])
    half = to_numpy(RotaryEmbedding()(x[..., order], start_index=2))
    interleaved = to_numpy(RotaryEmbedding(layout="interleaved")(x, start_index=2))
    np.testing.assert_allclose(interleaved[..., order], half, atol=1e-6)


def test_rotary_positions_equal_start_index_and_rows():
    x = normal(15, 2, 4, 3, 6)
    layer = RotaryEmbedding()
    by_start = to_numpy(layer(x, start_index=5))
    np.testing.assert_allclose(to_numpy(layer(x, positions=np.arange(5, 9))), by_start, atol=1e-6)
    positions = np.array([[5, 6, 7, 8], [0, 3, 3, 1]], "float32")  # (B, T): one row each
    out = to_numpy(layer(x, positions=positions))
    np.testing.assert_allclose(out[0], by_start[0], atol=1e-6)
    np.testing.assert_allclose(out[1], np_rotary(x[1:], positions[1])[0], atol=1e-5)


def test_rotary_axes():
    x = normal(16, 2, 5, 3, 6)  # (B, T, H, d)
    expected = to_numpy(RotaryEmbedding()(x, start_index=2))
    moved = np.transpose(x, (0, 3, 2, 1))  # (B, d, H, T)
    layer = RotaryEmbedding(sequence_axis=3, feature_axis=-3)
    out = to_numpy(layer(moved, start_index=2))
    np.testing.assert_allclose(np.transpose(out, (0, 3, 2, 1)), expected, atol=1e-6)


@pytest.mark.parametrize(
    "shape, options",
    [
        ((2, 6, 8), {}),
        ((2, 6, 3, 4), {"scaling_factor": 4.0}),
        ((2, 8, 6), {"sequence_axis": -1, "feature_axis": -2}),
    ],
)
def test_rotary_equals_keras_hub(shape, options):
    x = normal(17, *shape)
    ours = RotaryEmbedding(max_wavelength=500, **options)
    theirs = hub.RotaryEmbedding(max_wavelength=500, **options)
    length = x.shape[options.get("sequence_axis", 1)]
    rows = np.random.default_rng(0).integers(0, 50, size=(2, length))
    for kwargs in ({}, {"start_index": 7}, {"positions": rows[0]}, {"positions": rows}):
        np.testing.assert_allclose(
            to_numpy(ours(x, **kwargs)), to_numpy(theirs(x, **kwargs)), atol=1e-5
        )


def test_rotary_preserves_norms_and_is_relative():
    rng = np.random.default_rng(7)
    q, k = rng.normal(size=(2, 16)).astype("float32")
    length = 12
    for layout in ("half", "interleaved"):
        layer = RotaryEmbedding(layout=layout)
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
