"""The shared inputs and row builders of the bad-input matrix (tests/layers/test_bad_*.py).

A row is `(id, target, ...)`: `target()` makes the constructor call or the layer call
with one bad value; `row(entry)` turns it (or a `pytest.param` with marks) into a
`pytest.param` with that id.
"""

import functools

import keras
import numpy as np
import pytest

import keras_attn as ka

rng = np.random.default_rng(0)
Q = rng.normal(size=(2, 4, 6)).astype("float32")  # (B, Tq, dq)
V = rng.normal(size=(2, 5, 6)).astype("float32")  # (B, Tv, dv)
V10 = rng.normal(size=(2, 5, 10)).astype("float32")
X = rng.normal(size=(2, 5, 8)).astype("float32")  # a d_model = 8 sequence
V_MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], bool)
Q_MASK = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)


def np_(x):
    return keras.ops.convert_to_numpy(x)


def make(cls, *args, **kwargs):
    """Row target: the constructor call itself."""
    return functools.partial(cls, *args, **kwargs)


def call(factory, *args, **kwargs):
    """Row target: a fresh layer from `factory`, called once."""
    return lambda: factory()(*args, **kwargs)


def call_built(factory, build_args, *args, **kwargs):
    """Row target: a layer built by a first call on `build_args`, then called again."""

    def run():
        layer = factory()
        layer(*build_args)
        return layer(*args, **kwargs)

    return run


MHA = functools.partial(ka.MultiHeadAttention, num_heads=2, key_dim=4)
ENCODER = functools.partial(ka.TransformerEncoderBlock, intermediate_dim=8, num_heads=2)
DECODER = functools.partial(ka.TransformerDecoderBlock, intermediate_dim=8, num_heads=2)
LEARNED = functools.partial(ka.LearnedPositionalEmbedding, sequence_length=8)


def row(entry):
    """`pytest.param` of a row: a tuple `(id, *values)` or a `pytest.param` with marks."""
    if hasattr(entry, "marks"):  # a pytest.param
        return pytest.param(*entry.values[1:], id=entry.values[0], marks=entry.marks)
    return pytest.param(*entry[1:], id=entry[0])


def set_at(x, index, value):
    """A copy of `x` with `x[index] = value`."""
    x = x.copy()
    x[index] = value
    return x


POSITIVE = r"must be a positive integer\. Received: "
