"""`transformer_seq2seq`: the encoder-decoder Transformer, and its cached decoding steps."""

from typing import NamedTuple

import keras
from keras import ops

import keras_attn
from keras_attn._typing import Length, TensorLike


def transformer_seq2seq(
    source_vocab_size: int,
    target_vocab_size: int,
    num_layers: int = 2,
    num_heads: int = 4,
    d_model: int = 64,
    intermediate_dim: int = 128,
    dropout: float = 0.1,
    normalize_first: bool = False,
    max_length: int = 512,
    name: str = "transformer_seq2seq",
) -> keras.Model:
    """The encoder-decoder Transformer of Vaswani et al., trained with teacher forcing.

        e = Encoder(E_src[source] + PE)
        p(y_t | y_<t, x) = softmax(W Decoder(E_tgt[y_<t] + PE, e)_t)

    Token id 0 is padding on both sides: source padding is never attended
    to (by the encoder or by cross-attention) and padded target positions
    carry the mask, so Keras losses and metrics skip them. The decoder's
    self-attention is causal, so row `t` of the output sees
    `decoder_inputs[:, :t + 1]` only; with `decoder_inputs` = the targets
    shifted right behind a start token, row `t` predicts target `t`.
    Decode with `keras_attn.models.decoding.greedy_decode` / `beam_search` (KV-cached:
    a step costs O(T)).

    Args:
        source_vocab_size, target_vocab_size: token ids (0 is padding).
        num_layers: encoder blocks and decoder blocks.
        num_heads: attention heads per block.
        d_model: embedding and block width.
        intermediate_dim: feed-forward hidden width.
        dropout: on the embeddings and every residual branch (not on the
            attention weights).
        normalize_first: pre-norm blocks, each stack ending with a LayerNorm.
        max_length: a nominal longest sequence (sinusoidal positions accept
            any length).
        name: the model's name.

    Returns:
        A `keras.Model`: `{"encoder_inputs": (B, S), "decoder_inputs": (B, T)}`
        int tokens -> logits `(B, T, target_vocab_size)`.

    Example:

    >>> model = transformer_seq2seq(20, 30, num_layers=1, d_model=16, intermediate_dim=32)
    >>> out = model({"encoder_inputs": np.ones((2, 7), "int32"),
    ...              "decoder_inputs": np.ones((2, 5), "int32")})
    >>> print(out.shape)
    (2, 5, 30)

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762
    """
    # -- encoder ------------------------------------------------------------
    encoder_inputs = keras.Input((None,), dtype="int32", name="encoder_inputs")
    x = keras_attn.TokenAndPositionEmbedding(
        source_vocab_size,
        max_length,
        d_model,
        mask_zero=True,
        position="sinusoidal",
        name="encoder_embedding",
    )(encoder_inputs)
    x = keras.layers.Dropout(dropout, name="encoder_embedding_dropout")(x)
    for i in range(num_layers):
        x = keras_attn.TransformerEncoder(
            intermediate_dim, num_heads, dropout=dropout, normalize_first=normalize_first,
            attention_dropout=0.0, name=f"encoder_block_{i}",
        )(x)  # fmt: skip
    if normalize_first:
        x = keras.layers.LayerNormalization(epsilon=1e-5, name="encoder_norm")(x)
    # -- decoder ------------------------------------------------------------
    decoder_inputs = keras.Input((None,), dtype="int32", name="decoder_inputs")
    y = keras_attn.TokenAndPositionEmbedding(
        target_vocab_size,
        max_length,
        d_model,
        mask_zero=True,
        position="sinusoidal",
        name="decoder_embedding",
    )(decoder_inputs)
    y = keras.layers.Dropout(dropout, name="decoder_embedding_dropout")(y)
    for i in range(num_layers):
        y = keras_attn.TransformerDecoder(
            intermediate_dim, num_heads, dropout=dropout, normalize_first=normalize_first,
            attention_dropout=0.0, name=f"decoder_block_{i}",
        )(y, x)  # fmt: skip
    if normalize_first:
        y = keras.layers.LayerNormalization(epsilon=1e-5, name="decoder_norm")(y)
    logits = keras.layers.Dense(target_vocab_size, name="logits")(y)
    # -- model --------------------------------------------------------------
    inputs = {"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs}
    return keras.Model(inputs, logits, name=name)


def _layer_names(model):
    return {layer.name for layer in model.layers}


class TransformerDecodingState(NamedTuple):
    """The decoding state of a `transformer_seq2seq` (`TransformerDecodingSteps`).

    A `NamedTuple`, so the decoding loops carry it as a nest of tensors (`keras.tree`,
    `tf.while_loop`, `jax.lax` loops) and beam search reorders its rows (the batch axis).

    Args:
        self_attention_caches: one `keras_attn.KVCache` per decoder block, in block order:
            the target's keys and values `(B, h, max_length, dk)`, valid where written.
        cross_attention_caches: one `keras_attn.KVCache` per decoder block: the encoded
            source projected once `(B, h, S, dk)`, valid where the source is not padding;
            the steps read them, never write them.
    """

    self_attention_caches: list
    cross_attention_caches: list


class TransformerDecodingSteps:
    """Incremental decoding of a `transformer_seq2seq` model with KV caches.

    The decoding functions of `keras_attn.models.decoding` drive it: `start` encodes the
    source once (and projects it once per decoder block for
    cross-attention); each `step` embeds one token per example at position
    `index` and runs the decoder blocks on their caches, so a step costs
    O(T), not O(T^2). Everything is `keras.ops`, so the loop also runs inside
    a `tf.function` (a SavedModel's serving graph).

    Args:
        model: a model built by `transformer_seq2seq` (trained or reloaded).
    """

    @staticmethod
    def matches(model: keras.Model) -> bool:
        return {"encoder_embedding", "decoder_embedding", "decoder_block_0"} <= _layer_names(model)

    def __init__(self, model: keras.Model):
        names = _layer_names(model)
        self.blocks, i = [], 0
        while f"decoder_block_{i}" in names:
            self.blocks.append(model.get_layer(f"decoder_block_{i}"))
            i += 1
        last_encoder = "encoder_norm" if "encoder_norm" in names else f"encoder_block_{i - 1}"
        self.encoder = keras.Model(
            model.get_layer("encoder_inputs").output, model.get_layer(last_encoder).output
        )
        self.embedding = model.get_layer("decoder_embedding")
        self.norm = model.get_layer("decoder_norm") if "decoder_norm" in names else None
        self.logits = model.get_layer("logits")

    def start(self, encoder_inputs: TensorLike, max_length: int) -> TransformerDecodingState:
        """Encodes `(B, S)` source tokens; returns the initial decoding state."""
        encoded = self.encoder(encoder_inputs, training=False)  # (B, S, d)
        source_mask = ops.not_equal(encoder_inputs, 0)  # (B, S)
        batch = ops.shape(encoder_inputs)[0]
        return TransformerDecodingState(
            self_attention_caches=[b.empty_cache(batch, max_length) for b in self.blocks],
            cross_attention_caches=[
                b.compute_cross_attention_cache(encoded, source_mask) for b in self.blocks
            ],
        )

    def step(
        self,
        tokens: TensorLike,
        index: Length,
        state: TransformerDecodingState,
        return_alignment: bool = False,
    ) -> tuple[TensorLike, ...]:
        """`(B,)` tokens at position `index` -> next-token logits `(B, V)` and the new state.

        With `return_alignment=True` also the alignment, float32 `(B, S)`: the last decoder
        block's cross-attention weights of the token, averaged over the heads (0 on source
        padding), as `(logits, state, alignment)`.
        """
        x = self.embedding(ops.expand_dims(tokens, 1), start_index=index)  # (B, 1, d)
        caches, last = [], len(self.blocks) - 1
        for i, (block, cache, cross) in enumerate(
            zip(self.blocks, state.self_attention_caches, state.cross_attention_caches, strict=True)
        ):
            keep_weights = return_alignment and i == last  # the last block's weights only
            x, *weights, cache, _ = block(
                x,
                self_attention_cache=cache,
                self_attention_cache_update_index=index,
                cross_attention_cache=cross,
                training=False,
                return_attention_scores=keep_weights,
            )  # weights: [] or [self (B, h, 1, L), cross (B, h, 1, S)]
            caches.append(cache)
        if self.norm is not None:
            x = self.norm(x)
        logits = self.logits(x)[:, 0]
        state = state._replace(self_attention_caches=caches)
        if not return_alignment:
            return logits, state
        alignment = ops.mean(ops.cast(weights[1], "float32"), axis=1)[:, 0]  # (B, S)
        return logits, state, alignment
