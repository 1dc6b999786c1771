"""Transformer building blocks: `FeedForward`, `TransformerEncoderBlock`, `TransformerDecoderBlock`.

Each sublayer (self-attention, cross-attention, feed-forward) is wrapped in a
residual connection and layer normalization, post-norm as in the paper
(`x = LayerNorm(x + Dropout(sublayer(x)))`) or pre-norm with
`norm_first=True` (`x = x + Dropout(sublayer(LayerNorm(x)))`; a pre-norm stack
usually ends with one more `LayerNormalization`). Residuals go through
`keras.layers.Add`, so the implicit padding mask flows from block to block.
"""

import keras

from keras_attn.arguments import (
    check_dim,
    check_floating,
    check_positive_int,
    check_positive_number,
    check_rank,
    check_rate,
    clone_initializer,
    deserialize_optional_layer,
    serialize_optional_layer,
    sublayer_seed,
)
from keras_attn.base import QueryMaskOutput
from keras_attn.masks import check_mask_dtype
from keras_attn.multi_head_attention import MultiHeadAttention


@keras.saving.register_keras_serializable(package="keras_attn")
class FeedForward(keras.layers.Layer):
    """Position-wise feed-forward network: `FFN(x) = act(x W_1 + b_1) W_2 + b_2`.

    Args:
        intermediate_dim: width of the hidden layer.
        output_dim: width of the output; defaults to the input width.
        activation: activation of the hidden layer.
        dropout: dropout on the hidden activations, in training.
        use_bias: whether both layers have biases.
        kernel_initializer, bias_initializer: of both layers.
        seed: dropout seed.

    Call arguments:
        inputs: `(..., d)`.
        training: dropout on or off.

    Returns:
        `(..., output_dim or d)`. The input's implicit mask passes through.

    Example:

    >>> ffn = keras_attn.FeedForward(intermediate_dim=64)
    >>> print(ffn(keras.ops.ones((2, 5, 16))).shape)
    (2, 5, 16)

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need", section 3.3,
        https://arxiv.org/abs/1706.03762
    """

    def __init__(
        self,
        intermediate_dim,
        output_dim=None,
        activation="relu",
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        self.output_dim = check_positive_int("output_dim", output_dim, allow_none=True)
        self.activation = keras.activations.get(activation)
        self.dropout = check_rate("dropout", dropout)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self.supports_masking = True

    def _dense(self, units, activation, name):
        return keras.layers.Dense(
            units,
            activation=activation,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, inputs_shape):
        if inputs_shape[-1] is None:
            raise ValueError(
                f"The last axis of `inputs` must be known. Received: inputs.shape={inputs_shape}"
            )
        self.intermediate_dense = self._dense(
            self.intermediate_dim, self.activation, "intermediate"
        )
        self.hidden_dropout = keras.layers.Dropout(
            self.dropout, seed=self.seed, dtype=self.dtype_policy
        )
        self.output_dense = self._dense(self.output_dim or inputs_shape[-1], None, "output")
        self.intermediate_dense.build(inputs_shape)
        self.output_dense.build(tuple(inputs_shape[:-1]) + (self.intermediate_dim,))
        self.built = True

    def call(self, inputs, training=None):
        hidden = self.hidden_dropout(self.intermediate_dense(inputs), training=training)
        return self.output_dense(hidden)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.output_dim or inputs_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "output_dim": self.output_dim,
                "activation": keras.activations.serialize(self.activation),
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "seed": self.seed,
            }
        )
        return config


class _TransformerBlock(QueryMaskOutput, keras.layers.Layer):
    """What the encoder and decoder blocks share: arguments, sublayers, Add & Norm."""

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        dropout=0.0,
        attention_dropout=0.0,
        activation="relu",
        norm_first=False,
        key_dim=None,
        num_key_value_heads=None,
        layer_norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        rotary_embedding=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        self.dropout = check_rate("dropout", dropout)
        self.attention_dropout = check_rate("attention_dropout", attention_dropout)
        self.activation = keras.activations.get(activation)
        if not isinstance(norm_first, bool):
            raise TypeError(f"`norm_first` must be a bool. Received: norm_first={norm_first!r}")
        self.norm_first = norm_first
        self.key_dim = check_positive_int("key_dim", key_dim, allow_none=True)
        self.num_key_value_heads = check_positive_int(
            "num_key_value_heads", num_key_value_heads, allow_none=True
        )
        if num_heads % (num_key_value_heads or num_heads):
            raise ValueError(
                "`num_key_value_heads` must divide `num_heads`. Received: "
                f"num_key_value_heads={num_key_value_heads}, num_heads={num_heads}"
            )
        self.layer_norm_epsilon = check_positive_number("layer_norm_epsilon", layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.rotary_embedding = rotary_embedding
        self.seed = seed
        self.supports_masking = True
        self._add = keras.layers.Add(dtype=self.dtype_policy)

    def _model_dim(self, shape, name, built_width=None):
        width = shape[-1]
        if len(shape) != 3 or width is None:
            raise ValueError(
                f"`{name}` must have shape (batch, length, features) with known features. "
                f"Received: {name}.shape={tuple(shape)}"
            )
        if built_width is not None and width != built_width:
            raise ValueError(
                f"`{name}` must have width {built_width}, the width this block was built for. "
                f"Received: {name}.shape={tuple(shape)}"
            )
        if self.key_dim is None and width % self.num_heads:
            raise ValueError(
                f"The width of `{name}` ({width}) must be divisible by `num_heads` "
                f"({self.num_heads}) when `key_dim` is not given."
            )
        return width

    def _check_sequence(self, name, sequence, built_width, mask_name, mask):
        """Call-time checks of a sequence (rank, built width, float) and its padding mask."""
        self._model_dim(sequence.shape, name, built_width)
        check_floating(name, sequence)
        if mask is None:
            return
        check_mask_dtype(mask_name, mask)
        check_rank(mask_name, mask.shape, (2,))
        check_dim(mask_name, mask.shape[1], name, sequence.shape[1], "length")
        check_dim(mask_name, mask.shape[0], name, sequence.shape[0], "batch size")

    # Each random sublayer draws its own seed (`sublayer_seed`): the attention
    # dropouts, the residual dropouts and the feed-forward's hidden dropout.
    _SEEDS = {
        "self_attention": 0,
        "cross_attention": 1,
        "self_attention_dropout": 2,
        "cross_attention_dropout": 3,
        "feed_forward_dropout": 4,
        "feed_forward": 5,
    }

    def _attention(self, width, name, rotary_embedding=None):
        return MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self.key_dim or width // self.num_heads,
            num_key_value_heads=self.num_key_value_heads,
            dropout=self.attention_dropout,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            rotary_embedding=rotary_embedding,
            seed=sublayer_seed(self.seed, self._SEEDS[name]),
            dtype=self.dtype_policy,
            name=name,
        )

    def _norm_and_dropout(self, shape, name):
        norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=f"{name}_norm"
        )
        norm.build(shape)
        dropout = keras.layers.Dropout(
            self.dropout,
            seed=sublayer_seed(self.seed, self._SEEDS[f"{name}_dropout"]),
            dtype=self.dtype_policy,
            name=f"{name}_dropout",
        )
        return norm, dropout

    def _build_feed_forward(self, shape):
        self.feed_forward = FeedForward(
            self.intermediate_dim,
            activation=self.activation,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            seed=sublayer_seed(self.seed, self._SEEDS["feed_forward"]),
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        self.feed_forward.build(shape)
        self.feed_forward_norm, self.feed_forward_dropout = self._norm_and_dropout(
            shape, "feed_forward"
        )

    def _residual(self, x, norm, dropout, sublayer, training):
        """Post-norm `norm(x + drop(f(x)))`, or pre-norm `x + drop(f(norm(x)))`."""
        y = sublayer(norm(x) if self.norm_first else x)
        x = self._add([x, dropout(y, training=training)])
        return x if self.norm_first else norm(x)

    def _feed_forward_residual(self, x, training):
        return self._residual(
            x,
            self.feed_forward_norm,
            self.feed_forward_dropout,
            lambda y: self.feed_forward(y, training=training),
            training,
        )

    def compute_output_shape(self, *shapes, **kwargs):
        return tuple(shapes[0])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "activation": keras.activations.serialize(self.activation),
                "norm_first": self.norm_first,
                "key_dim": self.key_dim,
                "num_key_value_heads": self.num_key_value_heads,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "rotary_embedding": serialize_optional_layer(self.rotary_embedding),
                "seed": self.seed,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**deserialize_optional_layer(config, "rotary_embedding"))


_BLOCK_ARGS = """
    Args:
        num_heads: attention heads.
        intermediate_dim: hidden width of the feed-forward network.
        dropout: dropout on each sublayer's output before the residual add.
        attention_dropout: dropout on the attention weights.
        activation: activation of the feed-forward network.
        norm_first: pre-norm (`True`) instead of the paper's post-norm.
        key_dim: width of each head; defaults to `d_model / num_heads`.
        num_key_value_heads: grouped-query attention (see `MultiHeadAttention`).
        layer_norm_epsilon: epsilon of the layer normalizations.
        kernel_initializer, bias_initializer: of every projection.
        rotary_embedding: `None`, or a `keras_attn.RotaryEmbedding` applied to
            the queries and keys of the self-attention.
        seed: dropout seed.
"""


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerEncoderBlock(_TransformerBlock):
    __doc__ = (
        """Transformer encoder block: self-attention and feed-forward, each with Add & Norm.

    `x = LayerNorm(x + MHA(x, x, x))`, `y = LayerNorm(x + FFN(x))` (post-norm),
    or with `norm_first=True`: `x = x + MHA(LN(x))`, `y = x + FFN(LN(x))`.
"""
        + _BLOCK_ARGS
        + """
    Call arguments:
        inputs: float `(B, T, d_model)`, `d_model` as when the block was built.
        padding_mask: bool `(B, T)`, `True` = real token. By default the
            implicit Keras mask of `inputs` (e.g. from
            `TokenAndPositionEmbedding(mask_zero=True)`).
        attention_mask: bool `(B, T, T)`, merged with the padding mask.
        use_causal_mask: position `t` sees positions `<= t` only.
        return_attention_scores: also return the weights `(B, H, T, T)`.
        training: dropout on or off.

    Returns:
        `(B, T, d_model)` (and the weights). The implicit mask passes through.

    Example:

    >>> tokens = keras.Input((12,), dtype="int32")
    >>> x = keras_attn.TokenAndPositionEmbedding(100, 12, 32)(tokens)
    >>> x = keras_attn.TransformerEncoderBlock(num_heads=4, intermediate_dim=64)(x)
    >>> print(x.shape)
    (None, 12, 32)

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762; Xiong et al., 2020, "On Layer
        Normalization in the Transformer Architecture" (pre-norm),
        https://arxiv.org/abs/2002.04745
    """
    )

    def build(self, inputs_shape):
        width = self._model_dim(inputs_shape, "inputs")
        self._width = width
        self.self_attention = self._attention(width, "self_attention", self.rotary_embedding)
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_norm, self.self_attention_dropout = self._norm_and_dropout(
            inputs_shape, "self_attention"
        )
        self._build_feed_forward(inputs_shape)
        self.built = True

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
    ):
        self._check_sequence("inputs", inputs, self._width, "padding_mask", padding_mask)
        self.set_output_mask(padding_mask)
        weights = []

        def attend(x):
            # query_mask / value_mask left None are filled by Keras from x's implicit mask.
            # Weights only when asked: without them the attention may take a fast path.
            out = self.self_attention(
                x,
                x,
                query_mask=padding_mask,
                value_mask=padding_mask,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if not return_attention_scores:
                return out
            weights.append(out[1])
            return out[0]

        x = self._residual(
            inputs, self.self_attention_norm, self.self_attention_dropout, attend, training
        )
        x = self._feed_forward_residual(x, training)
        return (x, weights[0]) if return_attention_scores else x

    def compute_output_spec(self, inputs, return_attention_scores=False, **kwargs):
        output = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return output
        batch, length = inputs.shape[0], inputs.shape[1]
        weights = keras.KerasTensor((batch, self.num_heads, length, length), self.compute_dtype)
        return output, weights
