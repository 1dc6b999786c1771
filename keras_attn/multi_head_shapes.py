"""The shapes of multi-head attention: head and axis checks, attention axes, Keras' mask broadcast.

`keras.layers.MultiHeadAttention` takes inputs of any rank `(B, a_1, ..., a_n, d)`
and attends over some of their axes (`attention_axes`); the other axes are
batch axes. keras-attn runs every call on one rank-3 path: `AttentionLayout`
moves the batch axes to the front and flattens them into one, and the
attention axes into one sequence axis (row-major), then restores the caller's
shapes. A softmax over several axes at once is a softmax over their flattened
positions, so the weights are the same.
"""

import functools
import math

from keras import ops

from keras_attn.arguments import check_positive_int, is_int
from keras_attn.masks import check_mask_broadcast


def check_key_value_heads(num_key_value_heads, num_heads, heads_name="num_heads", allow_none=True):
    """`num_key_value_heads` as a Python int (`None` if `allow_none`: one per query head).

    `ValueError` unless it is a positive integer that divides `num_heads` (the
    query heads, named `heads_name` in the message: `num_query_heads` in Keras'
    GQA): the query heads share the key/value heads in groups of equal size.
    """
    kv_heads = check_positive_int("num_key_value_heads", num_key_value_heads, allow_none)
    if num_heads % (kv_heads or num_heads):
        raise ValueError(
            f"`{heads_name}` must be divisible by `num_key_value_heads`: the query heads share "
            "the key/value heads in groups of equal size, so `num_key_value_heads` must divide "
            f"`{heads_name}`. Received: num_key_value_heads={num_key_value_heads}, "
            f"{heads_name}={num_heads}"
        )
    return kv_heads


def check_output_shape(output_shape):
    """`output_shape` (None, an int, or a tuple or list of ints) as a tuple of ints or None."""
    if output_shape is None:
        return None
    shape = (output_shape,) if is_int(output_shape) else output_shape
    if (
        not isinstance(shape, (tuple, list))
        or not shape
        or not all(is_int(d) and d > 0 for d in shape)
    ):
        raise ValueError(
            f"Invalid `output_shape`: {output_shape!r}. When specified, `output_shape` must "
            "be a positive int or a tuple (or list) of positive ints: the output's axes "
            "after the batch and attention axes."
        )
    return tuple(int(d) for d in shape)


def check_attention_axes(attention_axes):
    """`attention_axes` (None, an int, or a tuple or list of ints) as a tuple or None."""
    if attention_axes is None:
        return None
    axes = (attention_axes,) if is_int(attention_axes) else attention_axes
    if not isinstance(axes, (tuple, list)) or not axes or not all(is_int(a) for a in axes):
        raise ValueError(
            "`attention_axes` must be None, an int, or a tuple (or list) of ints. "
            f"Received: attention_axes={attention_axes!r}"
        )
    return tuple(int(a) for a in axes)


def check_key_value_shapes(value_shape, key_shape):
    """`ValueError` unless `value` and `key` agree on every axis but the last (as Keras checks)."""
    if key_shape is not None and tuple(value_shape)[1:-1] != tuple(key_shape)[1:-1]:
        raise ValueError(
            "All dimensions of `value` and `key`, except the last one, must be equal. "
            f"Received: value_shape={tuple(value_shape)} and key_shape={tuple(key_shape)}"
        )


def _product(dims):
    """The product of dimensions that are ints or scalar tensors (1 for none)."""
    if all(is_int(d) for d in dims):
        return math.prod(dims)
    total = 1
    for d in dims:
        total = total * d
    return total


@functools.lru_cache(maxsize=64)
def attention_layout(rank, attention_axes=None):
    """The `AttentionLayout` of `rank` and `attention_axes` (a tuple or `None`), made once.

    A layout holds nothing but its axes; an eager call would otherwise build one each time.
    """
    return AttentionLayout(rank, attention_axes)


class AttentionLayout:
    """How inputs of rank `rank` attending over `attention_axes` map to the rank-3 path.

    Args:
        rank: the rank of `value` (and of `query`), `>= 3`.
        attention_axes: `None` (every axis but the first and the last), or
            a tuple of axes, negative ones counted from the end.

    The rank-3 layout with `attention_axes` `None`, `(1,)` or `(-2,)` is the
    identity: every method returns its input.
    """

    def __init__(self, rank, attention_axes=None):
        if attention_axes is None:
            attention_axes = tuple(range(1, rank - 1))
        axes = tuple(a + rank if a < 0 else a for a in attention_axes)
        if len(set(axes)) != len(axes) or not all(0 < a < rank - 1 for a in axes):
            raise ValueError(
                "`attention_axes` must name distinct axes of the inputs other than the "
                f"batch axis (0) and the feature axis (-1). Received: "
                f"attention_axes={attention_axes} for inputs of rank {rank}"
            )
        self.rank = rank
        self.attention_axes = axes
        self.batch_axes = tuple(a for a in range(rank - 1) if a not in axes)
        self.identity = self.batch_axes == (0,) and axes == (1,)
        self._order = self.batch_axes + axes  # the input's axes, feature axis left out

    def scores_shape(self, query_shape, value_shape, num_heads):
        """The static shape of the weights: `(batch axes..., h, query axes..., key axes...)`."""
        batch = tuple(query_shape[a] for a in self.batch_axes)
        query = tuple(query_shape[a] for a in self.attention_axes)
        return batch + (num_heads,) + query + tuple(value_shape[a] for a in self.attention_axes)

    def flatten(self, x):
        """`(B, a_1, ..., a_n, d)` -> `(B', T, d)`: batch axes flattened, then attention axes."""
        if self.identity or x is None:
            return x
        x = ops.transpose(x, self._order + (self.rank - 1,))
        shape, nb = ops.shape(x), len(self.batch_axes)
        return ops.reshape(x, (_product(shape[:nb]), _product(shape[nb:-1]), shape[-1]))

    def flatten_mask(self, mask, name, like):
        """A padding mask `(B, a_1, ..., a_n)` (`like`'s shape but the last axis) -> `(B', T)`."""
        if self.identity or mask is None:
            return mask
        if len(mask.shape) != self.rank - 1:
            raise ValueError(
                f"`{name}` must have the shape of its input without the last axis, "
                f"{tuple(like.shape[:-1])}. Received: {name}.shape={tuple(mask.shape)}"
            )
        mask = ops.transpose(mask, self._order)
        shape, nb = ops.shape(mask), len(self.batch_axes)
        return ops.reshape(mask, (_product(shape[:nb]), _product(shape[nb:])))

    def expand_mask(self, mask, scores_shape):
        """An explicit mask broadcast as Keras does, to the rank of the weights `scores_shape`.

        A mask of lower rank gets axes of size 1 inserted before its last
        `2 n` axes (`n` attention axes): at rank 3, `(Tq, Tv)`, `(B, 1, Tv)`
        and `(B, Tq, Tv)` broadcast over the heads, `(B, h, Tq, Tv)` is per
        head. `ValueError` unless it then broadcasts to `scores_shape`.
        """
        n = len(self.attention_axes)
        while len(mask.shape) < len(scores_shape):
            mask = ops.expand_dims(mask, -2 * n - 1)
        check_mask_broadcast(mask, scores_shape, "attention weights", "attention_mask")
        return mask

    def flatten_attention_mask(self, mask, query, value):
        """An `expand_mask`-ed mask -> `(B'|1, h|1, T_q, T_v)`, over the flattened positions."""
        if self.identity:
            return mask
        nb = len(self.batch_axes)
        q_shape, v_shape, m_shape = ops.shape(query), ops.shape(value), ops.shape(mask)
        batch = [q_shape[a] for a in self.batch_axes]
        if all(d == 1 for d in mask.shape[:nb]):
            batch = [1] * nb
        query_axes = [q_shape[a] for a in self.attention_axes]
        key_axes = [v_shape[a] for a in self.attention_axes]
        mask = ops.broadcast_to(mask, (*batch, m_shape[nb], *query_axes, *key_axes))
        return ops.reshape(
            mask, (_product(batch), m_shape[nb], _product(query_axes), _product(key_axes))
        )

    def unflatten_output(self, y, query):
        """`(B', T_q, o...)` -> `(B, a_1, ..., a_n, o...)`, the query's axes in its own order."""
        if self.identity:
            return y
        q_shape, y_shape = ops.shape(query), ops.shape(y)
        y = ops.reshape(y, [q_shape[a] for a in self._order] + list(y_shape[2:]))
        back = [self._order.index(a) for a in range(self.rank - 1)]
        return ops.transpose(y, back + list(range(self.rank - 1, len(y.shape))))

    def unflatten_scores(self, weights, query, value):
        """`(B', h, T_q, T_v)` -> `(batch axes..., h, query axes..., key axes...)`."""
        if self.identity:
            return weights
        q_shape, v_shape = ops.shape(query), ops.shape(value)
        return ops.reshape(
            weights,
            [q_shape[a] for a in self.batch_axes]
            + [ops.shape(weights)[1]]
            + [q_shape[a] for a in self.attention_axes]
            + [v_shape[a] for a in self.attention_axes],
        )
