"""`loop_kernels`: a TensorFlow decoding loop under XLA reads its projections' kernels once,
before the loop, and keeps a one-row product apart from what follows it; the layers compute
what they compute outside it (a NumPy reference), LoRA and mixed precision included, and a
quantized layer keeps its own path. `generate` at batch 1 decodes through it.
"""

import math

import keras
import numpy as np
import pytest

from keras_attn.matmul_einsum_dense import MatmulDense, MatmulEinsumDense, loop_kernels

rng = np.random.default_rng(0)


def np_(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def projection(kind, policy="float32"):
    """`(layer, input_shape)`: a built layer with random weights (the biases too)."""
    if kind == "dense":
        layer, shape = MatmulDense(6, activation="gelu", dtype=policy), (1, 8)
    elif kind == "in":
        layer = MatmulEinsumDense("btd,dhk->bthk", contract_axes=1, output_shape=(None, 3, 2),
                                  bias_axes="hk", dtype=policy)  # fmt: skip
        shape = (1, 8)
    else:
        layer = MatmulEinsumDense("bthk,hko->bto", contract_axes=2, output_shape=(None, 5),
                                  bias_axes="o", dtype=policy)  # fmt: skip
        shape = (1, 3, 2)
    layer.build((None, *shape))
    layer.set_weights([rng.normal(size=w.shape).astype("float32") for w in layer.weights])
    return layer, shape


def numpy_projection(layer, x):
    """The layer's function in NumPy: the last axes contracted with the kernel, the bias, the
    activation (gelu for the dense one, as Keras' approximate=False)."""
    kernel, n = np_(layer.kernel), layer.contract_axes  # LoRA folded in by the property
    inner = int(np.prod(kernel.shape[:n]))
    lead = x.shape[: x.ndim - n]
    y = x.reshape(-1, inner) @ kernel.reshape(inner, -1) + np_(layer.bias).reshape(-1)
    if isinstance(layer, MatmulDense):
        erf = np.vectorize(math.erf)  # the standard library's: no SciPy in the test venv
        y = 0.5 * y * (1 + erf(y / np.sqrt(2)))
    return y.reshape(*lead, *kernel.shape[n:])


def in_xla_loop(layer, x, out_shape, steps=2):
    """`layer(x)` in the body of a `tf.while_loop` compiled with XLA, inside `loop_kernels`
    entered before the loop; and the ops of the loop's body."""
    import tensorflow as tf

    def run(x):
        with loop_kernels([layer]) as kernels:
            assert list(kernels) == [id(layer)]

            def body(i, y):
                return i + 1, layer(x + tf.cast(i, x.dtype) * 0.0)

            y0 = tf.zeros(out_shape, layer.compute_dtype)
            return tf.while_loop(lambda i, y: i < steps, body, (0, y0))[1]

    function = tf.function(run, jit_compile=True)
    y = function(x)
    graph = function.get_concrete_function(x).graph.as_graph_def()
    body_ops = [node.op for f in graph.library.function for node in f.node_def]
    return y, body_ops


@pytest.mark.tensorflow_only  # XLA's while loop on TensorFlow: the only user of loop_kernels
@pytest.mark.parametrize("kind", ["dense", "in", "out"])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("variant", ["float32", "mixed_bfloat16", "lora"])
def test_loop_kernels_compute_the_layer(kind, rows, variant):
    layer, shape = projection(kind, "mixed_bfloat16" if variant == "mixed_bfloat16" else "float32")
    if variant == "lora":
        layer.enable_lora(2)
        b = layer.lora_kernel_b  # zeros: LoRA would change nothing yet
        b.assign(rng.normal(size=b.shape).astype("float32"))
    x = rng.normal(size=(rows, *shape)).astype("float32")
    expected = numpy_projection(layer, np_(keras.ops.cast(x, layer.compute_dtype)))
    x = keras.ops.convert_to_tensor(x, layer.compute_dtype)
    y, body_ops = in_xla_loop(layer, x, expected.shape)
    atol = 1e-4 if variant != "mixed_bfloat16" else 0.05
    assert str(y.dtype.name) == layer.compute_dtype
    np.testing.assert_allclose(np_(y), expected, atol=atol * np.abs(expected).max())
    # At one row the product is kept apart from the bias (an optimization barrier); at three,
    # XLA's matrix-matrix product is left to fuse as it will.
    assert body_ops.count("XlaOptimizationBarrier") == (rows == 1)


@pytest.mark.tensorflow_only
def test_loop_kernels_read_no_variable_in_the_body():
    """Only the bias is read in the body: the kernel (and LoRA's) come from outside."""
    layer, shape = projection("in")
    layer.enable_lora(2)
    x = rng.normal(size=(1, *shape)).astype("float32")
    _, body_ops = in_xla_loop(layer, keras.ops.convert_to_tensor(x), (1, 1, 3, 2))
    assert body_ops.count("ReadVariableOp") == 1, body_ops  # the bias


@pytest.mark.tensorflow_only
def test_quantized_and_unbuilt_layers_are_left_as_they_are():
    import tensorflow as tf

    quantized, shape = projection("dense")
    x = rng.normal(size=(1, *shape)).astype("float32")
    full = numpy_projection(quantized, x)
    quantized.quantize("int8")
    assert quantized.quantization_mode == "int8"
    unbuilt = MatmulDense(4)

    @tf.function(jit_compile=True)
    def run(x):
        with loop_kernels([quantized, unbuilt, keras.layers.Dense(3)]) as kernels:
            assert kernels == {}
            return quantized(x)

    np.testing.assert_allclose(np_(run(x)), full, atol=0.05 * np.abs(full).max())


def test_loop_kernels_hoist_nothing_eagerly():
    """Outside a traced function (and on JAX and torch, whose loops this is not for) the
    context reads nothing, and the layers run as ever."""
    layer, shape = projection("out")
    x = rng.normal(size=(1, *shape)).astype("float32")
    with loop_kernels([layer]) as kernels:
        assert kernels == {}
        y = np_(layer(x))
    np.testing.assert_allclose(y, numpy_projection(layer, x), atol=1e-4 * np.abs(y).max())


def test_matmul_dense_is_a_dense():
    """The same weights, names and function as Keras' `Dense`; it quantizes as `Dense` does,
    and round-trips through its config."""
    ours = MatmulDense(5, activation="relu", name="d")
    theirs = keras.layers.Dense(5, activation="relu", name="d")
    for layer in (ours, theirs):
        layer.build((None, 4))
    theirs.set_weights([rng.normal(size=w.shape).astype("float32") for w in theirs.weights])
    ours.set_weights(theirs.get_weights())
    assert [w.path for w in ours.weights] == [w.path for w in theirs.weights]
    x = rng.normal(size=(3, 4)).astype("float32")
    np.testing.assert_allclose(np_(ours(x)), np_(theirs(x)), atol=1e-5)
    assert MatmulDense.from_config(ours.get_config()).get_config() == ours.get_config()
    ours.quantize("int8")
    theirs.quantize("int8")
    np.testing.assert_allclose(np_(ours(x)), np_(theirs(x)), atol=1e-5)
