"""`GenerationConfig`: every setting checked once (naming it), hashable (the compile key), the
one way settings travel (`config=` equals the keywords), and the loop's carry a NamedTuple."""

import dataclasses
import math

import keras
import numpy as np
import pytest

from keras_attn.models import (
    GenerationConfig,
    beam_search,
    generate,
    greedy_decode,
    sample_decode,
    transformer_lm,
    transformer_seq2seq,
)
from keras_attn.models.generation import RULES, Carry, DecodingLoop, decoding_steps
from keras_attn.models.generation.compiled import _COMPILED

pytestmark = pytest.mark.backends

START, END, VOCAB = 1, 2, 23
PROMPTS = np.array([[5, 6, 7], [8, 9, 0]], "int32")
SOURCE = np.array([[3, 4, 5, 6], [7, 8, 0, 0]], "int32")


def np_(x):
    return keras.ops.convert_to_numpy(x)


@pytest.fixture(scope="module")
def lm():
    keras.utils.set_random_seed(0)
    return transformer_lm(VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32)


@pytest.fixture(scope="module")
def seq2seq():
    keras.utils.set_random_seed(1)
    return transformer_seq2seq(VOCAB, VOCAB, num_layers=1, d_model=16, intermediate_dim=32)


BAD = [
    ("sampler", "topk"), ("start_id", 0), ("end_id", -1), ("end_id", 1.0),
    ("temperature", -1.0), ("temperature", math.nan), ("temperature", True), ("top_k", -1),
    ("top_k", 1.5), ("top_p", 0.0), ("top_p", 1.5), ("seed", 1.5), ("seed", "0"),
    ("suppress_ids", "3"), ("suppress_ids", [-1]), ("repetition_penalty", 0.0),
    ("repetition_penalty", math.inf), ("repetition_penalty", 1e39),
    ("no_repeat_ngram_size", -1), ("beam_width", 0), ("length_penalty", math.nan),
    ("return_scores", "yes"), ("return_alignment", 1),
]  # fmt: skip


@pytest.mark.parametrize("name,value", BAD)
def test_each_bad_field_raises_naming_it_and_the_value(name, value):
    with pytest.raises(ValueError, match=rf"`{name}` must be .*Received: {name}="):
        GenerationConfig(**{name: value})


def test_every_field_has_one_rule_and_the_rules_name_the_exported_inputs():
    fields = [f.name for f in dataclasses.fields(GenerationConfig)]
    assert set(fields) | {"max_length"} == set(RULES)
    assert GenerationConfig.exported() == (
        "max_length", "temperature", "top_k", "top_p", "seed", "repetition_penalty",
        "stop_sequences", "min_new_tokens",
    )  # fmt: skip


@pytest.mark.tensorflow_only
def test_a_rule_reads_the_same_on_python_values_and_on_tensors():
    import tensorflow as tf

    cases = {
        "max_length": [0, 1, 7], "temperature": [-1.0, 0.0, 2.0, math.nan, math.inf],
        "top_k": [-1, 0, 3], "top_p": [0.0, 0.5, 1.0, 1.5],
        "repetition_penalty": [0.0, 1.0, 2.0, math.inf, math.nan],
    }  # fmt: skip
    for name, values in cases.items():
        rule = RULES[name]
        for value in values:
            tensor = tf.constant(value, rule.exported)
            assert bool(rule.holds(value, math.isfinite)) == bool(
                rule.holds(tensor, tf.math.is_finite)
            ), (name, value)


def test_the_config_is_frozen_hashable_and_keeps_off_values_one_way():
    config = GenerationConfig(sampler="sample", top_k=0, suppress_ids=np.array([4, 3, 4]))
    assert config.top_k is None and config.suppress_ids == (3, 4)
    same = GenerationConfig(sampler="sample", suppress_ids=[3, 4], repetition_penalty=None)
    assert config == same and hash(config) == hash(same) and len({config, same}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.temperature = 0.5
    # the compile key: the seed is the loop's argument; greedy ignores the sampling settings
    assert config.replace(seed=1).compile_key == config.replace(seed=2).compile_key
    greedy = GenerationConfig(sampler="sample", temperature=0, top_p=0.5, seed=3)
    assert greedy.compile_key == GenerationConfig().compile_key


def test_config_equals_the_keywords(lm, seq2seq):
    settings = dict(repetition_penalty=1.3, no_repeat_ngram_size=2, return_scores=True)
    sampled = dict(sampler="sample", temperature=0.8, top_k=5, top_p=0.9, seed=4)
    for options in (settings, {**settings, **sampled}):
        expected = generate(lm, PROMPTS, 4, END, jit_compile=False, **options)
        got = generate(lm, PROMPTS, 4, config=GenerationConfig(end_id=END, **options),
                       jit_compile=False)  # fmt: skip
        for a, b in zip(expected, got, strict=True):
            np.testing.assert_array_equal(a, b)
    config = GenerationConfig(start_id=START, end_id=END, **settings)
    for decoder, extra in ((greedy_decode, {}), (sample_decode, dict(seed=2, top_k=4))):
        expected = decoder(seq2seq, SOURCE, 5, START, END, **settings, **extra)
        got = decoder(seq2seq, SOURCE, 5, config=config.replace(**extra))
        for a, b in zip(expected, got, strict=True):
            np.testing.assert_array_equal(np_(a), np_(b))
    expected = beam_search(seq2seq, SOURCE, 5, START, END, beam_width=3, jit_compile=False)
    beam = GenerationConfig(start_id=START, end_id=END, beam_width=3)
    got = beam_search(seq2seq, SOURCE, 5, config=beam, jit_compile=False)
    np.testing.assert_array_equal(expected[0], got[0])
    # keywords given with a config replace its fields
    np.testing.assert_array_equal(
        np_(greedy_decode(seq2seq, SOURCE, 5, config=config, return_scores=False)),
        np_(greedy_decode(seq2seq, SOURCE, 5, START, END, repetition_penalty=1.3,
                          no_repeat_ngram_size=2)),
    )  # fmt: skip


def test_bad_calls_raise_as_python_does(lm):
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        generate(lm, PROMPTS, 4, temprature=0.5)
    with pytest.raises(TypeError, match="multiple values for argument 'end_id'"):
        generate(lm, PROMPTS, 4, END, end_id=END)
    with pytest.raises(TypeError, match="`config` must be a GenerationConfig"):
        generate(lm, PROMPTS, 4, config={"end_id": END})


@pytest.mark.xla
def test_one_compiled_loop_serves_every_seed(lm):
    config = GenerationConfig(sampler="sample", top_k=4)
    first = generate(lm, PROMPTS, 4, config=config.replace(seed=1), jit_compile=True)
    loops = len(_COMPILED[lm])
    second = generate(lm, PROMPTS, 4, config=config.replace(seed=2), jit_compile=True)
    assert len(_COMPILED[lm]) == loops  # the seed is no part of the compile key
    assert not np.array_equal(first, second)


def test_the_carry_is_a_named_tuple_with_empty_buffers_where_not_asked(seq2seq):
    steps = decoding_steps(seq2seq)
    plain = DecodingLoop(steps, GenerationConfig(start_id=START)).start(SOURCE, 3)
    assert type(plain) is Carry and plain.scores == () and plain.alignment == ()
    assert plain.before == ()  # no logits processor reads the history
    asked = GenerationConfig(start_id=START, return_scores=True, no_repeat_ngram_size=2)
    loop = DecodingLoop(steps, asked)
    carry = loop.step(0, loop.start(SOURCE, 3))
    assert type(carry) is Carry and carry._fields == Carry._fields
    assert carry.scores.shape == (2, 3) and carry.before.shape == (2, 1)
    assert np_(carry.outputs)[:, 1:].tolist() == [[0, 0], [0, 0]]
