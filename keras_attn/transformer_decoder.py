"""`TransformerDecoderBlock`: masked self-attention, cross-attention, feed-forward."""

import keras

from keras_attn.cache import KVCache, as_kv_cache
from keras_attn.transformer import _BLOCK_ARGS, _TransformerBlock


class _ImplicitMask(keras.layers.Layer):
    """Returns the implicit Keras mask of its input (all `True` when it has none)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs, mask=None):
        if mask is None:
            return keras.ops.ones(keras.ops.shape(inputs)[:2], "bool")
        return mask

    def compute_mask(self, inputs, mask=None):
        return None


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoderBlock(_TransformerBlock):
    __doc__ = (
        """Transformer decoder block: causal self-attention, cross-attention, feed-forward.

    Each sublayer has Add & Norm (post-norm, or pre-norm with `norm_first`):
    `x = LN(x + MHA(x, x, causal))`, `x = LN(x + MHA(x, encoder))`,
    `y = LN(x + FFN(x))`. Built without an encoder sequence it has no
    cross-attention (a decoder-only, GPT-style block).
"""
        + _BLOCK_ARGS
        + """
    Call arguments:
        decoder_sequence: `(B, T, d_model)`.
        encoder_sequence: `(B, S, d_enc)` or `None`. Whether the block has
            cross-attention is fixed by its first call.
        decoder_padding_mask: bool `(B, T)`; by default the implicit mask of
            `decoder_sequence`.
        encoder_padding_mask: bool `(B, S)`; by default the implicit mask of
            `encoder_sequence`. The cross-attention cache keeps it.
        decoder_attention_mask: bool `(B, T, T)` (cached: `(B, T, L)`).
        encoder_attention_mask: bool `(B, T, S)`.
        use_causal_mask: causal self-attention (default `True`).
        self_attention_cache: the `keras_attn.KVCache` of the self-attention
            (`block.self_attention.empty_cache(batch, max_length)`); turns on
            cached decoding, with `self_attention_cache_update_index` the
            position of the first token of `decoder_sequence`. It remembers
            which of its positions are real tokens (`decoder_padding_mask`).
        self_attention_cache_update_index: int or scalar tensor.
        cross_attention_cache: the `KVCache` of the source, as returned by
            the first cached call (which gets `encoder_sequence`); pass it,
            and no `encoder_sequence`, on later steps: the source is projected
            once and its padding mask travels with it.
        return_attention_scores: also return the weights.
        training: dropout on or off.

    Returns:
        `(B, T, d_model)`. With `return_attention_scores=True` the
        self-attention weights `(B, H, T, T or L)` and (with cross-attention)
        the cross-attention weights `(B, H, T, S)` follow. With a
        self-attention cache, `self_attention_cache` and
        `cross_attention_cache` (`None` without cross-attention) come last.

    Example:

    >>> enc = keras.random.normal((2, 7, 16))
    >>> dec = keras.random.normal((2, 5, 16))
    >>> block = keras_attn.TransformerDecoderBlock(num_heads=2, intermediate_dim=32)
    >>> print(block(dec, enc).shape)
    (2, 5, 16)

    One token at a time with caches (equal to the full causal pass):

    >>> cache, cross, steps = block.self_attention.empty_cache(2, 5), None, []
    >>> for t in range(5):
    ...     y, cache, cross = block(
    ...         dec[:, t : t + 1], None if cross is not None else enc,
    ...         self_attention_cache=cache, self_attention_cache_update_index=t,
    ...         cross_attention_cache=cross)
    ...     steps.append(y)
    >>> full = block(dec, enc)
    >>> print(bool(keras.ops.max(keras.ops.abs(keras.ops.concatenate(steps, 1) - full)) < 1e-5))
    True

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762
    """
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._implicit_mask = _ImplicitMask(dtype=self.dtype_policy)

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        width = self._model_dim(decoder_sequence_shape, "decoder_sequence")
        self._width, self._source_width = width, None
        self.self_attention = self._attention(width, "self_attention", self.rotary_embedding)
        self.self_attention.build(decoder_sequence_shape, decoder_sequence_shape)
        self.self_attention_norm, self.self_attention_dropout = self._norm_and_dropout(
            decoder_sequence_shape, "self_attention"
        )
        self.cross_attention = None
        if encoder_sequence_shape is not None:
            self._source_width = self._model_dim(encoder_sequence_shape, "encoder_sequence")
            self.cross_attention = self._attention(width, "cross_attention")
            self.cross_attention.build(decoder_sequence_shape, encoder_sequence_shape)
            self.cross_attention_norm, self.cross_attention_dropout = self._norm_and_dropout(
                decoder_sequence_shape, "cross_attention"
            )
        self._build_feed_forward(decoder_sequence_shape)
        self.built = True

    def _check_sources(self, encoder_sequence, cross_attention_cache, cached, cache_index):
        if cached and cache_index is None:
            raise ValueError(
                "`self_attention_cache_update_index` is required with `self_attention_cache`."
            )
        if not cached and cross_attention_cache is not None:
            raise ValueError("`cross_attention_cache` needs a `self_attention_cache` too.")
        if encoder_sequence is not None and cross_attention_cache is not None:
            raise ValueError("Pass either `encoder_sequence` or `cross_attention_cache`, not both.")
        given = encoder_sequence is not None or cross_attention_cache is not None
        if self.cross_attention is None and given:
            raise ValueError(
                "This block was built without an encoder sequence, so it has no "
                "cross-attention; do not pass `encoder_sequence` or `cross_attention_cache`."
            )
        if self.cross_attention is not None and not given:
            raise ValueError(
                "This block has cross-attention: pass `encoder_sequence` (or, when "
                "decoding with a cache, `cross_attention_cache`)."
            )

    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        decoder_attention_mask=None,
        encoder_attention_mask=None,
        use_causal_mask=True,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        training=None,
    ):
        cached = self_attention_cache is not None
        self._check_sources(
            encoder_sequence, cross_attention_cache, cached, self_attention_cache_update_index
        )
        self._check_sequence(
            "decoder_sequence", decoder_sequence, self._width, "decoder_padding_mask",
            decoder_padding_mask,
        )  # fmt: skip
        if encoder_sequence is not None:
            self._check_sequence(
                "encoder_sequence", encoder_sequence, self._source_width, "encoder_padding_mask",
                encoder_padding_mask,
            )  # fmt: skip
        self.set_output_mask(decoder_padding_mask)
        weights, caches = [], []

        def self_attend(x):
            # Masks left None are filled by Keras from x's implicit mask.
            out = self.self_attention(
                x,
                x,
                query_mask=decoder_padding_mask,
                value_mask=decoder_padding_mask,
                attention_mask=decoder_attention_mask,
                use_causal_mask=use_causal_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                cache=self_attention_cache,
                cache_update_index=self_attention_cache_update_index,
            )
            out = out if isinstance(out, tuple) else (out,)
            if return_attention_scores:
                weights.append(out[1])
            caches.extend(out[2 if return_attention_scores else 1 :])
            return out[0]

        if self.cross_attention is not None and cached and cross_attention_cache is None:
            # First cached step: project the source once; later steps reuse it.
            if encoder_padding_mask is None:
                encoder_padding_mask = self._implicit_mask(encoder_sequence)  # (B, S)
            cross_attention_cache = self.cross_attention.compute_cache(
                encoder_sequence, value_mask=encoder_padding_mask
            )
            encoder_sequence, encoder_padding_mask = None, None

        def cross_attend(x):
            common = dict(
                query_mask=decoder_padding_mask,
                value_mask=encoder_padding_mask,
                attention_mask=encoder_attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if cross_attention_cache is not None:
                # The cache's `valid` is the source's padding mask; merge any new one.
                out = self.cross_attention(x, cache=cross_attention_cache, **common)[:-1]
            else:
                out = self.cross_attention(x, encoder_sequence, **common)
                out = out if isinstance(out, tuple) else (out,)
            if return_attention_scores:
                weights.append(out[1])
            return out[0]

        x = self._residual(
            decoder_sequence,
            self.self_attention_norm,
            self.self_attention_dropout,
            self_attend,
            training,
        )
        if self.cross_attention is not None:
            x = self._residual(
                x, self.cross_attention_norm, self.cross_attention_dropout, cross_attend, training
            )
        x = self._feed_forward_residual(x, training)
        outputs = [x] + (weights if return_attention_scores else [])
        if cached:
            outputs += [caches[0], cross_attention_cache]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def compute_output_spec(
        self,
        decoder_sequence,
        encoder_sequence=None,
        return_attention_scores=False,
        self_attention_cache=None,
        cross_attention_cache=None,
        **kwargs,
    ):
        batch, length = decoder_sequence.shape[0], decoder_sequence.shape[1]
        outputs = [keras.KerasTensor(decoder_sequence.shape, dtype=self.compute_dtype)]
        if return_attention_scores:
            keys = (
                length if self_attention_cache is None else as_kv_cache(self_attention_cache).length
            )
            shape = (batch, self.num_heads, length)
            outputs.append(keras.KerasTensor(shape + (keys,), dtype=self.compute_dtype))
            if self.cross_attention is not None:
                source_length = (
                    as_kv_cache(cross_attention_cache).length
                    if cross_attention_cache
                    else encoder_sequence.shape[1]
                )
                outputs.append(keras.KerasTensor(shape + (source_length,), self.compute_dtype))
        if self_attention_cache is not None:
            outputs.append(
                KVCache(
                    *(
                        keras.KerasTensor(c.shape, c.dtype)
                        for c in as_kv_cache(self_attention_cache)
                    )
                )
            )
            cross = cross_attention_cache
            if self.cross_attention is not None and cross is None:
                heads = self.num_key_value_heads or self.num_heads
                source_length = encoder_sequence.shape[1]
                kv_shape = (batch, heads, source_length, self.cross_attention.key_dim)
                cross = KVCache(
                    keras.KerasTensor(kv_shape, self.compute_dtype),
                    keras.KerasTensor(kv_shape, self.compute_dtype),
                    keras.KerasTensor((batch, source_length), "bool"),
                )
            outputs.append(None if cross is None else as_kv_cache(cross))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
