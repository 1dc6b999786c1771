"""The shared model-check helper: every zoo model goes through `check_model`.

Like `layer_checks.check_layer`, it never branches on the model's type; what
differs between models is described by the arguments (data, loss, weights).
"""

import keras
import numpy as np

from keras_attn import testing
from keras_attn.models.training import build_for_fit


def _flat(outputs):
    """Model outputs (tensor, list or dict) as a flat list of NumPy arrays."""
    return [keras.ops.convert_to_numpy(t) for t in keras.tree.flatten(outputs)]


def check_model(
    model,
    x,
    y,
    *,
    tmp_path,
    loss,
    sample_weight=None,
    optimizer=None,
    steps=5,
    atol=1e-5,
):
    """Runs the common checks on a zoo model.

    1. It is a built functional model whose symbolic outputs agree with an
       eager call on `x`, and the outputs are finite.
    2. `steps` full-batch `fit` steps on `(x, y)` lower the loss.
    3. `.keras` save and reload with `safe_mode=True` and no `custom_objects`
       gives the same outputs.
    4. `model.export(path)` and `tf.saved_model.load` serve the same outputs
       (on the TensorFlow backend; the `.keras` reload runs on every backend).

    Args:
        model: the `keras.Model` a builder returned.
        x: model inputs as the model takes them (an array or a dict of arrays,
            with the inputs' dtypes).
        y: targets for `fit`.
        tmp_path: a directory for the saved files.
        loss: the loss to compile with.
        sample_weight: optional `fit` / `evaluate` sample weights.
        optimizer: defaults to `Adam(0.01)`.
        steps: number of `fit` steps (one full batch each).
        atol: tolerance of the output comparisons.

    Returns:
        The trained model.
    """
    keras.utils.set_random_seed(1234)

    # 1. A built functional model; symbolic and eager outputs agree.
    assert isinstance(model, keras.Model) and model.built
    symbolic = keras.tree.flatten(model.outputs)
    assert model.inputs and all(isinstance(t, keras.KerasTensor) for t in symbolic)
    eager = _flat(model(x, training=False))
    for sym, out in zip(symbolic, eager, strict=True):
        assert len(sym.shape) == out.ndim, (sym.shape, out.shape)
        compatible = all(s in (None, o) for s, o in zip(sym.shape, out.shape, strict=True))
        assert compatible, (sym.shape, out.shape)
        assert np.all(np.isfinite(out)), "non-finite model output"

    # 2. A few fit steps lower the loss.
    model.compile(optimizer=optimizer or keras.optimizers.Adam(0.01), loss=loss)
    batch_size = len(keras.tree.flatten(x)[0])
    build_for_fit(model, (x, y, sample_weight))  # TensorFlow: each step traced once
    evaluate = {"batch_size": batch_size, "verbose": 0, "return_dict": True}
    before = model.evaluate(x, y, sample_weight=sample_weight, **evaluate)["loss"]
    model.fit(x, y, sample_weight=sample_weight, epochs=steps, batch_size=batch_size, verbose=0)
    after = model.evaluate(x, y, sample_weight=sample_weight, **evaluate)["loss"]
    assert np.isfinite(after) and after < before, (before, after)

    # 3, 4. `.keras` reload with safe_mode=True (no custom_objects), SavedModel serving.
    inputs = x if isinstance(x, dict) else {model.inputs[0].name: x}
    formats = ("keras", "saved_model") if keras.backend.backend() == "tensorflow" else ("keras",)
    testing.assert_save_reload_equal(
        model, inputs, directory=str(tmp_path), formats=formats, atol=atol
    )
    return model


def padded_tokens(rng, batch, length, vocab, min_length=2):
    """Random token ids `3..vocab-1` `(batch, length)`, each row right-padded with 0."""
    tokens = rng.integers(3, vocab, size=(batch, length)).astype("int32")
    for row, size in zip(tokens, rng.integers(min_length, length + 1, size=batch), strict=True):
        row[size:] = 0
    return tokens


def favour_token(model, token, margin=8.0):
    """Makes `token` a `transformer_lm`'s (pre-norm, tied output) likeliest next token
    everywhere, by about `margin` logits: `final_norm`'s offset and `token`'s embedding row
    both move along one unit direction `u` (`logit = x . E[token]` gains about `margin`).
    """
    d_model = model.get_layer("final_norm").beta.shape[0]
    u = np.random.default_rng(token).normal(size=d_model)
    u = (u / np.linalg.norm(u)).astype("float32")
    norm, table = model.get_layer("final_norm"), model.get_layer("token_embedding").embeddings
    norm.beta.assign(keras.ops.convert_to_numpy(norm.beta) + np.sqrt(margin) * u)
    rows = keras.ops.convert_to_numpy(table).copy()
    rows[token] += np.sqrt(margin) * u
    table.assign(rows)
    return model
