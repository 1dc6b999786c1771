"""Boolean attention masks: build, check, merge. `True` means "may attend".

The mask math of keras-attn lives here (and is re-exported by
`keras_attn.ops`): the causal and cache masks, the merge of query, value,
explicit and causal masks into one, which query rows see any key, and the
checks every mask passes (boolean or integer dtype; a static shape that
broadcasts to the scores').
"""

import keras
from keras import ops


def causal_mask(query_length, value_length=None, query_start=None):
    """Boolean `(Tq, Tv)` mask where query `i` sees keys `j <= query_start + i`.

    `query_start` defaults to `Tv - Tq`: with `Tq == Tv` this is the lower
    triangle, and with `Tq < Tv` the mask is aligned to the end, so the last
    `Tq` positions of a sequence of length `Tv` see exactly what they would
    see in a full pass. Cached decoding passes the cache index instead.
    """
    if value_length is None:
        value_length = query_length
    if query_start is None:
        query_start = value_length - query_length
    rows = ops.expand_dims(ops.arange(query_length), 1) + ops.cast(query_start, "int32")
    cols = ops.expand_dims(ops.arange(value_length), 0)
    return rows >= cols


def cache_mask(query_length, cache_length, cache_index, value_mask=None, use_causal_mask=True):
    """The keys a cached decoding step may see: `(1 or B, Tq, S)` bool.

    The `Tq` new tokens sit at positions `cache_index .. cache_index + Tq - 1`
    of a cache of length `S`. Positions not written yet are never visible;
    with `use_causal_mask` token `i` also sees only positions
    `<= cache_index + i`. `value_mask (B, Tq)` marks padding among the new
    tokens; earlier cache positions count as visible (right padding, the
    usual case, then gives exactly the full pass; for padding before the end
    pass an `attention_mask` over the whole cache instead).
    """
    if use_causal_mask:
        visible = causal_mask(query_length, cache_length, query_start=cache_index)
    else:
        written = ops.arange(cache_length) < ops.cast(cache_index, "int32") + query_length
        visible = ops.expand_dims(written, 0)  # (1, S)
    visible = ops.expand_dims(visible, 0)  # (1, Tq or 1, S)
    if value_mask is None:
        return visible
    value_mask = ops.cast(as_bool_mask(value_mask, "value_mask"), "int32")  # (B, Tq)
    batch_ones = ops.ones((ops.shape(value_mask)[0], cache_length), "int32")
    index = ops.cast(cache_index, "int32")
    full = ops.slice_update(batch_ones, (ops.zeros((), "int32"), index), value_mask)  # (B, S)
    return ops.logical_and(visible, ops.expand_dims(ops.cast(full, "bool"), 1))


def merge_masks(*masks):
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


def check_mask_dtype(name, mask):
    """`TypeError` unless `mask` is boolean or integer (nonzero = attend).

    A float mask is refused: an additive mask (0 = keep, -1e9 = drop) read as
    "nonzero = attend" would be inverted, silently.
    """
    dtype = keras.backend.standardize_dtype(mask.dtype)
    if dtype != "bool" and not keras.backend.is_int_dtype(dtype):
        raise TypeError(
            f"`{name}` must be a boolean mask (True = may attend; integer 0/1 also "
            f"accepted), not an additive float mask. Received: {name}.dtype={dtype}"
        )


def as_bool_mask(mask, name="mask"):
    """Casts a boolean or integer mask to bool (`True`/nonzero = attend).

    Raises `TypeError` for a float mask (see `check_mask_dtype`).
    """
    check_mask_dtype(name, mask)
    if keras.backend.standardize_dtype(mask.dtype) == "bool":
        return mask
    return ops.not_equal(mask, 0)


def check_mask_broadcast(mask, target_shape, target="scores"):
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
            f"`mask` must broadcast to the shape of the {target}, {target_shape}. "
            f"Received: mask.shape={shape}"
        )


def compute_attention_mask(
    query_length,
    value_length,
    query_mask=None,
    value_mask=None,
    attention_mask=None,
    use_causal_mask=False,
):
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
    q = None if query_mask is None else ops.expand_dims(as_bool_mask(query_mask, "query_mask"), -1)
    v = None if value_mask is None else ops.expand_dims(as_bool_mask(value_mask, "value_mask"), -2)
    c = ops.expand_dims(causal_mask(query_length, value_length), 0) if use_causal_mask else None
    return merge_masks(q, v, attention_mask, c)


def visible_rows(mask):
    """`(..., Tq, 1)` bool: whether each query row sees at least one key."""
    return ops.any(mask, axis=-1, keepdims=True)


def visible_query_rows(
    query_length,
    value_length,
    query_mask=None,
    value_mask=None,
    attention_mask=None,
    use_causal_mask=False,
):
    """`visible_rows(compute_attention_mask(...))` without the `(Tq, Tv)` mask.

    With only a query mask, a value mask and the causal mask, whether row `i`
    sees a key is `query_mask[i]` and "some visible key `j <= i + Tv - Tq`",
    read from a running count of the value mask: `O(Tq + Tv)`. An explicit
    `attention_mask` is already `(B, Tq, Tv)`, so then the masks are merged.

    Returns:
        Boolean `(B or 1, Tq or 1, 1)`, or `None` when every row sees a key.
    """
    if attention_mask is not None:
        mask = compute_attention_mask(
            query_length, value_length, query_mask, value_mask, attention_mask, use_causal_mask
        )
        return visible_rows(mask)
    seen = None
    if use_causal_mask:
        last = ops.arange(query_length) + ops.cast(value_length - query_length, "int32")
        if value_mask is None:
            seen = ops.expand_dims(last >= 0, 0)  # (1, Tq)
        else:
            counts = ops.cumsum(ops.cast(as_bool_mask(value_mask), "int32"), axis=-1)
            before = ops.take(counts, ops.clip(last, 0, value_length - 1), axis=-1)  # (B, Tq)
            seen = ops.logical_and(before > 0, ops.expand_dims(last >= 0, 0))
    elif value_mask is not None:
        seen = ops.any(as_bool_mask(value_mask), axis=-1, keepdims=True)  # (B, 1)
    if query_mask is not None:
        seen = merge_masks(seen, query_mask)
    return None if seen is None else ops.expand_dims(seen, -1)


def chosen_positions_mask(pointers, num_positions):
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
