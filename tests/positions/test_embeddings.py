"""TokenAndPositionEmbedding: keras-hub's signature, defaults and weights; masks; reverse logits."""

import functools

import keras
import numpy as np
import pytest
from keras_hub import layers as hub
from test_positional import normal, np_sinusoidal, padded_ids, to_numpy

from keras_attn import ScaledDotAttention
from keras_attn.embeddings import TokenAndPositionEmbedding
from layer_checks import check_layer

# keras.layers.Embedding, and the position layers that test_positional checks on every backend.
pytestmark = pytest.mark.one_backend


@pytest.mark.parametrize(
    "options",
    [
        {"position": "sinusoidal", "mask_zero": True},
        {"position": "learned", "mask_zero": True, "tie_weights": False},
        {"embeddings_regularizer": "l2"},
    ],
)
def test_token_and_position_check_layer(tmp_path, options):
    ids = padded_ids(np.random.default_rng(3))
    check_layer(
        functools.partial(
            TokenAndPositionEmbedding,
            vocabulary_size=20,
            sequence_length=10,
            embedding_dim=6,
            **options,
        ),
        {"inputs": ids},
        tmp_path=tmp_path,
    )


# ---------------------------------------------------------------------------
# TokenAndPositionEmbedding
# ---------------------------------------------------------------------------


def test_token_and_position_defaults_are_keras_hubs():
    layer = TokenAndPositionEmbedding(20, 10, 6)
    ids = padded_ids(np.random.default_rng(8))
    layer(ids)
    assert (layer.position, layer.mask_zero, layer.tie_weights) == ("learned", False, True)
    assert layer.compute_mask(ids) is None and len(layer.trainable_weights) == 2


@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_token_and_position_equals_lookup_plus_encoding(position):
    ids = padded_ids(np.random.default_rng(8))
    layer = TokenAndPositionEmbedding(20, 10, 6, position=position, mask_zero=True)
    out = to_numpy(layer(ids, start_index=2))
    table = to_numpy(layer.token_embedding.embeddings)
    if position == "learned":
        encoding = to_numpy(layer.position_embedding.position_embeddings)[2:9]
    else:
        encoding = np_sinusoidal(range(2, 9), 6)
    np.testing.assert_allclose(out, table[ids] + encoding, atol=1e-5)
    np.testing.assert_array_equal(to_numpy(layer.compute_mask(ids)), ids != 0)
    positions = np.array([9, 0, 1, 1, 2, 3, 4])
    if position == "learned":
        encoding = to_numpy(layer.position_embedding.position_embeddings)[positions]
    else:
        encoding = np_sinusoidal(positions, 6)
    np.testing.assert_allclose(
        to_numpy(layer(ids, positions=positions)), table[ids] + encoding, atol=1e-5
    )


@pytest.mark.filterwarnings("ignore:Layer 'position_embedding'")  # keras-hub's, on its mask
@pytest.mark.parametrize("tie_weights", [True, False])
def test_token_and_position_equals_keras_hub_with_copied_weights(tie_weights):
    ids = padded_ids(np.random.default_rng(18))
    options = dict(tie_weights=tie_weights, mask_zero=True)
    theirs = hub.TokenAndPositionEmbedding(20, 10, 6, **options)
    ours = TokenAndPositionEmbedding(20, 10, 6, **options)
    theirs(ids), ours(ids)
    assert [w.shape for w in ours.weights] == [w.shape for w in theirs.weights]
    ours.set_weights(theirs.get_weights())
    for kwargs in ({}, {"start_index": 3}, {"positions": np.array([[4, 3, 2, 1, 0, 0, 0]] * 3)}):
        np.testing.assert_allclose(
            to_numpy(ours(ids, **kwargs)), to_numpy(theirs(ids, **kwargs)), atol=1e-6
        )
    np.testing.assert_array_equal(to_numpy(ours.compute_mask(ids)), ids != 0)
    hidden = normal(19, 3, 7, 6)
    np.testing.assert_allclose(
        to_numpy(ours.token_embedding(hidden, reverse=True)),
        to_numpy(theirs.token_embedding(hidden, reverse=True)),
        atol=1e-5,
    )


@pytest.mark.parametrize("tie_weights", [True, False])
def test_token_and_position_reverse_projection(tie_weights):
    layer = TokenAndPositionEmbedding(20, 10, 6, tie_weights=tie_weights)
    layer(padded_ids(np.random.default_rng(20)))
    hidden = normal(21, 3, 7, 6)
    logits = to_numpy(layer.token_embedding(hidden, reverse=True))
    table = to_numpy(layer.token_embedding.embeddings)  # (V, d)
    if tie_weights:
        np.testing.assert_allclose(logits, hidden @ table.T, atol=1e-5)
    else:
        reverse = to_numpy(layer.token_embedding.reverse_embeddings)  # (d, V), its own draw
        assert not np.allclose(reverse.reshape(-1), table.reshape(-1))
        np.testing.assert_allclose(logits, hidden @ reverse, atol=1e-5)


def test_token_and_position_regularizer_and_rank_3_ids():
    layer = TokenAndPositionEmbedding(20, 10, 6, embeddings_regularizer=keras.regularizers.L2(0.1))
    ids = np.stack([padded_ids(np.random.default_rng(22))] * 2, axis=1)  # (B, X, T)
    out = to_numpy(layer(ids))
    assert out.shape == (3, 2, 7, 6) and len(layer.losses) == 1
    table = to_numpy(layer.token_embedding.embeddings)
    np.testing.assert_allclose(to_numpy(layer.losses[0]), 0.1 * np.sum(table**2), rtol=1e-5)
    np.testing.assert_allclose(
        out, table[ids] + to_numpy(layer.position_embedding.position_embeddings)[:7], atol=1e-6
    )


@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_token_and_position_mask_reaches_attention(position):
    ids = padded_ids(np.random.default_rng(9))
    inputs = keras.Input(shape=(None,), dtype="int32")
    x = TokenAndPositionEmbedding(20, 10, 6, position=position, mask_zero=True)(inputs)
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
