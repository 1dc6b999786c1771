"""Fast dense paths: an attention core with a written-out gradient, matmul projections.

`fused_attention` is dense attention for calls that do not need the weights.
It computes the same `softmax(q k^T * scale + bias) v` as
`keras_attn.ops.attention`, with the `(..., Tq, Tv)` weights materialised
once, but makes fewer passes over them:

- the mask becomes an additive bias on the mask's own shape (usually
  `(B, 1, 1, Tv)` or `(B, 1, Tq, Tv)`, no head axis) and is added once,
  instead of a `where` before the softmax, a `where` after it and both
  `where`s again in the backward pass; rows that see no key are zeroed on
  the `(..., Tq, dv)` output instead of the weights;
- the backward pass is written out: `dV = P^T dO`, `dP = dO V^T`,
  `dS = P * (dP - delta)`, `dQ = dS K`, `dK = dS^T Q` with, in float32,
  `delta = rowsum(dO * O)` (a `(Tq, dv)` pass instead of the softmax
  gradient's `rowsum(dP * P)` over `(Tq, Tv)`).

Under mixed precision the matmuls run in the input dtype (bf16 on AMX) and
the softmax in float32, as on the dense path; `delta` is then taken as
`rowsum(dP * P)` so that it cancels exactly against the rounded `dP`.

`MatmulEinsumDense` is the `EinsumDense` of the multi-head projections run as
one 2-D matmul.
"""

import math

import keras
from keras import ops

from keras_attn import finite

# Bias of masked scores (float32): exp(s + _FILL - max) is exactly 0, and
# unlike the most negative float32, s + _FILL cannot overflow to -inf.
_FILL = -1e30


def _swap_last(x):
    rank = len(x.shape)
    return ops.transpose(x, list(range(rank - 2)) + [rank - 1, rank - 2])


def softmax(x, axis=-1):
    """`keras.ops.softmax`; on an axis of size 1 (one key: a decoder's first step) `exp(x - x)`.

    The same values (1, or NaN where `x` is NaN or infinite) and gradient (0),
    without the warning Keras gives for a softmax over a single element.
    """
    if x.shape[axis] == 1:
        return ops.exp(x - x)
    return ops.softmax(x, axis=axis)


def fused_attention(query, key, value, mask=None, is_causal=False, scale=None):
    """`keras_attn.ops.attention(...)[0]` without dropout or weights, with a custom gradient.

    `output_i = sum_j softmax_j(q_i . k_j * scale + bias_ij) v_j`, bias 0 where
    visible and -1e30 where masked.

    Args:
        query: `(..., Tq, dk)`.
        key: `(..., Tv, dk)`, with the same leading axes as `query`.
        value: `(..., Tv, dv)`, with the same leading axes.
        mask: boolean, broadcastable to `(..., Tq, Tv)`, `True` = attend.
        is_causal: query `i` sees keys `j <= i + Tv - Tq`.
        scale: score multiplier; `None` means `1 / sqrt(dk)`.

    Returns:
        `(..., Tq, dv)` in the dtype of `value`; rows with no visible key
        are zero, with zero (finite) gradients. A NaN or inf key or value at
        a masked position changes nothing; at a visible one, the rows that
        see it are NaN (`keras_attn.finite`).

    Example:

    >>> q = keras.random.normal((2, 3, 5, 8))
    >>> out = keras_attn.fused.fused_attention(q, q, q, is_causal=True)
    >>> ref, _ = keras_attn.ops.attention(q, q, q, is_causal=True)
    >>> print(out.shape, bool(keras.ops.max(keras.ops.abs(out - ref)) < 1e-5))
    (2, 3, 5, 8) True

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762; the backward pass as in Dao et al.,
        2022, "FlashAttention", https://arxiv.org/abs/2205.14135
    """
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if is_causal:
        tq, tv = ops.shape(query)[-2], ops.shape(key)[-2]
        rows = ops.expand_dims(ops.arange(tq) + (tv - tq), 1)
        causal = rows >= ops.expand_dims(ops.arange(tv), 0)  # (Tq, Tv)
        mask = causal if mask is None else ops.logical_and(mask, causal)
    bias = visible = None
    if mask is not None:
        mask = mask if mask.dtype == "bool" else ops.not_equal(mask, 0)
        bias = ops.where(mask, 0.0, _FILL)  # float32, on the mask's shape
        visible = ops.any(mask, axis=-1, keepdims=True)  # (..., Tq, 1)
    q = query * ops.cast(scale, query.dtype)  # scaling Tq * dk values, not Tq * Tv
    value, key, flag = finite.zero_nonfinite(value, key)
    out = _attend(q, key, value, bias, flag)
    return out if visible is None else ops.where(visible, out, ops.zeros_like(out))


def _attend(q, k, v, bias, flag):
    @ops.custom_gradient
    def attend(q, k, v):
        scores = ops.cast(ops.matmul(q, _swap_last(k)), "float32")
        probs = softmax(scores if bias is None else scores + bias, axis=-1)
        probs_low = ops.cast(probs, v.dtype)
        out = ops.matmul(probs_low, v)
        # NaN on the rows that see a non-finite key or value (forward only: the
        # backward pass runs on the zeroed ones).
        seen_out = finite.nan_where_seen(out, probs_low, flag)

        def grad(*args, upstream=None):
            d_out = args[0] if upstream is None else upstream
            d_out = ops.cast(d_out, v.dtype)
            d_v = ops.matmul(_swap_last(probs_low), d_out)
            d_probs = ops.cast(ops.matmul(d_out, _swap_last(v)), "float32")
            if v.dtype == "float32":
                delta = ops.sum(d_out * out, axis=-1, keepdims=True)  # (..., Tq, 1)
            else:  # rounded dP: subtract its own weighted mean, as the softmax gradient does
                delta = ops.sum(d_probs * probs, axis=-1, keepdims=True)
            d_scores = ops.cast(probs * (d_probs - delta), q.dtype)
            return ops.matmul(d_scores, k), ops.matmul(_swap_last(d_scores), q), d_v

        return seen_out, grad

    return attend(q, k, v)


class MatmulEinsumDense(keras.layers.EinsumDense):
    """An `EinsumDense` contracting the last `n` input axes, run as one 2-D matmul.

    `"btd,dhk->bthk"` is `(B T, d) x (d, h k)` and `"bthk,hko->bto"` is
    `(B T, h k) x (h k, o)`: the same kernel, bias and weight layout as the
    `EinsumDense` (and Keras' multi-head attention), but a plain matmul whose
    gradients are plain matmuls too, where TF's einsum transposes. Measured
    on a whole MHA training step: 5-15 % faster. A quantized layer keeps
    `EinsumDense.call`.
    """

    def __init__(self, equation, contract_axes, **kwargs):
        super().__init__(equation, **kwargs)
        self.contract_axes = contract_axes

    def quantize(self, mode=None, type_check=True, config=None):
        # EinsumDense refuses subclasses; quantized, this layer runs EinsumDense.call.
        super().quantize(mode, type_check=False, config=config)

    def call(self, inputs, training=None):
        if self.quantization_mode is not None:
            return super().call(inputs, training=training)
        n = self.contract_axes
        kernel = ops.cast(self.kernel, self.compute_dtype)
        inner, outer = kernel.shape[:n], kernel.shape[n:]
        flat = (math.prod(inner), math.prod(outer))
        y = ops.matmul(ops.reshape(inputs, (-1, flat[0])), ops.reshape(kernel, flat))
        if self.bias is not None:
            y = y + ops.reshape(ops.cast(self.bias, self.compute_dtype), (flat[1],))
        lead = [ops.shape(inputs)[i] for i in range(len(inputs.shape) - n)]
        return ops.reshape(y, (*lead, *outer))
