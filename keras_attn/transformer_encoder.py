"""`TransformerEncoder`: self-attention and feed-forward, each with Add & Norm.

Each sublayer of a block (self-attention, cross-attention, feed-forward) is
wrapped in a residual connection and layer normalization, post-norm as in the
paper (`x = LayerNorm(x + Dropout(sublayer(x)))`) or pre-norm with
`normalize_first=True` (`x = x + Dropout(sublayer(LayerNorm(x)))`; a pre-norm
stack usually ends with one more `LayerNormalization`). The blocks take
keras-hub's arguments, call arguments and weight order
(`keras_attn.transformer_block`, what the encoder and `keras_attn.transformer_decoder`
share); the output mask is the input's padding mask, so it flows from block to block.
"""

import keras

from keras_attn._typing import TensorLike
from keras_attn.transformer_block import BLOCK_ARGS, TransformerBlock


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerEncoder(TransformerBlock):
    __doc__ = (
        """Transformer encoder block: self-attention and feed-forward, each with Add & Norm.

    `x = LN(x + MHA(x, x, x))`, `y = LN(x + FFN(x))` (post-norm), or with
    `normalize_first=True`: `x = x + MHA(LN(x))`, `y = x + FFN(LN(x))`.

    A drop-in for `keras_hub.layers.TransformerEncoder`: the same constructor
    and call arguments in the same order, the same sublayer names
    (`_self_attention_layer`, `_self_attention_layer_norm`,
    `_feedforward_layer_norm`, ...) and weight order, so
    `block.set_weights(keras_hub_encoder.get_weights())` loads. Padded steps
    (`padding_mask` or the implicit mask) are zeroed on entry: their rows of
    the output depend on nothing they held (keras-hub's keep their input).
"""
        + BLOCK_ARGS
        + """
    Call arguments:
        inputs: float `(B, T, d_model)`, `d_model` as when the block was built.
        padding_mask: bool `(B, T)`, `True` = real token. By default the
            implicit Keras mask of `inputs` (e.g. from
            `TokenAndPositionEmbedding(mask_zero=True)`); a passed one wins.
        attention_mask: bool `(B, T, T)`, merged with the padding mask.
        training: dropout on or off.
        return_attention_scores: also return the weights `(B, H, T, T)`.
        use_causal_mask: position `t` sees positions `<= t` only (ours).

    Returns:
        `(B, T, d_model)`, or `(output, weights)` with
        `return_attention_scores=True`. The output mask is the padding mask.

    Example:

    >>> tokens = keras.Input((12,), dtype="int32")
    >>> x = keras_attn.TokenAndPositionEmbedding(100, 12, 32)(tokens)
    >>> x = keras_attn.TransformerEncoder(intermediate_dim=64, num_heads=4)(x)
    >>> print(x.shape)
    (None, 12, 32)

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762; Xiong et al., 2020, "On Layer
        Normalization in the Transformer Architecture" (pre-norm),
        https://arxiv.org/abs/2002.04745; Zhang and Sennrich, 2019, "Root
        Mean Square Layer Normalization" (`normalization="rms_norm"`),
        https://arxiv.org/abs/1910.07467; Shazeer, 2020, "GLU Variants
        Improve Transformer" (`feedforward="gated"`),
        https://arxiv.org/abs/2002.05202
    """
    )

    output_mask_argument = "padding_mask"  # the explicit output mask (`compute_mask`)

    def build(self, inputs_shape):
        # keras-hub's weight order: attention, its norm, the feed-forward norm, its kernels.
        self._build_self_attention(inputs_shape, "inputs", "self_attention_layer")
        self._build_feedforward(inputs_shape, norm_before_kernels=True)
        self.built = True

    def call(
        self,
        inputs: TensorLike,
        padding_mask: TensorLike | None = None,
        attention_mask: TensorLike | None = None,
        training: bool | None = None,
        return_attention_scores: bool = False,
        use_causal_mask: bool = False,
    ) -> TensorLike | tuple[TensorLike, TensorLike]:
        padding_mask = self._check_sequence(
            "inputs", inputs, self._width, "padding_mask", padding_mask
        )
        inputs, padding_mask = self._padding(inputs, padding_mask)
        norm = self._self_attention_layer_norm
        y, weights, _ = self._self_attention(
            self._residual_input(inputs, norm), padding_mask, attention_mask, use_causal_mask,
            return_attention_scores, training,
        )  # fmt: skip
        x = self._residual(inputs, y, norm, self._self_attention_dropout, training)
        x = self._feedforward_residual(x, training)
        x = self.with_output_mask(x, padding_mask)  # None: the implicit mask passes through
        return (x, weights) if return_attention_scores else x

    def compute_output_spec(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        use_causal_mask=False,
    ):
        output = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        output = self.with_output_mask(output, padding_mask)
        if not return_attention_scores:
            return output
        batch, length = inputs.shape[0], inputs.shape[1]
        weights = keras.KerasTensor((batch, self.num_heads, length, length), self.compute_dtype)
        return output, weights


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerEncoderBlock(TransformerEncoder):
    """`TransformerEncoder` under its former name: the files saved under that name load.

    The same layer. Keras keys a model's weights by each layer's snake-cased
    class name, so this subclass keeps `transformer_encoder_block` for the `.keras`
    and weights files written before the rename; new code writes
    `TransformerEncoder`, whose files load into keras-hub's and back.
    """
