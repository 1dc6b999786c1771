"""The constructor, projections and config of `MultiHeadAttention`: Keras' arguments and weights.

`MultiHeadProjections` checks and keeps Keras' constructor arguments (and
ours), builds the projections in Keras' order and layout (so that
`set_weights` with Keras' weights gives Keras' outputs), and serializes them.
`keras_attn.MultiHeadAttention` adds the attention itself; see its docstring
for every argument.
"""

import keras

from keras_attn import masks
from keras_attn import ops as attn_ops
from keras_attn._typing import ConstraintLike, InitializerLike, RegularizerLike
from keras_attn.arguments import (
    check_dim,
    check_rank,
    check_rate,
    clone_initializer,
    deserialize_optional_layer,
    serialize_optional_layer,
)
from keras_attn.base import QueryMaskOutput
from keras_attn.matmul_einsum_dense import MatmulEinsumDense
from keras_attn.multi_head_shapes import (
    AttentionLayout,
    check_attention_axes,
    check_key_value_shapes,
    check_output_shape,
    check_size,
)


class MultiHeadProjections(QueryMaskOutput, keras.layers.Layer):
    """The arguments, projection sublayers and config of `keras_attn.MultiHeadAttention`.

    Not a layer to use on its own: its subclass `MultiHeadAttention` (and
    `GroupedQueryAttention`) attends. Sublayers: `_query_dense`,
    `_key_dense`, `_gate_dense` (with `use_gate`), `_value_dense`,
    `_output_dense`, created in that order (Keras' weight order), with
    Keras' read-only `query_dense`, `key_dense`, `value_dense`,
    `output_dense`.
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
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_size("num_heads", num_heads)
        self.key_dim = check_size("key_dim", key_dim)
        self.value_dim = check_size("value_dim", value_dim, allow_none=True) or self.key_dim
        self.dropout = check_rate("dropout", dropout)
        self.use_bias = bool(use_bias)
        # Stored private, as Keras does: a public `output_shape` would clash in model summaries.
        self._output_shape = check_output_shape(output_shape)
        self.attention_axes = check_attention_axes(attention_axes)
        self.sliding_window = masks.check_window(sliding_window, "sliding_window")
        self.flash_attention = flash_attention
        # None (auto), True (the backend's kernel) or False (never it); Keras' global switch
        # stands in for None, read here as Keras' layer does.
        enabled = keras.config.is_flash_attention_enabled()
        self._flash = enabled if flash_attention is None else bool(flash_attention)
        self._flash_attention = bool(self._flash)
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
        self.num_key_value_heads = check_size(
            "num_key_value_heads", num_key_value_heads, allow_none=True
        )
        if self.num_heads % (self.num_key_value_heads or self.num_heads):
            raise ValueError(
                "`num_key_value_heads` must divide `num_heads`. Received: "
                f"num_key_value_heads={num_key_value_heads}, num_heads={num_heads}"
            )
        self.rotary_embedding = self._check_sublayer(
            "rotary_embedding", rotary_embedding, "keras_attn.RotaryEmbedding()"
        )
        if rotary_embedding is not None and self.key_dim % 2:
            raise ValueError(
                "`key_dim` must be even to rotate pairs of features with "
                f"`rotary_embedding`. Received: key_dim={key_dim}"
            )
        axes = (
            getattr(rotary_embedding, "sequence_axis", 1),
            getattr(rotary_embedding, "feature_axis", -1),
        )
        if rotary_embedding is not None and (axes[0] not in (1, -3) or axes[1] not in (-1, 3)):
            raise ValueError(
                "`rotary_embedding` rotates the heads (B, T, h, d): its `sequence_axis` must be "
                "1 and its `feature_axis` -1. Received: "
                f"sequence_axis={axes[0]}, feature_axis={axes[1]}"
            )
        self.position_bias = self._check_sublayer(
            "position_bias", position_bias, "keras_attn.AlibiBias()", "position_bias"
        )
        bias_heads = getattr(position_bias, "num_heads", None)  # a learned bias has its heads
        if bias_heads is not None and bias_heads != self.num_heads:
            raise ValueError(
                "`position_bias` must have one bias per query head. Received: "
                f"position_bias.num_heads={bias_heads}, num_heads={self.num_heads}"
            )
        # Checks the name, that "fused", "chunked" and "backend" come without dropout, and that
        # `flash_attention` agrees with `implementation`.
        attn_ops.choose_implementation(
            implementation, (None, None), self.dropout, True, False, flash_attention=self._flash
        )
        self.implementation = implementation
        # A seed generator only where there is dropout to draw (as Keras' Dropout).
        self.seed_generator = keras.random.SeedGenerator(seed) if self.dropout else None
        self.supports_masking = True

    @property
    def _sliding_window(self):
        """Keras' private name of `sliding_window` (read by code written for Keras' layer)."""
        return self.sliding_window

    @staticmethod
    def _check_sublayer(name, layer, example, method=None):
        if layer is not None and (
            not isinstance(layer, keras.layers.Layer) or (method and not hasattr(layer, method))
        ):
            raise TypeError(
                f"`{name}` must be None or a layer such as {example}. Received: {name}={layer!r}"
            )
        return layer

    # Keras' read-only names of the projections (e.g. `layer.query_dense.enable_lora(2)`).
    query_dense = property(lambda self: self._query_dense)
    key_dense = property(lambda self: self._key_dense)
    value_dense = property(lambda self: self._value_dense)
    output_dense = property(lambda self: self._output_dense)

    def _einsum_dense(self, equation, output_shape, bias_axes, name, activation=None):
        layer = MatmulEinsumDense(
            equation,
            contract_axes=2 if name == "attention_output" else 1,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
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
        return AttentionLayout(rank, None if len(query_shape) == 2 else self.attention_axes)

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
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = deserialize_optional_layer(config, "rotary_embedding")
        return cls(**deserialize_optional_layer(config, "position_bias"))
