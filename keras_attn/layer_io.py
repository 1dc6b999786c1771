"""What every attention layer does around `keras_attn.ops.attention`: inputs in, outputs out.

- `QueryMaskOutput`: the output mask is the query mask, carried by the
  output itself (`with_output_mask`, `compute_mask`); `AttentionLayer` adds
  that `attention_bias` reaches `call` as one `keras_attn.AttentionBias` that
  Keras neither casts (a float32 bias keeps its range under `mixed_float16`)
  nor refuses (a tuple mixing tensors and position biases);
- `check_input_shapes`, `prepare_query`, `check_masks`: the checks `build`
  and `call` start with, and the rank-2 query;
- `zero_unseen_rows`: the rows that see no key, or are padded, set to zero
  after the output projection (and their weights).
"""

import keras
from keras import ops as kops

# Keras has no public name for it; `keras.layers.MultiHeadAttention` sets its output mask so.
from keras.src.backend.common.masking import set_keras_mask

from keras_attn import masks
from keras_attn._execution import adapts_arguments_only
from keras_attn.arguments import check_dim, check_floating, check_rank
from keras_attn.masks import check_mask_dtype
from keras_attn.ops import AttentionBias


class QueryMaskOutput:
    """Mixin: the output mask of a layer is its query mask, implicit or explicit.

    Keras' `Layer.__call__` hands `compute_mask` the first input and its
    implicit mask only (`compute_mask(query, previous_mask)`): a mask passed
    as an argument (`query_mask=`, a block's `padding_mask=`) would be lost,
    and a downstream layer (`AttentionPooling`, a loss) would weigh padded
    rows. So the output carries the mask, as `keras.layers.MultiHeadAttention`
    does it: `call` attaches the mask it used to its output, and
    `compute_output_spec` the symbolic mask to the symbolic output (a
    functional model replays the masks its graph recorded); Keras keeps a mask
    an output already carries. Nothing of a call is kept on the layer: calls
    from several threads never exchange their masks.
    """

    # The call argument that holds the explicit output mask.
    output_mask_argument = "query_mask"

    def compute_mask(self, inputs, previous_mask=None, **call_arguments):
        """The output mask of a call: its explicit mask, else `previous_mask`.

        Keras calls `compute_mask(inputs, previous_mask)` with the implicit
        mask of the first input; the call's other arguments may follow by
        name, and the one named `output_mask_argument` (`query_mask`,
        `padding_mask`, ...), when given, is the output mask (as bool).
        """
        mask = call_arguments.get(self.output_mask_argument)
        if mask is None:
            return previous_mask
        return masks.as_bool_mask(mask, self.output_mask_argument)

    def with_output_mask(self, output, mask):
        """`output` carrying `mask` (as bool) as its Keras mask; with `mask=None`, as it is.

        Returns `output`: the mask is an attribute of that tensor (symbolic
        or not), never of the layer.
        """
        if mask is not None:
            set_keras_mask(output, masks.as_bool_mask(mask, self.output_mask_argument))
        return output


class AttentionLayer(QueryMaskOutput):
    """Mixin of the attention layers: the output mask, and `attention_bias` as Keras won't cast it.

    Keras casts every float tensor argument of a call to the compute dtype
    (a `-1e9` or `7e4` bias overflows float16), and refuses a tuple that
    mixes tensors and layers: an `attention_bias` (a tensor, a position bias,
    or a tuple of them) is wrapped in one `keras_attn.AttentionBias`, its
    tensors cast to float32, before Keras sees it. (In a functional model,
    built on symbolic tensors, it is left as it is: Keras must see its
    tensors to track them.)
    """

    @adapts_arguments_only  # `plain_calls` may call `call`: it takes a bias as it is
    def __call__(self, *args, **kwargs):
        bias = kwargs.get("attention_bias")
        if bias is not None and not isinstance(bias, AttentionBias):
            terms = bias if isinstance(bias, (tuple, list)) else (bias,)
            if not any(keras.backend.is_keras_tensor(t) for t in terms):
                kwargs["attention_bias"] = AttentionBias(*terms)
        return super().__call__(*args, **kwargs)


def check_input_shapes(query_shape, value_shape, key_shape=None):
    """Checks the shapes `build` receives; returns `(query_shape, key_shape)`.

    A rank-2 query shape `(B, dq)` comes back as `(B, 1, dq)`, and a missing
    key shape as the value shape.
    """
    key_shape = value_shape if key_shape is None else key_shape
    check_rank("query", query_shape, (2, 3))
    check_rank("value", value_shape, (3,))
    check_rank("key", key_shape, (3,))
    check_dim("key", key_shape[1], "value", value_shape[1], "length (axis 1)")
    check_dim("query", query_shape[0], "value", value_shape[0], "batch size")
    if len(query_shape) == 2:
        query_shape = (query_shape[0], 1, query_shape[1])
    return tuple(query_shape), tuple(key_shape)


def prepare_query(
    query, value, query_mask, key_padding_mask, attention_mask, key=None, value_shape=None
):
    """The checks every attention layer's `call` starts with, and the rank-2 query.

    The inputs must be floating point. Padded query rows are zeroed
    (`keras_attn.masks.zero_padded`). A rank-2 query `(B, dq)` becomes
    `(B, 1, dq)`, its masks following (`query_mask (B,)` -> `(B, 1)`,
    `attention_mask (B, Tv)` -> `(B, 1, Tv)`), and the explicit masks are
    checked (`check_masks`) against the query and `value_shape` (default
    `value.shape`; a cached cross-attention call passes the cache's).
    `key_padding_mask` `(B, Tv)` is the layer's `value_mask` (merged with
    `key_mask` where the layer has one); errors name it `value_mask`.

    Returns:
        `(query, query_mask, attention_mask, single_query)`: the rank-3 query,
        its masks, and whether the query was rank 2.
    """
    for name, x in (("query", query), ("value", value), ("key", key)):
        if x is not None:
            check_floating(name, x)
    query_mask = masks.as_bool_mask(query_mask, "query_mask")
    key_padding_mask = masks.as_bool_mask(key_padding_mask, "value_mask")
    attention_mask = masks.as_bool_mask(attention_mask, "attention_mask")
    single_query = len(query.shape) == 2
    if single_query:
        query = kops.expand_dims(query, 1)  # (B, 1, dq)
        if query_mask is not None:
            if len(query_mask.shape) != 1:
                raise ValueError(
                    "With a rank-2 query (one query per example) `query_mask` must have "
                    f"shape (batch,). Received: query_mask.shape={tuple(query_mask.shape)}"
                )
            query_mask = kops.expand_dims(query_mask, 1)  # (B, 1)
        if attention_mask is not None:
            check_rank("attention_mask", attention_mask.shape, (2,))
            attention_mask = kops.expand_dims(attention_mask, 1)  # (B, 1, Tv)
    value_shape = value.shape if value_shape is None else value_shape
    check_masks(query.shape, value_shape, query_mask, key_padding_mask, attention_mask)
    query = masks.zero_padded(query, query_mask)  # padded rows: no NaN in any gradient
    return query, query_mask, attention_mask, single_query


def zero_unseen_rows(output, weights, rows):
    """`output (B, Tq, ...)` and `weights (B, [h,] Tq, Tv)` zero on the rows where `rows` is False.

    `rows` is `keras_attn.masks.visible_query_rows` (`(B|1, Tq|1, 1)` or
    `None`): padded query rows and rows that see no key, zeroed after the
    output projection and its bias; `weights` may be `None`.
    """
    if rows is None:
        return output, weights
    wide = rows
    for _ in range(len(output.shape) - 3):  # one axis per output axis: (B, Tq, o_1, o_2)
        wide = kops.expand_dims(wide, -1)
    output = kops.where(wide, output, kops.zeros_like(output))
    if weights is not None:
        heads = kops.expand_dims(rows, 1) if len(weights.shape) == 4 else rows
        weights = kops.where(heads, weights, kops.zeros_like(weights))
    return output, weights


def check_masks(query_shape, value_shape, query_mask, key_padding_mask, attention_mask):
    """Static checks of explicit masks against `query (B, Tq, .)` and `value (B, Tv, ...)` shapes.

    Masks must be boolean (or integer or float), with the rank, lengths and batch size
    of their inputs (`attention_mask` may have batch size 1). The key padding mask is
    named by the call argument it comes from, `value_mask`.
    """
    if query_mask is not None:
        check_mask_dtype("query_mask", query_mask)
        check_rank("query_mask", query_mask.shape, (2,))
        check_dim("query_mask", query_mask.shape[1], "query", query_shape[1], "length")
        check_dim("query_mask", query_mask.shape[0], "query", query_shape[0], "batch size")
    if key_padding_mask is not None:
        check_mask_dtype("value_mask", key_padding_mask)
        check_rank("value_mask", key_padding_mask.shape, (2,))
        check_dim("value_mask", key_padding_mask.shape[1], "value", value_shape[1], "length")
        check_dim("value_mask", key_padding_mask.shape[0], "value", value_shape[0], "batch size")
    if attention_mask is not None:
        check_mask_dtype("attention_mask", attention_mask)
        check_rank("attention_mask", attention_mask.shape, (3,))
        if attention_mask.shape[0] != 1:
            check_dim(
                "attention_mask",
                attention_mask.shape[0],
                "query",
                query_shape[0],
                "batch size (or 1)",
            )
        check_dim(
            "attention_mask",
            attention_mask.shape[1],
            "query",
            query_shape[1],
            "query length (axis 1)",
        )
        check_dim(
            "attention_mask",
            attention_mask.shape[2],
            "value",
            value_shape[1],
            "value length (axis 2 of the mask, axis 1 of value)",
        )
