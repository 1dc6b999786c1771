"""`ScoreAttention`: the one attention pipeline every layer runs.

    project -> score -> mask -> normalize -> dropout -> combine -> project output

A mechanism overrides one step: its score (a `keras_attn.scores` layer), its
projections (`KeyValueAttention`), its normalization (`HardAttention`) or its
combine (`PointerAttention`). Mask math lives in `keras_attn.masks`, argument
checks in `keras_attn.arguments`.
"""

import keras
from keras import ops as kops

from keras_attn import masks, scores
from keras_attn import ops as attn_ops
from keras_attn._typing import TensorLike
from keras_attn.arguments import check_dim, check_floating, check_rank, check_rate
from keras_attn.kernels import bias as kernel_bias
from keras_attn.kernels import finite
from keras_attn.masks import check_mask_dtype


class QueryMaskOutput:
    """Mixin: the output mask of an attention layer is its query mask, implicit or explicit.

    Keras gives an output the implicit mask of the first input only; a
    `query_mask` passed as an argument would be lost, and a downstream layer
    (`AttentionPooling`, a loss) would weigh padded rows. `call` hands the
    mask it used to `set_output_mask`; `compute_mask`, which Keras calls right
    after `call` (eager, traced or symbolic), returns it.
    """

    def set_output_mask(self, query_mask):
        self._output_mask = None if query_mask is None else masks.as_bool_mask(query_mask)

    def compute_mask(self, inputs, previous_mask=None):
        mask = getattr(self, "_output_mask", None)
        self._output_mask = None
        return previous_mask if mask is None else mask


def check_input_shapes(query_shape, value_shape, key_shape=None):
    """Checks the shapes `build` receives; returns `(query_shape, key_shape)`.

    A rank-2 query shape `(B, dq)` comes back as `(B, 1, dq)`, and a missing
    key shape as the value shape.
    """
    key_shape = value_shape if key_shape is None else key_shape
    check_rank("query", query_shape, (2, 3))
    check_rank("value", value_shape, (3,))
    check_rank("key", key_shape, (3,))
    check_dim("key", key_shape[1], "value", value_shape[1], "length (axis 1)")
    check_dim("query", query_shape[0], "value", value_shape[0], "batch size")
    if len(query_shape) == 2:
        query_shape = (query_shape[0], 1, query_shape[1])
    return tuple(query_shape), tuple(key_shape)


def prepare_query(query, value, query_mask, value_mask, attention_mask, key=None, value_shape=None):
    """The checks every attention layer's `call` starts with, and the rank-2 query.

    The inputs must be floating point. Padded query rows are zeroed
    (`keras_attn.masks.zero_padded`). A rank-2 query `(B, dq)` becomes
    `(B, 1, dq)`, its masks following (`query_mask (B,)` -> `(B, 1)`,
    `attention_mask (B, Tv)` -> `(B, 1, Tv)`), and the explicit masks are
    checked (`check_masks`) against the query and `value_shape` (default
    `value.shape`; a cached cross-attention call passes the cache's).

    Returns:
        `(query, query_mask, attention_mask, single_query)`: the rank-3 query,
        its masks, and whether the query was rank 2.
    """
    for name, x in (("query", query), ("value", value), ("key", key)):
        if x is not None:
            check_floating(name, x)
    query_mask = _as_tensor_mask(query_mask, "query_mask")
    value_mask = _as_tensor_mask(value_mask, "value_mask")
    attention_mask = _as_tensor_mask(attention_mask, "attention_mask")
    single_query = len(query.shape) == 2
    if single_query:
        query = kops.expand_dims(query, 1)  # (B, 1, dq)
        if query_mask is not None:
            if len(query_mask.shape) != 1:
                raise ValueError(
                    "With a rank-2 query (one query per example) `query_mask` must have "
                    f"shape (batch,). Received: query_mask.shape={tuple(query_mask.shape)}"
                )
            query_mask = kops.expand_dims(query_mask, 1)  # (B, 1)
        if attention_mask is not None:
            check_rank("attention_mask", attention_mask.shape, (2,))
            attention_mask = kops.expand_dims(attention_mask, 1)  # (B, 1, Tv)
    value_shape = value.shape if value_shape is None else value_shape
    check_masks(query.shape, value_shape, query_mask, value_mask, attention_mask)
    query = masks.zero_padded(query, query_mask)  # padded rows: no NaN in any gradient
    return query, query_mask, attention_mask, single_query


def _as_tensor_mask(mask, name):
    """A Python list mask as a tensor; the dtype and type checks of `check_mask_dtype`."""
    if mask is None:
        return None
    if isinstance(mask, (list, tuple)):
        return masks.as_bool_mask(mask, name)
    check_mask_dtype(name, mask)
    return mask


def prepare_inputs(query, value, query_mask, value_mask, attention_mask, use_causal_mask, key=None):
    """The prelude every attention layer's `call` shares: `prepare_query`, then one mask.

    Returns:
        `(query, mask, single_query)`: the rank-3 query, the boolean mask
        `(B or 1, Tq, Tv)` or `None`, and whether the query was rank 2.
    """
    query, query_mask, attention_mask, single_query = prepare_query(
        query, value, query_mask, value_mask, attention_mask, key=key
    )
    mask = masks.compute_attention_mask(
        kops.shape(query)[1],
        kops.shape(value)[1],
        query_mask=query_mask,
        value_mask=value_mask,
        attention_mask=attention_mask,
        use_causal_mask=use_causal_mask,
    )
    return query, mask, single_query


def add_bias(scores, attention_bias, single_query=False):
    """`scores (B, Tq, Tv)` plus `attention_bias` in float32 (`keras_attn.kernels.bias`)."""
    if attention_bias is None:
        return scores
    terms = attention_bias if isinstance(attention_bias, (tuple, list)) else (attention_bias,)
    if single_query:  # a (B, Tv) bias of a rank-2 query
        terms = tuple(
            kops.expand_dims(b, -2) if hasattr(b, "shape") and len(b.shape) == 2 else b
            for b in terms
        )
    bias = kernel_bias.as_bias(tuple(terms), scores.shape, name="attention_bias")
    if bias is None:
        return scores
    query_length, value_length = kops.shape(scores)[-2], kops.shape(scores)[-1]
    full = bias.full(
        kernel_bias.query_positions(query_length, value_length),
        kernel_bias.key_positions(value_length),
        num_heads=1,
    )
    return kops.cast(scores, "float32") + full


def finish_outputs(output, weights, mask, single_query, return_attention_scores):
    """The epilogue every attention layer's `call` shares.

    Zeroes the output rows that see no key (after any output projection and
    its bias; every row when `Tv = 0`), drops the query axis of a rank-2
    query, and returns the output or `(output, weights)`. Weights have the
    query axis at -2.
    """
    if mask is not None:
        output = kops.where(masks.visible_rows(mask), output, kops.zeros_like(output))
    elif weights.shape[-1] in (0, None):
        # No mask, but maybe no key (Tv = 0): then no row sees a key.
        output = kops.where(kops.shape(weights)[-1] > 0, output, kops.zeros_like(output))
    if single_query:
        output, weights = output[:, 0], weights[..., 0, :]
    if return_attention_scores:
        return output, weights
    return output


def check_masks(query_shape, value_shape, query_mask, value_mask, attention_mask):
    """Static checks of explicit masks against `query (B, Tq, .)` and `value (B, Tv, ...)` shapes.

    Masks must be boolean (or integer), with the rank, lengths and batch size
    of their inputs (`attention_mask` may have batch size 1).
    """
    if query_mask is not None:
        check_mask_dtype("query_mask", query_mask)
        check_rank("query_mask", query_mask.shape, (2,))
        check_dim("query_mask", query_mask.shape[1], "query", query_shape[1], "length")
        check_dim("query_mask", query_mask.shape[0], "query", query_shape[0], "batch size")
    if value_mask is not None:
        check_mask_dtype("value_mask", value_mask)
        check_rank("value_mask", value_mask.shape, (2,))
        check_dim("value_mask", value_mask.shape[1], "value", value_shape[1], "length")
        check_dim("value_mask", value_mask.shape[0], "value", value_shape[0], "batch size")
    if attention_mask is not None:
        check_mask_dtype("attention_mask", attention_mask)
        check_rank("attention_mask", attention_mask.shape, (3,))
        if attention_mask.shape[0] != 1:
            check_dim(
                "attention_mask",
                attention_mask.shape[0],
                "query",
                query_shape[0],
                "batch size (or 1)",
            )
        check_dim(
            "attention_mask",
            attention_mask.shape[1],
            "query",
            query_shape[1],
            "query length (axis 1)",
        )
        check_dim(
            "attention_mask",
            attention_mask.shape[2],
            "value",
            value_shape[1],
            "value length (axis 2 of the mask, axis 1 of value)",
        )


@keras.saving.register_keras_serializable(package="keras_attn")
class ScoreAttention(QueryMaskOutput, keras.layers.Layer):
    """Soft attention with any score: `att(q, (K, V)) = sum_j softmax(s(q, k_j)) v_j`.

    The base of every attention layer in keras-attn. Use it directly with a
    score name or a `keras_attn.scores.Score` layer, or use the named
    subclasses (`DotAttention`, `AdditiveAttention`, ...).

    Args:
        score: `"dot"`, `"scaled_dot"`, `"additive"`, `"bilinear"` or a
            `keras_attn.scores.Score` layer.
        dropout: dropout rate on the attention weights, in training.
        seed: seed of the dropout (and of any sampling the layer does).
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(B, Tq, dq)`, or `(B, dq)` for one query per example. Query,
            key and value must be floating point (`TypeError` otherwise).
        value: `(B, Tv, dv)`.
        key: `(B, Tv, dk)`; defaults to `value`.
        query_mask: bool `(B, Tq)` (`(B,)` for a rank-2 query); filled from
            the implicit Keras mask of `query`. Padded query rows output zeros.
        value_mask: bool `(B, Tv)`; filled from the implicit mask of `value`.
            Padded keys get zero weight.
        attention_mask: bool `(B or 1, Tq, Tv)` (`(B, Tv)` for a rank-2
            query), `True` = may attend. Masks may also be integer (nonzero =
            attend); float (additive) masks raise `TypeError`.
        use_causal_mask: query `i` sees keys `j <= i + Tv - Tq` only.
        return_attention_scores: also return the weights.
        training: dropout (and sampling) on or off.
        attention_bias: `None`, a float tensor `(B or 1, Tq, Tv)` (`(B, Tv)`
            for a rank-2 query), a `keras_attn.PositionBias` with one head
            (`AlibiBias()`, `RelativePositionBias(num_heads=1)`), or a tuple
            of these: added to the scores (in float32) before the
            normalization (`keras_attn.kernels.bias`). Masked positions keep
            zero weight whatever their bias.

    Returns:
        Output `(B, Tq, dv)` (or `(B, dv)`), and with
        `return_attention_scores=True` the pair `(output, weights)` with
        weights `(B, Tq, Tv)` (or `(B, Tv)`). A query row with no visible key
        returns zeros and zero weights; so does every row when `Tv = 0` (an
        empty sequence). The output mask is `query_mask`.

        Non-finite inputs: a NaN or inf at a masked position (padding, a
        future step under the causal mask) never reaches the outputs, and a
        padded query row outputs zeros whatever it holds. A NaN or inf at a
        visible position propagates: the rows that attend to it are NaN.

    Example:

    >>> layer = keras_attn.ScoreAttention(score="bilinear")
    >>> out = layer(keras.ops.ones((2, 3, 4)), keras.ops.ones((2, 5, 6)))
    >>> print(out.shape)
    (2, 3, 6)
    """

    def __init__(
        self,
        score: str | dict | scores.Score = "dot",
        dropout: float = 0.0,
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.score = score
        self.score_layer = scores.get(score, dtype=self.dtype_policy)
        self.dropout = check_rate("dropout", dropout)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True

    # -- hooks a mechanism may override ------------------------------------

    def build_projections(self, query_shape, key_shape, value_shape):
        """Builds input/output projections; returns the projected shapes."""
        return query_shape, key_shape, value_shape

    def project_inputs(self, query, key, value):
        return query, key, value

    def normalize(self, scores, mask, training):
        """Scores -> weights; masked positions must get exactly zero."""
        return attn_ops.masked_softmax(scores, mask)

    def combine(self, weights, value):
        """`(B, Tq, Tv), (B, Tv, dv) -> (B, Tq, dv)`; non-finite values are already zeroed."""
        return kops.matmul(kops.cast(weights, value.dtype), value)

    def project_output(self, output):
        return output

    def output_width(self, query_shape, value_shape):
        """Last axis of the output, from the (unprojected) input shapes."""
        return value_shape[-1]

    # -- the pipeline -------------------------------------------------------

    def build(self, query_shape, value_shape, key_shape=None):
        query_shape, key_shape = check_input_shapes(query_shape, value_shape, key_shape)
        q_shape, k_shape, _ = self.build_projections(query_shape, key_shape, tuple(value_shape))
        if not self.score_layer.built:  # a deserialized Score arrives built
            self.score_layer.build(q_shape, k_shape)
        self.built = True

    def call(
        self,
        query: TensorLike,
        value: TensorLike,
        key: TensorLike | None = None,
        query_mask: TensorLike | None = None,
        value_mask: TensorLike | None = None,
        attention_mask: TensorLike | None = None,
        use_causal_mask: bool = False,
        return_attention_scores: bool = False,
        training: bool | None = None,
        attention_bias: TensorLike | tuple[TensorLike, ...] | None = None,
    ) -> TensorLike | tuple[TensorLike, TensorLike]:
        key = value if key is None else key
        query, mask, single_query = prepare_inputs(
            query, value, query_mask, value_mask, attention_mask, use_causal_mask, key=key
        )
        self.set_output_mask(query_mask)
        # Keys and values holding a NaN or inf are zeroed (and flagged) before
        # the projections, and their scores set to NaN: at a masked position
        # the mask replaces the score, so they reach neither the output nor a
        # gradient (dQ = dS K); at a visible one the rows that see them are NaN
        # (`keras_attn.kernels.finite`).
        value, key = masks.zero_padded(value, value_mask), masks.zero_padded(key, value_mask)
        value, key, flag = finite.zero_nonfinite(value, key)
        query, key, value = self.project_inputs(query, key, value)
        scores = self.score_layer(query, key)  # (B, Tq, Tv)
        scores = finite.nan_scores_where_flagged(scores, kops.cast(flag, scores.dtype))
        dtype = scores.dtype
        scores = add_bias(scores, attention_bias, single_query)
        weights = kops.cast(self.normalize(scores, mask, training), dtype)
        weights = attn_ops.dropout_weights(
            weights, self.dropout, training=training, seed=self.seed_generator
        )
        output = self.project_output(self.combine(weights, value))
        return finish_outputs(output, weights, mask, single_query, return_attention_scores)

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_width(query_shape, value_shape),)

    def compute_output_spec(self, query, value, key=None, return_attention_scores=False, **kwargs):
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape), dtype=self.compute_dtype
        )
        if not return_attention_scores:
            return output
        weights_shape = tuple(query.shape[:-1]) + (value.shape[1],)
        return output, keras.KerasTensor(weights_shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"score": scores.serialize(self.score), "dropout": self.dropout, "seed": self.seed}
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("score"), dict):
            config["score"] = scores.get(config["score"])
        return cls(**config)
