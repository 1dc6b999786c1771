"""Non-finite keys and values: masked ones change nothing, visible ones propagate.

A masked key gets exactly zero weight, but a weighted sum is a matmul and
`0 * nan = nan`: a NaN or inf value at a padded (or future) position would
reach every output row. Every attention path (`keras_attn.ops.weighted_sum`,
the combine of the score layers; the dense, fused and chunked kernels) guards
its combine in the same two steps:

1. `zero_nonfinite`: the key and value rows holding a NaN or inf are zeroed
   (`O(Tv d)`, forward only: the gradient passes straight through), and a
   flag `(..., Tv, 1)` marks them (1, else 0).
2. The path runs unchanged on the zeroed rows. When some position is
   flagged (a `cond` on the flag, so inputs that are all finite pay nothing
   more), it forms `W flag` next to its weighted sum `W V` (a matrix-vector
   product, one more pass over the weights and none in the backward pass):
   `sum_j w_ij flag_j` is positive exactly when row `i` gives a non-finite
   position a non-zero weight (the weights are non-negative).
   `nan_where_seen` sets those rows to NaN. (Measured: the unconditional
   product cost 4-11 % of an MHA training step and 5-18 % of an inference
   call; `benchmarks.run`'s shapes, 2 cores.)

So a NaN or inf at a masked position never reaches an output, and one at a
visible position makes the rows that see it NaN (all their channels), as a
plain matmul would. The kernels and `keras_attn.ScoreAttention` zero the
non-finite keys too, so a masked NaN key is in no gradient either
(`dQ = dS K` would compute `0 * nan`).

(Appending the flag to the values as one more channel would fold step 2
into the weighted sum, but an odd width such as 65 makes TensorFlow's batched
matmul on CPU about 2x slower, forward and backward: measured.)
"""

import functools
import math

import keras
from keras import ops

from keras_attn._execution import is_eager
from keras_attn.kernels._gradient import custom_gradient


def zero_nonfinite(value, key=None):
    """Zeroes the positions (axis -2) holding a NaN or inf, and flags them.

    Args:
        value: `(..., Tv, dv)`.
        key: `(..., Tv, dk)` or `None`; a position is non-finite when its key
            or its value is.

    Returns:
        `(value, key, flag)`: value and key (or `None`) zero on the
        non-finite positions, and `flag (..., Tv, 1)` in the value's dtype,
        1 on them and 0 elsewhere. In an eager call where every entry is
        finite, `(value, key, None)`: nothing to zero and nothing flagged
        (the `flag` arguments below take `None`).
    """
    if is_eager(value, key):
        value, key = _tensor(value), _tensor(key)  # a NumPy input comes back a tensor, as below
        if all_finite(value, key):
            return value, key, None
    finite = ops.all(ops.isfinite(value), axis=-1, keepdims=True)  # (..., Tv, 1)
    if key is not None:
        finite = ops.logical_and(finite, ops.all(ops.isfinite(key), axis=-1, keepdims=True))
        key = _zero_rows(key, finite)
    value = _zero_rows(value, finite)
    return value, key, ops.cast(ops.logical_not(finite), value.dtype)


def _tensor(x):
    """`x` as a tensor (`None` stays `None`); a tensor as it is, without a conversion op."""
    return x if x is None or ops.is_tensor(x) else ops.convert_to_tensor(x)


def all_finite(*tensors) -> bool:
    """Whether every entry of the (concrete) `tensors` is finite; `None`s skipped.

    In float32 and float64, one pass: the sum of all the entries is finite
    when they all are, and a NaN or inf makes it NaN or inf (a sum that
    overflows says "not finite" of finite entries: the guarded path then
    runs, which is right for any input). In narrower dtypes, entry by entry.
    """
    tensors = [t for t in tensors if t is not None]
    if keras.backend.backend() == "torch":  # the same test in torch's ops: a Keras op costs
        return _torch_all_finite(tensors)  # as much again per step, eagerly (issue 23)
    if all(ops.dtype(t) in ("float32", "float64") for t in tensors):
        return bool(ops.isfinite(functools.reduce(ops.add, [ops.sum(t) for t in tensors])))
    return all(bool(ops.all(ops.isfinite(t))) for t in tensors)


def _torch_all_finite(tensors) -> bool:
    import torch

    tensors = [t if torch.is_tensor(t) else ops.convert_to_tensor(t) for t in tensors]
    if all(t.dtype in (torch.float32, torch.float64) for t in tensors):
        total = tensors[0].sum()
        for t in tensors[1:]:
            total = total + t.sum()
        return math.isfinite(total.item())  # a Python float: no isfinite op (5 us vs 14 us)
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _zero_rows(x, finite):
    """`where(finite, x, 0)`, with the gradient passed straight through.

    The gradient of a `where` is another `where` in the backward pass (a pass
    over `x` per key and value: measured 10-15 % of a training step of the
    attention core). Straight through gives the same gradient wherever it
    matters: a zeroed row is either masked, and then its gradient is exactly
    zero anyway (zero weight), or visible, and then the rows that see it are
    NaN.
    """

    def zero(x, finite):
        return ops.where(finite, x, 0.0), lambda d_x: (d_x,)

    return custom_gradient(zero, (x,), (finite,))


def nan_where_seen(output, weights, flag):
    """`output (..., Tq, dv)` with NaN on the rows giving a flagged position a non-zero weight.

    Args:
        output: the weighted sum `weights @ value` of the zeroed values.
        weights: `(..., Tq, Tv)`, non-negative, in the dtype of `flag`.
        flag: `(..., Tv, 1)` from `zero_nonfinite`, or `None` (nothing flagged).
    """
    if flag is None:
        return output

    def mark():
        seen = ops.matmul(weights, flag)  # (..., Tq, 1)
        return ops.where(seen > 0, ops.cast(float("nan"), output.dtype), output)

    # The product is a pass over the (Tq, Tv) weights: only when a position is flagged.
    return ops.cond(ops.any(flag > 0), mark, lambda: output)


def nan_scores_where_flagged(scores, flag):
    """`scores (..., Tq, Tv)` with NaN at the flagged keys (`flag (..., Tv, 1)`).

    For pipelines that score zeroed keys with a layer of their own
    (`keras_attn.ScoreAttention`): a non-finite key or value at a visible
    position then gives a NaN score, so its rows are NaN whatever the
    normalization does with it (softmax, hard selection, a pointer), and at a
    masked position the mask replaces it. Only when something is flagged
    (`flag` `None`: nothing is).
    """
    if flag is None:
        return scores

    def mark():
        flagged = ops.swapaxes(flag, -1, -2) > 0  # (..., 1, Tv)
        return ops.where(flagged, ops.cast(float("nan"), scores.dtype), scores)

    return ops.cond(ops.any(flag > 0), mark, lambda: scores)
