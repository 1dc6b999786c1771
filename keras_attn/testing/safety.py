"""Safety checks: rows that see nothing stay finite and zero; saved copies give the same outputs."""

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import numpy as np

from keras_attn.testing._support import (
    _arrange,
    _as_arrays,
    _backend,
    _batch_size,
    _compare,
    _flatten,
    _is_float,
    _Runner,
    _to_numpy,
    _tolerance,
    _value_and_gradients,
)


def assert_fully_masked_rows_safe(
    fn: Callable,
    inputs: Mapping[str, Any],
    empty: Any,
    *,
    zero_outputs: bool = True,
    call_kwargs: Mapping[str, Any] | None = None,
    jit_compile: bool = False,
) -> None:
    """Asserts that rows with nothing visible give zeros, and nothing is NaN or inf.

    Every output must be finite; with `zero_outputs`, the outputs of the
    empty rows must be exactly zero (not an average over padding); the
    gradients of `sum(outputs ** 2)` with respect to every float input and
    every trainable weight must be finite (`where(mask, softmax(...), 0)`
    alone is zero forward and NaN backward). Gradients are taken on the
    TensorFlow, JAX and torch backends.

    Args:
        fn, inputs, call_kwargs, jit_compile: see the module docstring.
        empty: the examples whose masks leave nothing visible: an index, a
            list of indices, a bool `(B,)` array, or a bool `(B, T)` array of
            rows (then outputs with leading axes `(B, T)` are checked there).
        zero_outputs: the empty rows' outputs must be exactly zero. `False`
            for layers and models that add something after the attention
            (a residual, a classifier): then only finiteness is checked.

    Returns:
        None. Raises `AssertionError` naming the output or gradient at fault.

    Example:

    >>> from keras_attn import testing
    >>> x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32")
    >>> mask = np.array([[True, True, False], [False, False, False]])  # example 1: empty
    >>> testing.assert_fully_masked_rows_safe(
    ...     keras_attn.AdditiveAttention(units=4), {"query": x, "value": x, "value_mask": mask},
    ...     empty=1)

    Keras' own `Attention` averages the padding on such a row, and is caught:

    >>> attention = keras.layers.Attention()
    >>> def keras_attention(query, value, value_mask):
    ...     return attention([query, value], mask=[None, value_mask])
    >>> try:
    ...     testing.assert_fully_masked_rows_safe(
    ...         keras_attention, {"query": x, "value": x, "value_mask": mask}, empty=1)
    ... except AssertionError as error:
    ...     print(str(error)[:59])
    Fully masked rows: output 0 is not zero on the empty rows (
    """
    _backend("assert_fully_masked_rows_safe (gradients)")
    inputs = _as_arrays(inputs)
    batch = _batch_size(inputs)
    rows = np.asarray(empty)
    if rows.dtype != bool:
        rows = np.isin(np.arange(batch), np.atleast_1d(rows))
    runner = _Runner(fn, call_kwargs, jit_compile)
    tensors = runner.prepare(inputs)
    float_names = [n for n, v in inputs.items() if np.issubdtype(v.dtype, np.floating)]
    weights = list(fn.trainable_weights) if isinstance(fn, keras.layers.Layer) else []

    def function(*sources):
        return _flatten(runner.call({**tensors, **dict(zip(float_names, sources, strict=True))}))

    def loss(outputs):
        squares = [keras.ops.sum(keras.ops.cast(t, "float32") ** 2) for t in outputs
                   if _is_float(t.dtype)]  # fmt: skip
        return sum(squares, keras.ops.zeros(()))

    sources = [tensors[name] for name in float_names]
    outputs, gradients = _value_and_gradients(function, sources, weights, loss, jit_compile)
    for i, out in enumerate(_to_numpy(t) for t in outputs):
        if _is_float(out.dtype) and not np.all(np.isfinite(out)):
            raise AssertionError(f"Fully masked rows: output {i} has non-finite values")
        if zero_outputs and out.shape[: rows.ndim] == rows.shape and np.any(out[rows] != 0):
            raise AssertionError(
                f"Fully masked rows: output {i} is not zero on the empty rows (largest "
                f"|value| {np.abs(out[rows]).max():.3g}); a row with no visible key must "
                "output zeros, not an average over padding"
            )
    names = [f"input `{n}`" for n in float_names] + [f"weight `{w.path}`" for w in weights]
    for name, gradient in zip(names, gradients, strict=True):
        if gradient is not None and not np.all(np.isfinite(_to_numpy(gradient))):
            raise AssertionError(f"Fully masked rows: the gradient of {name} is not finite")


def _as_model(fn, inputs, call_kwargs):
    if isinstance(fn, keras.Model):
        return fn, dict(call_kwargs or {})
    if not isinstance(fn, keras.layers.Layer):
        raise TypeError(f"`fn` must be a Keras layer or model to be saved. Received: fn={fn!r}")
    symbolic = {
        name: keras.Input(shape=v.shape[1:], dtype=str(v.dtype), name=name)
        for name, v in inputs.items()
    }
    return keras.Model(symbolic, fn(**symbolic, **(call_kwargs or {}))), {}


def assert_save_reload_equal(
    fn: Callable,
    inputs: Mapping[str, Any],
    *,
    call_kwargs: Mapping[str, Any] | None = None,
    directory: str | os.PathLike | None = None,
    formats: Sequence[str] = ("keras", "saved_model"),
    atol: float | None = None,
) -> None:
    """Asserts that saved and reloaded copies give the same outputs and weights.

    `"keras"`: `model.save(path.keras)`, then
    `keras.saving.load_model(path, safe_mode=True)` with no `custom_objects`:
    every class must be registered and no config may need unsafe
    deserialization (a Python `lambda`). The weights must come back equal
    and the outputs too. `"saved_model"`: `model.export(path)` and
    `tf.saved_model.load(path).serve(...)` must give the outputs.

    Args:
        fn: a `keras.Model`, or a layer (wrapped in a functional model with
            one `keras.Input` per entry of `inputs`, `call_kwargs` fixed).
        inputs, call_kwargs: see the module docstring.
        directory: where to write; a temporary directory by default.
        formats: any of `"keras"` and `"saved_model"`.
        atol: tolerance; `None` picks one by dtype.

    Returns:
        None. Raises `AssertionError` when a reload fails or differs.

    Example:

    >>> from keras_attn import testing
    >>> x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32")
    >>> testing.assert_save_reload_equal(
    ...     keras_attn.BilinearAttention(), {"query": x, "value": x}, formats=("keras",))
    """
    inputs = _as_arrays(inputs)
    unknown = set(formats) - {"keras", "saved_model"}
    if unknown:
        raise ValueError(f"`formats` may hold 'keras' and 'saved_model'. Received: {formats}")
    model, kwargs = _as_model(fn, inputs, call_kwargs)
    runner = _Runner(model, kwargs)
    reference = runner(inputs)
    tol = _tolerance(atol, runner.dtypes)
    with tempfile.TemporaryDirectory() as scratch:
        directory = scratch if directory is None else str(directory)
        if "keras" in formats:
            path = os.path.join(directory, "reload_check.keras")
            model.save(path)
            try:
                reloaded = keras.saving.load_model(path, safe_mode=True)
            except Exception as error:
                raise AssertionError(
                    f"`.keras` reload with safe_mode=True failed: {type(error).__name__}: {error}"
                ) from error
            before, after = model.weights, reloaded.weights
            if [tuple(w.shape) for w in before] != [tuple(w.shape) for w in after]:
                raise AssertionError("`.keras` reload: the reloaded model has other weights")
            _compare(
                "`.keras` reload: a weight came back different",
                [_to_numpy(w) for w in after],
                [_to_numpy(w) for w in before],
                0.0,
            )
            _compare(
                "`.keras` reload: the reloaded model's output differs",
                _Runner(reloaded, kwargs)(inputs),
                reference,
                tol,
            )
        if "saved_model" in formats:
            import tensorflow as tf

            export_dir = os.path.join(directory, "reload_check_savedmodel")
            model.export(export_dir, verbose=False)
            loaded = tf.saved_model.load(export_dir)  # keep it: it owns the variables
            feed = _arrange(model, {n: tf.constant(v) for n, v in inputs.items()})
            served = [_to_numpy(t) for t in _flatten(loaded.serve(feed))]
            _compare("SavedModel: the served output differs", served, reference, tol)
