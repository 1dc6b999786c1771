"""`transformer_classifier`: token + position embedding, encoder blocks, pooling, classifier."""

import keras

import keras_attn

from .layers import MeanPooling

_POOLINGS = ("mean", "attention")


def transformer_classifier(
    vocab_size: int,
    sequence_length: int,
    num_classes: int,
    num_layers: int = 2,
    num_heads: int = 4,
    d_model: int = 64,
    intermediate_dim: int = 128,
    dropout: float = 0.1,
    pooling: str = "mean",
    position: str = "sinusoidal",
    normalize_first: bool = False,
    name: str = "transformer_classifier",
) -> keras.Model:
    """A Transformer encoder that classifies token sequences.

        x = Dropout(E[tokens] + PE)
        x = EncoderBlock_n(... EncoderBlock_1(x))
        logits = W pool(x) + b

    Token id 0 is padding: the embedding's mask reaches every block (padded
    tokens are never attended to) and the pooling (padded tokens never
    count). `pooling="attention"` pools with a learned context vector
    (`keras_attn.AttentionPooling`, Yang et al. 2016) instead of the mean.

    Args:
        vocab_size: number of token ids (0 is padding).
        sequence_length: longest input; the size of the learned position
            table with `position="learned"` (sinusoidal positions take any
            length).
        num_classes: number of classes; the model outputs logits.
        num_layers: encoder blocks.
        num_heads: attention heads per block.
        d_model: embedding and block width.
        intermediate_dim: feed-forward hidden width.
        dropout: on the embeddings and every residual branch (not on the
            attention weights).
        pooling: `"mean"` or `"attention"`.
        position: `"sinusoidal"` or `"learned"`.
        normalize_first: pre-norm blocks (then a final `LayerNormalization`).
        name: the model's name.

    Returns:
        A `keras.Model`: int tokens `(B, T)` -> logits `(B, num_classes)`.

    Example:

    >>> model = transformer_classifier(vocab_size=100, sequence_length=16, num_classes=3,
    ...                                num_layers=1, d_model=16, intermediate_dim=32)
    >>> print(model(np.ones((2, 16), "int32")).shape)
    (2, 3)

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762
    """
    if pooling not in _POOLINGS:
        raise ValueError(f"`pooling` must be one of {_POOLINGS}. Received: pooling={pooling!r}")
    # -- layers -------------------------------------------------------------
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    x = keras_attn.TokenAndPositionEmbedding(
        vocab_size, sequence_length, d_model, position=position, mask_zero=True, name="embedding"
    )(tokens)
    x = keras.layers.Dropout(dropout, name="embedding_dropout")(x)
    for i in range(num_layers):
        x = keras_attn.TransformerEncoder(
            intermediate_dim,
            num_heads,
            dropout=dropout,
            normalize_first=normalize_first,
            attention_dropout=0.0,
            name=f"encoder_block_{i}",
        )(x)
    if normalize_first:
        x = keras.layers.LayerNormalization(epsilon=1e-5, name="encoder_norm")(x)
    if pooling == "mean":
        # Over real tokens only; an all-padding input pools to zeros (not 0 / 0).
        x = MeanPooling(name="pooling")(x)
    else:
        x = keras_attn.AttentionPooling(d_model, name="pooling")(x)
    x = keras.layers.Dropout(dropout, name="pooled_dropout")(x)
    logits = keras.layers.Dense(num_classes, name="logits")(x)
    # -- model --------------------------------------------------------------
    return keras.Model(tokens, logits, name=name)
