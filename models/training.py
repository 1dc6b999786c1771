"""`build_for_fit`: a compiled model's training state, made before `fit` traces its step.

On TensorFlow, `model.fit` and `model.evaluate` (without a distribution strategy) leave the
optimizer's variables and the compiled loss and metrics' to the first trace of their step
function. A `tf.function` that creates variables in its first trace is traced a second
time, so the first `fit` of a model traces its whole training step twice, and the first
`evaluate` its test step. Measured on a 2+2-layer Transformer encoder-decoder, its first
`evaluate` and a 2-epoch `fit` (`python -m benchmarks.first_fit`, 2 CPU cores): 19.5 s, and
10.7 s with the state built first (one trace of each step). JAX, torch and TensorFlow
under a distribution strategy build that state before tracing already; Keras does it with
the same method this calls (`Trainer._symbolic_build`).
"""

import keras


def build_for_fit(model: keras.Model, data) -> keras.Model:
    """Builds a compiled model's optimizer, loss and metric state from the shapes of `data`.

    Call it after `model.compile` and before the first `fit` or `evaluate`: on TensorFlow
    their step function is then traced once instead of twice (see the module's docstring).
    Elsewhere (JAX, torch, a model under a `tf.distribute` strategy) Keras builds this state
    itself before tracing, and this does nothing.

    Args:
        model: a compiled `keras.Model`.
        data: what `fit` will take: a `tf.data.Dataset` of `(x, y)` or
            `(x, y, sample_weight)` batches (only its `element_spec` is read), or one
            such tuple of arrays (any batch size: only the shapes after the first axis
            and the dtypes matter).

    Returns:
        `model`, its optimizer, loss and metrics built.

    Example:

        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
        build_for_fit(model, (x, y))
        model.fit(x, y, epochs=3)  # the train step is traced once
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"`model` must be a `keras.Model`. Received: model={model!r}")
    if not model.compiled:
        raise ValueError("`model` must be compiled (`model.compile(...)`) before `build_for_fit`.")
    if keras.backend.backend() != "tensorflow" or model._distribute_strategy is not None:
        return model  # Keras builds the state before it traces (`_maybe_symbolic_build`)
    batch = getattr(data, "element_spec", data)  # a dataset: its batches' specs
    if not isinstance(batch, (tuple, list)) or not 1 <= len(batch) <= 3:
        raise ValueError(
            "`data` must be a `tf.data.Dataset` of `(x, y)` or `(x, y, sample_weight)` "
            f"batches, or one such tuple. Received: data={data!r}"
        )
    model._symbolic_build(data_batch=tuple(batch))
    return model
