"""The fused dense kernel: the weights materialised once, a written-out gradient.

`fused_attention` computes the same `softmax(q k^T * scale) v` as
`keras_attn.kernels.dense_attention`, for calls that need neither the
weights nor dropout, in fewer passes over the `(..., Tq, Tv)` scores:

- the masked scores are replaced once (`keras_attn.masks.fill_masked`, a
  `where` with the mask's own shape, usually `(B, 1, 1, Tv)`), and once more
  in the backward pass (a masked score's weight is exactly 0, but `dO V^T`
  may be inf at a huge masked value); rows that see no key are zeroed on the
  `(..., Tq, dv)` output instead of the weights;
- the backward pass is written out: `dV = P^T dO`, `dP = dO V^T`,
  `dS = P * (dP - delta)`, `dQ = dS K`, `dK = dS^T Q` with, in float32,
  `delta = rowsum(dO * O)` (a `(Tq, dv)` pass instead of the softmax
  gradient's `rowsum(dP * P)` over `(Tq, Tv)`).

In float32, and in bfloat16 without a bias, `dP - delta` is taken inside
the matmul (`[dO, -delta] [V, 1]^T`, accumulated in float32 by the matmul):
`dS = P * ([dO, -delta] [V, 1]^T)`, a pass over `(..., Tq, Tv)` fewer than
`P * (dP - delta)`, and under `mixed_bfloat16` on the bfloat16 weights the
`P V` matmul read, with no float32 copy of `dP` or `dS` (the scores' backward
stays in bfloat16, half the bytes). On TensorFlow with oneDNN (the default on
x86), outside XLA, bfloat16 scores without a bias also skip the float32 copy in
the forward pass: oneDNN's softmax of bfloat16 computes in float32 and rounds
once, the float32 softmax's weights rounded, bit for bit (tested); 1.6x faster
forward at 2 x 8 x 2048 x 32. With a bias and in float16 (where `dO V^T`
could overflow before a float32 subtraction), `dP` is cast to float32 and
`delta` taken as `rowsum(dP * P)`, so that it cancels exactly against the
rounded `dP`.
"""

import keras
from keras import ops

from keras_attn import masks
from keras_attn._execution import is_eager, records_gradients
from keras_attn.kernels import bias as bias_lib
from keras_attn.kernels import finite
from keras_attn.kernels._gradient import custom_gradient
from keras_attn.kernels._shapes import default_scale, lengths, swap_last
from keras_attn.kernels.dense import softmax
from keras_attn.kernels.registry import Kernel, register


def fused_attention(query, key, value, spec):
    """`dense_attention(...)[0]` without dropout or weights, with a custom gradient.

    Args:
        query, key, value, spec: as `keras_attn.kernels.dense_attention`; a
            bias is evaluated whole (float32) and added to the scores, its
            gradient `dS` summed to the bias's shape.

    Returns:
        `(output, None)`: `(..., Tq, dv)` in the dtype of `value`; rows with
        no visible key are zero, with zero (finite) gradients. A NaN or inf
        key or value at a masked position changes nothing; at a visible one,
        the rows that see it are NaN (`keras_attn.kernels.finite`).

    Example:

    >>> from keras_attn import kernels
    >>> q = keras.random.normal((2, 3, 5, 8))
    >>> spec = kernels.AttentionSpec(is_causal=True, return_weights=False)
    >>> out, _ = kernels.fused_attention(q, q, q, spec)
    >>> ref, _ = kernels.dense_attention(q, q, q, spec)
    >>> print(out.shape, bool(keras.ops.max(keras.ops.abs(out - ref)) < 1e-5))
    (2, 3, 5, 8) True

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762; the backward pass as in Dao et al.,
        2022, "FlashAttention", https://arxiv.org/abs/2205.14135
    """
    query_length, value_length = lengths(query, key)
    mask = spec.whole_mask(query_length, value_length, constant=is_eager(query))
    q = ops.multiply(query, ops.cast(default_scale(query, spec.scale), query.dtype))  # Tq * dk
    value, key, flag = finite.zero_nonfinite(value, key)
    bias = spec.whole_bias(query, query_length, value_length)
    out = _attend(q, key, value, mask, flag, bias)
    if mask is not None and not spec.rows_visible(query_length, value_length):
        out = ops.where(masks.visible_rows(mask), out, ops.zeros_like(out))
    return out, None


def _forward(q, k, v, mask, flag, bias):
    """`(seen_out, out, probs, probs_low)`: the output (NaN on the rows that see a
    non-finite key or value, forward only), and what the backward pass reads."""
    scores = ops.matmul(q, swap_last(k))
    if bias is not None:
        scores = ops.cast(scores, "float32") + bias
    if bias is None and ops.dtype(v) == "bfloat16" and _native_bfloat16_softmax(scores):
        # The same weights as the float32 softmax rounded (computed in float32 inside the
        # op), without the float32 copies: the backward pass reads only `probs_low`.
        filled = ops.where(mask, scores, FILL_BFLOAT16) if mask is not None else scores
        probs = probs_low = softmax(filled, axis=-1)
    else:
        probs = softmax(masks.fill_masked(scores, mask), axis=-1)
        probs_low = ops.cast(probs, v.dtype)
    out = ops.matmul(probs_low, v)
    return finite.nan_where_seen(out, probs_low, flag), out, probs, probs_low


# The most negative finite bfloat16: a row of fills is a finite uniform row (zeroed after).
FILL_BFLOAT16 = -3.3895313892515355e38


def _native_bfloat16_softmax(scores) -> bool:
    """Whether `softmax` of bfloat16 `scores` computes in float32 inside the op and rounds
    once: TensorFlow's oneDNN softmax (on by default on x86; `TF_ENABLE_ONEDNN_OPTS=0` turns
    it off), outside XLA. Then its weights are those of a float32 softmax rounded to
    bfloat16, bit for bit (tested); elsewhere the kernel casts to float32 itself."""
    if ops.dtype(scores) != "bfloat16" or keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util
    from tensorflow.python.util import _pywrap_util_port

    graph = tf.compat.v1.get_default_graph()
    xla = not tf.executing_eagerly() and control_flow_util.GraphOrParentsInXlaContext(graph)
    return _pywrap_util_port.IsMklEnabled() and not xla


def _with_ones(x):
    """`[x, 1]`: `(..., T, d + 1)`."""
    return ops.concatenate([x, ops.ones_like(x[..., :1])], axis=-1)


def _attend(q, k, v, mask, flag, bias=None):
    """The custom-gradient pass over `(q, k, v)`, or `(q, k, v, bias)` with a bias."""
    if not records_gradients(q, k, v, bias):  # eager inference: the forward pass alone
        return _forward(q, k, v, mask, flag, bias)[0]
    inputs = (q, k, v) if bias is None else (q, k, v, bias)
    bias_shape = None if bias is None else tuple(bias.shape)

    def attend(q, k, v, *rest):
        *bias, mask, flag = rest
        # The forward pass on stopped inputs: an eager GradientTape would
        # otherwise record (and keep alive) every op in it, next to the
        # custom gradient that replaces them.
        q_, k_, v_ = (ops.stop_gradient(x) for x in (q, k, v))
        bias_ = ops.stop_gradient(bias[0]) if bias else None
        seen_out, out, probs, probs_low = _forward(q_, k_, v_, mask, flag, bias_)

        def grad(d_out):
            d_out = ops.cast(d_out, v.dtype)
            d_v = ops.matmul(swap_last(probs_low), d_out)
            # a name: `v.dtype` is torch.float32 on torch
            if ops.dtype(v) == "float32" or not bias and ops.dtype(v) == "bfloat16":
                # dP - delta inside the matmul's (float32) accumulator: [dO, -delta] [V, 1]^T
                delta = ops.sum(ops.cast(d_out, "float32") * ops.cast(out, "float32"), -1, True)
                minus = ops.concatenate([d_out, ops.cast(-delta, v.dtype)], axis=-1)
                weights = probs if ops.dtype(v) == "float32" else probs_low
                d_scores = weights * ops.matmul(minus, swap_last(_with_ones(v_)))
            else:  # rounded dP: subtract its own weighted mean, as the softmax gradient does
                d_probs = ops.cast(ops.matmul(d_out, swap_last(v_)), "float32")
                delta = ops.sum(d_probs * probs, axis=-1, keepdims=True)
                d_scores = probs * (d_probs - delta)
            # Replaced, not multiplied: P = 0 at a masked key, but dP = dO V^T may be
            # inf there (a huge masked value), and 0 * inf is NaN.
            if mask is not None:
                d_scores = ops.where(mask, d_scores, ops.zeros_like(d_scores))
            grads = ()
            if bias:
                grads = (bias_lib.sum_to_shape(d_scores, bias_shape),)
            d_scores = ops.cast(d_scores, q.dtype)
            return (ops.matmul(d_scores, k_), ops.matmul(swap_last(d_scores), q_), d_v) + grads

        return seen_out, grad

    return custom_gradient(attend, inputs, (mask, flag))


FUSED = Kernel(
    name="fused",
    run=fused_attention,
    weights=False,
    dropout=False,
    normalize=False,
    scores=("dot",),
    memory="O(Tq Tv), fewer passes",
    auto_rank=2,
)
register(FUSED)
