"""transformer_classifier and transformer_seq2seq: the model checks (build, fit, save, reload)."""

import keras
import numpy as np
import pytest

from keras_attn.models import transformer_classifier, transformer_seq2seq
from model_checks import check_model, padded_tokens

START = 1
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


# The learning check of transformer_seq2seq with greedy (KV-cached) decoding is the main job's
# test, tests/zoo/test_main_job.py (slow): reversing 5-20 tokens to the README's figure, >= 99 %.
