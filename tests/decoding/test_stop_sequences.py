"""`stop_sequences` and `min_new_tokens` (issue 57, capabilities 5 and 6).

The references: where a row ends, computed in NumPy from the model's own tokens without the
setting (a row's tokens up to its first complete stop sequence are those tokens: stopping
changes nothing before it); a greedy NumPy loop on the full model's logits with Hugging
Face's `MinNewTokensLengthLogitsProcessor` (and a brute-force ban of the tokens that would
complete a stop sequence); Hugging Face's `StopStringCriteria` on a character vocabulary; a
one-token stop sequence finishing a beam hypothesis exactly as `end_id` does.
"""

import keras
import numpy as np
import pytest

from keras_attn import testing
from keras_attn.models import (
    beam_search,
    generate,
    greedy_decode,
    transformer_lm,
    transformer_seq2seq,
)
from keras_attn.models.generation import GenerationConfig
from keras_attn.models.generation.processors import StopSequences
from model_checks import favour_token

pytestmark = pytest.mark.backends

VOCAB, LENGTH, NEW = 23, 14, 7
PROMPTS = np.array([[5, 6, 7, 8], [10, 3, 0, 0], [4, 7, 0, 0]], "int32")  # right-padded


def np_(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def first_stop(row, stops):
    """The end (exclusive) of the first complete stop sequence in `row`, or None."""
    row = [int(t) for t in row]
    for end in range(1, len(row) + 1):
        if any(end >= len(s) and tuple(row[end - len(s) : end]) == s for s in stops):
            return end
    return None


def truncated(tokens, stops):
    """Each row up to its first complete stop sequence (kept), 0 after: where rows end."""
    out = np.array(tokens)
    for row in out:
        end = first_stop(row, stops)
        if end is not None:
            row[end:] = 0
    return out


@pytest.fixture(scope="module")
def lm():
    keras.utils.set_random_seed(0)
    return transformer_lm(
        VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32, sequence_length=LENGTH
    )


@pytest.fixture(scope="module")
def sevens():
    """A model rigged so greedy repeats 7 after every prompt: "7 7 7 ..."."""
    keras.utils.set_random_seed(2)
    model = transformer_lm(
        VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32, sequence_length=LENGTH
    )
    return favour_token(model, 7, margin=4.0)


# ---------------------------------------------------------------------------
# The config's rules
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", [[5, 6], [[]], [[-1]], [[1.5]], [[True]], "ab", [["a"]], 7, [[5], 6]]
)
def test_bad_stop_sequences_raise_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"`stop_sequences` must be .*Received: stop_sequences="):
        GenerationConfig(stop_sequences=bad)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2", float("nan")])
def test_bad_min_new_tokens_raises_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"`min_new_tokens` must be .*Received: min_new_tokens="):
        GenerationConfig(min_new_tokens=bad)


def test_the_settings_are_kept_one_way_and_hashable():
    config = GenerationConfig(stop_sequences=[[7, 8], np.array([3]), (7, 8)], min_new_tokens=None)
    assert config.stop_sequences == ((3,), (7, 8)) and config.min_new_tokens == 0
    same = GenerationConfig(stop_sequences=((3,), (7, 8)))
    assert hash(config) == hash(same) and config == same
    assert config.compile_key == same.compile_key


def test_an_id_outside_the_vocabulary_raises_in_generate(lm):
    with pytest.raises(ValueError, match=r"`stop_sequences` must be .*vocab_size=23"):
        generate(lm, PROMPTS, NEW, stop_sequences=[[5, 23]], jit_compile=False)
    with pytest.raises(ValueError, match=r"`min_new_tokens` must be"):
        generate(lm, PROMPTS, NEW, min_new_tokens=-2, jit_compile=False)


# ---------------------------------------------------------------------------
# The matcher against brute force and Hugging Face's StopStringCriteria
# ---------------------------------------------------------------------------


def test_stop_sequences_match_a_brute_force_search():
    """`ended` and `completing` on random rows (0 a token too: a `padding_id=-1` model's
    rows hold it) against the definitions, sequence by sequence."""
    rng = np.random.default_rng(0)
    stops = ((0, 1), (2,), (1, 2, 1), (3, 3))
    matcher = StopSequences.of(GenerationConfig(stop_sequences=stops))
    outputs = rng.integers(0, 4, size=(40, 6)).astype("int32")
    for index in range(6):
        ended = np_(matcher.ended(outputs, index))
        expected = [
            any(index + 1 >= len(s) and tuple(row[index + 1 - len(s) : index + 1]) == s
                for s in stops)
            for row in outputs.tolist()
        ]  # fmt: skip
        np.testing.assert_array_equal(ended, expected, err_msg=f"index={index}")
        # after a 2-token prompt: history = prompt + outputs, `index` new tokens so far
        history = np.concatenate([rng.integers(0, 4, (40, 2)), outputs], 1).astype("int32")
        completing = np_(matcher.completing(history, 2 + index, index, 5))
        expected = np.zeros((40, 5), bool)
        for b, row in enumerate(history[:, : 2 + index].tolist()):
            for s in stops:  # the last token completes s, the rest among the new tokens
                if len(s) - 1 <= index and tuple(row[len(row) - len(s) + 1 :]) == s[:-1]:
                    expected[b, s[-1]] = True
        np.testing.assert_array_equal(completing, expected, err_msg=f"index={index}")


def test_ended_is_hugging_faces_stop_string_criteria_on_a_character_vocabulary():
    """One character a token: Hugging Face's `StopStringCriteria` (stop strings) and the
    stop sequences of their characters' ids end the same rows, at every length."""
    pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    torch = pytest.importorskip("torch")
    from transformers import PreTrainedTokenizerFast
    from transformers.generation.stopping_criteria import StopStringCriteria

    letters = "abcdefgh"
    vocab = {"<pad>": 0, **{c: i + 1 for i, c in enumerate(letters)}}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), "isolated")
    backend.decoder = tokenizers.decoders.Fuse()  # characters joined as they are
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>")
    strings = ["ab", "c", "bab", "dd"]
    criteria = StopStringCriteria(tokenizer, strings)
    matcher = StopSequences.of(
        GenerationConfig(stop_sequences=[[vocab[c] for c in s] for s in strings])
    )
    rows = np.random.default_rng(1).integers(1, 5, size=(64, 6)).astype("int32")  # a-d
    for index in range(6):
        expected = np_(criteria(torch.tensor(rows[:, : index + 1], dtype=torch.long), None))
        np.testing.assert_array_equal(np_(matcher.ended(rows, index)), expected)


# ---------------------------------------------------------------------------
# Where rows end: hand-computed, and the NumPy reference
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_rigged_model_ends_at_the_stop_sequence(sevens, jit):
    """Greedy gives 7s; the stop sequence 7 7 ends every row after two new tokens, the
    prompt's own 7 (row 3) not counting: a stop sequence lies among the new tokens."""
    plain = generate(sevens, PROMPTS, NEW, jit_compile=jit)
    assert (plain == 7).all()
    stopped = generate(sevens, PROMPTS, NEW, stop_sequences=[[7, 7]], jit_compile=jit)
    expected = np.zeros((3, NEW), "int32")
    expected[:, :2] = 7
    np.testing.assert_array_equal(stopped, expected)
    one = generate(sevens, PROMPTS, NEW, stop_sequences=[[9], [7]], jit_compile=jit)
    expected[:, 1] = 0  # a one-token sequence: the first 7
    np.testing.assert_array_equal(one, expected)


@pytest.mark.parametrize("sampler", ["greedy", "sample"])
@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_rows_end_where_the_numpy_reference_says(lm, sampler, jit):
    """Stop sequences read off the model's own tokens (a bigram of row 0, a token of row 1,
    one no row completes): each row is its tokens without them, cut after its first one."""
    settings = dict(sampler=sampler, seed=4, temperature=1.5, jit_compile=jit)
    if sampler == "greedy":
        settings = dict(jit_compile=jit)
    plain = generate(lm, PROMPTS, NEW, **settings)
    stops = (tuple(plain[0, 2:4].tolist()), (int(plain[1, 3]),), (21, 22, 21))
    stopped = generate(lm, PROMPTS, NEW, stop_sequences=stops, **settings)
    expected = truncated(plain, stops)
    np.testing.assert_array_equal(stopped, expected)
    assert (expected == 0).any()  # the stops act
    streamed = np.stack(list(generate(lm, PROMPTS, NEW, stop_sequences=stops, stream=True,
                                      **settings)), axis=1)  # fmt: skip
    np.testing.assert_array_equal(streamed, stopped)


def test_stop_sequences_with_scores_and_an_end_id(lm):
    plain, plain_scores = generate(lm, PROMPTS, NEW, return_scores=True, jit_compile=False)
    stops = ((int(plain[0, 1]),),)
    end = int(plain[2, 2])
    tokens, scores = generate(
        lm, PROMPTS, NEW, end, stop_sequences=stops, return_scores=True, jit_compile=False
    )
    expected = plain.copy()
    for row in expected:  # whichever comes first: the end id or the stop sequence
        cut = min(first_stop(row, stops) or NEW, first_stop(row, ((end,),)) or NEW)
        row[cut:] = 0
    np.testing.assert_array_equal(tokens, expected)
    np.testing.assert_allclose(scores, np.where(expected == 0, 0.0, plain_scores), atol=1e-6)


def test_greedy_decode_of_a_seq2seq_model_stops_too():
    keras.utils.set_random_seed(5)
    model = transformer_seq2seq(
        VOCAB, VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=16
    )
    source = np.array([[5, 7, 9, 11, 4], [8, 3, 0, 0, 0]], "int32")
    plain = np_(greedy_decode(model, source, NEW, 1, None))
    stops = (tuple(plain[0, 1:3].tolist()), (int(plain[1, 4]),))
    stopped = np_(greedy_decode(model, source, NEW, 1, None, stop_sequences=stops))
    np.testing.assert_array_equal(stopped, truncated(plain, stops))


# ---------------------------------------------------------------------------
# Beam search: a hypothesis completing a stop sequence is finished, as at end_id
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_one_token_stop_sequence_finishes_a_hypothesis_as_end_id_does(lm, jit):
    """`end_id=v` and `stop_sequences=[[v]]` (another, suppressed, end id) rank and finish
    the same hypotheses: the same tokens and scores."""
    plain = generate(lm, PROMPTS, NEW, jit_compile=False)
    v = int(plain[0, 1])
    common = dict(sampler="beam", beam_width=3, suppress_ids=[22], return_scores=True,
                  jit_compile=jit)  # fmt: skip
    by_end = generate(lm, PROMPTS, NEW, end_id=v, **common)
    by_stop = generate(lm, PROMPTS, NEW, end_id=22, stop_sequences=[[v]], **common)
    np.testing.assert_array_equal(by_stop[0], by_end[0])
    np.testing.assert_allclose(by_stop[1], by_end[1], atol=1e-6)


def test_beam_search_ends_hypotheses_at_a_multi_token_stop_sequence(sevens):
    tokens = generate(sevens, PROMPTS, NEW, 22, sampler="beam", stop_sequences=[[7, 7]],
                      jit_compile=False)  # fmt: skip
    expected = np.zeros((3, NEW), "int32")
    expected[:, :2] = 7
    np.testing.assert_array_equal(tokens, expected)
    # width 1 is greedy decoding: the stops included
    greedy = generate(sevens, PROMPTS, NEW, 22, stop_sequences=[[7, 7]], jit_compile=False)
    one, _ = beam_search(sevens, PROMPTS, NEW, None, 22, beam_width=1, length_penalty=0.0,
                         stop_sequences=[[7, 7]], jit_compile=False)  # fmt: skip
    np.testing.assert_array_equal(one, greedy)


# ---------------------------------------------------------------------------
# min_new_tokens: Hugging Face's rule
# ---------------------------------------------------------------------------


def full_logits(model, prompts, tokens, padding=0):
    """The full model's next-token logits `(B, V)` after each prompt's real tokens and
    `tokens` `(B, t)` (right-padded with `padding` into one batch)."""
    pairs = zip(prompts, tokens, strict=True)
    rows = [[int(t) for t in p if t != padding] + [int(t) for t in y] for p, y in pairs]
    batch = np.array([row + [padding] * (LENGTH - len(row)) for row in rows], "int32")
    logits = np_(model(batch))
    return np.stack([logits[b, len(row) - 1] for b, row in enumerate(rows)]).astype("float32")


def reference_greedy(model, prompts, new, end_id=None, minimum=0, stops=(), padding=0):
    """Greedy decoding in NumPy on the full model: padding ruled out (`padding=-1`: every
    id a token, none ruled out), Hugging Face's
    `MinNewTokensLengthLogitsProcessor` on `end_id`, the tokens completing a stop sequence
    among the new tokens ruled out under `minimum`; rows end at `end_id` or a stop."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor

    batch = len(prompts)
    tokens = np.zeros((batch, 0), "int32")
    ended = np.zeros(batch, bool)
    for index in range(new):
        logits = full_logits(model, prompts, tokens, padding)
        if padding == 0:
            logits[:, 0] = -np.inf
        if end_id is not None:  # HF's input_ids: any prompt of width P, then the new tokens
            hf = MinNewTokensLengthLogitsProcessor(4, minimum, end_id)
            input_ids = torch.zeros((batch, 4 + index), dtype=torch.long)
            logits = hf(input_ids, torch.tensor(logits)).numpy()
        if index < minimum:
            for b, row in enumerate(tokens.tolist()):
                for s in stops:
                    if len(s) - 1 <= index and tuple(row[index - len(s) + 1 :]) == s[:-1]:
                        logits[b, s[-1]] = -np.inf
        chosen = np.where(ended, 0, logits.argmax(-1)).astype("int32")
        tokens = np.concatenate([tokens, chosen[:, None]], 1)
        for b, row in enumerate(tokens.tolist()):
            ended[b] |= row[-1] == end_id or first_stop(row, stops) == len(row)
    return tokens


@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_min_new_tokens_is_hugging_faces_rule(lm, jit):
    """The end token made the likeliest everywhere: without the minimum each row ends at
    once; with it, each row has `min_new_tokens` tokens first (Hugging Face's rule)."""
    keras.utils.set_random_seed(0)
    model = transformer_lm(
        VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32, sequence_length=LENGTH
    )
    model.set_weights(lm.get_weights())
    favour_token(model, 3, margin=3.0)
    plain = generate(model, PROMPTS, NEW, 3, jit_compile=jit)
    assert (plain[:, 0] == 3).all()
    for minimum in (1, 4):
        tokens = generate(model, PROMPTS, NEW, 3, min_new_tokens=minimum, jit_compile=jit)
        np.testing.assert_array_equal(tokens, reference_greedy(model, PROMPTS, NEW, 3, minimum))
        assert (tokens[:, :minimum] != 3).all() and (tokens[:, :minimum] != 0).all()
        streamed = np.stack(list(generate(model, PROMPTS, NEW, 3, min_new_tokens=minimum,
                                          stream=True, jit_compile=jit)), 1)  # fmt: skip
        np.testing.assert_array_equal(streamed, tokens)


@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_min_new_tokens_rules_out_completing_a_stop_sequence(sevens, jit):
    stops = ((7, 7),)
    for minimum in (2, 3):
        tokens = generate(sevens, PROMPTS, NEW, stop_sequences=stops, min_new_tokens=minimum,
                          jit_compile=jit)  # fmt: skip
        expected = reference_greedy(sevens, PROMPTS, NEW, None, minimum, stops)
        np.testing.assert_array_equal(tokens, expected)
        ends = [first_stop(row, stops) for row in tokens]
        assert all(end is not None and end > minimum for end in ends), tokens


def test_token_0_is_a_token_of_a_padding_id_minus_1_model():
    """Every id a token (`padding_id=-1`, an imported model's): a stop sequence of 0s is
    matched by position among the new tokens, never by a 0's value; rigged to repeat 0."""
    keras.utils.set_random_seed(4)
    model = transformer_lm(VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32,
                           sequence_length=LENGTH, padding_id=-1)  # fmt: skip
    favour_token(model, 0, margin=4.0)
    prompts = np.where(PROMPTS == 0, -1, PROMPTS)
    assert (generate(model, prompts, NEW, jit_compile=False) == 0).all()
    stops = ((0, 0),)
    tokens = generate(model, prompts, NEW, stop_sequences=stops, min_new_tokens=3,
                      jit_compile=False)  # fmt: skip
    expected = reference_greedy(model, prompts, NEW, None, 3, stops, padding=-1)
    np.testing.assert_array_equal(tokens, expected)
    # 0, then not 0 (0 0 ruled out under 3 new tokens), 0, then 0 0 completes: the end
    assert (tokens[:, 0] == 0).all() and (tokens[:, 1] != 0).all(), tokens
    assert [first_stop(row, stops) for row in tokens] == [4, 4, 4], tokens


def test_min_new_tokens_in_beam_search_and_sampling(lm):
    plain = generate(lm, PROMPTS, NEW, jit_compile=False)
    end = int(plain[0, 0])  # row 0 ends at once without the minimum
    for sampler in ("beam", "sample"):
        tokens = generate(lm, PROMPTS, NEW, end, sampler=sampler, seed=1, min_new_tokens=3,
                          jit_compile=False)  # fmt: skip
        assert (tokens[:, :3] != end).all() and (tokens[:, :3] != 0).all(), (sampler, tokens)


# ---------------------------------------------------------------------------
# Batch invariance with each setting
# ---------------------------------------------------------------------------


@pytest.mark.jax_slow  # eager: each op compiled anew on JAX (a minute on 2 cores)
def test_batch_invariance_holds_with_each_setting(lm):
    prompts = [[5, 6, 7], [8, 9], [4]]
    plain = generate(lm, np.array([[5, 6, 7], [8, 9, 0], [4, 0, 0]], "int32"), 5,
                     jit_compile=False)  # fmt: skip
    stops = (tuple(plain[0, 1:3].tolist()), (int(plain[2, 2]),))
    testing.assert_generation_batch_invariance(lm, prompts, 5, stop_sequences=stops,
                                               jit_compile=False)  # fmt: skip
    testing.assert_generation_batch_invariance(lm, prompts, 5, int(plain[1, 0]),
                                               min_new_tokens=2, jit_compile=False)  # fmt: skip
