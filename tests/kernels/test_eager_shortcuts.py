"""The eager shortcuts change no value: what a call skips when its values are known.

An eager call skips the non-finite guard on finite inputs, the custom gradient when nothing
records gradients, the row zeroing when static lengths say every row sees a key, and builds
its position masks as a cached NumPy constant (keras_attn._execution, masks.position_mask,
masks.position_rows_visible). Each shortcut is checked against the path it replaces: a brute
force over the positions, the traced (compiled) call, and the gradient under a tape.
"""

import contextlib
import itertools

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _execution, masks
from keras_attn.kernels import _gradient

rng = np.random.default_rng(11)


def np_(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def brute_force_rows(tq, tv, is_causal, window, start):
    """Row i sees key j iff (causal: j <= p_i) and (window: |p_i - j| < window), p_i = start + i."""
    start = tv - tq if start is None else start
    rows = []
    for i in range(tq):
        p = start + i
        rows.append(
            any(
                (not is_causal or j <= p) and (window is None or abs(p - j) < window)
                for j in range(tv)
            )
        )
    return np.array(rows, bool)


CASES = list(itertools.product((0, 1, 3, 6), (0, 1, 4, 6), (False, True), (None, 2), (None, 3, -2)))


@pytest.mark.parametrize("tq,tv,is_causal,window,start", CASES)
def test_position_rows_visible_is_true_exactly_when_every_row_sees_a_key(
    tq, tv, is_causal, window, start
):
    expected = brute_force_rows(tq, tv, is_causal, window, start).all()
    assert masks.position_rows_visible(tq, tv, is_causal, window, start) == bool(expected)


@pytest.mark.parametrize("tq,tv,is_causal,window,start", [c for c in CASES if c[2] or c[3]])
def test_the_constant_position_mask_equals_the_built_one(tq, tv, is_causal, window, start):
    def check(constant, built):
        if constant is None:  # masks nothing: no mask
            assert np.all(np_(built))
        else:
            np.testing.assert_array_equal(np_(constant), np_(built))

    built = masks.position_mask(tq, tv, is_causal, window, start)
    check(masks.position_mask(tq, tv, is_causal, window, start, constant=True), built)
    # A block of keys (the chunked kernel's key_start) too.
    built = masks.position_mask(tq, tv, is_causal, window, start, key_start=2)
    check(masks.position_mask(tq, tv, is_causal, window, start, key_start=2, constant=True), built)


def test_the_constant_position_mask_of_one_query_at_the_end_is_none():
    assert masks.position_mask(1, 5, True, constant=True) is None  # it sees every key
    assert masks.position_mask(1, 5, True, 2, constant=True) is not None
    assert masks.position_mask(1, 5, True) is not None  # built: traced calls keep the op


def test_lengths_known_only_at_run_time_are_never_called_visible():
    length = keras.ops.convert_to_tensor(4)
    assert not masks.position_rows_visible(length, 4, True)
    assert not masks.position_rows_visible(4, 4, True, query_start=length)


@pytest.fixture
def custom_gradient_calls(monkeypatch):
    """The functions the kernels wrap in `keras.ops.custom_gradient`, as they are wrapped."""
    calls = []
    original = keras.ops.custom_gradient

    def counting(fun):
        calls.append(fun)
        return original(fun)

    monkeypatch.setattr(_gradient.ops, "custom_gradient", counting)
    return calls


def test_an_eager_inference_call_skips_the_custom_gradient_and_a_taped_one_does_not(
    custom_gradient_calls,
):
    calls = custom_gradient_calls
    x = keras.ops.convert_to_tensor(rng.normal(size=(2, 5, 8)).astype("float32"))
    layer = keras_attn.MultiHeadAttention(2, 4, implementation="fused")
    layer(x, x)
    calls.clear()
    with _inference():  # torch records whatever touches a weight, unless told not to
        eager = layer(x, x, use_causal_mask=True)
    assert calls == []  # nothing records gradients: the forward pass alone
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch(x)
            taped = layer(x, x, use_causal_mask=True)
            loss = keras.ops.sum(taped)
            assert _execution.records_gradients(x)
        assert calls  # the custom gradient, as before
        grad = tape.gradient(loss, x)
        assert np.isfinite(np_(grad)).all()
        np.testing.assert_allclose(np_(taped), np_(eager), atol=1e-6)


@pytest.mark.parametrize("implementation", ["dense", "fused"])
def test_a_call_inside_no_gradients_builds_no_custom_gradient_traced_too(
    custom_gradient_calls, implementation
):
    """The decoders' loops run inside `no_gradients()`: traced there (a `tf.function`, a
    `jax.jit`), the kernels skip their custom gradients, with the same values; outside
    it a trace keeps them (it may be differentiated later), and the flag is reset."""
    calls = custom_gradient_calls
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    layer = keras_attn.MultiHeadAttention(2, 4, implementation=implementation)
    layer(x, x)
    calls.clear()
    call = lambda x: layer(x, x, use_causal_mask=True)  # noqa: E731
    with _execution.no_gradients():
        assert not _execution.records_gradients(keras.ops.convert_to_tensor(x))
        inside = _compiled(call)(x)
    assert calls == []
    if keras.backend.backend() != "torch":  # traced: gradients may be taken later
        outside = _compiled(lambda x: call(x))(x)  # a new function: jax.jit traces again
        assert calls
        np.testing.assert_allclose(np_(inside), np_(outside), atol=1e-6)
    else:  # eager torch: a weight records again
        assert _execution.records_gradients(layer.trainable_weights[0].value)


@pytest.mark.parametrize("implementation", ["dense", "fused", "chunked"])
def test_eager_equals_compiled_with_and_without_nonfinite_padding(implementation):
    """Finite inputs skip the guard eagerly; a NaN at a padded key takes it; traced, it stays."""
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    mask = np.ones((2, 6), bool)
    mask[1, 4:] = False
    hostile = x.copy()
    hostile[1, 4:] = np.nan
    layer = keras_attn.MultiHeadAttention(2, 4, implementation=implementation)
    layer(x, x)
    for value in (x, hostile):
        eager = layer(x, value, value_mask=mask, use_causal_mask=True)
        traced = _compiled(lambda v: layer(x, v, value_mask=mask, use_causal_mask=True))(value)
        assert np.isfinite(np_(eager)).all()
        np.testing.assert_allclose(np_(eager), np_(traced), atol=1e-5)


def test_a_nan_at_a_visible_key_still_reaches_the_rows_that_see_it_eagerly():
    q = rng.normal(size=(1, 1, 4, 8)).astype("float32")
    k = q.copy()
    k[0, 0, 2, 0] = np.nan
    out, _ = keras_attn.ops.attention(q, k, q, is_causal=True, return_weights=False)
    rows = np.isnan(np_(out)[0, 0]).any(axis=-1)
    np.testing.assert_array_equal(rows, [False, False, True, True])  # rows 2, 3 see key 2


def test_a_block_without_any_mask_equals_the_block_with_an_all_true_mask():
    x = keras.ops.convert_to_tensor(rng.normal(size=(2, 5, 16)).astype("float32"))
    block = keras_attn.TransformerDecoder(32, 2)
    plain = block(x)
    masked = block(x, decoder_padding_mask=np.ones((2, 5), bool))
    np.testing.assert_allclose(np_(plain), np_(masked), atol=1e-6)
    # The implicit Keras mask still counts: as if passed explicitly, not as no mask.
    tokens = np.array([[3, 4, 5, 0, 0], [1, 2, 3, 4, 5]])
    embedded = keras.layers.Embedding(8, 16, mask_zero=True)(tokens)
    out = np_(block(embedded))
    explicit = np_(block(embedded, decoder_padding_mask=tokens != 0))
    unmasked = np_(block(keras.ops.convert_to_tensor(np_(embedded))))
    np.testing.assert_allclose(out, explicit, atol=1e-6)
    assert not np.allclose(out[0], unmasked[0], atol=1e-3)


def _inference():
    if keras.backend.backend() == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


def _compiled(fn):
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    if backend == "jax":
        import jax

        return jax.jit(fn)
    return fn  # torch: eager only


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_all_finite_is_numpys_isfinite_and_an_overflowing_sum_takes_the_guard(dtype):
    from keras_attn.kernels import finite

    big = np.full((2, 3, 4), 6e4 if dtype == "float16" else 3e38, dtype)  # their sum overflows
    for a, b in [(big, big), (big, np.ones_like(big))]:
        for bad in (None, np.nan, np.inf, -np.inf):
            a = a.copy()
            if bad is not None:
                a[1, 2, 3] = bad
            expected = bool(np.isfinite(a).all() and np.isfinite(b).all())
            # In float32 a sum of finite entries may overflow ("not finite": the guard runs);
            # a non-finite entry is never called finite.
            if dtype == "float16" or not expected:
                assert finite.all_finite(a, b) == expected
            value, key, flag = finite.zero_nonfinite(b, a)
            if bad is None:  # nothing zeroed, whichever path ran
                np.testing.assert_array_equal(np_(key), a.astype("float32"))
            else:
                assert flag is not None and np_(flag)[1, 2, 0] == 1
                assert np_(key)[1, 2, 3] == 0


def test_a_symbolic_torch_call_takes_the_guard_not_the_eager_shortcut():
    """Keras' symbolic calls on torch (`compute_output_spec`) run on meta tensors, which hold no
    values: `is_eager` says so, and the non-finite guard builds its ops instead of reading a
    value. (`.item()` on a meta tensor raised, and Keras ran the call again on real tensors.)"""
    if keras.backend.backend() != "torch":
        pytest.skip("meta tensors are torch's")
    import torch

    assert not _execution.is_eager(torch.empty((2, 5, 4), device="meta"))
    assert _execution.is_eager(torch.ones(2))
    runs = []

    class Attend(keras.layers.Layer):  # no compute_output_spec: Keras runs `call` symbolically
        def call(self, q):
            runs.append(q.is_meta)
            return keras_attn.ops.attention(q, q, q, is_causal=True, return_weights=False)[0]

    output = Attend()(keras.Input((3, 4), batch_size=2))  # a functional model's first step
    assert tuple(output.shape) == (2, 3, 4)
    assert runs == [True]  # once, on meta tensors: no second run on real ones


@pytest.mark.parametrize("axes", [(0, 2, 1, 3), (0, 1, 3, 2), (3, 1, 0, 2), (1, 0)])
def test_transpose_is_numpys_eagerly_traced_and_on_arrays(axes):
    """`_execution.transpose` (an einsum on eager TensorFlow) permutes as `np.transpose` does."""
    x = rng.normal(size=(2, 3, 4, 5)[: len(axes)]).astype("float32")
    expected = np.transpose(x, axes)
    tensor = keras.ops.convert_to_tensor(x)
    casts = [keras.ops.cast(x, dtype) for dtype in ("float16", "bfloat16", "float64", "int32")]
    for value in (x, tensor, tensor > 0, *casts):
        got = _execution.transpose(value, axes)
        assert tuple(got.shape) == expected.shape
        np.testing.assert_array_equal(np_(got), np.transpose(np_(value), axes))
    if keras.backend.backend() == "tensorflow":  # traced: the graph's own transpose
        import tensorflow as tf

        traced = tf.function(lambda v: _execution.transpose(v, axes))
        np.testing.assert_array_equal(np_(traced(x)), expected)
