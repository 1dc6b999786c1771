"""Transformer blocks at the edges: an empty source adds nothing in cross-attention, the
sublayers start from different weights, a seeded block's dropouts differ."""

import keras
import numpy as np

import keras_attn

rng = np.random.default_rng(7)


def np_(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def t(x, dtype=None):
    return keras.ops.convert_to_tensor(x, dtype)


def _differ(a, b):
    a, b = np_(a), np_(b)
    n = min(a.size, b.size)
    return not np.allclose(a.reshape(-1)[:n], b.reshape(-1)[:n])


def test_a_decoder_block_with_an_empty_source_adds_nothing_in_cross_attention():
    block = keras_attn.TransformerDecoderBlock(16, 2, bias_initializer="ones")
    x = t(rng.normal(size=(2, 4, 8)).astype("float32"))
    block(x, t(np.zeros((2, 0, 8), "float32")))
    cross = block._cross_attention_layer(x, t(np.zeros((2, 0, 8), "float32")))
    np.testing.assert_array_equal(np_(cross), np.zeros((2, 4, 8)))


def test_sublayers_do_not_start_with_identical_weights():
    x = t(rng.normal(size=(2, 5, 8)).astype("float32"))
    mha = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    mha(x, x)
    assert _differ(mha.query_dense.kernel, mha.key_dense.kernel)
    assert _differ(mha.key_dense.kernel, mha.value_dense.kernel)
    kv = keras_attn.KeyValueAttention(key_dim=8)
    kv(x, x)
    assert _differ(kv.query_dense.kernel, kv.key_dense.kernel)
    additive = keras_attn.AdditiveAttention()
    additive(x, x)
    assert _differ(additive.score_layer.query_kernel, additive.score_layer.key_kernel)
    block = keras_attn.TransformerDecoderBlock(8, 2)
    block(x, x)
    # The attention's query projection, by its Keras name or (before that lands) ours.
    query = lambda mha: getattr(mha, "_query_dense", None) or mha.query_dense  # noqa: E731
    assert _differ(
        query(block._self_attention_layer).kernel, query(block._cross_attention_layer).kernel
    )
    assert _differ(
        block._feedforward_intermediate_dense.kernel, block._feedforward_output_dense.kernel
    )
    embedding = keras_attn.TokenAndPositionEmbedding(20, 5, 8, position="learned")
    embedding(t(np.zeros((1, 5), "int32")))
    table = embedding.position_embedding.weights[0]
    assert _differ(embedding.token_embedding.embeddings[:5], table)


def test_the_residual_dropouts_of_a_seeded_block_drop_different_features():
    block = keras_attn.TransformerDecoderBlock(8, 2, dropout=0.5, seed=3)
    x = t(rng.normal(size=(2, 5, 8)).astype("float32"))
    block(x, x)
    ones = t(np.ones((4, 64), "float32"))
    dropouts = [block._self_attention_dropout, block._cross_attention_dropout,
                block._feedforward_dropout]  # fmt: skip
    kept = [np_(d(ones, training=True)) != 0 for d in dropouts]
    for i in range(3):
        for j in range(i):
            assert not np.array_equal(kept[i], kept[j]), (i, j)
    attentions = (block._self_attention_layer, block._cross_attention_layer)
    seeds = {*(a.seed for a in attentions), *(d.seed for d in dropouts)}
    assert len(seeds) == 5 and None not in seeds
