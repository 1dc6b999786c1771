"""`num_return_sequences=n`: `B * n` rows grouped by prompt. Sampled: sample `j` of a prompt
is what the prompt alone draws with `seed + j` (the documented derivation; the reference is n
separate single-prompt calls), in any batch, streamed as one-shot; the rules of Hugging Face
(greedy and contrastive take 1, beam at most `beam_width`). The beams: tests/decoding/
test_beam_search.py."""

import keras
import numpy as np
import pytest

from keras_attn import testing
from keras_attn.models import (
    GenerationConfig,
    generate,
    sample_decode,
    transformer_lm,
    transformer_seq2seq,
)
from keras_attn.models.generation.samplers import sample_draws

pytestmark = pytest.mark.backends

VOCAB, LENGTH, N, SEED = 23, 5, 3, 11
PROMPTS = np.array([[0, 5, 6, 7], [8, 9, 0, 0], [4, 0, 0, 0]], "int32")  # padded either side
SETTINGS = dict(sampler="sample", temperature=1.5, top_k=8, top_p=0.95)


def np_(x):
    return keras.ops.convert_to_numpy(x)


@pytest.fixture(scope="module")
def lm():
    keras.utils.set_random_seed(0)
    return transformer_lm(VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32)


@pytest.mark.parametrize(
    "name,value,message",
    [
        (dict(num_return_sequences=0), 0, "`num_return_sequences` must be a positive integer"),
        (dict(num_return_sequences=2.0), 2.0, "`num_return_sequences` must be a positive"),
        (dict(num_return_sequences=2), 2, "must be 1 with sampler='greedy'"),
        (dict(num_return_sequences=2, sampler="beam", beam_width=1), 2, "at most `beam_width`"),
    ],
)
def test_bad_num_return_sequences_raises_naming_it(name, value, message):
    with pytest.raises(ValueError, match=rf"{message}.*Received: num_return_sequences={value}"):
        GenerationConfig(**name)


@pytest.mark.parametrize("jit", [pytest.param(False, marks=pytest.mark.jax_slow), True])
def test_sample_j_of_a_prompt_is_the_prompt_alone_with_seed_plus_j(lm, jit):
    tokens, scores = generate(lm, PROMPTS, LENGTH, seed=SEED, num_return_sequences=N,
                              return_scores=True, jit_compile=jit, **SETTINGS)  # fmt: skip
    assert tokens.shape == scores.shape == (len(PROMPTS) * N, LENGTH)
    for i, prompt in enumerate(PROMPTS):
        for j in range(N):
            alone, alone_scores = generate(
                lm, prompt[None], LENGTH, seed=SEED + j, return_scores=True, jit_compile=jit,
                **SETTINGS,
            )  # fmt: skip
            np.testing.assert_array_equal(tokens[i * N + j], alone[0], err_msg=str((i, j)))
            np.testing.assert_allclose(scores[i * N + j], alone_scores[0], atol=1e-5)
    assert len({tuple(row) for row in tokens}) > len(PROMPTS)  # the samples differ


def test_the_draws_are_n_single_prompt_draws():
    """`sample_draws`: column `i * n + j` is `keras.random.uniform((T, 1), seed=seed + j)`;
    `n = 1` is today's `(T, B)` draw."""
    config = GenerationConfig(sampler="sample", seed=SEED, num_return_sequences=N)
    draws = np_(sample_draws(config, LENGTH, 2))
    for j in range(N):
        alone = np_(keras.random.uniform((LENGTH, 1), seed=SEED + j))[:, 0]
        np.testing.assert_array_equal(draws[:, j], alone)
        np.testing.assert_array_equal(draws[:, N + j], alone)
    one = np_(sample_draws(config.replace(num_return_sequences=1), LENGTH, 2))
    np.testing.assert_array_equal(one, np_(keras.random.uniform((LENGTH, 2), seed=SEED)))


def test_streamed_n_samples_equal_one_shot(lm):
    tokens = generate(lm, PROMPTS, LENGTH, seed=SEED, num_return_sequences=N, **SETTINGS)
    steps = list(generate(lm, PROMPTS, LENGTH, seed=SEED, num_return_sequences=N,
                          stream=True, **SETTINGS))  # fmt: skip
    np.testing.assert_array_equal(np.stack(steps, axis=1), tokens)


@pytest.mark.jax_slow  # eager generate, batch after batch
def test_n_samples_and_n_beams_are_batch_invariant(lm):
    prompts = [[5, 6, 7], [8, 9], [4]]
    testing.assert_generation_batch_invariance(
        lm, prompts, 4, jit_compile=False, seed=SEED, num_return_sequences=2, **SETTINGS
    )
    testing.assert_generation_batch_invariance(
        lm, prompts, 4, 2, jit_compile=False, sampler="beam", beam_width=3,
        num_return_sequences=2,
    )  # fmt: skip


@pytest.mark.jax_slow  # eager sample_decode, one call per sample
def test_a_seq2seq_models_samples_are_its_examples_alone_with_seed_plus_j():
    keras.utils.set_random_seed(1)
    model = transformer_seq2seq(VOCAB, VOCAB, num_layers=1, d_model=16, intermediate_dim=16)
    source = np.array([[3, 4, 5, 6], [7, 8, 0, 0]], "int32")
    tokens = np_(sample_decode(model, source, LENGTH, start_id=1, seed=SEED,
                               num_return_sequences=N, temperature=1.5))  # fmt: skip
    assert tokens.shape == (len(source) * N, LENGTH)
    for i in range(len(source)):
        for j in range(N):
            alone = sample_decode(model, source[i : i + 1], LENGTH, start_id=1, seed=SEED + j,
                                  temperature=1.5)  # fmt: skip
            np.testing.assert_array_equal(tokens[i * N + j], np_(alone)[0])
