"""Beam search, compiled: equal to the NumPy ranking it replaced, with scores, alignment and
repetition controls."""

import types

import keras
import numpy as np
import pytest

from keras_attn.models import (
    beam_search,
    generate,
    greedy_decode,
    rnn_seq2seq,
    transformer_lm,
    transformer_seq2seq,
)
from keras_attn.models.decoding import decoding_steps, first_tokens

pytestmark = pytest.mark.backends

START, VOCAB, LENGTH = 1, 20, 5
SOURCE = np.array([[5, 7, 9, 11, 4, 6], [8, 3, 0, 0, 0, 0], [12, 13, 14, 0, 0, 0]], "int32")
PROMPTS = np.array([[0, 0, 5, 6], [7, 8, 9, 0], [3, 0, 0, 0]], "int32")  # padded either side
BUILDERS = {
    "transformer": lambda: transformer_seq2seq(
        VOCAB, VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=16
    ),
    "rnn": lambda: rnn_seq2seq(VOCAB, VOCAB, 8, 16, score="additive"),
    "lm": lambda: transformer_lm(
        VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=16, sequence_length=12
    ),
}


def np_(x):
    return keras.ops.convert_to_numpy(x)


class Case:
    """A model, its inputs, its start token and an end token: the commonest of its greedy
    tokens after the second step that are not among the first two (so some hypotheses
    finish, early or late, and extend with padding, while others run to `LENGTH`)."""

    def __init__(self, kind):
        keras.utils.set_random_seed(7)
        self.kind, self.model = kind, BUILDERS[kind]()
        self.lm = kind == "lm"
        self.inputs, self.start = (PROMPTS, None) if self.lm else (SOURCE, START)
        greedy = np_(greedy_decode(self.model, self.inputs, 8, self.start))
        later = greedy[:, 2:][~np.isin(greedy[:, 2:], greedy[:, :2])]
        self.end = int(np.bincount(later).argmax()) if later.size else 2

    def search(self, **kwargs):
        return beam_search(self.model, self.inputs, LENGTH, self.start, self.end, **kwargs)

    def reference(self, width, alpha, **kwargs):
        return reference_beam_search(
            self.model, self.inputs, LENGTH, self.start, self.end, width, alpha, **kwargs
        )


@pytest.fixture(scope="module")
def cases():
    """Each model built once per module, on first use."""
    built = {}

    def get(kind):
        if kind not in built:
            built[kind] = Case(kind)
        return built[kind]

    return get


@pytest.fixture(params=list(BUILDERS))
def case(cases, request):
    return cases(request.param)


@pytest.fixture
def seq2seq(cases):
    return cases("transformer")


# ---------------------------------------------------------------------------
# The reference: the NumPy ranking `beam_search` used before it was compiled (float64),
# with the repetition controls applied per hypothesis in NumPy
# ---------------------------------------------------------------------------


def ctrl(logits, seen, penalty):
    penalized = np.where(logits > 0, logits / penalty, logits * penalty)
    return np.where(seen, penalized, logits)


def banned_ngrams(history, n, vocab):
    """bool `(V,)`: tokens that would complete an n-gram (no padding in it) already in
    `history` (one hypothesis' tokens so far), by enumeration."""
    banned = np.zeros(vocab, bool)
    if len(history) < n:
        return banned
    last = tuple(history[len(history) - n + 1 :])
    for i in range(len(history) - n + 1):
        gram = tuple(history[i : i + n])
        if 0 not in gram and gram[:-1] == last:
            banned[gram[-1]] = True
    return banned


def reference_beam_search(
    model, source, max_length, start_id, end_id, width, alpha, suppress_ids=(), penalty=1.0,
    ngram=0, n=None,
):  # fmt: skip
    steps = decoding_steps(model)
    batch = source.shape[0]
    source = np.repeat(source, width, axis=0)  # (B*K, S)
    tokens = np_(first_tokens(steps, source, start_id))
    # what a hypothesis holds before its outputs: a prompt's real tokens, or the start token
    before = (
        [list(row[row != 0]) for row in source] if start_id is None else [[start_id]] * len(source)
    )
    state = steps.start(source, max_length)
    log_probs = np.full((batch, width), -np.inf)
    log_probs[:, 0] = 0.0
    lengths = np.zeros((batch, width))
    finished = np.zeros((batch, width), bool)
    sequences = np.zeros((batch, width, max_length), "int32")
    for index in range(max_length):
        logits, state = steps.step(tokens, index, state)
        logits = np_(logits).astype("float64")  # (B*K, V)
        vocab = logits.shape[-1]
        logits[:, [0, *suppress_ids]] = -np.inf
        for row in range(batch * width):
            history = np.array(
                before[row] + list(sequences.reshape(batch * width, -1)[row, :index])
            )
            if penalty != 1.0:
                seen = np.isin(np.arange(vocab), history[history != 0])
                logits[row] = ctrl(logits[row], seen, penalty)
            if ngram:
                banned = banned_ngrams(history, ngram, vocab)
                if np.any(np.isfinite(np.where(banned, -np.inf, logits[row]))):
                    logits[row] = np.where(banned, -np.inf, logits[row])
        top = logits.max(-1, keepdims=True)
        step_log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        step_log_probs = step_log_probs.reshape(batch, width, vocab)
        pad_only = np.full(vocab, -np.inf)
        pad_only[0] = 0.0  # a finished hypothesis extends with padding, at no cost
        step_log_probs = np.where(finished[..., None], pad_only, step_log_probs)
        candidates = log_probs[..., None] + step_log_probs  # (B, K, V)
        new_lengths = lengths + ~finished
        ranked = candidates / (((5.0 + new_lengths) / 6.0) ** alpha)[..., None]
        best = np.argsort(-ranked.reshape(batch, -1), axis=-1, kind="stable")[:, :width]
        beam, token = best // vocab, (best % vocab).astype("int32")  # (B, K)
        rows = np.arange(batch)[:, None]
        log_probs = candidates[rows, beam, token]
        lengths, finished = new_lengths[rows, beam], finished[rows, beam]
        sequences = sequences[rows, beam]
        sequences[:, :, index] = token
        finished = finished | (token == end_id)
        flat = (rows * width + beam).reshape(-1)
        state = keras.tree.map_structure(
            lambda s, rows=flat: keras.ops.take(s, rows, axis=0), state
        )
        tokens = token.reshape(-1)
        if finished.all():
            break
    final = log_probs / ((5.0 + np.maximum(lengths, 1)) / 6.0) ** alpha
    if n is not None:  # each example's n best final beams, best first: (B * n, T), (B * n,)
        order = np.argsort(-final, axis=-1, kind="stable")[:, :n]
        rows = np.arange(batch)[:, None]
        return sequences[rows, order].reshape(batch * n, -1), final[rows, order].reshape(-1)
    choice = np.argmax(final, axis=-1)
    rows = np.arange(batch)
    return sequences[rows, choice], final[rows, choice]


def assert_equal_search(result, expected):
    np.testing.assert_array_equal(result[0], expected[0])
    np.testing.assert_allclose(result[1], expected[1], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# The recomputes: scores and alignment of the chosen tokens, teacher-forced
# ---------------------------------------------------------------------------


def teacher_forced_log_probs(case, tokens):
    """float64 `(B, T, V)`: the model's log-softmax for each output position, in one pass."""
    if not case.lm:
        decoder_inputs = np.concatenate([np.full((len(tokens), 1), START), tokens[:, :-1]], 1)
        inputs = {"encoder_inputs": case.inputs, "decoder_inputs": decoder_inputs.astype("int32")}
        logits = np_(case.model(inputs)).astype("float64")
    else:  # each row alone, unpadded: its prompt, then its outputs
        logits = []
        for prompt, row in zip(case.inputs, tokens, strict=True):
            prompt = prompt[prompt != 0]
            full = np.concatenate([prompt, row[:-1]])[None].astype("int32")
            logits.append(np_(case.model(full))[0, len(prompt) - 1 :].astype("float64"))
        logits = np.stack(logits)
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def ended(tokens, end_id):
    """bool `(B, T)`: positions after each row's end token."""
    return np.cumsum(np.cumsum(tokens == end_id, axis=1), axis=1) > 1


def teacher_forced_scores(case, tokens):
    log_probs = teacher_forced_log_probs(case, tokens)
    scores = np.take_along_axis(log_probs, tokens[..., None], axis=-1)[..., 0]
    return np.where(ended(tokens, case.end), 0.0, scores)


def stepped_alignment(case, tokens):
    """`(B, T, S)`: the steps' alignment fed `START, tokens[:-1]` (0 after the end)."""
    steps = decoding_steps(case.model)
    state = steps.start(case.inputs, LENGTH)
    fed = np.concatenate([np.full((len(tokens), 1), START), tokens[:, :-1]], 1).astype("int32")
    alignment = []
    for index in range(tokens.shape[1]):
        _, state, weights = steps.step(fed[:, index], index, state, return_alignment=True)
        alignment.append(np_(weights))
    alignment = np.stack(alignment, 1)
    return np.where(ended(tokens, case.end)[..., None], 0.0, alignment)


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


# On JAX `ops.while_loop` is `lax.while_loop`: even `jit_compile=False` compiles the loop, at
# each call, so .ci/jax leaves these eager checks to TensorFlow and torch and runs the compiled
# ones below (the same loop, checked against the same reference).
@pytest.mark.jax_slow
def test_beam_search_equals_the_numpy_ranking_and_scores_the_model(case):
    """Eager; the second setting also returns the token scores: the teacher-forced ones."""
    expected = case.reference(3, 0.6)
    assert_equal_search(case.search(beam_width=3, length_penalty=0.6, jit_compile=False), expected)
    suppress_ids = (4, 7)
    expected = case.reference(4, 0.0, suppress_ids=suppress_ids)
    tokens, sequence_scores, scores = case.search(
        beam_width=4, length_penalty=0.0, suppress_ids=suppress_ids, return_scores=True,
        jit_compile=False,
    )  # fmt: skip
    assert_equal_search((tokens, sequence_scores), expected)
    assert not np.isin(tokens, suppress_ids).any()
    assert scores.dtype == np.float32 and scores.shape == tokens.shape
    np.testing.assert_allclose(scores, teacher_forced_scores(case, tokens), atol=1e-5)


@pytest.mark.jax_slow
def test_beam_search_with_repetition_controls_equals_the_numpy_reference(case):
    controls = {"repetition_penalty": 3.0, "no_repeat_ngram_size": 2}
    expected = case.reference(3, 0.6, penalty=3.0, ngram=2)
    assert_equal_search(case.search(beam_width=3, **controls, jit_compile=False), expected)
    greedy = greedy_decode(case.model, case.inputs, LENGTH, case.start, case.end, **controls)
    tokens, _ = case.search(beam_width=1, jit_compile=False, **controls)
    np.testing.assert_array_equal(tokens, np_(greedy))  # width 1: greedy, controls and all


def test_compiled_beam_search_returns_the_reference_scores_and_alignment(seq2seq):
    """One compiled loop (XLA, jax.jit; torch eager) with every option: its tokens are the
    reference's, its scores and alignment the teacher-forced ones."""
    controls = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2}
    tokens, sequence_scores, scores, alignment = seq2seq.search(
        beam_width=3, return_scores=True, return_alignment=True, **controls
    )
    expected = seq2seq.reference(3, 0.6, penalty=1.5, ngram=2)
    assert_equal_search((tokens, sequence_scores), expected)
    np.testing.assert_allclose(scores, teacher_forced_scores(seq2seq, tokens), atol=1e-5)
    assert alignment.dtype == np.float32 and alignment.shape == (*tokens.shape, SOURCE.shape[1])
    np.testing.assert_allclose(alignment, stepped_alignment(seq2seq, tokens), atol=1e-5)
    assert np.all(alignment[np.broadcast_to((SOURCE == 0)[:, None], alignment.shape)] == 0)


def test_generate_beam_is_compiled_beam_search(cases):
    case = cases("lm")
    expected = case.reference(2, 0.6)
    tokens = generate(case.model, PROMPTS, LENGTH, end_id=case.end, sampler="beam", beam_width=2)
    np.testing.assert_array_equal(tokens, expected[0])


def test_beam_search_bad_settings_and_an_empty_batch(seq2seq, cases):
    model = seq2seq.model
    for name, value in (("repetition_penalty", 0.0), ("no_repeat_ngram_size", -1)):
        with pytest.raises(ValueError, match=rf"`{name}` .*Received: {name}={value!r}"):
            beam_search(model, SOURCE, 3, START, 2, **{name: value})
    with pytest.raises(ValueError, match="Received: return_alignment=True"):
        beam_search(cases("lm").model, PROMPTS, 3, None, 2, return_alignment=True)
    empty = beam_search(model, SOURCE[:0], 3, START, 2, return_scores=True, return_alignment=True)
    assert [a.shape for a in empty] == [(0, 3), (0,), (0, 3), (0, 3, SOURCE.shape[1])]


def test_beam_search_returns_the_n_best_beams_best_first(case):
    """`num_return_sequences=n`: each example's n best final beams (the NumPy reference's),
    best first, the first today's output; their token scores the teacher-forced ones."""
    one = case.search(beam_width=3)
    tokens, sequence_scores, scores = case.search(
        beam_width=3, num_return_sequences=3, return_scores=True
    )
    assert_equal_search((tokens, sequence_scores), case.reference(3, 0.6, n=3))
    assert_equal_search((tokens[::3], sequence_scores[::3]), one)
    assert np.all(np.diff(sequence_scores.reshape(-1, 3), axis=1) <= 0)  # best first
    repeated = types.SimpleNamespace(  # each row's own example, for the recompute
        model=case.model, inputs=np.repeat(case.inputs, 3, axis=0), lm=case.lm, end=case.end
    )
    np.testing.assert_allclose(scores, teacher_forced_scores(repeated, tokens), atol=1e-5)
    if case.lm:  # `generate`'s beam: the same rows
        beams = generate(case.model, PROMPTS, LENGTH, case.end, sampler="beam", beam_width=3,
                         num_return_sequences=2)  # fmt: skip
        np.testing.assert_array_equal(beams, tokens.reshape(3, 3, -1)[:, :2].reshape(6, -1))


def test_more_sequences_than_beams_raises_naming_both(seq2seq):
    with pytest.raises(ValueError, match="num_return_sequences=5, beam_width=4"):
        seq2seq.search(beam_width=4, num_return_sequences=5)
