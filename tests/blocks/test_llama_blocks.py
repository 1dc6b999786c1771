"""The Transformer blocks' Llama-family options: RMS norm, the gated feed-forward, projections
without biases or with q/k/v biases only, Llama 3's rope scaling, Mistral's sliding window.

Each against a float64 NumPy reference of the block written from the formulas (Llama's
`LlamaDecoderLayer`: `x + Attn(RMS(x))`, `x + W_down(act(W_gate RMS(x)) * W_up RMS(x))`), on
every attention kernel; cached decoding after a padded prefill against the full pass; the
shared layer checks (config, masks, `.keras`, fit, mixed precision); configs written before
the options load as they were.
"""

import functools
import math

import keras
import numpy as np
import pytest

import keras_attn
from layer_checks import check_layer
from numpy_reference import llama3_scaling

rng = np.random.default_rng(58)
KERNELS = ("dense", "fused", "chunked", "backend")
MASK = np.array([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], bool)  # a left-padded row


def np_(x):
    return keras.ops.convert_to_numpy(x).astype("float64")


# -- NumPy references, from the formulas ------------------------------------------------


def np_rms_norm(x, scale, eps):
    """Llama's RMSNorm: `x / sqrt(mean(x^2) + eps) * scale`."""
    return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps) * scale


def np_layer_norm(x, gamma, beta, eps):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def silu(x):
    return x / (1 + np.exp(-x))


def gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))


def np_llama3_frequencies(theta, depth, factor, low, high, original):
    """Llama 3.1's rotary frequencies: `theta^(-2i/d)` scaled by Meta's `apply_scaling`."""
    return llama3_scaling(theta ** -(np.arange(0, depth, 2) / depth), factor, low, high, original)


def np_rope(x, positions, frequencies):
    """Rotates `x` `(B, T, h, d)`: pairs `(x_j, x_{j + d/2})` by `position * frequency_j`."""
    angles = np.asarray(positions, "float64")[:, None] * frequencies  # (T, d/2)
    cos, sin = np.cos(angles)[None, :, None], np.sin(angles)[None, :, None]
    a, b = np.split(x, 2, axis=-1)
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _weights(layer):
    """`(kernel, bias or 0)` of a projection, float64."""
    return np_(layer.kernel), 0.0 if layer.bias is None else np_(layer.bias)


def np_block(block, x, mask, causal, frequencies=None, scaling_factor=1.0):
    """The block's function in float64 from its weights: padded steps zeroed on entry."""
    att = block._self_attention_layer
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = (
        _weights(layer)
        for layer in (att._query_dense, att._key_dense, att._value_dense, att._output_dense)
    )
    heads, groups = wq.shape[1], wk.shape[1]
    eps, window = block.layer_norm_epsilon, block.sliding_window
    activation = {"silu": silu, "gelu": gelu, "relu": lambda h: np.maximum(h, 0)}[
        block.activation.__name__
    ]

    def norm(layer, h):
        if block.normalization == "rms_norm":
            return np_rms_norm(h, np_(layer.scale), eps)
        return np_layer_norm(h, np_(layer.gamma), np_(layer.beta), eps)

    def attention(h):
        length = h.shape[1]
        q = np.einsum("btd,dhk->bthk", h, wq) + bq
        k = np.einsum("btd,dhk->bthk", h, wk) + bk
        v = np.einsum("btd,dhk->bthk", h, wv) + bv
        if frequencies is not None:
            positions = np.arange(length) / scaling_factor
            q, k = np_rope(q, positions, frequencies), np_rope(k, positions, frequencies)
        k, v = np.repeat(k, heads // groups, axis=2), np.repeat(v, heads // groups, axis=2)
        scores = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(q.shape[-1])
        i, j = np.arange(length)[:, None], np.arange(length)[None, :]
        visible = mask[:, None, None, :] & np.ones((length, length), bool)
        if causal:
            visible = visible & (j <= i)
        if window is not None:
            visible = visible & (np.abs(i - j) < window)
        scores = np.where(visible, scores, -1e300)
        weights = np.exp(scores - scores.max(-1, keepdims=True)) * visible
        total = weights.sum(-1, keepdims=True)
        weights = weights / np.where(total > 0, total, 1.0)  # a row that sees nothing: zeros
        out = np.einsum("bhqs,bshk->bqhk", weights, v)
        out = np.einsum("bqhk,hko->bqo", out, wo) + bo
        return np.where(mask[..., None], out, 0.0)  # padded query rows give zeros

    def feedforward(h):
        w_up, b_up = _weights(block._feedforward_intermediate_dense)
        w_down, b_down = _weights(block._feedforward_output_dense)
        if block.feedforward == "gated":
            w_gate, b_gate = _weights(block._feedforward_gate_dense)
            hidden = activation(h @ w_gate + b_gate) * (h @ w_up + b_up)
        else:
            hidden = activation(h @ w_up + b_up)
        return hidden @ w_down + b_down

    x = np.where(mask[..., None], x, 0.0)
    norm_1, norm_2 = block._self_attention_layer_norm, block._feedforward_layer_norm
    if block.normalize_first:
        x = x + attention(norm(norm_1, x))
        return x + feedforward(norm(norm_2, x))
    x = norm(norm_1, x + attention(x))
    return norm(norm_2, x + feedforward(x))


# -- The variants ------------------------------------------------------------------------

LLAMA3_ROPE = dict(
    max_wavelength=10000,
    scaling_factor=4.0,
    rope_type="llama3",
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    # With key_dim 8 the wavelengths are 2 pi (1, 10, 100, 1000): one kept (< 64 / 4), one
    # interpolated, two divided by the factor (> 64 / 1).
    original_max_position_embeddings=64,
)


def _variant(name, implementation="auto", **extra):
    """`(block class, block arguments, causal, rotary frequencies, position scaling)`."""
    gqa = dict(num_heads=4, key_dim=8, num_key_value_heads=2, normalize_first=True)
    llama = dict(normalization="rms_norm", feedforward="gated", activation="silu", use_bias=False)
    if name == "llama":  # Llama 3.1: RMS norm, SwiGLU, no biases, GQA, rope scaled
        rotary = keras_attn.RotaryEmbedding(**LLAMA3_ROPE)
        freqs = np_llama3_frequencies(10000, 8, 4.0, 1.0, 4.0, 64)
        args, block, causal, scale = dict(**gqa, **llama, rotary_embedding=rotary), "dec", True, 1
    elif name == "qwen2":  # biased q, k, v only; rope with linear scaling
        rotary = keras_attn.RotaryEmbedding(1000, scaling_factor=2.0)
        freqs = 1000.0 ** -(np.arange(0, 8, 2) / 8)
        args = dict(**gqa, **llama, qkv_bias=True, rotary_embedding=rotary)
        block, causal, scale = "dec", True, 2.0
    elif name == "mistral":  # a causal sliding window of 3
        rotary = keras_attn.RotaryEmbedding()
        freqs = 10000.0 ** -(np.arange(0, 8, 2) / 8)
        args = dict(**gqa, **llama, sliding_window=3, rotary_embedding=rotary)
        block, causal, scale = "dec", True, 1
    else:  # "geglu_post_norm": an encoder, gated GELU with biases, layer norm, a window
        args = dict(num_heads=2, feedforward="gated", activation="gelu", sliding_window=2)
        block, causal, freqs, scale = "enc", False, None, 1
    cls = keras_attn.TransformerDecoder if block == "dec" else keras_attn.TransformerEncoder
    args.update(implementation=implementation, layer_norm_epsilon=0.1, **extra)
    return cls, args, causal, freqs, scale


VARIANTS = ("llama", "qwen2", "mistral", "geglu_post_norm")


def _randomize(block):
    for w in block.weights:  # scales near 1, everything else random (the biases too)
        one = w.path.endswith(("gamma", "scale"))
        w.assign(rng.normal(size=w.shape).astype("float32") * 0.3 + one)


def _call(block, x, mask):
    if isinstance(block, keras_attn.TransformerDecoder):
        return block(x, decoder_padding_mask=mask)
    return block(x, padding_mask=mask)


@pytest.mark.parametrize("implementation", KERNELS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_block_matches_the_numpy_reference(variant, implementation):
    cls, args, causal, frequencies, scale = _variant(variant, implementation)
    block = cls(intermediate_dim=24, **args)
    x = rng.normal(size=(2, 7, 16)).astype("float32")
    block.build(x.shape)
    _randomize(block)
    hostile = np.where(MASK[..., None], x, np.float32(1e30))  # never reaches the output
    out = np_(_call(block, hostile, MASK))
    expected = np_block(block, x.astype("float64"), MASK, causal, frequencies, scale)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-4)


def test_rms_norm_takes_the_epsilon_inside_the_square_root():
    """Llama's `x * rsqrt(mean(x^2) + eps) * w` (not `x / (rms(x) + eps)`): Keras' layer."""
    block = keras_attn.TransformerEncoder(8, 2, normalization="rms_norm", layer_norm_epsilon=0.5)
    x = rng.normal(size=(1, 3, 4)).astype("float32") * 0.3
    block.build(x.shape)
    norm = block._self_attention_layer_norm
    assert isinstance(norm, keras.layers.RMSNormalization) and norm.epsilon == 0.5
    assert [w.path.split("/")[-1] for w in norm.weights] == ["scale"]  # no bias
    expected = x / np.sqrt(np.mean(x**2, -1, keepdims=True) + 0.5)
    np.testing.assert_allclose(np_(norm(x)), expected, atol=1e-6)


@pytest.mark.parametrize("implementation", KERNELS)
@pytest.mark.parametrize("variant", ["llama", "qwen2", "mistral"])
def test_cached_decoding_after_a_padded_prefill_equals_the_full_pass(variant, implementation):
    cls, args, _, _, _ = _variant(variant, implementation)
    blocks = [cls(intermediate_dim=24, **args) for _ in range(2)]
    x = rng.normal(size=(2, 7, 16)).astype("float32")
    full = x
    for block in blocks:
        full = block(full, decoder_padding_mask=MASK)
    caches = [block.empty_cache(2, 7) for block in blocks]
    steps = []
    for start, stop in [(0, 3), *((t, t + 1) for t in range(3, 7))]:  # a prefill, then steps
        h = x[:, start:stop]
        for i, block in enumerate(blocks):
            h, caches[i] = block(
                h,
                decoder_padding_mask=MASK[:, start:stop],
                self_attention_cache=caches[i],
                self_attention_cache_update_index=start,
            )
        steps.append(np_(h))
    stepped = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(stepped[MASK], np_(full)[MASK], atol=1e-5, rtol=1e-5)


def test_llama_decoder_layer_checks(tmp_path):
    cls, args, _, _, _ = _variant("llama")
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    check_layer(
        functools.partial(cls, intermediate_dim=24, **args),
        {"decoder_sequence": x},
        tmp_path=tmp_path,
        causal=True,
    )


def test_qwen2_encoder_layer_checks(tmp_path):
    """Biased q, k, v, the rest bias-free, RMS norm, gated: padding invariance and the rest."""
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    check_layer(
        functools.partial(
            keras_attn.TransformerEncoder,
            intermediate_dim=24,
            num_heads=4,
            normalization="rms_norm",
            feedforward="gated",
            activation="silu",
            use_bias=False,
            qkv_bias=True,
            dropout=0.1,
        ),
        {"inputs": x},
        tmp_path=tmp_path,
        masks={"padding_mask": MASK[:, 1:]},
        mask_covers={"padding_mask": ["inputs"]},
        output_mask="padding_mask",
    )


def _paths(block):
    return [w.path.split("/", 1)[1] for w in block.weights]


def test_the_weights_each_option_makes():
    x = np.zeros((1, 3, 8), "float32")
    llama = keras_attn.TransformerDecoder(
        16, 2, normalization="rms_norm", feedforward="gated", use_bias=False
    )
    llama(x)
    assert _paths(llama) == [
        "self_attention/query/kernel",
        "self_attention/key/kernel",
        "self_attention/value/kernel",
        "self_attention/attention_output/kernel",
        "self_attention_layer_norm/scale",
        "feedforward_intermediate_dense/kernel",
        "feedforward_gate_dense/kernel",
        "feedforward_output_dense/kernel",
        "feedforward_layer_norm/scale",
    ]
    qwen2 = keras_attn.TransformerDecoder(16, 2, use_bias=False, qkv_bias=True)
    qwen2(x)
    assert [p for p in _paths(qwen2) if p.endswith(("bias", "beta"))] == [
        "self_attention/query/bias",
        "self_attention/key/bias",
        "self_attention/value/bias",
        "self_attention_layer_norm/beta",
        "feedforward_layer_norm/beta",
    ]
    no_qkv = keras_attn.TransformerEncoder(16, 2, qkv_bias=False)  # only the output's and FFN's
    no_qkv(x)
    assert [p for p in _paths(no_qkv) if p.endswith("/bias")] == [
        "self_attention_layer/attention_output/bias",
        "feedforward_intermediate_dense/bias",
        "feedforward_output_dense/bias",
    ]


def test_defaults_and_configs_written_before_the_options():
    """The defaults build today's block; a config without the new keys loads to them."""
    block = keras_attn.TransformerDecoder(16, 2)
    block(np.zeros((1, 3, 8), "float32"))
    assert _paths(block) == [
        "self_attention/query/kernel",
        "self_attention/query/bias",
        "self_attention/key/kernel",
        "self_attention/key/bias",
        "self_attention/value/kernel",
        "self_attention/value/bias",
        "self_attention/attention_output/kernel",
        "self_attention/attention_output/bias",
        "self_attention_layer_norm/gamma",
        "self_attention_layer_norm/beta",
        "feedforward_intermediate_dense/kernel",
        "feedforward_intermediate_dense/bias",
        "feedforward_output_dense/kernel",
        "feedforward_output_dense/bias",
        "feedforward_layer_norm/gamma",
        "feedforward_layer_norm/beta",
    ]
    config = block.get_config()
    new = {
        "normalization": "layer_norm",
        "feedforward": "dense",
        "use_bias": True,
        "qkv_bias": None,
    }
    assert {k: config[k] for k in new} == new
    old = {k: v for k, v in config.items() if k not in new}
    assert keras_attn.TransformerDecoder.from_config(old).get_config() == config
    for variant in VARIANTS:
        cls, args, _, _, _ = _variant(variant)
        config = cls(intermediate_dim=24, **args).get_config()
        assert cls.from_config(config).get_config() == config


def test_bad_options():
    with pytest.raises(ValueError, match="normalization"):
        keras_attn.TransformerEncoder(8, 2, normalization="batch_norm")
    with pytest.raises(ValueError, match="feedforward"):
        keras_attn.TransformerDecoder(8, 2, feedforward="swiglu")
    with pytest.raises(TypeError, match="use_bias"):
        keras_attn.TransformerDecoder(8, 2, use_bias="no")
    with pytest.raises(TypeError, match="qkv_bias"):
        keras_attn.TransformerDecoder(8, 2, qkv_bias="qkv")
    with pytest.raises(TypeError, match="qkv_bias"):
        keras_attn.MultiHeadAttention(2, 4, qkv_bias=1)


def test_mistral_sliding_window_is_transformers_window():
    """Query `i` sees key `j` iff `i - w < j <= i`: transformers' causal sliding window mask
    (masking_utils, used by Mistral) for the same `w`; its bidirectional window is inclusive
    (`|i - j| <= w`), ours `w + 1`."""
    masking_utils = pytest.importorskip("transformers.masking_utils")
    import torch  # transformers' mask functions take index tensors

    length, window = 9, 3
    x = rng.normal(size=(1, length, 8)).astype("float32")

    def seen(causal, w):
        mha = keras_attn.MultiHeadAttention(1, 8, sliding_window=w, implementation="dense")
        _, weights = mha(x, x, use_causal_mask=causal, return_attention_scores=True)
        return np_(weights)[0, 0] > 0

    def hf(function):
        index = torch.tensor
        return np.array(
            [
                [bool(function(index(0), index(0), index(i), index(j))) for j in range(length)]
                for i in range(length)
            ]
        )

    causal = hf(masking_utils.sliding_window_causal_mask_function(window))
    np.testing.assert_array_equal(seen(True, window), causal)
    both = hf(masking_utils.sliding_window_bidirectional_mask_function(window))
    np.testing.assert_array_equal(seen(False, window + 1), both)
