"""Functional core of keras-attn, written with `keras.ops` only.

Every attention layer in the library runs the same steps, and each step is a
function here:

    score -> mask -> normalize -> dropout -> combine

Shapes use `B` (batch), `Tq` (query length), `Tv` (key/value length), `dk`
(key width), `dv` (value width). Every function accepts any number of leading
batch axes (`(..., Tq, dk)`), so multi-head code can pass `(B, H, Tq, dk)`.

Masks are boolean, `True` means "may attend". A masked key gets exactly zero
weight, and a query row with no visible key gets all-zero weights (and so a zero
output), never NaN and never a uniform average over padding.
"""

import math

import numpy as np
from keras import ops, random

from keras_attn.chunked import chunked_attention
from keras_attn.fused import fused_attention

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
# Masks
# ---------------------------------------------------------------------------


def causal_mask(query_length, value_length=None, query_start=None):
    """Boolean `(Tq, Tv)` mask where query `i` sees keys `j <= query_start + i`.

    `query_start` defaults to `Tv - Tq`: with `Tq == Tv` this is the lower
    triangle, and with `Tq < Tv` the mask is aligned to the end, so the last
    `Tq` positions of a sequence of length `Tv` see exactly what they would
    see in a full pass. Cached decoding passes the cache index instead.
    """
    if value_length is None:
        value_length = query_length
    if query_start is None:
        query_start = value_length - query_length
    rows = ops.expand_dims(ops.arange(query_length), 1) + ops.cast(query_start, "int32")
    cols = ops.expand_dims(ops.arange(value_length), 0)
    return rows >= cols


def cache_mask(query_length, cache_length, cache_index, value_mask=None, use_causal_mask=True):
    """The keys a cached decoding step may see: `(1 or B, Tq, S)` bool.

    The `Tq` new tokens sit at positions `cache_index .. cache_index + Tq - 1`
    of a cache of length `S`. Positions not written yet are never visible;
    with `use_causal_mask` token `i` also sees only positions
    `<= cache_index + i`. `value_mask (B, Tq)` marks padding among the new
    tokens; earlier cache positions count as visible (right padding, the
    usual case, then gives exactly the full pass; for padding before the end
    pass an `attention_mask` over the whole cache instead).
    """
    if use_causal_mask:
        visible = causal_mask(query_length, cache_length, query_start=cache_index)
    else:
        written = ops.arange(cache_length) < ops.cast(cache_index, "int32") + query_length
        visible = ops.expand_dims(written, 0)  # (1, S)
    visible = ops.expand_dims(visible, 0)  # (1, Tq or 1, S)
    if value_mask is None:
        return visible
    value_mask = ops.cast(as_bool_mask(value_mask), "int32")  # (B, Tq)
    batch_ones = ops.ones((ops.shape(value_mask)[0], cache_length), "int32")
    index = ops.cast(cache_index, "int32")
    full = ops.slice_update(batch_ones, (ops.zeros((), "int32"), index), value_mask)  # (B, S)
    return ops.logical_and(visible, ops.expand_dims(ops.cast(full, "bool"), 1))


def merge_masks(*masks):
    """Logical AND of boolean masks that broadcast together; `None`s skipped.

    Returns `None` when every mask is `None`.
    """
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = as_bool_mask(mask)
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def as_bool_mask(mask):
    """Casts a mask to bool (`True`/nonzero = attend)."""
    if mask.dtype == "bool":
        return mask
    return ops.not_equal(mask, 0)


def compute_attention_mask(
    query_length,
    value_length,
    query_mask=None,
    value_mask=None,
    attention_mask=None,
    use_causal_mask=False,
):
    """Merges query, value, explicit and causal masks into one boolean mask.

    Args:
        query_length: `Tq` (int or scalar tensor).
        value_length: `Tv`.
        query_mask: `(B, Tq)` or `None`; `False` rows are padding.
        value_mask: `(B, Tv)` or `None`; `False` keys are padding.
        attention_mask: `(B, Tq, Tv)` or anything broadcastable to it.
        use_causal_mask: add `causal_mask(Tq, Tv)`.

    Returns:
        A rank-3 boolean mask, `(B, Tq, Tv)` or `(1, Tq, Tv)` (causal only),
        or `None` when there is nothing to mask.
    """
    q = None if query_mask is None else ops.expand_dims(as_bool_mask(query_mask), -1)
    v = None if value_mask is None else ops.expand_dims(as_bool_mask(value_mask), -2)
    c = ops.expand_dims(causal_mask(query_length, value_length), 0) if use_causal_mask else None
    return merge_masks(q, v, attention_mask, c)


def visible_rows(mask):
    """`(..., Tq, 1)` bool: whether each query row sees at least one key."""
    return ops.any(mask, axis=-1, keepdims=True)


def visible_query_rows(
    query_length,
    value_length,
    query_mask=None,
    value_mask=None,
    attention_mask=None,
    use_causal_mask=False,
):
    """`visible_rows(compute_attention_mask(...))` without the `(Tq, Tv)` mask.

    With only a query mask, a value mask and the causal mask, whether row `i`
    sees a key is `query_mask[i]` and "some visible key `j <= i + Tv - Tq`",
    read from a running count of the value mask: `O(Tq + Tv)`. An explicit
    `attention_mask` is already `(B, Tq, Tv)`, so then the masks are merged.

    Returns:
        Boolean `(B or 1, Tq or 1, 1)`, or `None` when every row sees a key.
    """
    if attention_mask is not None:
        mask = compute_attention_mask(
            query_length, value_length, query_mask, value_mask, attention_mask, use_causal_mask
        )
        return visible_rows(mask)
    seen = None
    if use_causal_mask:
        last = ops.arange(query_length) + ops.cast(value_length - query_length, "int32")
        if value_mask is None:
            seen = ops.expand_dims(last >= 0, 0)  # (1, Tq)
        else:
            counts = ops.cumsum(ops.cast(as_bool_mask(value_mask), "int32"), axis=-1)
            before = ops.take(counts, ops.clip(last, 0, value_length - 1), axis=-1)  # (B, Tq)
            seen = ops.logical_and(before > 0, ops.expand_dims(last >= 0, 0))
    elif value_mask is not None:
        seen = ops.any(as_bool_mask(value_mask), axis=-1, keepdims=True)  # (B, 1)
    if query_mask is not None:
        seen = merge_masks(seen, query_mask)
    return None if seen is None else ops.expand_dims(seen, -1)


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
        mask: boolean tensor broadcastable to `scores`, `True` = keep.
        axis: axis to normalize over.

    Returns:
        Weights with the shape and dtype of `scores`.
    """
    logits = ops.cast(scores, "float32")
    if mask is None:
        return ops.cast(ops.softmax(logits, axis=axis), scores.dtype)
    mask = as_bool_mask(mask)
    weights = ops.softmax(ops.where(mask, logits, _MASK_FILL), axis=axis)
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
    """`(..., Tq, Tv) x (..., Tv, dv) -> (..., Tq, dv)`: `sum_j w_ij v_j`."""
    return ops.matmul(ops.cast(weights, value.dtype), value)


IMPLEMENTATIONS = ("auto", "dense", "chunked")
# "auto" switches to the chunked path once the (..., Tq, Tv) scores would hold
# 2^28 values (1 GiB in float32; a dense training step keeps about three such
# tensors alive): e.g. 8 heads at B=1 from L=8192, at B=8 from L=2896.
# Below it the dense path is faster (measured 1.4-1.7x at L=4096-8192, B=1).
CHUNKED_MIN_SCORES = 2**28


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
    if dropout or scores_shape[-1] is None or scores_shape[-2] is None:
        return "dense"
    size = math.prod(d for d in scores_shape if d is not None)
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
        mask: boolean, broadcastable to `(..., Tq, Tv)`, `True` = attend.
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
        and a zero output.

    Example:

    >>> q = keras.random.normal((2, 4, 8))
    >>> out, w = keras_attn.ops.attention(q, q, q, is_causal=True)
    >>> print(out.shape, w.shape)
    (2, 4, 8) (2, 4, 4)
    """
    implementation = choose_implementation(
        implementation, (*query.shape[:-1], key.shape[-2]), dropout_rate, training
    )
    if implementation == "chunked":
        return chunked_attention(query, key, value, mask, is_causal, scale), None
    if not return_weights and not _dropout_active(dropout_rate, training):
        return fused_attention(query, key, value, mask, is_causal, scale), None
    scores = scaled_dot_score(query, key, scale=scale)
    if is_causal:
        mask = merge_masks(mask, causal_mask(ops.shape(query)[-2], ops.shape(key)[-2]))
    weights = masked_softmax(scores, mask)
    weights = dropout_weights(weights, dropout_rate, training=training, seed=seed)
    return weighted_sum(weights, value), weights if return_weights else None


def chosen_positions_mask(pointers, num_positions):
    """Mask for pointer decoding: step `i` may not point at `pointers[:, :i]`.

    Args:
        pointers: `(B, Tq)` integer positions chosen at each decoding step
            (the teacher-forced targets in training). Negative values are
            ignored (use them for padding).
        num_positions: `Tv`, the number of input positions.

    Returns:
        Boolean `(B, Tq, Tv)`: `False` where position `j` was already chosen
        at a step before `i`.
    """
    pointers = ops.convert_to_tensor(pointers)
    onehot = ops.one_hot(pointers, num_positions, dtype="int32")  # (B, Tq, Tv)
    # Exclusive running count over steps: chosen strictly before step i.
    chosen_before = ops.cumsum(onehot, axis=1) - onehot
    return ops.equal(chosen_before, 0)
