"""`keras_attn.testing.assert_generation_batch_invariance`: passes on the zoo's language
model, catches one that leaks across the batch or attends to padding, refuses bad prompts."""

import ast
import re

import keras
import numpy as np
import pytest

import keras_attn as ka
from keras_attn import testing
from keras_attn.models import generate, transformer_lm

# Every backend's `generate`; JAX's eager loop compiles each op anew (a minute here): its
# compiled loop is the one tests/decoding checks.
pytestmark = [pytest.mark.backends, pytest.mark.jax_slow]

VOCAB, STEPS = 30, 4
PROMPTS = [[5, 6, 7], [8, 9], [3]]
EAGER = {"jit_compile": False}  # a compile per prompt shape costs more than these tiny loops


class BatchMeanNorm(keras.layers.LayerNormalization):
    """Adds the batch's mean (as a batch normalization in training mode would)."""

    def call(self, x):
        y = super().call(x)
        return y + 4.0 * keras.ops.mean(y, axis=0, keepdims=True)


class AttendsToPadding(ka.TransformerDecoder):
    """Self-attention without the padding mask (passed or implicit): padded steps are keys."""

    def _self_attention(self, x, mask, *args, **kwargs):
        return super()._self_attention(keras.ops.add(x, 0.0), None, *args, **kwargs)


def tiny_lm(block=ka.TransformerDecoder, norm=keras.layers.LayerNormalization):
    """A `transformer_lm`-shaped model (its layer names: `generate` decodes it) from parts."""
    keras.utils.set_random_seed(2)
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    embedding = keras.layers.ReversibleEmbedding(
        VOCAB, 16, tie_weights=False, mask_zero=True, name="token_embedding"
    )
    x = block(16, 2, name="decoder_block_0")(embedding(tokens))  # post-norm
    x = norm(epsilon=1e-5, name="final_norm")(x)
    return keras.Model(tokens, embedding(x, reverse=True), name="transformer_lm")


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(2)
    return transformer_lm(VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=16)


def test_passes_on_the_zoo_language_model(model):
    testing.assert_generation_batch_invariance(model, PROMPTS, STEPS, **EAGER)
    # Its reference is the model's own tokens: the prompts alone, one call each.
    padded = np.array([[0, 5, 6, 7], [8, 9, 0, 0]], "int32")  # an array's padding is dropped
    testing.assert_generation_batch_invariance(model, padded, STEPS, end_id=9, **EAGER)


def test_catches_a_model_that_leaks_across_the_batch():
    if keras.backend.backend() == "jax":  # (run by hand: `-m jax_slow` with KERAS_BACKEND=jax)
        pytest.skip(
            "JAX draws other initial weights: this tiny leaky model then generates the same "
            "greedy tokens alone and in the batch (nothing to catch); TensorFlow and torch differ"
        )
    leaky = tiny_lm(norm=BatchMeanNorm)
    with pytest.raises(AssertionError, match=r"prompt \d+ in the batch.*alone at step \d") as info:
        testing.assert_generation_batch_invariance(leaky, PROMPTS, STEPS, **EAGER)
    # The message names the row, the step where its tokens part and both sequences: the row's
    # tokens alone are `generate`'s, and the two sequences first differ at that step.
    message = str(info.value)
    row, step = map(int, re.search(r"prompt (\d+) .* alone at step (\d+)", message).groups())
    alone, batched = (
        ast.literal_eval(re.search(rf"{label}:\s+(\[.*\])", message).group(1))
        for label in ("alone", "in the batch")
    )
    np.testing.assert_array_equal(
        alone, generate(leaky, np.array([PROMPTS[row]]), STEPS, **EAGER)[0]
    )
    assert np.flatnonzero(np.array(alone) != np.array(batched))[0] == step


def test_catches_a_model_that_attends_to_padding():
    model = tiny_lm(block=AttendsToPadding)
    with pytest.raises(AssertionError, match=r"padded .* differs from prompt \d+ alone at step"):
        testing.assert_generation_batch_invariance(model, PROMPTS, STEPS, **EAGER)


def test_refuses_bad_prompts(model):
    with pytest.raises(ValueError, match=r"at least 2 prompts .* Received: prompts=\[\[5, 6\]\]"):
        testing.assert_generation_batch_invariance(model, [[5, 6]], STEPS)
    with pytest.raises(ValueError, match=r"real \(not 0\) token\. Received: prompts\[1\]=\[0, 0\]"):
        testing.assert_generation_batch_invariance(model, [[5, 6], [0, 0]], STEPS)
