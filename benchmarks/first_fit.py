"""The first `evaluate` and `fit` of a model on TensorFlow, with and without `build_for_fit`.

    python -m benchmarks.first_fit [--repeats N]

Each repeat builds a fresh 2+2-layer Transformer encoder-decoder (d_model 32, 4 heads; the
model of `tests/zoo/test_models_transformer.py`), compiles it with Adam, its loss and an
accuracy metric, then times `evaluate` and a 2-epoch `fit` of 128 examples in batches of 64:
once as Keras leaves it (the optimizer's and the metrics' variables made inside the first
trace of each step, which makes TensorFlow trace it again) and once after
`keras_attn.models.training.build_for_fit`, interleaved. It prints the times (median
[min-max] over the repeats) and how often each step was traced.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_attn  # noqa: E402
from keras_attn.models.training import build_for_fit  # noqa: E402

VOCAB, LENGTH, D_MODEL = 13, 8, 32


def _model():
    source = keras.Input((None,), dtype="int32", name="source")
    decoder_inputs = keras.Input((LENGTH,), dtype="int32", name="decoder_inputs")
    embed = keras_attn.TokenAndPositionEmbedding
    x = embed(VOCAB, LENGTH, D_MODEL, mask_zero=True)(source)
    for _ in range(2):
        x = keras_attn.TransformerEncoderBlock(intermediate_dim=64, num_heads=4)(x)
    y = embed(VOCAB, LENGTH, D_MODEL, mask_zero=True)(decoder_inputs)
    for _ in range(2):
        y = keras_attn.TransformerDecoderBlock(intermediate_dim=64, num_heads=4)(y, x)
    model = keras.Model(
        {"source": source, "decoder_inputs": decoder_inputs}, keras.layers.Dense(VOCAB)(y)
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _data(count=128):
    rng = np.random.default_rng(0)
    source = rng.integers(1, VOCAB, (count, LENGTH)).astype("int32")
    target = source[:, ::-1].copy()
    decoder_inputs = np.concatenate([np.ones((count, 1), "int32"), target[:, :-1]], axis=1)
    return {"source": source, "decoder_inputs": decoder_inputs}, target


def _run(build, x, y):
    keras.utils.set_random_seed(0)
    model = _model()
    traces = {"train": 0, "test": 0}
    train_step, test_step = model.train_step, model.test_step

    def train(data):
        traces["train"] += 1
        return train_step(data)

    def test(data):
        traces["test"] += 1
        return test_step(data)

    model.train_step, model.test_step = train, test
    start = time.perf_counter()
    if build:
        build_for_fit(model, (x, y))
    model.evaluate(x, y, batch_size=64, verbose=0)
    model.fit(x, y, batch_size=64, epochs=2, verbose=0)
    return time.perf_counter() - start, traces


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if keras.backend.backend() != "tensorflow":
        raise SystemExit("benchmarks.first_fit measures the TensorFlow backend.")
    x, y = _data()
    seconds = {False: [], True: []}
    traces = {}
    for _ in range(args.repeats):
        for build in (False, True):
            took, traces[build] = _run(build, x, y)
            seconds[build].append(took)
    print(f"first evaluate + 2-epoch fit, {args.repeats} repeats, interleaved (seconds)")
    for build, label in ((False, "Keras alone"), (True, "build_for_fit first")):
        s = seconds[build]
        print(
            f"  {label:<20} {statistics.median(s):6.1f} [{min(s):.1f}-{max(s):.1f}]"
            f"  traces: train {traces[build]['train']}, test {traces[build]['test']}"
        )


if __name__ == "__main__":
    main()
