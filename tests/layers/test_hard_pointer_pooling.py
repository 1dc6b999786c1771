"""HardAttention, PointerAttention and AttentionPooling: checks, references, training."""

import functools

import keras
import numpy as np
import pytest

from keras_attn import ops
from keras_attn.hard_attention import HardAttention
from keras_attn.models.training import build_for_fit
from keras_attn.pointer_attention import PointerAttention
from keras_attn.pooling import AttentionPooling
from keras_attn.scores import BilinearScore
from layer_checks import check_layer, value_and_grads

B, TQ, TV, D = 3, 4, 5, 8


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _masks(rng):
    query_mask = np.ones((B, TQ), bool)
    query_mask[1, -1] = False
    value_mask = np.ones((B, TV), bool)
    value_mask[0, -2:] = False
    value_mask[2, :] = False  # example 2 sees no key at all
    return query_mask, value_mask


def _attention_inputs(seed=0):
    rng = np.random.default_rng(seed)
    query = rng.normal(size=(B, TQ, D)).astype("float32")
    value = rng.normal(size=(B, TV, D)).astype("float32")
    return rng, query, value


def _np_softmax(scores, mask):
    scores = np.where(mask, scores, -np.inf)
    scores = scores - np.max(np.where(mask, scores, -1e30), axis=-1, keepdims=True)
    weights = np.where(mask, np.exp(scores), 0.0)
    total = weights.sum(-1, keepdims=True)
    return np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)


# ---------------------------------------------------------------------------
# The shared layer checks
# ---------------------------------------------------------------------------


def test_hard_attention_layer_checks(tmp_path):
    rng, query, value = _attention_inputs()
    query_mask, value_mask = _masks(rng)
    check_layer(
        HardAttention,
        {"query": query, "value": value},
        tmp_path=tmp_path,
        masks={"query_mask": query_mask, "value_mask": value_mask},
        mask_covers={"query_mask": ["query"], "value_mask": ["value"]},
        expect_trainable=False,  # the dot score has no weights
    )


def test_pointer_attention_layer_checks(tmp_path):
    rng, query, value = _attention_inputs()
    query_mask, value_mask = _masks(rng)
    pointers = np.array([[0, 2, 1, 3], [4, 3, 2, 1], [1, 0, 3, 2]])
    check_layer(
        functools.partial(PointerAttention, units=8),
        {"query": query, "value": value},
        tmp_path=tmp_path,
        masks={
            "query_mask": query_mask,
            "value_mask": value_mask,
            "attention_mask": _np(ops.chosen_positions_mask(pointers, TV)),
        },
        mask_covers={"query_mask": ["query"], "value_mask": ["value"]},
    )


def test_attention_pooling_layer_checks(tmp_path):
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(B, 6, D)).astype("float32")
    mask = np.ones((B, 6), bool)
    mask[0, 4:] = False
    mask[2, :] = False
    check_layer(
        functools.partial(AttentionPooling, units=8),
        {"inputs": inputs},
        tmp_path=tmp_path,
        masks={"mask": mask},
        mask_covers={"mask": ["inputs"]},
    )


# ---------------------------------------------------------------------------
# HardAttention
# ---------------------------------------------------------------------------


def test_hard_attention_inference_is_argmax_of_numpy_score():
    rng, query, value = _attention_inputs(1)
    query_mask, value_mask = _masks(rng)
    out, weights = HardAttention()(
        query,
        value,
        query_mask=query_mask,
        value_mask=value_mask,
        return_attention_scores=True,
    )
    scores = np.einsum("bqd,bkd->bqk", query, value)
    mask = query_mask[:, :, None] & value_mask[:, None, :]
    best = np.argmax(np.where(mask, scores, -np.inf), axis=-1)  # (B, Tq)
    expected = np.take_along_axis(value, best[..., None], axis=1)  # (B, Tq, D)
    expected = np.where(mask.any(-1, keepdims=True), expected, 0.0)
    np.testing.assert_allclose(_np(out), expected, atol=1e-5)
    expected_weights = np.eye(TV)[best] * mask.any(-1, keepdims=True)
    np.testing.assert_array_equal(_np(weights), expected_weights)


def test_hard_attention_training_is_one_hot_with_gradients():
    rng, query, value = _attention_inputs(2)
    query_mask, value_mask = _masks(rng)
    layer = HardAttention(temperature=0.5, seed=3)
    layer(query, value)  # built: its seed state exists before the gradient is taken

    def call(query):
        return layer(
            query,
            value,
            query_mask=query_mask,
            value_mask=value_mask,
            return_attention_scores=True,
            training=True,
        )

    cotangent = rng.normal(size=query.shape[:2] + value.shape[-1:]).astype("float32")
    (out, weights), (grad,) = value_and_grads(call, [query], cotangent=cotangent)
    grad, weights, out = _np(grad), _np(weights), _np(out)

    visible = query_mask[:, :, None] & value_mask[:, None, :]
    rows = visible.any(-1)
    assert set(np.unique(weights)) <= {0.0, 1.0}  # exactly one-hot forward
    np.testing.assert_array_equal(weights.sum(-1), rows.astype("float32"))
    assert np.all(weights[~visible] == 0.0)
    chosen = np.argmax(weights, -1)
    selected = np.take_along_axis(value, chosen[..., None], axis=1)
    np.testing.assert_array_equal(out[rows], selected[rows])
    np.testing.assert_array_equal(out[~rows], 0.0)  # no visible key: zeros
    assert np.all(np.isfinite(grad)) and np.abs(grad[rows]).sum() > 0
    np.testing.assert_array_equal(grad[~rows], 0.0)


def test_hard_attention_fully_masked_gradients_are_finite():
    query = np.ones((2, 3, 4), "float32")
    value = np.ones((2, 5, 4), "float32")
    value_mask = np.zeros((2, 5), bool)
    layer = HardAttention()
    layer(query, value)
    for training in (True, False):
        out, (grad,) = value_and_grads(
            lambda q, training=training: layer(q, value, value_mask=value_mask, training=training),
            [query],
            cotangent=np.ones((2, 3, 4), "float32"),
        )
        np.testing.assert_array_equal(_np(out), 0.0)
        assert grad is None or np.all(np.isfinite(_np(grad)))


def test_hard_attention_config_keeps_score_and_temperature():
    layer = HardAttention(score=BilinearScore(), temperature=0.3, seed=7)
    config = layer.get_config()
    assert config["temperature"] == 0.3 and config["seed"] == 7
    revived = HardAttention.from_config(config)
    assert isinstance(revived.score_layer, BilinearScore)
    assert revived.get_config() == config
    assert HardAttention(score="scaled_dot").get_config()["score"] == "scaled_dot"


def _selection_data(rng, n, classes=8, tv=6, dv=4):
    keys = np.stack([rng.permutation(classes)[:tv] for _ in range(n)])  # (n, Tv)
    answer = rng.integers(0, tv, size=n)
    query = np.eye(classes, dtype="float32")[keys[np.arange(n), answer]]
    key = np.eye(classes, dtype="float32")[keys]  # (n, Tv, classes)
    value = rng.normal(size=(n, tv, dv)).astype("float32")
    target = value[np.arange(n), answer]
    return {"query": query, "key": key, "value": value}, target, answer


def test_hard_attention_learns_a_selection_task():
    """Query: one-hot class id; the target is the value whose key has that class."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    train, train_target, _ = _selection_data(rng, 4096)
    test, _, test_answer = _selection_data(rng, 1024)

    inputs = {
        "query": keras.Input((8,), name="query"),
        "key": keras.Input((6, 8), name="key"),
        "value": keras.Input((6, 4), name="value"),
    }
    projected = keras.layers.Dense(8, use_bias=False)(inputs["query"])
    attention = HardAttention(score="dot", seed=0)
    selected, weights = attention(
        projected, inputs["value"], key=inputs["key"], return_attention_scores=True
    )
    model = keras.Model(inputs, selected)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    build_for_fit(model, (train, train_target))
    model.fit(train, train_target, epochs=3, batch_size=64, verbose=0)

    chosen = np.argmax(keras.Model(inputs, weights).predict(test, verbose=0), -1)
    accuracy = float(np.mean(chosen == test_answer))
    print(f"hard attention selection accuracy: {accuracy:.3f}")
    assert accuracy >= 0.9, accuracy  # chance is 1/6


# ---------------------------------------------------------------------------
# PointerAttention
# ---------------------------------------------------------------------------


def test_chosen_positions_mask_hand_computed():
    mask = _np(ops.chosen_positions_mask(np.array([[2, 0, 1]]), 4))
    expected = np.array(
        [
            [True, True, True, True],  # step 0: nothing chosen yet
            [True, True, False, True],  # step 1: 2 was chosen
            [False, True, False, True],  # step 2: 2 and 0 were chosen
        ]
    )
    np.testing.assert_array_equal(mask[0], expected)


def test_pointer_distribution_matches_numpy_and_masks():
    rng, query, value = _attention_inputs(3)
    query_mask, value_mask = _masks(rng)
    pointers = np.array([[0, 2, 1, 3], [4, 3, 2, 1], [1, 0, 3, 2]])
    chosen = _np(ops.chosen_positions_mask(pointers, TV))
    layer = PointerAttention(units=6)
    probs, again = layer(
        query,
        value,
        query_mask=query_mask,
        value_mask=value_mask,
        attention_mask=chosen,
        return_attention_scores=True,
    )
    probs = _np(probs)
    np.testing.assert_array_equal(probs, _np(again))

    score = layer.score_layer
    U, W, v = _np(score.query_kernel), _np(score.key_kernel), _np(score.score_vector)
    hidden = np.tanh((query @ U)[:, :, None, :] + (value @ W)[:, None, :, :])
    u = hidden @ v  # (B, Tq, Tv)
    visible = query_mask[:, :, None] & value_mask[:, None, :] & chosen
    np.testing.assert_allclose(probs, _np_softmax(u, visible), atol=1e-5)

    assert np.all(probs[~visible] == 0.0)  # padded and already chosen: exactly 0
    rows = visible.any(-1)
    np.testing.assert_allclose(probs.sum(-1)[rows], 1.0, atol=1e-6)
    np.testing.assert_array_equal(probs[~rows], 0.0)


def test_pointer_single_query_shape():
    layer = PointerAttention(units=4)
    probs = layer(np.ones((2, 3), "float32"), np.ones((2, 7, 5), "float32"))
    assert tuple(probs.shape) == (2, 7)
    assert layer.compute_output_shape((2, 3), (2, 7, 5)) == (2, 7)


def _sorting_data(rng, n, length):
    x = rng.uniform(size=(n, length, 1)).astype("float32")
    targets = np.argsort(x[..., 0], axis=-1)  # pointers, ascending order
    previous = np.take_along_axis(x[..., 0], targets, axis=1)[:, :-1]
    decoder_in = np.concatenate([-np.ones((n, 1)), previous], 1)[..., None]
    mask = _np(ops.chosen_positions_mask(targets, length))
    feed = {"encoder": x, "decoder": decoder_in.astype("float32"), "chosen": mask}
    return feed, targets


def test_pointer_attention_learns_to_sort():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    length = 5
    train, train_targets = _sorting_data(rng, 2048, length)
    test, test_targets = _sorting_data(rng, 512, length)

    encoder = keras.Input((length, 1), name="encoder")
    decoder = keras.Input((length, 1), name="decoder")
    chosen = keras.Input((length, length), dtype="bool", name="chosen")
    enc = keras.layers.Dense(16, activation="tanh")(encoder)
    dec = keras.layers.Dense(16, activation="tanh")(decoder)
    probs = PointerAttention(units=16)(dec, enc, attention_mask=chosen)
    model = keras.Model([encoder, decoder, chosen], probs)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
    build_for_fit(model, (train, train_targets))
    model.fit(train, train_targets, epochs=3, batch_size=64, verbose=0)

    predicted = np.argmax(model.predict(test, verbose=0), -1)
    accuracy = float(np.mean(predicted == test_targets))
    # Uniform over the not yet chosen positions.
    chance = float(np.mean([1.0 / (length - i) for i in range(length)]))
    print(f"pointer sorting accuracy: {accuracy:.3f} (chance {chance:.3f})")
    assert accuracy >= 0.9 > chance, (accuracy, chance)


# ---------------------------------------------------------------------------
# AttentionPooling
# ---------------------------------------------------------------------------


def test_attention_pooling_matches_numpy():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(B, 6, D)).astype("float32")
    mask = np.ones((B, 6), bool)
    mask[0, 3:] = False
    mask[1, 0] = False
    layer = AttentionPooling(units=5, bias_initializer="random_normal")
    pooled, weights = layer(x, mask=mask, return_attention_scores=True)
    W, b, u_w = _np(layer.kernel), _np(layer.bias), _np(layer.context)
    expected_weights = _np_softmax(np.tanh(x @ W + b) @ u_w, mask)  # (B, T)
    np.testing.assert_allclose(_np(weights), expected_weights, atol=1e-5)
    np.testing.assert_allclose(_np(pooled), np.einsum("bt,btd->bd", expected_weights, x), atol=1e-5)
    np.testing.assert_allclose(_np(weights).sum(-1), 1.0, atol=1e-6)
    assert np.all(_np(weights)[~mask] == 0.0)


def test_attention_pooling_all_masked_gives_zeros_and_finite_gradients():
    x = np.random.default_rng(5).normal(size=(2, 4, 3)).astype("float32")
    mask = np.array([[True, True, False, False], [False] * 4])
    layer = AttentionPooling(units=4)
    layer(x, mask=mask)
    (pooled, weights), grads = value_and_grads(
        lambda x: layer(x, mask=mask, return_attention_scores=True),
        [x],
        layer.trainable_weights,
        cotangent=np.random.default_rng(6).normal(size=(2, 3)).astype("float32"),
    )
    np.testing.assert_array_equal(_np(pooled)[1], 0.0)
    np.testing.assert_array_equal(_np(weights)[1], 0.0)
    for grad in grads:
        assert np.all(np.isfinite(_np(grad)))


def test_attention_pooling_takes_the_implicit_mask():
    tokens = np.array([[3, 5, 2, 0, 0], [7, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    inputs = keras.Input((5,), dtype="int32")
    embedding = keras.layers.Embedding(10, D, mask_zero=True)
    pooling = AttentionPooling(units=4)
    pooled = pooling(embedding(inputs))
    assert getattr(pooled, "_keras_mask", None) is None
    model = keras.Model(inputs, pooled)
    explicit = pooling(embedding(tokens), mask=tokens != 0)
    np.testing.assert_allclose(_np(model(tokens)), _np(explicit), atol=1e-6)
    np.testing.assert_array_equal(_np(explicit)[2], 0.0)
    assert pooling.compute_mask(embedding(tokens), tokens != 0) is None


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("units", [0, -3, 2.5, None])
def test_bad_units(units):
    with pytest.raises(ValueError, match=r"`units` must be a positive integer. Received: units="):
        PointerAttention(units=units)
    with pytest.raises(ValueError, match=r"`units` must be a positive integer. Received: units="):
        AttentionPooling(units=units)


@pytest.mark.parametrize("temperature", [0, -1.0, True, "hot"])
def test_bad_temperature(temperature):
    with pytest.raises(
        ValueError, match=r"`temperature` must be a positive number. Received: temperature="
    ):
        HardAttention(temperature=temperature)


def test_bad_ranks():
    with pytest.raises(ValueError, match=r"`value` must have rank 3. Received: value.shape"):
        HardAttention()(np.ones((2, 3, 4)), np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"`query` must have rank 2 or 3. Received: query.shape"):
        PointerAttention(units=3)(np.ones((2, 3, 4, 5)), np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match=r"`inputs` must have rank 3. Received: inputs.shape"):
        AttentionPooling(units=3)(np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"`mask` must have rank 2. Received: mask.shape"):
        AttentionPooling(units=3)(np.ones((2, 4, 3)), mask=np.ones((2, 4, 3), bool))
    with pytest.raises(ValueError, match=r"`score` must be one of"):
        HardAttention(score="cosine")
