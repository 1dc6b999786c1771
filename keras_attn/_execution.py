"""Whether a call runs eagerly on values, and whether an autodiff system may record it.

An eager call (TensorFlow outside `tf.function`, JAX on concrete arrays,
torch outside `torch.compile`) pays for every op it runs, one at a time; a
traced call pays once, at trace time. A few guards of the kernels cost ops on
every call but change nothing for most inputs (the non-finite guard when
every key and value is finite; a custom gradient when nothing will be
differentiated). Eagerly, the values are known: those guards look and are
skipped when they would change nothing. Traced, they stay in the graph, as
the values are not known yet.
"""

import contextlib
import functools
import inspect
import threading

import keras
import numpy as np
from keras import ops
from keras.src.backend.common import global_state
from keras.src.backend.common.masking import get_keras_mask

_INFERENCE = threading.local()  # `depth`: how many `no_gradients()` contexts are open
_XLA = threading.local()  # `depth`: how many `xla_tracing()` contexts are open


def _tracer_type():
    import jax

    return jax.core.Tracer


def _jax_tracing() -> bool:
    """Whether a JAX transformation is tracing now: inside `jax.jit` even an op on NumPy
    constants gives a tracer, whose value no Python `bool` can read."""
    try:
        from jax._src.core import trace_state_clean  # 0.3 us: no op
    except ImportError:  # pragma: no cover - a JAX without it: Keras' own test, one op
        import jax.numpy as jnp

        return isinstance(jnp.zeros(()), _tracer_type())
    return not trace_state_clean()


def is_eager(*tensors) -> bool:
    """Whether ops on `tensors` run now, on values (no graph or trace is being built).

    TensorFlow: executing eagerly (not inside a `tf.function`). JAX: no
    tensor is a tracer (inside `jax.jit`, `jax.grad`, `jax.vmap` they are)
    and no transformation is tracing (inside `jax.jit`, ops on NumPy arrays
    or concrete arrays give tracers too). torch: not inside `torch.compile`,
    and no tensor is a meta tensor (Keras' symbolic calls, `compute_output_spec`,
    run on those: shapes, no values). Other backends: `False`.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.executing_eagerly()
    if backend == "jax":
        tracer = _tracer_type()
        return not any(isinstance(t, tracer) for t in tensors) and not _jax_tracing()
    if backend == "torch":
        import torch

        if any(getattr(t, "is_meta", False) for t in tensors):
            return False
        return not torch.compiler.is_compiling()
    return False


def has_values(x) -> bool:
    """Whether `x` itself holds values now, whatever is being traced around it.

    A NumPy array; an eager tensor (`is_eager`); on JAX, an array that is no
    tracer, a constant inside `jax.jit` too (its values are read with NumPy,
    not with ops, which would be traced).
    """
    if isinstance(x, np.ndarray):
        return True
    if isinstance(x, keras.KerasTensor) or getattr(x, "is_meta", False):
        return False  # symbolic (torch's symbolic calls run on meta tensors)
    if keras.backend.backend() == "jax":
        return not isinstance(x, _tracer_type())
    return is_eager(x)


def records_gradients(*tensors) -> bool:
    """Whether the backend may differentiate through ops on `tensors` now.

    `True` whenever it cannot tell: a traced call (a graph may be
    differentiated later), TensorFlow with a `GradientTape` recording, JAX on
    tracers (`jax.grad` traces), torch with gradients enabled and a tensor
    that requires them. `False` for an eager inference call, and for any call
    inside `no_gradients()` (the decoders' loops, eager or traced).
    """
    if getattr(_INFERENCE, "depth", 0):
        return False
    if not is_eager(*tensors):
        return True
    backend = keras.backend.backend()
    if backend == "tensorflow":
        try:
            from tensorflow.python.eager import record
        except ImportError:  # pragma: no cover - a TensorFlow without it: assume a tape
            return True
        return record.could_possibly_record()
    if backend == "torch":
        import torch

        return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)
    return False  # JAX on concrete arrays: no transformation is tracing them


@contextlib.contextmanager
def no_gradients(*layers):
    """A context for code that nothing will differentiate: the zoo's decoding loops.

    Inside it `records_gradients` is `False`, so the kernels build no custom gradient,
    eagerly or in a trace (a `tf.function` or `jax.jit` traced inside it: a traced
    GPT-2-small-sized decoding step has 72 ops fewer); on torch it is also
    `torch.no_grad()`. Without it, eager torch recorded every op of every step for a
    backward pass that never comes, which cost time and, through the kernels' custom
    gradients, kept each call's recorded steps alive after it returned (a
    GPT-2-small-sized model at batch 8: about 1.4 GB more each call). A generator must
    enter it per step, not across its yields (the flag is per thread).

    On torch, the `layers` given (the model a loop decodes) and every layer inside them
    call plainly while it is open (`plain_calls`): the decision is made here, once per
    loop, for the layers the loop runs, and their callers write `layer(x)`.

    Args:
        *layers: the layers or models the code inside runs (torch: see `plain_calls`).
    """
    _INFERENCE.depth = getattr(_INFERENCE, "depth", 0) + 1
    try:
        if keras.backend.backend() == "torch":
            import torch

            with torch.no_grad(), plain_calls(*layers):
                yield
        else:
            yield
    finally:
        _INFERENCE.depth -= 1


@contextlib.contextmanager
def xla_tracing():
    """A context around a trace that XLA will compile (`tf.function(jit_compile=True)`).

    XLA drops TensorFlow's `Assert` ops, logging "Ignoring Assert operator" for each one, so
    in-graph checks (`keras_attn.cache.check_index`) build none inside it. The flag is per
    thread.
    """
    _XLA.depth = getattr(_XLA, "depth", 0) + 1
    try:
        yield
    finally:
        _XLA.depth -= 1


def xla_traced() -> bool:
    """Whether a trace for XLA is under way in this thread (`xla_tracing`)."""
    return getattr(_XLA, "depth", 0) > 0


def adapts_arguments_only(method):
    """Marks a layer's `__call__` override that only adapts its arguments for Keras'
    `__call__` (and then calls it): `plain_calls` may still go straight to `call`."""
    method.adapts_arguments_only = True
    return method


# The layers `plain_calls` holds: id -> [layer, its own class, how many contexts hold it].
_PLAIN: dict[int, list] = {}
_PLAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def plain_calls(*layers):
    """On torch, while it is open, the layers' calls in `no_gradients()` skip Keras' `__call__`
    where it would only call `call`.

    Eager torch runs Keras' `Layer.__call__` in Python on every call: input
    conversion, a call signature bound, the training flag and masks looked up,
    name and autocast scopes, the module's hooks; 120-220 us a call against
    the 50-60 us of a small `Dense` or `LayerNormalization`'s `call` (measured,
    2 cores). A GPT-2-small-sized decoding step calls 147 layers: a quarter to a
    third of its time. `no_gradients(model)` (the decoders' loops) opens this for
    the model it decodes: each layer in `layers` (and in them, recursively; a
    `keras.Model` itself excepted) whose `__call__` is Keras' own or only adapts
    arguments (`adapts_arguments_only`) gets, for the context's duration, a
    subclass of its class whose `__call__` calls `layer.call` (`quantized_call`
    for a quantized layer, as Keras does) in a thread inside `no_gradients()`,
    when Keras' `__call__` would do nothing more than that and set the output
    mask (`_set_mask_metadata`, Keras' own, is called as `__call__` calls it):
    the layer is built; it does not autocast (its compute and variable dtypes
    agree, no autocast scope is open) and no argument needs converting (every
    float tensor is already in the layer's input dtype; no NumPy array); no
    Keras mask needs passing to `call` (only the first argument carries one,
    and `call` has no `mask` or `<first argument>_mask` left to fill), nor is
    dropped with a warning (the layer supports masking, if a mask is given);
    no `training=True`, nor a call-context argument `call` does not take, and no
    outer Keras `__call__` running (its call context would reach the layer); no
    rematerialization, activity regularizer,
    distribution or torch hook (`_calls_plainly`, per call). Anything else,
    another thread, and after the context: Keras' `__call__`. Each layer gets
    its own class back when the last context holding it closes. On TensorFlow
    and JAX (whose decoding steps are traced: `__call__` costs at trace time
    only) it does nothing.
    """
    if keras.backend.backend() != "torch" or not layers:
        yield
        return
    held = []
    with _PLAIN_LOCK:
        for layer in _inner_layers(layers):
            entry = _PLAIN.get(id(layer))
            if entry is None:
                if not _may_call_plainly(type(layer)):
                    continue
                entry = _PLAIN[id(layer)] = [layer, type(layer), 0]
                object.__setattr__(layer, "__class__", _plain_class(type(layer)))
            entry[2] += 1
            held.append(entry)
    try:
        yield
    finally:
        with _PLAIN_LOCK:
            for entry in held:
                entry[2] -= 1
                if not entry[2]:
                    layer, own_class, _ = _PLAIN.pop(id(entry[0]))
                    object.__setattr__(layer, "__class__", own_class)


def _inner_layers(layers):
    """Each distinct layer in `layers` and inside them (models excepted, their layers not)."""
    seen = set()
    for outer in layers:
        for layer in outer._flatten_layers(include_self=True, recursive=True):
            if id(layer) not in seen and not isinstance(layer, keras.Model):
                seen.add(id(layer))
                yield layer


def _may_call_plainly(cls) -> bool:
    """Whether `cls.__call__` is Keras' own or only adapts its arguments."""
    call = cls.__call__
    return call is keras.layers.Layer.__call__ or hasattr(call, "adapts_arguments_only")


@functools.cache
def _plain_class(cls):
    """`cls` with the `__call__` of `plain_calls` (its name, module and methods kept)."""

    def __call__(layer, *args, **kwargs):
        if getattr(_INFERENCE, "depth", 0) and _calls_plainly(layer, args, kwargs):
            return _plain_call(layer, args, kwargs)
        return cls.__call__(layer, *args, **kwargs)  # its own class's, whatever `type(layer)`

    namespace = {"__call__": __call__, "__module__": cls.__module__}
    return type(cls.__name__, (cls,), {**namespace, "__qualname__": cls.__qualname__})


def _plain_call(layer, args, kwargs):
    """`layer.call(*args, **kwargs)` (`quantized_call` if quantized), the output mask set."""
    if getattr(layer, "quantization_mode", None) is not None:
        outputs = layer.quantized_call(*args, **kwargs)
    else:
        outputs = layer.call(*args, **kwargs)
    mask = kwargs.get("mask")
    mask = get_keras_mask(args[0]) if mask is None else mask
    if layer.supports_masking and (mask is not None or _computes_masks(type(layer))):
        layer._set_mask_metadata(args[0], outputs, mask)
    return outputs


def _calls_plainly(layer, args, kwargs) -> bool:
    """Whether Keras' `__call__` of a `plain_calls` layer (torch) would only call `call` with
    these arguments, now."""
    if not args or not getattr(layer, "built", False):
        return False
    if global_state.get_global_attribute("current_call_ctx") is not None:
        return False  # inside an outer Keras `__call__`: its call context (training) is the layer's
    parameters = _parameters(type(layer))
    if any(name in kwargs and name not in parameters for name in layer._call_context_args):
        return False  # Keras drops it (`training` to a `call` without it)
    if kwargs.get("training") or layer.activity_regularizer is not None or layer._remat_mode:
        return False
    if layer.compute_dtype != layer.variable_dtype or _autocast_scope() is not None:
        return False
    import torch
    from torch.nn.modules import module

    if layer._forward_hooks or layer._forward_pre_hooks or torch.compiler.is_compiling():
        return False
    if module._global_forward_hooks or module._global_forward_pre_hooks:
        return False
    if keras.distribution.distribution() is not None:
        return False
    float_dtype = _torch_dtype(layer.input_dtype)
    for i, value in enumerate((*args, *kwargs.values())):
        nested = isinstance(value, (tuple, list, dict))  # a cache, `[query, value]`: one level
        for x in (value.values() if isinstance(value, dict) else value) if nested else (value,):
            if isinstance(x, (np.ndarray, tuple, list, dict)):
                return False  # converted by Keras, or deeper than this looks
            if i < len(args) and not (x is None or torch.is_tensor(x)):
                return False  # Keras refuses it (or lets the layer take it): its message
            if (i or nested) and get_keras_mask(x) is not None:
                return False  # Keras may pass it to `call` as `mask` or `<name>_mask`
            if torch.is_tensor(x) and x.is_floating_point() and x.dtype != float_dtype:
                return False
    if kwargs.get("mask") is not None and not layer.supports_masking:
        return False  # Keras warns that the mask is dropped
    if get_keras_mask(args[0]) is not None:
        if not layer.supports_masking:
            return False  # Keras drops the mask with a warning
        filled = ("mask", f"{parameters[0]}_mask")
        if any(n in parameters and kwargs.get(n) is None for n in filled):
            return False
    return True


@functools.cache
def _parameters(cls):
    """The names of `cls.call`'s parameters (after `self`), in order."""
    return tuple(inspect.signature(cls.call).parameters)[1:]


@functools.cache
def _computes_masks(cls):
    """Whether `cls` overrides `compute_mask` (Keras' own passes the input's mask on)."""
    return cls.compute_mask is not keras.layers.Layer.compute_mask


def _autocast_scope():
    from keras.src.backend.common.variables import get_autocast_scope

    return get_autocast_scope()


@functools.cache
def _torch_dtype(name):
    from keras.src.backend.torch.core import to_torch_dtype

    return to_torch_dtype(name)


def transpose(x, axes):
    """`keras.ops.transpose(x, axes)`, as the cheaper op where a backend has one.

    Eager TensorFlow runs its `Transpose` op through the slow path (the
    permutation converted to a tensor on every call: 180-200 us against 33 us
    for the same permutation written as an einsum, `"abcd->acbd"`; measured on
    2 cores); an eager call of `MultiHeadAttention` makes four or five. On
    torch a tensor's `permute` (Keras' op is the same view after its input
    conversions). Traced, and on JAX, Keras' transpose.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.executing_eagerly() and tf.is_tensor(x) and x.dtype.is_floating:  # no bool einsum
            return tf.einsum(_permutation_subscripts(tuple(axes)), x)
    elif backend == "torch":
        import torch

        if torch.is_tensor(x):  # the view Keras' op makes, without its conversions
            return x.permute(*axes)
    return ops.transpose(x, axes)


@functools.cache
def _permutation_subscripts(axes):
    letters = "abcdefghijklmnopqrstuvwxyz"[: len(axes)]
    return f"{letters}->{''.join(letters[a] for a in axes)}"
