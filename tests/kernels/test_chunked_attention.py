"""The chunked (online-softmax) attention path equals the dense path: values and gradients."""

import dataclasses
import itertools

import keras
import numpy as np
import pytest
from kernel_calls import run

import keras_attn
from keras_attn import kernels, ops
from keras_attn.kernels.chunked import block_size_for, chunked_attention
from layer_checks import compiled, dtype_of, value_and_grads
from numpy_reference import attend, causal, scaled_dot_scores

rng = np.random.default_rng(0)


def np_(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def qkv(tq=37, tv=45, lead=(2, 3), dk=8, dv=5, dtype="float32"):
    q = rng.normal(size=(*lead, tq, dk)).astype("float32")
    k = rng.normal(size=(*lead, tv, dk)).astype("float32")
    v = rng.normal(size=(*lead, tv, dv)).astype("float32")
    return [keras.ops.convert_to_tensor(x, dtype) for x in (q, k, v)]


def dense(mask=None, is_causal=False):
    return lambda q, k, v: ops.attention(q, k, v, mask=mask, is_causal=is_causal)[0]


def chunked(mask=None, is_causal=False, block_size=16):
    return lambda q, k, v: run(chunked_attention, q, k, v, mask, is_causal, block_size=block_size)[
        0
    ]


def assert_same(q, k, v, mask=None, is_causal=False, block_size=16, atol=1e-5):
    cotangent = rng.normal(size=q.shape[:-1] + v.shape[-1:]).astype("float32")
    out_c, grads_c = value_and_grads(chunked(mask, is_causal, block_size), (q, k, v), (), cotangent)
    out_d, grads_d = value_and_grads(dense(mask, is_causal), (q, k, v), (), cotangent)
    np.testing.assert_allclose(np_(out_c), np_(out_d), atol=atol, rtol=atol)
    for name, a, b in zip("qkv", grads_c, grads_d, strict=True):
        assert a.dtype == b.dtype, name
        np.testing.assert_allclose(np_(a), np_(b), atol=atol, rtol=atol, err_msg=f"d{name}")
    return np_(out_c), [np_(g) for g in grads_c]


@pytest.mark.parametrize("block_size", [1, 16, 45, 64])
def test_no_mask_equals_dense_values_and_gradients(block_size):
    assert_same(*qkv(), block_size=block_size)


def test_matches_numpy_reference():
    q, k, v = qkv()
    mask = rng.random((2, 1, 37, 45)) > 0.3
    out = np_(run(chunked_attention, q, k, v, mask=mask, is_causal=True, block_size=8)[0])
    ref, _ = attend(scaled_dot_scores(np_(q), np_(k)), np_(v), mask & causal(37, 45))
    np.testing.assert_allclose(out, ref, atol=1e-5)


# Tq != Tv (the end alignment) on TensorFlow and torch only (`jax_slow`): the same loop as Tq == Tv.
@pytest.mark.parametrize(
    "tq,tv",
    [
        (37, 37),
        pytest.param(20, 45, marks=pytest.mark.jax_slow),
        pytest.param(45, 20, marks=pytest.mark.jax_slow),
    ],
)
def test_causal_end_aligned(tq, tv):
    assert_same(*qkv(tq, tv), is_causal=True)


def test_key_padding_mask_general_mask_and_scale():
    q, k, v = qkv()
    key_padding = np.ones((2, 1, 1, 45), bool)
    key_padding[1, ..., 30:] = False
    assert_same(q, k, v, mask=keras.ops.convert_to_tensor(key_padding))
    general = rng.random((2, 3, 37, 45)) > 0.5
    assert_same(q, k, v, mask=keras.ops.convert_to_tensor(general), is_causal=True)
    out, _ = run(chunked_attention, q, k, v, mask=general.astype("int32"), scale=0.3, block_size=7)
    ref = ops.attention(q, k, v, mask=general, scale=0.3)[0]
    np.testing.assert_allclose(np_(out), np_(ref), atol=1e-5)


def test_fully_masked_rows_give_zeros_and_finite_zero_gradients():
    q, k, v = qkv()
    mask = rng.random((2, 3, 37, 45)) > 0.5
    mask[0, :, 5] = False  # one query row sees nothing
    mask[1, 2] = False  # a whole (batch, head) sees nothing
    out, grads = assert_same(q, k, v, mask=keras.ops.convert_to_tensor(mask))
    assert np.all(out[0, :, 5] == 0) and np.all(out[1, 2] == 0)
    assert all(np.all(np.isfinite(g)) for g in grads)
    dq, dk, dv = grads
    assert np.all(dq[0, :, 5] == 0) and np.all(dq[1, 2] == 0)
    assert np.all(dk[1, 2] == 0) and np.all(dv[1, 2] == 0)


def test_large_scores_do_not_overflow():
    q, k, v = qkv(tq=9, tv=20)
    out, grads = assert_same(q * 40.0, k * 40.0, v, atol=1e-4)
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize(
    "policy_dtype", [pytest.param("bfloat16", marks=pytest.mark.jax_slow), "float16"]
)
def test_low_precision_inputs_close_to_dense(policy_dtype):
    q, k, v = qkv(dtype=policy_dtype)
    mask = keras.ops.convert_to_tensor(rng.random((2, 1, 37, 45)) > 0.3)
    out_c, _ = run(chunked_attention, q, k, v, mask, is_causal=True, block_size=16)
    out_d = ops.attention(q, k, v, mask=mask, is_causal=True)[0]
    assert dtype_of(out_c) == policy_dtype
    np.testing.assert_allclose(np_(out_c), np_(out_d), atol=3e-2)
    # Against float32 math on the same (rounded) inputs: the accumulators are float32.
    q32, k32, v32 = (keras.ops.cast(x, "float32") for x in (q, k, v))
    ref = ops.attention(q32, k32, v32, mask=mask, is_causal=True)[0]
    np.testing.assert_allclose(np_(out_c), np_(ref), atol=3e-2)
    # Gradients: no further from float32 math than the dense path's (both ~1 % of the max).
    cotangent = rng.normal(size=(2, 3, 37, 5)).astype("float32")
    _, exact = value_and_grads(dense(mask, True), (q32, k32, v32), (), cotangent)
    _, low_dense = value_and_grads(dense(mask, True), (q, k, v), (), cotangent)
    _, low_chunked = value_and_grads(chunked(mask, True), (q, k, v), (), cotangent)
    for e, d, c in zip(exact, low_dense, low_chunked, strict=True):
        e, d, c = np_(e), np_(d), np_(c)
        error_dense, error_chunked = np.abs(d - e).max(), np.abs(c - e).max()
        assert error_chunked <= 2 * error_dense + 1e-3 * np.abs(e).max(), (
            error_chunked,
            error_dense,
        )


def test_eager_and_jit():
    q, k, v = qkv()
    expected = np_(dense(is_causal=True)(q, k, v))
    np.testing.assert_allclose(np_(chunked(is_causal=True)(q, k, v)), expected, atol=1e-5)
    jit = compiled(chunked(is_causal=True))
    np.testing.assert_allclose(np_(jit(q, k, v)), expected, atol=1e-5)


@pytest.mark.tensorflow_only  # a tf.function with unknown lengths
def test_dynamic_length():
    import tensorflow as tf

    q, k, v = qkv()
    expected = np_(dense(is_causal=True)(q, k, v))
    spec = [tf.TensorSpec((None, 3, None, width), "float32") for width in (8, 8, 5)]
    dynamic = tf.function(chunked(is_causal=True), input_signature=spec)
    np.testing.assert_allclose(np_(dynamic(q, k, v)), expected, atol=1e-5)


@pytest.mark.tensorflow_only  # reads the shapes in a TensorFlow graph
def test_no_query_by_key_tensor_in_the_graph():
    """Forward and backward hold (Tq, Bk) tiles, never a (Tq, Tv) matrix."""
    import tensorflow as tf

    q, k, v = qkv(tq=96, tv=96, lead=(1, 2))

    @tf.function
    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = tf.reduce_sum(
                run(chunked_attention, q, k, v, is_causal=True, block_size=32)[0] ** 2
            )
        return tape.gradient(loss, [q, k, v])

    graph = step.get_concrete_function(q, k, v).graph
    shapes = [tuple(t.shape) for op in graph.get_operations() for t in op.outputs]
    assert not [s for s in shapes if len(s) >= 2 and s[-2:] == (96, 96)]
    dense_graph = tf.function(lambda q, k, v: dense()(q, k, v)).get_concrete_function(q, k, v)
    assert any(tuple(t.shape)[-2:] == (96, 96) for t in dense_graph.outputs + [
        t for op in dense_graph.graph.get_operations() for t in op.outputs
    ])  # fmt: skip


def test_block_size_for():
    zeros = keras.ops.zeros
    assert block_size_for(zeros((1, 8, 16384, 32)), 16384) == 128
    assert block_size_for(zeros((32, 8, 128, 32)), 128) == 128  # capped by the length
    assert block_size_for(zeros((1, 1, 4, 2)), None) == 1024
    assert block_size_for(zeros((64, 8, 8192, 2)), 8192) == 64


def test_argument_errors():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="same leading axes"):
        run(chunked_attention, q, k[:1], v[:1])
    with pytest.raises(ValueError, match="must match"):
        run(chunked_attention, q, v, v)
    with pytest.raises(ValueError, match="`block_size` must be positive"):
        run(chunked_attention, q, k, v, block_size=-4)


# -- Selection through ops.attention ------------------------------------------


@pytest.fixture
def our_kernels(monkeypatch):
    """ "auto" among our own kernels, as on TensorFlow: where the backend kernel is preferred
    (torch, a GPU) it would be chosen first (tests/kernels/test_backend_kernel.py tests that)."""
    from keras_attn.kernels import backend as kernel_backend

    monkeypatch.setattr(kernel_backend, "preferred", lambda shape=None, masked=True: False)


def test_auto_threshold_counts_the_scores(our_kernels):
    def choose(implementation, shape, rate, training, weights=False):
        return ops.choose_implementation(implementation, shape, rate, training, weights)

    assert choose("auto", (None, 8, None, 10**6), 0.0, False) == "fused"  # length unknown
    assert choose("auto", (1, 8, 4096, 4096), 0.0, False) == "fused"  # 0.5 GiB of scores
    assert choose("auto", (None, 8, 8192, 8192), 0.0, False) == "chunked"  # 2 GiB
    assert choose("auto", (4, 8, 4096, 4096), 0.0, False) == "chunked"
    assert choose("auto", (4, 8, 4096, 4096), 0.1, True) == "dense"  # dropout active
    assert choose("auto", (4, 8, 4096, 4096), 0.0, False, weights=True) == "dense"
    assert choose("dense", (4, 8, 8192, 8192), 0.0, False) == "dense"
    for name in ("fused", "chunked"):
        assert choose(name, (1, 1, 4, 4), 0.1, False) == name  # dropout off in inference
        with pytest.raises(ValueError, match="has no dropout"):
            choose(name, (1, 1, 4, 4), 0.1, True)
        with pytest.raises(ValueError, match="never forms the attention weights"):
            choose(name, (1, 1, 4, 4), 0.0, False, weights=True)


def test_ops_attention_implementation_argument(monkeypatch, our_kernels):
    q, k, v = qkv()
    out, weights = ops.attention(
        q, k, v, is_causal=True, implementation="chunked", return_weights=False
    )
    assert weights is None
    ref, ref_weights = ops.attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(np_(out), np_(ref), atol=1e-5)
    assert ref_weights.shape == (2, 3, 37, 45)
    # "auto": fused below the threshold, chunked from it, dense with dropout or weights.
    chosen = record_kernels(monkeypatch)
    ops.attention(q, k, v, implementation="auto", return_weights=False)
    monkeypatch.setattr(kernels.registry, "CHUNKED_MIN_SCORES", 2 * 3 * 37 * 45)
    ops.attention(q, k, v, implementation="auto", return_weights=False)
    assert ops.attention(q, k, v, implementation="auto")[1] is not None
    auto_dropout = ops.attention(
        q, k, v, implementation="auto", dropout_rate=0.5, training=True, seed=1,
        return_weights=False,
    )  # fmt: skip
    assert chosen == ["fused", "chunked", "dense", "dense"] and auto_dropout[1] is None
    with pytest.raises(ValueError, match="has no dropout"):
        ops.attention(
            q, k, v, implementation="chunked", dropout_rate=0.1, training=True,
            return_weights=False,
        )  # fmt: skip
    with pytest.raises(ValueError, match="`implementation` must be one of"):
        ops.attention(q, k, v, implementation="flash")


@pytest.mark.parametrize("tq,tv,causal_", [(6, 6, True), (3, 6, True), (6, 4, True), (5, 5, False)])
def test_visible_query_rows_equals_the_merged_mask(tq, tv, causal_):
    for trial in range(5):
        qm = rng.random((3, tq)) > 0.3
        vm = rng.random((3, tv)) > (0.3 if trial else 0.9)
        for query_mask, value_mask in [(qm, vm), (None, vm), (qm, None), (None, None)]:
            full = ops.compute_attention_mask(tq, tv, query_mask, value_mask, None, causal_)
            got = ops.visible_query_rows(tq, tv, query_mask, value_mask, None, causal_)
            if full is None:
                assert got is None
                continue
            expected = np.broadcast_to(np_(ops.visible_rows(full)), (3, tq, 1))
            if got is None:  # "every row sees a key", known from the static lengths
                assert expected.all()
                continue
            np.testing.assert_array_equal(np.broadcast_to(np_(got), (3, tq, 1)), expected)
    attention_mask = rng.random((3, tq, tv)) > 0.7
    got = ops.visible_query_rows(tq, tv, None, None, attention_mask, causal_)
    full = ops.compute_attention_mask(tq, tv, None, None, attention_mask, causal_)
    np.testing.assert_array_equal(np_(got), np_(ops.visible_rows(full)))


@pytest.mark.parametrize("window", [1, 2, 5])
def test_visible_query_rows_with_a_window_and_a_start_equals_the_brute_force_rows(window):
    # Query starts past the keys too (a start of 9 with 1 to 7 keys): the indices stay in range.
    for tq, tv, causal_, start in itertools.product((1, 6), (1, 4, 7), (True, False), (None, 2, 9)):
        vm = rng.random((2, tv)) > 0.4
        got = ops.visible_query_rows(tq, tv, None, vm, None, causal_, start, window)
        p = np.arange(tq)[:, None] + (tv - tq if start is None else start)  # (Tq, 1)
        j = np.arange(tv)[None]
        sees = (j <= p) if causal_ else (j <= p + window - 1)
        sees &= j >= p - window + 1
        expected = np.any(vm[:, None, :] & sees[None], axis=-1, keepdims=True)
        np.testing.assert_array_equal(np.broadcast_to(np_(got), (2, tq, 1)), expected)


# -- MultiHeadAttention(implementation=...) ----------------------------------

X = rng.normal(size=(2, 9, 16)).astype("float32")
Y = rng.normal(size=(2, 11, 12)).astype("float32")
X_MASK = np.array([[1] * 9, [1] * 6 + [0] * 3], bool)
Y_MASK = np.array([[1] * 11, [1] * 4 + [0] * 7], bool)


def mha_pair(**kwargs):
    """A dense and a chunked MHA with the same weights."""
    dense_layer = keras_attn.MultiHeadAttention(implementation="dense", **kwargs)
    chunked_layer = keras_attn.MultiHeadAttention(implementation="chunked", **kwargs)
    return dense_layer, chunked_layer


def assert_layers_agree(
    dense_layer, chunked_layer, query, value, atol=1e-5, of_max=False, **call_kwargs
):
    """Outputs and gradients (inputs, weights) agree to `atol`.

    The output to `atol` (times its max |dense| if `of_max`), the gradients to
    `atol` times the largest dense gradient (at least 1).
    """
    dense_layer(query, value, **call_kwargs)
    chunked_layer(query, value, **call_kwargs)
    chunked_layer.set_weights(dense_layer.get_weights())
    results = []
    for layer in (dense_layer, chunked_layer):
        out, grads = value_and_grads(
            lambda q, v, layer=layer: layer(q, v, **call_kwargs),
            (query, value),
            layer.trainable_weights,
        )
        results.append((np_(out), [np_(g) for g in grads]))
    (out_d, grads_d), (out_c, grads_c) = results
    # Gradients are compared on the scale of the largest one: the key bias gets a zero
    # gradient in exact arithmetic (softmax is shift invariant), i.e. only rounding noise.
    largest = max(1.0, *(float(np.abs(g).max()) for g in grads_d))
    for i, (a, b) in enumerate(zip([out_c, *grads_c], [out_d, *grads_d], strict=True)):
        assert np.all(np.isfinite(a))
        # Weight gradients sum over the batch and positions: relative 1e-4 in float32.
        scale = largest if i else max(1.0, float(np.abs(b).max())) if of_max else 1.0
        np.testing.assert_allclose(a, b, atol=atol * scale, rtol=0 if of_max else 1e-4)
    return out_c


@pytest.mark.parametrize(
    "kv_heads,rotary",
    [pytest.param(None, False, marks=pytest.mark.jax_slow), (2, True), (1, False)],  # JAX: 2 of 3
)
def test_mha_chunked_equals_dense_with_masks(kv_heads, rotary):
    dense_layer, chunked_layer = mha_pair(
        num_heads=4,
        key_dim=4,
        num_key_value_heads=kv_heads,
        rotary_embedding=keras_attn.RotaryEmbedding() if rotary else None,
    )
    empty = Y_MASK.copy()
    empty[1] = False  # example 1 sees no key: its output must be exactly zero
    out = assert_layers_agree(
        dense_layer, chunked_layer, X, Y, query_mask=X_MASK, value_mask=empty, use_causal_mask=True
    )
    assert np.all(out[1] == 0)
    attention_mask = rng.random((2, 9, 11)) > 0.4
    assert_layers_agree(
        dense_layer, chunked_layer, X, Y, value_mask=Y_MASK, attention_mask=attention_mask
    )


@pytest.mark.jax_slow  # ~50 s of eager calls on JAX; TensorFlow and torch run it
def test_mha_chunked_self_attention_single_query_and_mixed_precision():
    dense_layer, chunked_layer = mha_pair(num_heads=2, key_dim=8)
    assert_layers_agree(dense_layer, chunked_layer, X, X, query_mask=X_MASK, value_mask=X_MASK)
    single_dense, single_chunked = mha_pair(num_heads=2, key_dim=8)
    out = assert_layers_agree(single_dense, single_chunked, X[:, 0], Y, value_mask=Y_MASK)
    assert out.shape == (2, 16)
    low_dense, low_chunked = mha_pair(num_heads=2, key_dim=8, dtype="mixed_bfloat16")
    # bfloat16 matmuls: both paths are ~1 % of the largest gradient from float32.
    out = assert_layers_agree(
        low_dense, low_chunked, X, X, atol=2e-2, of_max=True, use_causal_mask=True
    )
    assert np.all(np.isfinite(out))


def record_kernels(monkeypatch):
    """The names of the kernels `ops.attention` runs, appended to a list as they run."""
    chosen = []
    for name, kernel in list(kernels.KERNELS.items()):

        def recorded(*args, name=name, run=kernel.run):
            chosen.append(name)
            return run(*args)

        recording = dataclasses.replace(kernel, run=recorded)
        monkeypatch.setitem(kernels.KERNELS, name, recording)
    return chosen


def test_mha_auto_selection(monkeypatch, our_kernels):
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.5)
    assert layer.get_config()["implementation"] == "auto"
    chosen = record_kernels(monkeypatch)
    monkeypatch.setattr(kernels.registry, "CHUNKED_MIN_SCORES", 1)
    layer(X, X, training=False)
    layer(X, X, training=True)  # dropout in training
    _, weights = layer(X, X, return_attention_scores=True)  # weights requested
    assert weights.shape == (2, 2, 9, 9)
    assert chosen == ["chunked", "dense", "dense"]
    monkeypatch.setattr(kernels.registry, "CHUNKED_MIN_SCORES", 10**9)
    layer(X, X)
    monkeypatch.setattr(kernels.registry, "CHUNKED_MIN_SCORES", 2 * 2 * 9 * 9)  # (B, h, Tq, Tv)
    layer(X, X)
    layer(X[:1], X[:1])
    assert chosen[3:] == ["fused", "chunked", "fused"]


def test_mha_chunked_cached_decoding_equals_full_pass():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, implementation="chunked")
    full = np_(layer(X, X, use_causal_mask=True))
    cache, steps = layer.empty_cache(2, 9), []
    for start, length in [(0, 4), (4, 1), (5, 4)]:
        part = X[:, start : start + length]
        out, cache = layer(part, part, use_causal_mask=True, cache=cache, cache_update_index=start)
        steps.append(np_(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_mha_chunked_errors_and_config_round_trip():
    with pytest.raises(ValueError, match="has no dropout"):
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.1, implementation="chunked")
    with pytest.raises(ValueError, match="`implementation` must be one of"):
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, implementation="flash")
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, implementation="chunked")
    with pytest.raises(ValueError, match="never forms the attention weights"):
        layer(X, X, return_attention_scores=True)
    revived = keras_attn.MultiHeadAttention.from_config(layer.get_config())
    assert revived.implementation == "chunked"
