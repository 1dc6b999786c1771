"""Generation controls: scores, repetition penalty, no-repeat n-grams, streaming, bad input."""

import itertools

import keras
import numpy as np
import pytest

from keras_attn.models import (
    generate,
    greedy_decode,
    rnn_seq2seq,
    sample_decode,
    transformer_lm,
    transformer_seq2seq,
)
from keras_attn.models.generation import GenerationConfig
from keras_attn.models.generation import decode as decode_loop
from keras_attn.models.generation.config import (
    check_no_repeat_ngram_size,
    check_repetition_penalty,
)
from keras_attn.models.generation.processors import (
    banned_ngram_tokens,
    penalize_repetition,
    seen_tokens,
)
from keras_attn.models.generation.samplers import greedy_tokens
from model_checks import favour_token

pytestmark = pytest.mark.backends


def np_(x):
    return keras.ops.convert_to_numpy(x)


# ---------------------------------------------------------------------------
# The logits processors against NumPy references
# ---------------------------------------------------------------------------


def ctrl_reference(logits, seen, penalty):
    """CTRL's rule, element by element."""
    out = logits.copy()
    for b, v in zip(*np.nonzero(seen), strict=True):
        out[b, v] = logits[b, v] / penalty if logits[b, v] > 0 else logits[b, v] * penalty
    return out


def banned_reference(history, length, n, vocab, padding_id=0):
    """Brute force: every n-gram of the row's first `length` tokens whose first n - 1 tokens
    are the row's last n - 1 bans its last token (n-grams with padding never count)."""
    banned = np.zeros((len(history), vocab), bool)
    for b, row in enumerate(history[:, :length].tolist()):
        tail = tuple(row[length - n + 1 :]) if n > 1 else ()
        for i in range(length - n + 1):
            gram = row[i : i + n]
            if padding_id not in gram and min(gram) >= 0 and tuple(gram[:-1]) == tail:
                banned[b, gram[-1]] = True
    return banned


def test_penalize_repetition_is_ctrls_rule():
    logits = np.array([[2.0, -1.5, 0.0, 3.0, -np.inf], [-2.0, 1.0, 4.0, -0.5, 1.0]], "float32")
    seen = np.array([[1, 1, 1, 0, 1], [1, 0, 1, 1, 0]], bool)
    for penalty in (1.3, 0.5):
        got = np_(penalize_repetition(logits, seen, penalty))
        np.testing.assert_allclose(got, ctrl_reference(logits, seen, penalty), rtol=1e-6)
    got = np_(penalize_repetition(logits, seen, keras.ops.convert_to_tensor(2.0)))  # a tensor
    np.testing.assert_allclose(got, ctrl_reference(logits, seen, 2.0), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_huge_or_tiny_penalty_never_rules_a_token_out(dtype):
    """CTRL's rule overflows (a seen negative logit times 1e38 is -inf in float32, and float16
    holds no penalty past 65,504): a finite logit stays finite, clipped to the dtype's range,
    and -inf (ruled out) stays -inf; so a row whose every allowed token was seen still
    chooses one of them, never padding (issue 56: it gave token 0)."""
    logits = np.array([[-np.inf, -0.5, -2.0, 0.0, 1.5], [-np.inf, -3.0, -1.0, -0.25, -4.0]])
    seen = np.array([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], bool)
    typed = keras.ops.cast(logits, dtype)
    largest = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}.get(dtype, 3.4028235e38)
    for penalty in (1e38, 3.4e38, 2e-38, 1e-45, 70000.0):
        got = np_(keras.ops.cast(penalize_repetition(typed, seen, penalty), "float64"))
        want = np.clip(ctrl_reference(logits, seen, np.float32(penalty)), -largest, largest)
        want[:, 0] = -np.inf  # ruled out stays ruled out
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-6, err_msg=str(penalty))
        assert np.isfinite(got[:, 1:]).all(), penalty
        assert (np_(greedy_tokens(got)) != 0).all(), penalty  # never padding


def test_generate_with_a_huge_penalty_after_every_allowed_token_was_seen():
    """Only ids 5, 6, 7 allowed, all in the prompt, their logits -4, -5, -6 at every step (the
    final norm's output made a constant `u`, their embedding rows `-4u`, `-5u`, `-6u`): a
    penalty of 1e38 overflowed all three to -inf and greedy decoding emitted padding (0).
    Now each is clipped to float32's lowest and the tie goes to the lowest id, 5."""
    keras.utils.set_random_seed(0)
    model = transformer_lm(VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32)
    u = np.eye(16, dtype="float32")[0]
    norm, table = model.get_layer("final_norm"), model.get_layer("token_embedding").embeddings
    norm.gamma.assign(np.zeros(16, "float32"))
    norm.beta.assign(u)
    rows = np_(table).copy()
    rows[[5, 6, 7]] = -np.array([[4.0], [5.0], [6.0]]) * u
    table.assign(rows)
    suppress = [i for i in range(1, VOCAB) if i not in (5, 6, 7)]
    prompts = np.array([[5, 6, 7, 0]], "int32")
    for jit_compile in (False, True):
        for penalty in (1.0, 1e38):
            tokens = generate(
                model, prompts, NEW, repetition_penalty=penalty, suppress_ids=suppress,
                jit_compile=jit_compile,
            )  # fmt: skip
            np.testing.assert_array_equal(np_(tokens), 5, err_msg=f"{jit_compile} {penalty}")


def test_seen_tokens_ignores_padding():
    tokens = np.array([[3, 1, 3, 0], [0, 0, 4, 4]], "int32")
    expected = np.zeros((2, 6), bool)
    expected[0, [1, 3]] = expected[1, 4] = True
    np.testing.assert_array_equal(np_(seen_tokens(tokens, 6)), expected)
    # padding_id=-1 (an imported checkpoint's): 0 is a token, -1 nothing
    tokens = np.array([[3, -1, 3, 0], [-1, -1, 4, 4]], "int32")
    expected[0, [0, 1]] = True, False
    np.testing.assert_array_equal(np_(seen_tokens(tokens, 6, padding_id=-1)), expected)


def test_banned_ngram_tokens_equals_brute_force():
    rng = np.random.default_rng(0)
    history = rng.integers(1, 4, (3, 9)).astype("int32")  # 3 ids: many repeats
    history[1, :2] = 0  # left padding (a left-aligned prompt)
    history[2, 4] = 0  # padding inside: n-grams across it never count
    for n, length in itertools.product((1, 2, 3), (0, 2, 5, 9)):
        got = np_(banned_ngram_tokens(history, length, n, 5))
        np.testing.assert_array_equal(
            got, banned_reference(history, length, n, 5), f"{n=} {length=}"
        )
    got = np_(banned_ngram_tokens(history, keras.ops.convert_to_tensor(7), 2, 5))  # a tensor
    np.testing.assert_array_equal(got, banned_reference(history, 7, 2, 5))
    assert not np_(banned_ngram_tokens(history[:, :2], 2, 3, 5)).any()  # shorter than n
    # padding_id=-1: 0 is a token (here a frequent one), -1 the padding
    history = np.where(history == 0, -1, history - 1)
    for n, length in itertools.product((1, 2, 3), (2, 5, 9)):
        got = np_(banned_ngram_tokens(history, length, n, 5, padding_id=-1))
        expected = banned_reference(history, length, n, 5, padding_id=-1)
        np.testing.assert_array_equal(got, expected, f"{n=} {length=}")


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), 1e39, True, "2"])
def test_bad_repetition_penalty(bad):
    with pytest.raises(ValueError, match="repetition_penalty"):
        check_repetition_penalty(bad)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_no_repeat_ngram_size(bad):
    with pytest.raises(ValueError, match="no_repeat_ngram_size"):
        check_no_repeat_ngram_size(bad)


# ---------------------------------------------------------------------------
# The loop: scores, repetition controls and streaming against teacher-forced recomputes
# ---------------------------------------------------------------------------

VOCAB, LENGTH, NEW, START, END = 23, 12, 6, 1, 3
PROMPTS = np.array([[5, 6, 7, 8], [10, 3, 0, 0], [4, 0, 0, 0]], "int32")  # right-padded
LEFT_PADDED = np.array([[5, 6, 7, 8], [0, 0, 10, 3], [0, 0, 0, 4]], "int32")
SOURCE = np.array([[5, 7, 9, 11, 4], [8, 3, 0, 0, 0], [12, 13, 14, 0, 0]], "int32")


@pytest.fixture(scope="module")
def lm():
    keras.utils.set_random_seed(0)
    return transformer_lm(
        VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32, sequence_length=LENGTH
    )


@pytest.fixture(scope="module")
def streamed(lm):
    """The compiled calls' settings, by sampler (a compile each: the scores tests compile,
    the stream tests reuse): scores, the repetition controls, and an end token that ends
    row 2 by step 3 (read from an eager run: initial weights differ per backend)."""
    base = dict(temperature=0.7, top_k=5, seed=3, repetition_penalty=1.5, no_repeat_ngram_size=2)
    end = int(generate(lm, PROMPTS, NEW, jit_compile=False, **base)[2, 3])
    return {
        sampler: dict(base, sampler=sampler, end_id=end, return_scores=True)
        for sampler in ("greedy", "sample")
    }


@pytest.fixture(scope="module", params=["transformer", "rnn"])
def seq2seq(request):
    keras.utils.set_random_seed(5)
    if request.param == "rnn":
        return rnn_seq2seq(VOCAB, VOCAB, 8, 16, score="additive")
    return transformer_seq2seq(
        VOCAB, VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=16
    )


def log_softmax(logits):
    logits = logits.astype("float64")
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def after_end(tokens, end=END):
    """bool `(B, T)`: the positions after each row's first `end`."""
    return np.cumsum(np.cumsum(tokens == end, axis=1), axis=1) > 1


def lm_logits(model, prompts, tokens):
    """Teacher-forced next-token logits `(B, T, V)` of `tokens` after each prompt's real
    tokens: the full model on `prompt + tokens`, right-padded (one shape)."""
    rows = [
        [int(t) for t in p if t] + list(map(int, y)) for p, y in zip(prompts, tokens, strict=True)
    ]
    batch = np.array([row + [0] * (LENGTH - len(row)) for row in rows], "int32")
    logits = np_(model(batch))
    return np.stack(
        [logits[b, len(row) - tokens.shape[1] - 1 : len(row) - 1] for b, row in enumerate(rows)]
    )


def seq2seq_logits(model, source, tokens):
    """Teacher-forced logits `(B, T, V)`: the decoder fed `START, y_0, ..., y_{T-2}`."""
    decoder_inputs = np.concatenate([np.full((len(tokens), 1), START), tokens[:, :-1]], 1)
    inputs = {"encoder_inputs": source, "decoder_inputs": decoder_inputs.astype("int32")}
    return np_(model(inputs))


def teacher_forced_scores(logits, tokens, end=END):
    scores = np.take_along_axis(log_softmax(logits), tokens[..., None], -1)[..., 0]
    return np.where(after_end(tokens, end), 0.0, scores)


@pytest.mark.parametrize("sampler", ["greedy", "sample"])
def test_generate_scores_equal_a_teacher_forced_recompute(lm, streamed, sampler):
    options = streamed[sampler]
    tokens, scores = generate(lm, PROMPTS, NEW, **options)  # compiled
    assert scores.dtype == np.float32 and scores.shape == (3, NEW)
    ended = after_end(tokens, options["end_id"])
    if sampler == "greedy":  # a row ends: the scores after an end are checked
        assert ended.any()
    np.testing.assert_array_equal(tokens[ended], 0)
    expected = teacher_forced_scores(lm_logits(lm, PROMPTS, tokens), tokens, options["end_id"])
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    left = generate(lm, LEFT_PADDED, NEW, **options)  # padded on the left
    np.testing.assert_array_equal(left[0], tokens)
    np.testing.assert_allclose(left[1], scores, atol=1e-5)


def test_greedy_decode_scores_equal_a_teacher_forced_recompute(seq2seq):
    tokens, scores = greedy_decode(seq2seq, SOURCE, NEW, START, END, return_scores=True)
    tokens, scores = np_(tokens), np_(scores)
    plain = np_(greedy_decode(seq2seq, SOURCE, NEW, START, END))
    np.testing.assert_array_equal(tokens, plain)  # asking for scores changes no token
    greedy = sample_decode(seq2seq, SOURCE, NEW, START, END, temperature=0.0, seed=4)
    np.testing.assert_array_equal(np_(greedy), plain)  # temperature 0 is greedy
    expected = teacher_forced_scores(seq2seq_logits(seq2seq, SOURCE, tokens), tokens)
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    drawn, drawn_scores = sample_decode(
        seq2seq, SOURCE, NEW, START, END, top_p=0.9, seed=1, return_scores=True
    )
    expected = teacher_forced_scores(seq2seq_logits(seq2seq, SOURCE, np_(drawn)), np_(drawn))
    np.testing.assert_allclose(np_(drawn_scores), expected, atol=1e-5)


def ctrl_greedy(model, prompts, new, penalty):
    """Greedy with CTRL's penalty, step by step on the full model's logits (NumPy)."""
    tokens = np.zeros((len(prompts), 0), "int32")
    for _ in range(new):
        logits = lm_logits(
            model, prompts, np.concatenate([tokens, np.ones((len(prompts), 1), "int32")], 1)
        )[:, -1]
        logits[:, 0] = -np.inf
        seen = np.zeros_like(logits, bool)
        for b, row in enumerate(np.concatenate([prompts, tokens], 1)):
            seen[b, row[row != 0]] = True
        chosen = ctrl_reference(logits, seen, penalty).argmax(-1).astype("int32")
        tokens = np.concatenate([tokens, chosen[:, None]], 1)
    return tokens


def test_generate_with_repetition_penalty_equals_a_numpy_loop(lm):
    penalized = generate(lm, PROMPTS, NEW, repetition_penalty=3.0, jit_compile=False)
    np.testing.assert_array_equal(penalized, ctrl_greedy(lm, PROMPTS, NEW, 3.0))
    plain = generate(lm, PROMPTS, NEW, jit_compile=False)
    assert not np.array_equal(penalized, plain)  # the penalty acts (compiled: the stream test)
    greedy = generate(lm, PROMPTS, NEW, sampler="sample", temperature=0, jit_compile=False)
    np.testing.assert_array_equal(greedy, plain)  # temperature 0 is greedy


def ngrams(row, n):
    row = [int(t) for t in row if t]
    return [tuple(row[i : i + n]) for i in range(len(row) - n + 1)]


def test_no_repeat_ngram_size_repeats_no_ngram():
    keras.utils.set_random_seed(2)
    model = transformer_lm(VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32)
    favour_token(model, 7, margin=4.0)  # greedy repeats 7: "7 7 7 ..."
    plain = generate(model, PROMPTS, NEW, jit_compile=False)
    for n, sampler in itertools.product((1, 2), ("greedy", "sample")):
        assert all(
            len(set(g)) < len(g) for g in (ngrams(r, n) for r in np.hstack([PROMPTS, plain]))
        )
        tokens = generate(
            model, PROMPTS, NEW, sampler=sampler, seed=0, no_repeat_ngram_size=n, jit_compile=False
        )
        for row in np.hstack([PROMPTS, tokens]):
            assert len(set(ngrams(row, n))) == len(ngrams(row, n)), (n, sampler, row)


def test_no_repeat_ngram_size_in_seq2seq(seq2seq):
    tokens = np_(greedy_decode(seq2seq, SOURCE, NEW, START, no_repeat_ngram_size=1))
    for row in np.hstack([np.full((3, 1), START), tokens]):  # the start token counts
        assert len(set(row.tolist())) == len(row), row


def test_a_vocabulary_too_small_for_the_ngrams_still_decodes():
    keras.utils.set_random_seed(1)
    model = transformer_lm(4, num_layers=1, num_heads=1, d_model=8, intermediate_dim=8)
    prompts = np.array([[1, 2, 3]], "int32")
    tokens = generate(model, prompts, 3, no_repeat_ngram_size=1, jit_compile=False)
    # every token is banned from the start: the unbanned argmax, greedy's
    np.testing.assert_array_equal(tokens, generate(model, prompts, 3, jit_compile=False))


@pytest.mark.parametrize("sampler", ["greedy", "sample"])
def test_stream_equals_the_one_shot_call(lm, streamed, sampler):
    options = streamed[sampler]
    tokens, scores = generate(lm, PROMPTS, NEW, **options)  # compiled (and cached) above
    pairs = list(generate(lm, PROMPTS, NEW, stream=True, **options))  # compiled
    assert len(pairs) == NEW and all(t.shape == (3,) and t.dtype == np.int32 for t, _ in pairs)
    np.testing.assert_array_equal(np.stack([t for t, _ in pairs], 1), tokens)
    np.testing.assert_allclose(np.stack([s for _, s in pairs], 1), scores, atol=1e-6)
    options = {**options, "return_scores": False}
    eager = generate(lm, PROMPTS, NEW, stream=True, jit_compile=False, **options)
    np.testing.assert_array_equal(np.stack(list(eager), 1), tokens)


def test_stream_after_every_row_ended_yields_zeros(lm):
    first = generate(lm, PROMPTS[:1], 1, jit_compile=False)[0, 0]  # it ends row 0 at once
    streamed = generate(lm, PROMPTS[:1], NEW, end_id=int(first), stream=True, jit_compile=False)
    streamed = list(streamed)
    np.testing.assert_array_equal(np.stack(streamed, 1), [[first] + [0] * (NEW - 1)])


class FakeAlignmentSteps:
    """A bigram-like decoder whose alignment at step `index` is known: `index + 1` on source
    position `index % S`, and the logits favour token `index + 2` (so END at step 1)."""

    vocab_size = 8

    def start(self, encoder_inputs, max_length):
        return {"source": keras.ops.cast(encoder_inputs, "float32")}

    def step(self, tokens, index, state, return_alignment=False):
        source = state["source"]
        logits = keras.ops.one_hot(keras.ops.full_like(tokens, index + 2), 8) * 5.0
        if not return_alignment:
            return logits, state
        positions = keras.ops.arange(keras.ops.shape(source)[1])
        hot = keras.ops.cast(
            keras.ops.equal(positions, index % keras.ops.shape(source)[1]), "float32"
        )
        return (
            logits,
            state,
            keras.ops.zeros_like(source) + hot * keras.ops.cast(index + 1, "float32"),
        )


def test_alignment_is_collected_per_step_and_zero_after_the_end():
    source = np.ones((2, 3), "int32")
    tokens, alignment = _decode_with(FakeAlignmentSteps(), source, return_alignment=True)
    np.testing.assert_array_equal(tokens, [[2, 3, 0, 0]] * 2)
    expected = np.zeros((2, 4, 3), "float32")
    expected[:, 0, 0], expected[:, 1, 1] = 1.0, 2.0  # steps 2 and 3 come after the end (3)
    np.testing.assert_array_equal(alignment, expected)


def _decode_with(steps, source, **options):
    config = GenerationConfig(start_id=START, end_id=3, **options)
    decoded = decode_loop(steps, source, 4, config, lambda logits, index: greedy_tokens(logits))
    return np_(decoded.tokens), np_(decoded.alignment)


# ---------------------------------------------------------------------------
# Bad input, empty batches
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,name",
    [({"temperature": -1.0}, "temperature"), ({"temperature": float("nan")}, "temperature"),
     ({"top_k": -1}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
     ({"max_length": 0}, "max_length"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
     ({"repetition_penalty": -2.0}, "repetition_penalty"),
     ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size"), ({"end_id": VOCAB}, "end_id")],
)  # fmt: skip
def test_bad_generation_settings_name_the_argument(lm, kwargs, name):
    options = {"max_length": NEW, "sampler": "sample", **kwargs}
    value = kwargs[name]
    with pytest.raises(ValueError, match=rf"`{name}` must be .*Received: {name}={value!r}"):
        generate(lm, PROMPTS, **options)


def test_bad_lengths_and_modes_raise(lm, seq2seq):
    with pytest.raises(ValueError, match=r"sequence_length=12\). Received: max_length=10"):
        generate(lm, PROMPTS, 10)  # 4 prompt tokens + 10 - 1 new positions > 12
    with pytest.raises(ValueError, match=r"Received: stream=True, sampler='beam'"):
        generate(lm, PROMPTS, NEW, end_id=END, sampler="beam", stream=True)
    with pytest.raises(ValueError, match=r"`return_alignment=True` .*Received: return_alignment"):
        greedy_decode(lm, PROMPTS, NEW, return_alignment=True)  # a language model
    with pytest.raises(ValueError, match=r"`repetition_penalty` must be .*Received"):
        sample_decode(seq2seq, SOURCE, NEW, START, repetition_penalty=float("inf"))


def test_an_empty_batch_gives_empty_results(lm, seq2seq):
    tokens, scores = generate(lm, PROMPTS[:0], NEW, return_scores=True)
    assert tokens.shape == scores.shape == (0, NEW)
    assert tokens.dtype == np.int32 and scores.dtype == np.float32
    assert [t.shape for t in generate(lm, PROMPTS[:0], 2, stream=True)] == [(0,), (0,)]
    for decode in (greedy_decode, sample_decode):
        tokens, scores, alignment = decode(
            seq2seq, SOURCE[:0], NEW, START, return_scores=True, return_alignment=True
        )
        assert tuple(tokens.shape) == tuple(scores.shape) == (0, NEW)
        assert tuple(alignment.shape) == (0, NEW, SOURCE.shape[1])
