"""Attention biases that are functions of positions: ALiBi and T5's relative position bias.

A position bias is a layer that returns `bias[h, i, j] = f(query_position_i,
key_position_j)` added to the attention scores. Pass one to
`keras_attn.MultiHeadAttention(position_bias=...)` (or to
`keras_attn.ops.attention(bias=...)`): each kernel evaluates it where it needs
it, the chunked kernel one key block at a time (so a 32k-token sequence never
forms a `(32k, 32k)` bias), a cached decoding step at the cache's positions
(so step-by-step decoding equals the full pass). The query positions are
those of the causal mask: `query_start + i`, end-aligned (`Tv - Tq`) when
`Tq != Tv`.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_attn import masks
from keras_attn._typing import InitializerLike, Length, TensorLike
from keras_attn.arguments import check_positive_int, check_positive_number


def check_position_bias(layer, num_heads):
    """`layer` if it is a position bias for `num_heads` query heads, else an error.

    `None` passes. `TypeError` unless `layer` is a layer with a `position_bias`
    method (a `PositionBias`, or a layer written as one); `ValueError` unless
    it gives one bias per query head (`check_heads`).
    """
    if layer is not None and (
        not isinstance(layer, keras.layers.Layer) or not hasattr(layer, "position_bias")
    ):
        raise TypeError(
            "`position_bias` must be None or a layer such as keras_attn.AlibiBias(). "
            f"Received: position_bias={layer!r}"
        )
    check_heads(layer, num_heads)
    return layer


def check_heads(bias, num_heads):
    """`ValueError` unless the position bias `bias` gives one bias per query head.

    A bias with heads of its own (`bias.num_heads`: a learned table, as
    `RelativePositionBias`) must have `num_heads`; one without them (ALiBi's
    slopes follow the scores' heads), or an unknown `num_heads` (`None`), passes.
    """
    bias_heads = getattr(bias, "num_heads", None)
    if bias_heads is not None and num_heads is not None and bias_heads != num_heads:
        raise ValueError(
            "`position_bias` must have one bias per query head. Received: "
            f"position_bias.num_heads={bias_heads}, num_heads={num_heads}"
        )


class PositionBias(keras.layers.Layer):
    """Base class of the position biases: `bias = f(query positions, key positions)`.

    A subclass implements `position_bias` (a pure function of the positions
    and of its parameters, so that the chunked kernel's custom gradient can
    pass the parameters in) and, when it has weights, `bias_parameters` and
    `position_bias_gradient` (the gradient of its parameters from `dS`, for
    the chunked kernel's backward pass; the dense kernels differentiate
    `position_bias` directly). Register a subclass with
    `keras.saving.register_keras_serializable` to save models that use it.

    Call arguments:
        attention_scores: `(B, h, Tq, Tv)` scores; the layer returns them
            plus the bias (keras-hub's `AlibiBias` convention), at query
            positions `query_start + i`.
        query_start: the position of the first query; `None` means
            `Tv - Tq` (end-aligned).
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def bias_parameters(self):
        """The weights `position_bias` reads, as tensors (none by default)."""
        return ()

    def position_bias(self, query_positions, key_positions, parameters=(), num_heads=None):
        """Float32 `(h or 1, Tq, Tk)` from int32 positions `(Tq,)` and `(Tk,)`."""
        raise NotImplementedError

    def position_bias_gradient(self, d_bias, query_positions, key_positions, parameters):
        """Gradients of `parameters` given `d_bias`, the gradient of one `position_bias` block."""
        return ()

    def bias(
        self,
        query_length: Length,
        key_length: Length,
        num_heads: int | None = None,
        query_start: Length | None = None,
    ) -> TensorLike:
        """The whole `(h or 1, Tq, Tv)` float32 bias (end-aligned queries by default)."""
        query_positions = masks.query_positions(query_length, key_length, query_start)
        return self.position_bias(
            query_positions,
            masks.key_positions(key_length),
            self.bias_parameters(),
            num_heads=num_heads,
        )

    def call(self, attention_scores: TensorLike, query_start: Length | None = None) -> TensorLike:
        shape = attention_scores.shape
        if len(shape) != 4:
            raise ValueError(
                "`attention_scores` must have shape (batch_size, num_heads, query_length, "
                f"key_length). Received: attention_scores.shape={tuple(shape)}"
            )
        dynamic = ops.shape(attention_scores)
        bias = self.bias(dynamic[-2], dynamic[-1], num_heads=shape[1], query_start=query_start)
        return ops.add(attention_scores, ops.cast(bias[None], attention_scores.dtype))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)


def alibi_slopes(num_heads: int, alibi_bias_max: float = 8) -> np.ndarray:
    """ALiBi's per-head slopes `m_h` (Press et al.), as a float64 NumPy array.

    For `h` a power of two, the geometric sequence `r, r^2, ..., r^h` with
    `r = 2^(-alibi_bias_max / h)`; otherwise the slopes of the largest power
    of two below `h`, then every other slope of twice that many.
    """

    def powers_of_two(n):
        start = 2.0 ** (-alibi_bias_max / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(num_heads).is_integer():
        return np.array(powers_of_two(num_heads))
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = alibi_slopes(2 * closest, alibi_bias_max)[0::2][: num_heads - closest]
    return np.concatenate([powers_of_two(closest), extra])


@keras.saving.register_keras_serializable(package="keras_attn")
class AlibiBias(PositionBias):
    """Attention with Linear Biases (ALiBi): `bias[h, i, j] = -m_h |p_i - j|`.

    A fixed (not learned) penalty growing linearly with the distance between
    the query position `p_i` and the key position `j`, with one slope `m_h`
    per head (`alibi_slopes`: a geometric sequence from
    `2^(-alibi_bias_max / h)`). Under a causal mask (`j <= p_i`) this is the
    paper's `-m_h (p_i - j)`; without one the penalty is symmetric. No
    position embedding is needed, and models extrapolate to longer
    sequences than they were trained on.

    Two forms, one per use:

    - passed to a layer (`keras_attn.MultiHeadAttention(position_bias=
      AlibiBias())`, the blocks, `ops.attention(bias=...)`): the bias above,
      `-m_h |p_i - j|` (`bias()`), which the kernels evaluate per key block
      and at a cache's positions;
    - called on scores, as keras-hub's `AlibiBias`: keras-hub's values,
      `scores - m_h (Tv - 1 - j)` on every query row (the bias of the last
      position, whatever the row). Under a causal mask both give the same
      attention weights (they differ by a constant per row, which the softmax
      cancels); without one they differ.

    Args:
        alibi_bias_max: the exponent range of the slopes (keras-hub's name);
            8 in the paper.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        attention_scores: `(B, h, Tq, Tv)`.

    Returns:
        `attention_scores - m_h (Tv - 1 - j)` (keras-hub's values), same shape
        and dtype.

    Example:

    >>> scores = keras.ops.zeros((1, 2, 1, 3))
    >>> print(keras.ops.convert_to_numpy(keras_attn.AlibiBias()(scores))[0, :, 0].tolist())
    [[-0.125, -0.0625, 0.0], [-0.0078125, -0.00390625, 0.0]]
    >>> bias = keras_attn.AlibiBias().bias(2, 3, num_heads=1)  # in a layer: -m |p_i - j|
    >>> print(keras.ops.convert_to_numpy(bias).tolist())
    [[[-0.00390625, -0.0, -0.00390625], [-0.0078125, -0.00390625, -0.0]]]

    Reference:
        Press, Smith & Lewis, 2022, "Train Short, Test Long: Attention with
        Linear Biases Enables Input Length Extrapolation",
        https://arxiv.org/abs/2108.12409
    """

    def __init__(self, alibi_bias_max: float = 8, **kwargs):
        super().__init__(**kwargs)
        self.alibi_bias_max = check_positive_number("alibi_bias_max", alibi_bias_max)

    def position_bias(self, query_positions, key_positions, parameters=(), num_heads=None):
        if num_heads is None:
            raise ValueError("AlibiBias needs the number of heads: pass `num_heads`.")
        slopes = ops.convert_to_tensor(
            alibi_slopes(int(num_heads), self.alibi_bias_max), "float32"
        )[:, None, None]
        distance = ops.abs(query_positions[:, None] - key_positions[None, :])
        return -slopes * ops.cast(distance, "float32")[None]

    def call(self, attention_scores: TensorLike) -> TensorLike:
        """keras-hub's values: the bias of the last query position on every row."""
        shape = attention_scores.shape
        if len(shape) != 4:
            raise ValueError(
                "`attention_scores` must have shape (batch_size, num_heads, query_length, "
                f"key_length). Received: attention_scores.shape={tuple(shape)}"
            )
        key_length = ops.shape(attention_scores)[-1]
        bias = self.bias(1, key_length, num_heads=shape[1])  # (h, 1, Tv): query at Tv - 1
        return ops.add(attention_scores, ops.cast(bias[None], attention_scores.dtype))

    def get_config(self):
        config = super().get_config()
        config["alibi_bias_max"] = self.alibi_bias_max
        return config


def relative_position_bucket(
    relative_position: TensorLike,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> TensorLike:
    """T5's bucket of `relative_position = key position - query position` (int32 tensor).

    Half the buckets (all of them when not `bidirectional`, where only
    `key <= query` gets distinct buckets) hold exact distances up to
    `num_buckets / 4` (`/ 2` unidirectional); the rest are logarithmically
    spaced up to `max_distance`, beyond which the distance shares the last
    bucket.
    """
    n = -relative_position
    bucket = ops.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        bucket = ops.where(n < 0, num_buckets, 0)
        n = ops.abs(n)
    else:
        n = ops.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    log_ratio = ops.log(ops.maximum(ops.cast(n, "float32"), 1.0) / max_exact) / math.log(
        max_distance / max_exact
    )
    large = max_exact + ops.cast(log_ratio * (num_buckets - max_exact), "int32")
    large = ops.minimum(large, num_buckets - 1)
    return bucket + ops.where(is_small, n, large)


@keras.saving.register_keras_serializable(package="keras_attn")
class RelativePositionBias(PositionBias):
    """T5's learned relative position bias: `bias[h, i, j] = table[bucket(j - p_i), h]`.

    One learned scalar per head and per bucket of the relative position
    `j - p_i` (`relative_position_bucket`: exact for small distances,
    logarithmic up to `max_distance`). T5 shares one such layer across the
    layers of a stack and uses no other position information; its
    attention has no `1/sqrt(d)` scaling, which `MultiHeadAttention` keeps
    (the bias is added to the scaled scores).

    Args:
        num_heads: number of heads `h` (the table is `(num_buckets, h)`).
        num_buckets: 32 in T5.
        max_distance: 128 in T5.
        bidirectional: `True` for an encoder (keys before and after the query
            get separate buckets); `False` for a causal decoder.
        embeddings_initializer: of the table.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        attention_scores: `(B, h, Tq, Tv)`.
        query_start: see `PositionBias`.

    Returns:
        `attention_scores + bias`, same shape and dtype.

    Example:

    >>> bias = keras_attn.RelativePositionBias(num_heads=4, bidirectional=False)
    >>> mha = keras_attn.MultiHeadAttention(num_heads=4, key_dim=8, position_bias=bias)
    >>> x = keras.random.normal((2, 10, 32))
    >>> print(mha(x, x, use_causal_mask=True).shape, bias.bias(10, 10).shape)
    (2, 10, 32) (4, 10, 10)

    Reference:
        Raffel et al., 2020, "Exploring the Limits of Transfer Learning with a
        Unified Text-to-Text Transformer", https://arxiv.org/abs/1910.10683
        (section 2.1); Shaw, Uszkoreit & Vaswani, 2018,
        https://arxiv.org/abs/1803.02155
    """

    def __init__(
        self,
        num_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        embeddings_initializer: InitializerLike = "zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.num_buckets = check_positive_int("num_buckets", num_buckets)
        self.max_distance = check_positive_int("max_distance", max_distance)
        max_exact = self.num_buckets // (4 if bidirectional else 2)  # exact distances
        if max_exact < 1 or self.max_distance <= max_exact:
            raise ValueError(
                "`num_buckets` must leave at least one exact bucket (>= 4 bidirectional, "
                ">= 2 otherwise) and `max_distance` must exceed the exact range "
                f"({max(max_exact, 1)}). Received: num_buckets={num_buckets}, "
                f"max_distance={max_distance}, bidirectional={bidirectional}"
            )
        self.bidirectional = bool(bidirectional)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.table = self.add_weight(
            shape=(self.num_buckets, self.num_heads),
            initializer=self.embeddings_initializer,
            name="relative_attention_bias",
        )

    def bias_parameters(self):
        # A tensor, not the variable: the chunked kernel passes it into its custom
        # gradient (TensorFlow refuses variables read inside one).
        return (ops.copy(self.table),)

    def _buckets(self, query_positions, key_positions):
        relative = key_positions[None, :] - query_positions[:, None]  # (Tq, Tk)
        return relative_position_bucket(
            relative, self.bidirectional, self.num_buckets, self.max_distance
        )

    def position_bias(self, query_positions, key_positions, parameters=(), num_heads=None):
        check_heads(self, num_heads)
        table = ops.cast(parameters[0] if parameters else self.table, "float32")
        values = ops.take(table, self._buckets(query_positions, key_positions), axis=0)
        return ops.transpose(values, (2, 0, 1))  # (h, Tq, Tk)

    def position_bias_gradient(self, d_bias, query_positions, key_positions, parameters):
        if d_bias.shape[0] != self.num_heads:  # single-head scores (B, Tq, Tk)
            d_bias = ops.sum(d_bias, axis=0, keepdims=True)
        d = ops.reshape(ops.transpose(d_bias, (1, 2, 0)), (-1, d_bias.shape[0]))  # (Tq Tk, h)
        ids = ops.reshape(self._buckets(query_positions, key_positions), (-1,))
        grad = ops.segment_sum(d, ids, num_segments=self.num_buckets)
        return (ops.broadcast_to(grad, (self.num_buckets, self.num_heads)),)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "num_buckets": self.num_buckets,
                "max_distance": self.max_distance,
                "bidirectional": self.bidirectional,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            }
        )
        return config
