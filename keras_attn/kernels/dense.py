"""The reference kernel: scores, masked softmax, dropout, weighted sum; the weights are returned.

`dense_attention` is the kernel every other one is tested against, and the
only one that returns the `(..., Tq, Tv)` weights or applies dropout to them.
`masked_softmax` is the normalization of every attention layer.
"""

from keras import ops

from keras_attn import masks
from keras_attn.kernels import bias as bias_lib
from keras_attn.kernels import finite
from keras_attn.kernels._shapes import default_scale, swap_last


def softmax(x, axis=-1):
    """`keras.ops.softmax`; on an axis of size 1 (one key: a decoder's first step) `exp(x - x)`.

    The same values (1, or NaN where `x` is NaN or infinite) and gradient (0),
    without the warning Keras gives for a softmax over a single element.
    """
    if x.shape[axis] == 1:
        return ops.exp(x - x)
    return ops.softmax(x, axis=axis)


def masked_softmax(scores, mask=None, axis=-1):
    """Softmax over `axis` that gives masked positions exactly zero weight.

    The masked scores are replaced (`keras_attn.masks.fill_masked`) before the
    softmax, whatever they hold, and the softmax is computed in float32
    whatever the input dtype (so it cannot overflow under `mixed_float16`),
    then cast back to the input dtype. A row in which every position is
    masked gets all-zero weights, with zero (finite) gradients.

    Args:
        scores: float tensor.
        mask: boolean (or integer) tensor broadcastable to `scores`, `True` =
            keep. A float mask raises `TypeError`, a static shape that does
            not broadcast to the scores' `ValueError`.
        axis: axis to normalize over.

    Returns:
        Weights with the shape and dtype of `scores`.
    """
    mask = masks.as_bool_mask(mask)
    if mask is not None:
        masks.check_mask_broadcast(mask, scores.shape)
    weights = softmax(masks.fill_masked(scores, mask), axis=axis)
    if mask is not None:
        weights = ops.where(mask, weights, 0.0)
    return ops.cast(weights, scores.dtype)


def dense_attention(
    query,
    key,
    value,
    mask=None,
    is_causal=False,
    query_start=None,
    scale=None,
    dropout=None,
    window=None,
    bias=None,
):
    """`softmax(q k^T * scale) v` with the weights materialised and returned.

    The kernel signature (shared by `fused_attention` and `chunked_attention`):

    Args:
        query: `(..., Tq, dk)`.
        key: `(..., Tv, dk)`, with the leading axes of `query`.
        value: `(..., Tv, dv)`, with the leading axes of `query`.
        mask: boolean, broadcastable to `(..., Tq, Tv)`, `True` = attend.
        is_causal: query `i` sees keys `j <= query_start + i` only.
        query_start: the position of the first query among the keys
            (`keras_attn.masks.causal_mask`); `None` means `Tv - Tq` (end-aligned).
        scale: score multiplier; `None` means `1 / sqrt(dk)`.
        dropout: `None`, or a function applied to the weights (dense only).
        window: `None`, or a positive int: query `i` also sees only keys `j`
            with `|query_start + i - j| < window` (`keras_attn.masks.window_mask`).
        bias: `None` or a `keras_attn.kernels.bias.Bias` (from
            `keras_attn.kernels.bias.as_bias`): added to the scaled scores
            (float32) before the softmax.

    Returns:
        `(output, weights)`: `(..., Tq, dv)` in the dtype of `value` and
        `(..., Tq, Tv)` in the dtype of the scores. Rows with no visible key
        give zero weights and a zero output. A NaN or inf key or value at a
        masked position changes nothing; at a visible one, the rows that see
        it are NaN (`keras_attn.kernels.finite`); the non-finite keys are
        zeroed too, so a masked NaN key is in no gradient (`dQ = dS K`).
    """
    value, key, flag = finite.zero_nonfinite(value, key)
    # Tq * dk multiplies, not Tq * Tv (ops.multiply: `query` may be a NumPy array)
    q = ops.multiply(query, ops.cast(default_scale(query, scale), query.dtype))
    scores = ops.matmul(q, swap_last(key))  # (..., Tq, Tv)
    query_length, value_length = ops.shape(query)[-2], ops.shape(key)[-2]
    positions = masks.position_mask(query_length, value_length, is_causal, window, query_start)
    mask = masks.merge_masks(mask, positions)
    if bias is not None:  # in float32: a bias on float16 scores could overflow
        bias = bias.full(
            bias_lib.query_positions(query_length, value_length, query_start),
            bias_lib.key_positions(value_length),
            bias_lib.num_heads_of(query),
        )
        scores = ops.cast(scores, "float32") + bias
    weights = ops.cast(masked_softmax(scores, mask), query.dtype)
    if dropout is not None:
        weights = dropout(weights)
    w = ops.cast(weights, value.dtype)
    return finite.nan_where_seen(ops.matmul(w, value), w, flag), weights
