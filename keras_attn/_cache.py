"""Cached decoding for `MultiHeadAttention`: the call with `cache=(key_cache, value_cache)`.

Self-attention (`cache_update_index=i`) writes the keys and values of the new
tokens at positions `i, i + 1, ...` of the cache and attends over all of it;
cross-attention (`cache_update_index=None`) attends over keys and values that
`compute_cache` made once. See `MultiHeadAttention` for the contract.
"""

import numpy as np
from keras import ops as kops

from keras_attn import ops
from keras_attn.base import check_dim, check_rank, finish_outputs


def call_cached(
    layer,
    query,
    value,
    key,
    query_mask,
    value_mask,
    attention_mask,
    use_causal_mask,
    return_attention_scores,
    training,
    cache,
    cache_update_index,
):
    """`layer(query, value, ..., cache=cache, cache_update_index=...)`, the layer's projections.

    Returns:
        `(output, [weights,] (key_cache, value_cache))`, the cache updated.
    """
    check_rank("query", query.shape, (3,))
    if not isinstance(cache, (tuple, list)) or len(cache) != 2:
        raise TypeError(
            "`cache` must be a pair `(key_cache, value_cache)`. "
            f"Received: cache={type(cache).__name__}"
        )
    key_cache, value_cache = cache  # (B, g, S, dk), (B, g, S, dv)
    check_rank("cache", key_cache.shape, (4,))
    query_length, cache_length = kops.shape(query)[1], kops.shape(key_cache)[2]
    index = cache_update_index
    _check_cache_index(index, query.shape[1], key_cache.shape[2])
    if index is None:  # cross-attention over precomputed keys and values
        if value is not None or key is not None:
            raise ValueError(
                "With `cache_update_index=None` the cache holds the keys and values: "
                "pass no `value` or `key`."
            )
        mask = ops.compute_attention_mask(
            query_length, cache_length, query_mask, value_mask, None, use_causal_mask
        )
        start = 0
    else:
        if value is None:
            raise ValueError("`value` (the new tokens) is required with `cache_update_index`.")
        key = value if key is None else key
        check_dim("query", query.shape[1], "value", value.shape[1], "length (new tokens)")
        k_new = layer._heads(layer._rotate(layer.key_dense(key), index))  # (B, g, Tq, dk)
        v_new = layer._heads(layer.value_dense(value))  # (B, g, Tq, dv)
        zero = kops.zeros((), "int32")
        start_indices = (zero, zero, kops.cast(index, "int32"), zero)
        key_cache = kops.slice_update(key_cache, start_indices, k_new)
        value_cache = kops.slice_update(value_cache, start_indices, v_new)
        mask = ops.cache_mask(
            query_length, cache_length, index, value_mask, use_causal_mask
        )  # (B or 1, Tq, S)
        mask = ops.merge_masks(
            mask, None if query_mask is None else kops.expand_dims(query_mask, -1)
        )
        start = index
    if attention_mask is not None:
        check_rank("attention_mask", attention_mask.shape, (3,))
        check_dim("attention_mask", attention_mask.shape[2], "cache", key_cache.shape[2],
                  "length (axis 2 of the mask, axis 2 of the cache)")  # fmt: skip
        mask = ops.merge_masks(mask, attention_mask)
    q = layer._heads(layer._rotate(layer.query_dense(query), start))  # (B, h, Tq, dk)
    implementation = layer._implementation(
        (query.shape[0], query.shape[1], key_cache.shape[2]), return_attention_scores, training
    )
    output, weights = layer._attend(
        q, key_cache, value_cache, mask, training, implementation, return_attention_scores
    )
    if weights is None:
        outputs = layer._finish(output, None if mask is None else ops.visible_rows(mask), False)
    else:
        outputs = finish_outputs(output, weights, mask, False, return_attention_scores)
    outputs = outputs if return_attention_scores else (outputs,)
    return (*outputs, (key_cache, value_cache))


def _check_cache_index(index, query_length, cache_length):
    """`ValueError` unless the new tokens fit in the cache, for a Python int `index`.

    `slice_update` would clamp an index past the end (writing the new keys
    over earlier ones, silently); a tensor index is only known at run time.
    """
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
        return
    # Lengths unknown at trace time (None, or symbolic in a JAX export) are not checked.
    fits = not isinstance(query_length, int) or not isinstance(cache_length, int)
    fits = fits or int(index) + query_length <= cache_length
    if index < 0 or not fits:
        raise ValueError(
            "`cache_update_index` must be >= 0, with `cache_update_index + Tq` <= the cache "
            f"length, so that the new tokens fit in the cache. Received: "
            f"cache_update_index={index}, Tq={query_length}, cache length={cache_length}"
        )
