"""The fast dense paths equal the reference paths: fused attention core and matmul projections."""

import keras
import numpy as np
import pytest
from kernel_calls import run

import keras_attn
import layer_checks
from keras_attn import ops
from keras_attn.kernels import chunked_attention, fused_attention
from keras_attn.matmul_einsum_dense import MatmulEinsumDense
from layer_checks import check_fully_masked_rows
from numpy_reference import attend, causal, scaled_dot_scores

rng = np.random.default_rng(0)


def np_(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def qkv(tq=7, tv=9, lead=(2, 3), dk=8, dv=5, dtype="float32"):
    shapes = [(*lead, tq, dk), (*lead, tv, dk), (*lead, tv, dv)]
    return [
        keras.ops.convert_to_tensor(rng.normal(size=s).astype("float32"), dtype) for s in shapes
    ]


def value_and_grads(fn, q, k, v, cotangent, jit=False):
    """NumPy output and d(sum(output * cotangent)) / d(q, k, v)."""
    out, grads = layer_checks.value_and_grads(fn, (q, k, v), (), cotangent, jit=jit)
    return np_(out), [np_(g) for g in grads]


def reference(mask=None, is_causal=False, scale=None):
    return lambda q, k, v: ops.attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale)[0]


def fused(mask=None, is_causal=False, scale=None):
    return lambda q, k, v: run(fused_attention, q, k, v, mask, is_causal, scale=scale)[0]


# -- fused_attention -----------------------------------------------------------


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("tq,tv,is_causal", [(7, 9, False), (7, 9, True), (9, 7, True)])
def test_fused_equals_reference_values_and_gradients(tq, tv, is_causal, jit):
    q, k, v = qkv(tq, tv)
    mask = rng.random((2, 1, tq, tv)) > 0.3
    cotangent = rng.normal(size=(2, 3, tq, 5)).astype("float32")
    for m in (None, mask):
        got, got_grads = value_and_grads(fused(m, is_causal), q, k, v, cotangent, jit)
        ref, ref_grads = value_and_grads(reference(m, is_causal), q, k, v, cotangent)
        np.testing.assert_allclose(got, ref, atol=1e-5)
        for a, b in zip(got_grads, ref_grads, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_fused_matches_numpy_and_key_padding_mask():
    q, k, v = qkv()
    key_padding = np.ones((2, 1, 1, 9), bool)
    key_padding[1, ..., 4:] = False
    out = np_(run(fused_attention, q, k, v, key_padding.astype("int32"), scale=0.5)[0])
    ref, _ = attend(scaled_dot_scores(np_(q), np_(k), 0.5), np_(v), key_padding)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    out = np_(run(fused_attention, q, k, v, is_causal=True)[0])
    ref, _ = attend(scaled_dot_scores(np_(q), np_(k)), np_(v), causal(7, 9))
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_fused_fully_masked_rows_zero_with_zero_finite_gradients():
    q, k, v = qkv()
    mask = rng.random((2, 3, 7, 9)) > 0.5
    mask[0, :, 2] = False
    mask[1, 1] = False
    cotangent = rng.normal(size=(2, 3, 7, 5)).astype("float32")
    out, (dq, dk, dv) = value_and_grads(fused(mask), q, k, v, cotangent)
    ref, ref_grads = value_and_grads(reference(mask), q, k, v, cotangent)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    assert np.all(out[0, :, 2] == 0) and np.all(out[1, 1] == 0)
    assert np.all(dq[0, :, 2] == 0) and np.all(dq[1, 1] == 0)
    assert np.all(dk[1, 1] == 0) and np.all(dv[1, 1] == 0)
    for a, b in zip((dq, dk, dv), ref_grads, strict=True):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fused_low_precision_gradients_as_close_to_float32_as_the_reference(dtype):
    q, k, v = qkv(tq=16, tv=24, dtype=dtype)
    mask = rng.random((2, 1, 16, 24)) > 0.3
    cotangent = rng.normal(size=(2, 3, 16, 5)).astype("float32")
    q32, k32, v32 = (keras.ops.cast(x, "float32") for x in (q, k, v))
    exact = value_and_grads(reference(mask, True), q32, k32, v32, cotangent)
    low_ref = value_and_grads(reference(mask, True), q, k, v, cotangent)
    low_fused = value_and_grads(fused(mask, True), q, k, v, cotangent)
    assert layer_checks.dtype_of(run(fused_attention, q, k, v)[0]) == dtype
    # The fused backward keeps dP and dS in the low dtype (no float32 copies): one more
    # rounding than the reference's, so one unit of that dtype's precision at the scale of
    # the result (bfloat16: 2^-7; float16: 2^-10) on top of twice the reference's error.
    unit = {"bfloat16": 2.0**-7, "float16": 2.0**-10}[dtype]
    for e, r, f in zip([exact[0], *exact[1]], [low_ref[0], *low_ref[1]],
                       [low_fused[0], *low_fused[1]], strict=True):  # fmt: skip
        error_ref, error_fused = np.abs(r - e).max(), np.abs(f - e).max()
        assert error_fused <= 2 * error_ref + unit * np.abs(e).max(), (error_fused, error_ref)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's softmax op")
@pytest.mark.parametrize("jit", [False, True])
def test_fused_bfloat16_softmax_in_place_equals_the_float32_one_rounded(monkeypatch, jit):
    """TensorFlow with oneDNN (the default on x86) takes the softmax of bfloat16 scores in
    bfloat16: oneDNN computes it in float32 and rounds once, so the output and gradients
    are those of the float32 softmax, bit for bit (a fully masked row, NaN at masked
    values). Under XLA the kernel keeps its own float32 softmax."""
    from tensorflow.python.util import _pywrap_util_port

    from keras_attn.kernels import fused as fused_module

    if not _pywrap_util_port.IsMklEnabled():
        pytest.skip("oneDNN is off (TF_ENABLE_ONEDNN_OPTS=0): the kernel casts to float32")
    q, k, v = (np_(x) for x in qkv(tq=16, tv=40))
    mask = rng.random((2, 1, 16, 40)) > 0.3
    mask[..., 32:] = False
    mask[0, :, 3] = False  # a row that sees nothing
    v[..., 32:, :] = np.nan  # masked: changes nothing
    q, k, v = (keras.ops.convert_to_tensor(x, "bfloat16") for x in (q, k, v))
    cotangent = rng.normal(size=(2, 3, 16, 5)).astype("float32")
    taken = []
    original = fused_module._native_bfloat16_softmax
    monkeypatch.setattr(
        fused_module, "_native_bfloat16_softmax", lambda s: taken.append(original(s)) or taken[-1]
    )
    native = value_and_grads(fused(mask, True), q, k, v, cotangent, jit)
    assert taken and all(t is not jit for t in taken)
    monkeypatch.setattr(fused_module, "_native_bfloat16_softmax", lambda s: False)
    rounded = value_and_grads(fused(mask, True), q, k, v, cotangent, jit)
    for a, b in zip([native[0], *native[1]], [rounded[0], *rounded[1]], strict=True):
        assert np.all(np.isfinite(a))
        np.testing.assert_array_equal(a, b)
    assert np.all(native[0][0, :, 3] == 0)
    # float32 values under bfloat16 scores: the float32 softmax, whose weights they take
    v32 = keras.ops.cast(v, "float32")
    assert layer_checks.dtype_of(run(fused_attention, q, k, v32, mask, True)[0]) == "float32"


def test_ops_attention_return_weights_false():
    q, k, v = qkv()
    out, weights = ops.attention(q, k, v, is_causal=True, return_weights=False)
    assert weights is None
    np.testing.assert_allclose(np_(out), np_(reference(None, True)(q, k, v)), atol=1e-5)
    # Active dropout: the reference path, still without weights.
    out, weights = ops.attention(
        q, k, v, dropout_rate=0.5, training=True, seed=3, return_weights=False
    )
    assert weights is None and out.shape == (2, 3, 7, 5)


# -- non-finite keys and values: every path ---------------------------------------

PATHS = {
    "dense": lambda mask: reference(mask),
    "fused": lambda mask: fused(mask),
    "chunked": lambda mask: lambda q, k, v: run(chunked_attention, q, k, v, mask, block_size=4)[0],
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_nonfinite_masked_keys_and_values_change_no_output_and_no_gradient(path):
    q, k, v = (np_(x) for x in qkv())
    mask = np.ones((2, 1, 1, 9), bool)
    mask[0, ..., 6:] = False  # example 0: keys 6, 7, 8 are padding
    bad_k, bad_v = k.copy(), v.copy()
    bad_k[0, :, 7] = np.nan
    bad_v[0, :, 8] = np.inf
    bad_v[0, 1, 6, 0] = -np.inf
    cotangent = rng.normal(size=(2, 3, 7, 5)).astype("float32")
    attend_fn = PATHS[path](mask)
    out, grads = value_and_grads(attend_fn, q, bad_k, bad_v, cotangent)
    ref, ref_grads = value_and_grads(attend_fn, q, k, v, cotangent)
    for a, b in zip([out, *grads], [ref, *ref_grads], strict=True):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_nonfinite_visible_value_makes_the_rows_that_see_it_nan(path):
    q, k, v = (np_(x) for x in qkv())
    v[1, 2, 3, 4] = np.nan  # example 1, head 2, key 3: visible to every row of that head
    out = np_(PATHS[path](None)(q, k, v))
    nan_rows = np.zeros((2, 3, 7), bool)
    nan_rows[1, 2] = True
    assert np.all(np.isnan(out[nan_rows])) and np.all(np.isfinite(out[~nan_rows]))


# -- matmul projections ----------------------------------------------------------


@pytest.mark.parametrize(
    "equation,output_shape,bias_axes,contract,input_shape",
    [
        ("btd,dhk->bthk", (None, 3, 4), "hk", 1, (2, 5, 6)),
        ("bthk,hko->bto", (None, 6), "o", 2, (2, 5, 3, 4)),
    ],
)
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_projection_equals_einsum_dense(
    equation, output_shape, bias_axes, contract, input_shape, policy
):
    kwargs = dict(output_shape=output_shape, bias_axes=bias_axes, dtype=policy)
    ours = MatmulEinsumDense(equation, contract_axes=contract, **kwargs)
    theirs = keras.layers.EinsumDense(equation, **kwargs)
    x = rng.normal(size=input_shape).astype("float32")
    ours.build(input_shape)
    theirs.build(input_shape)
    assert [w.shape for w in ours.weights] == [w.shape for w in theirs.weights]
    theirs.set_weights([rng.normal(size=w.shape).astype("float32") for w in theirs.weights])
    ours.set_weights(theirs.get_weights())
    results = []
    for layer in (ours, theirs):
        y, grads = layer_checks.value_and_grads(layer, [x], layer.trainable_weights)
        assert layer_checks.dtype_of(y) == layer.compute_dtype
        results.append([np_(t) for t in [y, *grads]])
    atol = 1e-4 if policy == "float32" else 0.05
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(a, b, atol=atol * max(1.0, np.abs(b).max()))


@pytest.mark.tensorflow_only  # a tf.function with unknown batch and length
@pytest.mark.parametrize("equation,contract,input_shape", [
    ("btd,dhk->bthk", 1, (2, 5, 6)), ("bthk,hko->bto", 2, (2, 5, 3, 4))])  # fmt: skip
def test_projection_with_dynamic_batch_and_length(equation, contract, input_shape):
    import tensorflow as tf

    output_shape, bias_axes = ((None, 3, 4), "hk") if contract == 1 else ((None, 6), "o")
    layer = MatmulEinsumDense(
        equation, contract_axes=contract, output_shape=output_shape, bias_axes=bias_axes
    )
    x = rng.normal(size=input_shape).astype("float32")
    expected = np_(layer(x))
    spec = tf.TensorSpec((None, None, *input_shape[2:]), "float32")
    dynamic = tf.function(layer, input_signature=[spec])
    np.testing.assert_allclose(np_(dynamic(x)), expected, atol=1e-4 * np.abs(expected).max())
    # The unknown leading sizes are read once: one Shape op, one slice per unknown axis (each
    # op costs trace and compile time, and each projection of every traced layer makes them).
    types = [op.type for op in dynamic.get_concrete_function().graph.get_operations()]
    assert types.count("Shape") == 1 and types.count("StridedSlice") == 2, types


def test_quantized_projection_keeps_the_einsum_path():
    layer = MatmulEinsumDense("btd,dhk->bthk", contract_axes=1, output_shape=(None, 2, 4),
                        bias_axes="hk")  # fmt: skip
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    full = np_(layer(x))
    layer.quantize("int8")
    assert layer.quantization_mode == "int8"
    np.testing.assert_allclose(np_(layer(x)), full, atol=0.1 * np.abs(full).max())


# -- MultiHeadAttention on the fast paths ----------------------------------------


X = rng.normal(size=(2, 6, 12)).astype("float32")
X_MASK = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], bool)


@pytest.mark.parametrize("use_causal_mask", [False, True])
def test_mha_without_weights_equals_mha_with_weights(use_causal_mask):
    """`return_attention_scores=False` runs the fused core; outputs and gradients agree."""
    layer = keras_attn.MultiHeadAttention(num_heads=3, key_dim=4, num_key_value_heads=1)
    layer(X, X)
    kwargs = dict(query_mask=X_MASK, value_mask=X_MASK, use_causal_mask=use_causal_mask)
    results = []
    for scores in (False, True):

        def call(x, scores=scores):
            out = layer(x, x, return_attention_scores=scores, **kwargs)
            return out[0] if scores else out

        out, grads = layer_checks.value_and_grads(call, [X], layer.trainable_weights)
        results.append([np_(t) for t in [out, *grads]])
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
    assert np.all(results[0][0][1, 3:] == 0)  # padded query rows, after the output bias


@pytest.mark.parametrize("jit", [False, True])
def test_mha_fused_path_fully_masked_rows(jit):
    none_visible = X_MASK.copy()
    none_visible[1] = False
    check_fully_masked_rows(
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, implementation="dense"),
        {"query": X, "value": X},
        empty_example=1,
        jit=jit,
        query_mask=X_MASK,
        value_mask=none_visible,
    )


def test_mha_weights_layout_still_equals_keras():
    theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, value_dim=5, output_shape=7)
    ours = keras_attn.MultiHeadAttention(num_heads=2, key_dim=3, value_dim=5, output_shape=7)
    # Keras' einsum path: its fused dot_product_attention needs value_dim == key_dim on JAX.
    theirs(X, X, return_attention_scores=True)
    ours(X, X)
    assert [w.path.split("/")[-2:] for w in ours.weights] == [
        w.path.split("/")[-2:] for w in theirs.weights
    ]
    ours.set_weights(theirs.get_weights())
    theirs_out, _ = theirs(X, X, return_attention_scores=True)
    np.testing.assert_allclose(np_(ours(X, X)), np_(theirs_out), atol=1e-5)


def test_mha_save_and_reload_keeps_the_projections(tmp_path):
    inputs = keras.Input((6, 12))
    outputs = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)(inputs, inputs)
    model = keras.Model(inputs, outputs)
    path = str(tmp_path / "mha.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(np_(reloaded(X)), np_(model(X)), atol=1e-6)
    assert isinstance(reloaded.layers[-1].query_dense, MatmulEinsumDense)
