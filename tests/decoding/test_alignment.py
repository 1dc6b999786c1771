"""Seq2seq alignments: the decoding steps' cross-attention weights equal a teacher-forced pass."""

import keras
import numpy as np
import pytest

from keras_attn.models import greedy_decode, rnn_seq2seq, transformer_seq2seq
from keras_attn.models.decoding import decoding_steps
from layer_checks import compiled

START, VOCAB, STEPS = 1, 20, 5
# Right-padded sources of three lengths (0 = padding), one with no padding.
SOURCE = np.array([[5, 7, 9, 11, 4, 6], [8, 3, 0, 0, 0, 0], [12, 13, 14, 15, 0, 0]], "int32")
BUILDERS = {
    "transformer": lambda: transformer_seq2seq(
        VOCAB, VOCAB, num_layers=2, num_heads=2, d_model=16, intermediate_dim=16
    ),
    "rnn": lambda: rnn_seq2seq(VOCAB, VOCAB, 8, 16, score="additive"),
}


@pytest.fixture(scope="module", params=list(BUILDERS))
def model(request):
    keras.utils.set_random_seed(5)
    return BUILDERS[request.param]()


def stepped(model, source, steps):
    """Greedy tokens `(B, steps)` and the steps' alignments `(B, steps, S)`, one step a time."""
    decoder = decoding_steps(model)
    state = decoder.start(source, steps)
    tokens = np.full(len(source), START, "int32")
    outputs, alignments = [], []
    for index in range(steps):
        logits, state, alignment = decoder.step(tokens, index, state, return_alignment=True)
        tokens = (keras.ops.convert_to_numpy(logits)[:, 1:].argmax(-1) + 1).astype("int32")
        outputs.append(tokens)
        alignments.append(keras.ops.convert_to_numpy(alignment))
        assert keras.backend.standardize_dtype(alignment.dtype) == "float32"
        assert tuple(alignment.shape) == source.shape
    return np.stack(outputs, 1), np.stack(alignments, 1)


def teacher_forced_alignment(model, source, tokens):
    """`(B, T, S)`: the last decoder block's cross-attention weights averaged over the heads
    (the RNN's attention weights) for the decoder inputs `START, tokens[:-1]`, in one pass."""
    decoder_inputs = np.concatenate([np.full((len(source), 1), START), tokens[:, :-1]], 1)
    decoder_inputs = decoder_inputs.astype("int32")
    names = {layer.name for layer in model.layers}
    if "decoder_block_0" not in names:  # the RNN: the same layers, built to output the weights
        config = {"embedding_dim": 8, "units": 16, "score": "additive"}
        twin = rnn_seq2seq(VOCAB, VOCAB, **config, return_attention=True)
        twin.set_weights(model.get_weights())
        inputs = {"encoder_inputs": source, "decoder_inputs": decoder_inputs}
        return keras.ops.convert_to_numpy(twin(inputs)["attention"])
    blocks = sorted(n for n in names if n.startswith("encoder_block_"))
    encoder = keras.Model(
        model.get_layer("encoder_inputs").output, model.get_layer(blocks[-1]).output
    )
    encoded = encoder(source)  # (B, S, d)
    x = model.get_layer("decoder_embedding")(decoder_inputs)  # (B, T, d)
    masks = {"decoder_padding_mask": decoder_inputs != 0, "encoder_padding_mask": source != 0}
    for i in range(len(blocks) - 1):
        x = model.get_layer(f"decoder_block_{i}")(x, encoded, **masks)
    last = model.get_layer(f"decoder_block_{len(blocks) - 1}")
    _, _, cross = last(x, encoded, **masks, return_attention_scores=True)  # (B, h, T, S)
    return keras.ops.convert_to_numpy(keras.ops.mean(cross, axis=1))


def test_step_alignment_equals_the_teacher_forced_weights(model):
    tokens, alignment = stepped(model, SOURCE, STEPS)
    expected = teacher_forced_alignment(model, SOURCE, tokens)
    np.testing.assert_allclose(alignment, expected, atol=1e-5, rtol=1e-5)
    # A distribution over the real source tokens: exactly 0 on padding.
    padding = np.broadcast_to((SOURCE == 0)[:, None], alignment.shape)
    assert np.all(alignment[padding] == 0.0)
    np.testing.assert_allclose(alignment.sum(-1), 1.0, atol=1e-5)


def test_step_without_alignment_returns_logits_and_state(model):
    decoder = decoding_steps(model)
    state = decoder.start(SOURCE, STEPS)
    tokens = np.full(len(SOURCE), START, "int32")
    logits, _ = decoder.step(tokens, 0, state)
    with_alignment, _, _ = decoder.step(tokens, 0, state, return_alignment=True)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(logits), keras.ops.convert_to_numpy(with_alignment), atol=1e-6
    )


def test_rnn_without_attention_has_no_alignment():
    keras.utils.set_random_seed(5)
    decoder = decoding_steps(rnn_seq2seq(VOCAB, VOCAB, 8, 16, score=None))
    state = decoder.start(SOURCE, STEPS)
    with pytest.raises(ValueError, match="return_alignment=True"):
        decoder.step(np.full(len(SOURCE), START, "int32"), 0, state, return_alignment=True)


def test_greedy_decode_returns_the_alignment_of_its_tokens(model):
    """From the compiled loop (XLA on TensorFlow and JAX), equal to the teacher-forced pass."""
    free = keras.ops.convert_to_numpy(greedy_decode(model, SOURCE, STEPS, START))
    end_id = int(free[0, 1])  # row 0 ends by its second token; the others where they meet it
    tokens, alignment = compiled(
        lambda source: greedy_decode(model, source, STEPS, START, end_id, return_alignment=True)
    )(SOURCE)
    tokens, alignment = keras.ops.convert_to_numpy(tokens), keras.ops.convert_to_numpy(alignment)
    assert alignment.dtype == "float32" and alignment.shape == (len(SOURCE), STEPS, SOURCE.shape[1])
    # Until its end a row's tokens are the free decode's, so the teacher-forced pass over
    # them gives its alignment; after its end (tokens 0) the alignment is 0.
    expected = teacher_forced_alignment(model, SOURCE, free)
    ends = [np.flatnonzero(row == end_id) for row in free]
    cuts = np.array([hits[0] + 1 if len(hits) else STEPS for hits in ends])  # (B,)
    decoded = np.arange(STEPS) < cuts[:, None]  # (B, T): up to and with the end token
    assert (
        cuts[0] <= 2 and np.all(tokens[decoded] == free[decoded]) and np.all(tokens[~decoded] == 0)
    )
    np.testing.assert_allclose(alignment[decoded], expected[decoded], atol=1e-5, rtol=1e-5)
    assert np.all(alignment[~decoded] == 0.0)
