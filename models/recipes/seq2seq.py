"""Seq2seq recipes on text pairs: the generated tasks and real translation pairs.

Each task trains `epochs` passes over its first `train_examples` pairs (the task's
`Training` defaults unless `Settings` says otherwise) with Adam, a linear warmup and
a cosine decay to zero, then greedy-decodes the first `test_examples` test pairs with
the KV cache and reports `exact_match`: the share of decoded sequences equal to the
target, token for token. On real text (any dataset but the generated
`keras_attn_seq2seq`) it also reports `bleu`: corpus BLEU in points of the decoded
text, words joined with spaces, against the test targets (`keras_attn.models.bleu`).
Decoding, in the evaluation and in the export, stops after the longest training
target plus its end token: no length is read from the test split. The plot and the
printed example are the first test pair, whether decoded right or not.

`Settings.attention` (`--attention`) replaces the model of the tasks that take it by
the RNN encoder-decoder with additive (Bahdanau) attention (`"additive"`) or the same
RNN without attention (`"none"`), so one task compares the families on one dataset.
"""

import dataclasses
import math

import keras
import numpy as np
import tensorflow as tf

from ... import models
from .. import bleu, text
from ..training import build_for_fit
from .common import (
    END,
    START,
    Result,
    adam_warmup_cosine,
    dataset_size,
    load_supervised,
    progress_verbosity,
    take,
    text_vectorizer,
)

# ---------------------------------------------------------------------------
# Seq2seq on text pairs: generated tasks and ted_hrlr_translate
# ---------------------------------------------------------------------------

GENERATED = "keras_attn_seq2seq"  # the project's generated pairs: exact match, no BLEU


@dataclasses.dataclass(frozen=True)
class Training:
    """A seq2seq task's defaults: data, schedule and regularization.

    Args:
        epochs: passes over the training pairs (`Settings.epochs` overrides it).
        train_examples: training pairs used (`Settings.train_examples` overrides it).
        learning_rate: Adam's rate (with `cosine_decay`: its peak, after the warmup).
        cosine_decay: warm up linearly from 0 over `warmup_steps` (at most a tenth of
            the steps), then decay to 0 along a cosine; False: a constant rate.
        warmup_steps: see `cosine_decay`.
        dropout: the Transformer's dropout (embeddings and residual branches).
    """

    epochs: int = 5
    train_examples: int = 20_000
    learning_rate: float = 1e-3
    cosine_decay: bool = False
    warmup_steps: int = 500
    dropout: float = 0.1


ATTENTION = ("additive", "none")  # `Settings.attention`: the RNN's score, or none


def seq2seq_task(
    task_name, default_dataset, architecture, training=Training(), choose_attention=False
):
    """The recipe of a seq2seq task: `architecture` ("transformer" or "rnn") on text pairs.

    With `choose_attention` the task takes `Settings.attention`: the RNN with additive
    attention or with none instead of `architecture`.
    """

    def run(settings):
        name = settings.dataset or default_dataset
        family, score = _family(architecture, settings.attention if choose_attention else None)
        count = settings.train_examples or training.train_examples
        epochs = settings.epochs or training.epochs
        # `take` before `cache`: the cache then holds exactly what every epoch reads.
        train = take(load_supervised(name, "train", settings), count).cache()
        test = take(load_supervised(name, "test", settings), settings.test_examples)
        source_vectorizer = text_vectorizer(train.map(lambda s, t: s).batch(1024), 20000)
        target_vectorizer = text_vectorizer(
            train.map(lambda s, t: tf.strings.join([START, t, END], " ")).batch(1024), 20000
        )
        vocab = target_vectorizer.get_vocabulary()
        start_id, end_id = vocab.index(START), vocab.index(END)

        def to_features(source, target):
            target = target_vectorizer(tf.strings.join([START, target, END], " "))
            x = {"encoder_inputs": source_vectorizer(source), "decoder_inputs": target[:, :-1]}
            labels = target[:, 1:]
            return x, labels, tf.cast(labels != 0, "float32")

        batched = train.shuffle(count, seed=settings.seed).batch(settings.batch_size)
        keras.utils.set_random_seed(settings.seed)
        model = _seq2seq_model(
            family, score, source_vectorizer.vocabulary_size(), len(vocab), training.dropout
        )
        steps = epochs * math.ceil(dataset_size(train) / settings.batch_size)
        model.compile(
            optimizer=_optimizer(training, steps),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=["accuracy"],
        )
        features = batched.map(to_features)
        build_for_fit(model, features)  # TensorFlow traces the train step once, not twice
        model.fit(
            features, epochs=epochs, shuffle=False,
            callbacks=settings.callbacks(), verbose=progress_verbosity(),
        )  # fmt: skip

        # Decoding stops at the longest training target plus its end token, here and in
        # the export: the test split gives no length.
        max_length = _lengths(train.map(lambda s, t: t))[1] + 1
        sources, targets = zip(*test.as_numpy_iterator(), strict=True)
        source_ids = np.asarray(source_vectorizer(np.array(sources)))
        attends = family == "transformer" or score is not None  # else no alignment to plot
        decoded = models.greedy_decode(
            model, source_ids, max_length, start_id, end_id, return_alignment=attends
        )  # tokens, and with `attends` the decode's alignment (B, max_length, S)
        decoded, alignment = decoded if attends else (decoded, None)
        decoded = np.asarray(decoded)
        words = np.array(vocab)
        outputs = [" ".join(words[row[(row != 0) & (row != end_id)]]) for row in decoded]
        expected = [t.decode() for t in targets]
        exact = np.mean([o == e for o, e in zip(outputs, expected, strict=True)])
        metrics = {"exact_match": float(exact)}
        if not name.startswith(GENERATED):  # real text: BLEU of the text as a reader sees it
            metrics["bleu"] = bleu.corpus_bleu(outputs, expected)
        verdict = "right" if outputs[0] == expected[0] else "wrong"
        print(f"first test pair ({verdict}; the plot shows it):")
        print(f"  source:   {sources[0].decode()}")
        print(f"  expected: {expected[0]}\n  decoded:  {outputs[0]}")

        # Text in, text out: the vocabularies with the model. Sources are cut to the longest
        # training source; decoding stops where the evaluation's did. The training sources'
        # lengths go with it: `keras-attn predict` warns of inputs outside them.
        trained_lengths = _lengths(train.map(lambda s, t: s))
        text_model = text.TextSeq2Seq(
            model,
            text.string_lookup(source_vectorizer.get_vocabulary()),
            text.string_lookup(vocab),
            trained_lengths[1],
            max_length,
            START,
            END,
            trained_lengths=trained_lengths,
        )

        def export(path):
            text_model.export_text(path)

        first = None  # the plot's weights: the decode's own alignment of the first pair,
        if attends:  # on its decoded tokens and its real source tokens (T', S')
            first = np.asarray(alignment[0])[decoded[0] != 0][:, source_ids[0] != 0]

        def plot(path):
            from keras_attn import plotting

            source_words = source_vectorizer.get_vocabulary()
            fig = plotting.plot_attention(
                first,
                source_labels=[source_words[i] for i in source_ids[0] if i],
                target_labels=[vocab[i] for i in decoded[0] if i],
                title=f"{task_name}: cross-attention, first test pair",
            )
            plotting.save_figure(fig, path)

        return Result(name, model, metrics, export, plot if attends else None, text_model)

    run.__name__ = task_name
    run.training = training
    run.options = {"attention"} if choose_attention else set()  # `Settings` fields it reads
    run.text = True  # a text model: `keras-attn predict` takes it
    run.defaults = f"{training.epochs} epochs over {training.train_examples:,} examples"
    return run


def _optimizer(training, steps):
    if not training.cosine_decay:
        return keras.optimizers.Adam(training.learning_rate)
    return adam_warmup_cosine(steps, training.learning_rate, training.warmup_steps)


def _lengths(texts):
    """`(shortest, longest)`: the fewest and most words (`text.split_words`) of a non-blank
    string in `texts` (a dataset of strings); `(1, 1)` where there is none."""

    # In batches: one `map` call per string cost 4 s over the main job's 20,000 pairs.
    def extremes(batch):  # (2,): the fewest and most words of the batch's non-blank strings
        words = tf.cast(text.split_words(batch).row_lengths(), tf.int32)
        words = tf.boolean_mask(words, words > 0)
        return tf.stack([tf.reduce_min(words), tf.reduce_max(words)])  # none: (int32 max, min)

    def both(a, b):
        return tf.stack([tf.minimum(a[0], b[0]), tf.maximum(a[1], b[1])])

    low, high = texts.batch(4096).map(extremes).reduce(tf.constant([2**31 - 1, 1]), both).numpy()
    return (int(low), int(high)) if low <= high else (1, 1)


def _family(architecture, attention):
    """`(architecture, RNN score)` of a run: the task's model unless `attention` names one."""
    if attention is None:
        return architecture, "additive" if architecture == "rnn" else None
    if attention not in ATTENTION:
        raise ValueError(
            f"`attention` must be None or one of {ATTENTION}. Received: attention={attention!r}"
        )
    return "rnn", "additive" if attention == "additive" else None


def _seq2seq_model(architecture, score, source_vocab, target_vocab, dropout):
    if architecture == "transformer":
        return models.transformer_seq2seq(
            source_vocab, target_vocab, num_layers=2, num_heads=4, d_model=64,
            intermediate_dim=128, dropout=dropout,
        )  # fmt: skip
    return models.rnn_seq2seq(source_vocab, target_vocab, 64, 128, score=score)
