"""Hierarchical attention network on imdb_reviews: reviews -> sentences -> words -> HAN.

    python examples/imdb_han.py --download            # first run: fetches imdb_reviews (80 MB)
    python examples/imdb_han.py --plot han.png        # later runs; plots one test review

Each review is split into sentences with TF string ops (after `.`, `!`, `?` and at
`<br />` line breaks), each sentence into word ids with `keras.layers.TextVectorization`,
giving documents `(B, max_sentences, max_words)`. Writes `model.keras` (word ids ->
logits), `vocabulary.txt` and a SavedModel whose `serve` endpoint classifies raw
strings. `--plot FILE` draws the word and sentence weights of the first
test review (`keras_attn.plotting.plot_han`).
"""

import os

import common  # the examples' shared flags and dataset loading
import keras
import numpy as np
import tensorflow as tf

from keras_attn import models

DATASET = "imdb_reviews"


def parse_args(argv=None):
    p = common.parser(__doc__.splitlines()[0], f"tfds text classification (default {DATASET})", 3)
    p.add_argument("--vocab-size", type=int, default=20000, help="words kept")
    p.add_argument("--max-sentences", type=int, default=15, help="sentences kept per review")
    p.add_argument("--max-words", type=int, default=40, help="words kept per sentence")
    p.add_argument("--embedding-dim", type=int, default=64, help="word embedding width")
    p.add_argument("--units", type=int, default=32, help="GRU width per direction")
    args = p.parse_args(argv)
    if args.smoke:
        args.epochs, args.batch_size, args.train_examples = 1, 8, 16
        args.vocab_size, args.max_sentences, args.max_words = 200, 4, 8
        args.embedding_dim, args.units = 8, 4
    return args


def split_sentences(text):
    """`(B,)` reviews -> ragged `(B, None)` sentences (TF string ops, runs in tf.data)."""
    text = tf.strings.regex_replace(text, r"<br\s*/?>", "\n")  # imdb's line breaks
    text = tf.strings.regex_replace(text, r"([.!?]+)\s+", "\\1\n")  # end of a sentence
    sentences = tf.strings.strip(tf.strings.split(text, "\n"))
    return tf.ragged.boolean_mask(sentences, tf.strings.length(sentences) > 0)  # no empty ones


def main(argv=None):
    args = parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    name = args.dataset or DATASET

    # -- load ---------------------------------------------------------------
    train, info = common.load(name, "train", args.data_dir, args.download)
    test, _ = common.load(name, "test", args.data_dir, args.download)
    print(common.describe(name, args.data_dir))
    if args.train_examples:
        train = train.take(args.train_examples)
    test = test.take(16 if args.smoke else -1)
    num_classes = info.features[info.supervised_keys[1]].num_classes

    # -- preprocess: reviews -> (sentences, words) of ids, 0 = padding --------
    vectorizer = keras.layers.TextVectorization(
        max_tokens=args.vocab_size, output_sequence_length=args.max_words
    )
    vectorizer.adapt(train.batch(512).map(lambda text, label: split_sentences(text).flat_values))
    shape = (None, args.max_sentences, args.max_words)

    def documents(text):
        sentences = split_sentences(text)  # (B, None) strings
        words = vectorizer(sentences.flat_values)  # (sentences in the batch, W)
        words = tf.RaggedTensor.from_row_splits(words, sentences.row_splits)  # (B, None, W)
        return tf.cast(words.to_tensor(shape=shape), tf.int32)  # (B, S, W), cut or padded

    def batches(ds, shuffle=False):
        ds = ds.shuffle(10_000, seed=args.seed) if shuffle else ds
        ds = ds.batch(args.batch_size).map(lambda text, label: (documents(text), label))
        return ds.prefetch(tf.data.AUTOTUNE)

    # -- build --------------------------------------------------------------
    def han(return_attention=False):
        return models.hierarchical_attention_network(
            vocab_size=vectorizer.vocabulary_size(),
            embedding_dim=args.embedding_dim,
            word_units=args.units,
            sentence_units=args.units,
            num_classes=num_classes,
            max_sentences=args.max_sentences,
            max_words=args.max_words,
            dropout=0.2,
            return_attention=return_attention,
        )

    model = han()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )

    # -- fit and evaluate ---------------------------------------------------
    model.fit(batches(train, shuffle=True), epochs=args.epochs, verbose=2)
    loss, accuracy = model.evaluate(batches(test), verbose=0)
    print(f"{name} test: accuracy {accuracy:.4f}, loss {loss:.4f}")

    # -- export -------------------------------------------------------------
    out = common.output_dir(args, "imdb_han")
    model.save(os.path.join(out, "model.keras"))
    vocabulary = vectorizer.get_vocabulary()
    with open(os.path.join(out, "vocabulary.txt"), "w") as f:
        f.write("\n".join(vocabulary) + "\n")
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(vectorizer)
    archive.add_endpoint(
        "serve",  # raw review strings -> logits
        lambda text: model(documents(text), training=False),
        input_signature=[tf.TensorSpec((None,), tf.string)],
    )
    archive.write_out(os.path.join(out, "saved_model"), verbose=False)
    print(f"Saved {out}/model.keras, {out}/vocabulary.txt and the SavedModel {out}/saved_model")

    # -- plot: where the model looked in the first test review --------------
    if args.plot:
        from keras_attn import plotting

        viewer = han(return_attention=True)  # the same layers, attention weights as outputs
        viewer.set_weights(model.get_weights())
        text, label = next(iter(test.batch(1)))
        tokens = documents(text).numpy()[0]  # (S, W)
        outputs = viewer(tokens[None])
        words = [[vocabulary[i] for i in sentence if i] for sentence in tokens]
        words = words[: max(i + 1 for i, s in enumerate(words) if s)] if any(words) else [[]]
        fig = plotting.plot_han(
            np.asarray(outputs["word_attention"])[0],
            np.asarray(outputs["sentence_attention"])[0],
            words,
            title=f"{name} test review 0 (label {int(label[0])})",
        )
        plotting.save_figure(fig, args.plot)
        print(f"Saved the attention plot {args.plot}")
    return {"dataset": name, "accuracy": accuracy, "export": out}


if __name__ == "__main__":
    main()
