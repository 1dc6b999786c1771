"""Logits processors: what a decoding step does to its next-token logits before the choice.

Each is one object, `processor.apply(logits (B, V), index, history, length) -> logits`,
built from the `GenerationConfig` (`logits_processors`): padding and `suppress_ids` ruled out
(`RuleOut`), CTRL's repetition penalty (`RepetitionPenalty`), no-repeat n-grams
(`NoRepeatNgram`), Hugging Face's `min_new_tokens` (`MinNewTokens`, on `end_id` and the
`StopSequences`, which the loop also reads to end a row). `index` is the step (the number
of new tokens so far), `history` a row's tokens so far `(B, K + T)` (a language model's
prompt or a seq2seq decoder's start token, then the outputs; -1 where the prompt's padding
was and where not written yet: 0 is a real token of a `padding_id=-1` model) and
`length` how many of them count (`K + index`); a processor that reads the history says so
(`needs_history`: else the two are None). A new control is a config field and one processor
here (`logits_processors`). (A method, not `__call__`: AutoGraph, which converts the loops
`tf.function` compiles, cannot call an object.)

Everything is `keras.ops` on fixed shapes, so it runs eagerly, inside `tf.function` (XLA too)
and `jax.jit`; `penalty` and `length` may be scalar tensors (a SavedModel's per-request
settings).
"""

import numbers
from typing import Any

import keras
import numpy as np
from keras import ops

from keras_attn._typing import TensorLike

from .config import FLOAT32_MAX as _FLOAT32_MAX
from .config import GenerationConfig

# The largest finite value of a logits dtype narrower than float32 (float32's otherwise).
_LARGEST = {"float16": 65504.0, "bfloat16": (2 - 2**-7) * 2.0**127}


class RuleOut:
    """Token 0 (padding, never a real output token, unless the model's `padding_id` is
    negative: then 0 is a token) and the `suppress_ids` (checked Python ints) at `-inf`; the
    ids are a constant of the trace (one compiled loop per setting)."""

    needs_history = False

    def __init__(self, suppress_ids=(), padding_id=0):
        self.suppress_ids, self.padding_id = tuple(suppress_ids), padding_id

    def apply(self, logits, index, history=None, length=None):
        return rule_out(logits, self.suppress_ids, self.padding_id)


class RepetitionPenalty:
    """CTRL's penalty (`penalize_repetition`) on the tokens in the row's history."""

    needs_history = True

    def __init__(self, penalty):
        self.penalty = penalty

    def apply(self, logits, index, history, length):
        seen = seen_tokens(history, ops.shape(logits)[-1], padding_id=-1)  # -1: none
        return penalize_repetition(logits, seen, self.penalty)


class NoRepeatNgram:
    """The tokens that would repeat an n-gram of the row's history banned (`-inf`), unless
    that bans every token of a row (a tiny vocabulary: then not enforced at that step)."""

    needs_history = True

    def __init__(self, n):
        self.n = n

    def apply(self, logits, index, history, length):
        banned = banned_ngram_tokens(history, length, self.n, ops.shape(logits)[-1], -1)
        return ban(logits, banned)


def logits_processors(
    config: GenerationConfig, tensors: dict | None = None, padding_id: int = 0
) -> list:
    """The processors of `config`, in the order they apply; `tensors` may hold a scalar
    tensor `repetition_penalty` (an exported model's per-request setting: always applied);
    `padding_id`: the model's (negative: token 0 is a token, not ruled out)."""
    tensors = tensors or {}
    processors = [RuleOut(config.suppress_ids, padding_id)]
    penalty = tensors.get("repetition_penalty", config.repetition_penalty)
    if not _is_off(penalty, 1.0):
        processors.append(RepetitionPenalty(penalty))
    if config.no_repeat_ngram_size:
        processors.append(NoRepeatNgram(config.no_repeat_ngram_size))
    stops = StopSequences.of(config, tensors)
    minimum = tensors.get("min_new_tokens", config.min_new_tokens)
    if not _is_off(minimum, 0) and (config.end_id is not None or stops is not None):
        processors.append(MinNewTokens(minimum, config.end_id, stops))
    return processors


def _is_off(value: Any, off: float) -> bool:
    """Whether a setting is off: None, or a Python (NumPy) number equal to `off` (a tensor
    never is: an exported model's per-request setting)."""
    return value is None or (isinstance(value, numbers.Real) and value == off)


def rule_out(logits: TensorLike, suppress_ids=(), padding_id: int = 0) -> TensorLike:
    """Logits `(B, V)` with token 0 (padding; unless `padding_id` is negative: then 0 is a
    token) and the `suppress_ids` (Python ints) `-inf`."""
    padding = (0,) if padding_id == 0 else ()
    # (K,); -1 matches no id and keeps K >= 1
    ids = ops.convert_to_tensor(np.array((*padding, *suppress_ids, -1), "int32"))
    vocabulary = ops.arange(ops.shape(logits)[-1], dtype="int32")  # (V,)
    ruled_out = ops.any(ops.equal(ops.expand_dims(vocabulary, -1), ids), axis=-1)  # (V,)
    return ops.where(ruled_out, ops.cast(float("-inf"), logits.dtype), logits)


def ban(logits: TensorLike, banned: TensorLike) -> TensorLike:
    """Logits `(B, V)` with the `banned` tokens `-inf`; a row whose every token would then be
    `-inf` keeps its logits (the n-grams cannot all be avoided: a tiny vocabulary)."""
    allowed = ops.where(banned, ops.cast(float("-inf"), logits.dtype), logits)
    left = ops.any(allowed > float("-inf"), axis=-1, keepdims=True)  # (B, 1)
    return ops.where(left, allowed, logits)


def _token_mask(tokens, counts, vocab_size):
    """bool `(B, V)`: `[b, v]` true where some `tokens[b, n] == v` with `counts[b, n]` true
    (a negative token, none, must not count)."""
    tokens = ops.maximum(ops.cast(tokens, "int32"), 0)  # a valid index where it does not count
    batch, length = ops.shape(tokens)[0], ops.shape(tokens)[1]
    rows = ops.broadcast_to(ops.expand_dims(ops.arange(batch, dtype="int32"), 1), (batch, length))
    indices = ops.reshape(ops.stack([rows, tokens], axis=-1), (-1, 2))  # (B * N, 2)
    updates = ops.reshape(ops.cast(counts, "float32"), (-1,))  # (B * N,)
    zeros = ops.zeros((batch, vocab_size), "float32")
    return ops.scatter_update(zeros, indices, updates, reduction="add") > 0


def seen_tokens(tokens: TensorLike, vocab_size: int, padding_id: int = 0) -> TensorLike:
    """bool `(B, V)`: which token ids occur in each row of int `tokens` `(B, T)` (padding and
    negative ids never count): `seen[b, v] = any_t (tokens[b, t] == v != padding_id)`.

    Args:
        tokens: int `(B, T)` token ids in `[0, vocab_size)`, or padding.
        vocab_size: the Python int `V`.
        padding_id: the padding's id: 0 (then token 0 never counts) or negative (then 0
            is a token like any other).

    Returns:
        bool `(B, V)`.

    Example:

    >>> print(ops.convert_to_numpy(seen_tokens(np.array([[3, 1, 3, 0]]), 5)).astype(int))
    [[0 1 0 1 0]]
    """
    tokens = ops.convert_to_tensor(tokens, "int32")
    counts = ops.logical_and(ops.not_equal(tokens, padding_id), tokens >= 0)
    return _token_mask(tokens, counts, vocab_size)


def penalize_repetition(logits: TensorLike, seen: TensorLike, penalty: float) -> TensorLike:
    """CTRL's repetition penalty: where `seen`, a positive logit is divided by `penalty`, a
    negative one multiplied by it (`penalty > 1` makes a seen token less likely either way).

    `l'[b, v] = l / penalty if seen[b, v] and l > 0; l * penalty if seen[b, v] and l <= 0;
    l otherwise.` A penalty of 1 changes nothing; `-inf` (a ruled-out token) stays `-inf`.
    The penalty never rules a token out: a finite logit stays finite, clipped to the logits'
    dtype's finite range where the rule would overflow it (a huge penalty on a negative
    logit, or a tiny one on a positive logit), so a row whose every allowed token was seen
    still chooses among them, never padding. The arithmetic is float32 (float16 logits
    under mixed precision cannot hold a penalty past 65,504).

    Args:
        logits: float `(B, V)` (any float dtype; the result keeps it).
        seen: bool `(B, V)`, e.g. `seen_tokens(tokens so far, V)`.
        penalty: a positive Python float or a scalar float tensor.

    Returns:
        `(B, V)` logits, the dtype of `logits`.

    Example:

    >>> logits = np.array([[2.0, -2.0, 2.0]], "float32")
    >>> seen = np.array([[True, True, False]])
    >>> print(ops.convert_to_numpy(penalize_repetition(logits, seen, 2.0)))
    [[ 1. -4.  2.]]

    Reference:
        Keskar et al., 2019, "CTRL: A Conditional Transformer Language Model for
        Controllable Generation", https://arxiv.org/abs/1909.05858 (section 4.1)
    """
    logits = ops.convert_to_tensor(logits)
    dtype = logits.dtype
    values = ops.cast(logits, "float32")
    penalty = ops.cast(penalty, "float32")
    penalized = ops.where(values > 0, values / penalty, values * penalty)
    largest = _LARGEST.get(keras.backend.standardize_dtype(dtype), _FLOAT32_MAX)
    penalized = ops.clip(penalized, -largest, largest)  # finite stays finite (+-inf: below)
    seen = ops.logical_and(ops.cast(seen, "bool"), ops.isfinite(values))
    return ops.where(seen, ops.cast(penalized, dtype), logits)


def banned_ngram_tokens(
    history: TensorLike, length: int | TensorLike, n: int, vocab_size: int, padding_id: int = 0
) -> TensorLike:
    """bool `(B, V)`: the tokens that would complete an n-gram already in the row.

    Of `history[:, :length]` (a row's tokens so far: its prompt, then its outputs; padding
    and negative ids are none), token `v` is banned for row `b` when some n-gram
    `history[b, i : i + n]` (`i + n <= length`, no padding in it) ends in `v` and starts with
    the row's last `n - 1` tokens `history[b, length - n + 1 : length]`. With `n = 1` every
    token seen is banned. Fewer than `n` tokens so far ban nothing.

    Args:
        history: int `(B, H)` token ids in `[0, vocab_size)`, or padding.
        length: a Python int or a scalar int tensor in `[0, H]`: how many tokens count.
        n: the n-gram size, a Python int >= 1.
        vocab_size: the Python int `V`.
        padding_id: the padding's id: 0 (then token 0 is padding) or negative (then 0 is a
            token like any other).

    Returns:
        bool `(B, V)`.

    Example: after `5 6 7 5`, a 6 would repeat the bigram `5 6`.

    >>> history = np.array([[5, 6, 7, 5, 0, 0]], "int32")
    >>> print(np.flatnonzero(ops.convert_to_numpy(banned_ngram_tokens(history, 4, 2, 10))))
    [6]
    """
    history = ops.convert_to_tensor(history, "int32")
    size = history.shape[1]
    if size is not None and size < n:  # no room for an n-gram
        return ops.zeros((ops.shape(history)[0], vocab_size), "bool")
    width = ops.shape(history)[1] - n + 1  # W: the n-grams' start positions
    windows = ops.stack([history[:, j : j + width] for j in range(n)], axis=-1)  # (B, W, n)
    length = ops.cast(length, "int32")
    starts = ops.arange(width, dtype="int32")
    counts = ops.logical_and(
        ops.expand_dims(starts + n <= length, 0),  # (1, W): inside history[:, :length]
        ops.all(ops.logical_and(ops.not_equal(windows, padding_id), windows >= 0), axis=-1),
    )
    if n > 1:  # its first n - 1 tokens are the row's last n - 1
        last = ops.maximum(length - (n - 1) + ops.arange(n - 1, dtype="int32"), 0)
        last = ops.take(history, last, axis=1)  # (B, n - 1)
        same = ops.all(ops.equal(windows[:, :, :-1], ops.expand_dims(last, 1)), axis=-1)
        counts = ops.logical_and(counts, same)  # (B, W)
    return _token_mask(windows[:, :, -1], counts, vocab_size)


class StopSequences:
    """A config's `stop_sequences` as tensors: where a row's new tokens end with one
    (`ended`: the loop finishes the row), and which token would complete one
    (`completing`: `MinNewTokens` rules it out under the minimum).

    Args:
        ids: int32 `(N, L)`: the `N` sequences, each padded at its end with -1 (no token id
            is negative, so 0 stays a token of a `padding_id=-1` model).
        lengths: int32 `(N,)`: each one's number of tokens (>= 1).

    `of(config, tensors)` builds them from `config.stop_sequences` (constants of the trace)
    or from a tensor `tensors["stop_sequences"]` in the `ids` layout (an exported model's
    per-request stop strings, spelled with its vocabulary; `N` may be 0); None when there
    are none.

    Example: a row whose new tokens are `4 7 8` has ended on the sequence `7 8`; after
    `4 7`, an 8 would complete it.

    >>> stops = StopSequences.of(GenerationConfig(stop_sequences=[[7, 8], [3]]))
    >>> outputs = np.array([[4, 7, 8, 0]], "int32")
    >>> print(ops.convert_to_numpy(stops.ended(outputs, 2)))
    [ True]
    >>> print(np.flatnonzero(ops.convert_to_numpy(stops.completing(outputs, 2, 2, 10))))
    [3 8]
    """

    def __init__(self, ids, lengths):
        self.ids = ops.convert_to_tensor(ids, "int32")
        self.lengths = ops.convert_to_tensor(lengths, "int32")

    @classmethod
    def of(cls, config: GenerationConfig, tensors: dict | None = None) -> "StopSequences | None":
        ids = (tensors or {}).get("stop_sequences")
        if ids is not None:
            ids = ops.convert_to_tensor(ids, "int32")
            return cls(ids, ops.sum(ops.cast(ids >= 0, "int32"), axis=1))
        if not config.stop_sequences:
            return None
        width = max(len(s) for s in config.stop_sequences)
        ids = np.array([s + (-1,) * (width - len(s)) for s in config.stop_sequences], "int32")
        return cls(ids, np.array([len(s) for s in config.stop_sequences], "int32"))

    def _matches(self, tokens, end, count, lengths):
        """bool `(B, N)`: `tokens[b, end - l : end] == ids[n, :l]` with `l = lengths[n]`
        (the first `l` ids of each sequence), `l <= count` (inside the last `count` tokens)."""
        width = ops.shape(self.ids)[1]
        j = ops.expand_dims(ops.arange(width, dtype="int32"), 0)  # (1, L)
        lengths = ops.expand_dims(lengths, 1)  # (N, 1)
        positions = ops.clip(end - lengths + j, 0, ops.shape(tokens)[1] - 1)  # (N, L)
        window = ops.take(tokens, positions, axis=1)  # (B, N, L)
        same = ops.logical_or(ops.equal(window, self.ids), j >= lengths)  # (B, N, L)
        return ops.logical_and(ops.all(same, axis=-1), ops.transpose(lengths <= count))

    def ended(self, outputs, index):
        """bool `(B,)`: whether `outputs[:, : index + 1]`, a row's new tokens with the one
        just written at `index`, end with a whole stop sequence."""
        outputs = ops.convert_to_tensor(outputs, "int32")
        return ops.any(self._matches(outputs, index + 1, index + 1, self.lengths), axis=-1)

    def completing(self, history, length, count, vocab_size):
        """bool `(B, V)`: the tokens that would complete a stop sequence after
        `history[:, :length]`, its first tokens among the last `count` (the new ones)."""
        history = ops.convert_to_tensor(history, "int32")
        prefixes = self._matches(history, length, count, self.lengths - 1)  # (B, N)
        last = ops.take_along_axis(self.ids, ops.expand_dims(self.lengths - 1, 1), axis=1)
        last = ops.broadcast_to(ops.transpose(last), ops.shape(prefixes))  # (B, N)
        return _token_mask(last, prefixes, vocab_size)


class MinNewTokens:
    """Hugging Face's `min_new_tokens`: while a row has fewer than `minimum` new tokens
    (`index < minimum`), `end_id` is ruled out (`MinNewTokensLengthLogitsProcessor`), and so
    is each token that would complete one of the `stops` (`StopSequences`) among the new
    tokens; not enforced at a step where that would rule out every token of a row (a tiny
    vocabulary). `minimum` may be a scalar tensor (an exported model's per-request setting).
    """

    def __init__(self, minimum, end_id=None, stops=None):
        self.minimum, self.end_id, self.stops = minimum, end_id, stops
        self.needs_history = stops is not None

    def apply(self, logits, index, history=None, length=None):
        vocab_size = ops.shape(logits)[-1]
        banned = ops.zeros(ops.shape(logits), "bool")
        if self.end_id is not None:
            banned = ops.logical_or(banned, ops.arange(vocab_size) == self.end_id)
        if self.stops is not None:
            completing = self.stops.completing(history, length, index, vocab_size)
            banned = ops.logical_or(banned, completing)
        under = ops.convert_to_tensor(index, "int32") < ops.cast(self.minimum, "int32")
        return ops.where(under, ban(logits, banned), logits)
