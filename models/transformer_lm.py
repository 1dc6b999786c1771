"""`transformer_lm`: a decoder-only Transformer language model (the GPT family), and its steps."""

from typing import Any, NamedTuple

import keras
import numpy as np
from keras import ops

import keras_attn
from keras_attn import quantized
from keras_attn._typing import ActivationLike, Length, TensorLike
from keras_attn.arguments import check_positive_int, check_rate
from keras_attn.cache import RingKVCache
from keras_attn.positional import static_array
from keras_attn.transformer_block import normalization_layer

from .layers import DropMask, TokenPadding, TokenPositions, check_padding_id

POSITIONS = ("learned", "sinusoidal", "rotary", "alibi")
# `rope_scaling`'s keys: `keras_attn.RotaryEmbedding`'s scaling arguments.
ROPE_SCALING = (
    "rope_type",
    "scaling_factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)
_EMBEDDED = ("learned", "sinusoidal")  # added to the token embedding; the others act on scores


def transformer_lm(
    vocab_size: int,
    num_layers: int = 2,
    num_heads: int = 4,
    d_model: int = 64,
    intermediate_dim: int = 128,
    num_key_value_heads: int | None = None,
    position: str = "learned",
    sequence_length: int = 1024,
    sliding_window: int | None = None,
    dropout: float = 0.1,
    activation: ActivationLike = "gelu",
    layer_norm_epsilon: float = 1e-5,
    normalize_first: bool = True,
    tie_weights: bool = True,
    max_wavelength: float = 10000,
    implementation: str = "auto",
    name: str = "transformer_lm",
    *,
    normalization: str = "layer_norm",
    feedforward: str = "dense",
    use_bias: bool = True,
    qkv_bias: bool | None = None,
    rope_scaling: dict | None = None,
    padding_id: int = 0,
) -> keras.Model:
    """A decoder-only Transformer language model (GPT): next-token logits at every position.

        x = Dropout(E[tokens] + PE(positions))
        x = DecoderBlock_n(... DecoderBlock_1(x))      (causal self-attention only)
        logits = LN(x) E^T                              (tied; else a table of its own)

    The Llama family is the same model with other options: `position="rotary"`,
    `normalization="rms_norm"`, `feedforward="gated"`, `activation="silu"`,
    `use_bias=False`, `tie_weights=False`, `dropout=0.0`, plus
    `num_key_value_heads` (Llama 2 70B, Llama 3), `rope_scaling` (Llama 3.1),
    `sliding_window` (Mistral) or `qkv_bias=True` (Qwen2):

        x = E[tokens]
        x = x + Attn(RMS(x)),  x = x + W_down(silu(W_gate RMS(x)) * W_up RMS(x))   (per block)
        logits = RMS(x) W_out

    Row `t` of the output sees `tokens[:, :t + 1]` only, so with inputs
    `tokens[:, :-1]` and targets `tokens[:, 1:]` every position predicts the
    next token. Token id 0 is padding (`padding_id`): padded keys are never
    attended to and padded rows output the final norm's bias; train with
    `keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)`
    so padded targets do not count. Positions count real tokens only
    (`keras_attn.models.layers.TokenPositions`), so a row's logits do not depend on
    how much padding precedes or follows it; without padding they are
    `0, 1, ..., T - 1` (Hugging Face's). A model whose id 0 is a real token
    (a Hugging Face checkpoint's: `keras_attn.models.from_transformers`) takes
    `padding_id=-1`: padding is then -1, outside the vocabulary, in its inputs
    and in the prompts of `generate`, and every id of the vocabulary can be
    generated (`ignore_class=-1` in the loss).

    Generate with `keras_attn.models.generate` (compiled), or with
    `greedy_decode` / `sample_decode` / `beam_search` and `start_id=None`: a
    prefill of the prompts, then one KV-cached step per token
    (`LanguageModelSteps`).

    The argument names are the zoo's (`vocab_size`, `d_model`,
    `sequence_length`) and, for what the zoo has not, keras-hub's
    (`num_key_value_heads`, `layer_norm_epsilon`); keras-hub's GPT-2 calls
    them `vocabulary_size`, `hidden_dim`, `max_sequence_length`
    (`keras_attn.models.gpt2.from_gpt2_backbone` converts one).

    Args:
        vocab_size: number of token ids (0 is padding).
        num_layers: decoder blocks.
        num_heads: query heads per block.
        d_model: embedding and block width.
        intermediate_dim: feed-forward hidden width.
        num_key_value_heads: `None` (one key/value head per query head), or
            fewer, dividing `num_heads`: grouped-query attention (a smaller
            KV cache).
        position: `"learned"` (GPT-2), `"sinusoidal"`, `"rotary"` (Llama;
            queries and keys rotated in every block) or `"alibi"` (a linear
            distance penalty on the scores, no position embedding).
        sequence_length: rows of the learned position table, i.e. the
            longest prompt + generation with `position="learned"`; the other
            schemes take any length.
        sliding_window: `None`, or a positive int: each token attends to the
            last `sliding_window` positions only (Mistral). Generation then
            keeps a ring of that many positions per block
            (`LanguageModelSteps`): its memory does not grow with the tokens,
            and with rotary, ALiBi or sinusoidal positions it continues past
            any length.
        dropout: on the embeddings, every residual branch and the attention
            weights.
        activation: of the feed-forward networks.
        layer_norm_epsilon: of every layer normalization.
        normalize_first: pre-norm blocks followed by a final
            `LayerNormalization` (GPT-2); `False`: post-norm blocks.
        tie_weights: the output projection is the token table transposed
            (`True`), or a table of its own.
        max_wavelength: of the sinusoidal or rotary positions (Hugging Face's
            `rope_theta`).
        implementation: the attention kernel of every block, `"auto"`,
            `"dense"`, `"fused"` or `"chunked"` (long contexts in bounded
            memory; see `keras_attn.MultiHeadAttention`).
        name: the model's name.

        The Llama family's options (keyword-only; the defaults give GPT-2's
        model; see `keras_attn.TransformerDecoder` for each):

        normalization: `"layer_norm"` or `"rms_norm"`: every block's norms
            and the final norm (`layer_norm_epsilon` is the RMS norm's
            epsilon too: Hugging Face's `rms_norm_eps`).
        feedforward: `"dense"` or `"gated"` (`(act(x W_gate) * x W_up) W_down`).
        use_bias: whether the attention and feed-forward projections have
            biases (Llama, Mistral: `False`). The logits' projection (tied or
            not) has none either way.
        qkv_bias: whether the query, key and value projections have biases
            (`None`: `use_bias`; Qwen2: `True` with `use_bias=False`).
        rope_scaling: with `position="rotary"`, `None` or a dict of
            `keras_attn.RotaryEmbedding`'s scaling arguments (`rope_type`,
            `scaling_factor`, `low_freq_factor`, `high_freq_factor`,
            `original_max_position_embeddings`), e.g.
            `{"scaling_factor": 4.0}` (linear: positions divided by 4) or
            Llama 3.1's `{"rope_type": "llama3", "scaling_factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}`. Hugging Face's
            `rope_scaling` names `scaling_factor` `factor`.
        padding_id: the id that marks padding in the tokens: 0 (the zoo's:
            id 0 is no token and is never generated), or a negative id (-1:
            every id in `[0, vocab_size)` is a token, as in a Hugging Face
            checkpoint).

    Returns:
        A `keras.Model`: int32 tokens `(B, T)` -> logits `(B, T, vocab_size)`.

    Example:

    >>> model = transformer_lm(100, num_layers=1, d_model=16, intermediate_dim=32)
    >>> print(model(np.ones((2, 7), "int32")).shape)
    (2, 7, 100)

    A Llama-3-style model:

    >>> llama = transformer_lm(
    ...     100, num_layers=1, d_model=16, intermediate_dim=32, num_key_value_heads=2,
    ...     position="rotary", dropout=0.0, activation="silu", normalize_first=True,
    ...     tie_weights=False, max_wavelength=500000, normalization="rms_norm",
    ...     feedforward="gated", use_bias=False,
    ...     rope_scaling={"rope_type": "llama3", "scaling_factor": 8.0})
    >>> print(llama(np.ones((2, 7), "int32")).shape)
    (2, 7, 100)

    References:
        Radford et al., 2019, "Language Models are Unsupervised Multitask
        Learners" (GPT-2); Vaswani et al., 2017, "Attention Is All You
        Need", https://arxiv.org/abs/1706.03762; Touvron et al., 2023,
        "Llama 2", https://arxiv.org/abs/2307.09288; Grattafiori et al.,
        2024, "The Llama 3 Herd of Models", https://arxiv.org/abs/2407.21783;
        Jiang et al., 2023, "Mistral 7B", https://arxiv.org/abs/2310.06825;
        Yang et al., 2024, "Qwen2 Technical Report",
        https://arxiv.org/abs/2407.10671; transformers' `modeling_llama.py`
    """
    vocab_size = check_positive_int("vocab_size", vocab_size)
    num_layers = check_positive_int("num_layers", num_layers)
    d_model = check_positive_int("d_model", d_model)
    sequence_length = check_positive_int("sequence_length", sequence_length)
    dropout = check_rate("dropout", dropout)
    if position not in POSITIONS:
        raise ValueError(f"`position` must be one of {POSITIONS}. Received: position={position!r}")
    if not isinstance(tie_weights, bool):
        raise TypeError(f"`tie_weights` must be a bool. Received: tie_weights={tie_weights!r}")
    rope_scaling = _check_rope_scaling(rope_scaling, position)
    padding_id = check_padding_id(padding_id)
    # -- layers -------------------------------------------------------------
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    token_embedding = keras.layers.ReversibleEmbedding(
        vocab_size,
        d_model,
        tie_weights=tie_weights,
        mask_zero=padding_id == 0,
        name="token_embedding",
    )
    if padding_id == 0:
        x, padding_mask = token_embedding(tokens), None  # (B, T, d), masked where tokens == 0
    else:  # every id is a token: the mask is told by `padding_id`, passed to every block
        ids, padding_mask = TokenPadding(padding_id, name="token_padding")(tokens)  # (B, T)
        x = token_embedding(ids)  # (B, T, d)
    if position in _EMBEDDED:
        positions = TokenPositions(padding_id, name="positions")(tokens)  # (B, T)
        if position == "learned":
            embedding = keras_attn.PositionEmbedding(sequence_length, name="position_embedding")
        else:
            embedding = keras_attn.SinePositionEncoding(max_wavelength, name="position_embedding")
        x = keras.layers.Add(name="embeddings_add")([x, embedding(x, positions=positions)])
    x = keras.layers.Dropout(dropout, name="embedding_dropout")(x)
    for i in range(num_layers):
        x = keras_attn.TransformerDecoder(
            intermediate_dim,
            num_heads,
            dropout=dropout,
            activation=activation,
            layer_norm_epsilon=layer_norm_epsilon,
            normalize_first=normalize_first,
            num_key_value_heads=num_key_value_heads,
            rotary_embedding=(
                keras_attn.RotaryEmbedding(max_wavelength, **rope_scaling)
                if position == "rotary"
                else None
            ),
            position_bias=keras_attn.AlibiBias() if position == "alibi" else None,
            sliding_window=sliding_window,
            implementation=implementation,
            normalization=normalization,
            feedforward=feedforward,
            use_bias=use_bias,
            qkv_bias=qkv_bias,
            name=f"decoder_block_{i}",
        )(x, decoder_padding_mask=padding_mask)
    if normalize_first:
        x = normalization_layer(normalization, layer_norm_epsilon, "final_norm")(x)
    if padding_id != 0:  # the mask ends before the projection (no `mask_zero` there)
        x = DropMask(name="drop_mask")(x)
    logits = token_embedding(x, reverse=True)  # (B, T, vocab_size)
    # -- model --------------------------------------------------------------
    return keras.Model(tokens, logits, name=name)


def _check_rope_scaling(rope_scaling, position):
    """`rope_scaling` as a dict of `RotaryEmbedding` arguments (`{}` for `None`), checked."""
    if rope_scaling is None:
        return {}
    if not isinstance(rope_scaling, dict):
        raise TypeError(
            f"`rope_scaling` must be None or a dict. Received: rope_scaling={rope_scaling!r}"
        )
    unknown = sorted(set(rope_scaling) - set(ROPE_SCALING))
    if unknown:
        raise ValueError(
            f"`rope_scaling` takes the keys {ROPE_SCALING}. Received: unknown keys {unknown}"
        )
    if position != "rotary":
        raise ValueError(
            "`rope_scaling` scales rotary positions: it needs position='rotary'. Received: "
            f"position={position!r}, rope_scaling={rope_scaling!r}"
        )
    return dict(rope_scaling)


# ---------------------------------------------------------------------------
# Generation: a prefill, then one cached step per token
# ---------------------------------------------------------------------------


def left_align(tokens: TensorLike, padding_id: int = 0) -> TensorLike:
    """Each row's real tokens (not `padding_id`) moved to its end, in order: `[[5, 6, 0]] ->
    [[0, 5, 6]]`.

    Prompts padded on either side (or anywhere) become left-padded, so every
    row's next token goes to the same cache position.

    Example:

    >>> print(keras.ops.convert_to_numpy(left_align(np.array([[5, 6, 0, 0], [0, 7, 0, 8]]))))
    [[0 0 5 6]
     [0 0 7 8]]
    """
    tokens = ops.convert_to_tensor(tokens, "int32")
    length = ops.shape(tokens)[1]
    real = ops.cast(ops.not_equal(tokens, padding_id), "int32")
    order = ops.argsort(real * length + ops.arange(length, dtype="int32"), axis=-1)  # pads first
    return ops.take_along_axis(tokens, order, axis=-1)


def _layer_names(model):
    return {layer.name for layer in model.layers}


def check_prompts(
    prompts,
    vocab_size: int,
    max_length: int,
    sequence_length: int | None,
    padding_id: int = 0,
):
    """Eager checks of concrete prompts (a traced tensor passes unchecked).

    Raises:
        ValueError: a row without a real token (all `padding_id`), a token id
            (not padding) outside `[0, vocab_size)`, or (learned positions) a
            prompt that with `max_length` new tokens outgrows the position table.
    """
    values = static_array(prompts)
    if values is None:
        return
    if values.ndim != 2:
        raise ValueError(f"`prompts` must be int tokens (batch, length). Received: {values.shape}")
    if not np.issubdtype(values.dtype, np.integer):
        raise TypeError(f"`prompts` must hold integer token ids. Received: dtype={values.dtype}")
    if values.shape[0] == 0:  # no prompts: nothing else to check
        return
    lengths = np.sum(values != padding_id, axis=1)
    if values.size == 0 or np.any(lengths == 0):
        empty = np.flatnonzero(lengths == 0).tolist() if values.size else "all"
        raise ValueError(
            f"`prompts` must hold at least one real token per row ({padding_id} is padding): a "
            "language model continues its prompt; start an empty one with a start token "
            f"(GPT-2: <|endoftext|>). Received: empty rows {empty} of prompts with shape "
            f"{values.shape}"
        )
    bad = (values != padding_id) & ((values < 0) | (values >= vocab_size))
    if np.any(bad):
        raise ValueError(
            f"`prompts` must hold token ids in [0, vocab_size={vocab_size}). Received: "
            f"{sorted(set(values[bad].tolist()))[:5]}"
        )
    if sequence_length is not None and int(lengths.max()) + max_length - 1 > sequence_length:
        raise ValueError(
            f"The longest prompt ({int(lengths.max())} tokens) plus `max_length` - 1 "
            f"({max_length - 1}) new positions must fit in the model's learned positions "
            f"(sequence_length={sequence_length}). Received: max_length={max_length}"
        )


class LanguageModelState(NamedTuple):
    """The decoding state of a `transformer_lm` (`LanguageModelSteps`).

    A `NamedTuple`, so the decoding loops carry it as a nest of tensors (`keras.tree`,
    `tf.while_loop`, `jax.lax` loops) and beam search reorders its rows (the batch axis).

    Args:
        caches: one `keras_attn.KVCache` per decoder block, in block order: keys and values
            `(B, g, P - 1 + max_length, dk)`, valid where a real token was written; or,
            for a sliding window `w`, a `keras_attn.cache.RingKVCache` of `(B, g, w, dk)`.
        positions: int32 `(B,)`: each row's position for its next token (its count of real
            tokens fed so far, so padding shifts nothing).
        cache_index: int32 `(B,)`: the cache position the next token is written at (the
            left-aligned prompt's length - 1, then + 1 a step; the same in every row): the
            state carries it (a ring's positions grow past its length, and a full cache's
            depend on the call's `max_length`), so a step needs nothing of the call besides
            its state.
    """

    caches: list
    positions: Any
    cache_index: Any = None


class LanguageModelSteps:
    """Incremental decoding of a `transformer_lm` model with KV caches.

    The decoding functions of `keras_attn.models.decoding` drive it, with
    `start_id=None`: `start` left-aligns the prompts (`left_align`: padding
    on either side is accepted) and runs all but their last token through the
    blocks at once (the prefill), writing every block's `KVCache`, valid where
    the prompt is not padding; `start_tokens` are the prompts' last tokens,
    fed at the first step; each `step` embeds one token per row at its row's
    position (its count of real tokens: the same as unpadded) and runs the
    blocks on their caches, O(T) per token. Everything is `keras.ops`, so the
    loop also runs inside `tf.function` / `jax.jit`.

    With a `sliding_window` `w` the caches are rings of `w` positions
    (`keras_attn.cache.RingKVCache`) instead of `P - 1 + max_length`: a
    token sees the last `w` positions only, all of them in the ring, so the
    tokens are those of the full caches, in memory flat in the number of
    tokens. A prompt longer than `w` is prefilled at once (each token
    attending within its window) and its last `w` positions kept.

    Padding is the model's `padding_id` (its attribute here: 0, or -1 for a
    model whose every id is a token, e.g. `from_transformers`'): the prompts'
    padding, and the id the decoding loops never generate when it is a token
    id (0).

    Args:
        model: a model built by `transformer_lm` (trained or reloaded).
        ring: `None` (rings where the blocks have a sliding window), or
            `False`: caches of every position (the full-cache path, e.g. as
            a reference); `True` requires a sliding window.
        kv_cache_dtype: `None` or `"float"` (the caches in the model's compute
            dtype), or `"int8"`: keys and values stored as int8 with a float32
            scale per position and head (`keras_attn.cache.Int8Heads`), full
            caches and rings alike.

    Raises:
        ValueError: `ring=True` for a model without a sliding window; a
            `kv_cache_dtype` other than those.
    """

    @staticmethod
    def matches(model: keras.Model) -> bool:
        names = _layer_names(model)
        return {"token_embedding", "decoder_block_0"} <= names and "encoder_embedding" not in names

    def __init__(
        self, model: keras.Model, ring: bool | None = None, kv_cache_dtype: str | None = None
    ):
        names = _layer_names(model)
        self.blocks, i = [], 0
        while f"decoder_block_{i}" in names:
            self.blocks.append(model.get_layer(f"decoder_block_{i}"))
            i += 1
        self.token_embedding = model.get_layer("token_embedding")
        self.position_embedding = (
            model.get_layer("position_embedding") if "position_embedding" in names else None
        )
        self.norm = model.get_layer("final_norm") if "final_norm" in names else None
        self.vocab_size = self.token_embedding.input_dim
        # The id the prompts are padded with (the decoding loops read it: never generated
        # when it is a token id, i.e. 0); -1 in a model whose every id is a token.
        padding = model.get_layer("token_padding") if "token_padding" in names else None
        self.padding_id = 0 if padding is None else padding.padding_id
        learned = isinstance(self.position_embedding, keras_attn.PositionEmbedding)
        self.sequence_length = self.position_embedding.sequence_length if learned else None
        windows = [block.sliding_window for block in self.blocks]
        self.sliding_window = None if None in windows else max(windows)
        if ring not in (None, True, False):
            raise ValueError(f"`ring` must be None, True or False. Received: ring={ring!r}")
        if ring and self.sliding_window is None:
            raise ValueError(
                "A ring cache keeps the last `sliding_window` positions: it needs a model "
                f"built with `sliding_window`. Received: ring={ring}, sliding_window=None"
            )
        self.ring = self.sliding_window is not None if ring is None else ring
        if kv_cache_dtype not in (None, "float", "int8"):
            raise ValueError(
                "`kv_cache_dtype` must be None, 'float' or 'int8'. "
                f"Received: kv_cache_dtype={kv_cache_dtype!r}"
            )
        self.kv_cache_dtype = "int8" if kv_cache_dtype == "int8" else None  # None: compute's

    def _embed(self, tokens, positions):
        """`(B, T)` tokens at `(B, T)` positions -> `(B, T, d)`."""
        if self.padding_id != 0:  # padding (outside the vocabulary) read as row 0, masked
            tokens = ops.where(ops.equal(tokens, self.padding_id), 0, tokens)
        x = self.token_embedding(tokens)
        if self.position_embedding is not None:
            x = x + self.position_embedding(x, positions=positions)
        return x

    def _blocks(self, x, mask, caches, index):
        new = []
        for block, cache in zip(self.blocks, caches, strict=True):
            x, cache = block(
                x,
                decoder_padding_mask=mask,
                self_attention_cache=cache,
                self_attention_cache_update_index=index,
                training=False,
            )
            new.append(cache)
        return x, new

    def _logits(self, x):
        """`(B, d)` hidden states -> `(B, V)`: the token embedding's reverse projection.

        `token_embedding(x, reverse=True)` multiplies by the transposed table; under
        XLA on the CPU that transpose is a copy of the whole `(V, d)` table at every
        step (154 MiB for GPT-2's). A contraction with the table as it lies reads it
        once. An int8 table (`quantize`) is read as it lies where
        `keras_attn.quantized` has a path; otherwise a quantized table, a soft cap or a
        reverse dtype go through the layer itself.
        """
        layer = self.token_embedding
        plain = (
            layer.tie_weights
            and getattr(layer, "quantization_mode", None) is None
            and layer.logit_soft_cap is None
            and layer.reverse_dtype is None
        )
        if not plain:
            logits = quantized.int8_logits(layer, x)  # int8 bytes read as they lie, or None
            if logits is not None:
                return logits
            return layer(ops.expand_dims(x, 1), reverse=True)[:, 0]
        table = ops.cast(layer.embeddings, x.dtype)  # (V, d)
        return ops.transpose(ops.matmul(table, ops.transpose(x)))  # (V, d) (d, B) -> (B, V)

    def start_tokens(self, prompts: TensorLike) -> TensorLike:
        """`(B,)` int32: each prompt's last token, fed at the first step."""
        return left_align(prompts, self.padding_id)[:, -1]

    def start(
        self, prompts: TensorLike, max_length: int, return_hidden: bool = False
    ) -> LanguageModelState | tuple[LanguageModelState, TensorLike]:
        """Prefills the caches with `(B, P)` prompts (but their last tokens); the initial state.

        `return_hidden=True`: `(state, hidden)`, with the prefilled tokens' final hidden
        states `(B, P - 1, d)` (after the final norm: what the logits project; the
        left-aligned prompts', so a row's padding comes first).
        """
        check_prompts(prompts, self.vocab_size, max_length, self.sequence_length, self.padding_id)
        prompts = left_align(prompts, self.padding_id)  # (B, P)
        batch, length = ops.shape(prompts)[0], ops.shape(prompts)[1]
        if self.ring:
            caches = [
                RingKVCache(*b.empty_cache(batch, self.sliding_window, self.kv_cache_dtype))
                for b in self.blocks
            ]
        else:
            size = length - 1 + max_length
            caches = [b.empty_cache(batch, size, self.kv_cache_dtype) for b in self.blocks]
        positions = TokenPositions(self.padding_id)(prompts)  # (B, P)
        context = prompts[:, :-1]  # (B, P - 1)
        hidden = None
        if not isinstance(length, int) or length > 1:
            x = self._embed(context, positions[:, :-1])
            hidden, caches = self._blocks(x, ops.not_equal(context, self.padding_id), caches, 0)
        state = LanguageModelState(
            caches=caches,
            positions=positions[:, -1],
            cache_index=ops.zeros_like(positions[:, -1]) + ops.cast(length - 1, "int32"),
        )
        if not return_hidden:
            return state
        if hidden is None:  # a one-token prompt: nothing prefilled
            return state, ops.zeros((batch, 0, self.token_embedding.output_dim), "float32")
        return state, self._final_norm(hidden)

    def step(
        self,
        tokens: TensorLike,
        index: Length,
        state: LanguageModelState,
        return_hidden: bool = False,
    ) -> tuple[TensorLike, LanguageModelState] | tuple[TensorLike, LanguageModelState, TensorLike]:
        """`(B,)` tokens, the `index`-th fed -> next-token logits `(B, V)` and the new state
        (and with `return_hidden`, the tokens' final hidden states `(B, d)`: after the final
        norm, what the logits project; contrastive search compares them)."""
        tokens = ops.expand_dims(ops.cast(tokens, "int32"), 1)  # (B, 1)
        positions = ops.expand_dims(state.positions, 1)  # (B, 1)
        if state.cache_index is None:
            raise ValueError(
                "A step needs the state's `cache_index` (from `start`). Received: "
                "LanguageModelState(cache_index=None)"
            )
        cache_index = ops.max(state.cache_index, initial=0)  # the rows agree; B may be 0
        x = self._embed(tokens, positions)
        x, caches = self._blocks(
            x, ops.not_equal(tokens, self.padding_id), state.caches, cache_index
        )
        x = self._final_norm(x)
        logits = self._logits(x[:, 0])  # (B, V)
        state = LanguageModelState(caches, state.positions + 1, state.cache_index + 1)
        return (logits, state, x[:, 0]) if return_hidden else (logits, state)

    def _final_norm(self, x):
        """The blocks' output `(B, T, d)` after the final norm (where the model has one)."""
        return x if self.norm is None else self.norm(x)

    def extend(
        self, tokens: TensorLike, state: LanguageModelState
    ) -> tuple[TensorLike, LanguageModelState]:
        """`(B, T)` tokens fed at once (a step of `T` tokens) -> logits `(B, T, V)`, new state.

        Row `b`'s token `t` goes to cache position `cache_index + t` at position
        `positions[b] + t` and sees the cache before it and the tokens before it: logits
        `[:, t]` are those `step` would give after feeding `tokens[:, : t + 1]` one by one
        (speculative decoding verifies its draft's tokens this way). Needs the full
        caches (`ring=False`): a ring would overwrite positions a caller may roll back to.
        """
        if self.ring:
            raise ValueError(
                "`extend` writes several positions a caller may roll back: it needs the full "
                "caches (LanguageModelSteps(model, ring=False)). Received: a ring cache"
            )
        tokens = ops.cast(tokens, "int32")
        length = ops.shape(tokens)[1]
        positions = ops.expand_dims(state.positions, 1) + ops.arange(length, dtype="int32")
        cache_index = ops.max(state.cache_index, initial=0)  # the rows agree; B may be 0
        x = self._embed(tokens, positions)
        x, caches = self._blocks(
            x, ops.not_equal(tokens, self.padding_id), state.caches, cache_index
        )
        x = self._final_norm(x)
        batch, width = ops.shape(x)[0], ops.shape(x)[2]
        logits = self._logits(ops.reshape(x, (batch * length, width)))  # (B * T, V)
        logits = ops.reshape(logits, (batch, length, ops.shape(logits)[-1]))
        return logits, LanguageModelState(
            caches, state.positions + length, state.cache_index + length
        )
