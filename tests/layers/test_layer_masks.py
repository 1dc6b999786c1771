"""Masks through the attention layers: the explicit query mask is the output mask, list,
ragged, integer and float masks, NumPy scalars; a NaN at a masked key is in no gradient;
mixed float16 with huge padding on the default path equals the weights path."""

import threading

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


# -- the output mask belongs to the call, not to the layer --------------------------------------

Q_PAD = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
# Each layer built for `x (2, 5, 8)`, and a call with its explicit output mask.
OUTPUT_MASK_LAYERS = {
    "ScaledDotAttention": (
        keras_attn.ScaledDotAttention,
        lambda layer, x, m: layer(x, x, query_mask=m),
    ),
    "MultiHeadAttention": (
        lambda: keras_attn.MultiHeadAttention(num_heads=2, key_dim=4),
        lambda layer, x, m: layer(x, x, query_mask=m),
    ),
    "TransformerEncoder": (
        lambda: keras_attn.TransformerEncoder(16, 2),
        lambda layer, x, m: layer(x, padding_mask=m),
    ),
    "TransformerDecoder": (
        lambda: keras_attn.TransformerDecoder(16, 2),
        lambda layer, x, m: layer(x, x, decoder_padding_mask=m),
    ),
}


def _written_by_a_first_call(layer, call):
    """Names of the attributes a first call of a built layer adds or replaces."""
    before = dict(vars(layer))
    output = call()
    after = dict(vars(layer))
    missing = object()
    names = {k for k in before.keys() | after.keys() if before.get(k, missing) is not after.get(k)}
    return names, output


@pytest.mark.parametrize("name", sorted(OUTPUT_MASK_LAYERS))
def test_a_call_stores_nothing_on_the_layer_and_its_output_carries_the_query_mask(name):
    """A mask kept on the layer between `call` and `compute_mask` is shared by two threads."""
    make, run = OUTPUT_MASK_LAYERS[name]
    x = t(rng.normal(size=(2, 5, 8)).astype("float32"))
    dense = keras.layers.Dense(3)
    dense.build(x.shape)
    keras_own, _ = _written_by_a_first_call(dense, lambda: dense(x))  # Keras' `_called`
    layer = make()
    if name.startswith("Transformer"):
        layer.build(*[x.shape] * (2 if "Decoder" in name else 1))
    else:
        layer.build(x.shape, x.shape)
    written, out = _written_by_a_first_call(layer, lambda: run(layer, x, t(Q_PAD)))
    assert written <= keras_own, f"the call wrote {sorted(written - keras_own)} on the layer"
    np.testing.assert_array_equal(np_(out._keras_mask), Q_PAD)


@pytest.mark.parametrize("name", sorted(OUTPUT_MASK_LAYERS))
def test_compute_mask_alone_returns_the_explicit_mask_else_the_implicit_one(name):
    make, _ = OUTPUT_MASK_LAYERS[name]
    argument = {"TransformerEncoder": "padding_mask", "TransformerDecoder": "decoder_padding_mask"}
    argument = argument.get(name, "query_mask")
    layer = make()
    x = t(np.zeros((2, 5, 8), "float32"))
    implicit = t(np.array([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], bool))
    assert layer.compute_mask(x) is None
    # How Keras' `Layer.__call__` calls it: the first input and its implicit mask.
    np.testing.assert_array_equal(np_(layer.compute_mask(x, implicit)), np_(implicit))
    np.testing.assert_array_equal(np_(layer.compute_mask(x, **{argument: t(Q_PAD)})), Q_PAD)
    explicit_wins = layer.compute_mask(x, implicit, **{argument: t(Q_PAD.astype("int32"))})
    assert keras.backend.standardize_dtype(explicit_wins.dtype) == "bool"
    np.testing.assert_array_equal(np_(explicit_wins), Q_PAD)


def test_two_threads_calling_one_layer_each_get_their_own_output_mask():
    barrier = threading.Barrier(2, timeout=60)

    class Meeting(keras_attn.ScaledDotAttention):
        def combine(self, output, weights):
            barrier.wait()  # both calls are inside `call`, past their masks, at once
            return output

    layer, pool = Meeting(), keras_attn.AttentionPooling(4)
    inputs = [
        (rng.normal(size=(2, 5, 8)).astype("float32"), Q_PAD),
        (rng.normal(size=(3, 4, 8)).astype("float32"), np.eye(3, 4, dtype=bool) | PAD[1, :4]),
    ]
    layer.build((None, None, 8), (None, None, 8))
    pool.build((None, None, 8))
    results, errors = [None, None], []

    def run(i):
        x, mask = t(inputs[i][0]), t(inputs[i][1])
        try:
            out = layer(x, x, query_mask=mask)
            results[i] = (out, np_(pool(out)), np_(pool(out, mask=mask)))
        except Exception as error:  # noqa: BLE001 (reported below, with the other thread's)
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    for (_, mask), (out, pooled, expected) in zip(inputs, results, strict=True):
        np.testing.assert_array_equal(np_(out._keras_mask), mask)
        np.testing.assert_allclose(pooled, expected, atol=1e-6)


@pytest.mark.parametrize("name", sorted(OUTPUT_MASK_LAYERS))
def test_in_a_functional_model_the_explicit_output_mask_reaches_the_pooling(name):
    make, run = OUTPUT_MASK_LAYERS[name]
    ids = np.array([[3, 4, 5, 6, 7], [3, 4, 5, 6, 0]], "int32")  # an implicit mask...
    keep = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], bool)  # ...that the explicit one beats
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    layer, pool = make(), keras_attn.AttentionPooling(4)
    tokens, mask = keras.Input((5,), dtype="int32"), keras.Input((5,), dtype="bool")
    model = keras.Model([tokens, mask], pool(run(layer, embedding(tokens), mask)))
    out = run(layer, embedding(t(ids)), t(keep))
    np.testing.assert_allclose(
        np_(model([t(ids), t(keep)])), np_(pool(out, mask=t(keep))), atol=1e-5
    )


@pytest.mark.parametrize("block", [keras_attn.TransformerEncoder, keras_attn.TransformerDecoder])
def test_in_a_functional_model_a_block_passes_the_implicit_mask_through(block):
    ids = np.array([[3, 4, 5, 6, 7], [3, 4, 0, 0, 0]], "int32")
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    layer, pool = block(16, 2), keras_attn.AttentionPooling(4)
    tokens = keras.Input((5,), dtype="int32")
    x = embedding(tokens)
    model = keras.Model(
        tokens, pool(layer(x, x) if block is keras_attn.TransformerDecoder else layer(x))
    )
    e = embedding(t(ids))
    out = layer(e, e) if block is keras_attn.TransformerDecoder else layer(e)
    np.testing.assert_allclose(np_(model(t(ids))), np_(pool(out, mask=t(ids != 0))), atol=1e-5)


@pytest.mark.parametrize("make", [
    keras_attn.ScaledDotAttention, lambda: keras_attn.MultiHeadAttention(num_heads=2, key_dim=4),
])  # fmt: skip
def test_a_rank_2_query_has_its_mask_of_shape_batch_as_output_mask(make):
    query, value = t(np.ones((3, 8), "float32")), t(np.ones((3, 4, 8), "float32"))
    keep = np.array([True, False, True])
    out = make()(query, value, query_mask=t(keep))
    np.testing.assert_array_equal(np_(out._keras_mask), keep)
    symbolic = make()(
        keras.Input((8,)), keras.Input((4, 8)), query_mask=keras.Input((), dtype="bool")
    )
    assert tuple(symbolic._keras_mask.shape) == (None,)
