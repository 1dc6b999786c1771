"""Shape helpers the kernels share: the transposed key, the default scale, the static checks."""

import math

from keras import ops

from keras_attn._execution import transpose
from keras_attn.arguments import dim


def swap_last(x):
    """`(..., a, b) -> (..., b, a)`."""
    rank = len(x.shape)
    return transpose(x, (*range(rank - 2), rank - 1, rank - 2))


def default_scale(query, scale=None):
    """`scale`, or `1 / sqrt(dk)` from the static width of `query`."""
    if scale is not None:
        return scale
    if query.shape[-1] is None:
        raise ValueError(
            "The last axis of `query` must be known to compute the default scale. "
            f"Received: query.shape={tuple(query.shape)}"
        )
    return 1.0 / math.sqrt(query.shape[-1])


def check_qkv(query, key, value, same_widths=True):
    """`ValueError` unless `query (..., Tq, dk)`, `key (..., Tv, dk)`, `value (..., Tv, dv)` fit.

    Ranks >= 2 and equal; the same leading axes (where known); the lengths of
    key and value equal and, with `same_widths` (a dot product), the widths of
    query and key (where known).
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        if len(x.shape) < 2:
            raise ValueError(
                f"`{name}` must have rank >= 2, `(..., length, width)`. "
                f"Received: {name}.shape={tuple(x.shape)}"
            )
    if not len(query.shape) == len(key.shape) == len(value.shape):
        raise ValueError(
            "`query`, `key` and `value` must have the same rank. Received: "
            f"query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}, "
            f"value.shape={tuple(value.shape)}"
        )

    def differ(a, b):
        return any(
            isinstance(m, int) and isinstance(n, int) and m != n for m, n in zip(a, b, strict=True)
        )

    for name, x in (("key", key), ("value", value)):
        if differ(query.shape[:-2], x.shape[:-2]):
            raise ValueError(
                f"`query` and `{name}` must have the same leading axes. Received: "
                f"query.shape={tuple(query.shape)}, {name}.shape={tuple(x.shape)}"
            )
    if differ(key.shape[-2:-1], value.shape[-2:-1]):
        raise ValueError(
            "`key` and `value` must have the same length (axis -2). Received: "
            f"key.shape={tuple(key.shape)}, value.shape={tuple(value.shape)}"
        )
    if same_widths and differ(query.shape[-1:], key.shape[-1:]):
        raise ValueError(
            "The last axis of `query` and `key` must match. Received: "
            f"query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
        )


def lengths(query, key):
    """`(Tq, Tv)`: the lengths (axis -2) of `query` and `key`, static where known."""
    return dim(query, -2), dim(key, -2)


def dims(x):
    """Static dimensions where known, scalar tensors elsewhere (no shape op when all are known)."""
    if None not in x.shape:
        return list(x.shape)
    return [s if s is not None else d for s, d in zip(x.shape, ops.shape(x), strict=True)]
