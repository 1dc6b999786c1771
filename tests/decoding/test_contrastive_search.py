"""Contrastive search (`sampler="contrastive"`, `top_k`, `penalty_alpha`): equal to an
uncached brute-force reference (full passes, every candidate's hidden state computed anew, in
float64 NumPy), to greedy decoding at `penalty_alpha=0` or `top_k=1`, streamed as one-shot,
batch-invariant; and to keras-hub's `ContrastiveSampler` on a GPT-2 backbone's weights."""

import keras
import numpy as np
import pytest

from keras_attn import testing
from keras_attn.models import GenerationConfig, generate, transformer_lm, transformer_seq2seq
from keras_attn.models.generation import decoding_steps
from keras_attn.models.generation.contrastive import ContrastiveLoop

pytestmark = pytest.mark.backends

VOCAB, LENGTH, END = 24, 5, 9
PROMPTS = np.array([[0, 0, 5, 6], [7, 8, 9, 3], [4, 0, 0, 0]], "int32")  # padded either side


def np_(x):
    return keras.ops.convert_to_numpy(x)


@pytest.fixture(scope="module")
def lm():
    keras.utils.set_random_seed(3)
    model = transformer_lm(
        VOCAB, num_layers=2, num_heads=2, d_model=16, intermediate_dim=32, sequence_length=16
    )
    rng = np.random.default_rng(0)  # spread weights: logits and hidden states not near ties
    for weight in model.weights:
        weight.assign(rng.normal(0, 0.3, weight.shape).astype("float32"))
    return model


def reference_contrastive(model, prompts, max_length, k, alpha, end_id=None, suppress_ids=()):
    """Each row alone, unpadded, by full passes: at each step the `k` most likely tokens
    (padding and `suppress_ids` ruled out; ties at the lower id), each appended and run
    through the whole model for its final hidden state (after `final_norm`), scored
    `(1 - alpha) p - alpha max_j cos(h_v, h_j)` over the row's tokens so far. (The passes
    are right-padded to one width: causal, so padding after a position changes nothing
    there, and JAX compiles one shape.)"""
    hidden_model = keras.Model(model.input, model.get_layer("final_norm").output)
    width = prompts.shape[1] + max_length + 1

    def run(layer, sequences):  # (R, L) int -> float64 (R, L, ...) of the real positions
        ids = np.zeros((len(sequences), width), "int32")
        ids[:, : len(sequences[0])] = sequences
        return np_(layer(ids))[:, : len(sequences[0])].astype("float64")

    rows = []
    for prompt in prompts:
        sequence, out, ended = [int(t) for t in prompt if t], [], False
        for _ in range(max_length):
            if ended:
                out.append(0)
                continue
            logits = run(model, [sequence])[0, -1]
            logits[[0, *suppress_ids]] = -np.inf
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            earlier = run(hidden_model, [sequence])[0]  # (L, d)
            candidates = np.argsort(-probs, kind="stable")[:k]
            h = run(hidden_model, [[*sequence, v] for v in candidates])[:, -1]  # (k, d)
            cos = (
                h @ earlier.T / np.outer(np.linalg.norm(h, axis=1), np.linalg.norm(earlier, axis=1))
            )
            scores = (1 - alpha) * probs[candidates] - alpha * cos.max(axis=1)
            token = int(candidates[int(np.argmax(scores))])
            sequence.append(token)
            out.append(token)
            ended = token == end_id
        rows.append(out)
    return np.array(rows, "int32")


@pytest.mark.parametrize("jit", [pytest.param(False, marks=pytest.mark.jax_slow), True])
def test_contrastive_search_equals_the_uncached_reference(lm, jit):
    settings = dict(sampler="contrastive", top_k=3, penalty_alpha=0.6, suppress_ids=(3,))
    tokens = generate(lm, PROMPTS, LENGTH, END, jit_compile=jit, **settings)
    expected = reference_contrastive(lm, PROMPTS, LENGTH, 3, 0.6, END, suppress_ids=(3,))
    np.testing.assert_array_equal(tokens, expected)
    greedy = generate(lm, PROMPTS, LENGTH, END, suppress_ids=(3,), jit_compile=jit)
    assert np.any(tokens != greedy)  # the penalty changed the choice somewhere
    if jit:
        return
    strong = generate(lm, PROMPTS[:1], LENGTH, sampler="contrastive", top_k=4,
                      penalty_alpha=0.9, jit_compile=jit)  # fmt: skip
    np.testing.assert_array_equal(strong, reference_contrastive(lm, PROMPTS[:1], LENGTH, 4, 0.9))


@pytest.mark.jax_slow  # eager
def test_contrastive_search_on_ring_caches_equals_the_reference():
    """A sliding window (rotary positions): the steps keep ring caches, repeated and
    selected per candidate as the full ones."""
    keras.utils.set_random_seed(3)
    model = transformer_lm(VOCAB, num_layers=2, num_heads=2, d_model=16, intermediate_dim=32,
                           position="rotary", sliding_window=3)  # fmt: skip
    rng = np.random.default_rng(0)
    for weight in model.weights:
        weight.assign(rng.normal(0, 0.3, weight.shape).astype("float32"))
    tokens = generate(model, PROMPTS, 6, sampler="contrastive", top_k=3, jit_compile=False)
    np.testing.assert_array_equal(tokens, reference_contrastive(model, PROMPTS, 6, 3, 0.6))


@pytest.mark.jax_slow  # eager
def test_penalty_alpha_0_and_top_k_1_are_greedy(lm):
    greedy = generate(lm, PROMPTS, LENGTH, END, jit_compile=False)
    for top_k, alpha in ((4, 0.0), (1, 0.8)):
        tokens = generate(lm, PROMPTS, LENGTH, END, sampler="contrastive", top_k=top_k,
                          penalty_alpha=alpha, jit_compile=False)  # fmt: skip
        np.testing.assert_array_equal(tokens, greedy, err_msg=str((top_k, alpha)))


def test_streamed_contrastive_search_equals_one_shot_with_the_models_scores(lm):
    settings = dict(sampler="contrastive", top_k=3, penalty_alpha=0.5, return_scores=True)
    tokens, scores = generate(lm, PROMPTS, LENGTH, END, **settings)
    steps = list(generate(lm, PROMPTS, LENGTH, END, stream=True, **settings))
    np.testing.assert_array_equal(np.stack([t for t, _ in steps], 1), tokens)
    np.testing.assert_allclose(np.stack([s for _, s in steps], 1), scores, atol=1e-6)
    # the scores: the model's own log-probabilities of the chosen tokens (full passes)
    for row, prompt in enumerate(PROMPTS):
        prompt = prompt[prompt != 0]
        full = np.concatenate([prompt, tokens[row, :-1]])[None].astype("int32")
        logits = np_(lm(full))[0, len(prompt) - 1 :].astype("float64")
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        expected = log_probs[np.arange(LENGTH), tokens[row]]
        live = np.cumsum(np.cumsum(tokens[row] == END)) <= 1  # up to the end token
        np.testing.assert_allclose(scores[row][live], expected[live], atol=1e-5)
        assert np.all(scores[row][~live] == 0)


@pytest.mark.jax_slow  # eager generate, batch after batch
def test_contrastive_search_is_batch_invariant(lm):
    testing.assert_generation_batch_invariance(
        lm, [[5, 6], [7, 8, 9, 3], [4]], 4, END, jit_compile=False, sampler="contrastive",
        top_k=3, penalty_alpha=0.6,
    )  # fmt: skip


def test_bad_contrastive_settings(lm):
    with pytest.raises(ValueError, match="`top_k` must be a positive integer with sampler="):
        generate(lm, PROMPTS, 3, sampler="contrastive", top_k=None)
    for alpha in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match=r"`penalty_alpha` must be a number in \[0, 1\]"):
            generate(lm, PROMPTS, 3, sampler="contrastive", top_k=2, penalty_alpha=alpha)
    with pytest.raises(ValueError, match="`num_return_sequences` must be 1 with sampler="):
        GenerationConfig(sampler="contrastive", top_k=2, num_return_sequences=2)
    # one more position than the outputs: 4 + 12 fits 16 learned positions, 4 + 13 does not
    assert generate(lm, PROMPTS, 12, sampler="contrastive", top_k=2, jit_compile=False).shape
    with pytest.raises(ValueError, match="must fit in the model's learned positions"):
        generate(lm, PROMPTS, 13, sampler="contrastive", top_k=2)
    seq2seq = transformer_seq2seq(VOCAB, VOCAB, num_layers=1, d_model=8, intermediate_dim=8)
    config = GenerationConfig(sampler="contrastive", top_k=2, start_id=1)
    with pytest.raises(ValueError, match="needs a language model's decoding steps"):
        ContrastiveLoop(decoding_steps(seq2seq), config)


# ---------------------------------------------------------------------------
# The peer: keras-hub's ContrastiveSampler on GPT2CausalLM, the same weights
# ---------------------------------------------------------------------------


@pytest.mark.slow  # keras-hub compiles its generate (about 10 s a setting)
def test_contrastive_search_equals_keras_hub_gpt2():
    """keras-hub compares a candidate with every earlier position's hidden state, the prompt
    included (its prompt is unpadded here: equal lengths), as ours does."""
    keras_hub = pytest.importorskip("keras_hub")
    from keras_attn.models.gpt2 import from_gpt2_backbone

    vocab, length = 40, 8
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=64,
        max_sequence_length=20,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    for weight in backbone.weights:
        weight.assign(rng.normal(0, 0.2, weight.shape).astype("float32"))
    causal_lm = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    model = from_gpt2_backbone(backbone)  # GPT-2's token t is our t + 1
    prompts = np.random.default_rng(2).integers(1, vocab, (2, 4)).astype("int32")
    padded = np.concatenate([prompts, np.zeros((2, length), "int32")], 1)
    mask = np.concatenate([np.ones((2, 4), bool), np.zeros((2, length), bool)], 1)
    greedy = generate(model, prompts + 1, length) - 1
    for k, alpha in ((4, 0.6), (3, 0.9)):
        ours = generate(model, prompts + 1, length, sampler="contrastive", top_k=k,
                        penalty_alpha=alpha) - 1  # fmt: skip
        causal_lm.compile(sampler=keras_hub.samplers.ContrastiveSampler(k=k, alpha=alpha))
        hub = causal_lm.generate({"token_ids": padded, "padding_mask": mask}, stop_token_ids=None)
        np.testing.assert_array_equal(ours, np.asarray(hub["token_ids"])[:, 4:])
        assert np.any(ours != greedy)  # (greedy repeats one token here)
