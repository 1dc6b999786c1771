"""Every zoo builder trains, reloads and decodes on the backend the run is on.

The same file runs on JAX and torch (`KERAS_BACKEND`; skipped on TensorFlow, where
the builders' own files run these checks): each builder of
`keras_attn.models`, tiny, goes through `model_checks.check_model` (a few full-batch
`fit` steps on padded synthetic data lower a finite loss; `.keras` reload with
`safe_mode=True` gives equal outputs), then the
decoding functions run on the trained model and are checked against the model itself.
The zoo is imported inside the tests, so that collection imports no backend code.
"""

import keras
import numpy as np
import pytest

from model_checks import check_model, padded_tokens

# Every builder on JAX and torch; on TensorFlow each builder's own file (test_models_*.py,
# test_transformer_lm.py) runs `check_model` and its decoders.
pytestmark = [pytest.mark.backends, pytest.mark.other_backends]

START = 1


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _sparse_loss(**kwargs):
    return keras.losses.SparseCategoricalCrossentropy(**kwargs)


def _seq2seq_batch(rng, n=8, source_length=7, target_length=6, vocab=12):
    """Right-padded sources and targets (0), the targets shifted right behind START."""
    source = padded_tokens(rng, n, source_length, vocab)
    target = padded_tokens(rng, n, target_length, vocab)
    decoder_inputs = np.concatenate([np.full((n, 1), START, "int32"), target[:, :-1]], 1)
    decoder_inputs[target == 0] = 0  # padded target steps are padded inputs too
    return {"encoder_inputs": source, "decoder_inputs": decoder_inputs}, target


def _transformer_classifier(rng):
    from keras_attn.models import transformer_classifier

    model = transformer_classifier(
        vocab_size=20, sequence_length=9, num_classes=3, num_layers=1, num_heads=2,
        d_model=16, intermediate_dim=32, pooling="attention",
    )  # fmt: skip
    x = padded_tokens(rng, 12, 9, 20)
    return model, x, rng.integers(0, 3, size=12), _sparse_loss(from_logits=True)


def _transformer_seq2seq(rng):
    from keras_attn.models import transformer_seq2seq

    model = transformer_seq2seq(12, 12, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32)
    return model, *_seq2seq_batch(rng), _sparse_loss(from_logits=True)


def _rnn_seq2seq(rng):
    from keras_attn.models import rnn_seq2seq

    model = rnn_seq2seq(12, 12, embedding_dim=8, units=16, score="additive")
    return model, *_seq2seq_batch(rng), _sparse_loss(from_logits=True)


def _pointer_network(rng):
    from keras_attn.models import pointer_network

    # Sorting five numbers, padded to seven points (-1.0) and to -1 after shorter targets.
    points = rng.uniform(size=(8, 5, 1)).astype("float32")
    pointers = np.argsort(points[..., 0], axis=-1).astype("int32")
    pointers[np.arange(5) >= rng.integers(1, 6, size=(8, 1))] = -1
    points = np.pad(points, ((0, 0), (0, 2), (0, 0)), constant_values=-1.0)
    model = pointer_network(input_dim=1, units=16, pad_value=-1.0)
    x = {"points": points, "pointers": pointers}
    return model, x, pointers, _sparse_loss(ignore_class=-1)


def _hierarchical_attention_network(rng):
    from keras_attn.models import hierarchical_attention_network

    docs = rng.integers(1, 30, (8, 3, 6)).astype("int32")
    docs[np.arange(6) >= rng.integers(1, 7, (8, 3))[..., None]] = 0  # padded words
    docs[0, 1] = 0  # a padded sentence
    model = hierarchical_attention_network(
        vocab_size=30, embedding_dim=8, word_units=4, sentence_units=4, num_classes=3,
        max_sentences=3, max_words=6,
    )  # fmt: skip
    return model, docs, rng.integers(0, 3, size=8), _sparse_loss(from_logits=True)


def _check_greedy_decode(model, x):
    """Teacher-forced on its own greedy output, the model's argmax (0 excluded) is that output."""
    from keras_attn.models import greedy_decode

    source = x["encoder_inputs"]
    tokens = _np(greedy_decode(model, source, max_length=5, start_id=START))  # (B, 5)
    assert tokens.shape == (len(source), 5) and tokens.dtype == np.int32
    decoder_inputs = np.concatenate([np.full((len(source), 1), START, "int32"), tokens[:, :-1]], 1)
    logits = _np(model({"encoder_inputs": source, "decoder_inputs": decoder_inputs}))
    np.testing.assert_array_equal(np.argmax(logits[..., 1:], -1) + 1, tokens)


def _check_pointer_decode(model, x):
    """A permutation whose each step is the likeliest position not chosen before."""
    from keras_attn.models import pointer_decode

    points = x["points"][:, :5]  # the five real points
    order = pointer_decode(model, points)  # (B, 5)
    assert order.shape == (len(points), 5)
    assert (np.sort(order, -1) == np.arange(5)).all()
    probs = _np(model({"points": points, "pointers": order}))  # (B, 5, 5); row t sees order[:, :t]
    chosen = np.zeros(probs.shape, bool)
    for t in range(1, 5):
        chosen[:, t] = chosen[:, t - 1]
        chosen[np.arange(len(points)), t, order[:, t - 1]] = True
    np.testing.assert_array_equal(np.argmax(np.where(chosen, -1.0, probs), -1), order)


# (builder, the decoding check of the trained model or None)
CASES = [
    (_transformer_classifier, None),
    (_transformer_seq2seq, _check_greedy_decode),
    (_rnn_seq2seq, _check_greedy_decode),
    (_pointer_network, _check_pointer_decode),
    (_hierarchical_attention_network, None),
]


@pytest.mark.parametrize("build, check_decoding", CASES, ids=[b.__name__[1:] for b, _ in CASES])
def test_builder_fits_reloads_and_decodes(build, check_decoding, tmp_path):
    model, x, y, loss = build(np.random.default_rng(0))
    check_model(model, x, y, tmp_path=tmp_path, loss=loss)
    if check_decoding is not None:
        check_decoding(model, x)
