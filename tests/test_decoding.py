"""Seq2seq decoding: cached steps equal the full model, beam search, in-graph export."""

import itertools
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from model_checks import padded_tokens
from models import beam_search, export_seq2seq, greedy_decode, rnn_seq2seq, transformer_seq2seq

START, END = 1, 2
rng = np.random.default_rng(0)


def np_(x):
    return keras.ops.convert_to_numpy(x)


BUILDERS = {
    "transformer": lambda vocab: transformer_seq2seq(
        vocab, vocab, num_layers=2, num_heads=2, d_model=16, intermediate_dim=32
    ),
    "transformer_pre_norm": lambda vocab: transformer_seq2seq(
        vocab,
        vocab,
        num_layers=2,
        num_heads=2,
        d_model=16,
        intermediate_dim=32,
        normalize_first=True,
    ),
    "rnn_additive_lstm": lambda vocab: rnn_seq2seq(vocab, vocab, 8, 16, score="additive"),
    "rnn_bilinear_gru": lambda vocab: rnn_seq2seq(vocab, vocab, 8, 16, "bilinear", cell="gru"),
    "rnn_no_attention": lambda vocab: rnn_seq2seq(vocab, vocab, 8, 16, score=None),
}


def small_seq2seq(kind="transformer", vocab=12):
    keras.utils.set_random_seed(3)
    return BUILDERS[kind](vocab)


def uncached_greedy(model, source, max_length):
    """Greedy decoding by re-running the whole teacher-forced model on each prefix."""
    decoder_inputs = np.full((len(source), 1), START, "int32")
    for t in range(max_length):
        logits = np_(model({"encoder_inputs": source, "decoder_inputs": decoder_inputs}))
        next_tokens = logits[:, t, 1:].argmax(-1) + 1  # padding (0) is never emitted
        decoder_inputs = np.concatenate([decoder_inputs, next_tokens[:, None]], 1)
    return decoder_inputs[:, 1:]


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_step_by_step_greedy_decoding_equals_the_full_model(kind):
    model = small_seq2seq(kind)
    source = padded_tokens(rng, 4, 8, 12)
    cached = np_(greedy_decode(model, source, max_length=6, start_id=START))
    np.testing.assert_array_equal(cached, uncached_greedy(model, source, 6))


def test_greedy_stops_at_the_end_token_and_pads():
    model = small_seq2seq()
    source = padded_tokens(rng, 4, 8, 12)
    free = np_(greedy_decode(model, source, max_length=6, start_id=START))
    end_id = int(free[0, 2])  # make the third token of example 0 the end token
    stopped = np_(greedy_decode(model, source, max_length=6, start_id=START, end_id=end_id))
    for row_free, row in zip(free, stopped, strict=True):
        hits = np.flatnonzero(row_free == end_id)
        cut = hits[0] + 1 if len(hits) else 6
        np.testing.assert_array_equal(row[:cut], row_free[:cut])
        assert np.all(row[cut:] == 0)


@pytest.mark.parametrize("kind", ["transformer", "rnn_additive_lstm"])
def test_beam_search_width_one_equals_greedy(kind):
    model = small_seq2seq(kind)
    source = padded_tokens(rng, 4, 8, 12)
    greedy = np_(greedy_decode(model, source, max_length=6, start_id=START, end_id=END))
    beam, _ = beam_search(model, source, 6, start_id=START, end_id=END, beam_width=1)
    np.testing.assert_array_equal(beam, greedy)


def exhaustive_best(model, source, max_length, vocab, alpha):
    """The best normalized score over every output sequence, scored by the full model."""
    best = np.full(len(source), -np.inf)
    for sequence in itertools.product(range(vocab), repeat=max_length):
        sequence = np.array(sequence, "int32")
        ends = np.flatnonzero(sequence == END)
        length = ends[0] + 1 if len(ends) else max_length
        if np.any(sequence[length:] != 0) or np.any(sequence[:length] == 0):
            continue  # after the end only padding; padding is never a real token
        decoder_inputs = np.concatenate([[START], sequence[:-1]])[None].repeat(len(source), 0)
        logits = np_(model({"encoder_inputs": source, "decoder_inputs": decoder_inputs}))
        # Decoders never emit padding: normalize over the real tokens 1..V-1.
        log_probs = logits - np.log(np.exp(logits[..., 1:]).sum(-1, keepdims=True))
        score = log_probs[:, np.arange(length), sequence[:length]].sum(-1)
        best = np.maximum(best, score / ((5.0 + length) / 6.0) ** alpha)
    return best


@pytest.mark.parametrize("kind,alpha", [("transformer", 0.0), ("rnn_additive_lstm", 1.0)])
def test_wide_beam_search_finds_the_exhaustive_optimum(kind, alpha):
    vocab, max_length = 4, 3
    model = small_seq2seq(kind, vocab=vocab)
    source = padded_tokens(rng, 3, 5, vocab)
    _, scores = beam_search(
        model, source, max_length, START, END, beam_width=vocab**max_length, length_penalty=alpha
    )
    np.testing.assert_allclose(scores, exhaustive_best(model, source, max_length, vocab, alpha),
                               atol=1e-4)  # fmt: skip


@pytest.mark.parametrize("kind", ["transformer", "rnn_additive_lstm"])
def test_export_decodes_in_the_graph(kind, tmp_path):
    model = small_seq2seq(kind)
    source = padded_tokens(rng, 3, 8, 12)
    path = os.path.join(str(tmp_path), "seq2seq")
    export_seq2seq(model, path, max_length=6, start_id=START, end_id=END)
    loaded = tf.saved_model.load(path)
    expected = np_(greedy_decode(model, source, 6, START, END))
    np.testing.assert_array_equal(loaded.greedy_decode(tf.constant(source)).numpy(), expected)
    x = {"encoder_inputs": source, "decoder_inputs": padded_tokens(rng, 3, 5, 12)}
    served = loaded.serve({k: tf.constant(v) for k, v in x.items()})
    np.testing.assert_allclose(served.numpy(), np_(model(x)), atol=1e-5)


def test_decoding_argument_errors():
    model = small_seq2seq()
    with pytest.raises(ValueError, match="`max_length` must be a positive integer"):
        greedy_decode(model, np.ones((1, 3), "int32"), 0, START)
    with pytest.raises(ValueError, match="`start_id` must be a positive token id"):
        greedy_decode(model, np.ones((1, 3), "int32"), 3, 0)
    with pytest.raises(ValueError, match="`beam_width`"):
        beam_search(model, np.ones((1, 3), "int32"), 3, START, END, beam_width=0)
    with pytest.raises(ValueError, match="No decoding steps"):
        greedy_decode(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), [[1]], 3, 1)
