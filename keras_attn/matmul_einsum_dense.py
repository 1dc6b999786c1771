"""The projections as 2-D matmuls, and their kernels hoisted out of a decoding loop.

`MatmulEinsumDense` is the `EinsumDense` of the multi-head projections, run as
one 2-D matmul; `MatmulDense` is the `Dense` of the feed-forward sublayers.

`loop_kernels(layers)`: the context in which a TensorFlow decoding loop
compiled with XLA is traced (`keras_attn.models.generate`). Entering it reads
each layer's kernel as the 2-D matrix its product takes (cast to the compute
dtype, LoRA folded in), once, outside the loop's body; the body's calls take
those matrices. At one row a call also keeps its product apart from what
follows it (an XLA optimization barrier). Why: XLA on the CPU turns a
matrix-vector product into a plain loop when it can fuse it with the reshape of
its matrix (the `(d, h, k)` kernel read as `(d, h k)` inside the body) or with
the bias added after it, and that loop reads the weights several times slower
than XLA's own matrix-vector kernel (`python -m benchmarks.profile matvec`).
Hoisted and kept apart, a GPT-2-small-sized decoding step at batch 1 reads its
weights at 95 % of this machine's copy bandwidth, 1.3x keras-hub's step
(benchmarks/README.md, "The roofline").
"""

import contextlib
import math
import threading

import keras
from keras import ops

from keras_attn import quantized
from keras_attn._execution import is_eager

_LOOP = threading.local()  # `kernels`: {id(layer): 2-D kernel} inside `loop_kernels`


@contextlib.contextmanager
def loop_kernels(layers):
    """Within it, `layers`' calls take 2-D kernels read here, and keep a one-row product apart.

    For a TensorFlow loop compiled with XLA: enter it inside the compiled
    function, before the loop, and trace the loop's body within it. Every
    built, unquantized `MatmulEinsumDense` and `MatmulDense` among `layers`
    (others are left as they are) has its kernel read now: cast to the
    layer's compute dtype and reshaped to `(inputs, outputs)`, LoRA included,
    so a loop reads the same values as a call would. Another backend, or a
    call outside a traced function, gets no kernels: the layers run as ever.

    Args:
        layers: the layers to read (e.g. `model._flatten_layers()`).
    """
    kernels = {}
    if keras.backend.backend() == "tensorflow" and not is_eager():
        for layer in layers:
            if isinstance(layer, (MatmulEinsumDense, MatmulDense)) and layer.built:
                if layer.quantization_mode is None:
                    kernels[id(layer)] = _matrix(layer)
    previous = getattr(_LOOP, "kernels", None)
    _LOOP.kernels = kernels
    try:
        yield kernels
    finally:
        _LOOP.kernels = previous


def _matrix(layer):
    """`layer`'s kernel in its compute dtype as `(inputs, outputs)`."""
    kernel = ops.cast(layer.kernel, layer.compute_dtype)
    return ops.reshape(kernel, (math.prod(kernel.shape[: layer.contract_axes]), -1))


def _loop_kernel(layer):
    """`layer`'s kernel read by `loop_kernels`, or `None` outside it."""
    kernels = getattr(_LOOP, "kernels", None)
    return None if not kernels else kernels.get(id(layer))


def _project(layer, inputs, outer):
    """`layer`'s function as one 2-D matmul: its last `contract_axes` input axes contracted
    with its kernel (the one `loop_kernels` read, if any), the bias, the activation; the
    output `(*lead, *outer)`. Under `loop_kernels`, a one-row product sits behind an XLA
    optimization barrier."""
    hoisted = _loop_kernel(layer)
    kernel = _matrix(layer) if hoisted is None else hoisted
    x2 = ops.reshape(inputs, (-1, kernel.shape[0]))
    y = ops.matmul(x2, kernel)
    if hoisted is not None and x2.shape[0] == 1:
        from tensorflow.compiler.tf2xla.python import xla  # TensorFlow's XLA ops

        # Nothing fuses into the matrix-vector product from either side (module docstring).
        (y,) = xla.optimization_barrier(y)
    if layer.bias is not None:
        y = y + ops.reshape(ops.cast(layer.bias, layer.compute_dtype), (kernel.shape[1],))
    # One shape op for the leading axes (one per axis would add an op to every call).
    lead = ops.shape(inputs)[: -layer.contract_axes]
    y = ops.reshape(y, (*lead, *outer))
    return y if layer.activation is None else layer.activation(y)


class MatmulEinsumDense(keras.layers.EinsumDense):
    """An `EinsumDense` contracting the last `n` input axes, run as one 2-D matmul.

    `"btd,dhk->bthk"` is `(B T, d) x (d, h k)` and `"bthk,hko->bto"` is
    `(B T, h k) x (h k, o)`: the same kernel, bias and weight layout as the
    `EinsumDense` (and Keras' multi-head attention), but a plain matmul whose
    gradients are plain matmuls too, where TF's einsum transposes. Measured
    on a whole MHA training step: 5-15 % faster. The activation, LoRA
    (through `kernel`) and the regularizers are those of `EinsumDense`; a
    quantized layer keeps `EinsumDense.call`.

    An eager call (`keras_attn._execution.is_eager`: TensorFlow outside
    `tf.function`, torch, concrete JAX arrays) runs `EinsumDense.call` too:
    one einsum costs fewer op dispatches than three reshapes and a matmul,
    and eagerly the dispatches are most of a small call's time.
    """

    def __init__(self, equation, contract_axes, **kwargs):
        super().__init__(equation, **kwargs)
        self.contract_axes = contract_axes

    def quantize(self, mode=None, type_check=True, config=None):
        # EinsumDense refuses subclasses; quantized, this layer runs EinsumDense.call.
        super().quantize(mode, type_check=False, config=config)

    def call(self, inputs, training=None):
        if self.quantization_mode is not None or is_eager(inputs):
            return super().call(inputs, training=training)
        # The variable's shape: `kernel` would compute LoRA's product again.
        return _project(self, inputs, self._kernel.shape[self.contract_axes :])

    def _int8_call(self, inputs, training=None):
        outer = self._kernel.shape[self.contract_axes :]
        y = quantized.int8_project(self, inputs, self.contract_axes, outer)
        return super()._int8_call(inputs, training=training) if y is None else y


class MatmulDense(keras.layers.Dense):
    """A Keras `Dense` whose calls inside `loop_kernels` take the kernel read there.

    Elsewhere, and quantized, it is `Dense` itself: the same weights, names
    and results. Inside `loop_kernels` (a TensorFlow decoding loop under XLA)
    the product takes the hoisted kernel, and at one row it is kept apart from
    the bias and activation that follow (module docstring).
    """

    contract_axes = 1  # the last input axis, as `MatmulEinsumDense`'s `contract_axes`

    def quantize(self, mode=None, type_check=True, config=None):
        # Dense refuses subclasses; quantized, this layer runs Dense's quantized calls.
        super().quantize(mode, type_check=False, config=config)

    def call(self, inputs, training=None):
        if self.quantization_mode is not None or _loop_kernel(self) is None:
            return super().call(inputs, training=training)
        return _project(self, inputs, (self.units,))

    def _int8_call(self, inputs, training=None):
        y = quantized.int8_project(self, inputs, 1, (self.units,))
        return super()._int8_call(inputs, training=training) if y is None else y
