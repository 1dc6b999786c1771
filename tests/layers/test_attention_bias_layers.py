"""Attention biases and sliding windows through the layers: score layers, MHA, the blocks.

The kernels themselves are checked in tests/kernels/test_attention_bias.py (NumPy references,
gradients, cache steps); here each layer passes its `attention_bias=`, `position_bias=` and
`sliding_window=` to them, on every path and through the cache.
"""

import keras
import numpy as np
import pytest
from test_attention_bias import TQ, TV, B, H, np_, t5_layer

import keras_attn
from numpy_reference import alibi, attend, scaled_dot_scores

# ---------------------------------------------------------------------------
# The single-head score layers
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("single_query", [False, True])
def test_score_layers_add_the_bias(single_query):
    rng = np.random.default_rng(9)
    q = rng.normal(size=(2, 4)) if single_query else rng.normal(size=(2, 3, 4))
    v = rng.normal(size=(2, 5, 4))
    bias = rng.normal(size=(2, 5) if single_query else (1, 3, 5))
    value_mask = np.array([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], bool)
    layer = keras_attn.ScaledDotAttention()
    out, w = layer(q.astype("float32"), v.astype("float32"), value_mask=value_mask,
                   attention_bias=bias.astype("float32"), return_attention_scores=True)  # fmt: skip
    q3 = q[:, None] if single_query else q
    b3 = bias[:, None] if single_query else bias
    expected, expected_w = attend(scaled_dot_scores(q3, v) + b3, v, value_mask[:, None, :])
    if single_query:
        expected, expected_w = expected[:, 0], expected_w[:, 0]
    np.testing.assert_allclose(np_(out), expected, atol=1e-5)
    np.testing.assert_allclose(np_(w), expected_w, atol=1e-6)
    # ALiBi with one head on a score layer: slope 2^-8, end-aligned queries.
    out = layer(q.astype("float32"), v.astype("float32"), attention_bias=keras_attn.AlibiBias())
    expected, _ = attend(scaled_dot_scores(q3, v) + alibi(1, q3.shape[1], 5)[0], v)
    np.testing.assert_allclose(np_(out), expected[:, 0] if single_query else expected, atol=1e-5)


# ---------------------------------------------------------------------------
# MultiHeadAttention: position_bias, attention_bias, sliding_window on each path
# ---------------------------------------------------------------------------


def mha(implementation="auto", **kwargs):
    layer = keras_attn.MultiHeadAttention(num_heads=H, key_dim=4, implementation=implementation,
                                          **kwargs)  # fmt: skip
    layer.build((B, TV, 8), (B, TV, 8))
    return layer


def copy_weights(source, target):
    target.build((B, TV, 8), (B, TV, 8))
    target.set_weights(source.get_weights())
    return target


def mha_options():
    t5, _ = t5_layer(bidirectional=False)
    return {
        "alibi": {"position_bias": keras_attn.AlibiBias()},
        "t5+window": {"position_bias": t5, "sliding_window": 3},
        "window": {"sliding_window": 2},
    }


@pytest.mark.parametrize("option", ["alibi", "t5+window", "window"])
def test_mha_paths_and_cached_decoding_agree(option):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(B, TV, 8)).astype("float32")
    mask = np.ones((B, TV), bool)
    mask[0, :2], mask[1, 5] = False, False  # left padding, a hole
    x[~mask] = 1e30  # hostile padded steps
    options = mha_options()[option]
    reference = mha("dense", **options)
    full = np_(reference(x, x, query_mask=mask, value_mask=mask, use_causal_mask=True))
    assert np.isfinite(full).all()
    for implementation in ("fused", "chunked"):
        layer = copy_weights(reference, keras_attn.MultiHeadAttention(
            num_heads=H, key_dim=4, implementation=implementation, **options))  # fmt: skip
        out = np_(layer(x, x, query_mask=mask, value_mask=mask, use_causal_mask=True))
        np.testing.assert_allclose(out, full, atol=2e-5, err_msg=implementation)
    # Step by step through the cache: each step equals its row of the full pass.
    cache = reference.empty_cache(B, TV)
    steps = []
    for i in range(TV):
        y, cache = reference(x[:, i : i + 1], x[:, i : i + 1], query_mask=mask[:, i : i + 1],
                             value_mask=mask[:, i : i + 1], use_causal_mask=True, cache=cache,
                             cache_update_index=i)  # fmt: skip
        steps.append(np_(y))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=2e-5)


def test_mha_attention_bias_tensor_matches_numpy():
    rng = np.random.default_rng(12)
    x = rng.normal(size=(B, TQ, 8)).astype("float32")
    bias = rng.normal(size=(1, H, TQ, TQ)).astype("float32")
    layer = mha("dense")
    out, w = layer(x, x, attention_bias=bias, return_attention_scores=True)
    q, k, v = (np_(d(x)).transpose(0, 2, 1, 3) for d in (layer._query_dense, layer._key_dense,
                                                          layer._value_dense))  # fmt: skip
    _, expected_w = attend(scaled_dot_scores(q, k) + bias, v)
    np.testing.assert_allclose(np_(w), expected_w, atol=1e-5)
    chunked = copy_weights(
        layer, keras_attn.MultiHeadAttention(num_heads=H, key_dim=4, implementation="chunked")
    )
    np.testing.assert_allclose(np_(chunked(x, x, attention_bias=bias)), np_(out), atol=2e-5)


def test_mha_with_position_bias_trains_and_round_trips(tmp_path):
    t5, _ = t5_layer(bidirectional=True)
    inputs = keras.Input((TQ, 8))
    outputs = keras_attn.MultiHeadAttention(num_heads=H, key_dim=4, position_bias=t5,
                                            sliding_window=4)(inputs, inputs)  # fmt: skip
    model = keras.Model(inputs, outputs)
    model.compile("adam", "mse")
    x = np.random.default_rng(13).normal(size=(4, TQ, 8)).astype("float32")
    before = np_(t5.table).copy()
    model.fit(x, x, epochs=1, batch_size=2, verbose=0)
    assert not np.allclose(np_(t5.table), before)  # the table learns through fit
    path = tmp_path / "model.keras"
    model.save(path)
    reloaded = keras.models.load_model(path)
    np.testing.assert_allclose(np_(reloaded(x)), np_(model(x)), atol=1e-6)


# ---------------------------------------------------------------------------
# The Transformer blocks pass position_bias and sliding_window to their self-attention
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("bias", ["alibi", "t5"])
def test_decoder_block_with_a_bias_decodes_as_its_full_pass(bias):
    rng = np.random.default_rng(14)
    x = rng.normal(size=(B, TV, 8)).astype("float32")
    mask = np.ones((B, TV), bool)
    mask[0, :2] = False
    position_bias = keras_attn.AlibiBias() if bias == "alibi" else t5_layer(False)[0]
    block = keras_attn.TransformerDecoderBlock(16, H, position_bias=position_bias,
                                               sliding_window=3)  # fmt: skip
    full = np_(block(x, decoder_padding_mask=mask))
    cache, steps = block.empty_cache(B, TV), []
    for i in range(TV):
        step = {"self_attention_cache": cache, "self_attention_cache_update_index": i}
        y, cache = block(x[:, i : i + 1], decoder_padding_mask=mask[:, i : i + 1], **step)
        steps.append(np_(y))
    real = mask[..., None].repeat(8, -1)
    np.testing.assert_allclose(np.concatenate(steps, 1)[real], full[real], atol=3e-5)
    # The bias changes the output (it reached the attention), and the config keeps it.
    plain = keras_attn.TransformerDecoderBlock(16, H)
    plain.build((B, TV, 8))
    plain.set_weights(block.get_weights()[: len(plain.get_weights())] if bias == "alibi"
                      else [w for w in block.get_weights() if w.shape != (8, H)])  # fmt: skip
    assert not np.allclose(np_(plain(x, decoder_padding_mask=mask))[real], full[real], atol=1e-3)
    clone = keras_attn.TransformerDecoderBlock.from_config(block.get_config())
    assert type(clone.position_bias) is type(position_bias) and clone.sliding_window == 3


def test_encoder_block_with_a_bias_agrees_on_every_kernel():
    rng = np.random.default_rng(15)
    x = rng.normal(size=(B, TV, 8)).astype("float32")
    mask = np.ones((B, TV), bool)
    mask[1, -3:] = False
    outs, weights = {}, None
    for implementation in ("dense", "fused", "chunked"):
        block = keras_attn.TransformerEncoderBlock(16, H, implementation=implementation,
                                                   position_bias=keras_attn.AlibiBias(),
                                                   sliding_window=4)  # fmt: skip
        block.build((B, TV, 8))
        if weights is None:
            weights = block.get_weights()
        block.set_weights(weights)
        outs[implementation] = np_(block(x, padding_mask=mask))
    for implementation, out in outs.items():
        np.testing.assert_allclose(
            out[mask], outs["dense"][mask], atol=2e-5, err_msg=implementation
        )
