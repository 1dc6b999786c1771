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
import threading

import keras
import numpy as np
from keras import ops

_INFERENCE = threading.local()  # `depth`: how many `no_gradients()` contexts are open


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
def no_gradients():
    """A context for code that nothing will differentiate: the zoo's decoding loops.

    Inside it `records_gradients` is `False`, so the kernels build no custom gradient,
    eagerly or in a trace (a `tf.function` or `jax.jit` traced inside it: a traced
    GPT-2-small-sized decoding step has 72 ops fewer); on torch it is also
    `torch.no_grad()`. Without it, eager torch recorded every op of every step for a
    backward pass that never comes, which cost time and, through the kernels' custom
    gradients, kept each call's recorded steps alive after it returned (a
    GPT-2-small-sized model at batch 8: about 1.4 GB more each call). A generator must
    enter it per step, not across its yields (the flag is per thread).
    """
    _INFERENCE.depth = getattr(_INFERENCE, "depth", 0) + 1
    try:
        if keras.backend.backend() == "torch":
            import torch

            with torch.no_grad():
                yield
        else:
            yield
    finally:
        _INFERENCE.depth -= 1


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
