"""Text-classification recipes: imdb_reviews with a Transformer classifier or a HAN."""

import keras
import numpy as np
import tensorflow as tf

from ... import models
from .. import text
from ..training import build_for_fit
from .common import Result, load_supervised, progress_verbosity, take

# ---------------------------------------------------------------------------
# Text classification: imdb_reviews with a Transformer or a HAN
# ---------------------------------------------------------------------------

MAX_TOKENS, MAX_WORDS, MAX_SENTENCES, SENTENCE_WORDS = 20000, 256, 12, 32
EPOCHS, TRAIN_EXAMPLES = 2, 25000  # unless `Settings` says otherwise


MARKUP = "<br />"  # the line breaks of imdb_reviews' text


def _clean(reviews):
    """Reviews as `TextClassifier.token_ids` reads them: markup and Unicode spaces spaces."""
    return text.normalize_spaces(tf.strings.regex_replace(reviews, MARKUP, " "))


def _class_names(name, settings):
    """The dataset's label names (tfds' `ClassLabel`), or "0", "1" where it names none."""
    import tensorflow_datasets as tfds

    try:
        return list(tfds.builder(name, data_dir=settings.data_dir).info.features["label"].names)
    except Exception:  # a dataset without names, or whose builder cannot say
        return ["0", "1"]


def imdb_task(task_name, architecture):
    def run(settings):
        name = settings.dataset or "imdb_reviews"
        count = settings.train_examples or TRAIN_EXAMPLES
        train = take(load_supervised(name, "train", settings), count).cache()  # take, then cache
        test = take(load_supervised(name, "test", settings), settings.test_examples)
        hierarchical = architecture == "han"
        vectorizer = keras.layers.TextVectorization(
            MAX_TOKENS, output_sequence_length=SENTENCE_WORDS if hierarchical else MAX_WORDS
        )
        vectorizer.adapt(train.map(lambda review, label: _clean(review)).batch(1024))

        keras.utils.set_random_seed(settings.seed)
        vocab_size = vectorizer.vocabulary_size()
        pooling = settings.pooling or "attention"
        if hierarchical:
            build = lambda **kw: models.hierarchical_attention_network(  # noqa: E731
                vocab_size, 64, 32, 32, 2, MAX_SENTENCES, SENTENCE_WORDS, dropout=0.1,
                pooling=pooling, **kw,
            )  # fmt: skip
        else:
            build = lambda **kw: models.transformer_classifier(  # noqa: E731
                vocab_size, MAX_WORDS, 2, num_layers=2, num_heads=4, d_model=64,
                intermediate_dim=128, pooling=pooling, **kw,
            )  # fmt: skip
        model = build()
        # Text in, label out: the vectorizer with the model; training reads its token ids.
        text_model = text.TextClassifier(
            model, vectorizer, _class_names(name, settings),
            max_sentences=MAX_SENTENCES if hierarchical else None, markup=MARKUP,
        )  # fmt: skip

        def batches(ds, shuffle=False):
            ds = ds.shuffle(25000, seed=settings.seed) if shuffle else ds
            ds = ds.batch(settings.batch_size)
            return ds.map(lambda texts, labels: (text_model.token_ids(texts), labels))

        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        train_batches = batches(train, shuffle=True)
        build_for_fit(model, train_batches)  # TensorFlow traces the train step once, not twice
        model.fit(
            train_batches, epochs=settings.epochs or EPOCHS, shuffle=False,
            callbacks=settings.callbacks(), verbose=progress_verbosity(),
        )  # fmt: skip
        _, accuracy = model.evaluate(batches(test), verbose=0)
        texts = [t for t, _ in test.take(1).as_numpy_iterator()]

        def plot(path):
            from keras_attn import plotting

            ids = np.asarray(text_model.token_ids(texts[:1]))
            words = np.array(vectorizer.get_vocabulary())
            if hierarchical:
                attention_model = build(return_attention=True)
                attention_model.set_weights(model.get_weights())
                out = attention_model(ids)
                keep = [i for i, row in enumerate(ids[0]) if row.any()]  # real sentences
                sentences = [list(words[ids[0][i][ids[0][i] != 0]]) for i in keep]
                fig = plotting.plot_han(
                    np.asarray(out["word_attention"])[0][keep],
                    np.asarray(out["sentence_attention"])[0][keep],
                    sentences,
                )
            else:
                fig = _pooling_plot(model, ids, words, plotting)
            plotting.save_figure(fig, path)

        return Result(
            name, model, {"accuracy": float(accuracy)}, text_model.export_text, plot, text_model
        )

    run.__name__ = task_name
    run.options = {"pooling"}  # the `Settings` fields only this kind of task reads
    run.text = True  # a text model: `keras-attn predict` takes it
    run.defaults = f"{EPOCHS} epochs over {TRAIN_EXAMPLES:,} examples"
    return run


def _pooling_plot(model, ids, words, plotting):
    """The attention-pooling weights of a `transformer_classifier` over one review's words."""
    pooling = model.get_layer("pooling")
    pooled_input = pooling.input[0] if isinstance(pooling.input, list) else pooling.input
    encoded = keras.Model(model.input, pooled_input)(ids)
    _, weights = pooling(encoded, mask=ids != 0, return_attention_scores=True)
    real = ids[0] != 0
    return plotting.plot_attention(
        np.asarray(weights)[:, real],
        source_labels=list(words[ids[0][real]]),
        target_labels=["pooled"],
        title="transformer_classifier: attention pooling",
    )
