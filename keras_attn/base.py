"""`ScoreAttention`: the attention layer with any score, on `keras_attn.ops.attention`.

    project -> score -> mask -> normalize -> dropout -> combine -> project output

The score, mask, normalization, dropout and combine run in the kernel that
`keras_attn.ops.attention` chooses (`keras_attn.kernels`); a mechanism
overrides one step around it: its score (a `keras_attn.scores` layer), its
projections (`KeyValueAttention`), its normalization (`HardAttention`) or its
combine (`PointerAttention`). The checks and the output plumbing every
attention layer shares are in `keras_attn.layer_io`.
"""

import keras

from keras_attn import masks, scores
from keras_attn import ops as attn_ops
from keras_attn._typing import TensorLike
from keras_attn.arguments import check_rate, dim
from keras_attn.layer_io import AttentionLayer, check_input_shapes, prepare_query, zero_unseen_rows


@keras.saving.register_keras_serializable(package="keras_attn")
class ScoreAttention(AttentionLayer, keras.layers.Layer):
    """Soft attention with any score: `att(q, (K, V)) = sum_j softmax(s(q, k_j)) v_j`.

    The base of every attention layer in keras-attn. Use it directly with a
    score name or a `keras_attn.scores.Score` layer, or use the named
    subclasses (`DotAttention`, `AdditiveAttention`, ...).

    Args:
        score: `"dot"`, `"scaled_dot"`, `"additive"`, `"bilinear"` or a
            `keras_attn.scores.Score` layer.
        dropout: dropout rate on the attention weights, in training.
        seed: seed of the dropout (and of any sampling the layer does).
        implementation: the kernel of `keras_attn.ops.attention`: `"auto"`
            (default), `"dense"`, `"fused"`, `"chunked"` or `"backend"`.
            Dot-product scores (dot, scaled dot, bilinear) run on every
            kernel, the additive score on the dense and chunked ones (the
            chunked kernel never forms the `(B, Tq, Tv)` weights: memory
            `O(Tq)` per key block), any other `Score` on the dense one.
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
            attend) or float 0/1 (1 = attend, as Keras reads them); a float
            mask holding other values (an additive mask) raises `ValueError`
            (`keras_attn.masks.float_mask_as_bool`).
        use_causal_mask: query `i` sees keys `j <= i + Tv - Tq` only.
        return_attention_scores: also return the weights.
        training: dropout (and sampling) on or off.
        attention_bias: `None`, a float tensor `(B or 1, Tq, Tv)` (`(B, Tv)`
            for a rank-2 query), a `keras_attn.PositionBias` with one head
            (`AlibiBias()`, `RelativePositionBias(num_heads=1)`), a tuple of
            these or a `keras_attn.AttentionBias`: added to the scores in
            float32 (kept in float32 under a mixed policy) before the
            normalization. Masked positions keep zero weight whatever their
            bias.

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

    # Whether the layer needs the weights (its combine or normalization reads them).
    needs_weights = False

    def __init__(
        self,
        score: str | dict | scores.Score = "dot",
        dropout: float = 0.0,
        seed: int | None = None,
        implementation: str = "auto",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.score = score
        self.score_layer = scores.get(score, dtype=self.dtype_policy)
        self.dropout = check_rate("dropout", dropout)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.implementation = attn_ops.check_implementation(
            implementation,
            dropout_rate=self.dropout,
            score=None if self.score_layer.kind == "dot" else self.score_layer,
            return_weights=self.needs_weights,
        )
        self.supports_masking = True

    # -- hooks a mechanism may override ------------------------------------

    def build_projections(self, query_shape, key_shape, value_shape):
        """Builds input/output projections; returns the projected shapes."""
        return query_shape, key_shape, value_shape

    def project_inputs(self, query, key, value):
        return query, key, value

    def normalization(self, training):
        """`None` (the masked softmax), or `normalize(scores, mask) -> weights`.

        Masked positions must get exactly zero weight.
        """
        return None

    def combine(self, output, weights):
        """The kernel's `output (B, Tq, dv)` and `weights` (`None` unless `needs_weights`)."""
        return output

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
        attention_bias: TensorLike | tuple[TensorLike, ...] | attn_ops.AttentionBias | None = None,
    ) -> TensorLike | tuple[TensorLike, TensorLike]:
        key = value if key is None else key
        key_padding_mask = masks.as_bool_mask(value_mask, "value_mask")  # (B, Tv)
        query, query_mask, attention_mask, single_query = prepare_query(
            query, value, query_mask, key_padding_mask, attention_mask, key=key
        )
        # Padded keys and values zeroed before the projections: nothing they hold
        # reaches a gradient of the projections (dW = x^T dy).
        value = masks.zero_padded(value, key_padding_mask)
        key = masks.zero_padded(key, key_padding_mask)
        query, key, value = self.project_inputs(query, key, value)
        score = self.score_layer
        score.check_inputs(query, key)
        query, key = score.prepare(query, key)  # (B, Tq, d), (B, Tv, d)
        dot = score.kind == "dot"
        if attention_bias is not None and single_query:  # a (B, Tv) bias of a rank-2 query
            attention_bias = attn_ops.AttentionBias(attention_bias).map_tensors(
                lambda t: keras.ops.expand_dims(t, -2) if len(t.shape) == 2 else t
            )
        return_weights = return_attention_scores or self.needs_weights
        spec = attn_ops.AttentionSpec(
            mask=masks.merge_masks(
                None if key_padding_mask is None else key_padding_mask[:, None, :],
                attention_mask,
            ),  # (B|1, Tq|1, Tv)
            is_causal=bool(use_causal_mask),
            bias=attention_bias,
            scale=score.dot_scale(query) if dot else None,
            score=None if dot else score,
            dropout_rate=self.dropout,
            seed=self.seed_generator,
            training=training,
            return_weights=return_weights,
            normalize=self.normalization(training),
        )
        output, weights = attn_ops.attention(
            query, key, value, spec=spec, implementation=self.implementation
        )
        output = self.project_output(self.combine(output, weights))
        rows = spec.visible_query_rows(
            dim(query, 1), dim(key, 1), query_mask, key_padding_mask, attention_mask
        )
        output, weights = zero_unseen_rows(output, weights, rows)
        if single_query:
            output = output[:, 0]
            weights = None if weights is None else weights[..., 0, :]
            query_mask = None if query_mask is None else query_mask[:, 0]  # (B,)
        output = self.with_output_mask(output, query_mask)
        return (output, weights) if return_attention_scores else output

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_width(query_shape, value_shape),)

    def compute_output_spec(
        self, query, value, key=None, query_mask=None, value_mask=None, attention_mask=None,
        use_causal_mask=False, return_attention_scores=False, **kwargs,
    ):  # fmt: skip
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape), dtype=self.compute_dtype
        )
        output = self.with_output_mask(output, query_mask)
        if not return_attention_scores:
            return output
        weights_shape = tuple(query.shape[:-1]) + (value.shape[1],)
        return output, keras.KerasTensor(weights_shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "score": scores.serialize(self.score),
                "dropout": self.dropout,
                "seed": self.seed,
                "implementation": self.implementation,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("score"), dict):
            config["score"] = scores.get(config["score"])
        return cls(**config)


class FixedScoreAttention(ScoreAttention):
    """A `ScoreAttention` whose score is set by the class (`DotAttention`, `AdditiveAttention`,
    ...), not by its config."""

    def get_config(self):
        config = super().get_config()
        config.pop("score")
        return config
