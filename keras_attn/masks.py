"""Boolean attention masks: build, check, merge, fill. `True` means "may attend".

All the mask math of keras-attn lives here (and is re-exported by
`keras_attn.ops`); the kernels, the layers and the KV cache call these
functions and build no mask of their own:

- `as_bool_mask`: the one cast (boolean, integer or float 0/1 in, bool out;
  a float mask holding other values, ragged and other non-tensor masks
  refused with the argument's name);
- `causal_mask`: the one causal mask, for a whole `(Tq, Tv)` score matrix or
  for one block of keys (`key_start`), end-aligned or from a cache index;
- `window_mask`, `position_mask`: the symmetric sliding window, and the
  causal and window masks merged (what the kernels build from positions);
  `mask_at_positions`: the same for keys at any positions (a ring cache's);
- `positions_below`: the keys of a block that exist (a kernel's padding);
  `query_positions`, `key_positions`: the positions the causal mask, the
  window and the position biases share;
- `fill_masked`: the one fill, replacing masked scores (whatever they hold:
  huge, inf, NaN) before any max or exp;
- `compute_attention_mask`, `attention_heads_mask`: query, value, explicit
  and causal masks merged into one, or factored for the multi-head kernels;
- `visible_rows`, `visible_query_rows`: which query rows see any key;
- `zero_padded`: padded steps of an input set to 0 before any projection.
"""

import functools

import keras
import numpy as np
from keras import ops

from keras_attn._execution import has_values
from keras_attn._typing import Length, TensorLike

# Fill of masked scores. Softmax runs in float32 and this is the most negative
# finite float32: a row of fills is a finite uniform row (zeroed afterwards).
FILL = float(np.finfo(np.float32).min)
# The lowest visible score: the float32 next to FILL, 2^104 (2e31) above it, so that
# exp(FILL - s) is exactly 0 for every score s >= LOWEST. A bias is raised to it
# (`keras_attn.kernels.bias`): float32's lowest (an additive mask) and -inf would
# otherwise tie with, or fall below, the fill of the masked scores.
LOWEST = float(np.nextafter(np.float32(FILL), np.float32(0)))


def fill_masked(scores: TensorLike, mask: TensorLike | None) -> TensorLike:
    """`where(mask, scores, FILL)` in float32: masked scores replaced, never added to.

    A masked score that holds inf or NaN (a padded row that overflowed
    float16) is replaced like any other; adding a large negative bias would
    keep it.

    Args:
        scores: float tensor; cast to float32.
        mask: boolean, broadcastable to `scores`, or `None` (nothing masked).
    """
    scores = ops.cast(scores, "float32")
    return scores if mask is None else ops.where(mask, scores, FILL)


def causal_mask(
    query_length: Length,
    value_length: Length | None = None,
    query_start: Length | None = None,
    key_start: Length = 0,
) -> TensorLike:
    """Boolean `(Tq, Tv)` mask: query `i` sees keys `j` with `key_start + j <= query_start + i`.

    `query_start` is the position of the first query among the keys; it
    defaults to `Tv - Tq`: with `Tq == Tv` this is the lower triangle, and
    with `Tq < Tv` the mask is aligned to the end, so the last `Tq` positions
    of a sequence of length `Tv` see exactly what they would see in a full
    pass. Cached decoding passes the cache index; a kernel working on one
    block of keys passes the block's first position as `key_start` (and the
    full key length's `query_start`).
    """
    if value_length is None:
        value_length = query_length
    if query_start is None:
        query_start = value_length - query_length
    rows = ops.arange(query_length, dtype="int32") + ops.cast(query_start, "int32")
    cols = ops.arange(value_length, dtype="int32") + ops.cast(key_start, "int32")
    return ops.expand_dims(rows, 1) >= ops.expand_dims(cols, 0)


def window_mask(
    query_length: Length,
    value_length: Length,
    window: int,
    query_start: Length | None = None,
    key_start: Length = 0,
) -> TensorLike:
    """Boolean `(Tq, Tv)` band: query `i` sees key `j` iff `|p_i - (key_start + j)| < window`.

    A symmetric sliding window (`keras.layers.MultiHeadAttention`'s
    `sliding_window`), `p_i = query_start + i` the query positions of
    `causal_mask` (`query_start` defaults to `Tv - Tq`); composed with the
    causal mask it is the causal sliding window of Mistral or Longformer's local attention.
    """
    if query_start is None:
        query_start = value_length - query_length
    rows = ops.arange(query_length, dtype="int32") + ops.cast(query_start, "int32")
    cols = ops.arange(value_length, dtype="int32") + ops.cast(key_start, "int32")
    return ops.abs(ops.expand_dims(rows, 1) - ops.expand_dims(cols, 0)) < window


def position_mask(
    query_length: Length,
    value_length: Length,
    is_causal: bool = False,
    window: int | None = None,
    query_start: Length | None = None,
    key_start: Length = 0,
    constant: bool = False,
) -> TensorLike | None:
    """The masks that are functions of positions, merged: causal and window; `None` if neither.

    What a kernel builds whole (dense, fused) or per key block (chunked,
    with the block's `key_start`). With `constant=True` and every length and
    start a Python int, the mask is computed once with NumPy (cached) and
    converted: one op in place of seven, for an eager call (a traced call
    keeps the ops: a constant would put the `(Tq, Tv)` mask in its graph);
    and `None` when it masks nothing (one query at the end of the keys).
    """
    if constant and (is_causal or window is not None):
        query_start = _static_start(query_length, value_length, query_start)
        if _all_ints(query_length, value_length, query_start, key_start):
            mask = _numpy_position_mask(
                int(query_length),
                int(value_length),
                bool(is_causal),
                window,
                int(query_start),
                int(key_start),
            )
            return None if mask is None else ops.convert_to_tensor(mask)
    parts = []
    if is_causal:
        parts.append(causal_mask(query_length, value_length, query_start, key_start))
    if window is not None:
        parts.append(window_mask(query_length, value_length, window, query_start, key_start))
    return merge_masks(*parts)


def mask_at_positions(
    query_positions: TensorLike,
    key_positions: TensorLike,
    is_causal: bool = False,
    window: int | None = None,
) -> TensorLike | None:
    """Boolean `(Tq, Tv)`: the causal and window masks of keys at any positions; `None` if neither.

    `position_mask` for keys that are not at `0 .. Tv - 1` (a
    `keras_attn.cache.RingKVCache`'s slots): query `p_i` sees key `k_j` iff
    `k_j <= p_i` (causal) and `|p_i - k_j| < window`.

    Args:
        query_positions: int `(Tq,)`.
        key_positions: int `(Tv,)`.
        is_causal, window: as `position_mask`.

    Example:

    >>> mask = mask_at_positions(np.array([5]), np.array([4, 5, 2, 3]), True, 3)
    >>> print(keras.ops.convert_to_numpy(mask).tolist())
    [[True, True, False, True]]
    """
    rows = ops.expand_dims(ops.cast(query_positions, "int32"), 1)
    cols = ops.expand_dims(ops.cast(key_positions, "int32"), 0)
    parts = []
    if is_causal:
        parts.append(rows >= cols)
    if window is not None:
        parts.append(ops.abs(rows - cols) < window)
    return merge_masks(*parts)


def _all_ints(*values) -> bool:
    return all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values)


def _static_start(query_length, value_length, query_start):
    """`query_start`, its default `Tv - Tq` where both lengths are ints (else as given)."""
    if query_start is None and _all_ints(query_length, value_length):
        return int(value_length) - int(query_length)
    return query_start


@functools.lru_cache(maxsize=128)
def _numpy_position_mask(query_length, value_length, is_causal, window, query_start, key_start):
    rows = np.arange(query_length)[:, None] + query_start
    cols = np.arange(value_length)[None, :] + key_start
    mask = np.ones((query_length, value_length), bool)
    if is_causal:
        mask &= rows >= cols
    if window is not None:
        mask &= np.abs(rows - cols) < window
    if mask.all():  # nothing masked: no mask
        return None
    mask.flags.writeable = False
    return mask


def position_rows_visible(
    query_length: Length,
    value_length: Length,
    is_causal: bool = False,
    window: int | None = None,
    query_start: Length | None = None,
) -> bool:
    """Whether every query row is known, before the call, to see a key under the position masks.

    `True` only when the lengths and the start are Python ints (static
    shapes) and each row `p_i = query_start + i` has a key in its range
    (causal: some `j <= p_i`; window: some `j` with `|p_i - j| < window`):
    then zeroing the rows that see nothing is a no-op and a kernel or layer
    skips it. `False` when it cannot tell.
    """
    query_start = _static_start(query_length, value_length, query_start)
    if not _all_ints(query_length, value_length, query_start):
        return False
    return _rows_visible(
        int(query_length), int(value_length), bool(is_causal), window, int(query_start)
    )


@functools.lru_cache(maxsize=128)
def _rows_visible(query_length, value_length, is_causal, window, query_start):
    if int(value_length) == 0:
        return int(query_length) == 0
    p = np.arange(int(query_length)) + int(query_start)
    hi = np.full_like(p, int(value_length) - 1)
    lo = np.zeros_like(p)
    if is_causal:
        hi = np.minimum(hi, p)
    if window is not None:
        hi = np.minimum(hi, p + window - 1)
        lo = np.maximum(lo, p - window + 1)
    return bool(np.all(hi >= lo))


def check_window(window: int | None, name: str = "window") -> int | None:
    """`window` as a positive int or `None`; `ValueError` naming `name` otherwise."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window <= 0:
        raise ValueError(
            f"`{name}` must be None or a positive integer. Received: {name}={window!r}"
        )
    return int(window)


def query_positions(query_length, value_length, query_start=None):
    """`query_start + [0 .. Tq - 1]` as int32, `query_start` defaulting to `Tv - Tq`."""
    start = value_length - query_length if query_start is None else query_start
    return ops.arange(query_length, dtype="int32") + ops.cast(start, "int32")


def key_positions(length, start=0):
    """`start + [0 .. length - 1]` as int32."""
    return ops.arange(length, dtype="int32") + ops.cast(start, "int32")


def positions_below(length: Length, size: int, start: Length = 0) -> TensorLike:
    """`(size,)` bool: `start + j < length`, the positions of a block that lie before `length`.

    A kernel that pads the keys to whole blocks hides the padding with it.
    """
    return ops.arange(size, dtype="int32") + ops.cast(start, "int32") < length


def check_mask_dtype(name: str, mask: TensorLike) -> None:
    """`TypeError` unless `mask` is a dense boolean, integer or float tensor or array.

    Integers are read as nonzero = attend, floats as Keras reads them (1 =
    attend, 0 = masked); `as_bool_mask` refuses a float mask holding other
    values (an additive 0 / -1e9 mask), whose reading would be inverted.
    """
    dtype = getattr(mask, "dtype", None)
    if dtype is None or type(mask).__name__ == "RaggedTensor":
        raise TypeError(
            f"`{name}` must be a dense boolean tensor or NumPy array. "
            f"Received: {name} of type {type(mask).__name__}"
        )
    dtype = keras.backend.standardize_dtype(dtype)
    if dtype != "bool" and not keras.backend.is_int_dtype(dtype) and not _is_float(dtype):
        raise TypeError(
            f"`{name}` must be a boolean mask (True = may attend; integer or float 0/1 also "
            f"accepted). Received: {name}.dtype={dtype}"
        )


def _is_float(dtype) -> bool:
    return keras.backend.is_float_dtype(keras.backend.standardize_dtype(dtype))


def _known_values(mask: TensorLike) -> np.ndarray | None:
    """The values of `mask` when it holds them (an array, an eager tensor, a JAX constant
    inside `jax.jit`); `None` when traced."""
    if isinstance(mask, np.ndarray):
        return mask
    return ops.convert_to_numpy(mask) if has_values(mask) else None


def float_mask_as_bool(mask: TensorLike, name: str = "mask") -> TensorLike:
    """A float mask of 0s and 1s as bool (1 = attend, 0 = masked), as Keras reads it.

    When its values are known (a NumPy array, an eager tensor) any value
    other than 0 and 1 raises `ValueError` naming the argument: an additive
    mask (0 = keep, -1e9 = drop) would otherwise be read inverted. Traced,
    the values are not known: the mask is read as `mask > 0.5` (an additive
    mask then masks every key, and its rows give zeros).
    """
    values = _known_values(mask)
    if values is not None:
        bad = np.unique(values[(values != 0) & (values != 1)])  # NaN too
        if bad.size:
            shown = ", ".join(f"{v:g}" for v in bad[:4]) + (", ..." if bad.size > 4 else "")
            raise ValueError(
                f"`{name}` must be a boolean mask (True = may attend), or a float mask of 0s "
                "(masked) and 1s (attend) as Keras reads one; an additive mask "
                "(0 = keep, -1e9 = drop) would be read inverted: pass `mask == 0` for one. "
                f"Received: {name}.dtype={keras.backend.standardize_dtype(mask.dtype)} "
                f"holding {shown}"
            )
    if isinstance(mask, np.ndarray):
        return ops.convert_to_tensor(mask > 0.5)
    return ops.greater(mask, ops.cast(0.5, mask.dtype))


def as_bool_mask(mask: TensorLike | None, name: str = "mask") -> TensorLike | None:
    """Casts a boolean, integer or float mask to bool (`True` = attend); `None` stays `None`.

    Integers: nonzero = attend. Floats: 1 = attend, 0 = masked, as Keras reads
    them (`float_mask_as_bool`: other values raise `ValueError` when known).
    A Python list becomes a tensor first. Raises `TypeError` for a ragged,
    non-tensor or non-numeric mask (see `check_mask_dtype`).
    """
    if mask is None:
        return None
    if isinstance(mask, (list, tuple)):
        mask = np.asarray(mask)
    check_mask_dtype(name, mask)
    dtype = keras.backend.standardize_dtype(mask.dtype)
    if dtype == "bool":
        return ops.convert_to_tensor(mask) if isinstance(mask, np.ndarray) else mask
    if _is_float(dtype):
        return float_mask_as_bool(mask, name)
    return ops.not_equal(mask, 0)


def check_mask_broadcast(
    mask: TensorLike,
    target_shape: tuple[int | None, ...],
    target: str = "scores",
    name: str = "mask",
) -> None:
    """`ValueError` unless the static shape of `mask` broadcasts to `target_shape`.

    Dimensions unknown at trace time (None, or symbolic in a JAX export) are
    not checked.
    """
    shape, target_shape = tuple(mask.shape), tuple(target_shape)
    fits = len(shape) <= len(target_shape) and all(
        not isinstance(m, int) or not isinstance(t, int) or m in (1, t)
        for m, t in zip(reversed(shape), reversed(target_shape), strict=False)
    )
    if not fits:
        raise ValueError(
            f"`{name}` must broadcast to the shape of the {target}, {target_shape}. "
            f"Received: {name}.shape={shape}"
        )


def merge_masks(*masks: TensorLike | None) -> TensorLike | None:
    """Logical AND of boolean masks that broadcast together; `None`s skipped.

    Returns `None` when every mask is `None`.
    """
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = as_bool_mask(mask)
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def compute_attention_mask(
    query_length: Length,
    value_length: Length,
    query_mask: TensorLike | None = None,
    value_mask: TensorLike | None = None,
    attention_mask: TensorLike | None = None,
    use_causal_mask: bool = False,
) -> TensorLike | None:
    """Merges query, value, explicit and causal masks into one boolean mask.

    Args:
        query_length: `Tq` (int or scalar tensor).
        value_length: `Tv`.
        query_mask: `(B, Tq)` or `None`; `False` rows are padding.
        value_mask: `(B, Tv)` or `None`; `False` keys are padding.
        attention_mask: `(B, Tq, Tv)` or anything broadcastable to it.
        use_causal_mask: add `causal_mask(Tq, Tv)`.

    Returns:
        A rank-3 boolean mask, `(B, Tq, Tv)` or `(1, Tq, Tv)` (causal only),
        or `None` when there is nothing to mask.
    """
    q = as_bool_mask(query_mask, "query_mask")
    v = as_bool_mask(value_mask, "value_mask")
    c = causal_mask(query_length, value_length)[None] if use_causal_mask else None
    return merge_masks(
        None if q is None else q[:, :, None],
        None if v is None else v[:, None, :],
        attention_mask,
        c,
    )


def attention_heads_mask(
    value_mask: TensorLike | None = None, attention_mask: TensorLike | None = None
) -> TensorLike | None:
    """The key-side mask of multi-head attention, factored: `(B, 1, 1, Tv)` or `(B|1, 1, Tq, Tv)`.

    Padded keys stay `O(Tv)` (the chunked kernel slices this per key block);
    the query mask and the causal mask are not in it: padded query rows are
    zeroed on the output (`visible_query_rows`) and the causal mask is the
    kernels' `is_causal`.
    """
    v = as_bool_mask(value_mask, "value_mask")
    a = as_bool_mask(attention_mask, "attention_mask")
    return merge_masks(
        # (B, 1, 1, Tv) by expand_dims: TFLite has no builtin for v[:, None, None, :] on bools
        None if v is None else ops.expand_dims(ops.expand_dims(v, 1), 1),
        None if a is None else a[:, None],
    )


def zero_padded(x: TensorLike, mask: TensorLike | None) -> TensorLike:
    """`x (B, T, d)` with the padded steps (`mask (B, T)` False) set to 0; `None` mask: `x`.

    Layers zero their padded inputs before any projection: whatever a padded
    step holds (huge, inf, NaN) then reaches no output and no gradient (a
    weight's gradient `x^T dy` would compute `NaN * 0` there).
    """
    if mask is None:
        return x
    mask = as_bool_mask(mask)
    return ops.where(ops.expand_dims(mask, -1), x, ops.zeros_like(x))


def visible_rows(mask: TensorLike) -> TensorLike:
    """`(..., Tq, 1)` bool: whether each query row sees at least one key."""
    return ops.any(mask, axis=-1, keepdims=True)


def visible_query_rows(
    query_length: Length,
    value_length: Length,
    query_mask: TensorLike | None = None,
    value_mask: TensorLike | None = None,
    attention_mask: TensorLike | None = None,
    is_causal: bool = False,
    query_start: Length | None = None,
    window: int | None = None,
) -> TensorLike | None:
    """`visible_rows(compute_attention_mask(...))` without the `(Tq, Tv)` mask.

    With only a query mask, a value mask and the position masks (causal,
    `window`), row `i` sees a key when `query_mask[i]` and some visible key
    lies in its range `[lo_i, hi_i]` (`hi_i = p_i` when causal, `p_i + window - 1`
    with a window, else `Tv - 1`; `lo_i = p_i - window + 1` with a window, else
    0; `p_i = query_start + i` as in `causal_mask`), counted from a running sum
    of the value mask: `O(Tq + Tv)`. An explicit `attention_mask` is already
    `(B, Tq, Tv)`, so then the masks are merged. With `Tv = 0` no row sees a
    key.

    Returns:
        Boolean `(B or 1, Tq or 1, 1)`, or `None` when every row sees a key.
    """
    empty = isinstance(value_length, int) and value_length == 0
    if attention_mask is not None or empty:
        positions = position_mask(query_length, value_length, is_causal, window, query_start)
        attention_mask = merge_masks(attention_mask, None if positions is None else positions[None])
        mask = compute_attention_mask(
            query_length, value_length, query_mask, value_mask, attention_mask
        )
        if mask is None:  # Tv = 0 and nothing else to mask
            return ops.zeros((1, 1, 1), "bool")
        return visible_rows(mask)
    value_mask = as_bool_mask(value_mask, "value_mask")
    seen = None
    # Static lengths where every row sees a key: only the query mask is left.
    static = value_mask is None and position_rows_visible(
        query_length, value_length, is_causal, window, query_start
    )
    if (is_causal or window is not None) and not static:
        start = value_length - query_length if query_start is None else query_start
        p = ops.arange(query_length, dtype="int32") + ops.cast(start, "int32")  # (Tq,)
        hi = p if is_causal else None
        lo = None
        if window is not None:
            hi = ops.minimum(hi, p + window - 1) if hi is not None else p + window - 1
            lo = ops.maximum(p - window + 1, 0)
        hi = ops.minimum(hi, value_length - 1)
        lo = ops.zeros_like(p) if lo is None else lo
        nonempty = ops.expand_dims(ops.logical_and(hi >= lo, hi >= 0), 0)  # (1, Tq)
        if value_mask is None:
            seen = nonempty
        else:
            # before[:, j]: the visible keys at positions < j, (B, Tv + 1); keys in [lo, hi]:
            # before[hi + 1] - before[lo]. No clip of the int indices to constants: TFLite
            # lowers one to [0, 6] to Relu6, which is no builtin op on int32.
            counts = ops.cumsum(ops.cast(value_mask, "int32"), axis=-1)
            before = ops.pad(counts, ((0, 0), (1, 0)))
            upto = ops.maximum(hi + 1, 0)  # (Tq,) in [0, Tv], as hi <= Tv - 1
            first = ops.minimum(lo, upto)  # lo > hi + 1: an empty row anyway
            count = ops.take(before, upto, axis=-1) - ops.take(before, first, axis=-1)  # (B, Tq)
            seen = ops.logical_and(count > 0, nonempty)
    elif value_mask is not None:
        seen = ops.any(value_mask, axis=-1, keepdims=True)  # (B, 1)
    elif not isinstance(value_length, int):  # a length known only at run time may be 0
        seen = ops.reshape(value_length > 0, (1, 1))
    if query_mask is not None:
        seen = merge_masks(seen, as_bool_mask(query_mask, "query_mask"))
    return None if seen is None else ops.expand_dims(seen, -1)


def chosen_positions_mask(pointers: TensorLike, num_positions: int) -> TensorLike:
    """Mask for pointer decoding: step `i` may not point at `pointers[:, :i]`.

    Args:
        pointers: `(B, Tq)` integer positions chosen at each decoding step
            (the teacher-forced targets in training). Negative values are
            ignored (use them for padding).
        num_positions: `Tv`, the number of input positions.

    Returns:
        Boolean `(B, Tq, Tv)`: `False` where position `j` was already chosen
        at a step before `i`.
    """
    pointers = ops.convert_to_tensor(pointers)
    onehot = ops.one_hot(pointers, num_positions, dtype="int32")  # (B, Tq, Tv)
    # Exclusive running count over steps: chosen strictly before step i.
    chosen_before = ops.cumsum(onehot, axis=1) - onehot
    return ops.equal(chosen_before, 0)
