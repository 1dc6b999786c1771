"""MultiHeadAttention: shared checks, NumPy reference, Keras equality, GQA, masks."""

import functools

import keras
import numpy as np
import pytest

import keras_attn
from layer_checks import check_fully_masked_rows, check_layer, compiled
from numpy_reference import causal, softmax_masked

rng = np.random.default_rng(0)
Q = rng.normal(size=(2, 4, 12)).astype("float32")
V = rng.normal(size=(2, 5, 10)).astype("float32")
Q_MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
V_MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], bool)


def np_(x):
    return keras.ops.convert_to_numpy(x)


def numpy_mha(layer, query, value, mask):
    """Split into heads, per-head scaled dot attention, concat, output projection."""
    wq, bq, wk, bk, wv, bv, wo, bo = (np_(w) for w in layer.get_weights())
    q = np.einsum("btd,dhk->bhtk", query, wq) + bq[None, :, None, :]
    k = np.einsum("btd,dhk->bhtk", value, wk) + bk[None, :, None, :]
    v = np.einsum("btd,dhk->bhtk", value, wv) + bv[None, :, None, :]
    groups = layer.num_heads // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    weights = softmax_masked(scores, mask[:, None])
    heads = weights @ v  # (B, h, Tq, dv)
    out = np.einsum("bhtk,hko->bto", heads, wo) + bo
    visible = mask.any(-1, keepdims=True)
    return np.where(visible, out, 0.0), weights


@pytest.mark.parametrize("kv_heads", [None, 2, 1])
def test_layer_checks(kv_heads, tmp_path):
    check_layer(
        functools.partial(
            keras_attn.MultiHeadAttention, num_heads=4, key_dim=3, num_key_value_heads=kv_heads
        ),
        {"query": Q, "value": V},
        tmp_path=tmp_path,
        masks={"query_mask": Q_MASK, "value_mask": V_MASK},
        mask_covers={"query_mask": ["query"], "value_mask": ["value"]},
        call_kwargs={"return_attention_scores": True},
    )


def test_layer_checks_causal(tmp_path):
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    check_layer(
        functools.partial(keras_attn.MultiHeadAttention, num_heads=2, key_dim=4, dropout=0.1),
        {"query": x, "value": x},
        tmp_path=tmp_path,
        call_kwargs={"use_causal_mask": True},
        causal=True,
        mixed_precision=(),
    )


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_matches_numpy_reference(kv_heads):
    layer = keras_attn.MultiHeadAttention(
        num_heads=4, key_dim=3, value_dim=5, num_key_value_heads=kv_heads, output_shape=7
    )
    layer.build(Q.shape, V.shape)
    for w in layer.weights:  # non-zero biases, so the bias paths are checked too
        w.assign(rng.normal(size=w.shape).astype("float32") * 0.5)
    attn = rng.random((2, 4, 5)) > 0.3
    out, w = layer(
        Q,
        V,
        query_mask=Q_MASK,
        value_mask=V_MASK,
        attention_mask=attn,
        use_causal_mask=True,
        return_attention_scores=True,
    )
    mask = Q_MASK[:, :, None] & V_MASK[:, None, :] & attn & causal(4, 5)
    ref_out, ref_w = numpy_mha(layer, Q, V, mask)
    np.testing.assert_allclose(np_(w), ref_w, atol=1e-5)
    np.testing.assert_allclose(np_(out), ref_out, atol=1e-5)


def test_equals_keras_multi_head_attention_with_copied_weights():
    theirs = keras.layers.MultiHeadAttention(num_heads=3, key_dim=4, value_dim=5, output_shape=6)
    ours = keras_attn.MultiHeadAttention(num_heads=3, key_dim=4, value_dim=5, output_shape=6)
    # Keras' einsum path: its fused dot_product_attention needs value_dim == key_dim on JAX.
    theirs(Q, V, return_attention_scores=True)
    ours(Q, V)
    assert [w.shape for w in ours.get_weights()] == [w.shape for w in theirs.get_weights()]
    ours.set_weights(theirs.get_weights())
    mask = np.ones((2, 4, 5), bool) & causal(4, 5)  # every row sees something
    mask[0, :, 4] = False
    out_t, w_t = theirs(Q, V, attention_mask=mask, return_attention_scores=True)
    out_o, w_o = ours(Q, V, attention_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(np_(w_o), np_(w_t), atol=1e-5)
    np.testing.assert_allclose(np_(out_o), np_(out_t), atol=1e-5)


def test_grouped_query_with_all_heads_equals_plain_mha():
    plain = keras_attn.MultiHeadAttention(num_heads=4, key_dim=3)
    grouped = keras_attn.MultiHeadAttention(num_heads=4, key_dim=3, num_key_value_heads=4)
    plain(Q, V)
    grouped(Q, V)
    grouped.set_weights(plain.get_weights())
    np.testing.assert_allclose(
        np_(grouped(Q, V, value_mask=V_MASK)), np_(plain(Q, V, value_mask=V_MASK)), atol=1e-6
    )
    mqa = keras_attn.MultiHeadAttention(num_heads=4, key_dim=3, num_key_value_heads=1)
    mqa(Q, V)
    assert mqa.key_dense.kernel.shape == (10, 1, 3)


def test_single_query_and_rows_with_nothing_visible():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    out, w = layer(Q[:, 0], V, value_mask=V_MASK, return_attention_scores=True)
    assert out.shape == (2, 12) and w.shape == (2, 2, 5)
    none_visible = V_MASK.copy()
    none_visible[1] = False
    out, w = layer(Q, V, query_mask=Q_MASK, value_mask=none_visible, return_attention_scores=True)
    out, w = np_(out), np_(w)
    assert np.all(out[1] == 0) and np.all(w[1] == 0)  # after the output bias too
    assert np.all(out[0, 3] == 0)  # padded query row


# JAX runs float32 (eager and XLA) and the mixed policies under XLA; the mixed policies'
# eager rows, the slowest there, run on TensorFlow and torch (`jax_slow`).
@pytest.mark.parametrize(
    "policy,jit",
    [(p, j) if p == "float32" or j else pytest.param(p, j, marks=pytest.mark.jax_slow)
     for j in (False, True) for p in ("float32", "mixed_float16", "mixed_bfloat16")],
)  # fmt: skip
def test_fully_masked_rows_have_finite_gradients(policy, jit):
    none_visible = V_MASK.copy()
    none_visible[1] = False
    check_fully_masked_rows(
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.2, dtype=policy),
        {"query": Q, "value": V},
        empty_example=1,
        jit=jit,
        query_mask=Q_MASK,
        value_mask=none_visible,
        training=True,
    )


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"`num_key_value_heads` must divide `num_heads`.*=3"):
        keras_attn.MultiHeadAttention(num_heads=4, key_dim=2, num_key_value_heads=3)
    with pytest.raises(ValueError, match=r"`num_heads` must be a positive integer.*num_heads=0"):
        keras_attn.MultiHeadAttention(num_heads=0, key_dim=2)
    with pytest.raises(ValueError, match=r"`value` must have rank 3"):
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=2)(Q, V[0])
    with pytest.raises(ValueError, match=r"`value_mask` and `value` must have the same length"):
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=2)(Q, V, value_mask=Q_MASK)


# -- Cached decoding ----------------------------------------------------------

X = rng.normal(size=(2, 7, 12)).astype("float32")
X_MASK = np.array([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]], bool)  # right padding


def decode_with_cache(layer, x, mask, chunks):
    """Feeds `x` through the cache in chunks of the given lengths; concatenates outputs."""
    cache, outputs, start = layer.empty_cache(x.shape[0], x.shape[1]), [], 0
    for length in chunks:
        part, part_mask = x[:, start : start + length], mask[:, start : start + length]
        out, cache = layer(
            part,
            part,
            query_mask=part_mask,
            value_mask=part_mask,
            use_causal_mask=True,
            cache=cache,
            cache_update_index=start,
        )
        outputs.append(np_(out))
        start += length
    return np.concatenate(outputs, axis=1), cache


@pytest.mark.parametrize(
    "kv_heads,rotary,chunks",
    [
        (None, False, [1] * 7),
        pytest.param(2, True, [3, 1, 1, 2], marks=pytest.mark.jax_slow),  # JAX: 2 of 3
        (1, True, [7]),
    ],
)
def test_cached_decoding_equals_full_causal_pass(kv_heads, rotary, chunks):
    layer = keras_attn.MultiHeadAttention(
        num_heads=4,
        key_dim=4,
        num_key_value_heads=kv_heads,
        rotary_embedding=keras_attn.RotaryEmbedding() if rotary else None,
    )
    full = np_(layer(X, X, query_mask=X_MASK, value_mask=X_MASK, use_causal_mask=True))
    stepped, cache = decode_with_cache(layer, X, X_MASK, chunks)
    key_cache, value_cache = cache.key, cache.value
    np.testing.assert_allclose(stepped, full, atol=1e-5)
    # The cache holds the g key/value heads, not h copies.
    assert key_cache.shape == (2, kv_heads or 4, 7, 4) and value_cache.shape == key_cache.shape


def test_cache_masks_unwritten_positions_and_merges_attention_mask():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    layer(X, X)
    cache = layer.empty_cache(2, 7)
    _, w, cache = layer(
        X[:, :3], X[:, :3], cache=cache, cache_update_index=0, return_attention_scores=True
    )
    w = np_(w)  # (B, h, 3, 7): not causal, but positions 3.. are not written yet
    assert np.all(w[..., 3:] == 0) and np.allclose(w.sum(-1), 1, atol=1e-6)
    attention_mask = np.ones((2, 1, 7), bool)
    attention_mask[:, :, 1] = False
    _, w, _ = layer(
        X[:, 3:4],
        X[:, 3:4],
        cache=cache,
        cache_update_index=3,
        attention_mask=attention_mask,
        use_causal_mask=True,
        return_attention_scores=True,
    )
    w = np_(w)
    assert np.all(w[..., 1] == 0) and np.all(w[..., 4:] == 0)
    np.testing.assert_allclose(w.sum(-1), 1, atol=1e-6)


def test_cross_attention_cache_equals_uncached():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, num_key_value_heads=1)
    full = layer(Q, V, query_mask=Q_MASK, value_mask=V_MASK)
    out, cache = layer(Q, cache=layer.compute_cache(V), query_mask=Q_MASK, value_mask=V_MASK)
    np.testing.assert_allclose(np_(out), np_(full), atol=1e-6)
    assert cache.key.shape == (2, 1, 5, 4)


def test_cached_call_under_jit_and_in_a_functional_model():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    full = np_(layer(X, X, use_causal_mask=True))

    @compiled
    def step(token, cache, index):
        return layer(token, token, use_causal_mask=True, cache=cache, cache_update_index=index)

    cache, outputs = layer.empty_cache(2, 7), []
    for t in range(7):
        out, cache = step(X[:, t : t + 1], cache, keras.ops.convert_to_tensor(t))
        outputs.append(np_(out))
    np.testing.assert_allclose(np.concatenate(outputs, 1), full, atol=1e-5)

    token = keras.Input((1, 12))
    caches = keras_attn.KVCache(
        keras.Input((2, 7, 4)), keras.Input((2, 7, 4)), keras.Input((7,), dtype="bool")
    )
    out, new_cache = layer(token, token, use_causal_mask=True, cache=caches, cache_update_index=2)
    assert tuple(out.shape) == (None, 1, 12) and tuple(new_cache.key.shape) == (None, 2, 7, 4)
    assert tuple(new_cache.valid.shape) == (None, 7)


def test_cache_errors():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    with pytest.raises(ValueError, match="Call the layer once"):
        layer.compute_cache(V)
    layer(X, X)
    cache = layer.empty_cache(2, 7)
    with pytest.raises(TypeError, match="`cache` must be a keras_attn.KVCache"):
        layer(X, X, cache=cache[0], cache_update_index=0)
    stacked = keras.ops.stack([cache.key, cache.value], axis=1)  # keras-hub's form
    with pytest.raises(TypeError, match="stacked cache tensor: the TransformerDecoder"):
        layer(X, X, cache=stacked, cache_update_index=0)
    with pytest.raises(ValueError, match="pass no `value`"):
        layer(X, X, cache=cache)
    with pytest.raises(ValueError, match="`value` is required"):
        layer(X)
    with pytest.raises(TypeError, match="rotary_embedding"):
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, rotary_embedding=True)
    with pytest.raises(ValueError, match="`key_dim` must be even"):
        keras_attn.MultiHeadAttention(
            num_heads=2, key_dim=3, rotary_embedding=keras_attn.RotaryEmbedding()
        )
