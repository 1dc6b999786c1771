"""The int8 products of Keras-quantized layers, on paths that read int8 bytes.

`model.quantize("int8")` gives each `Dense`, `EinsumDense` and `ReversibleEmbedding` an
int8 kernel `Wq` with a float32 scale per output channel `s_w`, and an input quantizer
(Keras' `AbsMaxQuantizer`) that quantizes each input row `x` on the fly:

    s_x = 127 / (max|x| + eps),  xq = clip(round(x s_x), -127, 127)      (int8)
    y = (xq @ Wq) / (s_x s_w)                                            (int32 product)

Keras computes `xq @ Wq` with `keras.ops.matmul`, which on torch's CPU casts both operands
to int32 at every call (a float-sized copy of the whole kernel: an int8 model decodes
slower than the float32 one), and under XLA converts the kernel to a float copy before its
product. Here the same function runs on a declared path that reads the int8 kernel as it
lies (`int8_path` chooses):

- `"torch_int_mm"`: torch, CPU tensors: `torch._int_mm(xq, Wq)`, PyTorch's int8 x int8 ->
  int32 matrix product (oneDNN's VNNI kernel on x86): the same int32 product as Keras', so
  the same outputs, bit for bit.

Where no path applies, the layer's own quantized call runs (Keras'): a product that records
gradients (Keras' custom gradient dequantizes the kernel for it), LoRA, a quantizer other
than Keras' default `AbsMaxQuantizer` of `(-127, 127)`, a compute dtype other than float32,
another backend or device. Every path computes Keras' function: the tests compare each one
with the layer's own `quantized_call` and greedy decoding with the eager quantized model.
"""

import math

import keras
from keras import ops

from keras_attn._execution import is_eager, records_gradients

INT8_PATHS = ("torch_int_mm",)


def int8_path(layer, inputs):
    """The path that runs `layer`'s int8 product on `inputs` here, or `None` (Keras' call).

    Args:
        layer: a Keras layer (`Dense`, `keras_attn`'s `MatmulEinsumDense`, a tied
            `ReversibleEmbedding`'s reverse projection).
        inputs: the float inputs of the call.

    Returns:
        A name of `INT8_PATHS`, or `None` where none applies (module docstring).
    """
    if not _keras_int8(layer) or records_gradients(inputs):
        return None
    if keras.backend.backend() == "torch" and is_eager(inputs):
        import torch

        if torch.is_tensor(inputs) and inputs.device.type == "cpu":
            return "torch_int_mm"
    return None


def _keras_int8(layer) -> bool:
    """Whether `layer` is int8-quantized as `quantize("int8")` does by default, float32."""
    if getattr(layer, "quantization_mode", None) != "int8" or getattr(layer, "lora_enabled", 0):
        return False
    quantizer = getattr(layer, "inputs_quantizer", None)
    if type(quantizer) is not keras.quantizers.AbsMaxQuantizer:
        return False
    if tuple(quantizer.value_range) != (-127, 127) or quantizer.output_dtype != "int8":
        return False
    return layer.compute_dtype == "float32"


def int8_project(layer, inputs, contract_axes, outer):
    """`layer`'s int8 call (`Dense` / `MatmulEinsumDense`) on a declared path, or `None`.

    The last `contract_axes` axes of `inputs` are contracted with the kernel read as
    `(inputs, outputs)`; the output is `(*lead, *outer)`, then the bias and the activation,
    as Keras' `_int8_call`.

    Args:
        layer: a quantized `Dense` (`contract_axes=1`) or `MatmulEinsumDense`.
        inputs: float32 `(*lead, *contracted)`.
        contract_axes: how many trailing input axes the kernel contracts.
        outer: the output's trailing shape (the layer's output axes).

    Returns:
        The layer's output, or `None` where no path applies (`int8_path`): the caller runs
        Keras' own call.
    """
    path = int8_path(layer, inputs)
    if path is None or math.prod(layer.kernel_scale.shape) != math.prod(outer):
        return None  # not one scale per output channel
    kernel = _tensor(layer._kernel)  # int8 (*contracted, *outer)
    inner = math.prod(kernel.shape[:contract_axes])
    lead = tuple(inputs.shape[: len(inputs.shape) - contract_axes])
    x2 = ops.reshape(inputs, (-1, inner))  # (M, K)
    w2 = ops.reshape(kernel, (inner, -1))  # (K, N)
    scale = ops.reshape(_tensor(layer.kernel_scale), (-1,))  # (N,)
    y = int8_matmul(x2, w2, scale, layer.inputs_quantizer, path)  # (M, N)
    y = ops.reshape(y, (*lead, *outer))
    if layer.bias is not None:
        y = ops.add(y, layer.bias)
    return y if layer.activation is None else layer.activation(y)


def int8_logits(layer, x):
    """A tied, int8 `ReversibleEmbedding`'s reverse projection of `(B, d)` rows, or `None`.

    `x (B, d) -> (B, V)`: the rows against the int8 `(V, d)` table as it lies, each logit
    divided by its row's scale and the token's (Keras' `_int8_call(reverse=True)`).
    `None` where no path applies, or the layer has a soft cap, a reverse dtype or an untied
    table.
    """
    if not layer.tie_weights or layer.logit_soft_cap is not None or layer.reverse_dtype:
        return None
    path = int8_path(layer, x)
    if path is None:
        return None
    table = _tensor(layer._embeddings)  # int8 (V, d)
    scale = _tensor(layer.embeddings_scale)  # (V,)
    return int8_matmul(x, table, scale, layer.inputs_quantizer, path, transpose_kernel=True)


def quantize_rows(x, quantizer):
    """`(xq, s_x)`: Keras' `AbsMaxQuantizer` of each row of `x` (`(M, K)` float32), its ops.

    `s_x = 127 / (max|x| + eps)` `(M, 1)`, `xq = int8(clip(round(x s_x), -127, 127))`.
    """
    if keras.backend.backend() == "torch":
        import torch

        scale = torch.true_divide(127, x.abs().amax(-1, keepdim=True) + quantizer.epsilon)
        scale = scale.to(x.dtype)
        return torch.clip(torch.round(x * scale), -127, 127).to(torch.int8), scale
    return quantizer(x, axis=-1)


def int8_matmul(x, kernel, kernel_scale, quantizer, path, transpose_kernel=False):
    """`(quantize(x) @ kernel) / (s_x s_w)` on `path`: `x (M, K)` float32 -> `(M, N)`.

    Args:
        x: float32 `(M, K)` rows.
        kernel: int8 `(K, N)`, or `(N, K)` with `transpose_kernel`.
        kernel_scale: float32 `(N,)`: the kernel's scale per output channel.
        quantizer: the layer's input quantizer (Keras' `AbsMaxQuantizer`).
        path: a name of `INT8_PATHS` (`int8_path`).
        transpose_kernel: the kernel is `(N, K)` (a token table).

    Returns:
        float32 `(M, N)`.
    """
    if path not in INT8_PATHS:
        raise ValueError(f"`path` must be one of {INT8_PATHS}. Received: path={path!r}")
    xq, x_scale = quantize_rows(x, quantizer)
    import torch

    y = torch._int_mm(xq, kernel.t() if transpose_kernel else kernel)  # int32 (M, N), exact
    return torch.true_divide(y.to(x.dtype), x_scale * kernel_scale)


def _tensor(variable):
    """The backend tensor a Keras variable holds (no conversion op)."""
    return variable.value if isinstance(variable, keras.Variable) else variable
