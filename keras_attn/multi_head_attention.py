"""Multi-head attention (with grouped-query heads) on the shared attention path."""

import keras
from keras import ops as kops

from keras_attn import ops
from keras_attn.base import (
    check_input_shapes,
    check_positive_int,
    check_rate,
    finish_outputs,
    prepare_inputs,
)


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention: h scaled dot-product heads, concatenated, projected.

    `head_i = softmax(Q W_q^i (K W_k^i)^T / sqrt(d_k)) V W_v^i`,
    `MHA(Q, K, V) = concat(head_1, ..., head_h) W_o`.

    The per-head projections are stored fused (`W_q` of shape `(dq, h, d_k)`,
    the same layout as `keras.layers.MultiHeadAttention`). With
    `num_key_value_heads = g < h` the keys and values have `g` heads, each
    shared by `h / g` query heads (grouped-query attention; `g = 1` is
    multi-query attention). The heads run on `keras_attn.ops.attention`, the
    same masked-softmax path as every other layer.

    Args:
        num_heads: number of query heads `h`.
        key_dim: width `d_k` of each query/key head.
        value_dim: width of each value head; defaults to `key_dim`.
        num_key_value_heads: number of key/value heads `g`; must divide
            `num_heads`. `None` means `num_heads`.
        dropout: dropout rate on the attention weights, in training.
        use_bias: whether the projections have biases.
        output_dim: width of the output; defaults to the query width.
        kernel_initializer, bias_initializer: of the projections.
        seed: dropout seed.

    Call arguments:
        As every keras-attn attention layer: `query (B, Tq, dq)` (or
        `(B, dq)`), `value (B, Tv, dv)`, `key` (defaults to `value`),
        `query_mask`, `value_mask`, `attention_mask (B, Tq, Tv)`,
        `use_causal_mask`, `return_attention_scores`, `training`.

    Returns:
        `(B, Tq, output_dim or dq)`, and with `return_attention_scores=True`
        the weights `(B, h, Tq, Tv)`. A query row with no visible key returns
        zeros (after the output projection and its bias) and zero weights.

    Example:

    >>> x = keras.random.normal((2, 10, 32))
    >>> mha = keras_attn.MultiHeadAttention(num_heads=4, key_dim=8, num_key_value_heads=2)
    >>> out, w = mha(x, x, use_causal_mask=True, return_attention_scores=True)
    >>> print(out.shape, w.shape)
    (2, 10, 32) (2, 4, 10, 10)

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762; Ainslie et al., 2023, "GQA",
        https://arxiv.org/abs/2305.13245
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        num_key_value_heads=None,
        dropout=0.0,
        use_bias=True,
        output_dim=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.key_dim = check_positive_int("key_dim", key_dim)
        self.value_dim = check_positive_int("value_dim", value_dim, allow_none=True)
        self.num_key_value_heads = check_positive_int(
            "num_key_value_heads", num_key_value_heads, allow_none=True
        )
        if num_heads % (self.num_key_value_heads or num_heads):
            raise ValueError(
                "`num_key_value_heads` must divide `num_heads`. Received: "
                f"num_key_value_heads={num_key_value_heads}, num_heads={num_heads}"
            )
        self.dropout = check_rate("dropout", dropout)
        self.use_bias = use_bias
        self.output_dim = check_positive_int("output_dim", output_dim, allow_none=True)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True

    def _einsum_dense(self, equation, output_shape, bias_axes, name):
        return keras.layers.EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape, key_shape=None):
        query_shape, key_shape = check_input_shapes(query_shape, value_shape, key_shape)
        kv_heads = self.num_key_value_heads or self.num_heads
        value_dim = self.value_dim or self.key_dim
        self.query_dense = self._einsum_dense(
            "btd,dhk->bthk", (None, self.num_heads, self.key_dim), "hk", "query"
        )
        self.key_dense = self._einsum_dense(
            "btd,dhk->bthk", (None, kv_heads, self.key_dim), "hk", "key"
        )
        self.value_dense = self._einsum_dense(
            "btd,dhk->bthk", (None, kv_heads, value_dim), "hk", "value"
        )
        self.output_dense = self._einsum_dense(
            "bthk,hko->bto", (None, self.output_dim or query_shape[-1]), "o", "attention_output"
        )
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build((query_shape[0], query_shape[1], self.num_heads, value_dim))
        self.built = True

    def _heads(self, x):
        """`(B, T, g, d) -> (B, h, T, d)`, repeating each of the g heads h/g times."""
        x = kops.transpose(x, (0, 2, 1, 3))
        groups = self.num_heads // x.shape[1]
        return x if groups == 1 else kops.repeat(x, groups, axis=1)

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
    ):
        key = value if key is None else key
        query, mask, single_query = prepare_inputs(
            query, value, query_mask, value_mask, attention_mask, use_causal_mask
        )  # mask: (B, Tq, Tv) or None
        q = self._heads(self.query_dense(query))  # (B, h, Tq, dk)
        k = self._heads(self.key_dense(key))  # (B, h, Tv, dk)
        v = self._heads(self.value_dense(value))  # (B, h, Tv, dv)
        heads, weights = ops.attention(
            q,
            k,
            v,
            mask=None if mask is None else kops.expand_dims(mask, 1),  # (B, 1, Tq, Tv)
            dropout_rate=self.dropout,
            training=training,
            seed=self.seed_generator,
        )
        output = self.output_dense(kops.transpose(heads, (0, 2, 1, 3)))  # (B, Tq, out)
        return finish_outputs(output, weights, mask, single_query, return_attention_scores)

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def compute_output_spec(self, query, value, key=None, return_attention_scores=False, **kwargs):
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape), dtype=self.compute_dtype
        )
        if not return_attention_scores:
            return output
        batch, query_length = query.shape[0], tuple(query.shape[1:-1])
        weights_shape = (batch, self.num_heads) + query_length + (value.shape[1],)
        return output, keras.KerasTensor(weights_shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "num_key_value_heads": self.num_key_value_heads,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "output_dim": self.output_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "seed": self.seed,
            }
        )
        return config
