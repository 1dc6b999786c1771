"""Choosing the next token from a decoder's logits: greedy and sampled.

`keras_attn.models.decoding` calls these once per decoding step, inside its loop (eager,
or a `tf.function` in a SavedModel). Both use `ops.top_k` rather than
`ops.argmax`: on TensorFlow, Keras' `argmax` adds a sign-bit test
(`tf.BitwiseAnd`) that TFLite's builtin ops lack, while `top_k` converts and
breaks ties the same way (the lowest token id first). On JAX greedy decoding uses
`argmax`: JAX serializes `top_k` (jax2tf, in a SavedModel export) as a StableHLO
composite that TensorFlow's `XlaCallModule` (2.21) cannot read.
"""

import math
import numbers

import keras
import numpy as np
from keras import ops

from keras_attn._typing import TensorLike
from keras_attn.arguments import is_int

_FLOAT32_MAX = float(np.finfo("float32").max)


def greedy_tokens(logits: TensorLike) -> TensorLike:
    """`(B, V)` logits -> `(B,)` int32 `argmax_v logits[b, v]` (ties: the lowest id).

    Example:

    >>> print(ops.convert_to_numpy(greedy_tokens(np.array([[0.1, 2.0, 2.0], [3.0, 0.0, 1.0]]))))
    [1 0]
    """
    if keras.backend.backend() == "jax":
        return ops.cast(ops.argmax(logits, axis=-1), "int32")
    _, ids = ops.top_k(logits, 1)  # (B, 1)
    return ops.cast(ids[:, 0], "int32")


def check_sampling(temperature, top_k, top_p, seed):
    """The arguments, integers as Python ints (NumPy ones taken), or `ValueError` naming one."""
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, numbers.Real)
        or not math.isfinite(temperature)
        or temperature <= 0
    ):
        raise ValueError(
            "`temperature` must be a positive finite number (for temperature 0 use "
            f"greedy decoding). Received: temperature={temperature!r}"
        )
    if top_k is not None and (not is_int(top_k) or top_k < 1):
        raise ValueError(f"`top_k` must be None or a positive integer. Received: top_k={top_k!r}")
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1
    ):
        raise ValueError(f"`top_p` must be None or a number in (0, 1]. Received: top_p={top_p!r}")
    if seed is not None and (not is_int(seed)):
        raise ValueError(f"`seed` must be None or an integer. Received: seed={seed!r}")
    top_k, seed = (None if value is None else int(value) for value in (top_k, seed))
    return temperature, top_k, top_p, seed


def sample_tokens(
    logits: TensorLike,
    uniform: TensorLike,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> TensorLike:
    """Draws one token per row from `softmax(logits / temperature)`, truncated.

    The candidates are the `top_k` most likely tokens (all when None); of
    these, top-p (nucleus) sampling keeps the smallest most-likely-first set
    whose probability mass reaches `top_p`: token `i` in decreasing order is
    kept when the mass of the tokens before it is below `top_p`. The kept
    probabilities are renormalized and the token is drawn by inverse CDF from
    `uniform`: the first candidate whose cumulative probability exceeds
    `uniform * total`. So `top_k=1`, or a temperature going to 0, is greedy.

    The scaled logits are `(logits - max) / temperature`, at most 0, so a small
    temperature cannot overflow them to `+inf` (NaN probabilities, and a draw of
    padding): a logit far below the best one becomes `-inf` (probability 0). A
    temperature whose inverse float32 cannot hold (below about 2.9e-39) draws the
    argmax, as greedy decoding does. The arithmetic is float32 whatever the
    logits' dtype (float16 or bfloat16 under mixed precision).

    Args:
        logits: float `(B, V)`; a ruled-out token has logit `-inf`.
        uniform: float `(B,)` draws from `U[0, 1)`, one per row.
        temperature: positive number dividing the logits.
        top_k: None or the number of most likely tokens to sample from
            (more than `V` means all).
        top_p: None or the nucleus mass in `(0, 1]`.

    Returns:
        int32 `(B,)` token ids.

    Example:

    >>> logits = np.log(np.array([[0.5, 0.3, 0.2]], "float32"))
    >>> [int(sample_tokens(logits, np.array([u]))[0]) for u in (0.1, 0.6, 0.9)]
    [0, 1, 2]
    >>> [int(sample_tokens(logits, np.array([u]), top_p=0.7)[0]) for u in (0.1, 0.6, 0.9)]
    [0, 0, 1]
    """
    logits = ops.cast(logits, "float32")
    vocab = logits.shape[-1]
    k = vocab if top_k is None else min(top_k, vocab)
    if float(temperature) * _FLOAT32_MAX < 1:
        k = 1  # greedy: 1 / temperature overflows float32, as would every scaled gap
    values, ids = ops.top_k(logits, k)  # (B, k), most likely first; ties: lowest id first
    if k == 1:
        return ops.cast(ids[:, 0], "int32")
    # (values - max) * (1 / temperature) <= 0: no +inf, whatever the temperature; an exact
    # 0 at the max (the inverse is finite), so a softmax row is never all NaN.
    scaled = (values - values[:, :1]) * (1.0 / float(temperature))  # (B, k)
    probs = ops.softmax(scaled, axis=-1)
    if top_p is not None:
        before = ops.cumsum(probs, axis=-1) - probs  # mass of the more likely candidates
        probs = ops.where(before < top_p, probs, 0.0)
    cdf = ops.cumsum(probs, axis=-1)  # (B, k), unnormalized
    threshold = ops.expand_dims(ops.cast(uniform, "float32"), -1) * cdf[:, -1:]  # (B, 1)
    rank = ops.sum(ops.cast(ops.less_equal(cdf, threshold), "int32"), axis=-1)  # (B,)
    # uniform < 1, so only rounding could pass the last kept (nonzero) candidate, and a
    # ruled-out (-inf) token is never kept.
    kept = ops.sum(ops.cast(probs > 0, "int32"), axis=-1)  # (B,), a prefix: probs decrease
    rank = ops.minimum(rank, ops.maximum(kept, 1) - 1)
    chosen = ops.take_along_axis(ids, ops.expand_dims(rank, -1), axis=-1)  # (B, 1)
    return ops.cast(chosen[:, 0], "int32")
