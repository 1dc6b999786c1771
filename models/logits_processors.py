"""Repetition controls on a decoder's next-token logits: CTRL's penalty and no-repeat n-grams.

The decoding loops (`keras_attn.models.decoding`, beam search, the exported `generate`) call
these once per step, between ruling out padding and choosing the token. Everything is
`keras.ops` on fixed shapes, so it runs eagerly, inside `tf.function` (XLA too) and `jax.jit`;
`penalty` and `length` may be scalar tensors (a SavedModel's per-request settings).
"""

import math
import numbers

import keras
import numpy as np
from keras import ops

from keras_attn._typing import TensorLike
from keras_attn.arguments import is_int

_FLOAT32_MAX = float(np.finfo("float32").max)
# The largest finite value of a logits dtype narrower than float32 (float32's otherwise).
_LARGEST = {"float16": 65504.0, "bfloat16": (2 - 2**-7) * 2.0**127}


def check_repetition_penalty(value: float | None) -> float:
    """`repetition_penalty` as a Python float (None: 1.0, off), or `ValueError` naming it.

    Example:

    >>> check_repetition_penalty(None), check_repetition_penalty(2)
    (1.0, 2.0)
    """
    if value is None:
        return 1.0
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or not 0 < value <= _FLOAT32_MAX
    ):
        raise ValueError(
            "`repetition_penalty` must be a positive number a float32 holds (at most "
            f"{_FLOAT32_MAX:.4g}; 1 = off). Received: repetition_penalty={value!r}"
        )
    return float(value)


def check_no_repeat_ngram_size(value: int | None) -> int:
    """`no_repeat_ngram_size` as a Python int (None: 0, off), or `ValueError` naming it.

    Example:

    >>> check_no_repeat_ngram_size(None), check_no_repeat_ngram_size(3)
    (0, 3)
    """
    if value is None:
        return 0
    if not is_int(value) or value < 0:
        raise ValueError(
            "`no_repeat_ngram_size` must be a non-negative integer (0 = off). "
            f"Received: no_repeat_ngram_size={value!r}"
        )
    return int(value)


def _token_mask(tokens, counts, vocab_size):
    """bool `(B, V)`: `[b, v]` true where some `tokens[b, n] == v` with `counts[b, n]` true."""
    tokens = ops.cast(tokens, "int32")
    batch, length = ops.shape(tokens)[0], ops.shape(tokens)[1]
    rows = ops.broadcast_to(ops.expand_dims(ops.arange(batch, dtype="int32"), 1), (batch, length))
    indices = ops.reshape(ops.stack([rows, tokens], axis=-1), (-1, 2))  # (B * N, 2)
    updates = ops.reshape(ops.cast(counts, "float32"), (-1,))  # (B * N,)
    zeros = ops.zeros((batch, vocab_size), "float32")
    return ops.scatter_update(zeros, indices, updates, reduction="add") > 0


def seen_tokens(tokens: TensorLike, vocab_size: int) -> TensorLike:
    """bool `(B, V)`: which token ids occur in each row of int `tokens` `(B, T)` (0, padding,
    never counts): `seen[b, v] = any_t (tokens[b, t] == v and v != 0)`.

    Args:
        tokens: int `(B, T)` token ids in `[0, vocab_size)`.
        vocab_size: the Python int `V`.

    Returns:
        bool `(B, V)`.

    Example:

    >>> print(ops.convert_to_numpy(seen_tokens(np.array([[3, 1, 3, 0]]), 5)).astype(int))
    [[0 1 0 1 0]]
    """
    tokens = ops.convert_to_tensor(tokens, "int32")
    return _token_mask(tokens, ops.not_equal(tokens, 0), vocab_size)


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
    history: TensorLike, length: int | TensorLike, n: int, vocab_size: int
) -> TensorLike:
    """bool `(B, V)`: the tokens that would complete an n-gram already in the row.

    Of `history[:, :length]` (a row's tokens so far: its prompt, then its outputs; 0 =
    padding), token `v` is banned for row `b` when some n-gram `history[b, i : i + n]`
    (`i + n <= length`, no padding in it) ends in `v` and starts with the row's last `n - 1`
    tokens `history[b, length - n + 1 : length]`. With `n = 1` every token seen is banned.
    Fewer than `n` tokens so far ban nothing.

    Args:
        history: int `(B, H)` token ids in `[0, vocab_size)`.
        length: a Python int or a scalar int tensor in `[0, H]`: how many tokens count.
        n: the n-gram size, a Python int >= 1.
        vocab_size: the Python int `V`.

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
        ops.all(ops.not_equal(windows, 0), axis=-1),  # (B, W): no padding in the n-gram
    )
    if n > 1:  # its first n - 1 tokens are the row's last n - 1
        last = ops.maximum(length - (n - 1) + ops.arange(n - 1, dtype="int32"), 0)
        last = ops.take(history, last, axis=1)  # (B, n - 1)
        same = ops.all(ops.equal(windows[:, :, :-1], ops.expand_dims(last, 1)), axis=-1)
        counts = ops.logical_and(counts, same)  # (B, W)
    return _token_mask(windows[:, :, -1], counts, vocab_size)
