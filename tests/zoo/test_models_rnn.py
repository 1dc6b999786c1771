"""rnn_seq2seq: shared model checks, masks through encoder and decoder, training."""

import keras
import numpy as np
import pytest

from keras_attn.models import rnn_seq2seq
from keras_attn.models.training import build_for_fit
from model_checks import check_model

SCORES = ["additive", "dot", "scaled_dot", "bilinear", None]
VOCAB, PAD, BOS, EOS = 20, 0, 1, 2


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _batch(rng, n=6, source_length=7, target_length=6):
    """Right-padded source and teacher-forced target, with one example of each length."""
    source = rng.integers(3, VOCAB, (n, source_length)).astype("int32")
    target = rng.integers(3, VOCAB, (n, target_length)).astype("int32")
    for i in range(n):
        source[i, 1 + i % source_length :] = PAD
        target[i, 1 + i % target_length :] = PAD
    decoder_inputs = np.concatenate([np.full((n, 1), BOS, "int32"), target[:, :-1]], 1)
    decoder_inputs[target == PAD] = PAD  # one decoder input per target token
    return {"encoder_inputs": source, "decoder_inputs": decoder_inputs}, target


def _valid(x):
    return x["decoder_inputs"] != PAD  # (B, T): target steps that count


# ---------------------------------------------------------------------------
# The shared model checks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("score, cell", [("additive", "lstm"), ("bilinear", "gru"), (None, "lstm")])
def test_rnn_seq2seq_model_checks(tmp_path, score, cell):
    x, y = _batch(np.random.default_rng(0))
    model = rnn_seq2seq(VOCAB, VOCAB, embedding_dim=8, units=16, score=score, cell=cell)
    check_model(model, x, y, tmp_path=tmp_path, loss=_loss())


# ---------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("score", SCORES[:-1])
def test_padded_source_gets_zero_attention_weight(score):
    x, _ = _batch(np.random.default_rng(1))
    x["encoder_inputs"][-1] = PAD  # an empty source: nothing to attend to
    model = rnn_seq2seq(VOCAB, VOCAB, 8, 16, score=score, return_attention=True)
    out = model(x)
    weights = _np(out["attention"])  # (B, T, S)
    assert np.all(np.isfinite(_np(out["logits"])))
    source_pad = x["encoder_inputs"] == PAD
    assert np.all(weights.transpose(0, 2, 1)[source_pad] == 0.0)
    valid = _valid(x)
    attending = valid & ~source_pad.all(-1, keepdims=True)
    np.testing.assert_allclose(weights.sum(-1)[attending], 1.0, atol=1e-5)
    assert np.all(weights[~attending] == 0.0)  # padded decoder steps attend nowhere


@pytest.mark.parametrize("score", SCORES)
def test_padding_content_and_length_change_nothing(score):
    """The padding embedding, and extra padding on either input, leave valid logits unchanged."""
    x, _ = _batch(np.random.default_rng(2))
    model = rnn_seq2seq(VOCAB, VOCAB, 8, 16, score=score)
    valid = _valid(x)
    reference = _np(model(x))[valid]

    for name in ("encoder_embedding", "decoder_embedding"):
        table = model.get_layer(name).embeddings
        values = _np(table)
        values[PAD] = np.random.default_rng(3).normal(0, 3, values.shape[1])
        table.assign(values)
    np.testing.assert_allclose(_np(model(x))[valid], reference, atol=1e-5)

    longer = {name: np.pad(value, ((0, 0), (0, 4))) for name, value in x.items()}
    np.testing.assert_allclose(_np(model(longer))[:, : valid.shape[1]][valid], reference, atol=1e-5)


def test_loss_ignores_padded_target_steps():
    x, y = _batch(np.random.default_rng(3))
    model = rnn_seq2seq(VOCAB, VOCAB, 8, 16)
    model.compile(loss=_loss())
    changed = np.where(_valid(x), y, np.random.default_rng(4).integers(3, VOCAB, y.shape))
    before = model.evaluate(x, y, verbose=0)
    after = model.evaluate(x, changed.astype("int32"), verbose=0)
    assert before == pytest.approx(after, abs=1e-6)


def test_attention_model_takes_trained_weights():
    x, _ = _batch(np.random.default_rng(5))
    trained = rnn_seq2seq(VOCAB, VOCAB, 8, 16, score="bilinear", cell="gru")
    inspect = rnn_seq2seq(VOCAB, VOCAB, 8, 16, score="bilinear", cell="gru", return_attention=True)
    inspect.set_weights(trained.get_weights())
    np.testing.assert_allclose(_np(inspect(x)["logits"]), _np(trained(x)), atol=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"`score` must be one of .* Received: score='cosine'"):
        rnn_seq2seq(VOCAB, VOCAB, 8, 16, score="cosine")
    with pytest.raises(ValueError, match=r"`cell` must be one of .* Received: cell='rnn'"):
        rnn_seq2seq(VOCAB, VOCAB, 8, 16, cell="rnn")
    with pytest.raises(ValueError, match=r"`return_attention=True` needs a `score`"):
        rnn_seq2seq(VOCAB, VOCAB, 8, 16, score=None, return_attention=True)


# ---------------------------------------------------------------------------
# Training: attention against the no-attention baseline
# ---------------------------------------------------------------------------


def _reversal_data(rng, n, min_length, max_length, vocab):
    """Source: random tokens; target: the source reversed, then EOS."""
    source = np.zeros((n, max_length), "int32")
    decoder_inputs = np.zeros((n, max_length + 1), "int32")
    target = np.zeros((n, max_length + 1), "int32")
    for i, length in enumerate(rng.integers(min_length, max_length + 1, n)):
        tokens = rng.integers(3, vocab, length)
        source[i, :length] = tokens
        decoder_inputs[i, : length + 1] = [BOS, *tokens[::-1]]
        target[i, : length + 1] = [*tokens[::-1], EOS]
    return {"encoder_inputs": source, "decoder_inputs": decoder_inputs}, target


@pytest.mark.slow
def test_attention_beats_the_baseline_at_reversing_long_sequences():
    rng = np.random.default_rng(0)
    vocab = 12
    train, train_target = _reversal_data(rng, 5000, 10, 20, vocab)
    test, test_target = _reversal_data(rng, 1000, 10, 20, vocab)
    valid = _valid(test)
    accuracy = {}
    for score in ("additive", None):
        keras.utils.set_random_seed(0)
        model = rnn_seq2seq(vocab, vocab, embedding_dim=32, units=64, score=score)
        model.compile(optimizer=keras.optimizers.Adam(0.005), loss=_loss())
        build_for_fit(model, (train, train_target))
        model.fit(train, train_target, epochs=5, batch_size=64, verbose=0)
        predicted = np.argmax(model.predict(test, batch_size=256, verbose=0), -1)
        correct = predicted == test_target
        accuracy[score] = (correct[valid].mean(), np.all(correct | ~valid, -1).mean())
    print(
        "reversal (length 10-20), teacher-forced token / sequence accuracy: "
        f"additive attention {accuracy['additive'][0]:.3f} / {accuracy['additive'][1]:.3f}, "
        f"no attention {accuracy[None][0]:.3f} / {accuracy[None][1]:.3f}"
    )
    assert accuracy["additive"][0] >= 0.95, accuracy
    assert accuracy["additive"][0] >= accuracy[None][0] + 0.15, accuracy
    assert accuracy["additive"][1] >= accuracy[None][1] + 0.5, accuracy
