"""Choosing the next token from a decoder's logits: greedy and sampled.

`keras_attn.models.decoding` calls these once per decoding step, inside its loop (eager,
or a `tf.function` in a SavedModel). Ties go to the lowest token id on every backend
(`top_k_lowest_first`). On TensorFlow both use `ops.top_k` rather than `ops.argmax`: Keras'
`argmax` adds a sign-bit test (`tf.BitwiseAnd`) that TFLite's builtin ops lack, while `top_k`
converts and breaks ties the same way. On JAX greedy decoding uses `argmax`: JAX serializes
`top_k` (jax2tf, in a SavedModel export) as a StableHLO composite that TensorFlow's
`XlaCallModule` (2.21) cannot read. torch's `topk` orders equal values arbitrarily, so there
greedy decoding takes `argmax` (the first maximal index) and the samplers a stable sort.

`sample_tokens_with` is `sample_tokens` with its settings as tensors (an exported
`generate`'s per-request settings): one graph serves every temperature, top-k and top-p.
"""

import math
import numbers

import keras
import numpy as np
from keras import ops

from keras_attn._typing import TensorLike
from keras_attn.arguments import is_int

_FLOAT32_MAX = float(np.finfo("float32").max)


def top_k_lowest_first(values: TensorLike, k: int) -> tuple[TensorLike, TensorLike]:
    """`ops.top_k` with ties broken at the lowest index on every backend.

    Returns each row's `k` largest values, largest first, and their int32 indices; among
    equal values the lower index comes first (and is the one kept where `k` cuts through
    them). `ops.top_k` does this on TensorFlow and JAX; torch's `topk` orders ties
    arbitrarily, so there a stable descending sort.

    Args:
        values: float `(B, N)`.
        k: a Python int in `[1, N]`.

    Returns:
        `(top values (B, k), int32 indices (B, k))`.

    Example:

    >>> _, ids = top_k_lowest_first(np.array([[-1.0, 3.0, 3.0, 0.0, 3.0]]), 2)
    >>> print(ops.convert_to_numpy(ids))
    [[1 2]]
    """
    if keras.backend.backend() == "torch":
        import torch

        values = ops.convert_to_tensor(values)
        top, ids = torch.sort(values, dim=-1, descending=True, stable=True)
        return top[:, :k], ops.cast(ids[:, :k], "int32")
    top, ids = ops.top_k(values, k)
    return top, ops.cast(ids, "int32")


def greedy_tokens(logits: TensorLike) -> TensorLike:
    """`(B, V)` logits -> `(B,)` int32 `argmax_v logits[b, v]` (ties: the lowest id).

    Example:

    >>> print(ops.convert_to_numpy(greedy_tokens(np.array([[0.1, 2.0, 2.0], [3.0, 0.0, 1.0]]))))
    [1 0]
    """
    if keras.backend.backend() in ("jax", "torch"):  # both: the first maximal index
        return ops.cast(ops.argmax(logits, axis=-1), "int32")
    _, ids = ops.top_k(logits, 1)  # (B, 1)
    return ops.cast(ids[:, 0], "int32")


def check_sampling(temperature, top_k, top_p, seed):
    """The arguments, integers as Python ints (NumPy ones taken), or `ValueError` naming one.

    `temperature` a finite number >= 0 (0: greedy), `top_k` None or an integer >= 0 (0, as
    None: off; returned as None), `top_p` None or in `(0, 1]`, `seed` None or an integer.
    """
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, numbers.Real)
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise ValueError(
            "`temperature` must be a finite number >= 0 (0 is greedy decoding). "
            f"Received: temperature={temperature!r}"
        )
    if top_k is not None and (not is_int(top_k) or top_k < 0):
        raise ValueError(
            f"`top_k` must be None or an integer >= 0 (0 = off). Received: top_k={top_k!r}"
        )
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1
    ):
        raise ValueError(f"`top_p` must be None or a number in (0, 1]. Received: top_p={top_p!r}")
    if seed is not None and (not is_int(seed)):
        raise ValueError(f"`seed` must be None or an integer. Received: seed={seed!r}")
    top_k, seed = (None if value is None else int(value) for value in (top_k, seed))
    return temperature, top_k or None, top_p, seed


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
    if k == 1:
        return greedy_tokens(logits)
    values, ids = top_k_lowest_first(logits, k)  # (B, k), most likely first; ties: lowest id
    # (values - max) * (1 / temperature) <= 0: no +inf, whatever the temperature; an exact
    # 0 at the max (the inverse is finite), so a softmax row is never all NaN.
    # The max read from `logits`, not `values[:, :1]`: the same number, but TensorFlow's XLA
    # on a CPU took 20 ms a step (V = 5,000) to slice top_k's values, 1 ms this way.
    best = ops.max(logits, axis=-1, keepdims=True)  # (B, 1)
    scaled = (values - best) * (1.0 / float(temperature))  # (B, k)
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
    return chosen[:, 0]


def sample_tokens_with(
    logits: TensorLike,
    uniform: TensorLike,
    temperature: TensorLike,
    top_k: TensorLike,
    top_p: TensorLike,
) -> TensorLike:
    """`sample_tokens` with its settings as scalar tensors: one graph for every setting.

    The same draw: with `p = softmax((logits - max) / temperature)` over the tokens in
    decreasing order (ties: the lowest id first), a token of rank `r` is a candidate when
    `r < top_k` and the mass of the candidates before it is below `top_p`; the token is the
    first candidate whose cumulative probability exceeds `uniform * total`. The settings'
    "off" values stand for `sample_tokens`' `None`s: `top_k = 0` keeps every token (a full
    sort, then ranks `>= top_k` ruled out: `ops.top_k` needs a static `k`), `top_p >= 1`
    keeps every candidate, and `temperature * FLOAT32_MAX < 1` (0 included) is the argmax,
    `greedy_tokens`' token. For the same settings and `uniform` the tokens are
    `sample_tokens`' (`greedy_tokens`' for temperature 0): the candidates, their softmax and
    cumulative sums are computed alike. Settings are not checked here (the exported
    `generate` asserts them in its graph).

    Args:
        logits: float `(B, V)`, `V` static; a ruled-out token has logit `-inf`.
        uniform: float `(B,)` draws from `U[0, 1)`, one per row.
        temperature: float scalar, `>= 0`.
        top_k: int scalar, `>= 0` (0 = off; more than `V` means all).
        top_p: float scalar in `(0, 1]` (1 = off).

    Returns:
        int32 `(B,)` token ids.

    Raises:
        ValueError: `logits` whose last axis is not static.

    Example:

    >>> logits = np.log(np.array([[0.5, 0.3, 0.2]], "float32"))
    >>> draw = lambda u, t, k, p: int(sample_tokens_with(logits, np.array([u]), t, k, p)[0])
    >>> [draw(u, 1.0, 0, 1.0) for u in (0.1, 0.6, 0.9)], [draw(0.9, 0.0, 0, 1.0)]
    ([0, 1, 2], [0])
    >>> [draw(u, 1.0, 2, 0.7) for u in (0.1, 0.6, 0.9)]
    [0, 0, 1]
    """
    logits = ops.cast(logits, "float32")
    vocab = logits.shape[-1]
    if not isinstance(vocab, int):
        raise ValueError(
            "`logits` must have a static last axis (the vocabulary). "
            f"Received: shape={logits.shape}"
        )
    temperature = ops.cast(temperature, "float32")
    greedy = temperature * _FLOAT32_MAX < 1  # 1 / temperature overflows float32
    inverse = 1.0 / ops.where(greedy, 1.0, temperature)  # finite: no 0 * inf at the max
    values, ids = top_k_lowest_first(logits, vocab)  # (B, V) most likely first; ties: lowest id
    ranks = ops.arange(vocab, dtype="int32")  # (V,)
    top_k = ops.cast(top_k, "int32")
    candidate = ops.logical_or(ranks < top_k, top_k <= 0)  # (V,)
    best = ops.max(logits, axis=-1, keepdims=True)  # values[:, :1], quicker (sample_tokens)
    scaled = (values - best) * inverse  # (B, V), <= 0 (sample_tokens' arithmetic)
    scaled = ops.where(candidate, scaled, float("-inf"))
    probs = ops.softmax(scaled, axis=-1)
    top_p = ops.cast(top_p, "float32")
    before = ops.cumsum(probs, axis=-1) - probs  # mass of the more likely candidates
    probs = ops.where(ops.logical_or(before < top_p, top_p >= 1), probs, 0.0)
    cdf = ops.cumsum(probs, axis=-1)  # (B, V), unnormalized
    threshold = ops.expand_dims(ops.cast(uniform, "float32"), -1) * cdf[:, -1:]  # (B, 1)
    rank = ops.sum(ops.cast(ops.less_equal(cdf, threshold), "int32"), axis=-1)  # (B,)
    kept = ops.sum(ops.cast(probs > 0, "int32"), axis=-1)  # (B,), a prefix: probs decrease
    rank = ops.minimum(rank, ops.maximum(kept, 1) - 1)
    rank = ops.where(greedy, 0, rank)  # the argmax (ids[:, 0])
    chosen = ops.take_along_axis(ids, ops.expand_dims(rank, -1), axis=-1)  # (B, 1)
    return chosen[:, 0]
