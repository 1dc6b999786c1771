"""`MatmulEinsumDense`: the `EinsumDense` of the multi-head projections, run as one 2-D matmul."""

import math

import keras
from keras import ops

from keras_attn._execution import is_eager


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
        n = self.contract_axes
        kernel = ops.cast(self.kernel, self.compute_dtype)
        inner, outer = kernel.shape[:n], kernel.shape[n:]
        flat = (math.prod(inner), math.prod(outer))
        y = ops.matmul(ops.reshape(inputs, (-1, flat[0])), ops.reshape(kernel, flat))
        if self.bias is not None:
            y = y + ops.reshape(ops.cast(self.bias, self.compute_dtype), (flat[1],))
        lead = ops.shape(inputs)[:-n]  # one shape op (per axis, each call would add one)
        y = ops.reshape(y, (*lead, *outer))
        return y if self.activation is None else self.activation(y)
