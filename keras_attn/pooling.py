"""Attention pooling with a learned context vector (Hierarchical Attention Networks)."""

import keras
from keras import ops as kops

from keras_attn import masks
from keras_attn import ops as attn_ops
from keras_attn._typing import InitializerLike, TensorLike
from keras_attn.arguments import check_floating, check_positive_int, check_rank, check_rate


@keras.saving.register_keras_serializable(package="keras_attn")
class AttentionPooling(keras.layers.Layer):
    """Attention pooling of a sequence into one vector, with a learned context.

        u_t = tanh(W h_t + b)
        a_t = softmax_t(u_t . u_w)
        s = sum_t a_t h_t

    with `W (d, units)`, `b (units,)` and the context vector `u_w (units,)`
    learned. HAN uses it twice: words into a sentence vector, sentences into
    a document vector. It is not a query/value layer (the query is the
    learned `u_w`), so it takes one input.

    Args:
        units: positive width of the hidden representation `u_t`.
        use_bias: whether `b` is used.
        kernel_initializer, bias_initializer, context_initializer:
            initializers of `W`, `b` and `u_w`.
        dropout: dropout rate on the weights `a`, in training.
        seed: dropout seed.

    Call arguments:
        inputs: `(B, T, d)` sequence `h`.
        mask: bool `(B, T)`, `True` = keep; filled by Keras from an implicit
            mask (e.g. `Embedding(mask_zero=True)`). Masked steps get weight
            exactly 0; an example with no unmasked step (or `T = 0`) pools to
            zeros (with finite gradients). A NaN or inf at a masked step
            never reaches the output; at an unmasked step it makes the
            example's output NaN.
        return_attention_scores: also return the weights `a`.
        training: dropout on or off.

    Returns:
        `(B, d)`, or `(pooled, weights)` with `weights (B, T)` when
        `return_attention_scores=True`. The output carries no mask.

    Example:

    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(1000, 32, mask_zero=True)(tokens)
    >>> x = keras.layers.Bidirectional(keras.layers.GRU(16, return_sequences=True))(x)
    >>> sentence = keras_attn.AttentionPooling(units=32)(x)   # padding masked
    >>> print(sentence.shape)
    (None, 32)

    Reference:
        Yang et al., 2016, "Hierarchical Attention Networks for Document
        Classification", https://aclanthology.org/N16-1174
    """

    def __init__(
        self,
        units: int,
        use_bias: bool = True,
        kernel_initializer: InitializerLike = "glorot_uniform",
        bias_initializer: InitializerLike = "zeros",
        context_initializer: InitializerLike = "glorot_uniform",
        dropout: float = 0.0,
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units = check_positive_int("units", units)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.context_initializer = keras.initializers.get(context_initializer)
        self.dropout = check_rate("dropout", dropout)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True

    def build(self, inputs_shape):
        check_rank("inputs", inputs_shape, (3,))
        if inputs_shape[-1] is None:
            raise ValueError(
                "The last axis of `inputs` must be known. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        self.kernel = self.add_weight(  # W
            name="kernel",
            shape=(inputs_shape[-1], self.units),
            initializer=self.kernel_initializer,
        )
        self.bias = (  # b
            self.add_weight(name="bias", shape=(self.units,), initializer=self.bias_initializer)
            if self.use_bias
            else None
        )
        self.context = self.add_weight(  # u_w
            name="context", shape=(self.units,), initializer=self.context_initializer
        )

    def call(
        self,
        inputs: TensorLike,
        mask: TensorLike | None = None,
        return_attention_scores: bool = False,
        training: bool | None = None,
    ) -> TensorLike | tuple[TensorLike, TensorLike]:
        check_rank("inputs", inputs.shape, (3,))
        check_floating("inputs", inputs)
        if inputs.shape[-1] != self.kernel.shape[0]:
            raise ValueError(
                f"`inputs` must have width {self.kernel.shape[0]}, the width this layer was "
                f"built for. Received: inputs.shape={tuple(inputs.shape)}"
            )
        if mask is not None:
            mask = masks.as_bool_mask(mask, "mask")
            check_rank("mask", mask.shape, (2,))
            for axis, what in ((0, "batch size"), (1, "length")):
                if None not in (mask.shape[axis], inputs.shape[axis]):
                    if mask.shape[axis] != inputs.shape[axis]:
                        raise ValueError(
                            f"`mask` and `inputs` must have the same {what}. Received: "
                            f"mask.shape={tuple(mask.shape)}, inputs.shape={tuple(inputs.shape)}"
                        )
        # Masked steps zeroed first: nothing they hold (huge, inf, NaN) reaches the
        # output or a gradient (dW = h^T dU would be 0 * NaN).
        inputs = masks.zero_padded(inputs, mask)
        hidden = kops.matmul(inputs, self.kernel)  # (B, T, units)
        if self.bias is not None:
            hidden = hidden + self.bias
        keys = kops.tanh(hidden)  # u_t
        context = kops.reshape(kops.cast(self.context, keys.dtype), (1, 1, self.units))
        query = kops.broadcast_to(context, (kops.shape(keys)[0], 1, self.units))  # (B, 1, units)
        spec = attn_ops.AttentionSpec(
            mask=None if mask is None else mask[:, None, :],  # (B, 1, T)
            scale=1.0,
            dropout_rate=self.dropout,
            seed=self.seed_generator,
            training=training,
        )
        # a_t = softmax_t(u_t . u_w), s = sum_t a_t h_t: one query, the learned context.
        pooled, weights = attn_ops.attention(query, keys, inputs, spec=spec)
        pooled, weights = pooled[:, 0], weights[:, 0]  # (B, d), (B, T)
        if return_attention_scores:
            return pooled, weights
        return pooled

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, inputs_shape):
        return (inputs_shape[0], inputs_shape[-1])

    def compute_output_spec(self, inputs, mask=None, return_attention_scores=False, training=None):
        pooled = keras.KerasTensor(
            self.compute_output_shape(inputs.shape), dtype=self.compute_dtype
        )
        if not return_attention_scores:
            return pooled
        weights = keras.KerasTensor(tuple(inputs.shape[:2]), dtype=self.compute_dtype)
        return pooled, weights

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "context_initializer": keras.initializers.serialize(self.context_initializer),
                "dropout": self.dropout,
                "seed": self.seed,
            }
        )
        return config
