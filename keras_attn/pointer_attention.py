"""Pointer attention (Pointer Networks): the attention distribution is the output."""

import keras

from keras_attn._typing import InitializerLike
from keras_attn.additive_attention import AdditiveAttention
from keras_attn.arguments import check_positive_int


@keras.saving.register_keras_serializable(package="keras_attn")
class PointerAttention(AdditiveAttention):
    """Pointer attention: a distribution over the input positions.

    `u_ij = v^T tanh(W e_j + U d_i)`, `p(C_i = j) = softmax_j(u_ij)`, with
    `e_j` the encoder states (`value`, or `key` when given), `d_i` the
    decoder states (`query`) and `W (dk, units)`, `U (dq, units)`,
    `v (units,)` learned. The output is `p` itself, `(B, Tq, Tv)`, not a
    weighted sum of values: each decoder step points at one input position.
    It is `AdditiveAttention` with the combine step replaced.

    Padded positions (`value_mask`) and positions excluded by
    `attention_mask` get probability exactly 0. Pass the positions already
    chosen at earlier steps through `attention_mask`;
    `keras_attn.ops.chosen_positions_mask(pointers, Tv)` builds that mask
    from the pointer targets (teacher forcing) or from the decoded pointers.

    Args:
        units: positive hidden width of the score.
        use_bias: add a learned bias inside the tanh (not in the paper).
        kernel_initializer, bias_initializer: initializers of `W, U, v` and
            the bias.
        dropout: dropout rate on the distribution, in training (inverted
            dropout: rows sum to 1 only in expectation). Usually left at 0.
        seed: dropout seed.

    Call arguments:
        As `keras_attn.ScoreAttention`: `query` `(B, Tq, dq)` or `(B, dq)`,
        `value` `(B, Tv, dv)`, `key`, `query_mask`, `value_mask`,
        `attention_mask` (`(B, Tq, Tv)`, or `(B, Tv)` for a rank-2 query),
        `use_causal_mask`, `return_attention_scores`, `training`.

    Returns:
        The distribution `(B, Tq, Tv)` (or `(B, Tv)` for a rank-2 query);
        rows sum to 1 where a position is visible and are all zero where none
        is. With `return_attention_scores=True`, the pair
        `(distribution, distribution)`, to keep the shared signature.

    Example:

    >>> encoder_states = keras.random.normal((2, 5, 16))    # (B, Tv, dv)
    >>> decoder_states = keras.random.normal((2, 5, 16))    # (B, Tq, dq)
    >>> targets = keras.ops.convert_to_tensor([[3, 0, 4, 1, 2], [1, 2, 0, 4, 3]])
    >>> # step i may not point at targets[:, :i] (teacher forcing)
    >>> chosen = keras_attn.ops.chosen_positions_mask(targets, 5)   # (B, Tq, Tv)
    >>> pointer = keras_attn.PointerAttention(units=8)
    >>> probs = pointer(decoder_states, encoder_states, attention_mask=chosen)
    >>> print(probs.shape)                          # train with sparse CE on targets
    (2, 5, 5)

    Reference:
        Vinyals et al., 2015, "Pointer Networks", https://arxiv.org/abs/1506.03134
    """

    def __init__(
        self,
        units: int,
        use_bias: bool = False,
        kernel_initializer: InitializerLike = "glorot_uniform",
        bias_initializer: InitializerLike = "zeros",
        dropout: float = 0.0,
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(
            units=check_positive_int("units", units),
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            dropout=dropout,
            seed=seed,
            **kwargs,
        )

    needs_weights = True

    def combine(self, output, weights):
        return weights  # (B, Tq, Tv): the pointer distribution

    def output_width(self, query_shape, value_shape):
        return value_shape[1]  # Tv
