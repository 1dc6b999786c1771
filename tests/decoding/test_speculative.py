"""Speculative decoding: greedy tokens equal the target's own, sampled tokens distributed as
the target's (a chi-square test on a tiny vocabulary against NumPy's exact distribution)."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn._execution import no_gradients
from keras_attn.models import generate, transformer_lm
from keras_attn.models.generation.speculative import SpeculativeStats, sampling_probabilities
from keras_attn.models.transformer_lm import LanguageModelSteps

pytestmark = pytest.mark.backends

# chi2.isf(1e-6, dof) (scipy.stats): a statistic above it has probability 1e-6 under the null
CHI2_1E6 = {3: 30.66, 8: 42.70, 15: 56.49}
PROMPTS = np.array([[5, 6, 7, 8], [9, 3, 0, 0], [0, 4, 11, 0]], "int32")  # ragged, both sides


def lm(vocab, layers, d_model, seed, **options):
    keras.utils.set_random_seed(seed)
    return transformer_lm(
        vocab, num_layers=layers, d_model=d_model, intermediate_dim=2 * d_model,
        num_heads=2, dropout=0.0, **options,
    )  # fmt: skip


def perturbed(target, seed, scale=0.1):
    """A draft close to `target`: its weights (a copy) with noise of `scale` their spread."""
    draft = keras.models.clone_model(target)
    rng = np.random.default_rng(seed)
    for mine, theirs in zip(draft.weights, target.weights, strict=True):
        value = ops.convert_to_numpy(theirs)
        noise = scale * value.std() * rng.normal(size=value.shape) if value.ndim > 1 else 0
        mine.assign(value + noise)
    return draft


@pytest.fixture(scope="module")
def models():
    target = lm(40, 3, 32, 1)
    return target, perturbed(target, 0), lm(40, 1, 16, 2)


@pytest.mark.parametrize("position", ["learned", "rotary"])
def test_extend_equals_steps_after_a_roll_back(position):
    """`extend` (k tokens at once) gives the logits of k single steps, also from a state
    rolled back over rejected keys (left in the cache, overwritten)."""
    model = lm(30, 2, 16, 0, position=position)
    with no_gradients():  # torch: tensors NumPy can read
        check_extend(LanguageModelSteps(model, ring=False))


def check_extend(steps):
    state = steps.start(PROMPTS, 8)
    fed = np.concatenate([np.asarray(ops.convert_to_numpy(steps.start_tokens(PROMPTS)))[:, None],
                          [[11, 12, 13], [14, 15, 16], [17, 18, 19]]], axis=1)  # fmt: skip
    logits, extended = steps.extend(fed, state)
    one, reference = state, []
    for t in range(4):
        step_logits, one = steps.step(fed[:, t], t, one)
        reference.append(step_logits)
    np.testing.assert_allclose(logits, ops.stack(reference, 1), atol=1e-5)
    # two of the four kept: the next two tokens see those only
    kept = extended._replace(positions=state.positions + 2, cache_index=state.cache_index + 2)
    again, _ = steps.extend(fed[:, 2:] + 5, kept)
    one = state
    for t, tokens in enumerate([fed[:, 0], fed[:, 1], fed[:, 2] + 5, fed[:, 3] + 5]):
        step_logits, one = steps.step(tokens, t, one)
        if t >= 2:
            np.testing.assert_allclose(again[:, t - 2], step_logits, atol=1e-5)


@pytest.mark.parametrize("jit_compile", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_greedy_is_the_targets_greedy(models, jit_compile):
    """Token for token, with a close draft (rows accept differently) and a random one."""
    target, shared, random = models
    reference = generate(target, PROMPTS, 10, jit_compile=jit_compile)
    end_id = int(reference[0, 4])  # ends row 0 early (and others where they meet it)
    reference_end = generate(target, PROMPTS, 10, end_id=end_id, jit_compile=jit_compile)
    for draft, k in ((shared, 3), (random, 1)):
        tokens, stats = generate(target, PROMPTS, 10, draft_model=draft, num_speculative_tokens=k,
                                 jit_compile=jit_compile, return_acceptance=True)  # fmt: skip
        np.testing.assert_array_equal(tokens, reference)
        ended = generate(target, PROMPTS, 10, draft_model=draft, num_speculative_tokens=k,
                         end_id=end_id, jit_compile=jit_compile)  # fmt: skip
        np.testing.assert_array_equal(ended, reference_end)
        assert isinstance(stats, SpeculativeStats) and 0 <= stats.acceptance_rate <= 1
        assert stats.rounds * stats.tokens_per_round == pytest.approx(10)
        if draft is shared:  # rows accept different numbers: more than the lockstep keeps
            assert k * stats.acceptance_rate > stats.tokens_per_round - 1 > 0


def test_the_target_as_its_own_draft_accepts_everything(models):
    target = models[0]
    tokens, stats = generate(target, PROMPTS, 10, draft_model=target, num_speculative_tokens=3,
                             return_acceptance=True, jit_compile=False)  # fmt: skip
    np.testing.assert_array_equal(tokens, generate(target, PROMPTS, 10, jit_compile=False))
    assert stats == SpeculativeStats(1.0, 10 / 3, 3)  # 4 + 4 + 2 (of 4) tokens


@pytest.mark.slow
def test_processors_and_scores_as_the_targets(models):
    """The logits processors read each position's own history (the proposals before it)."""
    target, shared, _ = models
    settings = dict(repetition_penalty=1.5, no_repeat_ngram_size=2, suppress_ids=[3, 9],
                    return_scores=True)  # fmt: skip
    tokens, scores = generate(target, PROMPTS, 10, **settings)
    spec_tokens, spec_scores = generate(target, PROMPTS, 10, draft_model=shared, **settings)
    np.testing.assert_array_equal(spec_tokens, tokens)
    np.testing.assert_allclose(spec_scores, scores, atol=1e-5)
    # min_new_tokens (a processor at each position's own index) and the int8 KV caches
    settings = dict(min_new_tokens=3, end_id=int(tokens[0, 1]), kv_cache_dtype="int8")
    np.testing.assert_array_equal(
        generate(target, PROMPTS, 10, draft_model=shared, **settings),
        generate(target, PROMPTS, 10, **settings),
    )


def numpy_distribution(logits, temperature, top_k):
    """The target's sampling distribution from raw logits (padding ruled out), in NumPy."""
    logits = np.asarray(logits, "float64").copy()
    logits[..., 0] = -np.inf
    if top_k:
        cut = np.sort(logits, axis=-1)[..., -top_k][..., None]
        logits = np.where(logits >= cut, logits, -np.inf)
    z = np.exp((logits - logits.max(-1, keepdims=True)) / temperature)
    return z / z.sum(-1, keepdims=True)


def test_sampling_probabilities_against_numpy():
    logits = np.random.default_rng(0).normal(size=(3, 7)).astype("float32")
    logits[:, 0] = -np.inf
    for temperature, top_k in ((1.0, None), (0.6, 3)):
        np.testing.assert_allclose(
            sampling_probabilities(logits, temperature, top_k),
            numpy_distribution(logits, temperature, top_k), atol=1e-6,
        )  # fmt: skip
    nucleus = sampling_probabilities(np.log([[0.5, 0.3, 0.15, 0.05]]), top_p=0.8)
    np.testing.assert_allclose(nucleus, [[0.625, 0.375, 0, 0]], atol=1e-6)  # 0.5 + 0.3 >= 0.8


@pytest.mark.slow
@pytest.mark.parametrize("draft_is_target", [False, True])
def test_sampled_tokens_are_distributed_as_the_targets(draft_is_target):
    """The first two tokens of 4,000 rows (one prompt) against the target's exact joint
    distribution: chi-square below its 1e-6 quantile, while the draft's own distribution
    is rejected. A random draft exercises rejections and the residual draw (a batch this
    large keeps few proposals in lockstep), the target as its own draft the bonus token;
    the second token comes after the caches' roll back."""
    vocab, rows, temperature, top_k = 5, 4000, 0.8, 3
    target = lm(vocab, 2, 8, 3)
    draft = target if draft_is_target else lm(vocab, 1, 8, 4)
    prompt = np.array([[1, 2, 3]], "int32")
    tokens, stats = generate(target, np.repeat(prompt, rows, 0), 2, sampler="sample", seed=5,
                             temperature=temperature, top_k=top_k, draft_model=draft,
                             num_speculative_tokens=2, return_acceptance=True)  # fmt: skip
    if draft_is_target:
        assert stats.acceptance_rate == 1.0

    def joint(model):
        first = numpy_distribution(ops.convert_to_numpy(model(prompt))[0, -1], temperature, top_k)
        nexts = np.concatenate([prompt.repeat(vocab, 0), np.arange(vocab)[:, None]], 1)
        second = ops.convert_to_numpy(model(nexts))[:, -1]  # (V, V): after each first token
        second = numpy_distribution(second, temperature, top_k)
        return first[:, None] * second

    counts = np.zeros((vocab, vocab))
    np.add.at(counts, (tokens[:, 0], tokens[:, 1]), 1)

    def chi_square(expected):
        cells = expected > 0
        assert counts[~cells].sum() == 0  # nothing outside the support
        expected = rows * expected[cells]
        return ((counts[cells] - expected) ** 2 / expected).sum(), cells.sum() - 1

    statistic, dof = chi_square(joint(target))
    assert statistic < CHI2_1E6[dof]
    if not draft_is_target:  # the test has the power to tell the draft's distribution
        assert chi_square(joint(draft) + 1e-12 * (joint(target) > 0))[0] > 10 * CHI2_1E6[dof]


def test_bad_arguments(models):
    target, shared, _ = models
    other = lm(41, 1, 16, 0)
    with pytest.raises(ValueError, match="draft_model.*vocab_size=41"):
        generate(target, PROMPTS, 4, draft_model=other)
    with pytest.raises(ValueError, match="draft_model.*sampler='beam'"):
        generate(target, PROMPTS, 4, draft_model=shared, sampler="beam", end_id=2)
    with pytest.raises(ValueError, match="draft_model.*sampler='contrastive'"):
        generate(target, PROMPTS, 4, draft_model=shared, sampler="contrastive", top_k=4)
    with pytest.raises(ValueError, match="draft_model.*num_return_sequences=2"):
        generate(target, PROMPTS, 4, draft_model=shared, sampler="sample", num_return_sequences=2)
    with pytest.raises(ValueError, match="draft_model.*stop_sequences"):
        generate(target, PROMPTS, 4, draft_model=shared, stop_sequences=[[5, 6]])
    with pytest.raises(ValueError, match="draft_model.*transformer_lm"):
        generate(target, PROMPTS, 4, draft_model="small")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=f"num_speculative_tokens={bad!r}"):
            generate(target, PROMPTS, 4, draft_model=shared, num_speculative_tokens=bad)
    with pytest.raises(ValueError, match="needs a `draft_model`.*num_speculative_tokens=2"):
        generate(target, PROMPTS, 4, num_speculative_tokens=2)
    with pytest.raises(ValueError, match="return_acceptance=True, draft_model=None"):
        generate(target, PROMPTS, 4, return_acceptance=True)
    with pytest.raises(ValueError, match="return_acceptance=True, stream=True"):
        generate(target, PROMPTS, 4, draft_model=shared, stream=True, return_acceptance=True)


@pytest.mark.parametrize("settings", [dict(end_id=None), dict(sampler="sample", seed=3, top_k=8)])
def test_streamed_is_the_one_shot(models, settings):
    """The stream runs the same rounds with the same draws: the same tokens and scores."""
    target, shared, _ = models
    end_id = int(generate(target, PROMPTS, 10)[0, 4])  # row 0 ends, the others go on
    settings = dict(settings, end_id=end_id, return_scores=True, draft_model=shared,
                    num_speculative_tokens=3, jit_compile=False)  # fmt: skip
    tokens, scores = generate(target, PROMPTS, 10, **settings)
    steps = list(generate(target, PROMPTS, 10, stream=True, **settings))
    assert len(steps) == 10
    np.testing.assert_array_equal(np.stack([t for t, _ in steps], axis=1), tokens)
    np.testing.assert_allclose(np.stack([s for _, s in steps], axis=1), scores, atol=1e-6)
