"""Functional core of keras-attn, written with `keras.ops` only.

Every attention layer in the library runs the same steps, and each step is a
function here:

    score -> mask -> normalize -> dropout -> combine

Shapes use `B` (batch), `Tq` (query length), `Tv` (key/value length), `dk`
(key width), `dv` (value width). Every function accepts any number of leading
batch axes (`(..., Tq, dk)`), so multi-head code can pass `(B, H, Tq, dk)`.

Masks are boolean, `True` means "may attend" (built and checked in
`keras_attn.masks`, re-exported here). A masked key gets exactly zero weight,
and a query row with no visible key gets all-zero weights (and so a zero
output), never NaN and never a uniform average over padding. A NaN or inf at a
masked key never reaches an output (`keras_attn.kernels.finite`).
"""

import math

import numpy as np
from keras import ops, random

from keras_attn._typing import Length, TensorLike
from keras_attn.kernels import KERNELS, finite, masked_softmax
from keras_attn.kernels import backend as kernel_backend
from keras_attn.kernels import bias as kernel_bias
from keras_attn.kernels._shapes import check_qkv, swap_last
from keras_attn.masks import (
    as_bool_mask,
    attention_heads_mask,
    causal_mask,
    check_mask_broadcast,
    check_mask_dtype,
    check_window,
    chosen_positions_mask,
    compute_attention_mask,
    fill_masked,
    merge_masks,
    visible_query_rows,
    visible_rows,
    window_mask,
)

__all__ = [
    "CHUNKED_MIN_SCORES",
    "IMPLEMENTATIONS",
    "additive_score",
    "as_bool_mask",
    "attention",
    "window_mask",
    "attention_heads_mask",
    "bilinear_score",
    "causal_mask",
    "check_mask_broadcast",
    "check_mask_dtype",
    "choose_implementation",
    "chosen_positions_mask",
    "compute_attention_mask",
    "dot_score",
    "dropout_weights",
    "fill_masked",
    "masked_softmax",
    "merge_masks",
    "scaled_dot_score",
    "visible_query_rows",
    "visible_rows",
    "weighted_sum",
]


def _check_widths(name_a, shape_a, name_b, shape_b):
    a, b = shape_a[-1], shape_b[-1]
    if a is not None and b is not None and a != b:
        raise ValueError(
            f"The last axis of `{name_a}` and `{name_b}` must match for this "
            f"score. Received: {name_a}.shape={tuple(shape_a)}, "
            f"{name_b}.shape={tuple(shape_b)}"
        )


# ---------------------------------------------------------------------------
# Scores: (..., Tq, dq), (..., Tv, dk) -> (..., Tq, Tv)
# ---------------------------------------------------------------------------


def dot_score(query, key):
    """Dot-product score `s(q, k) = q . k` (Luong "dot").

    Args:
        query: `(..., Tq, d)` tensor.
        key: `(..., Tv, d)` tensor with the same width `d`.

    Returns:
        Scores `(..., Tq, Tv)`.
    """
    _check_widths("query", query.shape, "key", key.shape)
    return ops.matmul(query, swap_last(key))


def scaled_dot_score(query, key, scale=None):
    """Scaled dot-product score `s(q, k) = q . k / sqrt(d)` (Vaswani et al.).

    Args:
        query: `(..., Tq, d)` tensor.
        key: `(..., Tv, d)` tensor.
        scale: multiplier of the scores; `None` means `1 / sqrt(d)`.

    Returns:
        Scores `(..., Tq, Tv)`.
    """
    _check_widths("query", query.shape, "key", key.shape)
    if scale is None:
        scale = 1.0 / float(np.sqrt(_static_width("key", key)))
    # Scaling the query costs Tq * d multiplies instead of Tq * Tv.
    return ops.matmul(ops.multiply(query, ops.cast(scale, query.dtype)), swap_last(key))


def additive_score(query, key, v):
    """Additive score `s(q, k) = v^T tanh(q + k)` on already projected inputs.

    Bahdanau's score is `v^T tanh(W k + U q)`; pass `query = U q` and
    `key = W k` (both of width `units`). Memory is `(..., Tq, Tv, units)`.

    Args:
        query: `(..., Tq, units)` projected query.
        key: `(..., Tv, units)` projected key.
        v: `(units,)` weight vector.

    Returns:
        Scores `(..., Tq, Tv)`.
    """
    _check_widths("query", query.shape, "key", key.shape)
    hidden = ops.tanh(ops.expand_dims(query, -2) + ops.expand_dims(key, -3))
    return ops.einsum("...qku,u->...qk", hidden, v)  # (..., Tq, Tv)


def bilinear_score(query, key, kernel):
    """Bilinear score `s(q, k) = q^T W k` (Luong "general").

    Args:
        query: `(..., Tq, dq)` tensor.
        key: `(..., Tv, dk)` tensor; `dk` may differ from `dq`.
        kernel: `(dq, dk)` matrix `W`.

    Returns:
        Scores `(..., Tq, Tv)`.
    """
    kernel_shape = tuple(kernel.shape)
    if (
        query.shape[-1] is not None
        and key.shape[-1] is not None
        and kernel_shape != (query.shape[-1], key.shape[-1])
    ):
        raise ValueError(
            "`kernel` must have shape (query width, key width). Received: "
            f"kernel.shape={kernel_shape}, query.shape={tuple(query.shape)}, "
            f"key.shape={tuple(key.shape)}"
        )
    return ops.matmul(ops.matmul(query, kernel), swap_last(key))


def _static_width(name, x):
    width = x.shape[-1]
    if width is None:
        raise ValueError(
            f"The last axis of `{name}` must be known to compute the default "
            f"scale. Received: {name}.shape={tuple(x.shape)}"
        )
    return width


# ---------------------------------------------------------------------------
# Normalize, dropout, combine
# ---------------------------------------------------------------------------


def dropout_weights(weights, rate, training=False, seed=None):
    """Inverted dropout on attention weights in training; identity otherwise.

    Masked weights are zero before dropout and stay zero after it, so dropout
    can never reopen a masked position.
    """
    if not training or not rate:
        return weights
    return random.dropout(weights, rate, seed=seed)


def weighted_sum(weights, value):
    """`(..., Tq, Tv) x (..., Tv, dv) -> (..., Tq, dv)`: `sum_j w_ij v_j`.

    A zero weight contributes exactly nothing, even against a NaN or inf
    value: a plain matmul computes `0 * nan = nan`, and a non-finite value at
    a masked (padded, future) key would reach every row. The value rows
    holding a non-finite entry are zeroed, and the rows that give such a value
    a non-zero weight are set to NaN (all their channels): a non-finite value
    at a visible key still propagates, to the rows that see it. See
    `keras_attn.kernels.finite`; the weights must be non-negative, as softmax weights
    (after dropout) are.
    """
    value, _, flag = finite.zero_nonfinite(value)
    weights = ops.cast(weights, value.dtype)
    return finite.nan_where_seen(ops.matmul(weights, value), weights, flag)


IMPLEMENTATIONS = ("auto", "dense", "fused", "chunked", "backend")
# "auto" switches to the chunked kernel once the (..., Tq, Tv) scores would hold
# 2^28 values (1 GiB in float32; a dense training step keeps about three such
# tensors alive): e.g. 8 heads at B=1 from L=8192, at B=8 from L=2896.
# Below it the fused kernel is faster (measured 1.4-1.7x at L=4096-8192, B=1).
CHUNKED_MIN_SCORES = 2**28
_NO_WEIGHTS = ("fused", "chunked", "backend")


def _dropout_active(rate, training):
    return bool(rate) and not (training is None or training is False)


def choose_implementation(
    implementation: str,
    scores_shape: tuple,
    dropout_rate: float,
    training: bool | None,
    return_weights: bool,
    flash_attention: bool | None = None,
    position_bias: bool = False,
) -> str:
    """The one choice of a kernel: `"dense"`, `"fused"`, `"chunked"` or `"backend"`.

    Args:
        implementation: one of `IMPLEMENTATIONS`.
        scores_shape: the static shape of the scores, `(..., Tq, Tv)`. With
            `Tq` or `Tv` unknown `"auto"` never picks chunked; unknown leading
            axes (the batch at trace time) count as 1.
        dropout_rate, training: dropout is active when both are truthy.
        return_weights: whether the caller needs the weights.
        flash_attention: Keras' switch: `None`, `"auto"` decides; `True`,
            `"backend"` (from `"auto"` or `"backend"`); `False`, never it.
        position_bias: whether the call has a position bias (a function of
            positions, which the backend kernel evaluates whole).

    Returns:
        The kernel's name. `"auto"` gives `"dense"` when the weights are
        needed or dropout is active (only the dense kernel has them); else
        `"backend"` where the backend has a fused kernel for the default
        device (`keras_attn.kernels.backend.preferred`: JAX on a GPU, torch
        on CUDA; never TensorFlow) unless a position bias meets
        `CHUNKED_MIN_SCORES` scores; else `"chunked"` from
        `CHUNKED_MIN_SCORES` scores, else `"fused"`.

    Raises:
        ValueError: an unknown name; `"fused"`, `"chunked"` or `"backend"`
            with active dropout or the weights requested; a `flash_attention`
            the implementation contradicts (`True` with `"dense"`).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"`implementation` must be one of {IMPLEMENTATIONS}. "
            f"Received: implementation={implementation!r}"
        )
    implementation = kernel_backend.with_flash_attention(implementation, flash_attention)
    dropout = _dropout_active(dropout_rate, training)
    if implementation in _NO_WEIGHTS and return_weights:
        raise ValueError(
            f"implementation={implementation!r} never forms the attention weights: call with "
            "return_attention_scores=False (return_weights=False), or use implementation "
            "'auto' or 'dense' (flash_attention not True)."
        )
    if implementation in _NO_WEIGHTS and dropout:
        raise ValueError(
            f"implementation={implementation!r} has no dropout: use a dropout rate of 0, "
            "training=False, or implementation 'auto' or 'dense' (flash_attention not True). "
            f"Received: dropout rate {dropout_rate} with training={training}"
        )
    if implementation != "auto":
        return implementation
    if dropout or return_weights:
        return "dense"
    # Known dims are ints; None (or a JAX symbolic dim, in `model.export`) is unknown.
    known = [d if isinstance(d, int) else None for d in scores_shape]
    sizes = [d for d in known if d is not None]
    large = None not in known[-2:] and math.prod(sizes) >= CHUNKED_MIN_SCORES
    if flash_attention is None and kernel_backend.preferred() and not (position_bias and large):
        return "backend"
    return "chunked" if large else "fused"


def attention(
    query: TensorLike,
    key: TensorLike,
    value: TensorLike,
    mask: TensorLike | None = None,
    is_causal: bool = False,
    dropout_rate: float = 0.0,
    scale: float | None = None,
    training: bool | None = False,
    seed: int | random.SeedGenerator | None = None,
    implementation: str = "auto",
    return_weights: bool = True,
    query_start: Length | None = None,
    window: int | None = None,
    bias: TensorLike | tuple | None = None,  # a tensor, a PositionBias layer, or a tuple
    flash_attention: bool | None = None,
) -> tuple[TensorLike, TensorLike | None]:
    """Scaled dot-product attention `softmax(q k^T * scale + bias) v`, masks included.

    The one place that chooses a kernel (`keras_attn.kernels`); every layer
    with dot-product heads calls it.

    Args:
        query: `(..., Tq, dk)`.
        key: `(..., Tv, dk)`.
        value: `(..., Tv, dv)`.
        mask: boolean (or integer), broadcastable to `(..., Tq, Tv)`, `True` =
            attend. A float (additive) mask raises `TypeError`. Keep it
            factored (e.g. `(B, 1, 1, Tv)` for padded keys): the chunked
            kernel then stays `O(Tv)` in memory.
        is_causal: also apply `causal_mask(Tq, Tv, query_start)`.
        dropout_rate: dropout on the weights when `training`.
        scale: score multiplier; `None` means `1 / sqrt(dk)`.
        training: whether dropout is active.
        seed: a `keras.random.SeedGenerator` or int for the dropout.
        implementation: `"dense"` (the weights computed and returned, dropout),
            `"fused"` (the same values with a written-out gradient, no weights,
            no dropout), `"chunked"` (key blocks with an online softmax,
            memory `O(Tq)` per block instead of `O(Tq Tv)`; no weights, no
            dropout), `"backend"` (`keras.ops.dot_product_attention` with our
            masks around it, `keras_attn.kernels.backend`; no weights, no
            dropout) or `"auto"` (see `choose_implementation`).
        return_weights: `False` returns `None` for the weights (and lets
            `"auto"` take the fused or chunked kernel).
        query_start: the position of the first query among the keys for the
            causal mask; `None` means `Tv - Tq` (end-aligned). A cached
            decoding step passes its cache index.
        window: `None`, or a positive int: a symmetric sliding window, query
            `i` sees only keys `j` with `|query_start + i - j| < window`
            (`keras_attn.masks.window_mask`; composed with the other masks,
            built per key block by the chunked kernel).
        bias: `None`; a float tensor broadcastable to `(..., Tq, Tv)`; a
            `keras_attn.PositionBias` layer (e.g. `keras_attn.AlibiBias`,
            `keras_attn.RelativePositionBias`), a function of the query
            positions (those of the causal mask) and key positions that each
            kernel evaluates where it needs it (the chunked kernel per key
            block, never the `(Tq, Tv)` tensor); or a tuple of these, summed.
            Added to the scaled scores in float32 before the masked softmax
            (`keras_attn.kernels.bias`). A bias is not a mask: masked
            positions get zero weight whatever their bias.
        flash_attention: `None` lets `"auto"` decide, `True` forces the
            backend's kernel, `False` keeps `"auto"` off it.

    Returns:
        `(output, weights)`: output `(..., Tq, dv)`, weights `(..., Tq, Tv)`
        or `None` (not requested). Rows with no visible key give zero
        weights and a zero output. A NaN or inf in a masked key or value
        never reaches the output; one at a visible key makes the rows that
        see it NaN (every kernel: see `keras_attn.kernels.finite`).

    Raises:
        ValueError: `query`, `key` and `value` of rank < 2 or of different
            ranks, a `mask` whose static shape does not broadcast to
            `(..., Tq, Tv)`, mismatched widths, a kernel that cannot give
            what the call asks (see `choose_implementation`).
        TypeError: a float `mask`; a `bias` that is neither a float tensor
            nor a position bias.

    Example:

    >>> q = keras.random.normal((2, 4, 8))
    >>> out, w = keras_attn.ops.attention(q, q, q, is_causal=True)
    >>> print(out.shape, w.shape)
    (2, 4, 8) (2, 4, 4)

    A causal sliding window of 2 with ALiBi, on 4 heads:

    >>> q = keras.random.normal((1, 4, 6, 8))
    >>> out, w = keras_attn.ops.attention(
    ...     q, q, q, is_causal=True, window=2, bias=keras_attn.AlibiBias())
    >>> print(keras.ops.convert_to_numpy(w[0, 0] > 0).astype(int)[3])
    [0 0 1 1 0 0]
    """
    check_qkv(query, key, value)
    scores_shape = (*query.shape[:-1], key.shape[-2])
    mask = as_bool_mask(mask)
    if mask is not None:
        check_mask_broadcast(mask, scores_shape)
    window = check_window(window)
    bias = kernel_bias.as_bias(bias, scores_shape)
    name = choose_implementation(
        implementation, scores_shape, dropout_rate, training, return_weights,
        flash_attention=flash_attention, position_bias=bias is not None and bool(bias.functions),
    )  # fmt: skip
    dropout = None
    if _dropout_active(dropout_rate, training):
        dropout = lambda w: random.dropout(w, dropout_rate, seed=seed)  # noqa: E731
    output, weights = KERNELS[name](
        query, key, value, mask, is_causal, query_start, scale, dropout, window, bias
    )
    return output, weights if return_weights else None
