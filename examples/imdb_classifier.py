"""Transformer classifier on imdb_reviews: tfds -> TextVectorization -> fit -> evaluate -> export.

    python examples/imdb_classifier.py --download     # first run: fetches imdb_reviews (80 MB)
    python examples/imdb_classifier.py                # later runs: the prepared copy
    python examples/imdb_classifier.py --pooling attention --epochs 5

Any tfds text-classification dataset with `(text, label)` supervised keys works with
`--dataset NAME`. Writes `model.keras` (tokens -> logits), `vocabulary.txt` and a
SavedModel whose `serve` endpoint classifies raw strings.
"""

import os

import common  # the examples' shared flags and dataset loading
import keras
import tensorflow as tf

from keras_attn import models

DATASET = "imdb_reviews"


def parse_args(argv=None):
    p = common.parser(__doc__.splitlines()[0], f"tfds text classification (default {DATASET})", 3)
    p.add_argument("--vocab-size", type=int, default=20000, help="words kept")
    p.add_argument("--sequence-length", type=int, default=256, help="tokens kept per review")
    p.add_argument("--num-layers", type=int, default=2, help="encoder blocks")
    p.add_argument("--num-heads", type=int, default=4, help="attention heads")
    p.add_argument("--d-model", type=int, default=64, help="model width")
    p.add_argument("--pooling", choices=("mean", "attention"), default="mean", help="pooling")
    args = p.parse_args(argv)
    if args.smoke:
        args.epochs, args.batch_size, args.train_examples = 1, 8, 16
        args.vocab_size, args.sequence_length, args.num_layers, args.d_model = 200, 32, 1, 16
    return args


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

    # -- preprocess: words -> ids (0 = padding, 1 = out of vocabulary) -------
    vectorizer = keras.layers.TextVectorization(
        max_tokens=args.vocab_size, output_sequence_length=args.sequence_length
    )
    vectorizer.adapt(train.map(lambda text, label: text).batch(512))

    def batches(ds, shuffle=False):
        ds = ds.shuffle(10_000, seed=args.seed) if shuffle else ds
        ds = ds.batch(args.batch_size).map(lambda text, label: (vectorizer(text), label))
        return ds.prefetch(tf.data.AUTOTUNE)

    # -- build --------------------------------------------------------------
    model = models.transformer_classifier(
        vocab_size=vectorizer.vocabulary_size(),
        sequence_length=args.sequence_length,
        num_classes=num_classes,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        d_model=args.d_model,
        intermediate_dim=2 * args.d_model,
        pooling=args.pooling,
    )
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
    out = common.output_dir(args, "imdb_classifier")
    model.save(os.path.join(out, "model.keras"))
    with open(os.path.join(out, "vocabulary.txt"), "w") as f:
        f.write("\n".join(vectorizer.get_vocabulary()) + "\n")
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(vectorizer)
    archive.add_endpoint(
        "serve",  # raw review strings -> logits
        lambda text: model(vectorizer(text), training=False),
        input_signature=[tf.TensorSpec((None,), tf.string)],
    )
    archive.write_out(os.path.join(out, "saved_model"), verbose=False)
    print(f"Saved {out}/model.keras, {out}/vocabulary.txt and the SavedModel {out}/saved_model")
    return {"dataset": name, "accuracy": accuracy, "export": out}


if __name__ == "__main__":
    main()
