"""Multi-head attention: Keras' constructor, weights and call on `keras_attn.ops.attention`.

One concept, one file: the constructor (Keras' arguments and ours, checked),
the projections (built in Keras' order and layout, so that `set_weights`
with Keras' weights gives Keras' outputs), the attention (one
`keras_attn.ops.AttentionSpec` per call, the rank-3 path of
`keras_attn.multi_head_shapes.AttentionLayout`), the KV cache, and the config.
"""

from typing import NamedTuple

import keras
from keras import ops

from keras_attn import masks
from keras_attn import ops as attn_ops
from keras_attn._execution import transpose
from keras_attn._typing import (
    ConstraintLike,
    InitializerLike,
    Length,
    RegularizerLike,
    TensorLike,
)
from keras_attn.arguments import (
    check_dim,
    check_positive_int,
    check_rank,
    check_rate,
    clone_initializer,
    deserialize_optional_layer,
    dim,
    serialize_optional_layer,
)
from keras_attn.cache import (
    Int8Heads,
    KVCache,
    RingKVCache,
    as_kv_cache,
    dequantize,
    map_cache,
    ring_update,
    write,
)
from keras_attn.layer_io import AttentionLayer, prepare_query, zero_unseen_rows
from keras_attn.matmul_einsum_dense import MatmulEinsumDense
from keras_attn.multi_head_shapes import (
    attention_layout,
    check_attention_axes,
    check_key_value_heads,
    check_key_value_shapes,
    check_output_shape,
)
from keras_attn.position_bias import check_position_bias
from keras_attn.rotary import check_rotary_embedding

_FLASH_SCORES = (
    "Returning attention scores is not supported when flash attention is enabled. "
    "Please disable flash attention to access attention scores."
)


class ProjectedHeads(NamedTuple):
    """One call's projected heads and the padding and positions of the keys they attend over.

    What `MultiHeadAttention._project_inputs` hands to the attention
    (`_attend`) and to the output projection (`_project_output`); `S` is the
    number of keys attended over: `Tv`, or the cache's length in a cached call.
    """

    query: TensorLike  # (B, Tq, dq): the rank-3 query, padded rows zeroed (the gate reads it)
    q: TensorLike  # (B, h, Tq, dk), rotated
    k: TensorLike  # (B, g, S, dk), rotated
    v: TensorLike  # (B, g, S, dv)
    query_mask: TensorLike | None  # (B, Tq)
    key_padding_mask: TensorLike | None  # (B, S): which keys are real (a cache's valid ones)
    query_start: Length | None  # the first query's position among the keys; None: S - Tq
    cache: KVCache | None  # the cache, with the new tokens written
    in_range: TensorLike | None  # whether a tensor cache index fits the cache
    key_positions: TensorLike | None = None  # (S,) int32: a ring cache's; None: 0 .. S - 1


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHeadAttention(AttentionLayer, keras.layers.Layer):
    """Multi-head attention, a drop-in for `keras.layers.MultiHeadAttention`.

    `head_i = softmax(Q W_q^i (K W_k^i)^T / sqrt(d_k) + bias_i) V W_v^i`,
    `MHA(Q, K, V) = concat(head_1 * g_1, ..., head_h * g_h) W_o`, with the gate
    `g = sigmoid(Q W_g)` when `use_gate=True` (else 1).

    Keras' constructor, call and weight layout (weights copied with
    `set_weights` give the same outputs) on `keras_attn.ops.attention`:
    masked keys get exactly zero weight, rows with no visible key output
    zeros, long sequences may run chunked, a `KVCache` decodes step by step.
    Float masks are read as Keras reads them (1 = attend, 0 = masked); one
    holding other values (an additive 0 / -1e9 mask, which that reading would
    invert) raises `ValueError` when its values are known, and is read as
    `mask > 0.5` when traced. One difference from Keras: with
    `Tq != Tv` query `i` sits at position `Tv - Tq + i` for the causal mask
    and the sliding window (aligned to the end, as a decoding step needs).
    With `num_key_value_heads = g < h`, `h / g` query heads share each
    key/value head (`keras_attn.GroupedQueryAttention`: Keras' names).

    **Cached decoding** (rank-3 inputs): `cache=` a `keras_attn.KVCache`
    (from `empty_cache` or `compute_cache`), or a plain `(key, value, valid)` tuple;
    keras-hub's stacked cache tensor is taken by the Transformer decoder blocks
    (`TransformerDecoder`), not here. With `cache_update_index=i` the
    new tokens' keys and values are written at positions `i, i + 1, ...`
    (valid where `value_mask` holds) and the queries attend over the valid
    positions of the whole cache: step by step after a padded prefill equals
    one full causal pass. With `cache_update_index=None` the cache holds a
    source (`compute_cache`; cross-attention): pass no `value`.

    Args:
        num_heads: number of query heads `h`.
        key_dim: width `d_k` of each query and key head.
        value_dim: width of each value head; `None` means `key_dim`.
        dropout: dropout rate on the attention weights, in training.
        use_bias: whether the projections have biases.
        output_shape: the output's trailing shape, an int or a tuple;
            `None` means the query's width.
        attention_axes: the axes of `(B, a_1, ..., a_n, d)` attended over
            (the others are batch axes); `None`: all but the first and last.
            Several axes are one softmax over their positions, numbered
            row-major for the causal mask, window, rotary and position bias.
        sliding_window: `None`, or an int `w > 0`: position `p` sees key `j`
            only if `|p - j| < w` (with `use_causal_mask=True`, Mistral's
            causal window); applied per key block when chunked.
        flash_attention: which path runs, as in Keras. `True`: the
            backend's kernel, `keras.ops.dot_product_attention` (cuDNN on JAX
            with a GPU, SDPA on torch, Keras' composition on TensorFlow),
            with our masks around it; no dropout, no returned scores
            (`ValueError`, as Keras), `implementation` `"auto"` or
            `"backend"`. `False`: never that kernel. `None`:
            `keras.config.is_flash_attention_enabled()` if set, else
            `"auto"` decides (`keras_attn.ops.choose_implementation`: the
            backend's kernel on JAX with a GPU and torch with CUDA).
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, activity_regularizer, kernel_constraint,
        bias_constraint: of every projection (activity: on their outputs).
        use_gate: a sigmoid gate on the query (Qiu et al. 2025).
        seed: dropout seed.
        num_key_value_heads: key/value heads `g`, dividing `num_heads`;
            `None` means `num_heads`.
        rotary_embedding: `None`, or a `keras_attn.RotaryEmbedding` (or a
            layer of the same protocol: `call(x, start_index=0)` on
            `(B, T, h, d)` heads, keeping their shape) applied to the query and
            key heads (from `cache_update_index` if cached). Anything else
            raises `TypeError`.
        implementation: `"auto"`, `"dense"`, `"fused"`, `"chunked"` or
            `"backend"`, the kernel of `keras_attn.ops.attention`
            (`"chunked"` never forms the `(B, h, Tq, Tv)` weights; `"auto"`
            takes it from `keras_attn.ops.CHUNKED_MIN_SCORES` scores without
            weights or active dropout; `"backend"` is `flash_attention=True`).
        position_bias: `None`, or a `keras_attn.PositionBias` layer (e.g.
            `keras_attn.AlibiBias`) added to the scores on every path.
        qkv_bias: whether the query, key and value projections have biases;
            `None` (default) means `use_bias`. `use_bias=False, qkv_bias=True`
            is Qwen2's attention: biased q, k, v, an output projection
            without bias.

    Call arguments:
        query: `(B, Tq, dq)`, `(B, dq)` or `(B, a_1, ..., a_n, dq)`.
        value: `(B, Tv, dv)`, of the query's rank. key: defaults to `value`.
        query_mask, value_mask, key_mask: bool, the input's shape without
            its last axis; filled from implicit Keras masks. A key is
            visible where `value_mask` and `key_mask` hold.
        attention_mask: bool, int or float 0/1, `(Tq, Tv)`, `(B, 1, Tv)`, `(B, Tq, Tv)`
            or per head `(B, h, Tq, Tv)` (broadcast as Keras does).
        return_attention_scores, training: as Keras.
        use_causal_mask: query `i` sees keys `j <= Tv - Tq + i`.
        cache, cache_update_index: see above; `value_mask` then covers the
            new tokens or the source. An int index where the tokens do not
            fit raises; a tensor one fails a TensorFlow assertion (NaN output).
        attention_bias: `None`, a float tensor `(B|1, h|1, Tq, Tv)`, a
            `keras_attn.PositionBias`, a tuple of these or a
            `keras_attn.AttentionBias`, added to the scaled scores in float32
            (kept in float32 under a mixed policy; rank-3 inputs).

    Returns:
        The output: the query's shape with `output_shape` for its last axis;
        with `return_attention_scores=True` also the weights `(B, h, Tq, Tv)`
        (`(batch axes, h, query axes, key axes)` for more axes; `Tv = S` with
        a cache); with a cache, the updated `KVCache` last. Rows with no
        visible key, padded rows and every row when `Tv = 0` are zeros (after
        the output bias), with zero weights. The output mask is the query
        mask. A NaN or inf at a masked key or value never reaches the output.

    Raises:
        ValueError: bad constructor values (naming the argument), `dropout`,
            `return_attention_scores=True` or an `implementation` other than
            `"auto"` / `"backend"` with `flash_attention=True`,
            other widths than built for, `key` and `value` shapes differing
            before the last axis, masks that do not broadcast, a float mask
            holding values other than 0 and 1 (when known).
        TypeError: non-float inputs, non-numeric masks; a `rotary_embedding` or
            `position_bias` that is not such a layer.

    Example:

    >>> x = keras.random.normal((2, 10, 32))
    >>> mha = keras_attn.MultiHeadAttention(num_heads=4, key_dim=8, num_key_value_heads=2)
    >>> out, w = mha(x, x, use_causal_mask=True, return_attention_scores=True)
    >>> print(out.shape, w.shape)
    (2, 10, 32) (2, 4, 10, 10)
    >>> cache, steps = mha.empty_cache(batch_size=2, length=10), []
    >>> for i in range(10):
    ...     y, cache = mha(x[:, i : i + 1], x[:, i : i + 1], use_causal_mask=True,
    ...                    cache=cache, cache_update_index=i)
    ...     steps.append(y)
    >>> full = mha(x, x, use_causal_mask=True)
    >>> print(bool(keras.ops.all(keras.ops.abs(keras.ops.concatenate(steps, 1) - full) < 1e-5)))
    True

    Reference:
        Vaswani et al., 2017, https://arxiv.org/abs/1706.03762; Ainslie et
        al., 2023 (GQA), https://arxiv.org/abs/2305.13245; Qiu et al., 2025
        (gated attention), https://arxiv.org/abs/2505.06708
    """

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        value_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        output_shape: int | tuple[int, ...] | None = None,
        attention_axes: int | tuple[int, ...] | None = None,
        sliding_window: int | None = None,
        flash_attention: bool | None = None,
        kernel_initializer: InitializerLike = "glorot_uniform",
        bias_initializer: InitializerLike = "zeros",
        kernel_regularizer: RegularizerLike | None = None,
        bias_regularizer: RegularizerLike | None = None,
        activity_regularizer: RegularizerLike | None = None,
        kernel_constraint: ConstraintLike | None = None,
        bias_constraint: ConstraintLike | None = None,
        use_gate: bool = False,
        seed: int | None = None,
        *,
        num_key_value_heads: int | None = None,
        rotary_embedding: keras.layers.Layer | None = None,
        implementation: str = "auto",
        position_bias: keras.layers.Layer | None = None,
        qkv_bias: bool | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.key_dim = check_positive_int("key_dim", key_dim)
        self.value_dim = check_positive_int("value_dim", value_dim, allow_none=True) or self.key_dim
        self.dropout = check_rate("dropout", dropout)
        self.use_bias = bool(use_bias)
        if qkv_bias is not None and not isinstance(qkv_bias, bool):
            raise TypeError(f"`qkv_bias` must be None or a bool. Received: qkv_bias={qkv_bias!r}")
        self.qkv_bias = qkv_bias
        # Stored private, as Keras does: a public `output_shape` would clash in model summaries.
        self._output_shape = check_output_shape(output_shape)
        self.attention_axes = check_attention_axes(attention_axes)
        self.sliding_window = masks.check_window(sliding_window, "sliding_window")
        self.flash_attention = flash_attention
        # The flash choice (Keras' private name): None (auto), True (the backend's kernel) or
        # False (never it); Keras' global switch stands in for None, read here as Keras does.
        self._flash_attention = (
            keras.config.is_flash_attention_enabled()
            if flash_attention is None
            else bool(flash_attention)
        )
        if self._flash_attention and self.dropout > 0:
            raise ValueError(
                "Dropout is not supported when flash attention is enabled. Please set "
                f"dropout to 0.0 to use flash attention. Received: dropout={dropout}"
            )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        # Regularizes each projection's output, as in Keras; the base layer's
        # `activity_regularizer` (this layer's output) stays None.
        self._activity_regularizer = keras.regularizers.get(activity_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.use_gate = bool(use_gate)
        self.seed = seed
        self.num_key_value_heads = check_key_value_heads(num_key_value_heads, self.num_heads)
        self.rotary_embedding = check_rotary_embedding(rotary_embedding, self.key_dim)
        self.position_bias = check_position_bias(position_bias, self.num_heads)
        # The name, that "fused", "chunked" and "backend" come without dropout, and that
        # `flash_attention` agrees with `implementation`.
        attn_ops.check_implementation(implementation, self._flash_attention, self.dropout)
        self.implementation = implementation
        # Keras' layers keep the call's flag here for their `_compute_attention` (its GQA reads it).
        self._return_attention_scores = False
        # A seed generator only where there is dropout to draw (as Keras' Dropout).
        self.seed_generator = keras.random.SeedGenerator(seed) if self.dropout else None
        self.supports_masking = True

    @property
    def _sliding_window(self):
        """Keras' private name of `sliding_window` (read by code written for Keras' layer)."""
        return self.sliding_window

    # Keras' read-only names of the projections (e.g. `layer.query_dense.enable_lora(2)`).
    query_dense = property(lambda self: self._query_dense)
    key_dense = property(lambda self: self._key_dense)
    value_dense = property(lambda self: self._value_dense)
    output_dense = property(lambda self: self._output_dense)

    def _einsum_dense(self, equation, output_shape, bias_axes, name, activation=None):
        use_bias = self.use_bias
        if name in ("query", "key", "value") and self.qkv_bias is not None:
            use_bias = self.qkv_bias
        layer = MatmulEinsumDense(
            equation,
            contract_axes=2 if name == "attention_output" else 1,
            output_shape=output_shape,
            bias_axes=bias_axes if use_bias else None,
            activation=activation,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            activity_regularizer=self._activity_regularizer,
            kernel_constraint=self.kernel_constraint,
            bias_constraint=self.bias_constraint,
            dtype=self.dtype_policy,
            name=name,
        )
        # Inputs may carry an implicit mask (applied by this layer, not by the
        # projections): let it pass instead of warning that it is destroyed.
        layer.supports_masking = True
        return layer

    def _layout(self, query_shape, value_shape):
        """The checked `AttentionLayout` of inputs of these shapes (rank 2 queries: rank 3)."""
        if len(query_shape) < 2:
            raise ValueError(
                "`query` must have rank 2 or more: (batch, ..., features). "
                f"Received: query.shape={tuple(query_shape)}"
            )
        rank = max(len(query_shape), 3)
        check_rank("value", value_shape, (rank,))
        if len(query_shape) == 2 and self.attention_axes not in (None, (1,), (-2,)):
            raise ValueError(
                "A rank-2 query attends over axis 1 of `value` only. Received: "
                f"attention_axes={self.attention_axes}"
            )
        return attention_layout(rank, None if len(query_shape) == 2 else self.attention_axes)

    def build(self, query_shape, value_shape, key_shape=None):
        check_key_value_shapes(value_shape, key_shape)
        key_shape = tuple(value_shape if key_shape is None else key_shape)
        self._layout(query_shape, value_shape)  # checks the ranks and the attention axes
        check_dim("query", query_shape[0], "value", value_shape[0], "batch size")
        kv_heads = self.num_key_value_heads or self.num_heads
        heads = "btd,dhk->bthk"
        letters = "opqrsuvwxyz"[: len(self._output_shape or (None,))]
        # Created in Keras' order, so that `get_weights` lists them as Keras does.
        self._query_dense = self._einsum_dense(
            heads, (None, self.num_heads, self.key_dim), "hk", "query"
        )
        self._key_dense = self._einsum_dense(heads, (None, kv_heads, self.key_dim), "hk", "key")
        if self.use_gate:
            self._gate_dense = self._einsum_dense(
                heads, (None, self.num_heads, self.value_dim), "hk", "gate", "sigmoid"
            )
        self._value_dense = self._einsum_dense(
            heads, (None, kv_heads, self.value_dim), "hk", "value"
        )
        self._output_dense = self._einsum_dense(
            f"bthk,hk{letters}->bt{letters}",
            (None, *(self._output_shape or (query_shape[-1],))),
            letters,
            "attention_output",
        )
        for layer, width in ((self._query_dense, query_shape[-1]), (self._key_dense, key_shape[-1]),
                             (self._value_dense, value_shape[-1])):  # fmt: skip
            layer.build((None, None, width))
        if self.use_gate:
            self._gate_dense.build((None, None, query_shape[-1]))
        self._output_dense.build((None, None, self.num_heads, self.value_dim))
        # The EinsumDense projections do not check their input width: call() does.
        self._built_widths = {
            "query": query_shape[-1],
            "key": key_shape[-1],
            "value": value_shape[-1],
        }
        self.built = True

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
        check_key_value_shapes(value_shape, key_shape)
        return tuple(query_shape)[:-1] + (self._output_shape or tuple(query_shape)[-1:])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "output_shape": self._output_shape,
                "attention_axes": self.attention_axes,
                "sliding_window": self.sliding_window,
                "flash_attention": self.flash_attention,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
                "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
                "activity_regularizer": keras.regularizers.serialize(self._activity_regularizer),
                "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
                "bias_constraint": keras.constraints.serialize(self.bias_constraint),
                "use_gate": self.use_gate,
                "seed": self.seed,
                "num_key_value_heads": self.num_key_value_heads,
                "rotary_embedding": serialize_optional_layer(self.rotary_embedding),
                "implementation": self.implementation,
                "position_bias": serialize_optional_layer(self.position_bias),
                "qkv_bias": self.qkv_bias,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = deserialize_optional_layer(config, "rotary_embedding")
        return cls(**deserialize_optional_layer(config, "position_bias"))

    def _heads(self, x):
        """`(B, T, n, d) -> (B, n, T, d)`."""
        return transpose(x, (0, 2, 1, 3))

    def _repeat_kv(self, x):
        """`(B, g, T, d) -> (B, h, T, d)`, repeating each of the g heads h/g times."""
        groups = self.num_heads // x.shape[1]
        return x if groups == 1 else ops.repeat(x, groups, axis=1)

    def _rotate(self, x, start_index=0):
        if self.rotary_embedding is None:
            return x
        return self.rotary_embedding(x, start_index=start_index)

    def compute_cache(self, value, key=None, value_mask=None):
        """Keys and values of a source `(B, Tv, dv)` (`key` defaults to it), for cross-attention.

        Returns:
            A `KVCache`: keys `(B, g, Tv, key_dim)`, values
            `(B, g, Tv, value_dim)` and `valid` the `value_mask` (bool
            `(B, Tv)`, `None` meaning all real), to pass as `cache=` with
            `cache_update_index=None`.

        Raises:
            ValueError: a layer with a `position_bias` or a `sliding_window`:
                both compare a query's position with the keys', and a step
                through a cross-attention cache has no position in the source
                (the blocks apply both to the self-attention only).
        """
        if not self.built:
            raise ValueError(
                "Call the layer once (or `build` it) before `compute_cache`, so "
                "its projections exist."
            )
        if self.position_bias is not None or self.sliding_window is not None:
            raise ValueError(
                "A cross-attention cache has no query positions for a position bias or a "
                "sliding window to compare with the source's: use this layer's self-attention "
                "cache (`cache_update_index=`), or a cross-attention layer without them. "
                f"Received: position_bias={self.position_bias!r}, "
                f"sliding_window={self.sliding_window!r}"
            )
        key = value if key is None else key
        k = self._heads(self._rotate(self._key_dense(key)))  # (B, g, Tv, dk)
        v = self._heads(self._value_dense(value))  # (B, g, Tv, dv)
        valid = masks.as_bool_mask(value_mask, "value_mask")
        if valid is None:
            valid = ops.ones(ops.shape(value)[:2], "bool")
        return KVCache(k, v, valid)

    def empty_cache(self, batch_size, length, dtype=None):
        """A self-attention `KVCache` of `length` zero positions (none valid), in the compute dtype.

        Keys `(B, g, length, key_dim)`, values `(B, g, length, value_dim)`. With
        `dtype="int8"` they are `keras_attn.cache.Int8Heads`: int8 with a float32
        scale per position and head, quantized as they are written and read back
        in the compute dtype before the attention (within `max|x| / 254` of each
        key or value, `max` over its head vector).
        """
        kv_heads = self.num_key_value_heads or self.num_heads
        dtype = dtype or self.compute_dtype
        shapes = ((batch_size, kv_heads, length, d) for d in (self.key_dim, self.value_dim))
        if dtype == "int8":
            key, value = (Int8Heads.zeros(shape) for shape in shapes)
        else:
            key, value = (ops.zeros(shape, dtype) for shape in shapes)
        return KVCache(key, value, ops.zeros((batch_size, length), "bool"))

    def call(
        self,
        query: TensorLike,
        value: TensorLike | None = None,
        key: TensorLike | None = None,
        query_mask: TensorLike | None = None,
        value_mask: TensorLike | None = None,
        key_mask: TensorLike | None = None,
        attention_mask: TensorLike | None = None,
        return_attention_scores: bool = False,
        training: bool | None = None,
        use_causal_mask: bool = False,
        cache: KVCache | tuple[TensorLike, TensorLike, TensorLike] | None = None,
        cache_update_index: Length | None = None,
        attention_bias: TensorLike | None = None,
    ):
        if self._flash_attention and return_attention_scores:
            raise ValueError(_FLASH_SCORES)
        self._check_built_widths(query, value, key)
        query_mask, value_mask, key_mask, attention_mask = (
            masks.as_bool_mask(m, n) for m, n in ((query_mask, "query_mask"),
            (value_mask, "value_mask"), (key_mask, "key_mask"), (attention_mask, "attention_mask"))
        )  # fmt: skip
        cached, single_query = cache is not None, len(query.shape) == 2
        if cached:
            check_rank("query", query.shape, (2, 3))
            cache = as_kv_cache(cache)
            check_rank("cache", cache.key.shape, (4,))
            source = (cache.key.shape[0], cache.length, None)  # the keys: the cache's positions
        elif value is None:
            raise ValueError(
                "`value` is required unless a precomputed `cache` is passed "
                "(with a self-attention cache, `value` holds the new tokens)."
            )
        else:
            check_key_value_shapes(value.shape, None if key is None else key.shape)
            source = value.shape
        layout = attention_layout(3) if cached else self._layout(query.shape, source)
        attention_mask = self._expand_attention_mask(layout, attention_mask, query, value, source)
        for name, mask in (("value_mask", value_mask), ("key_mask", key_mask)):
            if mask is not None and layout.identity and value is not None:  # (B, Tv), merged
                check_rank(name, mask.shape, (2,))
                check_dim(name, mask.shape[1], "value", value.shape[1], "length")
        if attention_bias is not None and not layout.identity:
            raise ValueError(
                "`attention_bias` needs inputs of rank 3 (B, T, d). Received: "
                f"query.shape={tuple(query.shape)}"
            )
        if cached:
            self._check_cache_arguments(value, key, cache_update_index, use_causal_mask)
            if isinstance(cache, RingKVCache):
                self._check_ring(cache, cache_update_index, attention_mask, attention_bias)
        # Below the call, one key padding mask `(B, Tv)`: Keras' `value_mask` and `key_mask`.
        key_padding_mask = masks.merge_masks(
            layout.flatten_mask(value_mask, "value_mask", value),
            layout.flatten_mask(key_mask, "key_mask", value),
        )
        projected = self._project_inputs(
            layout.flatten(query),
            layout.flatten(value),
            layout.flatten(key),
            layout.flatten_mask(query_mask, "query_mask", query),
            key_padding_mask,
            cache,
            cache_update_index,
        )
        # A self-attention step: each new token is written valid (where the new tokens'
        # padding mask says so) and sees itself, whatever the causal mask and window.
        step = cached and cache_update_index is not None and attention_mask is None
        # The new keys' padding is the queries' (a decoder's self-attention): the real
        # queries see a key, their own, and the padded ones are zeroed: the rows are known.
        own_keys = step and key_padding_mask is query_mask
        step = step and query_mask is None and key_padding_mask is None
        bias = (
            None
            if self.position_bias is None and attention_bias is None
            else attn_ops.AttentionBias(self.position_bias, attention_bias)
        )
        is_causal, window = bool(use_causal_mask), self.sliding_window
        if projected.key_positions is not None:  # a ring cache: the keys are not in order
            attention_mask, bias = self._at_key_positions(projected, is_causal, bias)
            is_causal, window = False, None  # in `attention_mask` now
        spec = attn_ops.AttentionSpec(
            mask=masks.merge_masks(  # (B, 1, 1, S) and the explicit (B|1, h|1, Tq|1, S)
                masks.attention_heads_mask(projected.key_padding_mask), attention_mask
            ),
            is_causal=is_causal,
            query_start=projected.query_start,
            window=window,
            bias=bias,
            dropout_rate=self.dropout,
            seed=self.seed_generator,
            training=training,
            return_weights=return_attention_scores,
            every_row_sees_a_key=step,
        )
        heads, weights = self._attend(projected.q, projected.k, projected.v, spec)
        output, weights = self._project_output(
            projected, heads, weights, spec, attention_mask, own_keys
        )
        if single_query:  # (B, 1, ...) -> (B, ...)
            output = output[:, 0]
            weights = None if weights is None else weights[..., 0, :]
        output = self.with_output_mask(layout.unflatten_output(output, query), query_mask)
        if weights is not None:
            weights = layout.unflatten_scores(weights, query, value)
        outputs = (output, weights) if return_attention_scores else (output,)
        outputs += (projected.cache,) if cached else ()
        return outputs[0] if len(outputs) == 1 else outputs

    def _expand_attention_mask(self, layout, attention_mask, query, value, source):
        """Keras' explicit mask as the rank-3 path's `(B|1, h|1, Tq|1, S)` (`None`: `None`).

        `source` is the keys' shape (the cache's positions when cached); a
        rank-2 query's mask is `(B, Tv)`.
        """
        if attention_mask is None:
            return None
        single_query = len(query.shape) == 2
        if single_query:  # (B, Tv) -> (B, 1, Tv)
            check_rank("attention_mask", attention_mask.shape, (2,))
            attention_mask = ops.expand_dims(attention_mask, 1)
        scores = layout.scores_shape(
            ((query.shape[0], 1) if single_query else query.shape), source, self.num_heads
        )
        attention_mask = layout.expand_mask(attention_mask, scores)
        if not layout.identity:
            attention_mask = layout.flatten_attention_mask(attention_mask, query, value)
        return attention_mask

    @staticmethod
    def _check_cache_arguments(value, key, cache_update_index, use_causal_mask):
        """`ValueError` where a cached call's arguments do not fit its kind of cache."""
        cross = cache_update_index is None
        if cross and (value is not None or key is not None):
            raise ValueError(
                "With `cache_update_index=None` the cache holds the keys and values: "
                "pass no `value` or `key`."
            )
        if cross and use_causal_mask:
            raise ValueError(
                "use_causal_mask=True with a cross-attention cache (cache_update_index=None): "
                "a cached step's query has no position among the cached keys, so no causal "
                "mask can be aligned. Pass the positions it may see as `attention_mask`, or "
                "use a self-attention cache (with cache_update_index)."
            )
        if not cross and value is None:
            raise ValueError(
                "`value` is required with a self-attention cache: it holds the new tokens."
            )

    def _check_ring(self, cache, cache_update_index, attention_mask, attention_bias):
        """`ValueError` where a `RingKVCache` cannot stand for every position's cache."""
        if cache_update_index is None:
            raise ValueError(
                "A RingKVCache is a self-attention cache: pass `cache_update_index` (the "
                "position of the first new token). Received: cache_update_index=None"
            )
        length, window = cache.length, self.sliding_window
        if window is None or (isinstance(length, int) and length < window):
            raise ValueError(
                "A RingKVCache keeps the last `length` positions only: it needs a "
                "`sliding_window` no longer than it (the keys a query may see). Received: "
                f"sliding_window={window}, cache length={length}"
            )
        if attention_mask is not None or attention_bias is not None:
            raise ValueError(
                "A RingKVCache moves its positions every step: it takes no `attention_mask` "
                "or `attention_bias` over its slots (the causal mask, the window and the "
                "position bias are applied at each slot's position). Received: "
                f"attention_mask={'a mask' if attention_mask is not None else None}, "
                f"attention_bias={'a bias' if attention_bias is not None else None}"
            )

    def _at_key_positions(self, projected, is_causal, bias):
        """The causal mask, window and position bias of keys at `projected.key_positions`.

        A ring cache's keys are not at positions `0 .. S - 1`, which the
        kernels assume: the position masks become an explicit mask and the
        position bias a float32 tensor, both evaluated at the keys' positions
        (the queries' are `query_start + i`).

        Returns:
            `(attention_mask (1, 1, Tq, S) or None, bias (h, Tq, S) or None)`.
        """
        query_positions = masks.key_positions(dim(projected.q, 2), projected.query_start)
        mask = masks.mask_at_positions(
            query_positions, projected.key_positions, is_causal, self.sliding_window
        )  # (Tq, S)
        if bias is not None:
            bias = attn_ops.AttentionBias(
                bias.full(query_positions, projected.key_positions, self.num_heads)
            )
        return (None if mask is None else mask[None, None]), bias

    def _project_inputs(
        self, query, value, key, query_mask, key_padding_mask, cache, cache_update_index
    ):
        """The rank-3 path's heads: `query (B, Tq, dq)` (or `(B, dq)`), padding masks `(B, T)`.

        Checks the inputs (`keras_attn.layer_io.prepare_query`), zeroes the
        padded steps, projects the heads and rotates the query and key heads
        (from `cache_update_index` when cached). A self-attention cache gets
        the new tokens' keys and values and is attended whole; a
        cross-attention cache (`cache_update_index=None`) holds the keys and
        values already.

        Returns:
            A `ProjectedHeads`.
        """
        cross = cache is not None and cache_update_index is None
        value_shape = (cache.key.shape[0], cache.length) if cross else value.shape
        unzeroed_query = query
        query, query_mask, _, _ = prepare_query(
            query, value, query_mask, key_padding_mask, None, key=key, value_shape=value_shape
        )
        start, in_range = None, None  # the causal mask's query start; a tensor index's check
        positions = None  # the keys' positions where they are not their indices (a ring's)
        if cross:
            k, v = cache.key, cache.value
            key_padding_mask = masks.merge_masks(cache.valid, key_padding_mask)
        else:
            # Padded steps zeroed before the projections: nothing they hold reaches
            # a gradient of the kernels (dW = x^T dy). Self-attention zeroes once.
            same = key is None or key is value
            if value is unzeroed_query and key_padding_mask is query_mask:
                value = query  # zeroed by `prepare_query`, under the same mask
            else:
                value = masks.zero_padded(value, key_padding_mask)
            key = value if same else masks.zero_padded(key, key_padding_mask)
            index = 0 if cache_update_index is None else cache_update_index
            k = self._heads(self._rotate(self._key_dense(key), index))  # (B, g, Tv, dk)
            v = self._heads(self._value_dense(value))  # (B, g, Tv, dv)
            if isinstance(cache, RingKVCache):  # a step: the ring at its slots' positions
                cache, seen, positions = ring_update(cache, cache_update_index, k, v,
                                                     key_padding_mask)  # fmt: skip
                k, v, key_padding_mask = seen  # (B, g, S [+ Tq], d), (B, S [+ Tq])
                # several tokens: consecutive keys ending at the last one (end-aligned)
                start = None if positions is None else cache_update_index
            elif cache is not None:  # write the new tokens, then attend over the whole cache
                cache, in_range = write(cache, cache_update_index, k, v, key_padding_mask)
                k, v, key_padding_mask = cache.key, cache.value, cache.valid  # (B, g, S, d), (B, S)
                start = cache_update_index
        if isinstance(k, Int8Heads):  # an int8 cache: read in the compute dtype
            k, v = dequantize(k, self.compute_dtype), dequantize(v, self.compute_dtype)
        rotation = 0 if cache_update_index is None else cache_update_index  # the first query's
        q = self._heads(self._rotate(self._query_dense(query), rotation))
        return ProjectedHeads(
            query, q, k, v, query_mask, key_padding_mask, start, cache, in_range, positions
        )

    def _attend(self, q, k, v, spec):
        """Attention of the query heads `q (B, h, Tq, dk)` over `k, v (B, g, S, d)` under `spec`.

        Runs `keras_attn.ops.attention`, or, where a subclass overrides it,
        Keras' hook `_compute_attention` (`_call_compute_attention`).

        Returns:
            `(heads (B, Tq, h, dv), weights (B, h, Tq, S) or None)`.
        """
        if self._overrides_compute_attention():
            return self._call_compute_attention(q, k, v, spec)
        heads, weights = attn_ops.attention(
            q,
            self._repeat_kv(k),  # (B, h, S, dk)
            self._repeat_kv(v),
            spec=spec,
            implementation=self.implementation,
            flash_attention=self._flash_attention,
        )  # (B, h, Tq, dv), (B, h, Tq, S) or None
        return transpose(heads, (0, 2, 1, 3)), weights  # (B, Tq, h, dv)

    def _project_output(self, projected, heads, weights, spec, attention_mask, own_keys=False):
        """The output projection of `heads (B, Tq, h, dv)`, with the rows that see no key zeroed.

        `attention_mask` is the explicit `(B|1, h|1, Tq|1, S)` mask or `None`;
        `own_keys`: a self-attention step whose new keys are real exactly where
        the queries are, so the rows that see a key are the real queries (each
        sees its own key), with no pass over the keys' mask.
        Returns `(output (B, Tq, *output_shape), weights)`.
        """
        if self.use_gate:
            heads = heads * ops.cast(self._gate_dense(projected.query), heads.dtype)
        output = self._output_dense(heads)  # (B, Tq, *output_shape)
        if spec.every_row_sees_a_key:
            rows = None
        elif own_keys:
            rows = ops.expand_dims(projected.query_mask, -1)  # (B, Tq, 1)
        else:
            rows = spec.visible_query_rows(
                dim(projected.q, 2), dim(projected.k, 2), projected.query_mask,
                projected.key_padding_mask,
                None if attention_mask is None else ops.any(attention_mask, axis=1),
            )  # fmt: skip
        # (B|1, Tq|1, 1): padded rows and rows that see nothing give zeros
        output, weights = zero_unseen_rows(output, weights, rows)
        if projected.in_range is not None:  # a tensor cache index past the end: NaN, never clamped
            output = ops.where(projected.in_range, output, ops.cast(float("nan"), output.dtype))
        return output, weights

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        use_causal_mask=False,
    ):
        """Keras' hook: attention over projected heads, through `keras_attn.ops.attention`.

        The method `keras.layers.MultiHeadAttention` subclasses (and keras-hub's
        `CachedMultiHeadAttention`) override; `call` runs an override in its
        place, handing it the projected heads and the combined boolean mask
        (padding, causal, window and explicit masks merged), as Keras does.

        Args:
            query: `(B, T, N, key_dim)`.
            key: `(B, S, N, key_dim)`.
            value: `(B, S, N, value_dim)`.
            attention_mask: boolean `(B, T, S)` or `(B, N, T, S)`, `True` = attend.
            training: whether dropout is active.
            return_attention_scores: whether to return the weights.
            use_causal_mask: also apply the (end-aligned) causal mask.

        Returns:
            `(output (B, T, N, value_dim), weights (B, N, T, S) or None)`.
        """
        mask = masks.as_bool_mask(attention_mask, "attention_mask")
        if mask is not None and len(mask.shape) == 3:
            mask = ops.expand_dims(mask, 1)  # (B, 1, T, S)
        spec = attn_ops.AttentionSpec(
            mask=mask,
            is_causal=bool(use_causal_mask),
            dropout_rate=self.dropout,
            seed=self.seed_generator,
            training=training,
            return_weights=bool(return_attention_scores),
        )
        heads, weights = attn_ops.attention(
            self._heads(query),
            self._heads(key),
            self._heads(value),
            spec=spec,
            implementation=self.implementation,
            flash_attention=self._flash_attention,
        )
        return transpose(heads, (0, 2, 1, 3)), weights

    def _overrides_compute_attention(self):
        return type(self)._compute_attention is not MultiHeadAttention._compute_attention

    def _call_compute_attention(self, q, k, v, spec):
        """An overriding `_compute_attention` on Keras' layout, with the combined mask.

        The call's `training` and whether to return the weights are the spec's.
        """
        if spec.bias is not None and (spec.bias.tensors or spec.bias.position_biases):
            raise ValueError(
                f"{type(self).__name__} overrides `_compute_attention`, whose Keras contract "
                "has no bias: `attention_bias` and `position_bias` cannot reach it."
            )
        length, total = dim(q, 2), dim(k, 2)
        mask = spec.whole_mask(length, total)  # (B|1, h|1, Tq, Tv) or (Tq, Tv) or None
        if mask is not None:
            batch = ops.shape(q)[0]
            mask = ops.broadcast_to(mask, (batch, mask.shape[-3] if len(mask.shape) == 4
                                           else 1, length, total))  # fmt: skip
            mask = mask[:, 0] if mask.shape[1] == 1 else mask  # (B, T, S) as Keras gives it
        to_keras = lambda x: transpose(x, (0, 2, 1, 3))  # noqa: E731  (B, T, N, d)
        self._return_attention_scores = bool(spec.return_weights)
        return self._invoke_compute_attention(
            to_keras(q),
            to_keras(self._repeat_kv(k)),
            to_keras(self._repeat_kv(v)),
            mask,
            spec.training,
            spec.return_weights,
        )

    def _invoke_compute_attention(self, query, key, value, mask, training, return_weights):
        """The override, called as `keras.layers.MultiHeadAttention.call` calls it."""
        return self._compute_attention(query, key, value, mask, training, return_weights)

    def compute_output_spec(
        self, query, value=None, key=None, query_mask=None, value_mask=None, key_mask=None,
        attention_mask=None, return_attention_scores=False, training=None, use_causal_mask=False,
        cache=None, **kwargs,
    ):  # fmt: skip
        cache = None if cache is None else as_kv_cache(cache)
        if cache is None:
            check_key_value_shapes(value.shape, None if key is None else key.shape)
        output_shape = tuple(query.shape)[:-1] + (self._output_shape or tuple(query.shape)[-1:])
        output = keras.KerasTensor(output_shape, dtype=self.compute_dtype)
        outputs = [self.with_output_mask(output, query_mask)]
        if return_attention_scores:
            if self._flash_attention:
                raise ValueError(_FLASH_SCORES)
            if cache is not None or len(query.shape) == 2:  # (B, h, [Tq,] Tv)
                length = value.shape[1] if cache is None else cache.length
                shape = (query.shape[0], self.num_heads, *query.shape[1:-1], length)
            else:
                layout = self._layout(query.shape, value.shape)
                shape = layout.scores_shape(query.shape, value.shape, self.num_heads)
            outputs.append(keras.KerasTensor(shape, dtype=self.compute_dtype))
        if cache is not None:
            outputs.append(map_cache(lambda c: keras.KerasTensor(c.shape, c.dtype), cache))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
