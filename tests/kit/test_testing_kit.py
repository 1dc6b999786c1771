"""`keras_attn.testing` over every layer (the zoo builders: tests/kit/test_testing_kit_zoo.py).

Every layer is checked on inputs hypothesis draws (batch, lengths, widths, mask
patterns, start indices) in one of float32 / mixed_float16 / mixed_bfloat16,
with the options that change its code path drawn too (dropout in training,
`return_attention_scores`, the causal mask, a rank-2 query, pre-norm, grouped
heads with rotary positions, NaN in the padding). The same checks run once more
per layer under `jit_compile=True`. A few deliberately broken layers show that
each assertion fails when its property does not hold (tests/kit/test_testing_kit_catches.py).
"""

import hypothesis
import keras
import numpy as np
import pytest
from hypothesis import strategies as st
from layer_table import LAYERS, WIDTH  # the table of every layer, shared

import keras_attn as ka
from keras_attn import testing

SETTINGS = hypothesis.settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        hypothesis.HealthCheck.too_slow,
        hypothesis.HealthCheck.function_scoped_fixture,
    ],
)
# Keras warns on any softmax over a length-1 axis; hypothesis draws length-1 sequences.
pytestmark = pytest.mark.filterwarnings("ignore:You are using a softmax over axis -1")


# ---------------------------------------------------------------------------
# Drawing a configuration: from hypothesis, or from a seed (the jit runs)
# ---------------------------------------------------------------------------


class HypothesisPick:
    def __init__(self, data):
        self.data = data

    def bool(self):
        return self.data.draw(st.booleans())

    def int(self, low, high):
        return self.data.draw(st.integers(low, high))

    def choice(self, options):
        return self.data.draw(st.sampled_from(options))

    def mask(self, batch, length):
        row = st.lists(st.booleans(), min_size=length, max_size=length)
        rows = self.data.draw(st.lists(row, min_size=batch, max_size=batch))
        return np.array(rows, bool).reshape(batch, length)


class SeededPick:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def bool(self):
        return bool(self.rng.integers(2))

    def int(self, low, high):
        return int(self.rng.integers(low, high + 1))

    def choice(self, options):
        return options[int(self.rng.integers(len(options)))]

    def mask(self, batch, length):
        return self.rng.random((batch, length)) < 0.7


def run_checks(setup, jit_compile=False, batch=True):
    kwargs = setup.call_kwargs
    inference = {k: v for k, v in kwargs.items() if k != "training"}
    common = {"call_kwargs": kwargs, "jit_compile": jit_compile}
    if setup.padding is not None:
        testing.assert_padding_invariance(
            setup.layer, setup.inputs, setup.padding, **setup.padding_kwargs, **common
        )
    if setup.causal is not None:
        testing.assert_causal_invariance(setup.layer, setup.inputs, **setup.causal, **common)
    if batch:
        testing.assert_batch_invariance(
            setup.layer, setup.inputs, call_kwargs=inference, jit_compile=jit_compile
        )
    if setup.empty is not None:
        testing.assert_fully_masked_rows_safe(
            setup.layer, setup.inputs, setup.empty, zero_outputs=setup.zero_outputs, **common
        )


@pytest.mark.parametrize("name", sorted(LAYERS))
@SETTINGS
@hypothesis.given(data=st.data())
def test_kit_on_every_layer(name, data):
    setup = LAYERS[name](HypothesisPick(data))
    try:
        run_checks(setup)
    finally:
        keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_kit_on_every_layer_under_xla(name):
    """One drawn configuration per layer, every call compiled with XLA (TF or JAX)."""
    setup = LAYERS[name](SeededPick(sorted(LAYERS).index(name)))
    run_checks(setup, jit_compile=True, batch=False)  # batch: one more compile per size


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_kit_save_reload_on_every_layer(name, tmp_path):
    setup = LAYERS[name](SeededPick(100 + sorted(LAYERS).index(name)))
    kwargs = {k: v for k, v in setup.call_kwargs.items() if k != "training"}
    testing.assert_save_reload_equal(
        setup.layer, setup.inputs, call_kwargs=kwargs, directory=tmp_path, formats=("keras",)
    )


@pytest.mark.tensorflow_only  # SavedModel export
def test_kit_save_reload_saved_model(tmp_path):
    setup = LAYERS["MultiHeadAttention"](SeededPick(7))
    kwargs = {k: v for k, v in setup.call_kwargs.items() if k != "training"}
    testing.assert_save_reload_equal(setup.layer, setup.inputs, call_kwargs=kwargs)


@pytest.mark.parametrize(
    "implementation, return_scores",
    [("dense", False), ("dense", True), ("chunked", False)],
    ids=["fused", "dense-with-weights", "chunked"],
)
def test_kit_nonfinite_padding_on_every_multi_head_path(implementation, return_scores):
    """NaN, inf and -inf in padded values: fused (no weights), dense (weights), chunked."""
    x = np.random.default_rng(0).normal(size=(2, 4, WIDTH)).astype("float32")
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    testing.assert_padding_invariance(
        ka.MultiHeadAttention(2, 4, implementation=implementation),
        {"query": x, "value": x, "value_mask": mask},
        {"value": "value_mask"},
        nonfinite=True,
        call_kwargs={"return_attention_scores": return_scores},
    )
