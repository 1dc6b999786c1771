"""transformer_classifier, transformer_seq2seq and their cached decoding."""

import keras
import numpy as np
import pytest

from keras_attn.zoo import greedy_decode, transformer_classifier, transformer_seq2seq
from model_checks import check_model, padded_tokens

START, END = 1, 2
rng = np.random.default_rng(0)


def np_(x):
    return keras.ops.convert_to_numpy(x)


@pytest.mark.parametrize(
    "pooling,position,normalize_first",
    [("mean", "sinusoidal", False), ("attention", "learned", True)],
)
def test_transformer_classifier_model_checks(pooling, position, normalize_first, tmp_path):
    model = transformer_classifier(
        vocab_size=20, sequence_length=9, num_classes=3, num_layers=2, num_heads=2,
        d_model=16, intermediate_dim=32, pooling=pooling, position=position,
        normalize_first=normalize_first,
    )  # fmt: skip
    x = padded_tokens(rng, 16, 9, 20)
    y = rng.integers(0, 3, size=16)
    check_model(
        model, x, y, tmp_path=tmp_path,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )  # fmt: skip
    # Padding is never seen: an example scores as its unpadded self.
    for row in x[:3]:
        np.testing.assert_allclose(
            np_(model(row[None])), np_(model(row[row != 0][None])), atol=1e-5
        )


def test_transformer_classifier_bad_pooling():
    with pytest.raises(ValueError, match="`pooling` must be one of"):
        transformer_classifier(10, 5, 2, pooling="max")


def seq2seq_data(batch, length, vocab):
    source = padded_tokens(rng, batch, length, vocab)
    target = np.where(source != 0, source[:, ::-1], 0)  # placeholder content, any tokens
    decoder_inputs = np.concatenate([np.full((batch, 1), START, "int32"), target[:, :-1]], 1)
    return {"encoder_inputs": source, "decoder_inputs": decoder_inputs}, target


# Post-norm in the quick run; pre-norm in the slow one (the classifier checks both quickly).
@pytest.mark.parametrize("normalize_first", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_transformer_seq2seq_model_checks(normalize_first, tmp_path):
    model = transformer_seq2seq(
        14,
        12,
        num_layers=2,
        num_heads=2,
        d_model=16,
        intermediate_dim=32,
        normalize_first=normalize_first,
    )
    x, y = seq2seq_data(16, 7, 12)
    check_model(
        model, x, y, tmp_path=tmp_path,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )  # fmt: skip


def reverse_data(n, length, vocab, seed):
    data_rng = np.random.default_rng(seed)
    source = data_rng.integers(3, vocab, size=(n, length)).astype("int32")
    target = np.concatenate([source[:, ::-1], np.full((n, 1), END, "int32")], 1)
    decoder_inputs = np.concatenate([np.full((n, 1), START, "int32"), target[:, :-1]], 1)
    return {"encoder_inputs": source, "decoder_inputs": decoder_inputs}, target


@pytest.mark.slow
def test_transformer_seq2seq_learns_to_reverse_length_10():
    keras.utils.set_random_seed(0)
    vocab, length = 14, 10
    x, y = reverse_data(20000, length, vocab, seed=0)
    model = transformer_seq2seq(
        vocab, vocab, num_layers=2, num_heads=4, d_model=64, intermediate_dim=128, dropout=0.0
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x, y, epochs=6, batch_size=64, verbose=0)
    test_x, test_y = reverse_data(500, length, vocab, seed=1)
    decoded = np_(greedy_decode(model, test_x["encoder_inputs"], length + 1, START, END))
    exact = np.all(decoded == test_y, axis=1).mean()
    assert exact >= 0.95, exact
