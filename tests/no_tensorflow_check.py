"""keras_attn and its zoo without TensorFlow: import, train a step, decode, save and reload.

    python tests/no_tensorflow_check.py [--block]

Run from the repository root on a non-TensorFlow backend (KERAS_BACKEND, default jax).
`--block` makes `tensorflow` and `tensorflow_datasets` unfindable first (every
meta-path finder wrapped), for a machine that has them (`tests/compat/test_no_tensorflow.py`);
`.ci/no-tensorflow` runs it without `--block` in a venv where they are not installed.
Prints `ok` and exits 0, or fails with the assertion.
"""

import importlib
import os
import sys
import tempfile

BLOCKED = ("tensorflow", "tensorflow_datasets")


class HideTensorFlow:
    """Wraps a meta-path finder: `tensorflow`, `tensorflow_datasets` and their submodules
    are not found, as where they are not installed (`importlib.util.find_spec` gives
    `None`, `import` raises `ModuleNotFoundError`); everything else it finds as before."""

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            return None
        find_spec = getattr(self.finder, "find_spec", None)
        return None if find_spec is None else find_spec(name, path, target)

    def __getattr__(self, name):  # invalidate_caches, find_distributions, ...
        return getattr(self.finder, name)


def main():
    if "--block" in sys.argv[1:]:
        sys.meta_path[:] = [HideTensorFlow(finder) for finder in sys.meta_path]
    for name in BLOCKED:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        raise AssertionError(f"{name} is importable: run with --block, or where it is absent")
    os.environ.setdefault("KERAS_BACKEND", "jax")
    # This checkout's keras_attn, whatever else is installed.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import keras
    import numpy as np

    import keras_attn
    import keras_attn.testing
    from keras_attn import models as zoo

    assert keras.backend.backend() != "tensorflow", keras.backend.backend()
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)

    # The property kit on a layer of the library.
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    inputs = {"query": x, "value": x, "query_mask": mask, "value_mask": mask}
    keras_attn.testing.assert_padding_invariance(
        layer, inputs, {"value": "value_mask"}, output_mask="query_mask", nonfinite=True
    )

    # A zoo model: one training step, greedy decoding, a `.keras` round trip.
    vocab, start = 12, 1
    model = zoo.transformer_seq2seq(
        vocab, vocab, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32
    )
    source, target = rng.integers(3, vocab, (4, 7)), rng.integers(3, vocab, (4, 6))
    source[:2, 4:], target[:2, 3:] = 0, 0  # padded rows
    inputs = {"encoder_inputs": source, "decoder_inputs": target}
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True))
    before = [np.array(w) for w in model.get_weights()]
    history = model.fit(inputs, target, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]), history.history
    assert any(not np.allclose(a, b) for a, b in zip(before, model.get_weights(), strict=True))

    tokens = keras.ops.convert_to_numpy(zoo.greedy_decode(model, source, 4, start_id=start))
    previous = np.full((len(source), 1), start, "int32")  # uncached: the whole model per prefix
    for t in range(4):
        logits = keras.ops.convert_to_numpy(
            model({"encoder_inputs": source, "decoder_inputs": previous})
        )
        previous = np.concatenate([previous, logits[:, t, 1:].argmax(-1)[:, None] + 1], 1)
    np.testing.assert_array_equal(tokens, previous[:, 1:])
    ended = keras.ops.convert_to_numpy(zoo.greedy_decode(model, source, 4, start, end_id=2))
    beam, _ = zoo.beam_search(model, source, 4, start, end_id=2, beam_width=1)  # = greedy
    np.testing.assert_array_equal(beam, ended)

    path = os.path.join(tempfile.mkdtemp(), "seq2seq.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(reloaded(inputs)),
        keras.ops.convert_to_numpy(model(inputs)),
        atol=1e-6,
    )
    assert not any(name.split(".")[0] in BLOCKED for name in sys.modules), "TensorFlow loaded"
    print("ok", keras_attn.__file__)


if __name__ == "__main__":
    main()
