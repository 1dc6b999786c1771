"""Masks through the attention layers: the explicit query mask is the output mask, list,
ragged, integer and float masks, NumPy scalars; a NaN at a masked key is in no gradient;
mixed float16 with huge padding on the default path equals the weights path."""

import keras
import numpy as np
import pytest

import keras_attn

rng = np.random.default_rng(7)


def np_(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def t(x, dtype=None):
    return keras.ops.convert_to_tensor(x, dtype)


def test_mixed_float16_mha_default_path_equals_the_weights_path_with_huge_padding():
    keras.config.set_dtype_policy("mixed_float16")
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=8)
    x = np.abs(rng.normal(size=(2, 6, 16))).astype("float32")
    mask = np.array([[1] * 6, [1, 1, 1, 0, 0, 0]], bool)
    layer(t(x), t(x))
    # Positive projections: a real query (~40 per feature) against a padded key
    # (800 per feature) scores ~1e5, past float16's 65504; real scores stay ~1e3.
    layer.key_dense.kernel.assign(np.ones(layer.key_dense.kernel.shape, "float32"))
    layer.query_dense.kernel.assign(np.full(layer.query_dense.kernel.shape, 3.0, "float32"))
    x[1, 3:] = 50.0
    fast = np_(layer(t(x), t(x), query_mask=t(mask), value_mask=t(mask)))
    slow, _ = layer(
        t(x), t(x), query_mask=t(mask), value_mask=t(mask), return_attention_scores=True
    )
    assert np.all(np.isfinite(fast))
    # rtol: on torch the default path is the backend kernel, computed in float32 there (a mask
    # in float16), while the weights path rounds its weights to float16 (about 1e-2 apart).
    np.testing.assert_allclose(fast, np_(slow), atol=1e-2, rtol=1e-2)
    assert np.all(fast[1, 3:] == 0)


@pytest.mark.parametrize("make", [
    lambda: keras_attn.MultiHeadAttention(num_heads=2, key_dim=4),
    lambda: keras_attn.DotAttention(),
])  # fmt: skip
def test_an_explicit_query_mask_is_the_output_mask(make):
    x = t(rng.normal(size=(2, 5, 8)).astype("float32"))
    mask = t(np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool))
    layer, pool = make(), keras_attn.AttentionPooling(4)
    out = layer(x, x, query_mask=mask, value_mask=mask)
    np.testing.assert_allclose(np_(pool(out)), np_(pool(out, mask=mask)), atol=1e-6)
    block = keras_attn.TransformerEncoderBlock(16, 2)
    out = block(x, padding_mask=mask)
    np.testing.assert_allclose(np_(pool(out)), np_(pool(out, mask=mask)), atol=1e-6)


def test_list_and_ragged_masks_and_numpy_scalars():
    x = t(rng.normal(size=(2, 3, 8)).astype("float32"))
    layer = keras_attn.MultiHeadAttention(
        num_heads=np.int64(2), key_dim=np.int32(4), dropout=np.float32(0.0)
    )
    assert type(layer.num_heads) is int and layer.get_config()["num_heads"] == 2
    listed = layer(x, x, value_mask=[[True, True, False], [True, False, False]])
    arrayed = layer(x, x, value_mask=t(np.array([[1, 1, 0], [1, 0, 0]], bool)))
    np.testing.assert_allclose(np_(listed), np_(arrayed), atol=1e-6)
    with pytest.raises(TypeError, match="`value_mask` must be a dense boolean"):
        layer(x, x, value_mask=object())
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        ragged = tf.ragged.constant([[True, True], [True]])
        with pytest.raises(TypeError, match="`query_mask` must be a dense boolean"):
            layer(x, x, query_mask=ragged)
    assert keras_attn.TransformerEncoderBlock(np.int64(16), np.int64(2)).num_heads == 2


PAD = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool)
LAYERS_WITH_PADDING = {
    "DotAttention value_mask": (
        keras_attn.DotAttention,
        lambda layer, x, m: layer(x, x, value_mask=m),
    ),
    "MultiHeadAttention query_mask and value_mask": (
        lambda: keras_attn.MultiHeadAttention(num_heads=2, key_dim=4),
        lambda layer, x, m: layer(x, x, query_mask=m, value_mask=m),
    ),
    "AttentionPooling mask": (
        lambda: keras_attn.AttentionPooling(4),
        lambda layer, x, m: layer(x, mask=m),
    ),
    "TransformerEncoder padding_mask": (
        lambda: keras_attn.TransformerEncoder(16, 2),
        lambda layer, x, m: layer(x, padding_mask=m),
    ),
    "TransformerDecoder both padding masks": (
        lambda: keras_attn.TransformerDecoder(16, 2),
        lambda layer, x, m: layer(x, x, decoder_padding_mask=m, encoder_padding_mask=m),
    ),
}


@pytest.mark.parametrize("name", sorted(LAYERS_WITH_PADDING))
def test_float_padding_masks_of_0s_and_1s_equal_their_boolean_masks(name):
    make, run = LAYERS_WITH_PADDING[name]
    x = t(rng.normal(size=(2, 5, 8)).astype("float32"))
    layer = make()
    expected = np_(run(layer, x, t(PAD)))
    for dtype in ("float32", "float16"):
        np.testing.assert_allclose(np_(run(layer, x, t(PAD.astype(dtype)))), expected, atol=1e-6)
    name_in_error = "`mask`" if "Pooling" in name else "padding_mask`|`value_mask`|`query_mask`"
    with pytest.raises(ValueError, match=rf"({name_in_error}) must be a boolean mask"):
        run(layer, x, t(np.where(PAD, 0.0, -1e9).astype("float32")))  # an additive mask


def test_float_attention_masks_traced_are_read_above_one_half_blind_rows_give_zeros():
    from layer_checks import compiled

    x = rng.normal(size=(2, 4, 8)).astype("float32")
    keep = rng.random((2, 4, 4)) > 0.4
    keep[1, 2] = False  # a query that sees no key
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    expected, expected_w = map(np_, layer(x, x, attention_mask=keep, return_attention_scores=True))
    assert np.all(expected[1, 2] == 0) and np.all(expected_w[1, :, 2] == 0)
    step = compiled(lambda q, m: layer(q, q, attention_mask=m, return_attention_scores=True))
    out, w = map(np_, step(x, keep.astype("float32")))
    np.testing.assert_allclose(out, expected, atol=1e-5)
    np.testing.assert_allclose(w, expected_w, atol=1e-6)
    additive = np.where(keep, 0.0, -1e9).astype("float32")
    with pytest.raises(ValueError, match="`attention_mask` must be a boolean mask"):
        layer(x, x, attention_mask=additive)  # eager: the values are known, and refused
    if keras.backend.backend() != "torch":  # torch runs `compiled` eagerly: it raised above
        # Traced, the values are unknown: `mask > 0.5` hides every key, every row gives zeros.
        out, w = map(np_, step(x, additive))
        assert np.all(out == 0) and np.all(w == 0)


@pytest.mark.parametrize("make", [
    keras_attn.DotAttention, keras_attn.ScaledDotAttention, keras_attn.BilinearAttention,
    keras_attn.AdditiveAttention, lambda: keras_attn.KeyValueAttention(key_dim=4),
    lambda: keras_attn.HardAttention(), lambda: keras_attn.PointerAttention(4),
])  # fmt: skip
def test_a_nan_at_a_masked_key_is_in_no_gradient_of_the_score_layers(make):
    import layer_checks

    query = rng.normal(size=(2, 3, 6)).astype("float32")
    key = rng.normal(size=(2, 4, 6)).astype("float32")
    value = rng.normal(size=(2, 4, 6)).astype("float32")
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    key[~mask] = np.nan
    layer = make()
    layer(t(query), t(value), key=t(key))

    def fn(q, k, v):
        return layer(q, v, key=k, value_mask=t(mask))

    out, grads = layer_checks.value_and_grads(
        fn, (query, key, value), layer.trainable_weights, jit=False
    )
    assert np.all(np.isfinite(np_(out)))
    for g in grads:
        if g is not None:
            assert np.all(np.isfinite(np_(g)))
