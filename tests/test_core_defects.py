"""The defects found from outside on the paths the shared pipeline did not own, one test each.

Each test failed on the code before the attention core was consolidated
(masks in `keras_attn.masks`, kernels in `keras_attn.kernels`, the choice in
`keras_attn.ops.attention`, the cache in `keras_attn.cache`).
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from kernel_calls import run

import keras_attn
from keras_attn import kernels
from numpy_reference import attend, scaled_dot_scores

rng = np.random.default_rng(7)


def np_(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def t(x, dtype=None):
    return keras.ops.convert_to_tensor(x, dtype)


# -- 1. masked scores are replaced, never added to --------------------------------


@pytest.mark.parametrize("name", ["dense", "fused", "chunked"])
def test_a_masked_score_above_the_old_bias_does_not_leak_in(name):
    """Float32: a masked score of ~1e32 beat the fused and chunked kernels' -1e30 bias."""
    q = rng.normal(size=(2, 2, 5, 8)).astype("float32")
    k = rng.normal(size=(2, 2, 6, 8)).astype("float32")
    v = rng.normal(size=(2, 2, 6, 4)).astype("float32")
    mask = np.ones((2, 1, 1, 6), bool)
    mask[:, ..., 4:] = False
    q = np.abs(q) + 1.0
    k[..., 4:, :] = 1e31  # q . k ~ 1e32 at the masked keys
    kernel = kernels.KERNELS[name]
    out, _ = run(kernel, t(q), t(k), t(v), t(mask), block_size=4 if name == "chunked" else None)
    ref, _ = attend(scaled_dot_scores(q, k), v, mask)
    np.testing.assert_allclose(np_(out), ref, atol=1e-5)


@pytest.mark.parametrize("name", ["dense", "fused", "chunked"])
def test_a_masked_score_that_overflows_float16_does_not_make_the_row_nan(name):
    """Float16 keys of 3e4 at padded positions: q . k overflows to inf, and inf + bias is inf."""
    q = np.abs(rng.normal(size=(2, 2, 5, 8))).astype("float16") + 1
    k = rng.normal(size=(2, 2, 6, 8)).astype("float16")
    v = rng.normal(size=(2, 2, 6, 4)).astype("float16")
    mask = np.ones((2, 1, 1, 6), bool)
    mask[1, ..., 3:] = False
    k[1, :, 3:] = 3e4  # finite in float16; the score is not
    out, _ = run(kernels.KERNELS[name], t(q), t(k), t(v), t(mask))
    ref, _ = attend(scaled_dot_scores(q.astype("float64"), k.astype("float64")), v, mask)
    assert np.all(np.isfinite(np_(out)))
    np.testing.assert_allclose(np_(out), ref, atol=2e-2)


def test_mixed_float16_mha_default_path_equals_the_weights_path_with_huge_padding():
    keras.config.set_dtype_policy("mixed_float16")
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=8)
    x = np.abs(rng.normal(size=(2, 6, 16))).astype("float32")
    mask = np.array([[1] * 6, [1, 1, 1, 0, 0, 0]], bool)
    layer(t(x), t(x))
    # Positive projections: a real query (~40 per feature) against a padded key
    # (800 per feature) scores ~1e5, past float16's 65504; real scores stay ~1e3.
    layer.key_dense.kernel.assign(np.ones(layer.key_dense.kernel.shape, "float32"))
    layer.query_dense.kernel.assign(np.full(layer.query_dense.kernel.shape, 3.0, "float32"))
    x[1, 3:] = 50.0
    fast = np_(layer(t(x), t(x), query_mask=t(mask), value_mask=t(mask)))
    slow, _ = layer(
        t(x), t(x), query_mask=t(mask), value_mask=t(mask), return_attention_scores=True
    )
    assert np.all(np.isfinite(fast))
    # rtol: on torch the default path is the backend kernel, computed in float32 there (a mask
    # in float16), while the weights path rounds its weights to float16 (about 1e-2 apart).
    np.testing.assert_allclose(fast, np_(slow), atol=1e-2, rtol=1e-2)
    assert np.all(fast[1, 3:] == 0)


# -- 2. Tv = 0 gives zeros, not the output bias ------------------------------------


@pytest.mark.parametrize("implementation", ["auto", "fused", "chunked", "dense"])
def test_an_empty_value_gives_zeros_on_every_path(implementation):
    layer = keras_attn.MultiHeadAttention(
        num_heads=2, key_dim=4, bias_initializer="ones", implementation=implementation
    )
    q = t(rng.normal(size=(2, 3, 8)).astype("float32"))
    empty = t(np.zeros((2, 0, 8), "float32"))
    out = layer(q, empty, return_attention_scores=implementation == "dense")
    out = out[0] if isinstance(out, tuple) else out
    np.testing.assert_array_equal(np_(out), np.zeros((2, 3, 8)))


def test_a_decoder_block_with_an_empty_source_adds_nothing_in_cross_attention():
    block = keras_attn.TransformerDecoderBlock(16, 2, bias_initializer="ones")
    x = t(rng.normal(size=(2, 4, 8)).astype("float32"))
    block(x, t(np.zeros((2, 0, 8), "float32")))
    cross = block._cross_attention_layer(x, t(np.zeros((2, 0, 8), "float32")))
    np.testing.assert_array_equal(np_(cross), np.zeros((2, 4, 8)))


# -- 3. the chunked kernel stays O(L) in memory under an eager GradientTape -----------

_MEMORY_CHILD = """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
from keras_attn import kernels

def hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) * 1024

q = tf.random.normal((1, 4, 4096, 32))
def step():
    with tf.GradientTape() as tape:
        tape.watch(q)
        out, _ = kernels.chunked_attention(
            q, q, q, kernels.AttentionSpec(is_causal=True, return_weights=False), block_size=512
        )
        loss = tf.reduce_sum(out)
    return tape.gradient(loss, q)
fn = step if sys.argv[1] == "eager" else tf.function(step)
fn()  # warm up: what stays allocated after one step is not the step's peak
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = hwm()
fn()
print(json.dumps({"peak_increase": hwm() - before}))
"""


@pytest.mark.tensorflow_only
def test_chunked_training_step_under_an_eager_tape_keeps_linear_memory():
    """One (4, 4096, 4096) float32 score tensor is 256 MiB; the eager step used to keep them all."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux /proc to read the peak RSS")
    increase = {}
    for mode in ("eager", "graph"):
        run = subprocess.run(
            [sys.executable, "-c", _MEMORY_CHILD, mode], capture_output=True, text=True, check=True
        )
        increase[mode] = json.loads(run.stdout.strip().splitlines()[-1])["peak_increase"]
    # Before the fix: ~1.4 GiB eager against ~0.1 GiB in a graph.
    assert increase["eager"] < 256 * 2**20, increase


# -- 4. the cache remembers which of its positions are valid keys ---------------------


def test_stepwise_decoding_after_a_left_padded_prefill_equals_the_full_pass():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    x = rng.normal(size=(2, 7, 8)).astype("float32")
    mask = np.array([[1] * 7, [0, 0, 1, 1, 1, 1, 1]], bool)  # left padding in the prompt
    full = np_(layer(t(x), t(x), query_mask=t(mask), value_mask=t(mask), use_causal_mask=True))
    cache = layer.empty_cache(2, 7)
    prefill, cache = layer(
        t(x[:, :4]), t(x[:, :4]), query_mask=t(mask[:, :4]), value_mask=t(mask[:, :4]),
        use_causal_mask=True, cache=cache, cache_update_index=0,
    )  # fmt: skip
    outputs = [np_(prefill)]
    for i in range(4, 7):
        out, cache = layer(
            t(x[:, i : i + 1]), t(x[:, i : i + 1]), use_causal_mask=True, cache=cache,
            cache_update_index=i,
        )  # fmt: skip
        outputs.append(np_(out))
    np.testing.assert_allclose(np.concatenate(outputs, 1), full, atol=1e-5)
    np.testing.assert_array_equal(np_(cache.valid), mask)


def test_decoder_block_stepwise_after_a_left_padded_prefill_equals_the_full_pass():
    block = keras_attn.TransformerDecoderBlock(16, 2)
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    enc = t(rng.normal(size=(2, 5, 8)).astype("float32"))
    mask = np.array([[1] * 6, [0, 0, 0, 1, 1, 1]], bool)
    full = np_(block(t(x), enc, decoder_padding_mask=t(mask)))
    cache = block.empty_cache(2, 6)
    out, cache, cross = block(
        t(x[:, :3]), enc, decoder_padding_mask=t(mask[:, :3]), self_attention_cache=cache,
        self_attention_cache_update_index=0,
    )  # fmt: skip
    outputs = [np_(out)]
    for i in range(3, 6):
        out, cache, cross = block(
            t(x[:, i : i + 1]), self_attention_cache=cache, self_attention_cache_update_index=i,
            cross_attention_cache=cross,
        )  # fmt: skip
        outputs.append(np_(out))
    stepped = np.concatenate(outputs, 1)
    np.testing.assert_allclose(stepped[mask], full[mask], atol=1e-5)  # the real tokens


# -- 5. every weight gets its own initializer ------------------------------------------


def _differ(a, b):
    a, b = np_(a), np_(b)
    n = min(a.size, b.size)
    return not np.allclose(a.reshape(-1)[:n], b.reshape(-1)[:n])


def test_sublayers_do_not_start_with_identical_weights():
    x = t(rng.normal(size=(2, 5, 8)).astype("float32"))
    mha = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    mha(x, x)
    assert _differ(mha.query_dense.kernel, mha.key_dense.kernel)
    assert _differ(mha.key_dense.kernel, mha.value_dense.kernel)
    kv = keras_attn.KeyValueAttention(key_dim=8)
    kv(x, x)
    assert _differ(kv.query_dense.kernel, kv.key_dense.kernel)
    additive = keras_attn.AdditiveAttention()
    additive(x, x)
    assert _differ(additive.score_layer.query_kernel, additive.score_layer.key_kernel)
    block = keras_attn.TransformerDecoderBlock(8, 2)
    block(x, x)
    # The attention's query projection, by its Keras name or (before that lands) ours.
    query = lambda mha: getattr(mha, "_query_dense", None) or mha.query_dense  # noqa: E731
    assert _differ(
        query(block._self_attention_layer).kernel, query(block._cross_attention_layer).kernel
    )
    assert _differ(
        block._feedforward_intermediate_dense.kernel, block._feedforward_output_dense.kernel
    )
    embedding = keras_attn.TokenAndPositionEmbedding(20, 5, 8, position="learned")
    embedding(t(np.zeros((1, 5), "int32")))
    table = embedding.position_embedding.weights[0]
    assert _differ(embedding.token_embedding.embeddings[:5], table)


# -- 6. an explicit seed gives each dropout its own masks -------------------------------


def test_the_residual_dropouts_of_a_seeded_block_drop_different_features():
    block = keras_attn.TransformerDecoderBlock(8, 2, dropout=0.5, seed=3)
    x = t(rng.normal(size=(2, 5, 8)).astype("float32"))
    block(x, x)
    ones = t(np.ones((4, 64), "float32"))
    dropouts = [block._self_attention_dropout, block._cross_attention_dropout,
                block._feedforward_dropout]  # fmt: skip
    kept = [np_(d(ones, training=True)) != 0 for d in dropouts]
    for i in range(3):
        for j in range(i):
            assert not np.array_equal(kept[i], kept[j]), (i, j)
    attentions = (block._self_attention_layer, block._cross_attention_layer)
    seeds = {*(a.seed for a in attentions), *(d.seed for d in dropouts)}
    assert len(seeds) == 5 and None not in seeds


# -- 7. a tensor cache index past the end fails loudly ------------------------------------


def test_a_tensor_cache_index_past_the_end_is_not_clamped():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    x = t(rng.normal(size=(2, 1, 8)).astype("float32"))
    layer(x, x)
    cache = layer.empty_cache(2, 4)
    with pytest.raises(ValueError, match="cache_update_index"):
        layer(x, x, cache=cache, cache_update_index=4)
    index = t(4, "int32")
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        step = tf.function(lambda x, c, i: layer(x, x, cache=c, cache_update_index=i))
        with pytest.raises(tf.errors.InvalidArgumentError, match="cache_update_index"):
            step(x, cache, index)
    elif keras.backend.backend() == "torch":  # eager: the index is read and checked
        with pytest.raises(ValueError, match="cache_update_index"):
            layer(x, x, cache=cache, cache_update_index=index)
    else:  # no error can be raised under jit: the step's output is NaN
        out, _ = layer(x, x, cache=cache, cache_update_index=index)
        assert np.all(np.isnan(np_(out)))
    out, _ = layer(x, x, cache=cache, cache_update_index=t(3, "int32"))  # the last position fits
    assert np.all(np.isfinite(np_(out)))


# -- 8. an explicit query_mask is the output mask ----------------------------------------


@pytest.mark.parametrize("make", [
    lambda: keras_attn.MultiHeadAttention(num_heads=2, key_dim=4),
    lambda: keras_attn.DotAttention(),
])  # fmt: skip
def test_an_explicit_query_mask_is_the_output_mask(make):
    x = t(rng.normal(size=(2, 5, 8)).astype("float32"))
    mask = t(np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool))
    layer, pool = make(), keras_attn.AttentionPooling(4)
    out = layer(x, x, query_mask=mask, value_mask=mask)
    np.testing.assert_allclose(np_(pool(out)), np_(pool(out, mask=mask)), atol=1e-6)
    block = keras_attn.TransformerEncoderBlock(16, 2)
    out = block(x, padding_mask=mask)
    np.testing.assert_allclose(np_(pool(out)), np_(pool(out, mask=mask)), atol=1e-6)


# -- 9. clear errors, NumPy scalars accepted ------------------------------------------------


def test_list_and_ragged_masks_and_numpy_scalars():
    x = t(rng.normal(size=(2, 3, 8)).astype("float32"))
    layer = keras_attn.MultiHeadAttention(
        num_heads=np.int64(2), key_dim=np.int32(4), dropout=np.float32(0.0)
    )
    assert type(layer.num_heads) is int and layer.get_config()["num_heads"] == 2
    listed = layer(x, x, value_mask=[[True, True, False], [True, False, False]])
    arrayed = layer(x, x, value_mask=t(np.array([[1, 1, 0], [1, 0, 0]], bool)))
    np.testing.assert_allclose(np_(listed), np_(arrayed), atol=1e-6)
    with pytest.raises(TypeError, match="`value_mask` must be a dense boolean"):
        layer(x, x, value_mask=object())
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        ragged = tf.ragged.constant([[True, True], [True]])
        with pytest.raises(TypeError, match="`query_mask` must be a dense boolean"):
            layer(x, x, query_mask=ragged)
    assert keras_attn.TransformerEncoderBlock(np.int64(16), np.int64(2)).num_heads == 2


# -- a NaN at a masked key reaches no gradient of the score layers -------------------------


@pytest.mark.parametrize("make", [
    keras_attn.DotAttention, keras_attn.ScaledDotAttention, keras_attn.BilinearAttention,
    keras_attn.AdditiveAttention, lambda: keras_attn.KeyValueAttention(key_dim=4),
    lambda: keras_attn.HardAttention(), lambda: keras_attn.PointerAttention(4),
])  # fmt: skip
def test_a_nan_at_a_masked_key_is_in_no_gradient_of_the_score_layers(make):
    import layer_checks

    query = rng.normal(size=(2, 3, 6)).astype("float32")
    key = rng.normal(size=(2, 4, 6)).astype("float32")
    value = rng.normal(size=(2, 4, 6)).astype("float32")
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    key[~mask] = np.nan
    layer = make()
    layer(t(query), t(value), key=t(key))

    def fn(q, k, v):
        return layer(q, v, key=k, value_mask=t(mask))

    out, grads = layer_checks.value_and_grads(
        fn, (query, key, value), layer.trainable_weights, jit=False
    )
    assert np.all(np.isfinite(np_(out)))
    for g in grads:
        if g is not None:
            assert np.all(np.isfinite(np_(g)))
