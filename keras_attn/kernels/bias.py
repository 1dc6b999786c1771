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
- a tuple of these, or an `AttentionBias` (the container a layer's
  `attention_bias` becomes), summed.

The query positions are those of the causal mask (`keras_attn.masks.causal_mask`):
`query_start + i`, `query_start` defaulting to `Tv - Tq` (end-aligned; a
cached step passes its cache index). Key positions are `0 .. Tv - 1`.

A bias is not a mask: a masked position gets zero weight whatever its bias
holds (it is replaced with the mask, as the scores are), but a large negative
bias at a visible position only lowers its weight. Every kernel takes the bias
raised to `keras_attn.masks.LOWEST`, the float32 next to the masked scores'
fill: float32's lowest or -inf (an additive mask) at a visible key stays above
the fill, so a row whose every visible key has such a bias gets its softmax
(uniform over them), as any other row, and its masked keys zero weight.
"""

import keras
from keras import ops

from keras_attn import masks


class AttentionBias:
    """An attention bias: float32 tensors and position biases, summed.

    `AttentionBias(*terms)` takes tensors (broadcastable to the scores) and
    `keras_attn.PositionBias` layers, in any mix. It is the one form a bias
    takes from a layer's `attention_bias` argument down to the kernels, and a
    container Keras does not look into: a layer called with
    `attention_bias=AttentionBias(tensor, AlibiBias())` neither refuses the
    mix of tensors and layers nor casts the tensors to a float16 compute
    dtype (a `-1e9` or `7e4` entry keeps its value). A layer's
    `attention_bias` also takes a tensor, a position bias or a tuple of them:
    the layer wraps them in one. The tensors are cast to float32 here.

    Args:
        *terms: float tensors (or arrays) broadcastable to the scores
            `(..., Tq, Tv)`, `keras_attn.PositionBias` layers, other
            `AttentionBias` objects, or `None` (skipped).

    Returns:
        An object holding `tensors` (float32) and `position_biases`, falsy
        when both are empty. The kernels read it with `full`, `block`
        (chunked) and, for the chunked kernel's custom gradient, `inputs` /
        `with_inputs` / `block_gradients`.

    Raises:
        TypeError: a term that is neither a float tensor nor a position bias
            (a boolean mask goes in the mask argument).

    Example:

    >>> scores_bias = keras.ops.zeros((1, 1, 4, 4))
    >>> layer = keras_attn.ScaledDotAttention()
    >>> x = keras.random.normal((2, 4, 8))
    >>> bias = keras_attn.AttentionBias(scores_bias[:, 0], keras_attn.AlibiBias())
    >>> print(layer(x, x, attention_bias=bias).shape)
    (2, 4, 8)
    """

    def __init__(self, *terms):
        self.tensors, self.position_biases = [], []
        for term in terms:
            if term is None:
                continue
            if isinstance(term, AttentionBias):
                self.tensors += term.tensors
                self.position_biases += term.position_biases
            elif _is_position_bias(term):
                self.position_biases.append(term)
            else:
                self.tensors.append(_float32_tensor(term))
        # The position biases' parameters (e.g. a learned table), as tensors the
        # chunked kernel passes into its custom gradient.
        self.parameters = [tuple(b.bias_parameters()) for b in self.position_biases]

    def __bool__(self):
        return bool(self.tensors or self.position_biases)

    def __repr__(self):
        shapes = [tuple(t.shape) for t in self.tensors]
        names = [type(b).__name__ for b in self.position_biases]
        return f"AttentionBias(tensors={shapes}, position_biases={names})"

    def map_tensors(self, fn):
        """A copy with `fn` applied to every tensor (e.g. a query axis added)."""
        bias = self._copy()
        bias.tensors = [fn(t) for t in self.tensors]
        return bias

    def _copy(self):
        bias = AttentionBias.__new__(AttentionBias)
        bias.tensors, bias.position_biases = list(self.tensors), list(self.position_biases)
        bias.parameters = list(self.parameters)
        return bias

    def inputs(self):
        """The tensors a custom gradient takes (and returns gradients for)."""
        return self.tensors + [p for params in self.parameters for p in params]

    def with_inputs(self, inputs):
        """A copy whose tensors and parameters are `inputs` (same order as `inputs()`)."""
        inputs = list(inputs)
        bias = self._copy()
        bias.tensors = inputs[: len(self.tensors)]
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
            b.position_bias(query_positions, key_positions, params, num_heads=num_heads)
            for b, params in zip(self.position_biases, self.parameters, strict=True)
        ]
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return ops.maximum(total, masks.LOWEST)  # above the masked scores' fill (NaN stays)

    def block_gradients(self, d_scores, query_positions, key_positions):
        """The position biases' parameter gradients from one block's `dS` `(..., Tq, Bk)`."""
        d = sum_to_rank(d_scores, 3)  # (h|1, Tq, Bk): the batch axes summed
        grads = []
        for b, params in zip(self.position_biases, self.parameters, strict=True):
            if params:
                grads.append(
                    tuple(b.position_bias_gradient(d, query_positions, key_positions, params))
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


def _float32_tensor(term):
    """A float tensor (or array) term of a bias, cast to float32; `TypeError` otherwise."""
    dtype = getattr(term, "dtype", None)
    if dtype is None or not keras.backend.is_float_dtype(keras.backend.standardize_dtype(dtype)):
        what = type(term).__name__ if dtype is None else keras.backend.standardize_dtype(dtype)
        raise TypeError(
            "`attention_bias` must be a float tensor broadcastable to the scores, a "
            "keras_attn.PositionBias layer, or a tuple of these (a boolean mask goes in the "
            f"mask argument). Received: {what}"
        )
    return ops.cast(term, "float32")


def as_bias(bias, scores_shape, name="bias"):
    """`bias` (None, tensor, position bias, a tuple of them, an `AttentionBias`) or `None`.

    Tensors are cast to float32 and checked against `scores_shape`
    (`(..., Tq, Tv)`, static where known).

    Raises:
        TypeError: a term that is neither a float tensor nor a position bias
            (a boolean or integer tensor is a mask: pass it as the mask).
        ValueError: a tensor whose static shape does not broadcast to the scores.
    """
    if bias is None:
        return None
    if not isinstance(bias, AttentionBias):
        terms = bias if isinstance(bias, (tuple, list)) else (bias,)
        try:
            bias = AttentionBias(*terms)
        except TypeError as error:
            raise TypeError(str(error).replace("`attention_bias`", f"`{name}`")) from None
    for tensor in bias.tensors:
        _check_broadcast(name, tensor.shape, scores_shape)
    return bias if bias else None


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
