"""Additive (Bahdanau) attention."""

import keras

from keras_attn._typing import InitializerLike
from keras_attn.base import FixedScoreAttention
from keras_attn.scores import AdditiveScore


@keras.saving.register_keras_serializable(package="keras_attn")
class AdditiveAttention(FixedScoreAttention):
    """Additive attention with Bahdanau's learned weights.

    `s(q, k) = v^T tanh(W k + U q)`, `att(q, (K, V)) = sum_j softmax_j(s(q, k_j)) v_j`,
    with `W (dk, units)`, `U (dq, units)` and `v (units,)` learned. Unlike
    `keras.layers.AdditiveAttention` (`sum(tanh(q + k))`, no projections),
    query and key may have different widths.

    Args:
        units: hidden width of the score; `None` means the key width.
        use_bias: add a learned bias inside the tanh (not in the paper).
        kernel_initializer, bias_initializer: initializers of `W, U, v` and
            the bias.
        dropout: dropout rate on the attention weights, in training.
        seed: dropout seed.
        implementation: the kernel, `"auto"` (default), `"dense"` or
            `"chunked"` (an online softmax over key blocks with the score's
            own gradient: memory `O(Tq * units)` per key block, never the
            `(B, Tq, Tv)` weights).

    Call arguments, Returns: as `keras_attn.ScoreAttention`.

    Example:

    >>> decoder_state = keras.random.normal((2, 32))        # (B, dq)
    >>> encoder_outputs = keras.random.normal((2, 7, 64))   # (B, Tv, dv)
    >>> context = keras_attn.AdditiveAttention(units=16)(decoder_state, encoder_outputs)
    >>> print(context.shape)
    (2, 64)

    Reference:
        Bahdanau et al., 2015, "Neural Machine Translation by Jointly Learning
        to Align and Translate", https://arxiv.org/abs/1409.0473
    """

    def __init__(
        self,
        units: int | None = None,
        use_bias: bool = False,
        kernel_initializer: InitializerLike = "glorot_uniform",
        bias_initializer: InitializerLike = "zeros",
        dropout: float = 0.0,
        seed: int | None = None,
        implementation: str = "auto",
        **kwargs,
    ):
        dtype = kwargs.get("dtype")
        score = AdditiveScore(
            units=units,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            dtype=dtype,
        )
        super().__init__(
            score=score, dropout=dropout, seed=seed, implementation=implementation, **kwargs
        )
        self.units = units
        self.use_bias = use_bias

    def get_config(self):
        config = super().get_config()
        score_config = self.score_layer.get_config()
        config.update(
            {
                "units": self.units,
                "use_bias": self.use_bias,
                "kernel_initializer": score_config["kernel_initializer"],
                "bias_initializer": score_config["bias_initializer"],
            }
        )
        return config
