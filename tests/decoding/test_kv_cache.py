"""The KV cache: stepwise decoding after a left-padded prefill equals the full pass (MHA
and the decoder block); a tensor cache index past the end is not clamped."""

import keras
import numpy as np
import pytest

import keras_attn
import layer_checks

rng = np.random.default_rng(7)


def np_(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def t(x, dtype=None):
    return keras.ops.convert_to_tensor(x, dtype)


def test_stepwise_decoding_after_a_left_padded_prefill_equals_the_full_pass():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    x = rng.normal(size=(2, 7, 8)).astype("float32")
    mask = np.array([[1] * 7, [0, 0, 1, 1, 1, 1, 1]], bool)  # left padding in the prompt
    full = np_(layer(t(x), t(x), query_mask=t(mask), value_mask=t(mask), use_causal_mask=True))
    cache = layer.empty_cache(2, 7)
    prefill, cache = layer(
        t(x[:, :4]), t(x[:, :4]), query_mask=t(mask[:, :4]), value_mask=t(mask[:, :4]),
        use_causal_mask=True, cache=cache, cache_update_index=0,
    )  # fmt: skip
    outputs = [np_(prefill)]
    for i in range(4, 7):
        out, cache = layer(
            t(x[:, i : i + 1]), t(x[:, i : i + 1]), use_causal_mask=True, cache=cache,
            cache_update_index=i,
        )  # fmt: skip
        outputs.append(np_(out))
    np.testing.assert_allclose(np.concatenate(outputs, 1), full, atol=1e-5)
    np.testing.assert_array_equal(np_(cache.valid), mask)


@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("traced", [False, True])
def test_padded_self_attention_steps_equal_the_full_pass(traced, window):
    """A cached self-attention call whose padding is the queries' (`query_mask` and
    `value_mask` one tensor: the rows that see a key are the real queries, with no pass
    over the cache's mask) equals the uncached pass and the general path (the same mask
    as two tensors), with NaN, inf and huge values at the padded positions; a padded
    query with nothing before it, padding inside a prefill and a padded step give zeros."""
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, sliding_window=window)
    x = rng.normal(size=(3, 7, 8)).astype("float32")
    mask = np.array([[1] * 7, [0, 0, 1, 1, 0, 1, 1], [1, 0, 1, 1, 1, 0, 1]], bool)
    x[~mask] = np.array([np.nan, np.inf, 1e30, -np.inf, np.nan])[:, None]  # 5 padded steps
    full = np_(layer(t(x), t(x), query_mask=t(mask), value_mask=t(mask), use_causal_mask=True))

    for same in (True, False):

        def call(x, mask, cache, index, same=same):
            value_mask = mask if same else keras.ops.logical_and(mask, True)  # another tensor
            return layer(x, x, query_mask=mask, value_mask=value_mask, use_causal_mask=True,
                         cache=cache, cache_update_index=index)  # fmt: skip

        if traced:  # XLA on TensorFlow, jax.jit on JAX; torch runs it eagerly
            call = layer_checks.compiled(call)
        out, cache = call(t(x[:, :4]), t(mask[:, :4]), layer.empty_cache(3, 7), t(0, "int32"))
        outputs = [np_(out)]
        for i in range(4, 7):  # steps at a tensor index, as a decoding loop gives them
            out, cache = call(t(x[:, i : i + 1]), t(mask[:, i : i + 1]), cache, t(i, "int32"))
            outputs.append(np_(out))
        stepped = np.concatenate(outputs, 1)
        np.testing.assert_allclose(stepped, full, atol=1e-5, err_msg=f"same mask: {same}")
        assert np.all(stepped[~mask] == 0)
        np.testing.assert_array_equal(np_(cache.valid), mask)


def test_decoder_block_stepwise_after_a_left_padded_prefill_equals_the_full_pass():
    block = keras_attn.TransformerDecoderBlock(16, 2)
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    enc = t(rng.normal(size=(2, 5, 8)).astype("float32"))
    mask = np.array([[1] * 6, [0, 0, 0, 1, 1, 1]], bool)
    full = np_(block(t(x), enc, decoder_padding_mask=t(mask)))
    cache = block.empty_cache(2, 6)
    out, cache, cross = block(
        t(x[:, :3]), enc, decoder_padding_mask=t(mask[:, :3]), self_attention_cache=cache,
        self_attention_cache_update_index=0,
    )  # fmt: skip
    outputs = [np_(out)]
    for i in range(3, 6):
        out, cache, cross = block(
            t(x[:, i : i + 1]), self_attention_cache=cache, self_attention_cache_update_index=i,
            cross_attention_cache=cross,
        )  # fmt: skip
        outputs.append(np_(out))
    stepped = np.concatenate(outputs, 1)
    np.testing.assert_allclose(stepped[mask], full[mask], atol=1e-5)  # the real tokens


def test_a_tensor_cache_index_past_the_end_is_not_clamped():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    x = t(rng.normal(size=(2, 1, 8)).astype("float32"))
    layer(x, x)
    cache = layer.empty_cache(2, 4)
    with pytest.raises(ValueError, match="cache_update_index"):
        layer(x, x, cache=cache, cache_update_index=4)
    index = t(4, "int32")
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        step = tf.function(lambda x, c, i: layer(x, x, cache=c, cache_update_index=i))
        with pytest.raises(tf.errors.InvalidArgumentError, match="cache_update_index"):
            step(x, cache, index)
    elif keras.backend.backend() == "torch":  # eager: the index is read and checked
        with pytest.raises(ValueError, match="cache_update_index"):
            layer(x, x, cache=cache, cache_update_index=index)
    else:  # no error can be raised under jit: the step's output is NaN
        out, _ = layer(x, x, cache=cache, cache_update_index=index)
        assert np.all(np.isnan(np_(out)))
    out, _ = layer(x, x, cache=cache, cache_update_index=t(3, "int32"))  # the last position fits
    assert np.all(np.isfinite(np_(out)))


def test_a_causal_mask_on_a_cross_attention_cache_raises():
    mha = keras_attn.MultiHeadAttention(2, 4)
    source = t(rng.normal(size=(2, 5, 8)).astype("float32"))
    query = t(rng.normal(size=(2, 1, 8)).astype("float32"))
    mha(query, source)
    cache = mha.compute_cache(source)
    mha(query, cache=cache)  # no causal mask: fine
    with pytest.raises(ValueError, match="use_causal_mask=True with a cross-attention cache"):
        mha(query, cache=cache, use_causal_mask=True)


def test_a_stacked_cache_round_trips_through_kv_cache():
    stacked = rng.normal(size=(2, 2, 5, 3, 4)).astype("float32")  # keras-hub's (B, 2, S, g, d)
    valid = np.array([[1, 1, 0, 0, 0], [1, 0, 1, 0, 1]], bool)
    cache = keras_attn.KVCache.from_stacked(t(stacked), t(valid))
    np.testing.assert_array_equal(np_(cache.key), stacked[:, 0].transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(np_(cache.value), stacked[:, 1].transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(np_(cache.valid), valid)
    np.testing.assert_array_equal(np_(cache.to_stacked()), stacked)
    everywhere = keras_attn.KVCache.from_stacked(t(stacked))  # no `valid`: every position
    np.testing.assert_array_equal(np_(everywhere.valid), np.ones((2, 5), bool))


def test_keras_hubs_cache_is_valid_before_the_update_index():
    from keras_attn.cache import written_before

    stacked = t(np.zeros((2, 2, 5, 3, 4), "float32"))
    expected = np.array([[1, 1, 1, 0, 0]] * 2, bool)
    np.testing.assert_array_equal(np_(written_before(stacked, 3)), expected)  # a constant
    np.testing.assert_array_equal(np_(written_before(stacked, t(3, "int32"))), expected)


@pytest.mark.parametrize("shape", [(2, 5, 3, 4), (2, 3, 5, 3, 4)])
def test_a_stacked_cache_of_a_bad_shape_raises_naming_the_argument(shape):
    stacked = t(np.zeros(shape, "float32"))
    with pytest.raises(ValueError, match="self_attention_cache"):
        keras_attn.KVCache.from_stacked(stacked, name="self_attention_cache")
    with pytest.raises(ValueError, match=r"`cache`"):  # by default, `cache`
        keras_attn.KVCache.from_stacked(stacked)
