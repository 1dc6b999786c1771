"""The machinery behind `keras_attn.testing`'s checks: calling `fn`, comparing outputs."""

import weakref
from collections.abc import Mapping

import keras
import numpy as np

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
        self.dtypes = tuple(keras.backend.standardize_dtype(t.dtype) for t in outputs)
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


_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "torch"}


def _backend(what, backends=("tensorflow", "jax", "torch")):
    """The Keras backend's name; `ValueError` unless it is one of `backends`."""
    backend = keras.backend.backend()
    if backend not in backends:
        names = " or the ".join(_NAMES[b] for b in backends)
        raise ValueError(f"{what} needs the {names} backend. Received: backend={backend!r}")
    return backend


def _jit_modes(jit_compile):
    """`jit_compile` as a tuple; `None`: eager and XLA, eager only on torch (no XLA)."""
    if jit_compile is None:
        return (False,) if keras.backend.backend() == "torch" else (False, True)
    return tuple(jit_compile)


def _compile(function, variables=()):
    """`function` compiled with XLA: `tf.function(jit_compile=True)` or `jax.jit`.

    On JAX, `function` runs in a `keras.StatelessScope` in which `variables`
    (the Keras variables it reads) take the values passed at each call: the
    compiled function sees their current values, and their updates (e.g. a
    seed generator's) are dropped instead of leaking tracers.
    """
    if _backend("`jit_compile=True` (XLA)", ("tensorflow", "jax")) == "tensorflow":
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
    `keras.StatelessScope`), `torch.autograd.grad` on torch (a variable or source
    the loss does not depend on gets `None`, as on TensorFlow). `jit_compile`
    compiles the whole step with XLA (TensorFlow and JAX only).
    """
    variables = list(variables)
    backend = _backend("Taking gradients")
    if backend == "torch":
        if jit_compile:
            _backend("`jit_compile=True` (XLA)", ("tensorflow", "jax"))
        return _torch_value_and_gradients(function, sources, variables, loss)
    if backend == "tensorflow":
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


def _torch_value_and_gradients(function, sources, variables, loss):
    import torch

    sources = [keras.ops.convert_to_tensor(s).detach().requires_grad_(True) for s in sources]
    outputs = function(*sources)
    value = loss(outputs)
    # Only what requires a gradient goes to autograd; the rest gets `None` (as when the
    # loss does not depend on anything that does: a constant output).
    wanted = sources + [v.value for v in variables]
    used = [t.requires_grad and value.requires_grad for t in wanted]
    found = [t for t, use in zip(wanted, used, strict=True) if use]
    grads = iter(torch.autograd.grad(value, found, allow_unused=True) if found else ())
    return outputs, [next(grads) if use else None for use in used]


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


def _float64():
    """A context in which float64 is float64: JAX's x64 mode (TensorFlow needs none)."""
    if keras.backend.backend() == "jax":
        import jax

        return jax.enable_x64(True)
    import contextlib

    return contextlib.nullcontext()
