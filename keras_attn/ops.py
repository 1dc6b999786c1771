"""Functional core of keras-attn, written with `keras.ops` only.

Every attention layer in the library runs the same steps, and each step is a
function here:

    score -> mask -> normalize -> dropout -> combine

Shapes use `B` (batch), `Tq` (query length), `Tv` (key/value length), `dk`
(key width), `dv` (value width). Every function accepts any number of leading
batch axes (`(..., Tq, dk)`), so multi-head code can pass `(B, H, Tq, dk)`.

Masks are boolean, `True` means "may attend" (built and checked in
`keras_attn.masks`, re-exported here). A masked key gets exactly zero weight,
and a query row with no visible key gets all-zero weights (and so a zero
output), never NaN and never a uniform average over padding. A NaN or inf at a
masked key never reaches an output (`keras_attn.finite`).
"""

import math

import numpy as np
from keras import ops, random

from keras_attn import finite
from keras_attn.chunked import chunked_attention
from keras_attn.fused import fused_attention, softmax
from keras_attn.masks import (
    as_bool_mask,
    cache_mask,
    causal_mask,
    check_mask_broadcast,
    check_mask_dtype,
    chosen_positions_mask,
    compute_attention_mask,
    merge_masks,
    visible_query_rows,
    visible_rows,
)

__all__ = [
    "CHUNKED_MIN_SCORES",
    "IMPLEMENTATIONS",
    "additive_score",
    "as_bool_mask",
    "attention",
    "bilinear_score",
    "cache_mask",
    "causal_mask",
    "check_mask_broadcast",
    "check_mask_dtype",
    "choose_implementation",
    "chosen_positions_mask",
    "compute_attention_mask",
    "dot_score",
    "dropout_weights",
    "masked_softmax",
    "merge_masks",
    "scaled_dot_score",
    "visible_query_rows",
    "visible_rows",
    "weighted_sum",
]

# Fill value for masked scores. Softmax runs in float32, so the most negative
# finite float32 is safe: exp(fill - max) underflows to exactly 0 for any finite
# visible score, and a row of fills gives a finite uniform row that
# `masked_softmax` then zeroes.
_MASK_FILL = float(np.finfo(np.float32).min)


def _check_widths(name_a, shape_a, name_b, shape_b):
    a, b = shape_a[-1], shape_b[-1]
    if a is not None and b is not None and a != b:
        raise ValueError(
            f"The last axis of `{name_a}` and `{name_b}` must match for this "
            f"score. Received: {name_a}.shape={tuple(shape_a)}, "
            f"{name_b}.shape={tuple(shape_b)}"
        )


def _swap_last(x):
    rank = len(x.shape)
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    return ops.transpose(x, perm)


# ---------------------------------------------------------------------------
# Scores: (..., Tq, dq), (..., Tv, dk) -> (..., Tq, Tv)
# ---------------------------------------------------------------------------


def dot_score(query, key):
    """Dot-product score `s(q, k) = q . k` (Luong "dot").

    Args:
        query: `(..., Tq, d)` tensor.
        key: `(..., Tv, d)` tensor with the same width `d`.

    Returns:
        Scores `(..., Tq, Tv)`.
    """
    _check_widths("query", query.shape, "key", key.shape)
    return ops.matmul(query, _swap_last(key))


def scaled_dot_score(query, key, scale=None):
    """Scaled dot-product score `s(q, k) = q . k / sqrt(d)` (Vaswani et al.).

    Args:
        query: `(..., Tq, d)` tensor.
        key: `(..., Tv, d)` tensor.
        scale: multiplier of the scores; `None` means `1 / sqrt(d)`.

    Returns:
        Scores `(..., Tq, Tv)`.
    """
    _check_widths("query", query.shape, "key", key.shape)
    if scale is None:
        scale = 1.0 / float(np.sqrt(_static_width("key", key)))
    # Scaling the query costs Tq * d multiplies instead of Tq * Tv.
    return ops.matmul(query * ops.cast(scale, query.dtype), _swap_last(key))


def additive_score(query, key, v):
    """Additive score `s(q, k) = v^T tanh(q + k)` on already projected inputs.

    Bahdanau's score is `v^T tanh(W k + U q)`; pass `query = U q` and
    `key = W k` (both of width `units`). Memory is `(..., Tq, Tv, units)`.

    Args:
        query: `(..., Tq, units)` projected query.
        key: `(..., Tv, units)` projected key.
        v: `(units,)` weight vector.

    Returns:
        Scores `(..., Tq, Tv)`.
    """
    _check_widths("query", query.shape, "key", key.shape)
    hidden = ops.tanh(ops.expand_dims(query, -2) + ops.expand_dims(key, -3))
    return ops.einsum("...qku,u->...qk", hidden, v)  # (..., Tq, Tv)


def bilinear_score(query, key, kernel):
    """Bilinear score `s(q, k) = q^T W k` (Luong "general").

    Args:
        query: `(..., Tq, dq)` tensor.
        key: `(..., Tv, dk)` tensor; `dk` may differ from `dq`.
        kernel: `(dq, dk)` matrix `W`.

    Returns:
        Scores `(..., Tq, Tv)`.
    """
    kernel_shape = tuple(kernel.shape)
    if (
        query.shape[-1] is not None
        and key.shape[-1] is not None
        and kernel_shape != (query.shape[-1], key.shape[-1])
    ):
        raise ValueError(
            "`kernel` must have shape (query width, key width). Received: "
            f"kernel.shape={kernel_shape}, query.shape={tuple(query.shape)}, "
            f"key.shape={tuple(key.shape)}"
        )
    return ops.matmul(ops.matmul(query, kernel), _swap_last(key))


def _static_width(name, x):
    width = x.shape[-1]
    if width is None:
        raise ValueError(
            f"The last axis of `{name}` must be known to compute the default "
            f"scale. Received: {name}.shape={tuple(x.shape)}"
        )
    return width


# ---------------------------------------------------------------------------
# Normalize, dropout, combine
# ---------------------------------------------------------------------------


def masked_softmax(scores, mask=None, axis=-1):
    """Softmax over `axis` that gives masked positions exactly zero weight.

    The softmax is computed in float32 whatever the input dtype (so it cannot
    overflow under `mixed_float16`) and cast back to the input dtype. A row in
    which every position is masked gets all-zero weights, with zero (finite)
    gradients.

    Args:
        scores: float tensor.
        mask: boolean (or integer) tensor broadcastable to `scores`, `True` =
            keep. A float mask raises `TypeError`, a static shape that does
            not broadcast to the scores' `ValueError`.
        axis: axis to normalize over.

    Returns:
        Weights with the shape and dtype of `scores`.
    """
    logits = ops.cast(scores, "float32")
    if mask is None:
        return ops.cast(softmax(logits, axis=axis), scores.dtype)
    mask = as_bool_mask(mask)
    check_mask_broadcast(mask, scores.shape)
    weights = softmax(ops.where(mask, logits, _MASK_FILL), axis=axis)
    weights = ops.where(mask, weights, 0.0)
    return ops.cast(weights, scores.dtype)


def dropout_weights(weights, rate, training=False, seed=None):
    """Inverted dropout on attention weights in training; identity otherwise.

    Masked weights are zero before dropout and stay zero after it, so dropout
    can never reopen a masked position.
    """
    if not training or not rate:
        return weights
    return random.dropout(weights, rate, seed=seed)


def weighted_sum(weights, value):
    """`(..., Tq, Tv) x (..., Tv, dv) -> (..., Tq, dv)`: `sum_j w_ij v_j`.

    A zero weight contributes exactly nothing, even against a NaN or inf
    value: a plain matmul computes `0 * nan = nan`, and a non-finite value at
    a masked (padded, future) key would reach every row. The value rows
    holding a non-finite entry are zeroed, and the rows that give such a value
    a non-zero weight are set to NaN (all their channels): a non-finite value
    at a visible key still propagates, to the rows that see it. See
    `keras_attn.finite`; the weights must be non-negative, as softmax weights
    (after dropout) are.
    """
    value, _, flag = finite.zero_nonfinite(value)
    weights = ops.cast(weights, value.dtype)
    return finite.nan_where_seen(ops.matmul(weights, value), weights, flag)


IMPLEMENTATIONS = ("auto", "dense", "chunked")
# "auto" switches to the chunked path once the (..., Tq, Tv) scores would hold
# 2^28 values (1 GiB in float32; a dense training step keeps about three such
# tensors alive): e.g. 8 heads at B=1 from L=8192, at B=8 from L=2896.
# Below it the dense path is faster (measured 1.4-1.7x at L=4096-8192, B=1).
CHUNKED_MIN_SCORES = 2**28


def _check_attention_ranks(query, key, value):
    for name, x in (("query", query), ("key", key), ("value", value)):
        if len(x.shape) < 2:
            raise ValueError(
                f"`{name}` must have rank >= 2, `(..., length, width)`. "
                f"Received: {name}.shape={tuple(x.shape)}"
            )
    if not len(query.shape) == len(key.shape) == len(value.shape):
        raise ValueError(
            "`query`, `key` and `value` must have the same rank. Received: "
            f"query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}, "
            f"value.shape={tuple(value.shape)}"
        )


def _dropout_active(rate, training):
    return bool(rate) and not (training is None or training is False)


def choose_implementation(implementation, scores_shape, dropout_rate, training):
    """Resolves `"auto"` to `"dense"` or `"chunked"`; checks the name and dropout.

    Args:
        implementation: `"auto"`, `"dense"` or `"chunked"`.
        scores_shape: the static shape of the scores, `(..., Tq, Tv)`. With
            `Tq` or `Tv` unknown `"auto"` picks dense; unknown leading axes
            (the batch at trace time) count as 1.
        dropout_rate, training: the chunked path has no dropout, so
            `"auto"` picks dense while dropout is active and `"chunked"`
            raises.

    Returns:
        `"dense"`, or `"chunked"` (`"auto"`: when the scores would hold at
        least `CHUNKED_MIN_SCORES` values).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"`implementation` must be one of {IMPLEMENTATIONS}. "
            f"Received: implementation={implementation!r}"
        )
    dropout = _dropout_active(dropout_rate, training)
    if implementation == "chunked" and dropout:
        raise ValueError(
            "The chunked attention path has no dropout: use a dropout rate of 0, "
            "training=False, or implementation 'auto' or 'dense'. Received: dropout rate "
            f"{dropout_rate} with training={training}"
        )
    if implementation != "auto":
        return implementation
    # Known dims are ints; None (or a JAX symbolic dim, in `model.export`) is unknown.
    known = [d if isinstance(d, int) else None for d in scores_shape]
    if dropout or known[-1] is None or known[-2] is None:
        return "dense"
    size = math.prod(d for d in known if d is not None)
    return "chunked" if size >= CHUNKED_MIN_SCORES else "dense"


def attention(
    query,
    key,
    value,
    mask=None,
    is_causal=False,
    dropout_rate=0.0,
    scale=None,
    training=False,
    seed=None,
    implementation="dense",
    return_weights=True,
):
    """Scaled dot-product attention `softmax(q k^T * scale) v`, masks included.

    Args:
        query: `(..., Tq, dk)`.
        key: `(..., Tv, dk)`.
        value: `(..., Tv, dv)`.
        mask: boolean (or integer), broadcastable to `(..., Tq, Tv)`, `True` =
            attend. A float (additive) mask raises `TypeError`.
        is_causal: also apply `causal_mask(Tq, Tv)` (end-aligned).
        dropout_rate: dropout on the weights when `training`.
        scale: score multiplier; `None` means `1 / sqrt(dk)`.
        training: whether dropout is active.
        seed: a `keras.random.SeedGenerator` or int for the dropout.
        implementation: `"dense"` (the weights are computed and returned),
            `"chunked"` (`keras_attn.chunked.chunked_attention`: key blocks
            with an online softmax, memory `O(Tq)` per block instead of
            `O(Tq Tv)`; no weights, no dropout) or `"auto"` (chunked when
            the `(..., Tq, Tv)` scores would hold `CHUNKED_MIN_SCORES` values
            or more, both lengths known at trace time and no dropout active;
            dense otherwise).
        return_weights: `False` returns `None` for the weights and, on the
            dense path without active dropout, runs
            `keras_attn.fused.fused_attention` (same values; a written-out
            gradient and the mask as one bias make fewer passes over the
            `(Tq, Tv)` scores).

    Returns:
        `(output, weights)`: output `(..., Tq, dv)`, weights `(..., Tq, Tv)`,
        or `None` for the weights when the chunked path ran or
        `return_weights=False`. Rows with no visible key give zero weights
        and a zero output. A NaN or inf in a masked key or value never
        reaches the output; one at a visible key makes the rows that see it
        NaN (every path: see `keras_attn.finite`).

    Raises:
        ValueError: `query`, `key` and `value` of rank < 2 or of different
            ranks, a `mask` whose static shape does not broadcast to
            `(..., Tq, Tv)`, mismatched widths.
        TypeError: a float `mask`.

    Example:

    >>> q = keras.random.normal((2, 4, 8))
    >>> out, w = keras_attn.ops.attention(q, q, q, is_causal=True)
    >>> print(out.shape, w.shape)
    (2, 4, 8) (2, 4, 4)
    """
    _check_attention_ranks(query, key, value)
    scores_shape = (*query.shape[:-1], key.shape[-2])
    if mask is not None:
        mask = as_bool_mask(mask)
        check_mask_broadcast(mask, scores_shape)
    implementation = choose_implementation(implementation, scores_shape, dropout_rate, training)
    if implementation == "chunked":
        return chunked_attention(query, key, value, mask, is_causal, scale), None
    if not return_weights and not _dropout_active(dropout_rate, training):
        return fused_attention(query, key, value, mask, is_causal, scale), None
    # Non-finite keys too: a NaN key at a masked position is then not in the
    # gradient of the query either (dQ = dS K, and 0 * NaN = NaN).
    value, key, flag = finite.zero_nonfinite(value, key)
    scores = scaled_dot_score(query, key, scale=scale)
    if is_causal:
        mask = merge_masks(mask, causal_mask(ops.shape(query)[-2], ops.shape(key)[-2]))
    weights = masked_softmax(scores, mask)
    weights = dropout_weights(weights, dropout_rate, training=training, seed=seed)
    w = ops.cast(weights, value.dtype)
    output = finite.nan_where_seen(ops.matmul(w, value), w, flag)
    return output, weights if return_weights else None
