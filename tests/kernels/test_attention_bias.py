"""Attention biases and sliding windows on every kernel: NumPy references, gradients, cache steps.

A bias (a tensor, `AlibiBias`, `RelativePositionBias`, or a tuple) and a
`window` go through `keras_attn.ops.attention` into each kernel; the chunked
kernel evaluates position biases per key block. Every kernel is checked
against one NumPy formula, `softmax(q k^T / sqrt(d) + bias)` over the visible
keys, with hostile values (1e30, inf, NaN) at the masked keys.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import kernels, masks
from keras_attn import ops as attn_ops
from keras_attn.kernels import bias as bias_lib
from keras_attn.kernels.chunked import chunked_attention
from layer_checks import compiled, value_and_grads
from numpy_reference import alibi, attend, band, causal, scaled_dot_scores, t5_bias, t5_bucket

B, H, TQ, TV, D = 2, 4, 7, 11, 8


def np_(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def inputs(seed=0, tq=TQ, tv=TV, hostile=None):
    """q, k, v `(B, H, T, D)`, a key-padding mask `(B, 1, 1, Tv)` and NumPy copies.

    `hostile` (1e30, inf, nan) is written into the keys and values at the
    masked positions; the NumPy copies hold zeros there.
    """
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, H, tq, D)).astype("float32")
    k = rng.normal(size=(B, H, tv, D)).astype("float32")
    v = rng.normal(size=(B, H, tv, D)).astype("float32")
    keep = np.ones((B, tv), bool)
    keep[0, :3], keep[1, -2:] = False, False
    k_in, v_in = k.copy(), v.copy()
    if hostile is not None:
        k_in[~np.broadcast_to(keep[:, None, :], k.shape[:-1])] = hostile
        v_in[~np.broadcast_to(keep[:, None, :], v.shape[:-1])] = hostile
    return (q, k_in, v_in), (q, k, v), keep[:, None, None, :]


def t5_layer(bidirectional=True, seed=1):
    layer = keras_attn.RelativePositionBias(H, num_buckets=8, max_distance=20,
                                            bidirectional=bidirectional)  # fmt: skip
    table = np.random.default_rng(seed).normal(size=(8, H)).astype("float32")
    layer.table.assign(table)
    return layer, table


def biases(tq=TQ, tv=TV, query_start=None):
    """(name, bias argument, its NumPy value (h|1, Tq, Tv) or broadcastable)."""
    rng = np.random.default_rng(7)
    tensor = rng.normal(size=(1, H, tq, tv)).astype("float32")
    t5, table = t5_layer(bidirectional=False)
    alibi_np = alibi(H, tq, tv, query_start=query_start)
    t5_np = t5_bias(table, tq, tv, False, 20, query_start=query_start)
    return [
        ("tensor", tensor, tensor),
        ("alibi", keras_attn.AlibiBias(), alibi_np),
        ("t5", t5, t5_np),
        ("sum", (tensor, keras_attn.AlibiBias(), t5), tensor + alibi_np + t5_np),
    ]


def run_kernel(name, q, k, v, mask, is_causal=False, window=None, bias=None, query_start=None):
    if name == "chunked4":  # the chunked kernel over several key blocks
        spec = kernels.AttentionSpec(
            mask=mask, is_causal=is_causal, query_start=query_start, window=window,
            bias=bias_lib.as_bias(bias, (*q.shape[:-1], k.shape[-2])), return_weights=False,
        )  # fmt: skip
        return chunked_attention(q, k, v, spec, block_size=4)[0]
    return attn_ops.attention(q, k, v, mask=mask, is_causal=is_causal, window=window, bias=bias,
                              implementation=name, return_weights=False,
                              query_start=query_start)[0]  # fmt: skip


KERNELS = ("dense", "fused", "chunked", "chunked4")
# The chunked kernel's eager steps each compile a loop on JAX: its heaviest rows here run on
# TensorFlow and torch only (`jax_slow`); JAX runs them on the dense and fused kernels and the
# chunked kernel in the other tests.
JAX_SLOW_CHUNKED = [k if k in ("dense", "fused") else pytest.param(k, marks=pytest.mark.jax_slow)
                    for k in KERNELS]  # fmt: skip


# ---------------------------------------------------------------------------
# The position biases themselves
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("heads", [1, 2, 4, 6, 8, 12])
def test_alibi_matches_the_paper(heads):
    got = keras_attn.AlibiBias().bias(5, 9, num_heads=heads)
    np.testing.assert_allclose(np_(got), alibi(heads, 5, 9), rtol=1e-6)


def test_alibi_called_on_scores_gives_keras_hubs_values():
    # One query (the last position): bias m_h * (j - (Tv - 1)), slopes 1/16 and 1/256 for 2 heads.
    out = keras_attn.AlibiBias()(keras.ops.zeros((1, 2, 1, 3)))
    expected = [[[-0.125, -0.0625, 0.0]], [[-0.0078125, -0.00390625, 0.0]]]
    np.testing.assert_allclose(np_(out)[0], expected)
    with pytest.raises(ValueError, match="attention_scores"):
        keras_attn.AlibiBias()(keras.ops.zeros((2, 3)))


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_match_the_reference(bidirectional):
    offsets = np.arange(-300, 301)
    got = keras_attn.position_bias.relative_position_bucket(
        keras.ops.convert_to_tensor(offsets, "int32"), bidirectional, 32, 128
    )
    expected = [t5_bucket(int(o), bidirectional, 32, 128) for o in offsets]
    np.testing.assert_array_equal(np_(got).astype(int), expected)


def test_t5_bias_matches_the_reference():
    layer, table = t5_layer(bidirectional=True)
    got = layer.bias(6, 30, query_start=3)
    np.testing.assert_allclose(np_(got), t5_bias(table, 6, 30, True, 20, query_start=3), rtol=1e-6)


def test_position_bias_arguments_are_checked():
    with pytest.raises(ValueError, match="num_heads"):
        keras_attn.RelativePositionBias(0)
    with pytest.raises(ValueError, match="num_buckets"):
        keras_attn.RelativePositionBias(2, num_buckets=2)
    with pytest.raises(ValueError, match="alibi_bias_max"):
        keras_attn.AlibiBias(alibi_bias_max=-1)
    layer, _ = t5_layer()
    q = keras.ops.ones((1, 3, 5, 4))  # 3 heads, the bias has 4
    with pytest.raises(ValueError, match="num_heads"):
        attn_ops.attention(q, q, q, bias=layer)


def test_position_biases_round_trip():
    for layer in (keras_attn.AlibiBias(alibi_bias_max=6), t5_layer()[0]):
        clone = type(layer).from_config(layer.get_config())
        clone.set_weights(layer.get_weights())
        np.testing.assert_allclose(np_(clone.bias(4, 6, num_heads=H)),
                                   np_(layer.bias(4, 6, num_heads=H)))  # fmt: skip


# ---------------------------------------------------------------------------
# Every kernel equals the NumPy formula
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", JAX_SLOW_CHUNKED)
@pytest.mark.parametrize("hostile", [1e30, np.inf, np.nan])
def test_bias_on_every_kernel_matches_numpy(kernel, hostile):
    given, clean, mask = inputs(hostile=hostile)
    for name, bias, bias_np in biases():
        for is_causal, window in [(False, None), (True, None), (True, 3), (False, 4)]:
            visible = np.broadcast_to(mask, (B, H, TQ, TV))
            if is_causal:
                visible = visible & causal(TQ, TV)
            if window:
                visible = visible & band(TQ, TV, window)
            scores = scaled_dot_scores(clean[0], clean[1]) + bias_np
            expected, _ = attend(scores, clean[2], visible)
            got = run_kernel(kernel, *given, mask, is_causal, window, bias)
            what = f"{name} causal={is_causal} window={window}"
            np.testing.assert_allclose(np_(got), expected, atol=2e-5, err_msg=what)


@pytest.mark.parametrize("jit", [False, True])
def test_bias_gradients_agree_on_every_kernel(jit):
    given, _, mask = inputs(hostile=1e30)
    tensor = keras.Variable(np.random.default_rng(3).normal(size=(1, H, TQ, TV)), dtype="float32")
    t5, _ = t5_layer(bidirectional=False)
    cotangent = np.random.default_rng(4).normal(size=(B, H, TQ, D))
    results = {}
    for kernel in KERNELS:

        def f(q, k, v, kernel=kernel):
            bias = (keras.ops.convert_to_tensor(tensor), keras_attn.AlibiBias(), t5)
            return run_kernel(kernel, q, k, v, mask, True, 5, bias)

        results[kernel] = value_and_grads(f, given, [tensor, t5.table], cotangent, jit=jit)
    out_ref, grads_ref = results["dense"]
    for kernel, (out, grads) in results.items():
        np.testing.assert_allclose(np_(out), np_(out_ref), atol=2e-5, err_msg=kernel)
        for what, g, g_ref in zip(["q", "k", "v", "bias", "t5 table"], grads, grads_ref,
                                  strict=True):  # fmt: skip
            g = np_(g)
            assert np.isfinite(g).all(), (kernel, what)
            np.testing.assert_allclose(g, np_(g_ref), atol=5e-5, err_msg=f"{kernel} d{what}")
    assert np.abs(np_(grads_ref[4])).sum() > 0  # the learned table gets a gradient


@pytest.mark.parametrize("kernel", JAX_SLOW_CHUNKED)
def test_cached_steps_equal_the_full_pass(kernel):
    """One query at a time at `query_start = i` over all the keys: row i of the full pass."""
    given, _, mask = inputs(tq=TV, tv=TV)
    q, k, v = given
    for name, bias, _ in biases(TV, TV):
        if name in ("tensor", "sum"):
            continue  # a tensor is sliced by the caller; position biases follow query_start
        full = np_(run_kernel("dense", q, k, v, mask, True, 4, bias))
        steps = [np_(run_kernel(kernel, q[:, :, i : i + 1], k, v, mask, True, 4, bias,
                                query_start=i)) for i in range(TV)]  # fmt: skip
        np.testing.assert_allclose(np.concatenate(steps, axis=2), full, atol=2e-5, err_msg=name)


def test_bias_is_added_in_float32():
    # 7e4 overflows float16: the bias is added to float32 scores, the weights are one-hot.
    q = keras.ops.zeros((1, 1, 2, 4), "float16")
    bias = np.array([[[[7e4, 0.0, 0.0], [0.0, 7e4, 0.0]]]], "float32")
    v = keras.ops.convert_to_tensor(np.eye(3, 4)[None, None], "float16")
    for kernel in ("dense", "fused", "chunked"):
        out = run_kernel(kernel, q, keras.ops.zeros((1, 1, 3, 4), "float16"), v, None, bias=bias)
        np.testing.assert_allclose(np_(out)[0, 0], np.eye(3, 4)[:2], atol=1e-3, err_msg=kernel)


def test_bad_bias_and_window_are_refused():
    q = keras.ops.ones((1, 2, 3, 4))
    with pytest.raises(TypeError, match="bias"):
        attn_ops.attention(q, q, q, bias=np.ones((1, 2, 3, 3), bool))
    with pytest.raises(ValueError, match="bias"):
        attn_ops.attention(q, q, q, bias=np.ones((1, 2, 3, 5), "float32"))
    for window in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="window"):
            attn_ops.attention(q, q, q, window=window)


# ---------------------------------------------------------------------------
# Windows and which rows see a key
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("tq,tv,start", [(7, 7, None), (3, 9, None), (9, 4, None), (2, 9, 4)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_visible_rows_with_a_window_match_brute_force(tq, tv, start, is_causal):
    rng = np.random.default_rng(tq * tv)
    value_mask = rng.random((3, tv)) > 0.6
    query_mask = rng.random((3, tq)) > 0.2
    for window in (1, 2, 3):
        allowed = band(tq, tv, window, start)
        if is_causal:
            allowed = allowed & (np.arange(tq)[:, None] + (tv - tq if start is None else start)
                                 >= np.arange(tv)[None, :])  # fmt: skip
        expected = query_mask & (value_mask[:, None, :] & allowed).any(-1)
        got = masks.visible_query_rows(tq, tv, query_mask, value_mask, None, is_causal, start,
                                       window=window)  # fmt: skip
        np.testing.assert_array_equal(np.broadcast_to(np_(got)[..., 0] > 0, expected.shape),
                                      expected)  # fmt: skip


def test_rows_outside_every_window_are_zero_not_nan():
    # Keys 0-2 padded, window 2: query 0 and 1 see no key. Zero output, finite gradients.
    given, _, _ = inputs(hostile=np.nan)
    mask = np.ones((B, 1, 1, TV), bool)
    mask[:, :, :, :3] = False
    for kernel in KERNELS:
        out, grads = value_and_grads(
            lambda q, k, v, kernel=kernel: run_kernel(kernel, q, k, v, mask, False, 2,
                                                      keras_attn.AlibiBias(), query_start=0),
            given,
        )  # fmt: skip
        np.testing.assert_array_equal(np_(out)[:, :, :2], 0.0, err_msg=kernel)
        assert all(np.isfinite(np_(g)).all() for g in grads[:1]), kernel


def test_kernels_table_takes_window_and_bias():
    q = keras.random.normal((1, 2, 5, 4))
    bias = bias_lib.as_bias(keras_attn.AlibiBias(), (1, 2, 5, 5))
    spec = kernels.AttentionSpec(is_causal=True, window=2, bias=bias, return_weights=False)
    outs = [np_(kernels.KERNELS[n](q, q, q, spec)[0]) for n in ("dense", "fused", "chunked")]
    np.testing.assert_allclose(outs[1], outs[0], atol=1e-5)
    np.testing.assert_allclose(outs[2], outs[0], atol=1e-5)
    f = compiled(lambda q: kernels.chunked_attention(q, q, q, spec, block_size=2)[0])
    np.testing.assert_allclose(np_(f(q)), outs[0], atol=1e-5)
