"""Choosing the next token from a decoder's logits: greedy and sampled, one draw.

The decoding loop (`keras_attn.models.generation.loop`) calls `token_chooser(config, ...)`'s
function once per step, inside its loop (eager, or a `tf.function` in a SavedModel). Ties go
to the lowest token id on every backend (`top_k_lowest_first`). On TensorFlow both use
`ops.top_k` rather than `ops.argmax`: Keras' `argmax` adds a sign-bit test (`tf.BitwiseAnd`)
that TFLite's builtin ops lack, while `top_k` converts and breaks ties the same way. On JAX
greedy decoding uses `argmax`: JAX serializes `top_k` (jax2tf, in a SavedModel export) as a
StableHLO composite that TensorFlow's `XlaCallModule` (2.21) cannot read. torch's `topk`
orders equal values arbitrarily, so there greedy decoding takes `argmax` (the first maximal
index) and the sampler a stable sort.

`sample_tokens` takes its settings as Python numbers (a constant of the trace: one compiled
loop per setting) or as scalar tensors (an exported `generate`'s per-request settings: one
graph serves every temperature, top-k and top-p), and draws the same token from either.
"""

import numbers
from collections.abc import Callable

import keras
import numpy as np
from keras import ops

from keras_attn._typing import TensorLike

from .config import GenerationConfig

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


def _static(value) -> bool:
    """A Python (NumPy) number or None: a constant of the trace, not a tensor."""
    return value is None or isinstance(value, numbers.Number)


def sample_tokens(
    logits: TensorLike,
    uniform: TensorLike,
    temperature: float | TensorLike = 1.0,
    top_k: int | TensorLike | None = None,
    top_p: float | TensorLike | None = None,
) -> TensorLike:
    """Draws one token per row from `softmax(logits / temperature)`, truncated.

    With `p = softmax((logits - max) / temperature)` over the tokens in decreasing order
    (ties: the lowest id first), the candidates are the `top_k` most likely tokens (all when
    None or 0); of these, top-p (nucleus) sampling keeps the smallest most-likely-first set
    whose probability mass reaches `top_p`: token `i` in decreasing order is kept when the
    mass of the tokens before it is below `top_p`. The kept probabilities are renormalized
    and the token is drawn by inverse CDF from `uniform`: the first candidate whose
    cumulative probability exceeds `uniform * total`. So `top_k=1`, or a temperature going
    to 0, is greedy.

    The scaled logits are `(logits - max) / temperature`, at most 0, so a small
    temperature cannot overflow them to `+inf` (NaN probabilities, and a draw of
    padding): a logit far below the best one becomes `-inf` (probability 0). A
    temperature whose inverse float32 cannot hold (below about 2.9e-39; 0 included) draws
    the argmax, as greedy decoding does. The arithmetic is float32 whatever the logits'
    dtype (float16 or bfloat16 under mixed precision).

    The settings are Python numbers or scalar tensors, the same draw either way. As Python
    numbers the candidates are `ops.top_k(k)`'s; as tensors (an exported `generate`: not
    checked here, its graph asserts them) every token is sorted and ranks `>= top_k` are
    ruled out (`ops.top_k` needs a static `k`), `top_k = 0` and `top_p >= 1` stand for
    None (off), and the last axis of `logits` must be static.

    Args:
        logits: float `(B, V)`; a ruled-out token has logit `-inf`.
        uniform: float `(B,)` draws from `U[0, 1)`, one per row.
        temperature: a number `>= 0` dividing the logits (a float scalar tensor too).
        top_k: None or 0 (off), or the number of most likely tokens to sample from
            (more than `V` means all; an int scalar tensor too).
        top_p: None (off) or the nucleus mass in `(0, 1]` (a float scalar tensor too).

    Returns:
        int32 `(B,)` token ids.

    Raises:
        ValueError: tensor settings with `logits` whose last axis is not static.

    Example:

    >>> logits = np.log(np.array([[0.5, 0.3, 0.2]], "float32"))
    >>> [int(sample_tokens(logits, np.array([u]))[0]) for u in (0.1, 0.6, 0.9)]
    [0, 1, 2]
    >>> [int(sample_tokens(logits, np.array([u]), top_p=0.7)[0]) for u in (0.1, 0.6, 0.9)]
    [0, 0, 1]
    >>> t, k, p = (ops.convert_to_tensor(x) for x in (1.0, 2, 0.7))  # one graph for all
    >>> [int(sample_tokens(logits, np.array([u]), t, k, p)[0]) for u in (0.1, 0.6, 0.9)]
    [0, 0, 1]
    """
    logits = ops.cast(logits, "float32")
    vocab = logits.shape[-1]
    candidate = greedy = None
    if all(_static(value) for value in (temperature, top_k, top_p)):
        k = vocab if not top_k else min(top_k, vocab)
        if float(temperature) * _FLOAT32_MAX < 1:
            k = 1  # greedy: 1 / temperature overflows float32, as would every scaled gap
        if k == 1:
            return greedy_tokens(logits)
        inverse = 1.0 / float(temperature)
        values, ids = top_k_lowest_first(logits, k)  # (B, k), most likely first
        nucleus = None if top_p is None else (lambda before: before < top_p)
    else:
        if not isinstance(vocab, int):
            raise ValueError(
                "`logits` must have a static last axis (the vocabulary). "
                f"Received: shape={logits.shape}"
            )
        temperature = ops.cast(temperature, "float32")
        greedy = temperature * _FLOAT32_MAX < 1  # 1 / temperature overflows float32
        inverse = 1.0 / ops.where(greedy, 1.0, temperature)  # finite: no 0 * inf at the max
        values, ids = top_k_lowest_first(logits, vocab)  # (B, V), most likely first
        top_k = ops.cast(0 if top_k is None else top_k, "int32")
        candidate = ops.logical_or(ops.arange(vocab, dtype="int32") < top_k, top_k <= 0)  # (V,)
        top_p = ops.cast(1.0 if top_p is None else top_p, "float32")

        def nucleus(before):
            return ops.logical_or(before < top_p, top_p >= 1)

    # (values - max) * (1 / temperature) <= 0: no +inf, whatever the temperature; an exact
    # 0 at the max (the inverse is finite), so a softmax row is never all NaN.
    # The max read from `logits`, not `values[:, :1]`: the same number, but TensorFlow's XLA
    # on a CPU took 20 ms a step (V = 5,000) to slice top_k's values, 1 ms this way.
    best = ops.max(logits, axis=-1, keepdims=True)  # (B, 1)
    scaled = (values - best) * inverse  # (B, k)
    if candidate is not None:
        scaled = ops.where(candidate, scaled, float("-inf"))
    probs = ops.softmax(scaled, axis=-1)
    if nucleus is not None:
        before = ops.cumsum(probs, axis=-1) - probs  # mass of the more likely candidates
        probs = ops.where(nucleus(before), probs, 0.0)
    cdf = ops.cumsum(probs, axis=-1)  # (B, k), unnormalized
    threshold = ops.expand_dims(ops.cast(uniform, "float32"), -1) * cdf[:, -1:]  # (B, 1)
    rank = ops.sum(ops.cast(ops.less_equal(cdf, threshold), "int32"), axis=-1)  # (B,)
    # uniform < 1, so only rounding could pass the last kept (nonzero) candidate, and a
    # ruled-out (-inf) token is never kept.
    kept = ops.sum(ops.cast(probs > 0, "int32"), axis=-1)  # (B,), a prefix: probs decrease
    rank = ops.minimum(rank, ops.maximum(kept, 1) - 1)
    if greedy is not None:
        rank = ops.where(greedy, 0, rank)  # the argmax (ids[:, 0])
    chosen = ops.take_along_axis(ids, ops.expand_dims(rank, -1), axis=-1)  # (B, 1)
    return chosen[:, 0]


def token_chooser(
    config: GenerationConfig, uniform: TensorLike | None = None, tensors: dict | None = None
) -> Callable:
    """`choose(logits (B, V), index) -> (B,)` int32: the config's sampler, one draw a step.

    `"greedy"` (and `"sample"` at a Python temperature of 0): `greedy_tokens`; `"sample"`:
    `sample_tokens` with the config's temperature, top-k and top-p (or those of `tensors`,
    an exported `generate`'s per-request settings), on row `index` of `uniform`
    `(max_length, B)`.
    """
    tensors = tensors or {}
    if config.sampler != "sample" or (config.greedy and "temperature" not in tensors):
        return lambda logits, index: greedy_tokens(logits)
    settings = {n: tensors.get(n, getattr(config, n)) for n in ("temperature", "top_k", "top_p")}

    def choose(logits, index):
        return sample_tokens(logits, ops.take(uniform, index, axis=0), **settings)

    return choose


def sample_draws(config: GenerationConfig, max_length: int, batch: int) -> TensorLike:
    """float32 `(max_length, batch * n)` draws from `U[0, 1)` for `"sample"`, one per step and
    row, `n = config.num_return_sequences` (the rows: each prompt's `n` samples in turn).

    `n = 1`: `keras.random.uniform((max_length, batch), seed=seed)`. `n > 1`: sample `j` of
    every prompt draws `keras.random.uniform((max_length, 1), seed=seed + j)`, what a batch of
    that prompt alone draws with `seed + j`: the samples are reproducible from the seed,
    independent of each other and the same in any batch (`seed=None`: one unseeded draw).

    Example:

    >>> config = GenerationConfig(sampler="sample", seed=3, num_return_sequences=2)
    >>> draws = ops.convert_to_numpy(sample_draws(config, 4, 3))
    >>> alone = ops.convert_to_numpy(keras.random.uniform((4, 1), seed=4))[:, 0]
    >>> print(draws.shape, bool(np.all(draws[:, 3] == alone)))
    (4, 6) True
    """
    n, seed = config.num_return_sequences, config.seed
    if n == 1 or seed is None:
        return keras.random.uniform((max_length, batch * n), seed=seed)
    samples = [keras.random.uniform((max_length, 1), seed=seed + j) for j in range(n)]
    return ops.tile(ops.concatenate(samples, axis=1), (1, batch))  # column i * n + j: j's
