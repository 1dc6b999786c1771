"""A sliding-window language model generates through ring caches of `w` positions
(`keras_attn.cache.RingKVCache`): the tokens of the full caches (`LanguageModelSteps(model,
ring=False)`) and of the uncached full pass, for prompts shorter and longer than `w`, well past
`w` new tokens; eager, compiled, sampled and in beam search. The ring in one layer: chunks and
steps through it equal the full windowed pass.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.cache import RingKVCache
from keras_attn.models import generate, greedy_decode, transformer_lm
from keras_attn.models.decoding import beam_search_loop, sample_decode
from keras_attn.models.transformer_lm import LanguageModelSteps

VOCAB, WINDOW, NEW = 30, 2, 6  # 6 new tokens: the ring of 2 wraps three times
# A prompt shorter than the window (padded on either side) and one longer (4 real tokens).
PROMPTS = np.array([[5, 0, 0, 0, 0], [0, 0, 0, 6, 7], [0, 8, 9, 4, 3]], "int32")


def np_(x):
    return keras.ops.convert_to_numpy(x)


@pytest.fixture(scope="module", params=["rotary", "alibi"])
def model(request):
    keras.utils.set_random_seed(1)
    return transformer_lm(
        VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32,
        position=request.param, sliding_window=WINDOW, dropout=0.0,
    )  # fmt: skip


def full_cache(model):
    return LanguageModelSteps(model, ring=False)


@pytest.fixture(scope="module")
def reference(model):
    """The greedy tokens through full caches (today's path), eager."""
    return np_(greedy_decode(model, PROMPTS, NEW, steps=full_cache(model)))


def test_the_caches_are_rings_of_the_window(model):
    steps = LanguageModelSteps(model)
    state = steps.start(PROMPTS, NEW)
    assert all(isinstance(c, RingKVCache) for c in state.caches)
    assert state.caches[0].key.shape[2] == WINDOW
    assert np_(state.cache_index).tolist() == [4, 4, 4]  # the prompts' width, less one
    reference = full_cache(model).start(PROMPTS, NEW).caches[0]
    assert type(reference) is keras_attn.KVCache and reference.key.shape[2] == 4 + NEW
    with pytest.raises(ValueError, match=r"LanguageModelState\(cache_index=None\)"):
        steps.step(steps.start_tokens(PROMPTS), 0, state._replace(cache_index=None))


def test_greedy_ring_equals_full_cache_and_uncached_pass(model, reference):
    tokens = np_(greedy_decode(model, PROMPTS, NEW))
    np.testing.assert_array_equal(tokens, reference)
    # The uncached full pass, teacher-forced on the generated tokens: each token is the
    # argmax (padding ruled out) of the logits at the position before it.
    for prompt, row in zip(PROMPTS, tokens, strict=True):
        sequence = np.concatenate([prompt[prompt != 0], row])[None]
        logits = np_(model(sequence))[0, -NEW - 1 : -1]
        logits[:, 0] = -np.inf
        np.testing.assert_array_equal(row, logits.argmax(-1))


def test_sampled_ring_equals_full_cache(model):
    options = dict(temperature=1.5, seed=3)
    drawn = np_(sample_decode(model, PROMPTS, NEW, **options))
    reference = sample_decode(model, PROMPTS, NEW, steps=full_cache(model), **options)
    np.testing.assert_array_equal(drawn, np_(reference))
    assert len(np.unique(drawn)) > 3  # not a greedy-like sample


def test_beam_search_ring_equals_full_cache(model):
    options = dict(max_length=NEW, start_id=None, end_id=1, beam_width=2)
    ring = beam_search_loop(model, PROMPTS, **options)
    full = beam_search_loop(model, PROMPTS, steps=full_cache(model), **options)
    np.testing.assert_array_equal(np_(ring.tokens), np_(full.tokens))
    np.testing.assert_allclose(np_(ring.sequence_scores), np_(full.sequence_scores), atol=1e-5)


@pytest.mark.xla
def test_compiled_ring_equals_full_cache(model, reference):
    np.testing.assert_array_equal(generate(model, PROMPTS, NEW, jit_compile=True), reference)


def test_multi_head_attention_ring_equals_full_pass():
    """A chunk longer than the ring, steps, and a chunk after steps (the ring attended with
    the new tokens) through a ring longer than the window (the language models' rings are the
    window): the full windowed pass, with rotary keys and ALiBi."""
    x = keras.random.normal((2, 9, 8), seed=2)
    layer = keras_attn.MultiHeadAttention(
        2, 4, sliding_window=3, rotary_embedding=keras_attn.RotaryEmbedding(),
        position_bias=keras_attn.AlibiBias(),
    )  # fmt: skip
    full = np_(layer(x, x, use_causal_mask=True))
    ring, outputs = RingKVCache(*layer.empty_cache(2, 5)), []
    for start, stop in [(0, 6), (6, 7), (7, 9)]:
        chunk = x[:, start:stop]
        y, ring = layer(chunk, chunk, use_causal_mask=True, cache=ring, cache_update_index=start)
        outputs.append(np_(y))
    assert isinstance(ring, RingKVCache) and ring.key.shape[2] == 5
    np.testing.assert_allclose(np.concatenate(outputs, 1), full, atol=1e-5)


def test_bad_rings_raise():
    layer = keras_attn.MultiHeadAttention(2, 4, sliding_window=3)
    x = keras.random.normal((1, 1, 8))
    layer(x, x)
    with pytest.raises(ValueError, match="sliding_window=3, cache length=2"):
        layer(x, x, cache=RingKVCache(*layer.empty_cache(1, 2)), cache_update_index=0)
    ring = RingKVCache(*layer.empty_cache(1, 3))
    with pytest.raises(ValueError, match="takes no `attention_mask`"):
        layer(x, x, cache=ring, cache_update_index=0, attention_mask=np.ones((1, 1, 3), bool))
    with pytest.raises(ValueError, match="cache_update_index=None"):
        layer(x, cache=ring)
    unwindowed = keras_attn.MultiHeadAttention(2, 4)
    unwindowed(x, x)
    with pytest.raises(ValueError, match="sliding_window=None"):
        unwindowed(x, x, cache=ring, cache_update_index=0)
    lm = transformer_lm(VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32)
    with pytest.raises(ValueError, match="ring=True, sliding_window=None"):
        LanguageModelSteps(lm, ring=True)
    with pytest.raises(ValueError, match="ring='full'"):
        LanguageModelSteps(lm, ring="full")
