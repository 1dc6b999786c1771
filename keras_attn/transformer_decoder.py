"""`TransformerDecoder`: masked self-attention, cross-attention, feed-forward."""

import keras
import numpy as np
from keras import ops

from keras_attn import masks
from keras_attn._execution import transpose
from keras_attn._typing import TensorLike
from keras_attn.arguments import check_dim, check_rank
from keras_attn.cache import KVCache, as_kv_cache, positions_between, write
from keras_attn.transformer_block import BLOCK_ARGS, TransformerBlock


def _is_stacked(cache):
    """Whether `cache` is in keras-hub's form, one `(B, 2, S, g, d)` tensor (else a `KVCache`)."""
    return cache is not None and not isinstance(cache, (tuple, list))


def _from_stacked(name, cache, valid):
    """keras-hub's `(B, 2, S, g, d)` cache as a `KVCache` (heads first), valid where `valid`."""
    check_rank(name, cache.shape, (5,))
    if cache.shape[1] not in (None, 2):
        raise ValueError(
            f"`{name}` in keras-hub's form must have shape (batch, 2, length, heads, head_dim) "
            f"(keys and values stacked on axis 1). Received: {name}.shape={tuple(cache.shape)}"
        )
    key, value = (transpose(cache[:, i], (0, 2, 1, 3)) for i in (0, 1))  # (B, g, S, d)
    return KVCache(key, value, valid)


def _to_stacked(cache):
    """A `KVCache` in keras-hub's form `(B, 2, S, g, d)`; which positions are valid is lost."""
    return ops.stack([transpose(c, (0, 2, 1, 3)) for c in (cache.key, cache.value)], axis=1)


def _written(cache, index):
    """bool `(B, S)`: the positions of a keras-hub cache before `index` (taken as real tokens)."""
    batch, length = cache.shape[0], cache.shape[2]
    if all(isinstance(n, int) and not isinstance(n, bool) for n in (batch, length, index)):
        # one constant, not six ops a step
        return np.broadcast_to(positions_between(0, index, length), (batch, length))
    shape = ops.shape(cache)  # once: traced on TensorFlow, each call is a Shape op and slices
    before = ops.arange(shape[2], dtype="int32") < ops.cast(index, "int32")
    return ops.broadcast_to(ops.expand_dims(before, 0), (shape[0], shape[2]))


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoder(TransformerBlock):
    __doc__ = (
        """Transformer decoder block: causal self-attention, cross-attention, feed-forward.

    Each sublayer has Add & Norm (post-norm, or pre-norm with
    `normalize_first`): `x = LN(x + MHA(x, x, causal))`,
    `x = LN(x + MHA(x, encoder))`, `y = LN(x + FFN(x))`. Built without an
    encoder sequence it has no cross-attention (a decoder-only, GPT-style
    block).

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

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762
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

    def _cross_cache(self, encoder_sequence, source_mask, cache, index, stacked):
        """The source's `KVCache` of a cached call: computed, written at `index`, or reused."""
        if cache is None or index is not None:
            fresh = self._cross_attention_layer.compute_cache(
                encoder_sequence, value_mask=source_mask
            )
            if cache is None:
                return fresh
        reused_mask = source_mask is not None and index is None
        if reused_mask:
            length = cache.shape[2] if stacked else as_kv_cache(cache).length
            check_dim("encoder_padding_mask", source_mask.shape[1],
                      "cross_attention_cache", length, "length")  # fmt: skip
        if stacked:
            shape = ops.shape(cache)
            valid = source_mask if reused_mask else ops.ones((shape[0], shape[2]), "bool")
            cache = _from_stacked("cross_attention_cache", cache, valid)
        else:
            cache = as_kv_cache(cache)
            if reused_mask:  # a new mask merges with the one the cache keeps
                cache = cache._replace(valid=ops.logical_and(cache.valid, source_mask))
        if index is None:
            return cache
        return write(cache, index, fresh.key, fresh.value, fresh.valid)[0]

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

        stacked = _is_stacked(self_attention_cache)
        if stacked:
            check_rank("self_attention_cache", self_attention_cache.shape, (5,))
            valid = _written(self_attention_cache, self_attention_cache_update_index)
            self_attention_cache = _from_stacked(
                "self_attention_cache", self_attention_cache, valid
            )
        cross_stacked = _is_stacked(cross_attention_cache) or (
            stacked and cross_attention_cache is None
        )
        if self._cross_attention_layer is not None and cached:
            cross_attention_cache = self._cross_cache(
                encoder_sequence, source_mask, cross_attention_cache,
                cross_attention_cache_update_index, _is_stacked(cross_attention_cache),
            )  # fmt: skip
        weights, caches = [], []

        def self_attend(x):
            out = self._self_attention_layer(
                x,
                x,
                query_mask=decoder_mask,
                value_mask=decoder_mask,
                attention_mask=decoder_attention_mask,
                use_causal_mask=use_causal_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                cache=self_attention_cache,
                cache_update_index=self_attention_cache_update_index,
            )
            out = out if isinstance(out, tuple) else (out,)
            weights.extend(out[1:2] if return_attention_scores else [])
            caches.extend(out[2 if return_attention_scores else 1 :])
            return out[0]

        def cross_attend(x):
            common = dict(
                query_mask=decoder_mask,
                attention_mask=encoder_attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if cross_attention_cache is not None:
                # The cache's `valid` is the source's padding mask.
                out = self._cross_attention_layer(x, cache=cross_attention_cache, **common)[:-1]
            else:
                out = self._cross_attention_layer(
                    x, encoder_sequence, value_mask=source_mask, **common
                )
                out = out if isinstance(out, tuple) else (out,)
            weights.extend(out[1:2] if return_attention_scores else [])
            return out[0]

        x = self._residual(
            decoder_sequence,
            self._self_attention_layer_norm,
            self._self_attention_dropout,
            self_attend,
            training,
        )
        if self._cross_attention_layer is not None:
            x = self._residual(
                x,
                self._cross_attention_layer_norm,
                self._cross_attention_dropout,
                cross_attend,
                training,
            )
        x = self._feedforward_residual(x, training)
        # None: the implicit mask passes through (Keras' `compute_mask`).
        outputs = [self.with_output_mask(x, decoder_padding_mask)] + weights
        if cached:
            outputs.append(_to_stacked(caches[0]) if stacked else caches[0])
            if self._cross_attention_layer is not None:
                cross = cross_attention_cache
                outputs.append(_to_stacked(cross) if cross_stacked else cross)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

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
        stacked = _is_stacked(self_attention_cache)
        if stacked:
            cache_length = self_attention_cache.shape[2]
        elif self_attention_cache is not None:
            cache_length = as_kv_cache(self_attention_cache).length
        if cross is not None and cross_attention_cache is not None:
            source_length = (
                cross_attention_cache.shape[2]
                if _is_stacked(cross_attention_cache)
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
            outputs.append(spec(cache) if _is_stacked(cache) else KVCache(*map(spec, cache)))
        return tuple(outputs)


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoderBlock(TransformerDecoder):
    """`TransformerDecoder` under its former name: the files saved under that name load.

    The same layer. Keras keys a model's weights by each layer's snake-cased
    class name, so this subclass keeps `transformer_decoder_block` for the `.keras`
    and weights files written before the rename; new code writes
    `TransformerDecoder`, whose files load into keras-hub's and back.
    """
