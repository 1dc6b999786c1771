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

import numpy as np
from keras import ops, random

from keras_attn import kernels
from keras_attn._typing import Length, TensorLike
from keras_attn.kernels import (
    CHUNKED_MIN_SCORES,
    IMPLEMENTATIONS,
    AttentionBias,
    AttentionSpec,
    check_implementation,
    finite,
    masked_softmax,
)
from keras_attn.kernels._shapes import check_qkv, default_scale, swap_last
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
    "AttentionBias",
    "AttentionSpec",
    "additive_score",
    "as_bool_mask",
    "attention",
    "window_mask",
    "attention_heads_mask",
    "bilinear_score",
    "causal_mask",
    "check_mask_broadcast",
    "check_implementation",
    "check_mask_dtype",
    "choose_implementation",
    "chosen_positions_mask",
    "compute_attention_mask",
    "default_scale",
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


def choose_implementation(
    implementation: str,
    scores_shape: tuple,
    dropout_rate: float,
    training: bool | None,
    return_weights: bool,
    flash_attention: bool | None = None,
) -> str:
    """The kernel `attention` takes for such a call: `"dense"`, `"fused"`, `"chunked"`, `"backend"`.

    The name of `keras_attn.kernels.choose`'s choice (the one choice, read
    from the kernels' declarations) for a dot-product call with these
    properties (a call with a position bias: `keras_attn.kernels.choose`).

    Raises:
        ValueError: an unknown name; `"fused"`, `"chunked"` or `"backend"`
            with active dropout or the weights requested; a `flash_attention`
            the implementation contradicts (`True` with `"dense"`).
    """
    spec = AttentionSpec(
        dropout_rate=dropout_rate, training=training, return_weights=return_weights
    )
    return kernels.choose(spec, scores_shape, implementation, flash_attention).name


class _Default:
    """The default of a keyword of `attention` that a spec replaces: shown as its value
    (`help(attention)` reads `mask=None`), told apart from the same value passed."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return repr(self.value)


_NONE, _FALSE, _TRUE, _ZERO = _Default(None), _Default(False), _Default(True), _Default(0.0)


def attention(
    query: TensorLike,
    key: TensorLike,
    value: TensorLike,
    mask: TensorLike | None = _NONE,
    is_causal: bool = _FALSE,
    dropout_rate: float = _ZERO,
    scale: float | None = _NONE,
    training: bool | None = _FALSE,
    seed: int | random.SeedGenerator | None = _NONE,
    implementation: str = "auto",
    return_weights: bool = _TRUE,
    query_start: Length | None = _NONE,
    window: int | None = _NONE,
    bias: TensorLike | tuple | AttentionBias | None = _NONE,
    flash_attention: bool | None = None,
    *,
    spec: AttentionSpec | None = None,
) -> tuple[TensorLike, TensorLike | None]:
    """Attention `softmax(q k^T * scale + bias) v`, masks included: the one entry to the kernels.

    Every attention layer calls it: it checks the call, chooses the kernel
    (`keras_attn.kernels.choose`, from the kernels' declarations) and runs it.
    Call it with keywords, or with a `keras_attn.AttentionSpec`
    (`spec=`, then with no other keyword but `implementation` and
    `flash_attention`): a spec may also carry a score other than the dot
    product (`keras_attn.scores`) or a custom normalization.

    Args:
        query: `(..., Tq, dk)`.
        key: `(..., Tv, dk)`.
        value: `(..., Tv, dv)`.
        mask: boolean (or integer, or float 0/1 as Keras reads it),
            broadcastable to `(..., Tq, Tv)`, `True` = attend. A float mask
            holding other values (an additive mask) raises `ValueError`. Keep it
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
            dropout) or `"auto"` (see `keras_attn.kernels.choose`).
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
            block, never the `(Tq, Tv)` tensor); or a tuple of these, or a
            `keras_attn.AttentionBias`, summed. Added to the scaled scores in
            float32 before the masked softmax. A bias is not a mask: masked
            positions get zero weight whatever their bias.
        flash_attention: `None` lets `"auto"` decide, `True` forces the
            backend's kernel, `False` keeps `"auto"` off it.
        spec: the call as one `keras_attn.AttentionSpec`, in place of
            the keywords from `mask` to `bias` (all but `implementation`).

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
            what the call asks (see `keras_attn.kernels.choose`).
        ValueError: also a float `mask` holding values other than 0 and 1, and
            a `spec` with any keyword from `mask` to `bias` (all but `implementation`).
        TypeError: a non-numeric or ragged `mask`; a `bias` that is neither a float tensor
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
    keywords = {
        "mask": mask,
        "is_causal": is_causal,
        "dropout_rate": dropout_rate,
        "scale": scale,
        "training": training,
        "seed": seed,
        "return_weights": return_weights,
        "query_start": query_start,
        "window": window,
        "bias": bias,
    }
    given = [name for name, keyword in keywords.items() if not isinstance(keyword, _Default)]
    if spec is not None and given:
        raise ValueError(
            "`spec` replaces the keywords from `mask` to `bias` (all but `implementation`): pass "
            f"one or the other. Received: spec and {', '.join(given)}"
        )
    if spec is None:
        values = {
            name: keyword.value if isinstance(keyword, _Default) else keyword
            for name, keyword in keywords.items()
        }
        spec = AttentionSpec(
            mask=as_bool_mask(values.pop("mask")),
            is_causal=bool(values.pop("is_causal")),
            window=check_window(values.pop("window")),
            **values,
        )
    check_qkv(query, key, value, same_widths=spec.score is None)
    scores_shape = (*query.shape[:-1], key.shape[-2])
    if spec.mask is not None:
        check_mask_broadcast(spec.mask, scores_shape)
    if spec.bias is not None:
        spec = spec.replace(bias=kernels.bias.as_bias(spec.bias, scores_shape))
    kernel = kernels.choose(spec, scores_shape, implementation, flash_attention)
    output, weights = kernel.run(query, key, value, spec)
    return output, weights if spec.return_weights else None
