"""What `TransformerEncoder` and `TransformerDecoder` share.

Arguments, sublayers and Add & Norm, with keras-hub's argument order, names
and weight order (`keras_hub.layers.TransformerEncoder` / `TransformerDecoder`),
and the padding rule of every keras-attn layer: the padded steps of a block's
inputs are zeroed on entry, whether the padding mask is passed (`padding_mask=`)
or implicit (a Keras mask), so nothing they hold reaches an output or a gradient.
"""

import keras
from keras.src.backend.common.masking import get_keras_mask

from keras_attn import masks
from keras_attn import ops as attn_ops
from keras_attn._typing import ActivationLike, InitializerLike
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
from keras_attn.layer_io import QueryMaskOutput
from keras_attn.matmul_einsum_dense import MatmulDense
from keras_attn.multi_head_attention import MultiHeadAttention
from keras_attn.multi_head_shapes import check_key_value_heads
from keras_attn.position_bias import PositionBias
from keras_attn.rotary import RotaryEmbedding, check_rotary_embedding

BLOCK_ARGS = """
    Args:
        intermediate_dim: hidden width of the feed-forward network.
        num_heads: attention heads.
        dropout: dropout on each sublayer's output before the residual add,
            and (unless `attention_dropout` is given) on the attention weights.
        activation: activation of the feed-forward network.
        layer_norm_epsilon: epsilon of the layer normalizations.
        kernel_initializer, bias_initializer: of every projection.
        normalize_first: pre-norm (`True`, as GPT-2) instead of the paper's
            post-norm (as BERT).

        The arguments above are keras-hub's, in its order; ours follow
        (pass them by name):

        attention_dropout: dropout on the attention weights; `None` (default)
            means `dropout`, as keras-hub does.
        key_dim: width of each head; defaults to `d_model // num_heads` (keras-hub's
            rule: a width that `num_heads` does not divide, e.g. 256 with 3 heads, gets
            heads of 85, and the output projection maps `3 * 85` back to 256).
        num_key_value_heads: grouped-query attention (see `MultiHeadAttention`).
        rotary_embedding: `None`, or a `keras_attn.RotaryEmbedding` applied to
            the queries and keys of the self-attention.
        implementation: the attention kernel, `"auto"`, `"dense"`, `"fused"`
            or `"chunked"` (see `MultiHeadAttention`).
        position_bias: `None`, or a `keras_attn.AlibiBias` /
            `keras_attn.RelativePositionBias` added to the self-attention
            scores (on every kernel and through the cache; see
            `MultiHeadAttention`).
        sliding_window: `None`, or a positive int: the self-attention sees
            keys within `sliding_window - 1` positions (with the causal mask
            of a decoder: the last `sliding_window` positions, as Mistral's
            `sliding_window` in transformers: key `j` seen by query `i` when
            `i - sliding_window < j <= i`; transformers' bidirectional windows
            are inclusive, `|i - j| <= w`: ours `w + 1`).
        seed: dropout seed.

        The Llama family's options (defaults: today's GPT-2 / BERT block):

        normalization: `"layer_norm"` (`keras.layers.LayerNormalization`) or
            `"rms_norm"`: `keras.layers.RMSNormalization` (a subclass that
            passes the mask on, `keras_attn.transformer_block.MaskedRMSNormalization`),
            `x * rsqrt(mean(x^2) + layer_norm_epsilon) * scale`, no bias, as
            Llama's `LlamaRMSNorm` (the epsilon inside the square root, the
            mean over the features).
        feedforward: `"dense"`, `act(x W_1 + b_1) W_2 + b_2`, or `"gated"`:
            `(act(x W_gate) * (x W_up)) W_down` (GLU variants; SwiGLU with
            `activation="silu"` as Llama, GeGLU with `"gelu"`). The gated
            network has three kernels: `feedforward_gate_dense` (`W_gate`,
            with the activation), `feedforward_intermediate_dense` (`W_up`)
            and `feedforward_output_dense` (`W_down`), keras-hub's Llama names.
        use_bias: whether the projections have biases: the attention's query,
            key, value and output projections and the feed-forward kernels
            (`False`: Llama, Mistral). The norms are not projections: a layer
            norm keeps its bias, an RMS norm has none.
        qkv_bias: whether the attention's query, key and value projections have
            biases; `None` (default) means `use_bias`. Qwen2:
            `use_bias=False, qkv_bias=True`.
"""


NORMALIZATIONS = ("layer_norm", "rms_norm")
FEEDFORWARDS = ("dense", "gated")


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}. Received: {name}={value!r}")
    return value


@keras.saving.register_keras_serializable(package="keras_attn")
class MaskedRMSNormalization(keras.layers.RMSNormalization):
    """Keras' `RMSNormalization` passing its input's mask on, as `LayerNormalization` does.

    `x * rsqrt(mean(x^2) + epsilon) * scale` over the last axis, Llama's
    `LlamaRMSNorm`. Keras' own layer drops the mask (with a warning), so a
    model's final norm after masked blocks, reloaded, would warn at each call.
    """

    def __init__(self, axis=-1, epsilon=1e-6, **kwargs):
        super().__init__(axis=axis, epsilon=epsilon, **kwargs)
        self.supports_masking = True


def normalization_layer(normalization, epsilon, name, dtype=None):
    """The norm a block (or a model around blocks) uses: `"layer_norm"` or `"rms_norm"`."""
    if normalization == "rms_norm":
        return MaskedRMSNormalization(epsilon=epsilon, dtype=dtype, name=name)
    return keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)


def implicit_mask(x):
    """The Keras mask `x` carries (`_keras_mask`, set by an `Embedding(mask_zero=True)` or a
    `Masking` layer before it), or `None`: what Keras itself hands a layer as `mask`."""
    return get_keras_mask(x)


def attention_results(layer, *args, return_attention_scores=False, cache=None, **kwargs):
    """`layer(*args, ...)` (a `MultiHeadAttention`) as `(output, weights or None, cache or None)`.

    The layer returns `output`, `(output, weights)`, `(output, cache)` or
    `(output, weights, cache)`, after what it was asked for.
    """
    outputs = layer(*args, return_attention_scores=return_attention_scores, cache=cache, **kwargs)
    if not return_attention_scores and cache is None:
        return outputs, None, None
    weights = outputs[1] if return_attention_scores else None
    return outputs[0], weights, outputs[-1] if cache is not None else None


class TransformerBlock(QueryMaskOutput, keras.layers.Layer):
    """Base of the encoder and decoder blocks: arguments, sublayers, Add & Norm."""

    def __init__(
        self,
        intermediate_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        activation: ActivationLike = "relu",
        layer_norm_epsilon: float = 1e-5,
        kernel_initializer: InitializerLike = "glorot_uniform",
        bias_initializer: InitializerLike = "zeros",
        normalize_first: bool = False,
        *,
        attention_dropout: float | None = None,
        key_dim: int | None = None,
        num_key_value_heads: int | None = None,
        rotary_embedding: RotaryEmbedding | None = None,
        implementation: str = "auto",
        position_bias: PositionBias | None = None,
        sliding_window: int | None = None,
        seed: int | None = None,
        normalization: str = "layer_norm",
        feedforward: str = "dense",
        use_bias: bool = True,
        qkv_bias: bool | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.dropout = check_rate("dropout", dropout)
        self.activation = keras.activations.get(activation)
        self.layer_norm_epsilon = check_positive_number("layer_norm_epsilon", layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        if not isinstance(normalize_first, bool):
            raise TypeError(
                f"`normalize_first` must be a bool. Received: normalize_first={normalize_first!r}"
            )
        self.normalize_first = normalize_first
        self.attention_dropout = (
            None
            if attention_dropout is None
            else check_rate("attention_dropout", attention_dropout)
        )
        self.key_dim = check_positive_int("key_dim", key_dim, allow_none=True)
        self.num_key_value_heads = check_key_value_heads(num_key_value_heads, self.num_heads)
        self.rotary_embedding = check_rotary_embedding(rotary_embedding)
        self.implementation = attn_ops.check_implementation(implementation)
        self.position_bias = position_bias
        self.sliding_window = masks.check_window(sliding_window, "sliding_window")
        self.seed = seed
        self.normalization = _check_choice("normalization", normalization, NORMALIZATIONS)
        self.feedforward = _check_choice("feedforward", feedforward, FEEDFORWARDS)
        if not isinstance(use_bias, bool):
            raise TypeError(f"`use_bias` must be a bool. Received: use_bias={use_bias!r}")
        self.use_bias = use_bias
        if qkv_bias is not None and not isinstance(qkv_bias, bool):
            raise TypeError(f"`qkv_bias` must be None or a bool. Received: qkv_bias={qkv_bias!r}")
        self.qkv_bias = qkv_bias
        self.supports_masking = True

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
        if self.key_dim is None and width < self.num_heads:
            raise ValueError(
                f"The width of `{name}` ({width}) must be at least `num_heads` "
                f"({self.num_heads}) when `key_dim` is not given: each head is "
                "width // num_heads wide."
            )
        return width

    def _check_sequence(self, name, sequence, built_width, mask_name, mask):
        """Call-time checks of a sequence (rank, built width, float) and its padding mask.

        Returns the padding mask as bool (`keras_attn.masks.as_bool_mask`, named
        `mask_name` in its errors), or `None`.
        """
        self._model_dim(sequence.shape, name, built_width)
        check_floating(name, sequence)
        if mask is None:
            return None
        mask = masks.as_bool_mask(mask, mask_name)
        check_rank(mask_name, mask.shape, (2,))
        check_dim(mask_name, mask.shape[1], name, sequence.shape[1], "length")
        check_dim(mask_name, mask.shape[0], name, sequence.shape[0], "batch size")
        return mask

    def _padding(self, sequence, padding_mask):
        """`(sequence with its padded steps zeroed, bool (B, T) mask)`: explicit, else implicit.

        No mask at all (neither passed nor carried): `(sequence, None)`, so
        that nothing downstream pays for a mask of all `True`.
        """
        if padding_mask is None:
            padding_mask = implicit_mask(sequence)
            if padding_mask is None:
                return sequence, None
        padding_mask = masks.as_bool_mask(padding_mask)
        return masks.zero_padded(sequence, padding_mask), padding_mask

    # Each random sublayer draws its own seed (`sublayer_seed`).
    _SEEDS = {
        "self_attention": 0,
        "cross_attention": 1,
        "self_attention_dropout": 2,
        "cross_attention_dropout": 3,
        "feedforward_dropout": 4,
    }

    def _attention(self, width, name, seed_name, rotary_embedding=None, **positions):
        rate = self.dropout if self.attention_dropout is None else self.attention_dropout
        return MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self.key_dim or width // self.num_heads,
            num_key_value_heads=self.num_key_value_heads,
            dropout=rate,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            rotary_embedding=rotary_embedding,
            implementation=self.implementation,
            qkv_bias=self.qkv_bias,
            **positions,
            seed=sublayer_seed(self.seed, self._SEEDS[seed_name]),
            dtype=self.dtype_policy,
            name=name,
        )

    def _layer_norm(self, shape, name):
        norm = normalization_layer(
            self.normalization, self.layer_norm_epsilon, name, self.dtype_policy
        )
        norm.build(shape)
        return norm

    def _dropout(self, name):
        return keras.layers.Dropout(
            self.dropout,
            seed=sublayer_seed(self.seed, self._SEEDS[name]),
            dtype=self.dtype_policy,
            name=name,
        )

    def _dense(self, units, activation, name, input_shape):
        dense = MatmulDense(  # a Dense that a decoding loop can hoist the kernel of
            units,
            activation=activation,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
        dense.build(input_shape)
        return dense

    def _build_self_attention(self, shape, input_name, name):
        """keras-hub's weight order: attention (q, k, v, o), then its norm."""
        width = self._width = self._model_dim(shape, input_name)
        self._self_attention_layer = self._attention(
            width,
            name,
            "self_attention",
            self.rotary_embedding,
            position_bias=self.position_bias,
            sliding_window=self.sliding_window,
        )
        self._self_attention_layer.build(shape, shape)
        self._self_attention_layer_norm = self._layer_norm(shape, "self_attention_layer_norm")
        self._self_attention_dropout = self._dropout("self_attention_dropout")

    def _build_feedforward(self, shape, norm_before_kernels):
        """The feed-forward sublayers; `norm_before_kernels`: the encoder's weight order.

        Gated: the up projection (`intermediate`, no activation), then the gate
        (with it), as keras-hub's Llama decoder orders them.
        """
        if norm_before_kernels:
            self._feedforward_layer_norm = self._layer_norm(shape, "feedforward_layer_norm")
        gated = self.feedforward == "gated"
        self._feedforward_intermediate_dense = self._dense(
            self.intermediate_dim,
            None if gated else self.activation,
            "feedforward_intermediate_dense",
            shape,
        )
        self._feedforward_gate_dense = None
        if gated:
            self._feedforward_gate_dense = self._dense(
                self.intermediate_dim, self.activation, "feedforward_gate_dense", shape
            )
        self._feedforward_output_dense = self._dense(
            shape[-1],
            None,
            "feedforward_output_dense",
            tuple(shape[:-1]) + (self.intermediate_dim,),
        )
        if not norm_before_kernels:
            self._feedforward_layer_norm = self._layer_norm(shape, "feedforward_layer_norm")
        self._feedforward_dropout = self._dropout("feedforward_dropout")

    # Add & Norm, around a sublayer `f`: post-norm `norm(x + drop(f(x)))`, or pre-norm
    # `x + drop(f(norm(x)))`. In two halves, so that a sublayer's other results (weights,
    # caches) come back to the caller as they are: `f` reads `_residual_input(x, norm)`,
    # and `_residual(x, f(...), norm, dropout, training)` is the sublayer's output.

    def _residual_input(self, x, norm):
        """What a sublayer reads: `norm(x)` pre-norm, `x` post-norm."""
        return norm(x) if self.normalize_first else x

    def _residual(self, x, y, norm, dropout, training):
        """`x` plus its sublayer's output `y`: post-norm `norm(x + drop(y))`, pre `x + drop(y)`."""
        x = x + dropout(y, training=training)
        return x if self.normalize_first else norm(x)

    def _self_attention(
        self, x, mask, attention_mask, use_causal_mask, return_attention_scores, training,
        cache=None, cache_update_index=None,
    ):  # fmt: skip
        """`(output, weights or None, cache or None)`: `x` attending to itself.

        `mask` (bool `(B, T)` or `None`) is the padding of `x`, as queries and
        as keys; the other arguments are `MultiHeadAttention`'s. Weights only
        when asked: without them the attention may take a fast path.
        """
        return attention_results(
            self._self_attention_layer,
            x,
            x,
            query_mask=mask,
            value_mask=mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            cache=cache,
            cache_update_index=cache_update_index,
        )

    def _feedforward_residual(self, x, training):
        norm = self._feedforward_layer_norm
        h = self._residual_input(x, norm)
        y = self._feedforward_intermediate_dense(h)  # act(x W_1 + b_1), or x W_up
        if self._feedforward_gate_dense is not None:
            y = self._feedforward_gate_dense(h) * y  # act(x W_gate) * x W_up
        y = self._feedforward_output_dense(y)
        return self._residual(x, y, norm, self._feedforward_dropout, training)

    def compute_output_shape(self, *shapes, **kwargs):
        return tuple(shapes[0])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "num_heads": self.num_heads,
                "dropout": self.dropout,
                "activation": keras.activations.serialize(self.activation),
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "normalize_first": self.normalize_first,
                "attention_dropout": self.attention_dropout,
                "key_dim": self.key_dim,
                "num_key_value_heads": self.num_key_value_heads,
                "rotary_embedding": serialize_optional_layer(self.rotary_embedding),
                "implementation": self.implementation,
                "position_bias": serialize_optional_layer(self.position_bias),
                "sliding_window": self.sliding_window,
                "seed": self.seed,
                "normalization": self.normalization,
                "feedforward": self.feedforward,
                "use_bias": self.use_bias,
                "qkv_bias": self.qkv_bias,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = deserialize_optional_layer(config, "rotary_embedding")
        return cls(**deserialize_optional_layer(config, "position_bias"))
