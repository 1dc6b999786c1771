"""Multi-head attention (with grouped-query heads) on the shared attention path."""

import keras
from keras import ops

from keras_attn import masks
from keras_attn import ops as attn_ops
from keras_attn.arguments import (
    check_dim,
    check_positive_int,
    check_rank,
    check_rate,
    clone_initializer,
    deserialize_optional_layer,
    serialize_optional_layer,
)
from keras_attn.base import QueryMaskOutput, check_input_shapes, prepare_query
from keras_attn.cache import KVCache, as_kv_cache, write
from keras_attn.matmul_einsum_dense import MatmulEinsumDense


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHeadAttention(QueryMaskOutput, keras.layers.Layer):
    """Multi-head attention: h scaled dot-product heads, concatenated, projected.

    `head_i = softmax(Q W_q^i (K W_k^i)^T / sqrt(d_k)) V W_v^i`,
    `MHA(Q, K, V) = concat(head_1, ..., head_h) W_o`.

    The per-head projections are stored fused (`W_q` of shape `(dq, h, d_k)`,
    the same layout as `keras.layers.MultiHeadAttention`). With
    `num_key_value_heads = g < h` the keys and values have `g` heads, each
    shared by `h / g` query heads (grouped-query attention; `g = 1` is
    multi-query attention). The heads run on `keras_attn.ops.attention`, the
    same masked-softmax path as every other layer.

    **Cached decoding.** Pass `cache=` a `keras_attn.KVCache` (keys and
    values `(B, g, S, d)` and which positions are valid keys, `(B, S)`; from
    `empty_cache` or `compute_cache`):

    - with `cache_update_index=i` (self-attention), the keys and values of
      the new tokens are written at positions `i, i + 1, ...` of the cache,
      valid where `value_mask` says the new tokens are real, and the queries
      attend over the valid positions of the whole cache (positions not yet
      written are invalid; with `use_causal_mask=True` token `i + t` sees
      positions `<= i + t`). Decoding one token at a time, after a prefill
      with padding anywhere in it, gives the outputs of one full causal pass.
    - with `cache_update_index=None` (cross-attention), the cache holds the
      keys and values of the source, computed once by `compute_cache`
      (valid where the source's padding mask is); pass no `value` then.

    The call then returns the updated cache as its last output.

    Args:
        num_heads: number of query heads `h`.
        key_dim: width `d_k` of each query/key head.
        value_dim: width of each value head; defaults to `key_dim`.
        num_key_value_heads: number of key/value heads `g`; must divide
            `num_heads`. `None` means `num_heads`.
        dropout: dropout rate on the attention weights, in training.
        use_bias: whether the projections have biases.
        output_dim: width of the output; defaults to the query width.
        kernel_initializer, bias_initializer: of the projections.
        rotary_embedding: `None`, or a `keras_attn.RotaryEmbedding` applied to
            each query and key head before the scores (positions from 0, or
            from `cache_update_index` for the new tokens of a cached call).
        implementation: `"auto"` (default), `"dense"`, `"fused"` or
            `"chunked"`: the kernel of `keras_attn.ops.attention`, which
            chooses for `"auto"`. The chunked kernel
            (`keras_attn.kernels.chunked_attention`) never forms the
            `(B, h, Tq, Tv)` weights, in the forward or the backward pass:
            memory grows as `Tq` instead of `Tq * Tv`, and padding and causal
            masks are applied per key block. `"auto"` takes it when the
            weights are not requested, no dropout is active and the
            `(B, h, Tq, Tv)` weights would hold
            `keras_attn.ops.CHUNKED_MIN_SCORES` values (2^28, 1 GiB in
            float32; at B=1 and 8 heads from L=8192) or more. The result is
            the same either way (to float rounding).
        seed: dropout seed.

    Call arguments:
        As every keras-attn attention layer: `query (B, Tq, dq)` (or
        `(B, dq)`), `value (B, Tv, dv)`, `key` (defaults to `value`),
        `query_mask`, `value_mask`, `attention_mask (B, Tq, Tv)`,
        `use_causal_mask`, `return_attention_scores`, `training`.
        cache: a `keras_attn.KVCache`, see above; `value_mask` then covers
            the new tokens (self-attention) or the source (cross).
        cache_update_index: int or scalar integer tensor, see above. A Python
            int at which the new tokens do not fit raises `ValueError`; a
            tensor one fails a TensorFlow assertion when the step runs, and
            makes the step's output NaN on every backend.

    Returns:
        `(B, Tq, output_dim or dq)`, and with `return_attention_scores=True`
        the weights `(B, h, Tq, Tv)` (`Tv = S` with a cache); with a cache
        the updated `KVCache` comes last: `(output, [weights,] cache)`. A
        query row with no visible key, a padded query row and every row when
        `Tv = 0` return zeros (after the output projection and its bias) and
        zero weights. The output mask is the query mask (implicit or
        explicit). A NaN or inf at a masked key or value (padding, a future
        step) never reaches the output, on every path
        (`keras_attn.kernels.finite`); one at a visible position makes the
        rows that see it NaN.

    Raises:
        ValueError: inputs of another width than the layer was built for, a
            `cache_update_index` (a Python int) at which the new tokens do not
            fit in the cache, and the shape checks of every attention layer.
        TypeError: non-float inputs, float masks.

    Example:

    >>> x = keras.random.normal((2, 10, 32))
    >>> mha = keras_attn.MultiHeadAttention(num_heads=4, key_dim=8, num_key_value_heads=2)
    >>> out, w = mha(x, x, use_causal_mask=True, return_attention_scores=True)
    >>> print(out.shape, w.shape)
    (2, 10, 32) (2, 4, 10, 10)

    Decoding step by step with a cache gives the full causal pass:

    >>> cache = mha.empty_cache(batch_size=2, length=10)
    >>> steps = []
    >>> for i in range(10):
    ...     y, cache = mha(x[:, i : i + 1], x[:, i : i + 1], use_causal_mask=True,
    ...                    cache=cache, cache_update_index=i)
    ...     steps.append(y)
    >>> full = mha(x, x, use_causal_mask=True)
    >>> print(bool(keras.ops.all(keras.ops.abs(keras.ops.concatenate(steps, 1) - full) < 1e-5)))
    True

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762; Ainslie et al., 2023, "GQA",
        https://arxiv.org/abs/2305.13245
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        num_key_value_heads=None,
        dropout=0.0,
        use_bias=True,
        output_dim=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        rotary_embedding=None,
        implementation="auto",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.key_dim = check_positive_int("key_dim", key_dim)
        self.value_dim = check_positive_int("value_dim", value_dim, allow_none=True)
        self.num_key_value_heads = check_positive_int(
            "num_key_value_heads", num_key_value_heads, allow_none=True
        )
        if num_heads % (self.num_key_value_heads or num_heads):
            raise ValueError(
                "`num_key_value_heads` must divide `num_heads`. Received: "
                f"num_key_value_heads={num_key_value_heads}, num_heads={num_heads}"
            )
        self.dropout = check_rate("dropout", dropout)
        self.use_bias = use_bias
        self.output_dim = check_positive_int("output_dim", output_dim, allow_none=True)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        if rotary_embedding is not None and not isinstance(rotary_embedding, keras.layers.Layer):
            raise TypeError(
                "`rotary_embedding` must be None or a layer such as "
                f"keras_attn.RotaryEmbedding(). Received: rotary_embedding={rotary_embedding!r}"
            )
        if rotary_embedding is not None and key_dim % 2:
            raise ValueError(
                "`key_dim` must be even to rotate pairs of features with "
                f"`rotary_embedding`. Received: key_dim={key_dim}"
            )
        self.rotary_embedding = rotary_embedding
        # Checks the name, and that "fused" and "chunked" come without dropout.
        attn_ops.choose_implementation(implementation, (None, None), self.dropout, True, False)
        self.implementation = implementation
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True

    def _einsum_dense(self, equation, output_shape, bias_axes, name):
        layer = MatmulEinsumDense(
            equation,
            contract_axes=2 if name == "attention_output" else 1,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
        # Inputs may carry an implicit mask (applied by this layer, not by the
        # projections): let it pass instead of warning that it is destroyed.
        layer.supports_masking = True
        return layer

    def build(self, query_shape, value_shape, key_shape=None):
        query_shape, key_shape = check_input_shapes(query_shape, value_shape, key_shape)
        kv_heads = self.num_key_value_heads or self.num_heads
        value_dim = self.value_dim or self.key_dim
        self.query_dense = self._einsum_dense(
            "btd,dhk->bthk", (None, self.num_heads, self.key_dim), "hk", "query"
        )
        self.key_dense = self._einsum_dense(
            "btd,dhk->bthk", (None, kv_heads, self.key_dim), "hk", "key"
        )
        self.value_dense = self._einsum_dense(
            "btd,dhk->bthk", (None, kv_heads, value_dim), "hk", "value"
        )
        self.output_dense = self._einsum_dense(
            "bthk,hko->bto", (None, self.output_dim or query_shape[-1]), "o", "attention_output"
        )
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build((query_shape[0], query_shape[1], self.num_heads, value_dim))
        # The EinsumDense projections do not check their input width: call() does.
        self._built_widths = {
            "query": query_shape[-1],
            "key": key_shape[-1],
            "value": tuple(value_shape)[-1],
        }
        self.built = True

    def _heads(self, x):
        """`(B, T, n, d) -> (B, n, T, d)`."""
        return ops.transpose(x, (0, 2, 1, 3))

    def _repeat_kv(self, x):
        """`(B, g, T, d) -> (B, h, T, d)`, repeating each of the g heads h/g times."""
        groups = self.num_heads // x.shape[1]
        return x if groups == 1 else ops.repeat(x, groups, axis=1)

    def _rotate(self, x, start_index=0):
        if self.rotary_embedding is None:
            return x
        return self.rotary_embedding(x, start_index=start_index)

    def compute_cache(self, value, key=None, value_mask=None):
        """Keys and values of a source, for cross-attention with a cache.

        Args:
            value: `(B, Tv, dv)`.
            key: `(B, Tv, dk)`; defaults to `value`.
            value_mask: bool `(B, Tv)`, the source's real tokens; `None`
                means all.

        Returns:
            A `KVCache`: keys `(B, g, Tv, key_dim)`, values
            `(B, g, Tv, value_dim)` and `valid` the `value_mask`, to pass as
            `cache=` with `cache_update_index=None`.
        """
        if not self.built:
            raise ValueError(
                "Call the layer once (or `build` it) before `compute_cache`, so "
                "its projections exist."
            )
        key = value if key is None else key
        k = self._heads(self._rotate(self.key_dense(key)))  # (B, g, Tv, dk)
        v = self._heads(self.value_dense(value))  # (B, g, Tv, dv)
        valid = masks.as_bool_mask(value_mask, "value_mask")
        if valid is None:
            valid = ops.ones(ops.shape(value)[:2], "bool")
        return KVCache(k, v, valid)

    def empty_cache(self, batch_size, length, dtype=None):
        """A self-attention cache for `length` positions, none of them valid yet.

        Returns:
            A `KVCache` of zero keys `(B, g, length, key_dim)` and values
            `(B, g, length, value_dim)` in the compute dtype, and `valid` all
            `False`.
        """
        kv_heads = self.num_key_value_heads or self.num_heads
        dtype = dtype or self.compute_dtype
        return KVCache(
            ops.zeros((batch_size, kv_heads, length, self.key_dim), dtype),
            ops.zeros((batch_size, kv_heads, length, self.value_dim or self.key_dim), dtype),
            ops.zeros((batch_size, length), "bool"),
        )

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        cache=None,
        cache_update_index=None,
    ):
        self._check_built_widths(query, value, key)
        cached, cross = cache is not None, cache is not None and cache_update_index is None
        explicit_mask = attention_mask
        if cached:
            check_rank("query", query.shape, (3,))
            cache = as_kv_cache(cache)
            check_rank("cache", cache.key.shape, (4,))
            attention_mask = None  # over the cache's positions: checked below
        if cross and (value is not None or key is not None):
            raise ValueError(
                "With `cache_update_index=None` the cache holds the keys and values: "
                "pass no `value` or `key`."
            )
        if not cross and value is None:
            raise ValueError(
                "`value` is required unless a precomputed `cache` is passed "
                "(with a self-attention cache, `value` holds the new tokens)."
            )
        value_shape = (cache.key.shape[0], cache.length) if cross else value.shape
        query, query_mask, attention_mask, single_query = prepare_query(
            query, value, query_mask, value_mask, attention_mask, key=key, value_shape=value_shape
        )
        if cached:
            attention_mask = self._cache_attention_mask(explicit_mask, cache)
        self.set_output_mask(query_mask)

        start, in_range = None, None  # the causal mask's query start; a tensor index's check
        if cross:
            k, v, key_mask = cache.key, cache.value, masks.merge_masks(cache.valid, value_mask)
        else:
            key = value if key is None else key
            # Padded steps zeroed before the projections: nothing they hold reaches
            # a gradient of the kernels (dW = x^T dy).
            key, value = masks.zero_padded(key, value_mask), masks.zero_padded(value, value_mask)
            index = 0 if cache_update_index is None else cache_update_index
            k = self._heads(self._rotate(self.key_dense(key), index))  # (B, g, Tv, dk)
            v = self._heads(self.value_dense(value))  # (B, g, Tv, dv)
            key_mask = value_mask
            if cached:  # write the new tokens, then attend over the whole cache
                cache, in_range = write(cache, cache_update_index, k, v, value_mask)
                k, v, key_mask, start = cache.key, cache.value, cache.valid, cache_update_index
        q = self._heads(self._rotate(self.query_dense(query), 0 if start is None else start))
        heads, weights = attn_ops.attention(
            q,
            self._repeat_kv(k),  # (B, h, Tv, dk)
            self._repeat_kv(v),
            mask=masks.attention_heads_mask(key_mask, attention_mask),
            is_causal=use_causal_mask,
            query_start=start,
            dropout_rate=self.dropout,
            training=training,
            seed=self.seed_generator,
            implementation=self.implementation,
            return_weights=return_attention_scores,
        )  # (B, h, Tq, dv), (B, h, Tq, Tv) or None
        output = self.output_dense(ops.transpose(heads, (0, 2, 1, 3)))  # (B, Tq, out)
        rows = masks.visible_query_rows(
            ops.shape(q)[2], ops.shape(k)[2], query_mask, key_mask, attention_mask,
            use_causal_mask, query_start=start,
        )  # fmt: skip
        if rows is not None:  # (B|1, Tq|1, 1): padded rows and rows that see nothing give zeros
            output = ops.where(rows, output, ops.zeros_like(output))
            if weights is not None:
                weights = ops.where(rows[:, None], weights, ops.zeros_like(weights))
        if in_range is not None:  # a tensor cache index past the end: NaN, never clamped
            output = ops.where(in_range, output, ops.cast(float("nan"), output.dtype))
        if single_query:
            output = output[:, 0]
            weights = None if weights is None else weights[..., 0, :]
        outputs = (output, weights) if return_attention_scores else (output,)
        if cached:
            outputs += (cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def _cache_attention_mask(self, attention_mask, cache):
        """The checked `attention_mask (B|1, Tq, S)` of a cached call (over the cache)."""
        if attention_mask is None:
            return None
        masks.check_mask_dtype("attention_mask", attention_mask)
        check_rank("attention_mask", attention_mask.shape, (3,))
        check_dim("attention_mask", attention_mask.shape[2], "cache", cache.length,
                  "length (axis 2 of the mask, axis 2 of the cache)")  # fmt: skip
        return masks.as_bool_mask(attention_mask, "attention_mask")

    def _check_built_widths(self, query, value, key):
        """`ValueError` unless the inputs have the widths the projections were built for."""
        inputs = {"query": query, "value": value, "key": value if key is None else key}
        for name, x in inputs.items():
            width = self._built_widths[name]
            if x is not None and x.shape[-1] is not None and x.shape[-1] != width:
                name = "value" if key is None and name == "key" else name
                raise ValueError(
                    f"`{name}` must have width {width}, the width this layer was built for. "
                    f"Received: {name}.shape={tuple(x.shape)}"
                )

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def compute_output_spec(
        self, query, value=None, key=None, return_attention_scores=False, cache=None, **kwargs
    ):
        value_length = value.shape[1] if cache is None else as_kv_cache(cache).length
        output_shape = tuple(query.shape[:-1]) + (self.output_dim or query.shape[-1],)
        outputs = [keras.KerasTensor(output_shape, dtype=self.compute_dtype)]
        if return_attention_scores:
            batch, query_length = query.shape[0], tuple(query.shape[1:-1])
            weights_shape = (batch, self.num_heads) + query_length + (value_length,)
            outputs.append(keras.KerasTensor(weights_shape, dtype=self.compute_dtype))
        if cache is not None:
            cache = as_kv_cache(cache)
            outputs.append(KVCache(*(keras.KerasTensor(c.shape, dtype=c.dtype) for c in cache)))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "num_key_value_heads": self.num_key_value_heads,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "output_dim": self.output_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "rotary_embedding": serialize_optional_layer(self.rotary_embedding),
                "implementation": self.implementation,
                "seed": self.seed,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**deserialize_optional_layer(config, "rotary_embedding"))
