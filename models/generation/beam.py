"""Beam search over a model's cached decoding steps: one loop of `keras.ops`, compiled.

Two entries, both importable from `keras_attn.models.generation`:

- `beam_search(model, encoder_inputs, max_length, start_id, end_id, beam_width=4,
  length_penalty=0.6, suppress_ids=(), *, config=None, return_scores=False,
  return_alignment=False, repetition_penalty=None, no_repeat_ngram_size=0, jit_compile=True)`:
  NumPy in, NumPy out, compiled (`tf.function(jit_compile=True)` on TensorFlow, `jax.jit` on
  JAX, the model's variables passed as arguments; eager on torch).
- `beam_search_loop(model, encoder_inputs, max_length, config, steps=None, tensors=None) ->
  Beams`: the loop itself, tensors in and tensors out, for a caller's own graph (a
  SavedModel's `tf.function`).

The search runs the decoding loop's public parts (`DecodingLoop.model_step`, `process`,
`record`) on the `B * K` hypotheses; its carry is `Hypotheses`: the loop's `Carry` and each
hypothesis' log-probability and length.
"""

import weakref
from typing import Any, NamedTuple

import keras
import numpy as np
from keras import ops

from keras_attn._execution import no_gradients
from keras_attn._typing import TensorLike

from .compiled import compiled_loop
from .config import GenerationConfig, check_setting, config_from
from .loop import Carry, DecodingLoop
from .samplers import top_k_lowest_first
from .steps import alignment_step, decoder_vocab_size, decoding_steps

_POSITIONAL = ("start_id", "end_id", "beam_width", "length_penalty", "suppress_ids")


class Beams(NamedTuple):
    """`beam_search_loop`'s result: each example's best hypothesis (its `n =
    num_return_sequences` best, best first: `B * n` rows, grouped by example).

    tokens: int32 `(B * n, T)`, 0 after the end token.
    sequence_scores: float32 `(B * n,)`, its `log p(Y | x) / lp(|Y|)`.
    token_scores: float32 `(B * n, T)`, the model's log-probability of each token (0.0 after
        the end), or None.
    alignment: float32 `(B * n, T, S)`, the steps' alignment at each token (0 after the end),
        or None.
    """

    tokens: TensorLike
    sequence_scores: TensorLike
    token_scores: TensorLike | None = None
    alignment: TensorLike | None = None


class Hypotheses(NamedTuple):
    """Beam search's carry: the decoding loop's `Carry` of the `B * K` hypotheses, each one's
    `log_probs` float32 `(B*K,)` (its log-probability under the processed distribution) and
    `lengths` float32 `(B*K,)` (its tokens before the end)."""

    carry: Carry
    log_probs: Any
    lengths: Any


def length_penalty_factor(length: TensorLike, alpha: float) -> TensorLike:
    """GNMT's `lp(|Y|) = ((5 + |Y|) / 6) ** alpha` (Wu et al. 2016), float32."""
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def beam_search(
    model: keras.Model,
    encoder_inputs: TensorLike,
    max_length: int,
    *args,
    config: GenerationConfig | None = None,
    jit_compile: bool = True,
    **settings,
) -> tuple[np.ndarray, ...]:
    """Beam search over cached decoding steps, ranking `log p(Y | x) / lp(|Y|)`.

    Keeps the `beam_width` best prefixes of every example; a prefix that
    emitted `end_id` is finished and only extends with padding at no cost
    (padding is never emitted otherwise, nor are the `suppress_ids`).
    Hypotheses are ranked by their log-probability divided by GNMT's length
    penalty `lp(|Y|) = ((5 + |Y|) / 6) ** length_penalty` (0 ranks by
    log-probability alone); of equal candidates the one of the lower beam, then
    the lower token id, ranks first. With `beam_width=1` this is greedy decoding.
    The search stops when every hypothesis has finished, or after `max_length` tokens.

    The ranking runs in float32 inside one loop of `keras.ops` (`beam_search_loop`),
    compiled with `jit_compile` on TensorFlow (XLA) and JAX (`jax.jit`), traced once per
    model, config (its `compile_key`) and input shape (and again after a change of the
    model's variables, as `keras_attn.models.generate`); torch runs it eagerly. (On JAX
    `ops.while_loop` is
    `lax.while_loop`: `jit_compile=False` compiles the loop too, at every call.) Sums and
    normalized scores are float32: two candidates within float32 rounding of each other
    (about 1e-7 relative) may rank in the other order than in exact arithmetic.

    With `repetition_penalty` or `no_repeat_ngram_size`, each hypothesis' logits pass
    through the config's logits processors (`keras_attn.models.generation.processors`:
    CTRL's penalty on the tokens already in the hypothesis, a language model's prompt
    included; then the tokens that would repeat an n-gram of the hypothesis ruled out)
    before the log-softmax that ranks them, so the sequence score is under that processed
    distribution; `return_scores`' token scores
    stay the model's own.

    The settings are today's keywords (positional order `start_id`, `end_id`, `beam_width`,
    `length_penalty`, `suppress_ids`), or a `GenerationConfig` as `config=` (keywords given
    too replace its fields; the sampler is `"beam"`).

    Args:
        model: a zoo seq2seq model, or a language model (`transformer_lm`).
        encoder_inputs: int tokens `(B, S)`, 0 = padding (a language model's
            prompts).
        max_length: longest output.
        start_id: the token fed at the first step; `None` for a language
            model (it continues its prompt).
        end_id: the end-of-sequence token (required).
        beam_width: hypotheses kept per example.
        length_penalty: the exponent `alpha`, a finite number.
        suppress_ids: token ids never emitted (as in `greedy_decode`).
        return_scores: also return the best hypothesis' per-token log-probabilities under
            the model: `log_softmax(raw logits)` at each chosen token (before padding and
            `suppress_ids` are ruled out and before the penalties), 0.0 after the end.
        return_alignment: also return its alignment at each token (a seq2seq model whose
            steps give one: the last decoder block's cross-attention averaged over heads,
            the RNN's attention weights), 0 after the end.
        repetition_penalty: None or 1 (off), or CTRL's penalty `> 0`.
        no_repeat_ngram_size: 0 (off), or `n`: no n-gram occurs twice in a hypothesis
            (a language model's prompt included).
        jit_compile: compile the loop (TensorFlow, JAX).
        config: a `GenerationConfig` holding the settings (None: from the keywords).
        num_return_sequences: `n <= beam_width`: each example's `n` best hypotheses of the
            final beams, best first (the first is the one `n = 1` returns).

    Returns:
        `(tokens, sequence_scores)`: int32 NumPy `(B, max_length)` (0 after `end_id`) and
        the best hypothesis' normalized score, float32 `(B,)`; then float32 `token_scores`
        `(B, max_length)` if `return_scores`, then float32 `alignment`
        `(B, max_length, S)` if `return_alignment`. With `num_return_sequences=n`, `B * n`
        rows in each: example `i`'s `n` best are rows `i * n` to `i * n + n - 1`.

    Raises:
        ValueError: as `greedy_decode`, a missing `end_id`, a `beam_width`
            that is not a positive integer, a `length_penalty` that is
            not a finite number (NaN would rank every hypothesis alike), a bad
            `repetition_penalty` or `no_repeat_ngram_size`, or `return_alignment` for a
            model whose steps give no alignment.

    Example:

    >>> from keras_attn.models import transformer_seq2seq
    >>> model = transformer_seq2seq(20, 30, num_layers=1, d_model=16, intermediate_dim=32)
    >>> tokens, scores = beam_search(model, np.ones((2, 7), "int32"), 4, start_id=1, end_id=2)
    >>> print(tokens.shape, scores.shape)
    (2, 4) (2,)
    >>> _, _, token_scores, alignment = beam_search(
    ...     model, np.ones((2, 7), "int32"), 4, 1, 2, return_scores=True, return_alignment=True)
    >>> print(token_scores.shape, alignment.shape)
    (2, 4) (2, 4, 7)

    Reference:
        Wu et al., 2016, "Google's Neural Machine Translation System",
        https://arxiv.org/abs/1609.08144 (length penalty)
    """
    config, _ = config_from(config, _POSITIONAL, args, settings, "beam_search", sampler="beam")
    steps = decoding_steps(model, config.kv_cache_dtype)
    max_length = check_setting("max_length", max_length)
    config.check_vocabulary(decoder_vocab_size(steps, model))
    if config.end_id is None:
        raise ValueError("`end_id` (the end-of-sequence token) is required by beam search.")
    if config.return_alignment:
        alignment_step(steps)  # raises for steps without an alignment
    source = np.asarray(ops.convert_to_numpy(encoder_inputs)).astype("int32")
    if source.shape[0] == 0:  # no examples: no hypotheses to rank
        empty = Beams(
            np.zeros((0, max_length), "int32"),
            np.zeros((0,), "float32"),
            np.zeros((0, max_length), "float32") if config.return_scores else None,
            np.zeros((0, max_length, source.shape[1]), "float32") if config.return_alignment
            else None,
        )  # fmt: skip
        return _outputs(empty)
    if not jit_compile or keras.backend.backend() == "torch":
        with no_gradients(model):  # torch: nothing recorded; the model's layers call plainly
            return _outputs(beam_search_loop(model, source, max_length, config=config))
    # The compiled loop lives as long as the model (a weak key): it must not hold it.
    model_ref = weakref.ref(model)
    penalized = config.repetition_penalty != 1.0

    def loop(source, penalty):  # the penalty a tensor: one trace serves every value
        tensors = {"repetition_penalty": penalty} if penalized else None
        return beam_search_loop(model_ref(), source, max_length, config=config, tensors=tensors)

    key = ("beam_search", config.replace(repetition_penalty=1.0).compile_key, max_length, penalized)
    function = compiled_loop(model, key, loop)
    return _outputs(function(source, np.float32(config.repetition_penalty)))


def _outputs(beams):
    """The public return value: NumPy `(tokens, sequence_scores[, token_scores][, alignment])`."""
    return tuple(np.asarray(ops.convert_to_numpy(value)) for value in beams if value is not None)


def beam_search_loop(
    model: keras.Model,
    encoder_inputs: TensorLike,
    max_length,
    *args,
    config: GenerationConfig | None = None,
    steps: Any = None,
    tensors: dict | None = None,
    **settings,
) -> Beams:
    """`beam_search` as tensors: one `ops.while_loop` over the `B * K` hypotheses.

    Every step feeds each hypothesis' last token, takes `log_softmax` of its processed
    logits (padding and `suppress_ids` ruled out, then the repetition controls), extends
    each of the `K` hypotheses of an example with each token (a finished one with padding
    only, at no cost), and keeps the `K` best of the `K * V` candidates by
    `log p / lp(|Y|)` (the lowest flat index `beam * V + token` first among equals:
    `ops.top_k`, a stable sort on torch); the decoding state and the hypotheses' buffers
    follow their parents (`ops.take` along the batch axis). It stops when every hypothesis
    has finished or after `max_length` steps, and returns each example's best by
    `log p / lp(max(|Y|, 1))`.

    Runs eagerly, inside a `tf.function` (XLA too) or `jax.jit`.

    Args:
        model: a zoo seq2seq or language model, as `beam_search`.
        encoder_inputs: int `(B, S)` tokens (a tensor or an array).
        max_length: a Python int (or a scalar int tensor).
        *args, **settings: as `beam_search`'s (checked there; here as given).
        config: a `GenerationConfig` (`end_id`, `beam_width`, `length_penalty`, the logits
            processors, `return_scores`, `return_alignment`; its `end_id` required).
        steps: the decoding-steps object; by default `decoding_steps(model)`.
        tensors: per-request settings as scalar tensors (a float `repetition_penalty`: one
            trace serves every value).

    Returns:
        `Beams(tokens, sequence_scores, token_scores, alignment)`: tensors, the last two
        None unless asked.

    Example:

    >>> from keras_attn.models import GenerationConfig, transformer_seq2seq
    >>> model = transformer_seq2seq(20, 30, num_layers=1, d_model=16, intermediate_dim=32)
    >>> config = GenerationConfig(sampler="beam", start_id=1, end_id=2, beam_width=3)
    >>> beams = beam_search_loop(model, np.ones((2, 7), "int32"), 4, config=config)
    >>> print(beams.tokens.shape, beams.sequence_scores.shape, beams.token_scores)
    (2, 4) (2,) None
    """
    config, _ = config_from(config, _POSITIONAL, args, settings, "beam_search_loop", sampler="beam")
    decode = DecodingLoop(
        steps or decoding_steps(model, config.kv_cache_dtype), config, tensors=tensors
    )
    width, alpha = config.beam_width, config.length_penalty
    source = ops.convert_to_tensor(encoder_inputs, "int32")
    batch = ops.shape(source)[0]
    source = ops.repeat(source, width, axis=0)  # (B*K, S): each example's K hypotheses
    rows = batch * width
    first = ops.arange(rows, dtype="int32") % width == 0  # (B*K,): each example's first
    hypotheses = Hypotheses(
        carry=decode.start(source, max_length),
        log_probs=ops.where(first, 0.0, float("-inf")),  # one live to start from
        lengths=ops.zeros((rows,), "float32"),
    )

    def step(index, hypotheses):
        carry = hypotheses.carry
        logits, state, alignment = decode.model_step(carry, index)
        logits = ops.cast(logits, "float32")  # (B*K, V)
        vocab = ops.shape(logits)[-1]
        processed = decode.process(logits, carry, index)
        finished = carry.finished
        pad_only = ops.where(ops.arange(vocab) == 0, 0.0, float("-inf"))  # (V,)
        step_log_probs = ops.where(
            ops.expand_dims(finished, 1), pad_only, ops.log_softmax(processed, axis=-1)
        )  # a finished hypothesis extends with padding, at no cost
        candidates = ops.expand_dims(hypotheses.log_probs, 1) + step_log_probs  # (B*K, V)
        new_lengths = hypotheses.lengths + ops.cast(ops.logical_not(finished), "float32")
        ranked = candidates / ops.expand_dims(length_penalty_factor(new_lengths, alpha), 1)
        best = _best(ops.reshape(ranked, (batch, -1)), width)  # (B, K): beam * V + token
        token = ops.reshape(best % vocab, (-1,))  # (B*K,)
        parents = ops.reshape(
            best // vocab + ops.expand_dims(ops.arange(batch, dtype="int32") * width, 1), (-1,)
        )  # (B*K,): each new hypothesis' parent row
        chosen = parents * vocab + token  # in the flattened (B*K*V,) candidates
        kept = keras.tree.map_structure(
            lambda s: ops.take(s, parents, axis=0), carry._replace(state=state)
        )  # the parents' rows, their `finished` included
        scores = None
        if config.return_scores:  # the model's own log-probability of the token
            scores = ops.take(ops.reshape(ops.log_softmax(logits, axis=-1), (-1,)), chosen)
        if config.return_alignment:
            alignment = ops.take(ops.cast(alignment, "float32"), parents, axis=0)  # (B*K, S)
        return index + 1, Hypotheses(
            carry=decode.record(kept, index, token, kept.state, scores, alignment),
            log_probs=ops.take(ops.reshape(candidates, (-1,)), chosen),
            lengths=ops.take(new_lengths, parents),
        )

    def searching(index, hypotheses):
        return ops.logical_and(
            index < max_length, ops.logical_not(ops.all(hypotheses.carry.finished))
        )

    index = ops.convert_to_tensor(0, "int32")
    _, hypotheses = ops.while_loop(searching, step, (index, hypotheses))
    final = hypotheses.log_probs / length_penalty_factor(
        ops.maximum(hypotheses.lengths, 1.0), alpha
    )  # (B*K,)
    n = config.num_return_sequences
    if n == 1:
        choice = ops.argmax(ops.reshape(final, (batch, width)), axis=-1)  # the first best
        best = ops.cast(choice, "int32") + ops.arange(batch, dtype="int32") * width  # (B,)
    else:  # each example's n best, best first (of equals, the lower beam first)
        choice = top_k_lowest_first(ops.reshape(final, (batch, width)), n)[1]  # (B, n)
        best = ops.reshape(choice + ops.arange(batch, dtype="int32")[:, None] * width, (-1,))
    tokens, scores, alignment = (
        None if value is None else ops.take(value, best, axis=0)
        for value in decode.result(hypotheses.carry)
    )  # fmt: skip
    return Beams(tokens, ops.take(final, best), scores, alignment)


def _best(ranked, k):
    """int32 `(B, k)`: the indices of each row's `k` largest values, the lowest index first
    among equals."""
    return top_k_lowest_first(ranked, k)[1]
