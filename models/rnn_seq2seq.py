"""RNN encoder-decoder with an attention context vector at every decoder step."""

from typing import Any, NamedTuple

import keras

import keras_attn
from keras_attn._typing import Length, TensorLike

_CELLS = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}
_SCORES = ("additive", "dot", "scaled_dot", "bilinear")


def _attention_layer(score, attention_units):
    if score == "additive":
        return keras_attn.AdditiveAttention(units=attention_units, name="attention")
    return keras_attn.ScoreAttention(score=score, name="attention")


def rnn_seq2seq(
    source_vocab_size: int,
    target_vocab_size: int,
    embedding_dim: int,
    units: int,
    score: str | None = "additive",
    cell: str = "lstm",
    attention_units: int | None = None,
    return_attention: bool = False,
    name: str = "rnn_seq2seq",
) -> keras.Model:
    """RNN encoder-decoder with attention over the encoder outputs.

        h_1..h_S, state = EncoderRNN(embed(x))
        s_1..s_T        = DecoderRNN(embed(y_in), initial_state=state)
        c_t             = sum_j softmax_j(score(s_t, h_j)) h_j
        logits_t        = W_o tanh(W_c [c_t; s_t])

    Luong et al.'s global attention: the decoder outputs `s_t` are the
    queries, so every step is computed in one teacher-forced pass.
    `score="additive"` uses Bahdanau's score `v^T tanh(W h_j + U s_t)`
    (`keras_attn.AdditiveAttention`); `"dot"`, `"scaled_dot"` and
    `"bilinear"` (Luong's "general") use `keras_attn.ScoreAttention`.
    `score=None` is the baseline without attention: `logits_t = W_o tanh(W_c s_t)`.

    Token id 0 is padding in both inputs (`Embedding(mask_zero=True)`):
    padded source tokens get exactly zero attention weight, and the output
    carries the decoder-input mask, so Keras leaves padded target steps out
    of the loss and of the metrics.

    Inputs, a dict:
        "encoder_inputs": int32 `(B, S)` source token ids.
        "decoder_inputs": int32 `(B, T)` target token ids shifted right
            (start token first), for teacher forcing.

    Args:
        source_vocab_size, target_vocab_size: vocabulary sizes (including 0).
        embedding_dim: width of both token embeddings.
        units: width of the encoder and decoder RNNs and of the attentional
            hidden layer.
        score: `"additive"`, `"dot"`, `"scaled_dot"`, `"bilinear"`, or `None`.
        cell: `"lstm"` or `"gru"`.
        attention_units: hidden width of the additive score; `None` means `units`.
        return_attention: also output the attention weights `(B, T, S)`; the
            model then outputs a dict `{"logits", "attention"}`. The layers are
            the same, so a trained model's weights load into it with
            `set_weights`.
        name: model name.

    Returns:
        A `keras.Model` with output logits `(B, T, target_vocab_size)` (not
        probabilities: train with
        `keras.losses.SparseCategoricalCrossentropy(from_logits=True)`).

    Example:

    >>> model = rnn_seq2seq(100, 120, embedding_dim=16, units=32, score="bilinear")
    >>> source = np.array([[5, 8, 13, 0], [7, 2, 0, 0]], "int32")
    >>> target_in = np.array([[1, 9, 4], [1, 3, 0]], "int32")
    >>> logits = model({"encoder_inputs": source, "decoder_inputs": target_in})
    >>> print(logits.shape)
    (2, 3, 120)
    >>> loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    >>> model.compile("adam", loss)

    References:
        Bahdanau et al., 2015, "Neural Machine Translation by Jointly Learning
        to Align and Translate", https://arxiv.org/abs/1409.0473
        Luong et al., 2015, "Effective Approaches to Attention-based Neural
        Machine Translation", https://arxiv.org/abs/1508.04025
    """
    if score is not None and score not in _SCORES:
        raise ValueError(f"`score` must be one of {_SCORES} or None. Received: score={score!r}")
    if cell not in _CELLS:
        raise ValueError(f"`cell` must be one of {tuple(_CELLS)}. Received: cell={cell!r}")
    if return_attention and score is None:
        raise ValueError("`return_attention=True` needs a `score`. Received: score=None")
    rnn = _CELLS[cell]

    # -- inputs ------------------------------------------------------------
    source = keras.Input((None,), dtype="int32", name="encoder_inputs")  # (B, S)
    target_in = keras.Input((None,), dtype="int32", name="decoder_inputs")  # (B, T)

    # -- encoder -----------------------------------------------------------
    x = keras.layers.Embedding(
        source_vocab_size, embedding_dim, mask_zero=True, name="encoder_embedding"
    )(source)
    encoder = rnn(units, return_sequences=True, return_state=True, name="encoder")
    encoder_outputs, *state = encoder(x)  # (B, S, units), the final state(s)

    # -- decoder (teacher forcing) -----------------------------------------
    y = keras.layers.Embedding(
        target_vocab_size, embedding_dim, mask_zero=True, name="decoder_embedding"
    )(target_in)
    decoder = rnn(units, return_sequences=True, name="decoder")
    decoder_outputs = decoder(y, initial_state=state)  # (B, T, units)

    # -- attention: masks come from the embeddings (query and value masks) --
    hidden = decoder_outputs
    if score is not None:
        context, weights = _attention_layer(score, attention_units or units)(
            decoder_outputs, encoder_outputs, return_attention_scores=True
        )  # (B, T, units), (B, T, S)
        hidden = keras.layers.Concatenate(name="context_and_output")([context, decoder_outputs])

    # -- output ------------------------------------------------------------
    hidden = keras.layers.Dense(units, activation="tanh", name="attentional_hidden")(hidden)
    logits = keras.layers.Dense(target_vocab_size, name="logits")(hidden)  # (B, T, V)
    inputs = {"encoder_inputs": source, "decoder_inputs": target_in}
    outputs = {"logits": logits, "attention": weights} if return_attention else logits
    return keras.Model(inputs, outputs, name=name)


class RNNDecodingState(NamedTuple):
    """The decoding state of an `rnn_seq2seq` (`RNNDecodingSteps`).

    A `NamedTuple`, so the decoding loops carry it as a nest of tensors (`keras.tree`,
    `tf.while_loop`, `jax.lax` loops) and beam search reorders its rows (the batch axis).

    Args:
        encoder_outputs: `(B, S, units)`: the encoder's outputs, the attention's values.
        source_mask: bool `(B, S)`: `True` where the source is not padding.
        states: the decoder cell's states, a list of `(B, units)`: `[h, c]` (LSTM) or
            `[h]` (GRU); the only field a step changes.
    """

    encoder_outputs: Any
    source_mask: Any
    states: list


class RNNDecodingSteps:
    """Step-by-step decoding of an `rnn_seq2seq` model, one RNN cell step per token.

    `start` runs the encoder once; `step` embeds one token per example,
    advances the decoder cell from its state, attends over the encoder
    outputs with the new cell output as the query, and returns the logits,
    exactly as the teacher-forced model computes row `t`. Driven by
    `keras_attn.models.decoding.greedy_decode` / `beam_search`.

    Args:
        model: a model built by `rnn_seq2seq` (trained or reloaded).
    """

    @staticmethod
    def matches(model: keras.Model) -> bool:
        names = {layer.name for layer in model.layers}
        return {"encoder", "decoder", "decoder_embedding", "attentional_hidden"} <= names

    def __init__(self, model: keras.Model):
        names = {layer.name for layer in model.layers}
        self.encoder = keras.Model(
            model.get_layer("encoder_inputs").output, model.get_layer("encoder").output
        )  # [outputs (B, S, units), *final states]
        self.embedding = model.get_layer("decoder_embedding")
        self.cell = model.get_layer("decoder").cell
        self.attention = model.get_layer("attention") if "attention" in names else None
        self.concat = model.get_layer("context_and_output") if self.attention else None
        self.hidden = model.get_layer("attentional_hidden")
        self.logits = model.get_layer("logits")

    def start(self, encoder_inputs: TensorLike, max_length: int) -> RNNDecodingState:
        """Encodes `(B, S)` source tokens; returns the initial decoding state."""
        del max_length  # an RNN state does not grow
        outputs, *states = self.encoder(encoder_inputs, training=False)
        return RNNDecodingState(
            encoder_outputs=outputs,
            source_mask=keras.ops.not_equal(encoder_inputs, 0),
            states=list(states),
        )

    def step(
        self,
        tokens: TensorLike,
        index: Length,
        state: RNNDecodingState,
        return_alignment: bool = False,
    ) -> tuple[TensorLike, ...]:
        """`(B,)` tokens -> next-token logits `(B, V)` and the new state.

        With `return_alignment=True` also the alignment, float32 `(B, S)`: the attention
        weights of the step over the encoder outputs (0 on source padding), as
        `(logits, state, alignment)`.

        Raises:
            ValueError: `return_alignment=True` for a model without attention (`score=None`).
        """
        del index  # the RNN state carries the position
        if return_alignment and self.attention is None:
            raise ValueError(
                "This rnn_seq2seq has no attention (score=None): it has no alignment to "
                "return. Received: return_alignment=True"
            )
        x = keras.ops.take(self.embedding.embeddings, tokens, axis=0)  # (B, E), no mask
        output, states = self.cell(x, state.states, training=False)  # (B, units)
        states = list(states) if isinstance(states, (list, tuple)) else [states]
        hidden = keras.ops.expand_dims(output, 1)  # (B, 1, units)
        if self.attention is not None:
            context = self.attention(
                hidden, state.encoder_outputs, value_mask=state.source_mask,
                return_attention_scores=return_alignment,
            )  # fmt: skip
            if return_alignment:
                context, weights = context  # (B, 1, units), (B, 1, S)
            hidden = self.concat([context, hidden])  # context: (B, 1, units)
        logits = self.logits(self.hidden(hidden))[:, 0]  # (B, V)
        state = state._replace(states=states)
        if not return_alignment:
            return logits, state
        return logits, state, keras.ops.cast(weights[:, 0], "float32")
