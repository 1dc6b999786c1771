"""`TransformerDecoder`: masked self-attention, cross-attention, feed-forward."""

import keras
from keras import ops

from keras_attn import masks
from keras_attn._typing import TensorLike
from keras_attn.arguments import check_dim, check_rank
from keras_attn.cache import KVCache, as_kv_cache, is_stacked, map_cache, write, written_before
from keras_attn.transformer_block import BLOCK_ARGS, TransformerBlock, attention_results


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoder(TransformerBlock):
    __doc__ = (
        """Transformer decoder block: causal self-attention, cross-attention, feed-forward.

    Each sublayer has Add & Norm (post-norm, or pre-norm with
    `normalize_first`): `x = LN(x + MHA(x, x, causal))`,
    `x = LN(x + MHA(x, encoder))`, `y = LN(x + FFN(x))`. Built without an
    encoder sequence it has no cross-attention (a decoder-only, GPT-style
    block). With `normalization="rms_norm"`, `feedforward="gated"` and
    `use_bias=False` it is a Llama decoder layer (below).

    A drop-in for `keras_hub.layers.TransformerDecoder`: the same constructor
    and call arguments in the same order, the same sublayer names and weight
    order, and keras-hub's cache form. Padded steps (padding masks, passed or
    implicit) are zeroed on entry.

    **Caches.** Two forms, each returned in the form it came in:

    - a `keras_attn.KVCache` (`block.empty_cache(batch, max_length)`), which
      remembers which of its positions hold real tokens: a prompt with
      padding anywhere, prefilled at once, then decoded a token at a time,
      gives the full pass. For cross-attention, leave `cross_attention_cache`
      `None` on the first cached call (it is computed from
      `encoder_sequence` and returned; or use
      `block.compute_cross_attention_cache`), then pass it back, with or
      without `encoder_sequence`: the source is projected once and its
      padding mask travels with it.
    - keras-hub's: one float tensor `(B, 2, S, g, head_dim)` (keys, values;
      e.g. `ops.zeros(...)`). It cannot say which positions are valid, so it
      assumes every position before `self_attention_cache_update_index` is a
      real token and the positions from it on are not written yet (masked).
      `cross_attention_cache_update_index=0` computes the source's keys and
      values into `cross_attention_cache`; `None` reuses it, valid where
      `encoder_padding_mask` (or the implicit mask of `encoder_sequence`)
      is, all positions without one.
"""
        + BLOCK_ARGS
        + """
    Call arguments:
        decoder_sequence: `(B, T, d_model)`.
        encoder_sequence: `(B, S, d_enc)` or `None`. Whether the block has
            cross-attention is fixed by its first call.
        decoder_padding_mask: bool `(B, T)`; by default the implicit mask of
            `decoder_sequence`. In a cached call it covers the new tokens.
        decoder_attention_mask: bool `(B, T, T)` (cached: `(B, T, S)`).
        encoder_padding_mask: bool `(B, S)`; by default the implicit mask of
            `encoder_sequence`.
        encoder_attention_mask: bool `(B, T, S)`.
        self_attention_cache: a `KVCache` or a `(B, 2, L, g, d)` tensor;
            turns on cached decoding, with `self_attention_cache_update_index`
            the position of the first token of `decoder_sequence`.
        self_attention_cache_update_index: int or scalar integer tensor.
        cross_attention_cache: the source's cache, see above.
        cross_attention_cache_update_index: `0` to compute the source's keys
            and values into `cross_attention_cache`, `None` to reuse it.
        use_causal_mask: causal self-attention (default `True`).
        training: dropout on or off.
        return_attention_scores: also return the weights (ours).

    Returns:
        As keras-hub: `output (B, T, d_model)`; with a self-attention cache
        `(output, self_attention_cache)`, and with cross-attention
        `(output, self_attention_cache, cross_attention_cache)`. With
        `return_attention_scores=True` the self-attention weights
        `(B, H, T, T or L)`, and with cross-attention its weights
        `(B, H, T, S)`, follow `output` (before the caches).

    Example:

    >>> enc = keras.random.normal((2, 7, 16))
    >>> dec = keras.random.normal((2, 5, 16))
    >>> block = keras_attn.TransformerDecoder(intermediate_dim=32, num_heads=2)
    >>> print(block(dec, enc).shape)
    (2, 5, 16)

    One token at a time with caches (equal to the full causal pass):

    >>> cache, cross, steps = block.empty_cache(2, 5), None, []
    >>> for t in range(5):
    ...     y, cache, cross = block(
    ...         dec[:, t : t + 1], enc, self_attention_cache=cache,
    ...         self_attention_cache_update_index=t, cross_attention_cache=cross)
    ...     steps.append(y)
    >>> full = block(dec, enc)
    >>> print(bool(keras.ops.max(keras.ops.abs(keras.ops.concatenate(steps, 1) - full)) < 1e-5))
    True

    A Llama decoder layer (`LlamaDecoderLayer`: `x = x + Attn(RMS(x))`,
    `y = x + W_down(silu(W_gate RMS(x)) * W_up RMS(x))`, no biases, rotary,
    grouped-query):

    >>> llama = keras_attn.TransformerDecoder(
    ...     intermediate_dim=32, num_heads=4, num_key_value_heads=2, activation="silu",
    ...     normalize_first=True, normalization="rms_norm", feedforward="gated",
    ...     use_bias=False, rotary_embedding=keras_attn.RotaryEmbedding(500000))
    >>> print(llama(dec).shape)
    (2, 5, 16)

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762; Zhang and Sennrich, 2019, "Root
        Mean Square Layer Normalization", https://arxiv.org/abs/1910.07467;
        Shazeer, 2020, "GLU Variants Improve Transformer",
        https://arxiv.org/abs/2002.05202; Touvron et al., 2023, "Llama 2",
        https://arxiv.org/abs/2307.09288 (transformers' `modeling_llama.py`);
        Yang et al., 2024, "Qwen2 Technical Report" (q/k/v biases),
        https://arxiv.org/abs/2407.10671
    """
    )

    output_mask_argument = "decoder_padding_mask"  # the explicit output mask (`compute_mask`)

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        # keras-hub's weight order: self-attention and its norm, cross-attention
        # and its norm, the feed-forward kernels, their norm.
        shape = decoder_sequence_shape
        self._build_self_attention(shape, "decoder_sequence", "self_attention")
        self._source_width = None
        self._cross_attention_layer = None
        if encoder_sequence_shape is not None:
            self._source_width = self._model_dim(encoder_sequence_shape, "encoder_sequence")
            self._cross_attention_layer = self._attention(
                self._width, "cross_attention", "cross_attention"
            )
            self._cross_attention_layer.build(shape, encoder_sequence_shape)
            self._cross_attention_layer_norm = self._layer_norm(shape, "cross_attention_layer_norm")
            self._cross_attention_dropout = self._dropout("cross_attention_dropout")
        self._build_feedforward(shape, norm_before_kernels=False)
        self.built = True

    def empty_cache(self, batch_size: int, max_length: int, dtype: str | None = None) -> KVCache:
        """The self-attention's `KVCache` for `max_length` positions, none valid yet."""
        return self._self_attention_layer.empty_cache(batch_size, max_length, dtype)

    def compute_cross_attention_cache(
        self, encoder_sequence: TensorLike, encoder_padding_mask: TensorLike | None = None
    ) -> KVCache:
        """The source's `KVCache` for cross-attention (valid where `encoder_padding_mask` is)."""
        if self._cross_attention_layer is None:
            raise ValueError(
                "This block was built without an encoder sequence: no cross-attention."
            )
        encoder_padding_mask = self._check_sequence(
            "encoder_sequence", encoder_sequence, self._source_width, "encoder_padding_mask",
            encoder_padding_mask,
        )  # fmt: skip
        source, source_mask = self._padding(encoder_sequence, encoder_padding_mask)
        return self._cross_attention_layer.compute_cache(source, value_mask=source_mask)

    def _check_sources(self, encoder_sequence, cross_cache, cross_index, cached, cache_index):
        if cached and cache_index is None:
            raise ValueError(
                "`self_attention_cache_update_index` is required with `self_attention_cache`."
            )
        if not cached and cross_cache is not None:
            raise ValueError("`cross_attention_cache` needs a `self_attention_cache` too.")
        if cross_index is not None and (cross_cache is None or encoder_sequence is None):
            raise ValueError(
                "`cross_attention_cache_update_index` needs `cross_attention_cache` and "
                "`encoder_sequence` (whose keys and values it writes into the cache)."
            )
        given = encoder_sequence is not None or cross_cache is not None
        if self._cross_attention_layer is None and given:
            raise ValueError(
                "This block was built without an encoder sequence, so it has no "
                "cross-attention; do not pass `encoder_sequence` or `cross_attention_cache`."
            )
        if self._cross_attention_layer is not None and not given:
            raise ValueError(
                "This block has cross-attention: pass `encoder_sequence` (or, when "
                "decoding with a cache, `cross_attention_cache`)."
            )

    def _caches_in(self, self_cache, index, cross_cache, source_mask, cross_index):
        """The caches of a call as `KVCache`s: keras-hub's stacked tensors converted, once.

        A stacked self-attention cache is valid before `index`; a stacked
        cross-attention cache where the source's padding mask is when it is
        reused (`cross_index` `None`), everywhere else. A `KVCache` reused
        with a new source mask merges it with the one it keeps.
        """
        if is_stacked(self_cache):
            check_rank("self_attention_cache", self_cache.shape, (5,))  # before its length is read
            valid = written_before(self_cache, index)
            self_cache = KVCache.from_stacked(self_cache, valid, name="self_attention_cache")
        if cross_cache is None:
            return self_cache, None
        reused_mask = source_mask if cross_index is None else None
        stacked = is_stacked(cross_cache)
        if reused_mask is not None:
            length = cross_cache.shape[2] if stacked else as_kv_cache(cross_cache).length
            check_dim("encoder_padding_mask", source_mask.shape[1],
                      "cross_attention_cache", length, "length")  # fmt: skip
        if stacked:
            return self_cache, KVCache.from_stacked(
                cross_cache, reused_mask, name="cross_attention_cache"
            )
        cross_cache = as_kv_cache(cross_cache)
        if reused_mask is not None:
            cross_cache = cross_cache._replace(
                valid=ops.logical_and(cross_cache.valid, reused_mask)
            )
        return self_cache, cross_cache

    def _cross_cache(self, encoder_sequence, source_mask, cache, index):
        """The source's `KVCache` of a cached call: computed, written at `index`, or reused."""
        if cache is not None and index is None:
            return cache
        fresh = self._cross_attention_layer.compute_cache(encoder_sequence, value_mask=source_mask)
        if cache is None:
            return fresh
        return write(cache, index, fresh.key, fresh.value, fresh.valid)[0]

    def _cross_attention(
        self, x, source, source_mask, mask, attention_mask, return_attention_scores, training,
        cache,
    ):  # fmt: skip
        """`(output, weights or None)`: `x` attending to the source, or to its `cache`."""
        cached = cache is not None  # then the cache holds the keys, values and `valid` mask
        output, weights, _ = attention_results(
            self._cross_attention_layer,
            x,
            None if cached else source,
            query_mask=mask,
            value_mask=None if cached else source_mask,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            cache=cache,
        )
        return output, weights

    def call(
        self,
        decoder_sequence: TensorLike,
        encoder_sequence: TensorLike | None = None,
        decoder_padding_mask: TensorLike | None = None,
        decoder_attention_mask: TensorLike | None = None,
        encoder_padding_mask: TensorLike | None = None,
        encoder_attention_mask: TensorLike | None = None,
        self_attention_cache: KVCache | TensorLike | None = None,
        self_attention_cache_update_index: int | TensorLike | None = None,
        cross_attention_cache: KVCache | TensorLike | None = None,
        cross_attention_cache_update_index: int | TensorLike | None = None,
        use_causal_mask: bool = True,
        training: bool | None = None,
        return_attention_scores: bool = False,
    ) -> TensorLike | tuple[TensorLike, ...]:
        cached = self_attention_cache is not None
        cross = self._cross_attention_layer is not None
        self._check_sources(
            encoder_sequence, cross_attention_cache, cross_attention_cache_update_index, cached,
            self_attention_cache_update_index,
        )  # fmt: skip
        decoder_padding_mask = self._check_sequence(
            "decoder_sequence", decoder_sequence, self._width, "decoder_padding_mask",
            decoder_padding_mask,
        )  # fmt: skip
        if encoder_sequence is not None:
            encoder_padding_mask = self._check_sequence(
                "encoder_sequence", encoder_sequence, self._source_width, "encoder_padding_mask",
                encoder_padding_mask,
            )  # fmt: skip
            encoder_sequence, source_mask = self._padding(encoder_sequence, encoder_padding_mask)
        else:  # a cached cross-attention step: the mask alone, read once
            source_mask = masks.as_bool_mask(encoder_padding_mask, "encoder_padding_mask")
        decoder_sequence, decoder_mask = self._padding(decoder_sequence, decoder_padding_mask)

        # keras-hub's caches in: `KVCache`s from here on, stacked again on the way out.
        stacked = is_stacked(self_attention_cache)
        cross_stacked = is_stacked(cross_attention_cache) or (
            stacked and cross_attention_cache is None
        )
        self_cache, cross_cache = self._caches_in(
            self_attention_cache, self_attention_cache_update_index, cross_attention_cache,
            source_mask, cross_attention_cache_update_index,
        )  # fmt: skip
        if cross and cached:
            cross_cache = self._cross_cache(
                encoder_sequence, source_mask, cross_cache, cross_attention_cache_update_index
            )

        norm = self._self_attention_layer_norm
        y, self_weights, self_cache = self._self_attention(
            self._residual_input(decoder_sequence, norm), decoder_mask, decoder_attention_mask,
            use_causal_mask, return_attention_scores, training, self_cache,
            self_attention_cache_update_index,
        )  # fmt: skip
        x = self._residual(decoder_sequence, y, norm, self._self_attention_dropout, training)
        if cross:
            norm = self._cross_attention_layer_norm
            y, cross_weights = self._cross_attention(
                self._residual_input(x, norm), encoder_sequence, source_mask, decoder_mask,
                encoder_attention_mask, return_attention_scores, training, cross_cache,
            )  # fmt: skip
            x = self._residual(x, y, norm, self._cross_attention_dropout, training)
        x = self._feedforward_residual(x, training)

        # None: the implicit mask passes through (Keras' `compute_mask`).
        outputs = (self.with_output_mask(x, decoder_padding_mask),)
        if return_attention_scores:
            outputs += (self_weights, cross_weights) if cross else (self_weights,)
        if cached:
            outputs += (self_cache.to_stacked() if stacked else self_cache,)
        if cached and cross:
            outputs += (cross_cache.to_stacked() if cross_stacked else cross_cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def compute_output_spec(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        decoder_attention_mask=None,
        encoder_padding_mask=None,
        encoder_attention_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        cross_attention_cache_update_index=None,
        use_causal_mask=True,
        training=None,
        return_attention_scores=False,
    ):
        batch, length = decoder_sequence.shape[0], decoder_sequence.shape[1]
        output = keras.KerasTensor(decoder_sequence.shape, dtype=self.compute_dtype)
        outputs = [self.with_output_mask(output, decoder_padding_mask)]
        cross = self._cross_attention_layer
        stacked = is_stacked(self_attention_cache)
        if stacked:
            cache_length = self_attention_cache.shape[2]
        elif self_attention_cache is not None:
            cache_length = as_kv_cache(self_attention_cache).length
        if cross is not None and cross_attention_cache is not None:
            source_length = (
                cross_attention_cache.shape[2]
                if is_stacked(cross_attention_cache)
                else as_kv_cache(cross_attention_cache).length
            )
        elif cross is not None:
            source_length = encoder_sequence.shape[1]
        if return_attention_scores:
            shape = (batch, self.num_heads, length)
            keys = length if self_attention_cache is None else cache_length
            outputs.append(keras.KerasTensor(shape + (keys,), dtype=self.compute_dtype))
            if cross is not None:
                outputs.append(keras.KerasTensor(shape + (source_length,), self.compute_dtype))
        if self_attention_cache is None:
            return outputs[0] if len(outputs) == 1 else tuple(outputs)

        def spec(tensor):
            return keras.KerasTensor(tensor.shape, dtype=tensor.dtype)

        caches = [self_attention_cache]
        if cross is not None and cross_attention_cache is None:
            heads, head_dim = self.num_key_value_heads or self.num_heads, cross.key_dim
            kv_shape = (batch, heads, source_length, head_dim)
            dtype = self.compute_dtype
            cross_attention_cache = (
                keras.KerasTensor((batch, 2, source_length, heads, head_dim), dtype)
                if stacked
                else KVCache(
                    keras.KerasTensor(kv_shape, dtype),
                    keras.KerasTensor(kv_shape, dtype),
                    keras.KerasTensor((batch, source_length), "bool"),
                )
            )
        if cross is not None:
            caches.append(cross_attention_cache)
        for cache in caches:
            kind = type(cache) if isinstance(cache, KVCache) else KVCache  # a ring stays one
            outputs.append(spec(cache) if is_stacked(cache) else map_cache(spec, kind(*cache)))
        return tuple(outputs)


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoderBlock(TransformerDecoder):
    """`TransformerDecoder` under its former name: the files saved under that name load.

    The same layer. Keras keys a model's weights by each layer's snake-cased
    class name, so this subclass keeps `transformer_decoder_block` for the `.keras`
    and weights files written before the rename; new code writes
    `TransformerDecoder`, whose files load into keras-hub's and back.
    """
