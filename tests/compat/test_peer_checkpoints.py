"""The peers' weight files load into the same model of ours, and ours into theirs.

Keras keys a functional model's layers in `.weights.h5` / `.keras` files by their
snake-cased class names, so the class names are the peers' (keras-hub's
`TransformerEncoder`, `TransformerDecoder`, `PositionEmbedding`,
`SinePositionEncoding`; Keras' `GroupQueryAttention`, a class named
`GroupedQueryAttention`). The reference is the peer's own output with its own
weights. The former names keep loading the files saved under them
(tests/fixtures/former_names.keras, written before the rename).
"""

import os

import keras
import numpy as np
import pytest
from keras_hub import layers as hub

import keras_attn

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
TOKENS = np.random.default_rng(0).integers(1, 20, (2, 6)).astype("int32")
X = np.random.default_rng(1).normal(size=(2, 6, 8)).astype("float32")


def blocks_model(layers):
    """Tokens -> token and position embedding (+ sine, + learned positions) -> encoder, decoder."""
    tokens = keras.Input((6,), dtype="int32")
    x = layers.TokenAndPositionEmbedding(20, 6, 8)(tokens)
    x = keras.layers.Add()([x, layers.SinePositionEncoding()(x)])
    x = keras.layers.Add()([x, layers.PositionEmbedding(6)(x)])
    encoded = layers.TransformerEncoder(16, 2)(x)
    encoded = layers.TransformerEncoder(16, 2, normalize_first=True)(encoded)
    return keras.Model(tokens, layers.TransformerDecoder(16, 2)(x, encoded))


def gqa_model(layers):
    x = keras.Input((6, 8))
    y = layers.GroupQueryAttention(head_dim=4, num_query_heads=4, num_key_value_heads=2)(x, x)
    return keras.Model(x, layers.GroupQueryAttention(2, 2, 1, use_bias=False)(y, x))


def run(model, inputs):
    return keras.ops.convert_to_numpy(model(inputs))


CASES = {
    "keras_hub": (blocks_model, hub, TOKENS),
    "keras": (gqa_model, keras.layers, X),
}


@pytest.mark.parametrize("suffix", [".weights.h5", ".keras"])
@pytest.mark.parametrize("peer", CASES)
def test_a_peers_file_loads_into_ours_and_ours_into_the_peers(peer, suffix, tmp_path):
    build, peer_layers, inputs = CASES[peer]
    keras.utils.set_random_seed(0)
    theirs, ours = build(peer_layers), build(keras_attn)
    path = str(tmp_path / f"theirs{suffix}")
    theirs.save_weights(path) if suffix == ".weights.h5" else theirs.save(path)
    ours.load_weights(path)
    expected = run(theirs, inputs)
    np.testing.assert_allclose(run(ours, inputs), expected, atol=1e-5)

    keras.utils.set_random_seed(1)
    ours = build(keras_attn)  # fresh weights of ours, back into theirs
    path = str(tmp_path / f"ours{suffix}")
    ours.save_weights(path) if suffix == ".weights.h5" else ours.save(path)
    theirs.load_weights(path)
    np.testing.assert_allclose(run(theirs, inputs), run(ours, inputs), atol=1e-5)
    assert not np.allclose(run(ours, inputs), expected, atol=1e-3)  # new weights


def test_the_classes_have_the_peers_names():
    assert keras_attn.GroupQueryAttention is keras_attn.GroupedQueryAttention
    assert keras_attn.GroupQueryAttention.__name__ == keras.layers.GroupQueryAttention.__name__
    for name in ("TransformerEncoder", "TransformerDecoder", "PositionEmbedding"):
        assert getattr(keras_attn, name).__name__ == getattr(hub, name).__name__
    assert keras_attn.SinePositionEncoding.__name__ == hub.SinePositionEncoding.__name__


FORMER = {
    "TransformerEncoderBlock": "TransformerEncoder",
    "TransformerDecoderBlock": "TransformerDecoder",
    "LearnedPositionalEmbedding": "PositionEmbedding",
    "SinusoidalPositionalEncoding": "SinePositionEncoding",
}


def test_a_keras_file_saved_under_the_former_names_loads_with_its_outputs(tmp_path):
    model = keras.saving.load_model(os.path.join(FIXTURES, "former_names.keras"))
    saved = np.load(os.path.join(FIXTURES, "former_names.npz"))
    np.testing.assert_allclose(run(model, saved["tokens"]), saved["outputs"], atol=1e-5)
    classes = {type(layer).__name__: type(layer) for layer in model.layers}
    for former, name in FORMER.items():
        assert issubclass(classes[former], getattr(keras_attn, name))
        assert getattr(keras_attn, former) is classes[former]
    # Saved again and reloaded (the GroupedQueryAttention now under Keras' paths).
    model.save(tmp_path / "again.keras")
    again = keras.saving.load_model(tmp_path / "again.keras")
    np.testing.assert_allclose(run(again, saved["tokens"]), saved["outputs"], atol=1e-5)
