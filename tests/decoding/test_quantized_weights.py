"""`keras_attn.quantized`: the int8 products of `quantize("int8")`d layers on a declared path.

Each path computes Keras' function (`Dense._int8_call`: inputs quantized per row, an int32
product, rescaled): checked against a NumPy reference of that formula and against the layer's
own Keras call, and greedy decoding against the eager quantized model run through Keras' call
alone. Which path runs is chosen in one place (`int8_path`), refused where it does not apply.
"""

import warnings

import keras
import numpy as np
import pytest

from keras_attn import quantized
from keras_attn._execution import no_gradients
from keras_attn.matmul_einsum_dense import MatmulDense, MatmulEinsumDense
from keras_attn.models import generate, transformer_lm

VOCAB, NEW = 37, 5
PROMPTS = np.array([[5, 6, 7, 8], [10, 3, 9, 2]], "int32")
TORCH = keras.backend.backend() == "torch"


def np_(x):
    return keras.ops.convert_to_numpy(x)


def quantized_lm():
    keras.utils.set_random_seed(0)
    model = transformer_lm(
        VOCAB, num_layers=2, num_heads=2, d_model=16, intermediate_dim=32, dropout=0.0
    )
    with warnings.catch_warnings():  # layers without int8 weights (norms) say so
        warnings.simplefilter("ignore", UserWarning)
        model.quantize("int8")
    return model


def keras_int8(x, kernel, kernel_scale, eps=1e-7):
    """NumPy: Keras' int8 product, `(round(x s_x) @ Wq) / (s_x s_w)` with `s_x` per row
    (`eps`: Keras' default `keras.config.epsilon()`)."""
    x = x.reshape(x.shape[0], -1).astype("float32")
    scale = (np.float32(127) / (np.abs(x).max(-1, keepdims=True) + np.float32(eps))).astype(
        "float32"
    )
    xq = np.clip(np.round(x * scale), -127, 127).astype("int32")
    y = xq @ kernel.reshape(x.shape[1], -1).astype("int32")  # exact
    return y.astype("float32") / (scale * kernel_scale.reshape(-1))


def layers_of(model):
    kinds = (MatmulDense, MatmulEinsumDense)
    return [layer for layer in model._flatten_layers() if isinstance(layer, kinds)]


def inputs_for(layer, rows):
    """`(rows, 1, *contracted)` random inputs for `layer` (one decoding step's)."""
    shape = (rows, 1, *layer._kernel.shape[: layer.contract_axes])
    return np.random.default_rng(rows).normal(size=shape).astype("float32")


@pytest.mark.parametrize("rows", [1, 3])
def test_each_projection_computes_keras_int8_function(rows):
    """Every quantized projection (q, k, v, output, feed-forward), on the path this backend
    chooses: the NumPy formula, and Keras' own `_int8_call` (exactly on torch: the same
    int32 product)."""
    model = quantized_lm()
    with no_gradients():
        for layer in layers_of(model):
            x = inputs_for(layer, rows)
            outputs = np_(layer(keras.ops.convert_to_tensor(x)))
            kernel, scale = np_(layer._kernel), np_(layer.kernel_scale)
            expected = keras_int8(x.reshape(rows, -1), kernel, scale) + np_(layer.bias).reshape(-1)
            if layer.activation is not None:  # the feed-forward's gelu: not what is tested here
                expected = np_(layer.activation(keras.ops.convert_to_tensor(expected)))
            np.testing.assert_allclose(outputs.reshape(rows, -1), expected, rtol=1e-5, atol=1e-5)
            keras_call = super(type(layer), layer)._int8_call(keras.ops.convert_to_tensor(x))
            tolerance = 0 if TORCH else 1e-6
            np.testing.assert_allclose(outputs, np_(keras_call), rtol=tolerance, atol=tolerance)


def test_logits_of_the_int8_table():
    """The tied int8 token table's reverse projection: Keras' formula with a scale per token."""
    model = quantized_lm()
    table = model.get_layer("token_embedding")
    x = np.random.default_rng(0).normal(size=(3, 16)).astype("float32")
    with no_gradients():
        logits = quantized.int8_logits(table, keras.ops.convert_to_tensor(x))
        reference = table(keras.ops.convert_to_tensor(x[:, None]), reverse=True)[:, 0]
    if not TORCH:
        assert logits is None  # no path here: the layer's own call
        return
    expected = keras_int8(x, np_(table._embeddings).T, np_(table.embeddings_scale))
    np.testing.assert_allclose(np_(logits), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np_(logits), np_(reference))


def test_path_choice():
    """Declared and refused: torch's `_int_mm` for Keras' default int8 layers at inference;
    no path for a float layer, LoRA, another input quantizer, or a product that records
    gradients; none on TensorFlow and JAX."""
    model = quantized_lm()
    layer = layers_of(model)[0]
    x = keras.ops.convert_to_tensor(inputs_for(layer, 1))
    with no_gradients():
        assert quantized.int8_path(layer, x) == ("torch_int_mm" if TORCH else None)
        float_layer = MatmulDense(4)
        float_layer.build((None, 16))
        assert quantized.int8_path(float_layer, x) is None
        lora = quantized_lm()
        lora_layer = layers_of(lora)[0]
        lora_layer.enable_lora(2)
        assert quantized.int8_path(lora_layer, x) is None
        other = quantized_lm()
        other_layer = layers_of(other)[0]
        other_layer.inputs_quantizer = keras.quantizers.AbsMaxQuantizer(value_range=(-8, 7))
        assert quantized.int8_path(other_layer, x) is None
    if TORCH:
        import torch

        recorded = torch.tensor(np_(x), requires_grad=True)  # a backward pass may follow
        assert quantized.int8_path(layer, recorded) is None
    with pytest.raises(ValueError, match="path="):
        quantized.int8_matmul(x, layer._kernel, layer.kernel_scale, None, "fast")


def test_greedy_tokens_equal_the_eager_quantized_model(monkeypatch):
    """`generate` with the paths gives the tokens of the eager quantized model run through
    Keras' own int8 calls (every path refused), token by token over the uncached full pass."""
    model = quantized_lm()
    tokens = generate(model, PROMPTS, NEW, jit_compile=False)
    monkeypatch.setattr(quantized, "int8_path", lambda layer, inputs: None)
    rows = [list(prompt) for prompt in PROMPTS]
    for _ in range(NEW):
        logits = np_(model(np.array(rows, "int32")))[:, -1]
        logits[:, 0] = -np.inf  # padding is never generated
        rows = [row + [int(t)] for row, t in zip(rows, logits.argmax(-1), strict=True)]
    expected = np.array([row[-NEW:] for row in rows], "int32")
    np.testing.assert_array_equal(tokens, expected)
    np.testing.assert_array_equal(generate(model, PROMPTS, NEW, jit_compile=False), tokens)
