"""The soft attention layers: shared checks, NumPy references, mask semantics."""

import functools

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.models.training import build_for_fit
from layer_checks import check_fully_masked_rows, check_layer
from numpy_reference import (
    additive_scores,
    attend,
    bilinear_scores,
    causal,
    dot_scores,
    scaled_dot_scores,
)

rng = np.random.default_rng(0)
Q = rng.normal(size=(2, 4, 6)).astype("float32")
V = rng.normal(size=(2, 5, 6)).astype("float32")
V_WIDE = rng.normal(size=(2, 5, 10)).astype("float32")
Q_MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
V_MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], bool)

# (layer factory, value array): one row per public soft attention layer.
LAYERS = {
    "dot": (keras_attn.DotAttention, V),
    "scaled_dot": (functools.partial(keras_attn.ScaledDotAttention, dropout=0.1), V),
    "additive": (functools.partial(keras_attn.AdditiveAttention, units=8), V_WIDE),
    "bilinear": (keras_attn.BilinearAttention, V_WIDE),
    "key_value": (functools.partial(keras_attn.KeyValueAttention, key_dim=4, output_dim=3), V_WIDE),
    "key_value_additive": (
        functools.partial(keras_attn.KeyValueAttention, key_dim=4, value_dim=7, score="additive"),
        V_WIDE,
    ),
    "score_bilinear": (functools.partial(keras_attn.ScoreAttention, score="bilinear"), V_WIDE),
    "score_instance": (
        lambda **kw: keras_attn.ScoreAttention(
            score=keras_attn.scores.AdditiveScore(units=3, use_bias=True), **kw
        ),
        V_WIDE,
    ),
}


def np_(x):
    return keras.ops.convert_to_numpy(x)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_checks_with_padding(name, tmp_path):
    make, value = LAYERS[name]
    check_layer(
        make,
        {"query": Q, "value": value},
        tmp_path=tmp_path,
        masks={"query_mask": Q_MASK, "value_mask": V_MASK},
        mask_covers={"query_mask": ["query"], "value_mask": ["value"]},
        call_kwargs={"return_attention_scores": True},
        expect_trainable=name not in ("dot", "scaled_dot"),
    )


@pytest.mark.parametrize("name", ["scaled_dot", "additive", "key_value"])
def test_layer_checks_causal_self_attention(name, tmp_path):
    make, _ = LAYERS[name]
    x = rng.normal(size=(2, 6, 6)).astype("float32")
    check_layer(
        make,
        {"query": x, "value": x},
        tmp_path=tmp_path,
        call_kwargs={"use_causal_mask": True},
        causal=True,
        expect_trainable=name != "scaled_dot",
        mixed_precision=(),
    )


def _numpy_scores(layer, q, k):
    """The score of each layer from its own weights, by the papers' formulas."""
    s = layer.score_layer
    if isinstance(s, keras_attn.scores.DotScore):
        return dot_scores(q, k)
    if isinstance(s, keras_attn.scores.ScaledDotScore):
        return scaled_dot_scores(q, k, s.scale)
    if isinstance(s, keras_attn.scores.AdditiveScore):
        bias = None if s.bias is None else np_(s.bias)
        return additive_scores(
            q, k, np_(s.query_kernel), np_(s.key_kernel), np_(s.score_vector), bias
        )
    return bilinear_scores(q, k, np_(s.kernel))


@pytest.mark.parametrize(
    "name", ["dot", "scaled_dot", "additive", "bilinear", "score_bilinear", "score_instance"]
)
def test_matches_numpy_reference(name):
    make, value = LAYERS[name]
    layer = make()
    attn_mask = rng.random((2, 4, 5)) > 0.3
    out, w = layer(
        Q,
        value,
        query_mask=Q_MASK,
        value_mask=V_MASK,
        attention_mask=attn_mask,
        return_attention_scores=True,
    )
    mask = Q_MASK[:, :, None] & V_MASK[:, None, :] & attn_mask
    ref_out, ref_w = attend(_numpy_scores(layer, Q, value), value, mask)
    np.testing.assert_allclose(np_(w), ref_w, atol=1e-5)
    np.testing.assert_allclose(np_(out), ref_out, atol=1e-5)


@pytest.mark.parametrize("score", ["dot", "scaled_dot", "additive", "bilinear"])
def test_key_value_attention_matches_numpy(score):
    layer = keras_attn.KeyValueAttention(key_dim=4, value_dim=3, score=score, output_dim=5)
    out, w = layer(Q, V_WIDE, value_mask=V_MASK, use_causal_mask=True, return_attention_scores=True)

    def dense(d, x):
        return x @ np_(d.kernel) + np_(d.bias)

    q, k, v = (
        dense(layer.query_dense, Q),
        dense(layer.key_dense, V_WIDE),
        dense(layer.value_dense, V_WIDE),
    )
    mask = V_MASK[:, None, :] & causal(4, 5)
    ref_ctx, ref_w = attend(_numpy_scores(layer, q, k), v, mask)
    np.testing.assert_allclose(np_(w), ref_w, atol=1e-5)
    np.testing.assert_allclose(np_(out), dense(layer.output_dense, ref_ctx), atol=1e-5)


def test_self_attention_formula():
    """softmax(X Wq (X Wk)^T / sqrt(dk)) X Wv, no biases."""
    x = rng.normal(size=(1, 5, 6)).astype("float32")
    layer = keras_attn.KeyValueAttention(key_dim=4, use_bias=False)
    out = np_(layer(x, x))
    wq, wk, wv = (np_(d.kernel) for d in (layer.query_dense, layer.key_dense, layer.value_dense))
    s = (x @ wq) @ (x @ wk).transpose(0, 2, 1) / 2.0
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (e / e.sum(-1, keepdims=True)) @ (x @ wv), atol=1e-5)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_rows_with_nothing_visible_are_zero(name):
    """Keras' own Attention averages the padding here; we return zeros."""
    make, value = LAYERS[name]
    layer = make()
    value_mask = V_MASK.copy()
    value_mask[1] = False  # example 1 has no visible key at all
    out, w = layer(Q, value, query_mask=Q_MASK, value_mask=value_mask, return_attention_scores=True)
    out, w = np_(out), np_(w)
    assert np.all(out[1] == 0) and np.all(w[1] == 0)
    assert np.all(out[0, 3] == 0) and np.all(w[0, 3] == 0)  # padded query row
    assert np.all(w[0, :3, 4] == 0)  # padded key
    np.testing.assert_allclose(w[0, :3].sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name", ["additive", "key_value"])
def test_fully_masked_rows_have_finite_gradients(name, policy, jit):
    make, value = LAYERS[name]
    value_mask = V_MASK.copy()
    value_mask[1] = False
    check_fully_masked_rows(
        make(dtype=policy),
        {"query": Q, "value": value},
        empty_example=1,
        jit=jit,
        query_mask=Q_MASK,
        value_mask=value_mask,
        use_causal_mask=True,
    )


def test_causal_mask_holds_with_dropout_in_training():
    """keras#23038: the causal mask was dropped when dropout > 0."""
    x = rng.normal(size=(2, 6, 6)).astype("float32")
    layer = keras_attn.ScaledDotAttention(dropout=0.5, seed=3)
    _, w = layer(x, x, use_causal_mask=True, return_attention_scores=True, training=True)
    w = np_(w)
    assert np.all(w[:, ~causal(6, 6)] == 0)
    assert np.any(w[:, causal(6, 6)] == 0)  # dropout acted


def test_single_query_rank_2():
    layer = keras_attn.AdditiveAttention(units=5)
    q2 = Q[:, 0]
    out, w = layer(q2, V, value_mask=V_MASK, return_attention_scores=True)
    assert out.shape == (2, 6) and w.shape == (2, 5)
    out3, w3 = layer(Q[:, :1], V, value_mask=V_MASK, return_attention_scores=True)
    np.testing.assert_allclose(np_(out), np_(out3)[:, 0], atol=1e-6)
    np.testing.assert_allclose(np_(w), np_(w3)[:, 0], atol=1e-6)
    chosen = np.array([[1, 0, 1, 1, 1], [1, 1, 1, 1, 1]], bool)
    _, w_masked = layer(q2, V, attention_mask=chosen, return_attention_scores=True)
    assert np_(w_masked)[0, 1] == 0


def test_output_mask_is_query_mask():
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10, 6, mask_zero=True)(tokens)
    y = keras_attn.DotAttention()(x, x)
    assert y._keras_mask is not None
    ids = np.array([[1, 2, 0], [3, 0, 0]], "int32")
    emb = keras.layers.Embedding(10, 6, mask_zero=True)
    e = emb(ids)
    out = keras_attn.BilinearAttention()(e, e)
    np.testing.assert_array_equal(np_(out._keras_mask), ids != 0)


def test_embedding_mask_zero_model_trains_and_round_trips(tmp_path):
    """Tokens with padding -> attention -> pooling -> classifier, fit, save, export."""
    ids = rng.integers(1, 20, size=(256, 8)).astype("int32")
    lengths = rng.integers(2, 9, size=256)
    ids[np.arange(8)[None, :] >= lengths[:, None]] = 0
    labels = (ids == 7).any(1).astype("int32")  # "does token 7 occur?"

    tokens = keras.Input((8,), dtype="int32")
    x = keras.layers.Embedding(20, 16, mask_zero=True)(tokens)
    x = keras_attn.KeyValueAttention(key_dim=16, output_dim=16)(x, x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    out = keras.layers.Dense(2, activation="softmax")(x)
    model = keras.Model(tokens, out)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    build_for_fit(model, (ids, labels))
    history = model.fit(ids, labels, epochs=15, batch_size=64, verbose=0)
    assert history.history["accuracy"][-1] > 0.9, history.history["accuracy"]

    path = tmp_path / "model.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        reloaded.predict(ids, verbose=0), model.predict(ids, verbose=0), atol=1e-6
    )
    if keras.backend.backend() != "tensorflow":
        return  # SavedModel export and serving: checked on the TensorFlow backend
    import tensorflow as tf

    model.export(str(tmp_path / "sm"), verbose=False)
    served = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_allclose(np_(served.serve(ids)), model.predict(ids, verbose=0), atol=1e-6)


@pytest.mark.parametrize(
    "make, args, error, match",
    [
        (keras_attn.DotAttention, (Q, V_WIDE), ValueError, r"`query` and `key`"),
        (
            keras_attn.DotAttention,
            (Q[0], V),
            ValueError,
            r"`query` and `value` must have the same batch size",
        ),
        (keras_attn.DotAttention, (Q, V[:, :, :, None]), ValueError, r"`value` must have rank 3"),
        (
            keras_attn.DotAttention,
            (Q, V, V[:, :3]),
            ValueError,
            r"`key` and `value` must have the same length",
        ),
    ],
)
def test_bad_shapes(make, args, error, match):
    with pytest.raises(error, match=match):
        make()(*args)


def test_bad_masks_and_arguments():
    layer = keras_attn.DotAttention()
    with pytest.raises(ValueError, match=r"`value_mask` and `value` must have the same length"):
        layer(Q, V, value_mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match=r"`attention_mask` must have rank 3"):
        layer(Q, V, attention_mask=np.ones((4, 5), bool))
    with pytest.raises(
        ValueError, match=r"`dropout` must be a number in \[0, 1\). Received: dropout=1.5"
    ):
        keras_attn.DotAttention(dropout=1.5)
    with pytest.raises(ValueError, match=r"`units` must be a positive integer.*units=0"):
        keras_attn.AdditiveAttention(units=0)
    with pytest.raises(ValueError, match=r"`key_dim` must be a positive integer.*key_dim=-2"):
        keras_attn.KeyValueAttention(key_dim=-2)
    with pytest.raises(ValueError, match=r"`score` must be one of .*Received: score='cosine'"):
        keras_attn.KeyValueAttention(key_dim=4, score="cosine")
    with pytest.raises(TypeError, match=r"`score` must be a string"):
        keras_attn.ScoreAttention(score=3)
