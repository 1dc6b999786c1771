"""`keras_attn.testing` over every zoo builder: one cheap model per builder, each check."""

import keras
import numpy as np
import pytest

from keras_attn import models as zoo
from keras_attn import testing

# `.keras` everywhere; SavedModel (TensorFlow's format) on the TensorFlow backend.
SAVE_FORMATS = ("keras", "saved_model") if keras.backend.backend() == "tensorflow" else ("keras",)
# As in tests/kit/test_testing_kit.py: Keras warns on any softmax over a length-1 axis.
pytestmark = pytest.mark.filterwarnings("ignore:You are using a softmax over axis -1")


def _tokens(rng, batch, length, vocab, low=3):
    tokens = rng.integers(low, vocab, size=(batch, length)).astype("int32")
    for row, size in zip(tokens, [length, 1, length - 2, 2][:batch], strict=True):
        row[size:] = 0
    return tokens


def _seq2seq_inputs(rng):
    source = _tokens(rng, 4, 6, 15)
    target = _tokens(rng, 4, 5, 15, low=1)
    return {"encoder_inputs": source, "decoder_inputs": target}


def classifier_checks(rng, tmp_path):
    model = zoo.transformer_classifier(
        20, 12, 3, num_layers=1, num_heads=2, d_model=8, intermediate_dim=16,
        pooling="attention", position="learned", dropout=0.1,
    )  # fmt: skip
    tokens = _tokens(rng, 4, 8, 20)
    tokens[1] = 0  # an empty example
    inputs = {"tokens": tokens}
    testing.assert_padding_invariance(model, inputs, {"tokens": tokens != 0}, pad_value=0)
    testing.assert_padding_invariance(
        model, inputs, {"tokens": tokens != 0}, pad_value=0, jit_compile=True
    )
    testing.assert_batch_invariance(model, inputs)
    testing.assert_fully_masked_rows_safe(model, inputs, empty=1, zero_outputs=False)
    testing.assert_save_reload_equal(model, inputs, directory=tmp_path, formats=SAVE_FORMATS)


def seq2seq_checks(rng, tmp_path):
    model = zoo.transformer_seq2seq(15, 15, num_layers=1, num_heads=2, d_model=8,
                                       intermediate_dim=16)  # fmt: skip
    inputs = _seq2seq_inputs(rng)
    padding = {"encoder_inputs": inputs["encoder_inputs"] != 0}
    testing.assert_padding_invariance(model, inputs, padding, pad_value=0)
    testing.assert_causal_invariance(model, inputs, sequences=["decoder_inputs"])
    testing.assert_batch_invariance(model, inputs)
    testing.assert_save_reload_equal(model, inputs, directory=tmp_path, formats=("keras",))


def rnn_checks(rng, tmp_path):
    model = zoo.rnn_seq2seq(15, 15, embedding_dim=8, units=8, score="additive")
    inputs = _seq2seq_inputs(rng)
    padding = {"encoder_inputs": inputs["encoder_inputs"] != 0}
    testing.assert_padding_invariance(model, inputs, padding, pad_value=0)
    testing.assert_causal_invariance(model, inputs, sequences=["decoder_inputs"])
    testing.assert_batch_invariance(model, inputs)
    testing.assert_save_reload_equal(model, inputs, directory=tmp_path, formats=("keras",))


def pointer_checks(rng, tmp_path):
    model = zoo.pointer_network(input_dim=1, units=8, pad_value=-1.0)
    points = rng.uniform(size=(3, 5, 1)).astype("float32")
    points[1, 3:] = -1.0  # padding points
    pointers = np.argsort(np.where(points[..., 0] < 0, 9, points[..., 0]), -1).astype("int32")
    inputs = {"points": points, "pointers": pointers}
    testing.assert_padding_invariance(
        model, inputs, {"points": points[..., 0] >= 0}, pad_value=-1.0
    )
    testing.assert_causal_invariance(model, inputs, sequences=["pointers"])
    testing.assert_batch_invariance(model, inputs)
    testing.assert_save_reload_equal(model, inputs, directory=tmp_path, formats=("keras",))


def han_checks(rng, tmp_path):
    keras.config.set_dtype_policy("mixed_bfloat16")  # the zoo under a mixed policy
    model = zoo.hierarchical_attention_network(
        vocab_size=30, embedding_dim=8, word_units=4, sentence_units=4, num_classes=3,
        max_sentences=3, max_words=5,
    )  # fmt: skip
    docs = rng.integers(1, 30, size=(3, 3, 5)).astype("int32")
    docs[:, :, 3:] = 0
    docs[1] = 0  # an empty document
    inputs = {"tokens": docs}
    testing.assert_batch_invariance(model, inputs)
    testing.assert_fully_masked_rows_safe(model, inputs, empty=1, zero_outputs=False)
    testing.assert_save_reload_equal(model, inputs, directory=tmp_path, formats=("keras",))


ZOO = {
    "transformer_classifier": classifier_checks,
    "transformer_seq2seq": seq2seq_checks,
    "rnn_seq2seq": rnn_checks,
    "pointer_network": pointer_checks,
    "hierarchical_attention_network": han_checks,
}


@pytest.mark.parametrize("builder", sorted(ZOO))
def test_kit_on_every_zoo_builder(builder, tmp_path):
    ZOO[builder](np.random.default_rng(0), tmp_path)
