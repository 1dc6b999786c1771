"""The cached decoding loop: a carry of tensors, one step per token, for any decoding steps.

`DecodingLoop(steps, config, choose)` drives a model's decoding steps (`steps.py`): `start`
gives the first `Carry`, `step` the carry after one more token of every row, `result` the
`Decoded` tokens (and scores, alignment). A step is the public parts in order:
`model_step` (the steps' logits, new state and alignment) -> `process` (the config's logits
processors) -> `choose` (the config's sampler) -> `record` (the token, its score and
alignment written, `finished` updated). Beam search runs the same parts on its `B * K`
hypotheses (`beam.py`), with its own choice between `process` and `record`.
"""

from typing import Any, NamedTuple

from keras import ops

from keras_attn._typing import TensorLike

from ..transformer_lm import left_align
from .config import GenerationConfig
from .processors import StopSequences, logits_processors
from .samplers import token_chooser
from .steps import alignment_step, first_tokens


class Carry(NamedTuple):
    """What the decoding loop carries from step to step: a nest of tensors with a leading
    batch axis (beam search reorders its rows with `keras.tree`). A buffer not asked for is
    `()` (an empty nest: nothing carried).

    Args:
        tokens: int32 `(B,)`, the tokens fed at the next step.
        outputs: int32 `(B, max_length)`, the tokens chosen so far (0 after a row's end and
            where not written yet).
        finished: bool `(B,)`, the rows that emitted `end_id` or completed a stop sequence.
        state: the decoding steps' state.
        before: int32 `(B, K)`, what a row holds before its outputs (a language model's
            prompt, a seq2seq decoder's start token; -1 where its padding was), where a
            logits processor reads the row's history; else `()`.
        scores: float32 `(B, max_length)` (`return_scores`), else `()`.
        alignment: float32 `(B, max_length, S)` (`return_alignment`), else `()`.
    """

    tokens: Any
    outputs: Any
    finished: Any
    state: Any
    before: Any = ()
    scores: Any = ()
    alignment: Any = ()


class Decoded(NamedTuple):
    """What the loop returns; a field not asked for is None.

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
    """One cached decoding loop: `start` (the first `Carry`), `step` (one token per row),
    `result` (the `Decoded` of a carry); `decode` runs it in one `ops.fori_loop`, and
    `generate(..., stream=True)` step by step.

    A step: the raw logits -> their score (`return_scores`) -> the logits processors
    (padding and `suppress_ids` ruled out, CTRL's `repetition_penalty` on the tokens seen,
    the tokens that would repeat an n-gram of `no_repeat_ngram_size` banned) -> `choose(logits
    (B, V), index) -> (B,)`. "Seen" and the n-grams' history are the row's tokens so far: a
    language model's prompt (`steps.start_tokens` marks one) then its outputs; a seq2seq
    decoder's start token then its outputs (as Hugging Face's `input_ids`). They are read
    from the outputs the loop carries anyway. `max_length` may be a scalar int tensor, and
    `tensors` may hold scalar tensors for the settings an exported model takes per request
    (`GenerationConfig.exported`); the config's settings are constants of the trace (one
    compiled loop per config: `GenerationConfig.compile_key`).

    Args:
        steps: a decoding-steps object (`decoding_steps(model)`).
        config: the `GenerationConfig` (checked).
        choose: `choose(logits (B, V), index) -> (B,)` int32; by default the config's greedy
            choice (`token_chooser`).
        tensors: per-request settings as scalar tensors (`repetition_penalty`, ...).

    Raises:
        ValueError: `return_alignment` for steps without an alignment.
    """

    def __init__(self, steps, config: GenerationConfig, choose=None, tensors=None):
        self.steps, self.config = steps, config
        self.choose = choose or token_chooser(config)
        self.padding_id = getattr(steps, "padding_id", 0)  # -1: every id is a token
        self.processors = logits_processors(config, tensors, self.padding_id)
        self.needs_history = any(p.needs_history for p in self.processors)
        self._steps_step = alignment_step(steps) if config.return_alignment else steps.step
        self.stops = StopSequences.of(config, tensors)  # None: no stop sequences

    def start(self, encoder_inputs: TensorLike, max_length) -> Carry:
        """The carry before the first step: the `(B,)` tokens fed first, the `(B, max_length)`
        outputs, which rows have `finished`, the steps' `state`, and what the config needs."""
        encoder_inputs = ops.convert_to_tensor(encoder_inputs, "int32")
        batch = ops.shape(encoder_inputs)[0]
        tokens = first_tokens(self.steps, encoder_inputs, self.config.start_id)
        before = scores = alignment = ()
        if self.needs_history:  # what the row holds before its outputs, (B, K), -1 = none
            continues = hasattr(self.steps, "start_tokens")
            before = left_align(encoder_inputs, self.padding_id) if continues else tokens[:, None]
            # -1, not 0: token 0 is a real token of a `padding_id=-1` model
            before = ops.where(ops.equal(before, self.padding_id), -1, before)
        if self.config.return_scores:
            scores = ops.zeros((batch, max_length), "float32")
        if self.config.return_alignment:
            source = ops.shape(encoder_inputs)[1]
            alignment = ops.zeros((batch, max_length, source), "float32")
        return Carry(
            tokens=tokens,
            outputs=ops.zeros((batch, max_length), "int32"),
            finished=ops.zeros((batch,), "bool"),
            state=self.start_state(encoder_inputs, max_length),
            before=before,
            scores=scores,
            alignment=alignment,
        )

    def start_state(self, encoder_inputs: TensorLike, max_length) -> Any:
        """The carry's first `state`: the steps started (`steps.start`)."""
        return self.steps.start(encoder_inputs, max_length)

    def model_step(self, carry: Carry, index) -> tuple:
        """The steps fed `carry.tokens`: `(logits (B, V), new state, alignment (B, S) or None)`."""
        logits, state, *alignment = self._steps_step(carry.tokens, index, carry.state)
        return logits, state, (alignment[0] if alignment else None)

    def process(self, logits: TensorLike, carry: Carry, index) -> TensorLike:
        """`logits` `(B, V)` after the config's logits processors."""
        history = length = None
        if self.needs_history:
            written = ops.arange(ops.shape(carry.outputs)[1], dtype="int32") < index  # (T,)
            outputs = ops.where(written, carry.outputs, -1)  # not written yet: none
            history = ops.concatenate([carry.before, outputs], axis=1)  # (B, K + T), -1 = none
            length = ops.shape(carry.before)[1] + index
        for processor in self.processors:
            logits = processor.apply(logits, index, history, length)
        return logits

    def record(self, carry: Carry, index, tokens, state, scores=None, alignment=None) -> Carry:
        """The carry after the `index`-th tokens `(B,)`: written to the outputs, with their
        `scores` `(B,)` and `alignment` `(B, S)` where asked (0 for a row finished before),
        the new `state`, and the rows that emitted `end_id` or whose new tokens now end with
        a stop sequence (`config.stop_sequences`) finished."""
        finished = carry.finished
        new = {"tokens": tokens, "outputs": write(carry.outputs, index, tokens), "state": state}
        if self.config.return_scores:
            new["scores"] = write(carry.scores, index, ops.where(finished, 0.0, scores))
        if self.config.return_alignment:
            alignment = ops.where(ops.expand_dims(finished, -1), 0.0, alignment)
            new["alignment"] = write(carry.alignment, index, alignment)
        if self.config.end_id is not None:
            new["finished"] = ops.logical_or(finished, ops.equal(tokens, self.config.end_id))
        if self.stops is not None:
            ended = self.stops.ended(new["outputs"], index)
            new["finished"] = ops.logical_or(new.get("finished", finished), ended)
        return carry._replace(**new)

    def step(self, index, carry: Carry) -> Carry:
        """The carry after the `index`-th token of every row (0 for a finished row)."""
        logits, state, alignment = self.model_step(carry, index)
        chosen = self.choose(self.process(logits, carry, index), index)
        tokens = ops.where(carry.finished, 0, chosen)
        scores = token_scores(logits, tokens) if self.config.return_scores else None
        return self.record(carry, index, tokens, state, scores, alignment)

    def result(self, carry: Carry) -> Decoded:
        config = self.config
        return Decoded(
            carry.outputs,
            carry.scores if config.return_scores else None,
            carry.alignment if config.return_alignment else None,
        )


def token_scores(logits: TensorLike, tokens: TensorLike) -> TensorLike:
    """float32 `(B,)`: `log_softmax(logits)[b, tokens[b]]`, the model's own log-probability."""
    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # (B, V)
    return ops.take_along_axis(log_probs, ops.expand_dims(tokens, -1), axis=-1)[:, 0]


def decode(
    steps, encoder_inputs, max_length, config: GenerationConfig, choose=None, tensors=None
) -> Decoded:
    """The cached decoding loop (`DecodingLoop`, in one `ops.fori_loop`) -> `Decoded`."""
    loop = DecodingLoop(steps, config, choose, tensors)
    carry = ops.fori_loop(0, max_length, loop.step, loop.start(encoder_inputs, max_length))
    return loop.result(carry)


def write(buffer, index, values):
    """`buffer[:, index] = values` for `(B, T, ...)` and `(B, ...)` tensors."""
    start = (0, index) + (0,) * (len(buffer.shape) - 2)
    return ops.slice_update(buffer, start, ops.expand_dims(ops.cast(values, buffer.dtype), 1))
