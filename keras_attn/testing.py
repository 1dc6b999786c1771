"""Property checks for attention layers and models: the invariants, as assertions.

The bugs people hit with attention are silent: a mask dropped on one code path,
real tokens attending to padding, a future token leaking into the past, NaN or
a uniform average on a row with nothing to attend to, weights lost on reload.
Each check below calls a layer or model a few times with related inputs and
raises `AssertionError`, naming the property, the output and the largest
difference, when the property does not hold:

| check | property |
|---|---|
| `assert_padding_invariance` | new padded content, or more padding, changes no visible output |
| `assert_causal_invariance` | changing the inputs from step `t` on changes no output before `t` |
| `assert_batch_invariance` | an example's output does not depend on the rest of its batch |
| `assert_fully_masked_rows_safe` | rows that see nothing output zeros; outputs, gradients finite |
| `assert_save_reload_equal` | `.keras` (safe mode) and SavedModel copies give the same outputs |

They work on any Keras layer or model, not only keras-attn's, and need no test
framework. Every check takes the same first arguments:

- `fn`: a layer, a model or any callable. A `keras.Model` is called
  `fn(inputs, **call_kwargs)`, with `inputs` arranged as the model's inputs
  (matched by name); anything else `fn(**inputs, **call_kwargs)`.
- `inputs`: dict `name -> array` of every argument with a batch axis (axis 0),
  masks included; sequences have their steps on axis 1.
- `call_kwargs`: other arguments, passed unchanged (`use_causal_mask=True`,
  `return_attention_scores=True`, `training=True`, ...).
- `jit_compile=True` runs each call compiled with XLA: `tf.function(jit_compile=True)`
  on the TensorFlow backend, `jax.jit` on JAX (the variables of a layer or
  model `fn` passed in, through a `keras.StatelessScope`); the checks run on
  one `fn` with the same `call_kwargs` share the compilations.

A layer's non-trainable state (its seed generators, ...) is put back before
every call, so with `training=True` seeded dropout draws the same randomness
each time and the comparisons stay exact. Tolerances default to `1e-5`
(absolute and relative), `1e-2` for float16 outputs and `5e-2` for bfloat16.
The checks run on the TensorFlow and JAX backends; TensorFlow (or JAX) is
imported only by what needs it (SavedModel, gradients, XLA).
"""

import os
import tempfile
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import numpy as np

__all__ = [
    "assert_batch_invariance",
    "assert_causal_invariance",
    "assert_fully_masked_rows_safe",
    "assert_padding_invariance",
    "assert_save_reload_equal",
]

_TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2}
_DEFAULT_TOLERANCE = 1e-5


# ---------------------------------------------------------------------------
# Calling `fn` and reading its outputs
# ---------------------------------------------------------------------------


def _arrange(model, tensors):
    """The dict of inputs in the structure a model was built with."""
    try:
        structure = model.input
    except (AttributeError, ValueError):  # a subclassed model: pass the dict
        return tensors
    if isinstance(structure, dict):
        return {name: tensors[name] for name in structure}
    flat = keras.tree.flatten(structure)
    if len(flat) == 1 and len(tensors) == 1:
        return next(iter(tensors.values()))
    return keras.tree.pack_sequence_as(structure, [tensors[t.name] for t in flat])


class _Runner:
    """Calls `fn` on a dict of arrays and returns its outputs as float32/int NumPy arrays."""

    def __init__(self, fn, call_kwargs=None, jit_compile=False):
        if not callable(fn):
            raise TypeError(f"`fn` must be a layer, a model or a callable. Received: fn={fn!r}")
        self.fn = fn
        self.call_kwargs = dict(call_kwargs or {})
        self.jit_compile = jit_compile
        self.compiled = None
        self.state = None
        self.dtypes = ()

    def call(self, tensors):
        return _call(self.fn, tensors, self.call_kwargs)

    def prepare(self, inputs):
        """Tensors for `inputs`; builds `fn` eagerly and puts its state back."""
        tensors = {name: keras.ops.convert_to_tensor(v) for name, v in inputs.items()}
        if isinstance(self.fn, keras.layers.Layer):
            if not self.fn.built:
                self.call(tensors)  # weights exist before any tracing
            variables = self.fn.non_trainable_variables
            if self.state is None:
                self.state = [keras.ops.convert_to_numpy(v) for v in variables]
            for variable, value in zip(variables, self.state, strict=True):
                variable.assign(value)
        return tensors

    def raw(self, inputs):
        tensors = self.prepare(inputs)
        if not self.jit_compile:
            return self.call(tensors)
        if self.compiled is None:
            self.compiled = _compiled_call(self.fn, self.call_kwargs)
        return self.compiled(tensors)

    def __call__(self, inputs):
        outputs = _flatten(self.raw(inputs))
        self.dtypes = tuple(str(t.dtype) for t in outputs)
        return [_to_numpy(t) for t in outputs]


def _call(fn, tensors, call_kwargs):
    if isinstance(fn, keras.Model):
        return fn(_arrange(fn, tensors), **call_kwargs)
    return fn(**tensors, **call_kwargs)


# fn -> {frozen call_kwargs: compiled call}, so that the checks run one after
# the other on one layer share their XLA compilations.
_COMPILED = weakref.WeakKeyDictionary()


def _freeze(value):
    if isinstance(value, np.ndarray):
        return (value.shape, str(value.dtype), value.tobytes())
    return repr(value)


def _compiled_call(fn, call_kwargs):
    key = tuple(sorted((name, _freeze(v)) for name, v in call_kwargs.items()))
    try:
        cache, ref = _COMPILED.setdefault(fn, {}), weakref.ref(fn)
    except TypeError:  # not weak-referenceable: compiled for this check only
        cache, ref = {}, lambda: fn
    if key not in cache:
        kwargs = dict(call_kwargs)
        variables = list(fn.variables) if isinstance(fn, keras.layers.Layer) else []
        cache[key] = _compile(lambda tensors: _call(ref(), tensors, kwargs), variables)
    return cache[key]


def _backend(what):
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax"):
        raise ValueError(
            f"{what} needs the TensorFlow or the JAX backend. Received: backend={backend!r}"
        )
    return backend


def _compile(function, variables=()):
    """`function` compiled with XLA: `tf.function(jit_compile=True)` or `jax.jit`.

    On JAX, `function` runs in a `keras.StatelessScope` in which `variables`
    (the Keras variables it reads) take the values passed at each call: the
    compiled function sees their current values, and their updates (e.g. a
    seed generator's) are dropped instead of leaking tracers.
    """
    if _backend("`jit_compile=True`") == "tensorflow":
        import tensorflow as tf

        return tf.function(function, jit_compile=True, reduce_retracing=True)
    import jax

    variables = list(variables)

    def pure(values, *args):
        with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
            return function(*args)

    compiled = jax.jit(pure)
    return lambda *args: compiled([v.value for v in variables], *args)


def _value_and_gradients(function, sources, variables, loss, jit_compile=False):
    """`(outputs, gradients)` of `outputs = function(*sources)` and the scalar `loss(outputs)`.

    The gradients are with respect to `sources` (float tensors), then
    `variables` (Keras variables): `tf.GradientTape` on TensorFlow,
    `jax.value_and_grad` on JAX (the variables mapped in a
    `keras.StatelessScope`). `jit_compile` compiles the whole step with XLA.
    """
    variables = list(variables)
    if _backend("Taking gradients") == "tensorflow":
        import tensorflow as tf

        def step(*sources):
            with tf.GradientTape() as tape:
                tape.watch(sources)
                outputs = function(*sources)
                value = loss(outputs)
            return outputs, tape.gradient(value, list(sources) + variables)

        return (tf.function(step, jit_compile=True) if jit_compile else step)(*sources)
    import jax

    def pure(source_values, variable_values):
        with keras.StatelessScope(state_mapping=list(zip(variables, variable_values, strict=True))):
            outputs = function(*source_values)
            return loss(outputs), outputs

    step = jax.value_and_grad(pure, argnums=(0, 1), has_aux=True)
    step = jax.jit(step) if jit_compile else step
    (_, outputs), (d_sources, d_variables) = step(list(sources), [v.value for v in variables])
    return outputs, list(d_sources) + list(d_variables)


def _flatten(outputs):
    return [t for t in keras.tree.flatten(outputs) if t is not None]


def _is_float(dtype):
    return "float" in str(dtype)


def _to_numpy(tensor):
    if _is_float(tensor.dtype):
        tensor = keras.ops.cast(tensor, "float32")
    return np.asarray(keras.ops.convert_to_numpy(tensor))


def _tolerance(atol, dtypes):
    if atol is not None:
        return atol
    return max([_TOLERANCE.get(d, _DEFAULT_TOLERANCE) for d in dtypes], default=1e-5)


def _as_arrays(inputs):
    if not isinstance(inputs, Mapping) or not inputs:
        raise TypeError(
            "`inputs` must be a non-empty dict `name -> array`. "
            f"Received: inputs of type {type(inputs).__name__}"
        )
    return {name: np.asarray(keras.ops.convert_to_numpy(v)) for name, v in inputs.items()}


def _batch_size(inputs):
    sizes = {name: v.shape[0] for name, v in inputs.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"Every input needs the same batch size (axis 0). Received: {sizes}")
    return next(iter(sizes.values()))


def _compare(what, actual, expected, tol, keep=None):
    """Raises `AssertionError` unless each output of `actual` matches `expected`.

    `keep`: bool `(B, T)`; outputs whose leading axes are `(B, T)` are compared
    only where it is True.
    """
    if len(actual) != len(expected):
        raise AssertionError(f"{what}: {len(actual)} outputs, expected {len(expected)}")
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        if a.shape != e.shape:
            raise AssertionError(f"{what}: output {i} has shape {a.shape}, expected {e.shape}")
        if _is_float(a.dtype):
            close = np.isclose(a, e, atol=tol, rtol=tol, equal_nan=True)
        else:
            close = a == e
        if keep is not None and a.shape[: keep.ndim] == keep.shape:
            close |= ~keep.reshape(keep.shape + (1,) * (a.ndim - keep.ndim))
        if not close.all():
            index = tuple(int(j) for j in np.argwhere(~close)[0])
            with np.errstate(invalid="ignore"):
                diff = np.abs(a.astype("float64") - e.astype("float64"))[~close]
            largest = f"{diff.max():.3g}" if np.all(np.isfinite(diff)) else "not finite"
            raise AssertionError(
                f"{what}: output {i} (shape {a.shape}) differs at {int((~close).sum())} of "
                f"{a.size} values, first at index {index}: {a[index].item()!r} instead of "
                f"{e[index].item()!r} (largest difference {largest}, tolerance {tol:g})"
            )


def _perturb(x, where, rng, nonfinite=False):
    """`x` with new values where `where` (bool `(B, T)`, broadcast over trailing axes)."""
    where = where.reshape(where.shape + (1,) * (x.ndim - where.ndim))
    if x.dtype == bool:
        raise ValueError("Boolean inputs (masks) describe padding; they are not perturbed.")
    if np.issubdtype(x.dtype, np.integer):
        low, high = int(x.min()), int(x.max())
        new = rng.integers(low, max(high, low + 1) + 1, size=x.shape).astype(x.dtype)
    elif nonfinite:
        new = np.resize(np.array([np.nan, np.inf, -np.inf], x.dtype), x.shape)
    else:
        new = (x + rng.normal(0.0, 3.0, size=x.shape)).astype(x.dtype)
    return np.where(where, new, x)


def _marks(inputs, padding):
    """`name -> bool (B, T)` from `padding` values that are arrays or names of mask inputs."""
    if not isinstance(padding, Mapping) or not padding:
        raise TypeError(f"`padding` must be a non-empty dict. Received: padding={padding!r}")
    marks = {}
    for name, real in padding.items():
        if name not in inputs:
            raise ValueError(f"`padding` names {name!r}, which is not in `inputs`.")
        real = np.asarray(inputs[real] if isinstance(real, str) else real, bool)
        if real.shape != inputs[name].shape[:2]:
            raise ValueError(
                f"`padding[{name!r}]` must have shape (batch, steps) = "
                f"{inputs[name].shape[:2]}. Received: shape {real.shape}"
            )
        marks[name] = real
    return marks


# ---------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------


def assert_padding_invariance(
    fn: Callable,
    inputs: Mapping[str, Any],
    padding: Mapping[str, Any],
    *,
    output_mask: Any = None,
    pad_value: float | None = None,
    extra_steps: int = 2,
    nonfinite: bool = False,
    call_kwargs: Mapping[str, Any] | None = None,
    atol: float | None = None,
    seed: int = 0,
    jit_compile: bool = False,
) -> None:
    """Asserts that padding changes no visible output.

    Two ways padding can be marked:

    - by a mask the callee receives (an entry of `inputs`, or an implicit
      Keras mask): the check writes new values (noise, or NaN/inf with
      `nonfinite=True`) into the padded positions of each input in `padding`;
    - by content (`pad_value`: token id 0 with `mask_zero=True`, a
      `keras.layers.Masking` value): the check appends `extra_steps` steps of
      `pad_value` to each input in `padding`; outputs that grew with it are
      compared on the original positions.

    Args:
        fn, inputs, call_kwargs, jit_compile: see the module docstring.
        padding: dict `input name -> bool (B, T)`, `True` = real step, or the
            name of that boolean mask in `inputs`.
        output_mask: bool `(B, T)` (or the name of an input): outputs whose
            leading axes are `(B, T)` are compared only where it is `True`
            (for layers whose padded rows are not defined, e.g. a residual
            block). `None`: every output value must stay the same.
        pad_value: `None`, or the value that marks padding by content.
        extra_steps: steps appended with `pad_value`.
        nonfinite: write NaN, inf and -inf into padded positions instead of
            noise (then no non-finite value may reach a visible output).
        atol: absolute and relative tolerance; `None` picks one by dtype.
        seed: of the new values.

    Returns:
        None. Raises `AssertionError` when a visible output changed.

    Example:

    >>> from keras_attn import testing
    >>> x = np.random.default_rng(0).normal(size=(2, 4, 8)).astype("float32")
    >>> mask = np.array([[True, True, True, False], [True, True, False, False]])
    >>> testing.assert_padding_invariance(
    ...     keras_attn.DotAttention(), {"query": x, "value": x, "value_mask": mask},
    ...     padding={"value": "value_mask"}, nonfinite=True)
    """
    inputs = _as_arrays(inputs)
    marks = _marks(inputs, padding)
    runner = _Runner(fn, call_kwargs, jit_compile)
    reference = runner(inputs)
    tol = _tolerance(atol, runner.dtypes)
    keep = None
    if output_mask is not None:
        keep = np.asarray(inputs[output_mask] if isinstance(output_mask, str) else output_mask)
        keep = keep.astype(bool)
    names = ", ".join(f"`{name}`" for name in marks)
    if pad_value is None:
        rng = np.random.default_rng(seed)
        changed = dict(inputs)
        for name, real in marks.items():
            changed[name] = _perturb(inputs[name], ~real, rng, nonfinite)
        what = f"Padding invariance: changing {names} at padded steps changed a visible output"
        _compare(what, runner(changed), reference, tol, keep)
        return
    longer = dict(inputs)
    for name, real in marks.items():
        x = inputs[name]
        padded = np.all(x.reshape(x.shape[:2] + (-1,)) == pad_value, axis=-1)
        if np.any(padded != ~real):
            raise ValueError(
                f"`padding[{name!r}]` must be False exactly where `{name}` equals "
                f"pad_value={pad_value!r}."
            )
        widths = [(0, 0), (0, extra_steps)] + [(0, 0)] * (x.ndim - 2)
        longer[name] = np.pad(x, widths, constant_values=pad_value)
    grown = [out[tuple(slice(0, n) for n in ref.shape)] for out, ref in zip(
        runner(longer), reference, strict=True)]  # fmt: skip
    what = f"Padding invariance: {extra_steps} more padded steps on {names} changed an output"
    _compare(what, grown, reference, tol, keep)


def assert_causal_invariance(
    fn: Callable,
    inputs: Mapping[str, Any],
    *,
    sequences: Sequence[str] | None = None,
    steps: Sequence[int] | None = None,
    time_axes: int | Sequence[int | None] = 1,
    call_kwargs: Mapping[str, Any] | None = None,
    atol: float | None = None,
    seed: int = 0,
    jit_compile: bool = False,
) -> None:
    """Asserts that changing the inputs at steps `>= t` changes no output before `t`.

    Args:
        fn, inputs, call_kwargs, jit_compile: see the module docstring.
        sequences: names of the inputs changed from step `t` on (axis 1); by
            default every non-boolean input of rank >= 2. They must share
            their length `T >= 2`.
        steps: the values of `t` to try; by default `1`, `T // 2` and `T - 1`.
        time_axes: the step axis of the outputs: an int for all of them, or
            one entry per (flattened) output, `None` to skip that output
            (e.g. `(1, 2)` for an output `(B, T, d)` and weights
            `(B, heads, T, T)`).
        atol: tolerance; `None` picks one by dtype.
        seed: of the new values.

    Returns:
        None. Raises `AssertionError` when a future step changed the past.

    Example:

    >>> from keras_attn import testing
    >>> x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    >>> testing.assert_causal_invariance(
    ...     keras_attn.ScaledDotAttention(), {"query": x, "value": x},
    ...     call_kwargs={"use_causal_mask": True})
    """
    inputs = _as_arrays(inputs)
    if sequences is None:
        sequences = [n for n, v in inputs.items() if v.dtype != bool and v.ndim >= 2]
    lengths = {name: inputs[name].shape[1] for name in sequences}
    if len(set(lengths.values())) != 1 or min(lengths.values()) < 2:
        raise ValueError(f"`sequences` must share one length T >= 2 on axis 1. Received: {lengths}")
    length = next(iter(lengths.values()))
    steps = sorted({1, length // 2, length - 1}) if steps is None else list(steps)
    runner = _Runner(fn, call_kwargs, jit_compile)
    reference = runner(inputs)
    tol = _tolerance(atol, runner.dtypes)
    axes = [time_axes] * len(reference) if isinstance(time_axes, int) else list(time_axes)
    if len(axes) != len(reference):
        raise ValueError(
            f"`time_axes` needs one entry per output ({len(reference)}). Received: {time_axes}"
        )
    rng = np.random.default_rng(seed)
    for t in steps:
        future = np.zeros(inputs[sequences[0]].shape[:2], bool)
        future[:, t:] = True
        changed = dict(inputs)
        for name in sequences:
            changed[name] = _perturb(inputs[name], future, rng)
        outputs = runner(changed)
        pairs = [(o.take(range(t), a), r.take(range(t), a)) for o, r, a in
                 zip(outputs, reference, axes, strict=True) if a is not None]  # fmt: skip
        what = f"Causal invariance: changing steps >= {t} of {sequences} changed an earlier output"
        _compare(what, [p[0] for p in pairs], [p[1] for p in pairs], tol)


def assert_batch_invariance(
    fn: Callable,
    inputs: Mapping[str, Any],
    *,
    examples: Sequence[int] | None = None,
    call_kwargs: Mapping[str, Any] | None = None,
    atol: float | None = None,
    jit_compile: bool = False,
) -> None:
    """Asserts that each example's output does not depend on the rest of its batch.

    The batch is run reversed, and each example in `examples` alone (a batch
    of one); every output (batch on axis 0) must equal the full batch's.
    Run it in inference: in training, random layers draw per batch.

    Args:
        fn, inputs, call_kwargs, jit_compile: see the module docstring.
            At least two examples.
        examples: indices of the examples run alone; by default all.
        atol: tolerance; `None` picks one by dtype.

    Returns:
        None. Raises `AssertionError` when an output depends on other examples.

    Example:

    >>> from keras_attn import testing
    >>> x = np.random.default_rng(0).normal(size=(3, 4, 8)).astype("float32")
    >>> testing.assert_batch_invariance(keras_attn.AttentionPooling(units=4), {"inputs": x})
    """
    inputs = _as_arrays(inputs)
    batch = _batch_size(inputs)
    if batch < 2:
        raise ValueError(f"`inputs` needs at least 2 examples. Received: batch size {batch}")
    runner = _Runner(fn, call_kwargs, jit_compile)
    reference = runner(inputs)
    tol = _tolerance(atol, runner.dtypes)
    order = np.arange(batch)[::-1]
    reversed_outputs = runner({name: v[order] for name, v in inputs.items()})
    _compare(
        "Batch invariance: reversing the batch changed an example's output",
        [out[np.argsort(order)] for out in reversed_outputs],
        reference,
        tol,
    )
    for i in range(batch) if examples is None else examples:
        alone = runner({name: v[i : i + 1] for name, v in inputs.items()})
        _compare(
            f"Batch invariance: example {i} alone differs from example {i} in the batch",
            alone,
            [out[i : i + 1] for out in reference],
            tol,
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
    alone is zero forward and NaN backward). Gradients need the TensorFlow
    or the JAX backend.

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
