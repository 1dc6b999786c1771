"""The blocks as drop-ins for keras-hub's `TransformerEncoder` / `TransformerDecoder`.

keras-hub's layers are the reference: their signatures, their weights copied
with `set_weights`, their outputs on real tokens and their cached decoding
(keras-hub's cache form, one `(B, 2, S, h, d)` tensor per cache).
"""

import inspect

import keras
import numpy as np
import pytest
from keras import ops
from keras_hub import layers as hub

import keras_attn
from layer_checks import compiled

rng = np.random.default_rng(1)
X = rng.normal(size=(2, 6, 8)).astype("float32")
X_MASK = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], bool)
ENC = rng.normal(size=(2, 5, 8)).astype("float32")
ENC_MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], bool)


def np_(x):
    return keras.ops.convert_to_numpy(x)


def hostile(x, mask):
    """`x` with 1e30 at its padded steps: a padded step must not reach a real one."""
    return np.where(mask[..., None], x, np.float32(1e30))


def parameters(function):
    return [n for n in inspect.signature(function).parameters if n not in ("self", "kwargs")]


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (keras_attn.TransformerEncoderBlock, hub.TransformerEncoder),
        (keras_attn.TransformerDecoderBlock, hub.TransformerDecoder),
    ],
)
def test_constructor_and_call_arguments_start_with_keras_hubs_in_order(ours, theirs):
    for method in ("__init__", "call"):
        expected = parameters(getattr(theirs, method))
        assert parameters(getattr(ours, method))[: len(expected)] == expected
    defaults = {
        n: p.default for n, p in inspect.signature(theirs.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }  # fmt: skip
    ours_defaults = inspect.signature(keras_attn.transformer_block.TransformerBlock.__init__)
    for name, default in defaults.items():
        assert ours_defaults.parameters[name].default == default, name


def test_positional_arguments_are_intermediate_dim_then_num_heads():
    block = keras_attn.TransformerEncoderBlock(256, 8)
    block(np.zeros((1, 3, 32), "float32"))
    assert block._self_attention_layer.num_heads == 8
    assert tuple(block._feedforward_intermediate_dense.kernel.shape) == (32, 256)


def copied(ours, theirs, *args, **kwargs):
    """`ours` built like `theirs` (called on `args`), with `theirs`' weights loaded."""
    theirs(*args, **kwargs)
    ours(*args, **kwargs)
    ours.set_weights([np_(w) for w in theirs.get_weights()])
    strip = lambda layer: [w.path.split("/", 1)[1] for w in layer.weights]  # noqa: E731
    assert strip(ours) == strip(theirs)  # the same sublayer names, in the same order
    return ours, theirs


@pytest.mark.parametrize("normalize_first", [False, True])
def test_encoder_loads_keras_hub_weights_and_gives_its_outputs(normalize_first):
    options = dict(normalize_first=normalize_first, activation="gelu")
    ours, theirs = copied(
        keras_attn.TransformerEncoderBlock(16, 2, **options),
        hub.TransformerEncoder(16, 2, **options),
        X,
    )
    expected = np_(theirs(X, padding_mask=X_MASK))
    out = np_(ours(hostile(X, X_MASK), padding_mask=X_MASK))
    np.testing.assert_allclose(out[X_MASK], expected[X_MASK], atol=1e-5)
    attention_mask = np.tril(np.ones((2, 6, 6), bool))
    expected = np_(theirs(X, X_MASK, attention_mask))  # keras-hub's positional order
    out = np_(ours(hostile(X, X_MASK), X_MASK, attention_mask))
    np.testing.assert_allclose(out[X_MASK], expected[X_MASK], atol=1e-5)


@pytest.mark.parametrize("normalize_first", [False, True])
def test_decoder_loads_keras_hub_weights_and_gives_its_outputs(normalize_first):
    ours, theirs = copied(
        keras_attn.TransformerDecoderBlock(16, 2, normalize_first=normalize_first),
        hub.TransformerDecoder(16, 2, normalize_first=normalize_first),
        X,
        ENC,
    )
    masks = dict(decoder_padding_mask=X_MASK, encoder_padding_mask=ENC_MASK)
    expected = np_(theirs(X, ENC, **masks))
    out = np_(ours(hostile(X, X_MASK), hostile(ENC, ENC_MASK), **masks))
    np.testing.assert_allclose(out[X_MASK], expected[X_MASK], atol=1e-5)


def test_a_width_the_heads_do_not_divide_takes_keras_hubs_head_width():
    """keras.io's GPT example: width 256, 3 heads of 85, projected back to 256 (here 16, 3)."""
    ours, theirs = copied(keras_attn.TransformerDecoder(32, 3), hub.TransformerDecoder(32, 3), X)
    assert ours._self_attention_layer.key_dim == X.shape[-1] // 3
    expected = np_(theirs(X, decoder_padding_mask=X_MASK))
    out = np_(ours(hostile(X, X_MASK), decoder_padding_mask=X_MASK))
    np.testing.assert_allclose(out[X_MASK], expected[X_MASK], atol=1e-5)
    ours, theirs = copied(keras_attn.TransformerEncoder(32, 3), hub.TransformerEncoder(32, 3), X)
    expected = np_(theirs(X, padding_mask=X_MASK))
    out = np_(ours(hostile(X, X_MASK), padding_mask=X_MASK))
    np.testing.assert_allclose(out[X_MASK], expected[X_MASK], atol=1e-5)


def test_decoder_only_loads_keras_hub_weights():
    ours, theirs = copied(
        keras_attn.TransformerDecoderBlock(16, 2), hub.TransformerDecoder(16, 2), X
    )
    expected = np_(theirs(X, decoder_padding_mask=X_MASK))
    out = np_(ours(hostile(X, X_MASK), decoder_padding_mask=X_MASK))
    np.testing.assert_allclose(out[X_MASK], expected[X_MASK], atol=1e-5)


def decode(layer, x, source, prompt, source_mask=None, index_as_tensor=False):
    """keras-hub's cached decoding: zero caches, a prompt, then a token a step.

    The first call computes the cross cache (`cross_attention_cache_update_index=0`);
    later ones reuse it (`None`) and still pass the source, as keras-hub's callers do.
    """
    batch, length, _ = x.shape
    heads, head_dim = 2, x.shape[-1] // 2
    cache = ops.zeros((batch, 2, length, heads, head_dim))
    cross = ops.zeros((batch, 2, source.shape[1], heads, head_dim))
    out, cache, cross = layer(
        x[:, :prompt], source, encoder_padding_mask=source_mask, self_attention_cache=cache,
        self_attention_cache_update_index=0, cross_attention_cache=cross,
        cross_attention_cache_update_index=0,
    )  # fmt: skip
    outputs = [out]
    for i in range(prompt, length):
        index = ops.convert_to_tensor(i) if index_as_tensor else i
        out, cache, cross = layer(
            x[:, i : i + 1], source, encoder_padding_mask=source_mask, self_attention_cache=cache,
            self_attention_cache_update_index=index, cross_attention_cache=cross,
        )  # fmt: skip
        outputs.append(out)
    return np.concatenate([np_(o) for o in outputs], axis=1), np_(cache), np_(cross)


@pytest.mark.parametrize("source_mask,index_as_tensor", [(None, True), (ENC_MASK, True),
                                                          (ENC_MASK, False)])  # fmt: skip
def test_keras_hub_cache_form_gives_keras_hubs_outputs_and_caches(source_mask, index_as_tensor):
    """Also with a Python int index (the written positions then come as a NumPy constant)."""
    ours, theirs = copied(
        keras_attn.TransformerDecoderBlock(16, 2), hub.TransformerDecoder(16, 2), X, ENC
    )
    expected = decode(theirs, X, ENC, 2, source_mask)
    actual = decode(ours, X, ENC, 2, source_mask, index_as_tensor=index_as_tensor)
    keep = np.ones(ENC.shape[:2], bool) if source_mask is None else source_mask
    keys = np.broadcast_to(keep[:, None, :, None, None], actual[2].shape)
    for a, e, real in zip(actual, expected, [True, True, keys], strict=True):
        np.testing.assert_allclose(a * real, e * real, atol=1e-5)  # padded source steps zeroed
    full = ours(X, ENC, encoder_padding_mask=source_mask)
    np.testing.assert_allclose(actual[0], np_(full), atol=1e-5)


def test_keras_hub_cache_form_in_a_compiled_step():
    block = keras_attn.TransformerDecoderBlock(16, 2)
    full = np_(block(X))

    def body(i, outputs, cache):
        out, cache = block(
            ops.slice(X, (0, i, 0), (2, 1, 8)),
            self_attention_cache=cache,
            self_attention_cache_update_index=i,
        )  # decoder-only: (output, self_attention_cache), as keras-hub
        return i + 1, ops.slice_update(outputs, (0, i, 0), out), cache

    loop = compiled(  # XLA: the update index is a tensor
        lambda: ops.while_loop(
            lambda i, *_: i < 6, body, (0, ops.zeros_like(X), ops.zeros((2, 2, 6, 2, 4)))
        )
    )
    _, outputs, cache = loop()
    np.testing.assert_allclose(np_(outputs), full, atol=1e-5)
    assert tuple(cache.shape) == (2, 2, 6, 2, 4)


def test_return_structures():
    decoder_only = keras_attn.TransformerDecoderBlock(16, 2)
    decoder_only(X)
    out = decoder_only(X, self_attention_cache=decoder_only.empty_cache(2, 6),
                       self_attention_cache_update_index=0)  # fmt: skip
    assert len(out) == 2 and isinstance(out[1], keras_attn.KVCache)
    block = keras_attn.TransformerDecoderBlock(16, 2)
    block(X, ENC)
    out = block(X, ENC, self_attention_cache=block.empty_cache(2, 6),
                self_attention_cache_update_index=0, return_attention_scores=True)  # fmt: skip
    assert [tuple(o.shape) for o in out[:3]] == [(2, 6, 8), (2, 2, 6, 6), (2, 2, 6, 5)]
    assert all(isinstance(c, keras_attn.KVCache) for c in out[3:]) and len(out) == 5
