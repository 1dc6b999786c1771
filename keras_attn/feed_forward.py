"""`FeedForward`: the position-wise feed-forward network of a Transformer block."""

import keras

from keras_attn._typing import ActivationLike, InitializerLike, TensorLike
from keras_attn.arguments import check_positive_int, check_rate, clone_initializer


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
        intermediate_dim: int,
        output_dim: int | None = None,
        activation: ActivationLike = "relu",
        dropout: float = 0.0,
        use_bias: bool = True,
        kernel_initializer: InitializerLike = "glorot_uniform",
        bias_initializer: InitializerLike = "zeros",
        seed: int | None = None,
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

    def call(self, inputs: TensorLike, training: bool | None = None) -> TensorLike:
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
