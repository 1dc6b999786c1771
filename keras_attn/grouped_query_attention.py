"""`GroupedQueryAttention` (`GroupQueryAttention`): Keras' GQA on our `MultiHeadAttention`."""

import keras

from keras_attn._typing import ConstraintLike, InitializerLike, RegularizerLike
from keras_attn.arguments import check_positive_int
from keras_attn.multi_head_attention import MultiHeadAttention
from keras_attn.multi_head_shapes import check_key_value_heads

# Keys of MultiHeadAttention's config that GroupedQueryAttention names otherwise or fixes.
_RENAMED = ("num_heads", "key_dim", "value_dim", "output_shape", "attention_axes")
# MultiHeadAttention's public names of its projections, which Keras' GQA does not have.
_PUBLIC_PROJECTIONS = ("query_dense", "key_dense", "value_dense", "output_dense")


@keras.saving.register_keras_serializable(package="keras_attn")
class GroupedQueryAttention(MultiHeadAttention):
    """Grouped-query attention, a drop-in for `keras.layers.GroupQueryAttention`.

    `head_i = softmax(Q W_q^i (K W_k^{g(i)})^T / sqrt(d) + bias_i) V W_v^{g(i)}`
    with `g(i) = floor(i / (h / g))`: `h = num_query_heads` query heads share
    `g = num_key_value_heads` key/value heads in groups of `h / g`; then
    `concat(head_1 * g_1, ..., head_h * g_h) W_o` (the gate `sigmoid(Q W_g)`
    when `use_gate=True`). `g = h` is multi-head attention, `g = 1`
    multi-query attention.

    `MultiHeadAttention(num_heads=h, key_dim=d, value_dim=d,
    num_key_value_heads=g)` under Keras' names: the same layer, the same
    weights (Keras' layout: weights copied from
    `keras.layers.GroupQueryAttention` with `set_weights` give the same
    outputs; its `.weights.h5` and `.keras` files load with `load_weights`,
    and ours into it: the class is named as Keras' class, and the weights lie
    under Keras' paths), the same call, cache and guarantees (see `MultiHeadAttention`,
    also for the documented difference from Keras: with `Tq != Tv` the causal
    mask is aligned to the end; float 0/1 masks are read as Keras reads them). The
    cache holds the `g` key/value heads, not `h` copies.

    Args:
        head_dim: width `d` of every query, key and value head.
        num_query_heads: number of query heads `h`.
        num_key_value_heads: number of key/value heads `g`, dividing `h`.
        dropout, use_bias, sliding_window, flash_attention,
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, activity_regularizer, kernel_constraint,
        bias_constraint, use_gate, seed: as `MultiHeadAttention`.
        rotary_embedding, implementation, position_bias: keyword only, as
            `MultiHeadAttention`.

    Call arguments:
        As `MultiHeadAttention`: `query (B, Tq, dq)`, `value (B, Tv, dv)`,
        `key=None`, `query_mask`, `value_mask`, `key_mask`, `attention_mask`,
        `return_attention_scores`, `training`, `use_causal_mask`, then
        `cache`, `cache_update_index`, `attention_bias`.

    Returns:
        `(B, Tq, dq)`, and with `return_attention_scores=True` the weights
        `(B, h, Tq, Tv)`; with a cache, the updated `KVCache` last.

    Raises:
        ValueError: `num_query_heads` not divisible by `num_key_value_heads`,
            non-positive sizes, and the errors of `MultiHeadAttention`;
            `compute_output_shape` with a query and a value of different
            widths (as Keras').
        TypeError: non-float inputs, non-numeric masks.

    Example:

    >>> x = keras.random.normal((2, 6, 16))
    >>> gqa = keras_attn.GroupedQueryAttention(head_dim=4, num_query_heads=4,
    ...                                        num_key_value_heads=2, sliding_window=3)
    >>> out, w = gqa(x, x, use_causal_mask=True, return_attention_scores=True)
    >>> print(out.shape, w.shape, gqa.key_dense.kernel.shape)
    (2, 6, 16) (2, 4, 6, 6) (16, 2, 4)

    Reference:
        Ainslie et al., 2023, "GQA: Training Generalized Multi-Query
        Transformer Models from Multi-Head Checkpoints",
        https://arxiv.org/abs/2305.13245
    """

    def __init__(
        self,
        head_dim: int,
        num_query_heads: int,
        num_key_value_heads: int,
        dropout: float = 0.0,
        use_bias: bool = True,
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
        **kwargs,
    ):
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.num_query_heads = check_positive_int("num_query_heads", num_query_heads)
        kv_heads = check_key_value_heads(
            num_key_value_heads, self.num_query_heads, "num_query_heads", allow_none=False
        )
        super().__init__(
            num_heads=self.num_query_heads,
            key_dim=self.head_dim,
            value_dim=self.head_dim,
            dropout=dropout,
            use_bias=use_bias,
            sliding_window=sliding_window,
            flash_attention=flash_attention,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer,
            bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer,
            kernel_constraint=kernel_constraint,
            bias_constraint=bias_constraint,
            use_gate=use_gate,
            seed=seed,
            num_key_value_heads=kv_heads,
            **kwargs,
        )

    def _compute_attention(
        self, query, key, value, attention_mask=None, training=None, use_causal_mask=False
    ):
        """Keras' GQA hook: attention over projected heads, through `keras_attn.ops.attention`.

        The method `keras.layers.GroupQueryAttention` subclasses override, with
        its signature: `call` runs an override in its place, handing it the
        projected query heads and the key and value heads repeated to
        `num_query_heads`, and the combined boolean mask (padding, causal,
        window and explicit masks merged), as Keras does. Whether to return
        the weights is the call's `return_attention_scores`, kept in
        `self._return_attention_scores` (as Keras keeps it).

        Args:
            query: `(B, T, h, head_dim)`.
            key, value: `(B, S, h, head_dim)`.
            attention_mask: boolean `(B, T, S)` or `(B, h, T, S)`, `True` = attend.
            training: whether dropout is active.
            use_causal_mask: also apply the (end-aligned) causal mask.

        Returns:
            `(output (B, T, h, head_dim), weights (B, h, T, S) or None)`.
        """
        return super()._compute_attention(
            query,
            key,
            value,
            attention_mask=attention_mask,
            training=training,
            return_attention_scores=self._return_attention_scores,
            use_causal_mask=use_causal_mask,
        )

    def _overrides_compute_attention(self):
        return type(self)._compute_attention is not GroupedQueryAttention._compute_attention

    def _invoke_compute_attention(self, query, key, value, mask, training, return_weights):
        """The override, called as `keras.layers.GroupQueryAttention.call` calls it."""
        return self._compute_attention(query, key, value, attention_mask=mask, training=training)

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        if query_shape[-1] != value_shape[-1]:
            raise ValueError(
                "The last dimension of `query_shape` and `value_shape` must be equal, but "
                f"are {query_shape[-1]}, {value_shape[-1]}. Received: "
                f"query_shape={tuple(query_shape)}, value_shape={tuple(value_shape)}"
            )
        return super().compute_output_shape(query_shape, value_shape, key_shape)

    # Keras' saving walks `dir(layer)`, public names first, and files a sublayer under the
    # first name that reaches it. Keras' GQA keeps its projections under `_query_dense`, ...
    # only: with the public aliases hidden from `dir()`, our files have Keras' paths. While
    # loading they are listed too (the walk tries every name until one loads), so a file
    # written under them (by earlier versions) still loads; saving hides them again.
    def __dir__(self):
        names = super().__dir__()
        if getattr(self, "_listing_public_projections", False):
            return names
        return [name for name in names if name not in _PUBLIC_PROJECTIONS]

    def save_own_variables(self, store):
        self._listing_public_projections = False
        super().save_own_variables(store)

    def load_own_variables(self, store):
        self._listing_public_projections = True
        super().load_own_variables(store)

    def get_config(self):
        config = super().get_config()
        for name in _RENAMED:
            config.pop(name)
        config.update(head_dim=self.head_dim, num_query_heads=self.num_query_heads)
        return config


# Keras' public name (`keras.layers.GroupQueryAttention`, a class named `GroupedQueryAttention`).
GroupQueryAttention = GroupedQueryAttention
