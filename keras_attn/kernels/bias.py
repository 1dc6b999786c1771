"""Additive attention biases: tensors, and functions of query and key positions.

A bias is added to the scaled scores before the masked softmax,
`softmax(q k^T * scale + bias)`, on every kernel. It is given as

- a float tensor broadcastable to the scores `(..., Tq, Tv)`, e.g.
  `(B|1, h|1, Tq, Tv)` for multi-head attention; or
- a position bias, a `keras_attn.PositionBias` layer (`AlibiBias`,
  `RelativePositionBias`): a function of the query and key positions that a
  kernel evaluates only where it needs it: whole for the dense and fused
  kernels, one key block at a time for the chunked kernel (never the
  `(Tq, Tv)` tensor), at the cache's positions for a cached decoding step; or
- a tuple of these, summed.

The query positions are those of the causal mask (`keras_attn.masks.causal_mask`):
`query_start + i`, `query_start` defaulting to `Tv - Tq` (end-aligned; a
cached step passes its cache index). Key positions are `0 .. Tv - 1`.

A bias is not a mask: a masked position gets zero weight whatever its bias
holds (it is replaced with the mask, as the scores are), but a large negative
bias at a visible position only lowers its weight.
"""

import keras
from keras import ops


class Bias:
    """A normalized bias: float32 tensors and position biases, summed.

    Built by `as_bias`; the kernels read it with `full`, `block` (chunked)
    and, for the chunked kernel's custom gradient, `inputs` / `gradients`.
    """

    def __init__(self, tensors, functions):
        self.tensors = list(tensors)
        self.functions = list(functions)
        # The position biases' parameters (e.g. a learned table), as tensors the
        # chunked kernel passes into its custom gradient.
        self.parameters = [tuple(f.bias_parameters()) for f in self.functions]

    def inputs(self):
        """The tensors a custom gradient takes (and returns gradients for)."""
        return self.tensors + [p for params in self.parameters for p in params]

    def with_inputs(self, inputs):
        """A copy whose tensors and parameters are `inputs` (same order as `inputs()`)."""
        inputs = list(inputs)
        bias = Bias.__new__(Bias)
        bias.tensors = inputs[: len(self.tensors)]
        bias.functions = self.functions
        bias.parameters, rest = [], inputs[len(self.tensors) :]
        for params in self.parameters:
            bias.parameters.append(tuple(rest[: len(params)]))
            rest = rest[len(params) :]
        return bias

    def full(self, query_positions, key_positions, num_heads):
        """The float32 sum of every term over the whole `(Tq, Tv)` grid."""
        return self._total(self.tensors, query_positions, key_positions, num_heads)

    def block(self, query_positions, key_positions, first, size, num_heads, slicer):
        """The float32 bias of key block `[first, first + size)`: tensors sliced, functions run."""
        tensors = [t if t.shape[-1] == 1 else slicer(t, -1, first, size) for t in self.tensors]
        return self._total(tensors, query_positions, key_positions, num_heads)

    def _total(self, tensors, query_positions, key_positions, num_heads):
        terms = list(tensors) + [
            f.position_bias(query_positions, key_positions, params, num_heads=num_heads)
            for f, params in zip(self.functions, self.parameters, strict=True)
        ]
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total

    def block_gradients(self, d_scores, query_positions, key_positions):
        """The position biases' parameter gradients from one block's `dS` `(..., Tq, Bk)`."""
        d = sum_to_rank(d_scores, 3)  # (h|1, Tq, Bk): the batch axes summed
        grads = []
        for f, params in zip(self.functions, self.parameters, strict=True):
            if params:
                grads.append(
                    tuple(f.position_bias_gradient(d, query_positions, key_positions, params))
                )
            else:
                grads.append(())
        return grads


def sum_to_rank(x, rank):
    """Sums the leading axes of `x` until it has `rank` axes."""
    extra = len(x.shape) - rank
    return ops.sum(x, axis=tuple(range(extra))) if extra > 0 else x


def sum_to_shape(x, shape):
    """The gradient of a broadcast: `x` summed down to `shape` (leading and size-1 axes)."""
    x = sum_to_rank(x, len(shape))
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and x.shape[i] != 1)
    return ops.sum(x, axis=axes, keepdims=True) if axes else x


def _is_position_bias(b):
    return isinstance(b, keras.layers.Layer) and hasattr(b, "position_bias")


def as_bias(bias, scores_shape, name="bias"):
    """`bias` (None, tensor, position bias or a tuple of them) as a `Bias`, or `None`.

    Tensors are cast to float32 and checked against `scores_shape`
    (`(..., Tq, Tv)`, static where known).

    Raises:
        TypeError: a term that is neither a float tensor nor a position bias
            (a boolean or integer tensor is a mask: pass it as the mask).
        ValueError: a tensor whose static shape does not broadcast to the scores.
    """
    if bias is None:
        return None
    terms = bias if isinstance(bias, (tuple, list)) else (bias,)
    tensors, functions = [], []
    for term in terms:
        if term is None:
            continue
        if _is_position_bias(term):
            functions.append(term)
            continue
        dtype = getattr(term, "dtype", None)
        if dtype is None or not keras.backend.is_float_dtype(
            keras.backend.standardize_dtype(dtype)
        ):
            what = type(term).__name__ if dtype is None else keras.backend.standardize_dtype(dtype)
            raise TypeError(
                f"`{name}` must be a float tensor broadcastable to the scores "
                f"{tuple(scores_shape)}, a keras_attn.PositionBias layer, or a tuple of these "
                f"(a boolean mask goes in the mask argument). Received: {what}"
            )
        term = ops.cast(term, "float32")
        _check_broadcast(name, term.shape, scores_shape)
        tensors.append(term)
    if not tensors and not functions:
        return None
    return Bias(tensors, functions)


def _check_broadcast(name, shape, scores_shape):
    if len(shape) > len(scores_shape):
        raise ValueError(
            f"`{name}` must broadcast to the scores {tuple(scores_shape)}. "
            f"Received: {name}.shape={tuple(shape)}"
        )
    for b, s in zip(reversed(shape), reversed(scores_shape), strict=False):
        if isinstance(b, int) and isinstance(s, int) and b not in (1, s):
            raise ValueError(
                f"`{name}` must broadcast to the scores {tuple(scores_shape)}. "
                f"Received: {name}.shape={tuple(shape)}"
            )


def num_heads_of(query):
    """The heads axis of `(B, h, Tq, d)` queries; 1 for rank-3 (single-head) queries."""
    return query.shape[-3] if len(query.shape) >= 4 else 1


def query_positions(query_length, value_length, query_start=None):
    """`query_start + [0 .. Tq - 1]` as int32, `query_start` defaulting to `Tv - Tq`."""
    start = value_length - query_length if query_start is None else query_start
    return ops.arange(query_length, dtype="int32") + ops.cast(start, "int32")


def key_positions(length, start=0):
    """`start + [0 .. length - 1]` as int32."""
    return ops.arange(length, dtype="int32") + ops.cast(start, "int32")
