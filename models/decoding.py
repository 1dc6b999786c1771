"""Decoding for the zoo's autoregressive models.

**Seq2seq** (`greedy_decode`, `beam_search`, `sample_decode`, `export_seq2seq`):
a model is decoded through its *decoding steps* object (`decoding_steps(model)`,
new kinds of model with `register_decoding_steps`):
`start(encoder_inputs, max_length) -> state` encodes the source once, and
`step(tokens, index, state) -> (logits, state)` feeds one token per example.
For `transformer_seq2seq` a step runs the decoder blocks on their KV caches
(O(T) per step instead of re-running the whole decoder, O(T^2)); for
`rnn_seq2seq` it is one RNN cell step and one attention over the source.

The pointer networks' decoding (`pointer_decode`, `polygon_decode`,
`predict_batch`) lives in `keras_attn.models.pointer_decoding`, and `export_seq2seq` in
`keras_attn.models.seq2seq_export`; both are importable from here too. Decoding itself needs
no TensorFlow (only the export does).
"""

import functools
import inspect
import numbers
from collections.abc import Sequence
from typing import Any, NamedTuple

import keras
import numpy as np
from keras import ops

from keras_attn._execution import no_gradients
from keras_attn._typing import TensorLike
from keras_attn.arguments import check_positive_int, is_int
from keras_attn.models.logits_processors import (
    banned_ngram_tokens,
    check_no_repeat_ngram_size,
    check_repetition_penalty,
    penalize_repetition,
    seen_tokens,
)
from keras_attn.models.pointer_decoding import pointer_decode, polygon_decode, predict_batch  # noqa: F401
from keras_attn.models.rnn_seq2seq import RNNDecodingSteps
from keras_attn.models.sampling import check_sampling, greedy_tokens, sample_tokens
from keras_attn.models.transformer_lm import LanguageModelSteps, left_align
from keras_attn.models.transformer_seq2seq import TransformerDecodingSteps

# ---------------------------------------------------------------------------
# Seq2seq
# ---------------------------------------------------------------------------

_STEPS = [TransformerDecodingSteps, RNNDecodingSteps, LanguageModelSteps]


def register_decoding_steps(steps_class: type) -> type:
    """Teaches greedy, beam, sampled decoding and `export_seq2seq` a new kind of model.

    `decoding_steps(model)` returns `steps_class(model)` for the first
    registered class whose `matches(model)` is true; classes registered later
    are tried first (so one can take over a variant of a zoo model), and
    registering a class twice changes nothing. The class implements:

    - `matches(model) -> bool` (a static method): whether it decodes `model`;
    - `__init__(model)`: picks the layers it needs from the model;
    - `start(encoder_inputs, max_length) -> state`: encodes the int32 source
      `(B, S)` once; `state` is a nest of tensors with a leading batch axis
      (beam search reorders its rows with `keras.tree`): a dict, or a `NamedTuple`
      as the zoo's steps carry (`TransformerDecodingState`, `RNNDecodingState`,
      `LanguageModelState`); not a dataclass, which `keras.tree` takes for one leaf;
    - `step(tokens, index, state) -> (logits, state)`: feeds the `(B,)` tokens
      at position `index` and returns the next-token logits `(B, V)`;
    - optionally `start_tokens(encoder_inputs) -> (B,)`: a model that continues
      its input (a language model: `encoder_inputs` is the prompt) gives the
      tokens fed at the first step, and is decoded with `start_id=None`.

    Written with `keras.ops`, the steps also run inside `export_seq2seq`'s
    graph. For `export_seq2seq` the model takes `{"encoder_inputs",
    "decoder_inputs"}` and returns logits `(B, T, V)` (teacher forcing).

    Args:
        steps_class: the class described above.

    Returns:
        `steps_class`, so this works as a class decorator.

    Example: a hand-built model whose next token depends on the source (mean
    embedding) and on the previous token only, so a step needs no cache.

    >>> embed = keras.layers.Embedding(10, 8, name="embedding")
    >>> logits_layer = keras.layers.Dense(10, name="logits")
    >>> source = keras.Input((None,), dtype="int32", name="encoder_inputs")
    >>> previous = keras.Input((None,), dtype="int32", name="decoder_inputs")
    >>> context = keras.layers.GlobalAveragePooling1D(name="source_mean")(embed(source))
    >>> hidden = embed(previous) + keras.ops.expand_dims(context, 1)  # (B, T, 8)
    >>> model = keras.Model({"encoder_inputs": source, "decoder_inputs": previous},
    ...                     logits_layer(hidden), name="bigram")
    >>> @register_decoding_steps
    ... class BigramSteps:
    ...     @staticmethod
    ...     def matches(model):
    ...         return {"embedding", "source_mean", "logits"} <= {l.name for l in model.layers}
    ...     def __init__(self, model):
    ...         self.embed, self.logits = model.get_layer("embedding"), model.get_layer("logits")
    ...         self.mean = model.get_layer("source_mean")
    ...     def start(self, encoder_inputs, max_length):
    ...         return {"context": self.mean(self.embed(encoder_inputs))}  # (B, 8)
    ...     def step(self, tokens, index, state):
    ...         return self.logits(self.embed(tokens) + state["context"]), state
    >>> source_tokens = np.array([[3, 4, 5], [6, 7, 0]], "int32")
    >>> print(greedy_decode(model, source_tokens, max_length=4, start_id=1).shape)
    (2, 4)
    >>> tokens, _ = beam_search(model, source_tokens, 4, start_id=1, end_id=2, beam_width=3)
    >>> drawn = sample_decode(model, source_tokens, 4, start_id=1, top_p=0.9, seed=0)
    >>> print(tokens.shape, drawn.shape)
    (2, 4) (2, 4)
    """
    for method in ("matches", "start", "step"):
        if not callable(getattr(steps_class, method, None)):
            raise ValueError(
                f"`steps_class` must define `{method}` (see `register_decoding_steps`). "
                f"Received: steps_class={steps_class!r}"
            )
    if steps_class not in _STEPS:
        _STEPS.insert(0, steps_class)
    return steps_class


def decoding_steps(model: keras.Model) -> Any:
    """The decoding-steps object of a seq2seq or language model (see `register_decoding_steps`)."""
    for steps_class in _STEPS:
        if steps_class.matches(model):
            return steps_class(model)
    raise ValueError(
        f"No decoding steps for model {model.name!r}: expected a model built by "
        "keras_attn.models.transformer_seq2seq, keras_attn.models.rnn_seq2seq or "
        "keras_attn.models.transformer_lm, or one whose class was "
        "added with keras_attn.models.decoding.register_decoding_steps."
    )


def decoder_vocab_size(steps: Any, model: keras.Model) -> int | None:
    """The number of token ids a decoder emits, where known: its steps' `vocab_size`, else
    the last axis of the model's one output, the logits `(B, T, V)`; otherwise None."""
    size = getattr(steps, "vocab_size", None)
    outputs = getattr(model, "outputs", None) or []  # a functional model's
    if size is None and len(outputs) == 1 and outputs[0].shape:
        size = outputs[0].shape[-1]
    return None if size is None else int(size)


def check_lengths(
    max_length: int, start_id: int | None, end_id: int | None, vocab_size: int | None = None
) -> tuple[int, int | None, int | None]:
    """The arguments as Python ints (NumPy ones taken), or `ValueError` naming the bad one.

    `max_length` must be a positive integer, the token ids (or None) in `[1, vocab_size)`
    (0 is padding; any positive id when `vocab_size` is None).
    """
    max_length = check_positive_int("max_length", max_length)
    below = f" below vocab_size={vocab_size}" if vocab_size is not None else ""
    for name, value in (("start_id", start_id), ("end_id", end_id)):
        if value is not None and (not is_int(value) or not 0 < value < (vocab_size or np.inf)):
            raise ValueError(
                f"`{name}` must be a positive token id (0 is padding){below}. "
                f"Received: {name}={value!r}"
            )
    return max_length, *(None if v is None else int(v) for v in (start_id, end_id))


def check_suppress_ids(
    suppress_ids: Sequence[int] | np.ndarray, vocab_size: int | None = None
) -> tuple[int, ...]:
    """`suppress_ids` as a sorted tuple of Python ints (NumPy ones taken), or `ValueError`.

    A list, tuple, set or 1-D array of token ids in `[0, vocab_size)` (when `vocab_size` is
    given) that leaves a token besides padding to generate.
    """
    values = suppress_ids
    if isinstance(values, np.ndarray):
        values = values.tolist() if values.ndim == 1 else None  # NumPy ints -> Python ints
    in_range = f" in [0, vocab_size={vocab_size})" if vocab_size is not None else ""
    if not isinstance(values, list | tuple | set | frozenset | range) or not all(
        is_int(v) and 0 <= v < (vocab_size or np.inf) for v in values
    ):
        raise ValueError(
            f"`suppress_ids` must be a sequence of token ids{in_range}. "
            f"Received: suppress_ids={suppress_ids!r}"
        )
    values = tuple(sorted({int(v) for v in values}))
    if vocab_size is not None and len({0, *values}) >= vocab_size:
        raise ValueError(
            "`suppress_ids` must leave a token besides padding (0) to generate. "
            f"Received: suppress_ids={suppress_ids!r}"
        )
    return values


def first_tokens(steps: Any, encoder_inputs: TensorLike, start_id: int | None) -> TensorLike:
    """The `(B,)` int32 tokens fed at the first step: `start_id`, or a language model's prompt's.

    Raises:
        ValueError: `start_id` given for a model that continues its prompt
            (its steps have `start_tokens`), or missing for a seq2seq model.
    """
    continues = hasattr(steps, "start_tokens")
    if continues and start_id is not None:
        raise ValueError(
            "A language model continues its prompt: pass `start_id=None` (the prompt's last "
            f"token is fed first; put a start token in the prompt). Received: start_id={start_id}"
        )
    if not continues and start_id is None:
        raise ValueError(
            "`start_id` (the token fed at the first step) is required for a seq2seq model."
        )
    if continues:
        return ops.cast(steps.start_tokens(encoder_inputs), "int32")
    batch = ops.shape(ops.convert_to_tensor(encoder_inputs))[0]
    return ops.full((batch,), start_id, "int32")


def greedy_decode(
    model: keras.Model,
    encoder_inputs: TensorLike,
    max_length: int,
    start_id: int | None = None,
    end_id: int | None = None,
    steps: Any = None,
    suppress_ids: Sequence[int] | np.ndarray = (),
    repetition_penalty: float | None = None,
    no_repeat_ngram_size: int = 0,
    return_scores: bool = False,
    return_alignment: bool = False,
) -> TensorLike | tuple[TensorLike, ...]:
    """Greedy decoding: `y_t = argmax_v p(v | y_<t, x)`, one cached step per token.

    Token 0 (padding) and the `suppress_ids` are never emitted before the end. With the
    repetition controls the argmax is taken over the controlled logits: CTRL's
    `repetition_penalty` divides the positive logits and multiplies the negative ones of
    the tokens already in the row (`keras_attn.models.logits_processors`), and
    `no_repeat_ngram_size=n` rules out every token that would repeat an n-gram of the row
    (unless that rules out every token: then the n-grams are not enforced at that step).
    A row's tokens so far are a language model's prompt and outputs, or a seq2seq
    decoder's start token and outputs.

    Args:
        model: a zoo seq2seq model (`transformer_seq2seq` or `rnn_seq2seq`),
            or a language model (`transformer_lm`).
        encoder_inputs: int tokens `(B, S)`, 0 = padding: the source, or a
            language model's prompts (padded on either side; see
            `keras_attn.models.transformer_lm.LanguageModelSteps`).
        max_length: number of tokens to decode (a language model's new
            tokens, whatever the prompt's length).
        start_id: the token fed at the first step (seq2seq); `None` for a
            language model, which continues its prompt.
        end_id: when given, an example stops at its first `end_id` (kept in
            the output) and is padded with 0 after it.
        steps: a decoding-steps object; by default `decoding_steps(model)`.
        suppress_ids: token ids never emitted (an OOV token, say): their logits are
            `-inf` before the argmax (the argmax over the other tokens).
        repetition_penalty: None or 1 (off), or a positive number (above 1 discourages
            repeats).
        no_repeat_ngram_size: 0 (off) or the n-gram size `n >= 1`.
        return_scores: also return the float32 `(B, max_length)` scores: each token's
            `log p(y_t | y_<t, x)` under the model's own distribution (before the
            suppression and the repetition controls), 0.0 after a row's end.
        return_alignment: also return the float32 `(B, max_length, S)` alignment: each
            step's attention over the source (a `transformer_seq2seq`: its last decoder
            block's cross-attention, averaged over the heads; an `rnn_seq2seq`: its
            attention weights), 0 on source padding and after a row's end.

    Returns:
        int32 `(B, max_length)` tokens (a tensor; runs eagerly or inside a
        `tf.function` or `jax.jit`); with `return_scores` or `return_alignment`, a tuple
        `(tokens, scores, alignment)` of the tokens and what was asked, in that order. An
        empty batch gives empty results.

    Raises:
        ValueError: a `max_length` that is not a positive integer, a
            `start_id` or `end_id` outside `[1, vocab_size)` (where the
            decoder's vocabulary is known: see `decoder_vocab_size`), a
            `repetition_penalty` that is not a positive finite number, a negative or
            non-integer `no_repeat_ngram_size`, or `return_alignment=True` for a model
            without a source to attend to (a language model).

    Example:

    >>> from keras_attn.models import transformer_seq2seq
    >>> model = transformer_seq2seq(20, 30, num_layers=1, d_model=16, intermediate_dim=32)
    >>> source = np.ones((2, 7), "int32")
    >>> print(greedy_decode(model, source, max_length=4, start_id=1).shape)
    (2, 4)
    >>> tokens, scores, alignment = greedy_decode(
    ...     model, source, 4, start_id=1, repetition_penalty=1.2, no_repeat_ngram_size=2,
    ...     return_scores=True, return_alignment=True)
    >>> print(tokens.shape, scores.shape, alignment.shape)
    (2, 4) (2, 4) (2, 4, 7)
    """

    def choose(logits, index):
        return greedy_tokens(logits)

    return _decode_model(
        model, encoder_inputs, max_length, start_id, end_id, steps, suppress_ids,
        lambda max_length: choose, repetition_penalty=repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size, return_scores=return_scores,
        return_alignment=return_alignment,
    )  # fmt: skip


def sample_decode(
    model: keras.Model,
    encoder_inputs: TensorLike,
    max_length: int,
    start_id: int | None = None,
    end_id: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    steps: Any = None,
    suppress_ids: Sequence[int] | np.ndarray = (),
    repetition_penalty: float | None = None,
    no_repeat_ngram_size: int = 0,
    return_scores: bool = False,
    return_alignment: bool = False,
) -> TensorLike | tuple[TensorLike, ...]:
    """Sampled decoding: `y_t ~ softmax(logits_t / temperature)`, truncated to top-k / top-p.

    The same cached steps as `greedy_decode`; each step draws its token with
    `keras_attn.models.sampling.sample_tokens` (temperature, then the `top_k` most likely
    tokens, then the top-p nucleus: the smallest most-likely-first set with
    mass >= `top_p`). `top_k=1`, or a temperature going to 0, gives the greedy
    tokens; `temperature=0` is greedy decoding (`greedy_tokens`, exactly). The uniform
    draws, one per step and example, come from
    `keras.random.uniform` with `seed`: a fixed integer seed gives the same
    tokens at every call; `None` draws from Keras' global seed generator
    (`keras.utils.set_random_seed`). Token 0 (padding) and the `suppress_ids` are never
    drawn: their logits are `-inf` before the repetition controls (as in `greedy_decode`),
    the temperature, top-k and top-p.

    Args:
        model, encoder_inputs, max_length, start_id, end_id, steps, suppress_ids,
            repetition_penalty, no_repeat_ngram_size, return_scores, return_alignment:
            as in `greedy_decode` (the scores are the model's log-probabilities, before
            the temperature, top-k and top-p).
        temperature: a number >= 0 dividing the logits (1 samples the
            model's distribution; below 1 is sharper; 0 is greedy).
        top_k: None or 0 (off), or sample among the `top_k` most likely tokens.
        top_p: None, or the nucleus mass in `(0, 1]`.
        seed: None or an integer.

    Returns:
        int32 `(B, max_length)` tokens (a tensor); with `return_scores` or
        `return_alignment` a tuple, as in `greedy_decode`.

    Raises:
        ValueError: as `greedy_decode`, a negative, NaN or infinite `temperature`, a
            negative `top_k`, a `top_p` outside `(0, 1]`, or a `seed` that is not an
            integer; each names the argument.

    Example:

    >>> from keras_attn.models import transformer_seq2seq
    >>> model = transformer_seq2seq(20, 30, num_layers=1, d_model=16, intermediate_dim=32)
    >>> source = np.ones((2, 7), "int32")
    >>> a = sample_decode(model, source, 5, start_id=1, top_k=10, top_p=0.9, seed=7)
    >>> b = sample_decode(model, source, 5, start_id=1, top_k=10, top_p=0.9, seed=7)
    >>> print(a.shape, bool(np.all(np.asarray(a) == np.asarray(b))))
    (2, 5) True

    References:
        Fan et al., 2018, "Hierarchical Neural Story Generation",
        https://arxiv.org/abs/1805.04833 (top-k);
        Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration",
        https://arxiv.org/abs/1904.09751 (top-p)
    """
    temperature, top_k, top_p, seed = check_sampling(temperature, top_k, top_p, seed)

    def choice(max_length):
        if temperature == 0:  # greedy
            return lambda logits, index: greedy_tokens(logits)
        batch = ops.shape(ops.convert_to_tensor(encoder_inputs))[0]
        uniform = keras.random.uniform((max_length, batch), seed=seed)  # a draw per step, row

        def choose(logits, index):
            row = ops.take(uniform, index, axis=0)
            return sample_tokens(logits, row, temperature, top_k, top_p)

        return choose

    return _decode_model(
        model, encoder_inputs, max_length, start_id, end_id, steps, suppress_ids, choice,
        repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
        return_scores=return_scores, return_alignment=return_alignment,
    )  # fmt: skip


def _decode_model(
    model, encoder_inputs, max_length, start_id, end_id, steps, suppress_ids, choice, **options
):
    """`greedy_decode` / `sample_decode`: the checks, then `_decode` with the token choice
    `choice(max_length)`; their return value (`_returned`)."""
    steps = steps or decoding_steps(model)
    vocab_size = decoder_vocab_size(steps, model)
    max_length, start_id, end_id = check_lengths(max_length, start_id, end_id, vocab_size)
    suppress_ids = check_suppress_ids(suppress_ids, vocab_size)
    options["repetition_penalty"] = check_repetition_penalty(options["repetition_penalty"])
    options["no_repeat_ngram_size"] = check_no_repeat_ngram_size(options["no_repeat_ngram_size"])
    if options["return_alignment"]:
        _alignment_step(steps)  # raises for steps without an alignment
    encoder_inputs = ops.convert_to_tensor(encoder_inputs, "int32")
    if encoder_inputs.shape[0] == 0:  # no examples: nothing to decode
        decoded = _empty(encoder_inputs, max_length)
    else:
        with no_gradients():  # torch: nothing to record for a backward pass
            decoded = _decode(
                steps, encoder_inputs, max_length, start_id, end_id, choice(max_length),
                suppress_ids, **options,
            )  # fmt: skip
    return _returned(decoded, options["return_scores"], options["return_alignment"])


def _returned(decoded, return_scores: bool, return_alignment: bool):
    """The decoders' return value: the tokens alone, or a tuple `(tokens, scores, alignment)`
    of the tokens and what was asked, in that order."""
    if not (return_scores or return_alignment):
        return decoded.tokens
    asked = ((True, decoded.tokens), (return_scores, decoded.scores))
    return tuple(v for wanted, v in asked + ((return_alignment, decoded.alignment),) if wanted)


def _empty(encoder_inputs, max_length):
    """The `Decoded` of an empty batch: tokens, scores and alignment with 0 rows."""
    source = ops.shape(encoder_inputs)[1]
    return Decoded(
        ops.zeros((0, max_length), "int32"),
        ops.zeros((0, max_length), "float32"),
        ops.zeros((0, max_length, source), "float32"),
    )


class Decoded(NamedTuple):
    """What the cached loop (`_decode`) returns; a field not asked for is None.

    Args:
        tokens: int32 `(B, max_length)`, 0 after a row's end token.
        scores: float32 `(B, max_length)`: `log_softmax(logits)[token]` of each chosen token
            under the model's own distribution (its raw logits, in float32: before ruling
            out, penalties, temperature, top-k and top-p); 0.0 after a row's end token.
        alignment: float32 `(B, max_length, S)`: each step's alignment over the source
            (`steps.step(..., return_alignment=True)`'s); 0 after a row's end token.
    """

    tokens: Any
    scores: Any = None
    alignment: Any = None


class DecodingLoop:
    """One cached decoding loop: `start` (the first carry), `step` (one token per row),
    `result` (the `Decoded` of a carry); `_decode` runs it in one `ops.fori_loop`, and
    `generate(..., stream=True)` step by step.

    A step: the raw logits -> their score (`return_scores`) -> padding and `suppress_ids`
    ruled out (`_ruled_out`) -> CTRL's `repetition_penalty` on the tokens seen -> the tokens
    that would repeat an n-gram of `no_repeat_ngram_size` banned (`-inf`) -> `choose(logits
    (B, V), index) -> (B,)`. A row whose every token the n-grams would ban (a tiny
    vocabulary) chooses among its unbanned logits. "Seen" and the n-grams' history are the
    row's tokens so far: a language model's prompt (`steps.start_tokens` marks one) then its
    outputs; a seq2seq decoder's start token then its outputs (as Hugging Face's
    `input_ids`). They are read from the outputs the loop carries anyway: the carry holds a
    score or alignment buffer only when asked, and nothing for the repetition controls.
    `max_length` may be a scalar int tensor and `repetition_penalty` a scalar float tensor
    (an exported model's per-request settings); the other options are constants of the
    trace (one compiled loop per setting).

    Args:
        steps: a decoding-steps object (`decoding_steps(model)`).
        start_id, end_id: as in `greedy_decode` (checked).
        choose: `choose(logits (B, V), index) -> (B,)` int32, the token of each row.
        suppress_ids: checked token ids never chosen (`check_suppress_ids`).
        repetition_penalty: None, a positive number (checked; 1: off) or a float tensor.
        no_repeat_ngram_size: 0 (off) or `n >= 1`.
        return_scores, return_alignment: what the carry collects besides the tokens.

    Raises:
        ValueError: a bad `no_repeat_ngram_size`, or `return_alignment` for steps without an
            alignment.
    """

    def __init__(
        self,
        steps,
        start_id,
        end_id,
        choose,
        suppress_ids=(),
        *,
        repetition_penalty=None,
        no_repeat_ngram_size=0,
        return_scores=False,
        return_alignment=False,
    ):
        self.steps, self.start_id, self.end_id = steps, start_id, end_id
        self.choose, self.suppress_ids = choose, suppress_ids
        self.padding_id = getattr(steps, "padding_id", 0)  # -1: every id is a token
        self.repetition_penalty = None if _is_off(repetition_penalty, 1.0) else repetition_penalty
        self.no_repeat_ngram_size = check_no_repeat_ngram_size(no_repeat_ngram_size)
        self.return_scores, self.return_alignment = return_scores, return_alignment
        self._step = _alignment_step(steps) if return_alignment else steps.step

    def start(self, encoder_inputs, max_length) -> dict:
        """The carry before the first step: the `(B,)` tokens fed first, the `(B, max_length)`
        outputs, which rows have `finished`, the steps' `state`, and what the options need."""
        encoder_inputs = ops.convert_to_tensor(encoder_inputs, "int32")
        batch = ops.shape(encoder_inputs)[0]
        tokens = first_tokens(self.steps, encoder_inputs, self.start_id)
        carry = {
            "tokens": tokens,
            "outputs": ops.zeros((batch, max_length), "int32"),
            "finished": ops.zeros((batch,), "bool"),
            "state": self.steps.start(encoder_inputs, max_length),
        }
        if self.repetition_penalty is not None or self.no_repeat_ngram_size:
            # what the row holds before its outputs, (B, K): the prompt or the start token
            continues = hasattr(self.steps, "start_tokens")
            before = left_align(encoder_inputs, self.padding_id) if continues else tokens[:, None]
            carry["before"] = ops.where(ops.equal(before, self.padding_id), 0, before)
        if self.return_scores:
            carry["scores"] = ops.zeros((batch, max_length), "float32")
        if self.return_alignment:
            source = ops.shape(encoder_inputs)[1]
            carry["alignment"] = ops.zeros((batch, max_length, source), "float32")
        return carry

    def step(self, index, carry) -> dict:
        """The carry after the `index`-th token of every row (0 for a finished row)."""
        carry = dict(carry)
        logits, carry["state"], *alignment = self._step(carry["tokens"], index, carry["state"])
        raw = logits
        logits = _ruled_out(logits, self.suppress_ids, self.padding_id)
        logits = self._controlled(logits, index, carry)
        finished = carry["finished"]
        tokens = ops.where(finished, 0, self.choose(logits, index))
        carry["tokens"] = tokens
        carry["outputs"] = _write(carry["outputs"], index, tokens)
        if self.return_scores:
            log_probs = ops.log_softmax(ops.cast(raw, "float32"), axis=-1)  # (B, V)
            score = ops.take_along_axis(log_probs, ops.expand_dims(tokens, -1), axis=-1)[:, 0]
            carry["scores"] = _write(carry["scores"], index, ops.where(finished, 0.0, score))
        if self.return_alignment:
            (alignment,) = alignment  # (B, S)
            alignment = ops.where(ops.expand_dims(finished, -1), 0.0, alignment)
            carry["alignment"] = _write(carry["alignment"], index, alignment)
        if self.end_id is not None:
            carry["finished"] = ops.logical_or(finished, ops.equal(tokens, self.end_id))
        return carry

    def _controlled(self, logits, index, carry):
        """`logits` `(B, V)` after the repetition penalty and the banned n-grams."""
        if "before" not in carry:
            return logits
        history = ops.concatenate([carry["before"], carry["outputs"]], axis=1)  # (B, K + T)
        vocab = ops.shape(logits)[-1]
        if self.repetition_penalty is not None:  # outputs not written yet are 0: not seen
            seen = seen_tokens(history, vocab)
            logits = penalize_repetition(logits, seen, self.repetition_penalty)
        if self.no_repeat_ngram_size:
            length = ops.shape(carry["before"])[1] + index
            banned = banned_ngram_tokens(history, length, self.no_repeat_ngram_size, vocab)
            logits = _ban(logits, banned)
        return logits

    @staticmethod
    def result(carry) -> Decoded:
        return Decoded(carry["outputs"], carry.get("scores"), carry.get("alignment"))


def _decode(
    steps,
    encoder_inputs,
    max_length,
    start_id,
    end_id,
    choose,
    suppress_ids=(),
    *,
    repetition_penalty=None,
    no_repeat_ngram_size=0,
    return_scores=False,
    return_alignment=False,
):
    """The cached decoding loop (`DecodingLoop`, in one `ops.fori_loop`) -> `Decoded`."""
    loop = DecodingLoop(
        steps, start_id, end_id, choose, suppress_ids, repetition_penalty=repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size, return_scores=return_scores,
        return_alignment=return_alignment,
    )  # fmt: skip
    carry = ops.fori_loop(0, max_length, loop.step, loop.start(encoder_inputs, max_length))
    return loop.result(carry)


def _write(buffer, index, values):
    """`buffer[:, index] = values` for `(B, T, ...)` and `(B, ...)` tensors."""
    start = (0, index) + (0,) * (len(buffer.shape) - 2)
    return ops.slice_update(buffer, start, ops.expand_dims(ops.cast(values, buffer.dtype), 1))


def _is_off(value, off):
    """Whether a setting is off: None, or a Python (NumPy) number equal to `off` (a tensor
    never is: an exported model's per-request setting)."""
    return value is None or (isinstance(value, numbers.Real) and value == off)


def _ban(logits, banned):
    """Logits `(B, V)` with the `banned` tokens `-inf`; a row whose every token would then be
    `-inf` keeps its logits (the n-grams cannot all be avoided: a tiny vocabulary)."""
    allowed = ops.where(banned, ops.cast(float("-inf"), logits.dtype), logits)
    left = ops.any(allowed > float("-inf"), axis=-1, keepdims=True)  # (B, 1)
    return ops.where(left, allowed, logits)


def _alignment_step(steps):
    """`steps.step` returning `(logits, state, alignment)`, or `ValueError` for steps that have
    no alignment (a language model's; a registered class without the keyword)."""
    parameters = inspect.signature(steps.step).parameters.values()
    if not any(p.name == "return_alignment" or p.kind is p.VAR_KEYWORD for p in parameters):
        raise ValueError(
            f"`return_alignment=True` needs decoding steps that attend to a source; "
            f"{type(steps).__name__}.step has no `return_alignment`. "
            "Received: return_alignment=True"
        )
    return functools.partial(steps.step, return_alignment=True)


def _ruled_out(logits, suppress_ids=(), padding_id=0):
    """Logits `(B, V)` with token 0 (padding, never a real output token; unless the
    model's `padding_id` is negative: then 0 is a token) and the `suppress_ids` (checked
    Python ints) ruled out: `-inf`.

    The ids are a constant of the trace: one compiled loop per setting.
    """
    padding = (0,) if padding_id == 0 else ()
    # (K,); -1 matches no id and keeps K >= 1
    ids = ops.convert_to_tensor(np.array((*padding, *suppress_ids, -1), "int32"))
    vocabulary = ops.arange(ops.shape(logits)[-1], dtype="int32")  # (V,)
    ruled_out = ops.any(ops.equal(ops.expand_dims(vocabulary, -1), ids), axis=-1)  # (V,)
    return ops.where(ruled_out, ops.cast(float("-inf"), logits.dtype), logits)


# Beam search lives in `keras_attn.models.beam_decoding` (which imports this module when it
# runs); its name stays importable from here.
from keras_attn.models.beam_decoding import beam_search, beam_search_loop  # noqa: E402, F401


def __getattr__(name):
    # `export_seq2seq` lives in `keras_attn.models.seq2seq_export` (which imports this
    # module, and TensorFlow when it runs); importable from here too.
    if name == "export_seq2seq":
        from keras_attn.models.seq2seq_export import export_seq2seq

        return export_seq2seq
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
