"""keras-attn demo: associative recall, with and without attention.

Each example is a padded set of (key, value) token pairs and a query key; the
target is the value stored under the query key. A model that attends from the
query over the keys (Bahdanau's additive attention) reads the answer off the
right slot; the same model with mean pooling instead of attention cannot.

    python examples/demo.py            # about a minute on 2 CPU cores
    python examples/demo.py --epochs 3 # quicker, a little less accurate
"""

import quiet  # noqa: F401  (first: hides TensorFlow's start-up notices)

# isort: split
import argparse

import keras
import numpy as np

import keras_attn

NUM_KEYS, NUM_VALUES, MAX_PAIRS = 50, 20, 12


def make_data(n, rng):
    """Keys are distinct in each example; 0 is padding in every sequence."""
    keys = np.zeros((n, MAX_PAIRS), "int32")
    values = np.zeros((n, MAX_PAIRS), "int32")
    lengths = rng.integers(3, MAX_PAIRS + 1, size=n)
    query = np.zeros((n,), "int32")
    target = np.zeros((n,), "int32")
    for i, length in enumerate(lengths):
        keys[i, :length] = rng.choice(np.arange(1, NUM_KEYS + 1), size=length, replace=False)
        values[i, :length] = rng.integers(1, NUM_VALUES + 1, size=length)
        slot = rng.integers(length)
        query[i], target[i] = keys[i, slot], values[i, slot] - 1
    return {"keys": keys, "values": values, "query": query}, target


def build_model(use_attention, dim=32):
    keys = keras.Input((MAX_PAIRS,), dtype="int32", name="keys")
    values = keras.Input((MAX_PAIRS,), dtype="int32", name="values")
    query = keras.Input((), dtype="int32", name="query")
    key_embedding = keras.layers.Embedding(NUM_KEYS + 1, dim, mask_zero=True)
    k = key_embedding(keys)  # (B, T, d), carries the padding mask
    v = keras.layers.Embedding(NUM_VALUES + 1, dim, mask_zero=True)(values)
    q = key_embedding(query)  # (B, d): one query per example
    if use_attention:
        context = keras_attn.AdditiveAttention(units=dim)(q, v, key=k)  # (B, d)
    else:
        context = keras.layers.GlobalAveragePooling1D()(v)  # (B, d), masked mean
    hidden = keras.layers.Dense(64, activation="relu")(keras.layers.Concatenate()([q, context]))
    outputs = keras.layers.Dense(NUM_VALUES, activation="softmax")(hidden)
    return keras.Model([keys, values, query], outputs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--train-size", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x_train, y_train = make_data(args.train_size, rng)
    x_test, y_test = make_data(2000, rng)
    print(
        f"associative recall: up to {MAX_PAIRS} (key, value) pairs, {NUM_VALUES} values "
        f"(chance {1 / NUM_VALUES:.1%})"
    )
    for name, use_attention in [("additive attention", True), ("mean pooling", False)]:
        model = build_model(use_attention)
        model.compile(
            optimizer=keras.optimizers.Adam(3e-3),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        model.fit(x_train, y_train, epochs=args.epochs, batch_size=128, verbose=0)
        _, accuracy = model.evaluate(x_test, y_test, verbose=0)
        print(f"{name:>20}: test accuracy {accuracy:.1%}")


if __name__ == "__main__":
    main()
