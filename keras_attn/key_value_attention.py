"""Key-value attention with learned query, key and value projections."""

import keras

from keras_attn._typing import InitializerLike
from keras_attn.arguments import check_positive_int, clone_initializer
from keras_attn.base import ScoreAttention
from keras_attn.scores import Score


@keras.saving.register_keras_serializable(package="keras_attn")
class KeyValueAttention(ScoreAttention):
    """Key-value attention: learned projections, then attention with any score.

    `Q = q W_q, K = k W_k, V = v W_v`,
    `att = sum_j softmax_j(s(Q, K_j)) V_j` (then `W_o` when `output_dim` is
    set). Called as `layer(x, x)` it is single-head self-attention:
    `softmax(X W_q (X W_k)^T / sqrt(d_k)) X W_v`.

    Args:
        key_dim: width of the projected queries and keys.
        value_dim: width of the projected values; defaults to `key_dim`.
        score: `"scaled_dot"` (default), `"dot"`, `"additive"`, `"bilinear"`
            or a `keras_attn.scores.Score` layer, applied to the projected
            query and key.
        output_dim: if set, a final projection to this width.
        use_bias: whether the projections have biases.
        kernel_initializer, bias_initializer: of the projections.
        dropout: dropout rate on the attention weights, in training.
        seed: dropout seed.
        implementation: the kernel, `"auto"` (default), `"dense"`,
            `"fused"`, `"chunked"` or `"backend"`, as `keras_attn.ScoreAttention`
            (`"chunked"` never forms the `(B, Tq, Tv)` weights: long sequences
            in `O(Tq)` memory per key block; the additive score runs on the
            dense and chunked kernels only).

    Call arguments:
        As `keras_attn.ScoreAttention`.

    Returns:
        `(B, Tq, output_dim or value_dim)`, and the weights `(B, Tq, Tv)` with
        `return_attention_scores=True`.

    Example:

    >>> x = keras.random.normal((2, 10, 32))
    >>> layer = keras_attn.KeyValueAttention(key_dim=16, output_dim=32)
    >>> print(layer(x, x, use_causal_mask=True).shape)
    (2, 10, 32)

    Reference:
        Daniluk et al., 2017, "Frustratingly Short Attention Spans in Neural
        Language Modeling", https://arxiv.org/abs/1702.04521; Vaswani et al.,
        2017, https://arxiv.org/abs/1706.03762
    """

    def __init__(
        self,
        key_dim: int,
        value_dim: int | None = None,
        score: str | dict | Score = "scaled_dot",
        output_dim: int | None = None,
        use_bias: bool = True,
        kernel_initializer: InitializerLike = "glorot_uniform",
        bias_initializer: InitializerLike = "zeros",
        dropout: float = 0.0,
        seed: int | None = None,
        implementation: str = "auto",
        **kwargs,
    ):
        super().__init__(
            score=score, dropout=dropout, seed=seed, implementation=implementation, **kwargs
        )
        self.key_dim = check_positive_int("key_dim", key_dim)
        self.value_dim = check_positive_int("value_dim", value_dim, allow_none=True)
        self.output_dim = check_positive_int("output_dim", output_dim, allow_none=True)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

        def dense(units, name):
            return keras.layers.Dense(
                units,
                use_bias=use_bias,
                kernel_initializer=clone_initializer(self.kernel_initializer),
                bias_initializer=clone_initializer(self.bias_initializer),
                dtype=self.dtype_policy,
                name=name,
            )

        self.query_dense = dense(self.key_dim, "query")
        self.key_dense = dense(self.key_dim, "key")
        self.value_dense = dense(self.value_dim or self.key_dim, "value")
        self.output_dense = dense(self.output_dim, "output") if self.output_dim else None

    def build_projections(self, query_shape, key_shape, value_shape):
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        projected_value = self.value_dense.compute_output_shape(value_shape)
        if self.output_dense is not None:
            self.output_dense.build(tuple(query_shape[:-1]) + (projected_value[-1],))
        return (
            self.query_dense.compute_output_shape(query_shape),
            self.key_dense.compute_output_shape(key_shape),
            projected_value,
        )

    def project_inputs(self, query, key, value):
        return self.query_dense(query), self.key_dense(key), self.value_dense(value)

    def project_output(self, output):
        return output if self.output_dense is None else self.output_dense(output)

    def output_width(self, query_shape, value_shape):
        return self.output_dim or self.value_dim or self.key_dim

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "output_dim": self.output_dim,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
