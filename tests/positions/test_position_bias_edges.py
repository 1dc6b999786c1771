"""Position biases at the edges a switching user meets: sharing, keras-hub's ALiBi, caches.

References: keras-hub's own `AlibiBias` output; the full (uncached) pass.
"""

import keras
import numpy as np
import pytest
from keras_hub import layers as hub

import keras_attn

rng = np.random.default_rng(0)


def np_(x):
    return keras.ops.convert_to_numpy(x)


def test_a_shared_relative_position_bias_reloads_shared(tmp_path):
    # T5's way: one bias for the whole stack. Saved once; loading shares one table again.
    t5 = keras_attn.RelativePositionBias(2, num_buckets=8, embeddings_initializer="normal")
    x = keras.Input((5, 8))
    y = keras_attn.TransformerEncoder(16, 2, position_bias=t5)(x)
    model = keras.Model(x, keras_attn.TransformerEncoder(16, 2, position_bias=t5)(y))
    inputs = rng.normal(size=(2, 5, 8)).astype("float32")
    model.save(tmp_path / "shared.keras")
    loaded = keras.saving.load_model(tmp_path / "shared.keras")
    np.testing.assert_allclose(np_(loaded(inputs)), np_(model(inputs)), atol=1e-5)
    first, second = (layer.position_bias for layer in loaded.layers[1:])
    assert first is second and len(loaded.weights) == len(model.weights)
    first.table.assign(3 * rng.normal(size=(8, 2)))  # one table: both blocks see the change
    model.layers[1].position_bias.table.assign(first.table)
    np.testing.assert_allclose(np_(loaded(inputs)), np_(model(inputs)), atol=1e-5)


@pytest.mark.parametrize("heads, tq, tv", [(2, 4, 4), (3, 2, 5), (8, 6, 3)])
def test_alibi_called_on_scores_equals_keras_hubs_on_every_row(heads, tq, tv):
    scores = rng.normal(size=(2, heads, tq, tv)).astype("float32")
    expected = np_(hub.AlibiBias()(scores))
    np.testing.assert_allclose(np_(keras_attn.AlibiBias()(scores)), expected, rtol=1e-6)
    np.testing.assert_allclose(
        np_(keras_attn.AlibiBias(alibi_bias_max=4)(scores)),
        np_(hub.AlibiBias(alibi_bias_max=4)(scores)),
        rtol=1e-6,
    )


def test_alibi_in_a_layer_gives_keras_hubs_weights_under_a_causal_mask():
    # In a layer the bias is -m |p_i - j|, keras-hub's -m (Tv - 1 - j) plus a constant per row:
    # the same softmax where j <= p_i.
    scores = rng.normal(size=(1, 4, 5, 5)).astype("float32")
    causal = np.tril(np.ones((5, 5), bool))
    ours = np_(keras_attn.AlibiBias().bias(5, 5, num_heads=4))[None] + scores
    theirs = np_(hub.AlibiBias()(scores))
    softmax = lambda s: np_(keras.ops.softmax(np.where(causal, s, -1e9), axis=-1))  # noqa: E731
    np.testing.assert_allclose(softmax(ours), softmax(theirs), atol=1e-6)
    assert not np.allclose(ours, theirs, atol=1e-3)


@pytest.mark.parametrize(
    "options", [{"position_bias": keras_attn.AlibiBias()}, {"sliding_window": 2}]
)
def test_a_cross_attention_cache_with_query_positions_raises(options):
    # A step through the source's cache has no position in the source: a full pass aligns its
    # queries to the source's end, a step would see the last position (it differed silently).
    mha = keras_attn.MultiHeadAttention(2, 4, **options)
    source = rng.normal(size=(2, 6, 8)).astype("float32")
    mha(source[:, :3], source)
    with pytest.raises(ValueError, match="cross-attention cache has no query positions"):
        mha.compute_cache(source)
    plain = keras_attn.MultiHeadAttention(2, 4)
    queries = rng.normal(size=(2, 3, 8)).astype("float32")
    full = np_(plain(queries, source))
    cache = plain.compute_cache(source)
    steps = [np_(plain(queries[:, t : t + 1], cache=cache)[0]) for t in range(3)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_a_learned_bias_on_other_heads_raises_in_a_layer_and_in_ops_attention():
    bias = keras_attn.RelativePositionBias(num_heads=4)
    message = r"`position_bias` must have one bias per query head\. Received: "
    with pytest.raises(ValueError, match=message + r"position_bias\.num_heads=4, num_heads=2"):
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, position_bias=bias)
    q = rng.normal(size=(1, 2, 3, 4)).astype("float32")  # (B, h, T, d): 2 heads
    with pytest.raises(ValueError, match=message + r"position_bias\.num_heads=4, num_heads=2"):
        keras_attn.ops.attention(q, q, q, bias=bias)
