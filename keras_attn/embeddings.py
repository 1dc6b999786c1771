"""Token embedding plus position encoding, with keras-hub's signature and reverse projection."""

import keras
from keras import ops

from keras_attn._typing import InitializerLike, RegularizerLike, TensorLike
from keras_attn.arguments import check_positive_int, check_positive_number, clone_initializer
from keras_attn.positional import (
    PositionEmbedding,
    SinePositionEncoding,
    check_min_rank,
)

POSITIONS = ("learned", "sinusoidal")


@keras.saving.register_keras_serializable(package="keras_attn")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus position encoding: `x_t = E[token_t] + PE(t)`.

    The usual input layer of a Transformer, with keras-hub's signature: its
    weights load with `set_weights` and give equal outputs (tested). `E` is a
    `keras.layers.ReversibleEmbedding` (the attribute `token_embedding`):
    `layer.token_embedding(hidden, reverse=True)` projects hidden states
    `(..., embedding_dim)` back to logits `(..., vocabulary_size)`, by `E^T`
    with `tie_weights=True`, else by a separate `(embedding_dim,
    vocabulary_size)` table. With `mask_zero=True` token id 0 is padding: the
    output carries the mask `token != 0`, so downstream attention layers
    ignore padded keys.

    Args:
        vocabulary_size: number of token ids.
        sequence_length: rows of the learned table (sinusoidal: any length).
        embedding_dim: width of the output.
        tie_weights: whether the reverse projection uses the token table
            (`True`) or a table of its own.
        embeddings_initializer: of the token table, the reverse table and the
            learned position table (each gets its own copy).
        mask_zero: whether token id 0 is padding.
        position: `"learned"` (`PositionEmbedding`, keras-hub's only
            kind) or `"sinusoidal"` (`SinePositionEncoding`).
        embeddings_regularizer: of the token table.
        max_wavelength: of the sinusoidal encoding.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: token ids `(B, T)` or `(B, ..., T)`: the sequence is the last
            axis.
        start_index: position of the first token (int or scalar tensor).
        positions: `None`, or every token's position, `(T,)` or `(B, T)`;
            replaces `start_index`.

    Returns:
        `inputs.shape + (embedding_dim,)`, with the implicit mask
        `inputs != 0` when `mask_zero`.

    Example:

    >>> layer = keras_attn.TokenAndPositionEmbedding(1000, 64, 32, mask_zero=True)
    >>> x = layer(keras.ops.array([[5, 7, 9, 0]]))
    >>> print(x.shape, layer.token_embedding(x, reverse=True).shape)
    (1, 4, 32) (1, 4, 1000)

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762; tied input and output embeddings:
        Press and Wolf, 2017, https://arxiv.org/abs/1608.05859
    """

    def __init__(
        self,
        vocabulary_size: int,
        sequence_length: int,
        embedding_dim: int,
        tie_weights: bool = True,
        embeddings_initializer: InitializerLike = "uniform",
        mask_zero: bool = False,
        position: str = "learned",
        embeddings_regularizer: RegularizerLike | None = None,
        max_wavelength: float = 10000,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        self.sequence_length = check_positive_int("sequence_length", sequence_length)
        self.embedding_dim = check_positive_int("embedding_dim", embedding_dim)
        for name, value in (("tie_weights", tie_weights), ("mask_zero", mask_zero)):
            if not isinstance(value, bool):
                raise TypeError(f"`{name}` must be a bool. Received: {name}={value!r}")
        if position not in POSITIONS:
            raise ValueError(
                f"`position` must be one of {POSITIONS}. Received: position={position!r}"
            )
        self.tie_weights = tie_weights
        self.mask_zero = mask_zero
        self.position = position
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.embeddings_regularizer = keras.regularizers.get(embeddings_regularizer)
        self.max_wavelength = check_positive_number("max_wavelength", max_wavelength)

        self.token_embedding = keras.layers.ReversibleEmbedding(
            self.vocabulary_size,
            self.embedding_dim,
            tie_weights=tie_weights,
            embeddings_initializer=clone_initializer(self.embeddings_initializer),
            embeddings_regularizer=self.embeddings_regularizer,
            mask_zero=mask_zero,
            dtype=self.dtype_policy,
            name="token_embedding",
        )  # the output's mask is computed here, in compute_mask
        if position == "learned":
            self.position_embedding = PositionEmbedding(
                self.sequence_length,
                initializer=clone_initializer(self.embeddings_initializer),
                dtype=self.dtype_policy,
                name="position_embedding",
            )
        else:
            self.position_embedding = SinePositionEncoding(
                self.max_wavelength, dtype=self.dtype_policy, name="position_embedding"
            )

    def build(self, inputs_shape):
        check_min_rank("inputs", inputs_shape, 2)
        self.token_embedding.build(inputs_shape)
        if not self.tie_weights:
            # Keras draws the reverse table with the token table's initializer
            # instance, i.e. the same numbers reshaped: give it its own draw.
            reverse = self.token_embedding.reverse_embeddings
            initializer = clone_initializer(self.embeddings_initializer)
            reverse.assign(initializer(reverse.shape, dtype=reverse.dtype))
        self.position_embedding.build(self.compute_output_shape(inputs_shape))
        self.built = True

    def call(
        self,
        inputs: TensorLike,
        start_index: int | TensorLike = 0,
        positions: TensorLike | None = None,
    ) -> TensorLike:
        tokens = self.token_embedding(inputs)  # (B, ..., T, embedding_dim)
        return tokens + self.position_embedding(
            tokens, start_index=start_index, positions=positions
        )

    def compute_mask(self, inputs, mask=None):
        return ops.not_equal(inputs, 0) if self.mask_zero else None

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape) + (self.embedding_dim,)

    def get_config(self):
        config = super().get_config()
        names = ("vocabulary_size", "sequence_length", "embedding_dim", "tie_weights")
        config.update({name: getattr(self, name) for name in names})
        config.update(
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
            mask_zero=self.mask_zero,
            position=self.position,
            embeddings_regularizer=keras.regularizers.serialize(self.embeddings_regularizer),
            max_wavelength=self.max_wavelength,
        )
        return config
