"""The reference kernel: scores, masked softmax, dropout, weighted sum; the weights are returned.

`dense_attention` is the kernel every other one is tested against, and the
only one that returns the `(..., Tq, Tv)` weights or applies dropout to them.
`masked_softmax` is the normalization of every attention layer.
"""

from keras import ops, random

from keras_attn import masks
from keras_attn._execution import is_eager
from keras_attn.kernels import finite
from keras_attn.kernels._shapes import default_scale, lengths, swap_last
from keras_attn.kernels.registry import Kernel, register


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
            keep; a float mask of 0s and 1s is read as Keras reads it (1 =
            keep). A float mask holding other values (an additive 0 / -1e9
            mask) raises `ValueError` when its values are known, and is read
            as `mask > 0.5` when traced (`keras_attn.masks.float_mask_as_bool`);
            a static shape that does not broadcast to the scores raises
            `ValueError`.
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


def dense_attention(query, key, value, spec):
    """`softmax(s(q, k) + bias) v` with the weights materialised and returned.

    The reference kernel: every call the others run, it runs too, and it is
    the only one with the weights, dropout, a custom normalization
    (`spec.normalize`) and any score (`spec.score`).

    Args:
        query: `(..., Tq, dk)`.
        key: `(..., Tv, dk)`, with the leading axes of `query`.
        value: `(..., Tv, dv)`, with the leading axes of `query`.
        spec: the `keras_attn.kernels.AttentionSpec` of the call.

    Returns:
        `(output, weights)`: `(..., Tq, dv)` in the dtype of `value` and
        `(..., Tq, Tv)` in the dtype of the query. Rows with no visible key
        give zero weights and a zero output. A NaN or inf key or value at a
        masked position changes nothing; at a visible one, the rows that see
        it are NaN (`keras_attn.kernels.finite`); the non-finite keys are
        zeroed too, so a masked NaN key is in no gradient (`dQ = dS K`).
    """
    value, key, flag = finite.zero_nonfinite(value, key)
    if spec.score is None:
        # Tq * dk multiplies, not Tq * Tv (ops.multiply: `query` may be a NumPy array)
        q = ops.multiply(query, ops.cast(default_scale(query, spec.scale), query.dtype))
        scores = ops.matmul(q, swap_last(key))  # (..., Tq, Tv)
    else:
        scores = spec.score.pairwise(query, key, spec.score.score_parameters())
    if spec.score is not None or spec.normalize is not None:
        # A non-finite key or value was zeroed: its score is NaN, so that the rows that
        # see it are NaN whatever the score or the normalization makes of it (a selection).
        scores = finite.nan_scores_where_flagged(
            scores, None if flag is None else ops.cast(flag, scores.dtype)
        )
    query_length, value_length = lengths(query, key)
    mask = spec.whole_mask(query_length, value_length, constant=is_eager(query))
    bias = spec.whole_bias(query, query_length, value_length)
    if bias is not None:  # in float32: a bias on float16 scores could overflow
        scores = ops.cast(scores, "float32") + bias
    normalize = masked_softmax if spec.normalize is None else spec.normalize
    weights = ops.cast(normalize(scores, mask), query.dtype)
    if spec.dropout:
        weights = random.dropout(weights, spec.dropout_rate, seed=spec.seed)
    w = ops.cast(weights, value.dtype)
    return finite.nan_where_seen(ops.matmul(w, value), w, flag), weights


DENSE = Kernel(
    name="dense",
    run=dense_attention,
    weights=True,
    dropout=True,
    normalize=True,
    scores=("dot", "blockwise", "any"),
    memory="O(Tq Tv)",
    auto_rank=3,
)
register(DENSE)
