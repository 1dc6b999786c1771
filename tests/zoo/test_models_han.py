"""hierarchical_attention_network: model checks, masks at both levels, attention outputs."""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import AttentionPooling
from keras_attn.models import hierarchical_attention_network
from keras_attn.models.layers import FoldIntoBatch, MeanPooling, PaddingMask, UnfoldFromBatch
from layer_checks import check_layer
from model_checks import check_model

VOCAB, S, W = 30, 3, 6


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _han(**kwargs):
    return hierarchical_attention_network(
        vocab_size=VOCAB,
        embedding_dim=8,
        word_units=4,
        sentence_units=4,
        num_classes=3,
        max_sentences=S,
        max_words=W,
        **kwargs,
    )


def _documents(rng, n=6):
    """Right-padded words; document 0 has a fully padded middle sentence, document 1 is empty."""
    docs = rng.integers(1, VOCAB, (n, S, W)).astype("int32")
    lengths = rng.integers(1, W + 1, (n, S))
    docs[np.arange(W) >= lengths[..., None]] = 0
    docs[0, 1] = 0
    docs[2:, -1] = 0  # trailing padded sentences
    docs[1] = 0
    return docs


# ---------------------------------------------------------------------------
# The shared checks
# ---------------------------------------------------------------------------


def test_han_model_checks(tmp_path):
    rng = np.random.default_rng(0)
    docs = _documents(rng)
    check_model(
        _han(dropout=0.1),
        docs,
        rng.integers(0, 3, len(docs)),
        tmp_path=tmp_path,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


@pytest.mark.parametrize(
    "make_layer, inputs",
    [
        (FoldIntoBatch, {"inputs": np.arange(24, dtype="float32").reshape(2, 3, 4)}),
        (functools.partial(UnfoldFromBatch, 3), {"inputs": np.ones((6, 4), "float32")}),
        (PaddingMask, {"tokens": np.array([[[3, 0], [0, 0]], [[0, 0], [0, 1]]], "int32")}),
    ],
)
def test_glue_layer_checks(tmp_path, make_layer, inputs):
    check_layer(make_layer, inputs, tmp_path=tmp_path, expect_trainable=False, mixed_precision=())


def test_fold_and_unfold_carry_masks():
    mask = np.array([[[True, False], [False, False], [True, True]]] * 2)  # (B, S, W)
    folded = FoldIntoBatch().compute_mask(None, mask)
    np.testing.assert_array_equal(_np(folded), mask.reshape(6, 2))
    np.testing.assert_array_equal(_np(UnfoldFromBatch(3).compute_mask(None, folded)), mask)


# ---------------------------------------------------------------------------
# Masks at both levels
# ---------------------------------------------------------------------------


def test_padding_gets_zero_weight_and_no_nan():
    docs = _documents(np.random.default_rng(1))
    out = _han(return_attention=True)(docs)
    logits, words, sentences = (
        _np(out[k]) for k in ("logits", "word_attention", "sentence_attention")
    )
    assert np.all(np.isfinite(logits)) and np.all(np.isfinite(words))
    assert np.all(np.isfinite(sentences))

    assert np.all(words[docs == 0] == 0.0)  # padded words
    real_sentence = (docs != 0).any(-1)  # (B, S)
    np.testing.assert_allclose(words.sum(-1)[real_sentence], 1.0, atol=1e-5)
    assert np.all(sentences[~real_sentence] == 0.0)  # fully padded sentences
    assert sentences[0, 1] == 0.0 and np.all(sentences[1] == 0.0)
    non_empty = real_sentence.any(-1)
    np.testing.assert_allclose(sentences.sum(-1)[non_empty], 1.0, atol=1e-5)


def test_padding_content_changes_nothing():
    """A random padding embedding reaches neither level: the masks hide it."""
    docs = _documents(np.random.default_rng(2))
    model = _han()
    reference = _np(model(docs))
    table = model.get_layer("embedding").embeddings
    values = _np(table)
    values[0] = np.random.default_rng(3).normal(0, 3, values.shape[1])
    table.assign(values)
    np.testing.assert_allclose(_np(model(docs)), reference, atol=1e-5)


def test_empty_document_has_finite_gradients():
    docs = _documents(np.random.default_rng(4))
    model = _han()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        loss = loss_fn(np.array([2, 0]), model(docs[:2], training=True))  # docs[1] is empty
    grads = tape.gradient(loss, model.trainable_weights)
    assert np.isfinite(_np(loss))
    for weight, grad in zip(model.trainable_weights, grads, strict=True):
        assert grad is not None and np.all(np.isfinite(_np(grad))), weight.path


def test_attention_model_takes_trained_weights():
    docs = _documents(np.random.default_rng(5))
    trained, inspect = _han(), _han(return_attention=True)
    inspect.set_weights(trained.get_weights())
    np.testing.assert_allclose(_np(inspect(docs)["logits"]), _np(trained(docs)), atol=1e-6)


# ---------------------------------------------------------------------------
# The mean-pooling ablation
# ---------------------------------------------------------------------------


def test_mean_pooling_layer_checks(tmp_path):
    h = np.random.default_rng(3).normal(size=(3, 5, 4)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], bool)
    check_layer(
        MeanPooling,
        {"inputs": h},
        masks={"mask": mask},
        mask_covers={"mask": ["inputs"]},
        tmp_path=tmp_path,
        expect_trainable=False,
    )


def test_mean_pooling_is_the_mean_over_real_steps():
    h = np.random.default_rng(4).normal(size=(3, 5, 4)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], bool)
    pooled, weights = MeanPooling()(h, mask=mask, return_attention_scores=True)
    expected = [h[0, :3].mean(0), h[1].mean(0), np.zeros(4)]
    np.testing.assert_allclose(_np(pooled), expected, atol=1e-6)
    np.testing.assert_allclose(_np(weights), mask / np.maximum(mask.sum(1, keepdims=True), 1))


def test_han_mean_pooling_ablation():
    rng = np.random.default_rng(5)
    docs = _documents(rng)
    model = _han(pooling="mean", return_attention=True)
    assert not [layer for layer in model.layers if isinstance(layer, AttentionPooling)]
    out = model(docs)
    assert np.all(np.isfinite(_np(out["logits"])))
    words = _np(out["word_attention"])  # uniform over each sentence's real words
    real = docs != 0
    expected = real / np.maximum(real.sum(-1, keepdims=True), 1)
    np.testing.assert_allclose(words, expected, atol=1e-6)
    sentences = real.any(-1)
    np.testing.assert_allclose(
        _np(out["sentence_attention"]), sentences / np.maximum(sentences.sum(-1, keepdims=True), 1)
    )
    with pytest.raises(ValueError, match=r"`pooling` must be one of .*Received: pooling='max'"):
        _han(pooling="max")
