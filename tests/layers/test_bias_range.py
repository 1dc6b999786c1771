"""An attention bias keeps float32 range in every layer, on every kernel, under mixed precision.

Red team, 2026-12-02: under `mixed_float16` Keras cast a layer's `attention_bias` to
float16, so a `7e4` entry became inf and its row NaN (MultiHeadAttention and the score
layers); and a tuple mixing a tensor with a position bias was refused by Keras before
the layer ran. Each layer here runs with a bias holding `-1e9` (an additive mask over all
but one key of a row) and `7e4`, alone and next to `AlibiBias()`, against the same layer
in float64.
"""

import keras
import numpy as np
import pytest

import keras_attn as ka
from keras_attn.testing.differential import _with_policy

rng = np.random.default_rng(7)
B, TQ, TV, D = 2, 4, 5, 8
QUERY = rng.normal(size=(B, TQ, D))
VALUE = rng.normal(size=(B, TV, D))
BIAS = np.zeros((B, TQ, TV))
BIAS[:, 1, 1:] = -1e9  # row 1 sees key 0 only
BIAS[0, 2, 3] = 7e4  # beyond float16's range: the row's weight goes to key 3

ALL = ("dense", "fused", "chunked", "backend")
LAYERS = {
    "DotAttention": (lambda **kw: ka.DotAttention(**kw), ALL),
    "ScaledDotAttention": (lambda **kw: ka.ScaledDotAttention(**kw), ALL),
    "BilinearAttention": (lambda **kw: ka.BilinearAttention(**kw), ALL),
    "KeyValueAttention": (lambda **kw: ka.KeyValueAttention(6, output_dim=D, **kw), ALL),
    "AdditiveAttention": (lambda **kw: ka.AdditiveAttention(units=4, **kw), ("dense", "chunked")),
    "PointerAttention": (lambda **kw: ka.PointerAttention(units=4, **kw), ("auto",)),
    "MultiHeadAttention": (lambda **kw: ka.MultiHeadAttention(2, 4, **kw), ALL),
    "GroupedQueryAttention": (lambda **kw: ka.GroupedQueryAttention(4, 2, 1, **kw), ALL),
}
CASES = [
    pytest.param(name, implementation, policy, alibi, id=f"{name}-{implementation}-{policy}-{a}")
    for name, (_, implementations) in LAYERS.items()
    for implementation in implementations
    for policy in ("mixed_float16", "mixed_bfloat16")
    for alibi, a in ((False, "tensor"), (True, "tensor+alibi"))
]


def _bias(name, dtype, alibi):
    bias = keras.ops.convert_to_tensor(BIAS.astype(dtype))
    if "Head" in name or "Query" in name:  # (B, 1, Tq, Tv): every head
        bias = bias[:, None]
    return (bias, ka.AlibiBias()) if alibi else bias


@pytest.mark.parametrize("name, implementation, policy, alibi", CASES)
def test_a_large_bias_keeps_float32_range(name, implementation, policy, alibi):
    make, _ = LAYERS[name]
    options = {} if implementation == "auto" else {"implementation": implementation}
    layer = make(dtype=policy, **options)
    query = keras.ops.convert_to_tensor(QUERY.astype("float32"))
    value = keras.ops.convert_to_tensor(VALUE.astype("float32"))
    layer(query, value)
    out = layer(query, value, attention_bias=_bias(name, "float32", alibi))
    reference = type(layer).from_config(_with_policy(layer.get_config(), "float64"))
    reference(QUERY, VALUE)
    reference.set_weights([np.asarray(w, "float64") for w in layer.get_weights()])
    expected = keras.ops.convert_to_numpy(
        reference(
            keras.ops.convert_to_tensor(QUERY),
            keras.ops.convert_to_tensor(VALUE),
            attention_bias=_bias(name, "float64", alibi),
        )
    )
    got = keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))
    assert np.isfinite(got).all(), f"{name} [{implementation}, {policy}]: NaN or inf output"
    np.testing.assert_allclose(got, expected, atol=3e-2 * max(1.0, np.abs(expected).max()))
