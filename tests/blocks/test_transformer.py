"""FeedForward and the Transformer blocks: shared checks, formulas, cached decoding."""

import functools
import math

import keras
import numpy as np
import pytest

import keras_attn
from layer_checks import check_layer, compiled

rng = np.random.default_rng(0)
X = rng.normal(size=(2, 6, 8)).astype("float32")
X_MASK = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], bool)
ENC = rng.normal(size=(2, 5, 12)).astype("float32")
ENC_MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], bool)


def np_(x):
    return keras.ops.convert_to_numpy(x)


def layer_norm(x, gamma, beta, eps=1e-5):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


# -- FeedForward ------------------------------------------------------------


def test_feed_forward_layer_checks(tmp_path):
    check_layer(
        functools.partial(keras_attn.FeedForward, intermediate_dim=16, dropout=0.1),
        {"inputs": X},
        tmp_path=tmp_path,
    )


def test_feed_forward_formula():
    ffn = keras_attn.FeedForward(intermediate_dim=16, output_dim=5, activation="gelu")
    out = np_(ffn(X))
    w1, b1, w2, b2 = ffn.get_weights()
    hidden = X @ w1 + b1
    gelu = 0.5 * hidden * (1 + np.vectorize(math.erf)(hidden / np.sqrt(2)))
    np.testing.assert_allclose(out, gelu @ w2 + b2, atol=1e-5)


# -- Encoder block ------------------------------------------------------------


@pytest.mark.parametrize("normalize_first", [False, True])
def test_encoder_layer_checks(normalize_first, tmp_path):
    check_layer(
        functools.partial(
            keras_attn.TransformerEncoderBlock,
            intermediate_dim=16,
            num_heads=2,
            dropout=0.1,
            normalize_first=normalize_first,
        ),
        {"inputs": X},
        tmp_path=tmp_path,
        masks={"padding_mask": X_MASK},
        mask_covers={"padding_mask": ["inputs"]},
        output_mask="padding_mask",
        call_kwargs={"return_attention_scores": True},
    )


def test_encoder_layer_checks_causal_rotary_gqa(tmp_path):
    check_layer(
        functools.partial(
            keras_attn.TransformerEncoderBlock,
            intermediate_dim=16,
            num_heads=4,
            num_key_value_heads=2,
            rotary_embedding=keras_attn.RotaryEmbedding(),
        ),
        {"inputs": X},
        tmp_path=tmp_path,
        call_kwargs={"use_causal_mask": True},
        causal=True,
    )


def numpy_encoder(block, x, mask, normalize_first):
    """The paper's formulas with the block's own weights; padded steps zeroed on entry."""
    wq, bq, wk, bk, wv, bv, wo, bo = (np_(w) for w in block._self_attention_layer.get_weights())
    g1, be1 = (np_(w) for w in block._self_attention_layer_norm.get_weights())
    w1, b1 = (np_(w) for w in block._feedforward_intermediate_dense.get_weights())
    w2, b2 = (np_(w) for w in block._feedforward_output_dense.get_weights())
    g2, be2 = (np_(w) for w in block._feedforward_layer_norm.get_weights())
    x = np.where(mask[..., None], x, 0.0)

    def attention(h):
        q = np.einsum("btd,dhk->bhtk", h, wq) + bq[None, :, None]
        k = np.einsum("btd,dhk->bhtk", h, wk) + bk[None, :, None]
        v = np.einsum("btd,dhk->bhtk", h, wv) + bv[None, :, None]
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
        s = np.where(mask[:, None, None, :], s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w = w / w.sum(-1, keepdims=True)
        out = np.einsum("bhtk,hko->bto", w @ v, wo) + bo
        return np.where(mask[..., None], out, 0.0)  # padded query rows give zeros

    def ffn_np(h):
        return np.maximum(h @ w1 + b1, 0) @ w2 + b2

    if normalize_first:
        x = x + attention(layer_norm(x, g1, be1))
        return x + ffn_np(layer_norm(x, g2, be2))
    x = layer_norm(x + attention(x), g1, be1)
    return layer_norm(x + ffn_np(x), g2, be2)


@pytest.mark.parametrize("normalize_first", [False, True])
def test_encoder_matches_numpy_reference(normalize_first):
    block = keras_attn.TransformerEncoderBlock(16, 2, normalize_first=normalize_first)
    block.build(X.shape)
    for w in block.weights:
        w.assign(rng.normal(size=w.shape).astype("float32") * 0.4 + (w.name == "gamma"))
    hostile = np.where(X_MASK[..., None], X, np.float32(1e30))  # never reaches the output
    out = np_(block(hostile, padding_mask=X_MASK))
    np.testing.assert_allclose(out, numpy_encoder(block, X, X_MASK, normalize_first), atol=1e-5)


def test_encoder_implicit_mask_equals_explicit_padding_mask():
    tokens = np.array([[3, 4, 5, 0, 0], [6, 7, 0, 0, 0]])
    embed = keras_attn.TokenAndPositionEmbedding(10, 5, 8, mask_zero=True)
    block = keras_attn.TransformerEncoderBlock(intermediate_dim=16, num_heads=2)
    x = embed(tokens)
    implicit = block(x)
    explicit = block(x, padding_mask=tokens != 0)
    np.testing.assert_allclose(np_(implicit), np_(explicit), atol=1e-6)  # padded rows too
    with_attention_mask = block(x, attention_mask=np.ones((2, 5, 5), bool))  # still implicit
    np.testing.assert_allclose(np_(with_attention_mask), np_(explicit), atol=1e-6)
    unmasked = block(np_(x))  # a NumPy copy carries no mask: padding is attended
    assert not np.allclose(np_(unmasked)[tokens != 0], np_(explicit)[tokens != 0], atol=1e-3)


def test_block_argument_errors():
    with pytest.raises(ValueError, match="num_heads"):
        keras_attn.TransformerEncoderBlock(intermediate_dim=4, num_heads=0)
    with pytest.raises(ValueError, match="dropout"):
        keras_attn.TransformerEncoderBlock(4, 2, dropout=1.5)
    with pytest.raises(ValueError, match="attention_dropout"):
        keras_attn.TransformerEncoderBlock(4, 2, attention_dropout=-0.1)
    with pytest.raises(TypeError, match="normalize_first"):
        keras_attn.TransformerDecoderBlock(4, 2, normalize_first="yes")
    with pytest.raises(ValueError, match="implementation"):
        keras_attn.TransformerDecoderBlock(4, 2, implementation="flash")
    with pytest.raises(ValueError, match="at least `num_heads`"):
        keras_attn.TransformerEncoderBlock(intermediate_dim=4, num_heads=64)(X)
    with pytest.raises(TypeError):  # our extras are keyword-only
        keras_attn.TransformerEncoderBlock(4, 2, 0.0, "relu", 1e-5, "glorot_uniform", "zeros",
                                           False, 0.0)  # fmt: skip
    with pytest.raises(ValueError, match="intermediate_dim"):
        keras_attn.FeedForward(intermediate_dim=-1)


# -- Decoder block ------------------------------------------------------------


@pytest.mark.parametrize("normalize_first", [False, True])
def test_decoder_layer_checks(normalize_first, tmp_path):
    check_layer(
        functools.partial(
            keras_attn.TransformerDecoderBlock,
            intermediate_dim=16,
            num_heads=2,
            dropout=0.1,
            normalize_first=normalize_first,
        ),
        {"decoder_sequence": X, "encoder_sequence": ENC},
        tmp_path=tmp_path,
        masks={"decoder_padding_mask": X_MASK, "encoder_padding_mask": ENC_MASK},
        mask_covers={
            "decoder_padding_mask": ["decoder_sequence"],
            "encoder_padding_mask": ["encoder_sequence"],
        },
        output_mask="decoder_padding_mask",
        call_kwargs={"return_attention_scores": True},
        causal=False,  # the encoder sequence is not causal; see the decoder-only check
    )


def test_decoder_only_layer_checks_causal(tmp_path):
    check_layer(
        functools.partial(
            keras_attn.TransformerDecoderBlock,
            intermediate_dim=16,
            num_heads=2,
            rotary_embedding=keras_attn.RotaryEmbedding(),
        ),
        {"decoder_sequence": X},
        tmp_path=tmp_path,
        causal=True,
    )


def test_decoder_is_causal_by_default_and_sees_the_whole_source():
    block = keras_attn.TransformerDecoderBlock(intermediate_dim=16, num_heads=2)
    out = np_(block(X, ENC))
    changed = X.copy()
    changed[:, 4:] += 1.0
    out_changed = np_(block(changed, ENC))
    np.testing.assert_allclose(out_changed[:, :4], out[:, :4], atol=1e-6)
    enc_changed = ENC.copy()
    enc_changed[:, -1] += 1.0  # every decoder position attends to the last source token
    assert not np.allclose(np_(block(X, enc_changed))[:, 0], out[:, 0], atol=1e-4)


def decode_step_by_step(blocks, dec, enc, enc_mask, first_chunk, jit=False):
    """Runs a stack of decoder blocks over `dec` with caches: a prefill, then one token a step."""
    length = dec.shape[1]
    caches = [b.empty_cache(dec.shape[0], length) for b in blocks]
    cross = [None] * len(blocks)

    def run(x, index, caches, cross):
        new_caches, new_cross = [], []
        for block, cache, cross_cache in zip(blocks, caches, cross, strict=True):
            x, cache, cross_cache = block(
                x,
                enc if cross_cache is None else None,  # keras-hub passes it each step: both work
                # The mask is given with the source only: the cross cache keeps it.
                encoder_padding_mask=enc_mask if cross_cache is None else None,
                self_attention_cache=cache,
                self_attention_cache_update_index=index,
                cross_attention_cache=cross_cache,
            )
            new_caches.append(cache)
            new_cross.append(cross_cache)
        return x, new_caches, new_cross

    x, caches, cross = run(dec[:, :first_chunk], 0, caches, cross)  # computes the cross caches
    step = compiled(run) if jit else run
    outputs = [x]
    for t in range(first_chunk, length):
        x, caches, cross = step(dec[:, t : t + 1], keras.ops.convert_to_tensor(t), caches, cross)
        outputs.append(x)
    return np.concatenate([np_(o) for o in outputs], axis=1)


@pytest.mark.parametrize(
    "kv_heads,rotary,normalize_first,first_chunk,jit",
    [
        (None, False, False, 1, False),
        (2, True, False, 3, False),
        # XLA: TensorFlow only (`jax_slow`: ~40 s on JAX; torch has no XLA)
        pytest.param(1, True, True, 2, True, marks=pytest.mark.jax_slow),
    ],
)
def test_cached_decoding_equals_full_pass(kv_heads, rotary, normalize_first, first_chunk, jit):
    dec = rng.normal(size=(2, 7, 16)).astype("float32")
    blocks = [
        keras_attn.TransformerDecoderBlock(
            intermediate_dim=32,
            num_heads=4,
            num_key_value_heads=kv_heads,
            normalize_first=normalize_first,
            rotary_embedding=keras_attn.RotaryEmbedding() if rotary else None,
        )
        for _ in range(2)
    ]
    full = dec
    for block in blocks:
        full = block(full, ENC, encoder_padding_mask=ENC_MASK)
    stepped = decode_step_by_step(blocks, dec, ENC, ENC_MASK, first_chunk, jit=jit)
    np.testing.assert_allclose(stepped, np_(full), atol=1e-5)


def _structure(outputs):
    """Each output's class, shape and dtype, in the outputs' nesting (a `KVCache` by name)."""
    if isinstance(outputs, keras_attn.KVCache):
        return ("KVCache", *(_structure(o) for o in outputs))
    if isinstance(outputs, tuple):
        return tuple(_structure(o) for o in outputs)
    return tuple(outputs.shape), keras.backend.standardize_dtype(outputs.dtype)


def _inputs(value, name):
    """`keras.Input`s for a tensor or a `KVCache` of arrays (batch size kept)."""
    if isinstance(value, keras_attn.KVCache):
        return keras_attn.KVCache(*(_inputs(v, f"{name}_{f}") for f, v in value._asdict().items()))
    dtype = keras.backend.standardize_dtype(value.dtype)
    return keras.Input(batch_shape=tuple(value.shape), dtype=dtype, name=name)


@pytest.mark.parametrize("form", ["kv_cache", "stacked"])
@pytest.mark.parametrize("cross", [False, True])
def test_a_functional_model_with_cached_inputs_builds_and_equals_the_block(form, cross):
    """The symbolic outputs (`compute_output_spec`) have the eager call's structure."""
    block = keras_attn.TransformerDecoderBlock(intermediate_dim=16, num_heads=2)
    enc = ENC[:, :, :8]
    block(X, enc if cross else None)
    if form == "stacked":  # keras-hub's: (B, 2, S, heads, head_dim), the source's too
        cache = rng.normal(size=(2, 2, 6, 2, 4)).astype("float32")
        cross_cache = rng.normal(size=(2, 2, 5, 2, 4)).astype("float32")
    else:
        cache = block.empty_cache(2, 6)._replace(valid=np.array([[1, 1, 0, 0, 0, 0]] * 2, bool))
        cross_cache = block.compute_cross_attention_cache(enc) if cross else None
    arrays = {"decoder_sequence": X[:, 2:3], "self_attention_cache": cache}
    if cross:
        arrays.update(cross_attention_cache=cross_cache)
        if form == "stacked":  # reused, valid where the source's padding mask is
            arrays.update(encoder_sequence=enc, encoder_padding_mask=ENC_MASK)
    arrays = keras.tree.map_structure(keras.ops.convert_to_tensor, arrays)
    inputs = {name: _inputs(value, name) for name, value in arrays.items()}
    symbolic = block(**inputs, self_attention_cache_update_index=2, return_attention_scores=True)
    model = keras.Model(inputs, symbolic)
    eager = block(**arrays, self_attention_cache_update_index=2, return_attention_scores=True)
    assert _structure(symbolic) == _structure(eager)
    for a, b in zip(keras.tree.flatten(model(arrays)), keras.tree.flatten(eager), strict=True):
        np.testing.assert_allclose(np_(a), np_(b), atol=1e-5)


def projection(mha, name):
    """`mha`'s `name` projection (`_key_dense`, or `key_dense` before Keras' names land)."""
    found = getattr(mha, f"_{name}_dense", None)
    return getattr(mha, f"{name}_dense") if found is None else found


@pytest.mark.jax_slow  # ~35 s of eager steps on JAX; TensorFlow and torch run it
@pytest.mark.parametrize("pass_source", [False, True])
def test_cached_decoding_projects_the_source_once(pass_source):
    block = keras_attn.TransformerDecoderBlock(intermediate_dim=8, num_heads=2)
    dec = rng.normal(size=(2, 3, 12)).astype("float32")
    block(dec, ENC)
    calls = []
    key_dense = projection(block._cross_attention_layer, "key")
    original = key_dense.call
    key_dense.call = lambda *a, **k: calls.append(1) or original(*a, **k)
    cache, cross = block.empty_cache(2, 3), None
    for t in range(3):
        _, cache, cross = block(
            dec[:, t : t + 1],
            ENC if cross is None or pass_source else None,
            self_attention_cache=cache,
            self_attention_cache_update_index=t,
            cross_attention_cache=cross,
        )
    assert len(calls) == 1


def test_decoder_errors():
    block = keras_attn.TransformerDecoderBlock(intermediate_dim=8, num_heads=2)
    block(X, ENC)
    with pytest.raises(ValueError, match="has cross-attention"):
        block(X)
    with pytest.raises(ValueError, match="cache_update_index"):
        block(X, ENC, self_attention_cache=block.empty_cache(2, 6))
    with pytest.raises(ValueError, match="needs a `self_attention_cache`"):
        block(X, cross_attention_cache=block.compute_cross_attention_cache(ENC))
    with pytest.raises(ValueError, match="cross_attention_cache_update_index"):
        block(
            X,
            ENC,
            self_attention_cache=block.empty_cache(2, 6),
            self_attention_cache_update_index=0,
            cross_attention_cache_update_index=0,
        )
    decoder_only = keras_attn.TransformerDecoderBlock(intermediate_dim=8, num_heads=2)
    decoder_only(X)
    with pytest.raises(ValueError, match="no cross-attention"):
        decoder_only(X, ENC)
    with pytest.raises(ValueError, match="no cross-attention"):
        decoder_only.compute_cross_attention_cache(ENC)
