"""MultiHeadAttention / GroupedQueryAttention as drop-ins for Keras': weights, masks, axes, windows.

References: Keras' own layers with the weights copied by `set_weights` (equal
outputs on real tokens), and a NumPy formula of gated multi-head attention
with a sliding-window band (`numpy_reference.band`).
"""

import keras
import numpy as np
import pytest

import keras_attn
from numpy_reference import band, causal, softmax_masked

rng = np.random.default_rng(3)
X = rng.normal(size=(2, 6, 8)).astype("float32")
V = rng.normal(size=(2, 5, 8)).astype("float32")
V_MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], bool)
HOSTILE = np.where(V_MASK[..., None], V, np.float32(1e30))  # huge values at padded keys


def np_(x):
    return keras.ops.convert_to_numpy(x)


def pair(theirs, ours, *inputs):
    """Both layers built on `inputs`, ours holding a copy of Keras' weights."""
    theirs(*inputs)
    ours(*inputs)
    assert [w.shape for w in ours.get_weights()] == [w.shape for w in theirs.get_weights()]
    ours.set_weights(theirs.get_weights())
    return theirs, ours


def numpy_gated_mha(weights, query, value, mask, gate=False, groups=1):
    """`concat_i(softmax(q_i k_i^T / sqrt(d)) v_i * sigmoid(x W_g)_i) W_o`; blind rows: 0."""
    wq, bq, wk, bk, *rest = weights
    wg, bg, wv, bv, wo, bo = rest if gate else (None, None, *rest)
    q = np.einsum("btd,dhk->bhtk", query, wq) + bq[:, None]
    k = np.repeat(np.einsum("btd,dhk->bhtk", value, wk) + bk[:, None], groups, axis=1)
    v = np.repeat(np.einsum("btd,dhk->bhtk", value, wv) + bv[:, None], groups, axis=1)
    w = softmax_masked(q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]), mask)
    heads = w @ v  # (B, h, Tq, dv)
    if gate:
        heads = heads / (1 + np.exp(-(np.einsum("btd,dhk->bhtk", query, wg) + bg[:, None])))
    out = np.einsum("bhtk,hko->bto", heads, wo) + bo
    visible = np.broadcast_to(mask, w.shape).any(axis=(1, -1))[..., None]
    return np.where(visible, out, 0.0), w


# -- weights copied from Keras ----------------------------------------------------


@pytest.mark.parametrize("use_gate", [False, True])
def test_mha_equals_keras_with_copied_weights_gate_and_padding(use_gate):
    # On JAX, Keras' own layer fails with value_dim != key_dim (its call of
    # jax.nn.dot_product_attention reshapes the values to the key width): equal widths there.
    value_dim = 4 if keras.backend.backend() == "jax" else 3
    kwargs = dict(num_heads=2, key_dim=4, value_dim=value_dim, use_gate=use_gate,
                  output_shape=(2, 5))  # fmt: skip
    theirs, ours = pair(
        keras.layers.MultiHeadAttention(**kwargs), keras_attn.MultiHeadAttention(**kwargs), X, V
    )
    out_t, w_t = theirs(X, V, value_mask=V_MASK, return_attention_scores=True)
    out_o, w_o = ours(X, V, value_mask=V_MASK, return_attention_scores=True)
    assert out_o.shape == (2, 6, 2, 5)
    np.testing.assert_allclose(np_(out_o), np_(out_t), atol=1e-5)
    np.testing.assert_allclose(np_(w_o), np_(w_t), atol=1e-6)
    # Whatever the padded keys hold, nothing changes (Keras' 0 * 1e30 would not hold).
    np.testing.assert_allclose(np_(ours(X, HOSTILE, value_mask=V_MASK)), np_(out_t), atol=1e-5)


@pytest.mark.parametrize("use_gate", [False, True])
def test_gqa_equals_keras_with_copied_weights(use_gate):
    kwargs = dict(head_dim=4, num_query_heads=4, num_key_value_heads=2, use_gate=use_gate)
    theirs, ours = pair(
        keras.layers.GroupQueryAttention(**kwargs),
        keras_attn.GroupedQueryAttention(**kwargs),
        X,
        V,
    )
    out_t, w_t = theirs(X, V, value_mask=V_MASK, return_attention_scores=True)
    out_o, w_o = ours(X, V, value_mask=V_MASK, return_attention_scores=True)
    np.testing.assert_allclose(np_(out_o), np_(out_t), atol=1e-5)
    np.testing.assert_allclose(np_(w_o), np_(w_t), atol=1e-6)
    ref, _ = numpy_gated_mha(
        [np_(w) for w in ours.weights], X, V, V_MASK[:, None, None], use_gate, groups=2
    )
    np.testing.assert_allclose(np_(out_o), ref, atol=1e-5)
    assert ours.key_dense.kernel.shape == (8, 2, 4)  # g key/value heads, as Keras'


@pytest.mark.parametrize("use_gate", [False, True])
def test_attention_axes_equal_keras_on_rank_5_inputs(use_gate):
    q = rng.normal(size=(2, 3, 2, 4, 6)).astype("float32")
    v = rng.normal(size=(2, 3, 2, 5, 6)).astype("float32")
    kwargs = dict(num_heads=2, key_dim=3, attention_axes=(2, 3), use_gate=use_gate)
    theirs, ours = pair(
        keras.layers.MultiHeadAttention(**kwargs), keras_attn.MultiHeadAttention(**kwargs), q, v
    )
    mask = rng.random((2, 3, 2, 4, 2, 5)) > 0.3  # (batch axes, query axes, key axes)
    mask[..., 0, 0] = True  # every query sees a key (Keras would average over nothing)
    out_t, w_t = theirs(q, v, attention_mask=mask, return_attention_scores=True)
    out_o, w_o = ours(q, v, attention_mask=mask, return_attention_scores=True)
    assert w_o.shape == (2, 3, 2, 2, 4, 2, 5)
    np.testing.assert_allclose(np_(w_o), np_(w_t), atol=1e-6)
    np.testing.assert_allclose(np_(out_o), np_(out_t), atol=1e-5)
    assert ours.compute_output_spec(keras.KerasTensor(q.shape), keras.KerasTensor(v.shape),
                                    return_attention_scores=True)[1].shape == w_o.shape  # fmt: skip


def test_attention_axis_in_the_middle_with_causal_mask_equals_keras():
    x = rng.normal(size=(2, 5, 3, 6)).astype("float32")  # attend over axis 1; axis 2: batch
    kwargs = dict(num_heads=2, key_dim=4, attention_axes=1)
    theirs, ours = pair(
        keras.layers.MultiHeadAttention(**kwargs), keras_attn.MultiHeadAttention(**kwargs), x, x
    )
    out_t, w_t = theirs(x, x, use_causal_mask=True, return_attention_scores=True)
    out_o, w_o = ours(x, x, use_causal_mask=True, return_attention_scores=True)
    np.testing.assert_allclose(np_(w_o), np_(w_t), atol=1e-6)
    np.testing.assert_allclose(np_(out_o), np_(out_t), atol=1e-5)


# -- masks as Keras takes them -------------------------------------------------


def test_attention_mask_shapes_keras_accepts():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    layer(X, V)
    weights = [np_(w) for w in layer.weights]
    full = np.broadcast_to(V_MASK[:, None], (2, 6, 5))
    per_head = rng.random((2, 2, 6, 5)) > 0.4
    per_head[..., 0] = True
    for mask, expected in [
        (full[0], np.broadcast_to(full[0], (2, 6, 5))),  # (Tq, Tv)
        (V_MASK[:, None], full),  # (B, 1, Tv), as the keras.io tutorials pass it
        (full.astype("int32"), full),  # (B, Tq, Tv), integer
        (full.astype("float32"), full),  # float 0/1, read as Keras reads it (1 = attend)
        (per_head, per_head),  # (B, h, Tq, Tv)
    ]:
        heads_mask = expected if expected.ndim == 4 else expected[:, None]
        ref, ref_w = numpy_gated_mha(weights, X, V, heads_mask)
        out, w = layer(X, V, attention_mask=mask, return_attention_scores=True)
        np.testing.assert_allclose(np_(w), ref_w, atol=1e-6)
        np.testing.assert_allclose(np_(out), ref, atol=1e-5)
    additive = np.where(full, 0.0, -1e9).astype("float32")  # read as 0/1 it would be inverted
    with pytest.raises(ValueError, match=r"`attention_mask` must be a boolean mask.*-1e\+09"):
        layer(X, V, attention_mask=additive)
    with pytest.raises(ValueError, match="`attention_mask` must broadcast"):
        layer(X, V, attention_mask=np.ones((2, 3, 6, 5), bool))


@pytest.mark.parametrize("gqa", [False, True])
def test_float_masks_of_0s_and_1s_equal_keras_eager_and_compiled(gqa):
    from layer_checks import compiled

    if gqa:
        kwargs = dict(head_dim=4, num_query_heads=4, num_key_value_heads=2)
        theirs, ours = keras.layers.GroupQueryAttention(**kwargs), keras_attn.GroupQueryAttention
    else:
        kwargs = dict(num_heads=2, key_dim=4)
        theirs, ours = keras.layers.MultiHeadAttention(**kwargs), keras_attn.MultiHeadAttention
    theirs, ours = pair(theirs, ours(**kwargs), X, V)
    keep = rng.random((2, 6, 5)) > 0.4
    keep[..., 0] = True  # every query sees a key (Keras would average over nothing)
    mask = keep.astype("float32")  # as keras.io writes them: ops.tril(ops.ones(...))
    expected, expected_w = map(np_, theirs(X, V, attention_mask=mask, return_attention_scores=True))
    step = compiled(lambda x, v, m: ours(x, v, attention_mask=m, return_attention_scores=True))
    for out, w in (ours(X, V, attention_mask=mask, return_attention_scores=True), step(X, V, mask)):
        np.testing.assert_allclose(np_(w), expected_w, atol=1e-6)
        np.testing.assert_allclose(np_(out), expected, atol=1e-5)
        assert np.all(np_(w)[np.broadcast_to(~keep[:, None], w.shape)] == 0)


def test_key_mask_is_merged_with_value_mask():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    key_mask = np.array([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], bool)
    both = layer(X, V, key=V * 2, value_mask=V_MASK, key_mask=key_mask)
    merged = layer(X, V, key=V * 2, value_mask=V_MASK & key_mask)
    np.testing.assert_allclose(np_(both), np_(merged), atol=1e-6)
    with pytest.raises(ValueError, match="`key_mask` and `value` must have the same length"):
        layer(X, V, key_mask=key_mask[:, :4])


def test_shape_checks_and_arguments_as_keras():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    with pytest.raises(ValueError, match="All dimensions of `value` and `key`, except the last"):
        layer.compute_output_shape((2, 6, 8), (2, 5, 8), (2, 4, 8))
    with pytest.raises(ValueError, match="All dimensions of `value` and `key`, except the last"):
        layer(X, V, V[:, :4])
    gqa = keras_attn.GroupedQueryAttention(head_dim=2, num_query_heads=4, num_key_value_heads=2)
    with pytest.raises(ValueError, match="last dimension of `query_shape` and `value_shape`"):
        gqa.compute_output_shape((2, 6, 8), (2, 5, 7))
    with pytest.raises(ValueError, match="`num_query_heads` must be divisible"):
        keras_attn.GroupedQueryAttention(head_dim=2, num_query_heads=4, num_key_value_heads=3)
    with pytest.raises(ValueError, match=r"Invalid `output_shape`: 8\.0"):
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, output_shape=8.0)
    with pytest.raises(ValueError, match="argument `value_dim`.*value_dim=1.5"):
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, value_dim=1.5)
    with pytest.raises(ValueError, match="`sliding_window` must be None or a positive integer"):
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, sliding_window=0)
    with pytest.raises(ValueError, match="`position_bias` must have one bias per query head"):
        keras_attn.MultiHeadAttention(
            num_heads=2, key_dim=4, position_bias=keras_attn.RelativePositionBias(3)
        )
    with pytest.raises(ValueError, match="`attention_axes` must name distinct axes"):
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=3)(X, X)


def test_flash_attention_as_keras():
    with pytest.raises(ValueError, match="Dropout is not supported when flash attention"):
        keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, flash_attention=True, dropout=0.1)
    flash = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, flash_attention=True)
    dense = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, implementation="dense")
    flash(X, V)
    dense(X, V)
    dense.set_weights(flash.get_weights())
    with pytest.raises(ValueError, match="Returning attention scores is not supported"):
        flash(X, V, return_attention_scores=True)
    np.testing.assert_allclose(
        np_(flash(X, V, value_mask=V_MASK)), np_(dense(X, V, value_mask=V_MASK)), atol=1e-5
    )


def test_regularizers_constraints_and_config():
    layer = keras_attn.MultiHeadAttention(
        num_heads=2, key_dim=4, use_gate=True, kernel_regularizer="l2",
        activity_regularizer="l1", kernel_constraint="non_neg", sliding_window=3,
    )  # fmt: skip
    layer(X, V)
    assert len(layer.losses) == 5 + 5  # 5 kernels, 5 projection outputs
    assert all(isinstance(d.kernel.constraint, keras.constraints.NonNeg) for d in (
        layer._query_dense, layer._key_dense, layer._gate_dense, layer._value_dense,
        layer._output_dense))  # fmt: skip
    revived = keras_attn.MultiHeadAttention.from_config(layer.get_config())
    assert revived.get_config() == layer.get_config()
    gqa = keras_attn.GroupedQueryAttention(head_dim=4, num_query_heads=4, num_key_value_heads=2)
    theirs = keras.layers.GroupQueryAttention(head_dim=4, num_query_heads=4, num_key_value_heads=2)
    assert set(theirs.get_config()) <= set(gqa.get_config())
    mha_keys = set(keras.layers.MultiHeadAttention(num_heads=2, key_dim=4).get_config())
    assert mha_keys <= set(layer.get_config())


def test_keras_weights_file_loads_into_ours(tmp_path):
    def model(cls):
        inputs = keras.Input((6, 8))
        return keras.Model(inputs, cls(num_heads=2, key_dim=4, use_gate=True)(inputs, inputs))

    theirs, ours = model(keras.layers.MultiHeadAttention), model(keras_attn.MultiHeadAttention)
    path = str(tmp_path / "mha.weights.h5")
    theirs.save_weights(path)
    ours.load_weights(path)  # the same sublayer names: `_query_dense`, ..., `_gate_dense`
    np.testing.assert_allclose(np_(ours(X)), np_(theirs(X)), atol=1e-5)


def test_keras_round_trip_of_gated_windowed_gqa(tmp_path):
    gqa = keras_attn.GroupedQueryAttention(
        head_dim=4, num_query_heads=4, num_key_value_heads=1, use_gate=True, sliding_window=2
    )
    inputs = keras.Input((6, 8))
    model = keras.Model(inputs, gqa(inputs, inputs, use_causal_mask=True))
    path = str(tmp_path / "gqa.keras")
    model.save(path)
    revived = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(np_(revived(X)), np_(model(X)), atol=1e-6)
    assert isinstance(revived.layers[-1], keras_attn.GroupedQueryAttention)


# -- sliding window against a NumPy band ---------------------------------------

X_MASK = np.array([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0]], bool)  # padding at both ends


@pytest.mark.parametrize("implementation", ["dense", "chunked"])
@pytest.mark.parametrize("causal_too", [False, True])
def test_sliding_window_equals_numpy_band(implementation, causal_too):
    layer = keras_attn.MultiHeadAttention(
        num_heads=2, key_dim=4, sliding_window=2, implementation=implementation
    )
    layer(X, X)
    mask = band(6, 6, 2) & X_MASK[:, None, :] & (causal(6, 6) if causal_too else True)
    ref, _ = numpy_gated_mha([np_(w) for w in layer.weights], X, X, mask[:, None])
    hostile = np.where(X_MASK[..., None], X, np.float32(np.nan))  # NaN at the padded steps
    out = layer(hostile, hostile, query_mask=X_MASK, value_mask=X_MASK, use_causal_mask=causal_too)
    np.testing.assert_allclose(np_(out), np.where(X_MASK[..., None], ref, 0.0), atol=1e-5)


def test_sliding_window_weights_and_decoding_step_by_step():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, sliding_window=3)
    _, w = layer(X, X, use_causal_mask=True, return_attention_scores=True)
    w = np_(w)
    assert np.all(w[..., ~(band(6, 6, 3) & causal(6, 6))] == 0)
    assert np.all(w[..., band(6, 6, 3) & causal(6, 6)] > 0)
    full = np_(layer(X, X, query_mask=X_MASK, value_mask=X_MASK, use_causal_mask=True))
    cache, steps = layer.empty_cache(2, 6), []
    for i in range(6):
        token, token_mask = X[:, i : i + 1], X_MASK[:, i : i + 1]
        out, cache = layer(token, token, query_mask=token_mask, value_mask=token_mask,
                           use_causal_mask=True, cache=cache, cache_update_index=i)  # fmt: skip
        steps.append(np_(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


# -- Keras' `_compute_attention` hook -------------------------------------------------------


def _doubled(base):
    class Doubled(base):
        """A subclass as users write them: the hook's output changed, the rest inherited."""

        def _compute_attention(self, query, key, value, attention_mask=None, training=None,
                               return_attention_scores=False, use_causal_mask=False):  # fmt: skip
            self.seen_mask = attention_mask
            output, scores = super()._compute_attention(
                query, key, value, attention_mask=attention_mask, training=training,
                return_attention_scores=return_attention_scores,
            )  # fmt: skip
            return output * 2.0, scores

    return Doubled


def test_a_subclass_overriding_compute_attention_changes_the_layer_as_keras():
    theirs, ours = pair(
        _doubled(keras.layers.MultiHeadAttention)(2, 4),
        _doubled(keras_attn.MultiHeadAttention)(2, 4),
        X,
        X,
    )
    kwargs = dict(value_mask=X_MASK, use_causal_mask=True)  # Tq == Tv: both causal masks agree
    expected = np_(theirs(X, X, **kwargs))
    out = np_(ours(X, np.where(X_MASK[..., None], X, np.float32(1e30)), **kwargs))
    np.testing.assert_allclose(out[X_MASK], expected[X_MASK], atol=1e-5)  # the real rows
    plain = keras_attn.MultiHeadAttention(2, 4)
    plain(X, X)
    plain.set_weights(ours.get_weights())
    assert not np.allclose(out[X_MASK], np_(plain(X, X, **kwargs))[X_MASK])  # the override ran
    # The combined boolean mask, as Keras hands it: the padding and the causal mask merged.
    combined = X_MASK[:, None, :] & causal(6, 6)[None]
    np.testing.assert_array_equal(np_(ours.seen_mask).astype(bool), combined)


def test_compute_attention_called_directly_equals_keras():
    theirs, ours = pair(keras.layers.MultiHeadAttention(2, 4), keras_attn.MultiHeadAttention(2, 4),
                        X, V)  # fmt: skip
    q = rng.normal(size=(2, 6, 2, 4)).astype("float32")
    k = rng.normal(size=(2, 5, 2, 4)).astype("float32")
    v = rng.normal(size=(2, 5, 2, 4)).astype("float32")
    mask = np.broadcast_to(V_MASK[:, None, :], (2, 6, 5))
    expected, expected_scores = theirs._compute_attention(
        q, k, v, attention_mask=mask, return_attention_scores=True
    )
    out, scores = ours._compute_attention(q, k, v, attention_mask=mask,
                                          return_attention_scores=True)  # fmt: skip
    np.testing.assert_allclose(np_(out), np_(expected), atol=1e-5)
    np.testing.assert_allclose(np_(scores), np_(expected_scores), atol=1e-6)


def test_an_override_cannot_silently_drop_a_bias():
    layer = _doubled(keras_attn.MultiHeadAttention)(2, 4, position_bias=keras_attn.AlibiBias())
    with pytest.raises(ValueError, match="overrides `_compute_attention`"):
        layer(X, V)


def _doubled_gqa(base):
    class Doubled(base):
        """A GQA subclass as Keras' own test writes it: Keras' GQA hook signature."""

        def _compute_attention(self, query, key, value, attention_mask=None, training=None):
            self.seen_mask = attention_mask
            output, scores = super()._compute_attention(query, key, value, attention_mask, training)
            return output * 2.0, scores

    return Doubled


def test_a_gqa_subclass_overriding_compute_attention_changes_the_layer_as_keras():
    kwargs = dict(head_dim=4, num_query_heads=4, num_key_value_heads=2)
    theirs, ours = pair(
        _doubled_gqa(keras.layers.GroupQueryAttention)(**kwargs),
        _doubled_gqa(keras_attn.GroupedQueryAttention)(**kwargs),
        X,
        X,
    )
    call = dict(value_mask=X_MASK, use_causal_mask=True, return_attention_scores=True)
    expected, expected_w = theirs(X, X, **call)
    out, w = ours(X, np.where(X_MASK[..., None], X, np.float32(1e30)), **call)
    out, w, expected, expected_w = map(np_, (out, w, expected, expected_w))
    combined = X_MASK[:, None, :] & causal(6, 6)[None]  # (B, T, S): padding and causal merged
    seen = combined.any(-1)  # (B, T): batch 1's first query sees no key
    np.testing.assert_allclose(out[seen], expected[seen], atol=1e-5)
    heads_seen = np.broadcast_to(seen[:, None], w.shape[:-1])  # (B, h, T)
    np.testing.assert_allclose(w[heads_seen], expected_w[heads_seen], atol=1e-6)
    assert np.all(out[~seen] == 0) and np.all(w[~heads_seen] == 0)  # Keras: uniform, not zeros
    plain = keras_attn.GroupedQueryAttention(**kwargs)
    plain(X, X)
    plain.set_weights(ours.get_weights())
    plain_out = np_(plain(X, X, use_causal_mask=True, value_mask=X_MASK))
    assert not np.allclose(out[seen], plain_out[seen])  # the override ran
    # The combined boolean mask, as Keras hands it.
    np.testing.assert_array_equal(np_(ours.seen_mask).astype(bool), combined)
    # Without scores asked for, the hook is told so (Keras keeps the flag on the layer).
    ours(X, X)
    assert ours._return_attention_scores is False and ours.seen_mask is None


@pytest.mark.parametrize("return_scores", [False, True])
def test_gqa_compute_attention_called_directly_equals_keras(return_scores):
    kwargs = dict(head_dim=4, num_query_heads=4, num_key_value_heads=2)
    theirs, ours = pair(keras.layers.GroupQueryAttention(**kwargs),
                        keras_attn.GroupedQueryAttention(**kwargs), X, V)  # fmt: skip
    theirs._return_attention_scores = ours._return_attention_scores = return_scores
    q, k, v = (rng.normal(size=(2, t, 4, 4)).astype("float32") for t in (6, 5, 5))
    mask = np.broadcast_to(V_MASK[:, None, :], (2, 6, 5))
    expected, expected_scores = theirs._compute_attention(q, k, v, attention_mask=mask)
    out, scores = ours._compute_attention(q, k, v, attention_mask=mask)
    np.testing.assert_allclose(np_(out), np_(expected), atol=1e-5)
    assert (scores is None) is (not return_scores)
    if return_scores:
        np.testing.assert_allclose(np_(scores), np_(expected_scores), atol=1e-6)
