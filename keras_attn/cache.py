"""The key/value cache of `MultiHeadAttention`: keys, values, and which positions are valid keys.

A cached decoding step attends over keys and values kept from earlier steps.
The cache remembers, per position, whether it holds a real key: positions not
written yet, and padded tokens of a prompt (a left-padded prefill), stay
invalid, so step-by-step decoding sees exactly the keys a full pass would.

keras-hub's blocks keep a cache as one tensor `(B, 2, S, g, d)`, keys and
values stacked, with no record of which positions are valid: `is_stacked`,
`KVCache.from_stacked`, `KVCache.to_stacked` and `written_before` convert it at
the edge of a layer that takes it (`TransformerDecoder`).
"""

import functools
from typing import Any, NamedTuple

import keras
import numpy as np
from keras import ops

from keras_attn._execution import transpose
from keras_attn._typing import Length, TensorLike
from keras_attn.arguments import check_rank, dim


class KVCache(NamedTuple):
    """Keys and values of multi-head attention, and which of their positions are valid.

    A `NamedTuple`, so it passes through `tf.function`, `jax.jit`, Keras
    layers and `tf.while_loop`s as a plain nest of three tensors.

    Args:
        key: `(B, g, S, key_dim)`: the keys, heads first (rotated, when the
            layer has a rotary embedding).
        value: `(B, g, S, value_dim)`.
        valid: bool `(B, S)`: `True` where the position holds a real key.

    Made by `MultiHeadAttention.empty_cache` (self-attention: nothing valid
    yet) or `MultiHeadAttention.compute_cache` (cross-attention: the source,
    valid where its padding mask is), and returned, updated, by every cached
    call.

    Returns:
        The tuple `(key, value, valid)`, with the fields by name.

    Example:

    >>> mha = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    >>> x = keras.random.normal((1, 3, 8))
    >>> _ = mha(x, x)
    >>> cache = mha.empty_cache(batch_size=1, length=3)
    >>> y, cache = mha(x[:, :1], x[:, :1], use_causal_mask=True, cache=cache, cache_update_index=0)
    >>> print(cache.key.shape, keras.ops.convert_to_numpy(cache.valid).tolist())
    (1, 2, 3, 4) [[True, False, False]]
    """

    key: Any
    value: Any
    valid: Any

    @property
    def length(self) -> int | None:
        """`S`, the number of positions (static, or `None` if unknown)."""
        return self.key.shape[2]

    @classmethod
    def from_stacked(
        cls, tensor: TensorLike, valid: TensorLike | None = None, *, name: str = "cache"
    ) -> "KVCache":
        """A cache in keras-hub's form, one tensor `(B, 2, S, g, d)`, as a `KVCache`.

        keras-hub stacks the keys and values on axis 1, heads after positions;
        a `KVCache` keeps them apart, heads first.

        Args:
            tensor: `(B, 2, S, g, d)`: keys (`tensor[:, 0]`) and values.
            valid: bool `(B, S)`, which positions hold real keys (e.g.
                `written_before(tensor, index)` for a self-attention cache),
                or `None`: all of them.
            name: the argument `tensor` came in, for the error message.

        Returns:
            A `KVCache`: keys and values `(B, g, S, d)`, and `valid`.

        Raises:
            ValueError: `tensor` is not of rank 5 with 2 on axis 1.

        Example:

        >>> stacked = keras.ops.zeros((1, 2, 3, 2, 4))  # keras-hub's zero cache
        >>> cache = keras_attn.KVCache.from_stacked(stacked)
        >>> print(cache.key.shape, keras.ops.convert_to_numpy(cache.valid).tolist())
        (1, 2, 3, 4) [[True, True, True]]
        >>> print(cache.to_stacked().shape)
        (1, 2, 3, 2, 4)
        """
        check_rank(name, tensor.shape, (5,))
        if tensor.shape[1] not in (None, 2):
            raise ValueError(
                f"`{name}` in keras-hub's form must have shape (batch, 2, length, heads, head_dim) "
                f"(keys and values stacked on axis 1). Received: {name}.shape={tuple(tensor.shape)}"
            )
        key, value = (transpose(tensor[:, i], (0, 2, 1, 3)) for i in (0, 1))  # (B, g, S, d)
        if valid is None:
            valid = ops.ones((dim(tensor, 0), dim(tensor, 2)), "bool")
        return cls(key, value, valid)

    def to_stacked(self) -> TensorLike:
        """The cache in keras-hub's form, `(B, 2, S, g, d)`: `valid` is dropped.

        Keys and values must have the same width (keras-hub's always do).
        """
        return ops.stack([transpose(c, (0, 2, 1, 3)) for c in (self.key, self.value)], axis=1)


def as_kv_cache(cache: KVCache | tuple[TensorLike, TensorLike, TensorLike]) -> KVCache:
    """`cache` as a `KVCache`; a plain 3-tuple `(key, value, valid)` is accepted.

    Raises:
        TypeError: anything else (e.g. a `(key, value)` pair: a cache must say
            which positions are valid).
    """
    if isinstance(cache, KVCache):
        return cache
    if isinstance(cache, (tuple, list)) and len(cache) == 3:
        return KVCache(*cache)
    raise TypeError(
        "`cache` must be a keras_attn.KVCache(key, value, valid), from `empty_cache` or "
        f"`compute_cache`. Received: cache of type {type(cache).__name__}"
        + (f" with {len(cache)} items" if isinstance(cache, (tuple, list)) else "")
    )


def is_stacked(cache: KVCache | TensorLike | None) -> bool:
    """Whether `cache` is in keras-hub's form, one tensor (not `None`, a `KVCache` or a tuple)."""
    return cache is not None and not isinstance(cache, (tuple, list))


def written_before(stacked: TensorLike, index: Length) -> TensorLike:
    """bool `(B, S)`: the positions of a keras-hub cache `(B, 2, S, g, d)` before `index`.

    keras-hub's cache cannot say which positions are valid: a self-attention
    cache holds real tokens before the position being written, and nothing
    from it on. Static sizes and an int `index` give a NumPy constant.
    """
    batch, length = stacked.shape[0], stacked.shape[2]
    if all(isinstance(n, int) and not isinstance(n, bool) for n in (batch, length, index)):
        # one constant, not six ops a step
        return np.broadcast_to(positions_between(0, index, length), (batch, length))
    shape = ops.shape(stacked)  # once: traced on TensorFlow, each call is a Shape op and slices
    before = ops.arange(shape[2], dtype="int32") < ops.cast(index, "int32")
    return ops.broadcast_to(ops.expand_dims(before, 0), (shape[0], shape[2]))


def write(
    cache: KVCache,
    index: Length,
    key: TensorLike,
    value: TensorLike,
    valid: TensorLike | None = None,
) -> tuple[KVCache, TensorLike | None]:
    """The cache with `key`, `value` (`(B, g, Tq, d)`) written at positions `index, index + 1, ...`.

    Args:
        cache: a `KVCache`.
        index: int or scalar integer tensor, the position of the first new token.
        key, value: the new keys and values, heads first.
        valid: bool `(B, Tq)`, which new tokens are real (padding is not), or
            `None` (all real).

    Returns:
        `(cache, in_range)`: the updated `KVCache`, and `None` or, for a tensor
        `index`, a scalar bool tensor: whether the new tokens fit (see
        `check_index`).
    """
    query_length = dim(key, 2)
    in_range = check_index(index, query_length, dim(cache.key, 2))
    if in_range is None:  # an int index: static start indices, no op to build them
        zero, index = 0, int(index)
    else:
        zero, index = ops.zeros((), "int32"), ops.cast(index, "int32")
    start = (zero, zero, index, zero)
    cache_length = dim(cache.key, 2)
    static = in_range is None and isinstance(query_length, int) and isinstance(cache_length, int)
    if valid is None and static:  # every new token real, static positions: one op
        new_valid = ops.logical_or(
            cache.valid, positions_between(index, index + query_length, cache_length)
        )
    else:
        if valid is None:
            valid = ops.ones((dim(key, 0), query_length), "bool")
        # slice_update of a bool tensor is not supported on every backend: as int32.
        new_valid = ops.slice_update(
            ops.cast(cache.valid, "int32"), (zero, index), ops.cast(valid, "int32")
        )
        new_valid = ops.cast(new_valid, "bool")
    updated = KVCache(
        ops.slice_update(cache.key, start, ops.cast(key, cache.key.dtype)),
        ops.slice_update(cache.value, start, ops.cast(value, cache.value.dtype)),
        new_valid,
    )
    return updated, in_range


@functools.lru_cache(maxsize=64)
def positions_between(start, stop, length):
    """bool `(length,)` NumPy constant: `start <= position < stop` (static ints, made once)."""
    positions = np.arange(length)
    written = (positions >= start) & (positions < stop)
    written.flags.writeable = False
    return written


def check_index(index: Length, query_length: Length, cache_length: Length) -> TensorLike | None:
    """`index + Tq <= S` and `index >= 0`: the new tokens must fit in the cache.

    `slice_update` would clamp an index past the end (writing the new keys
    over earlier ones, silently). A Python or NumPy int raises `ValueError`
    here. A tensor index is checked when the step runs: on TensorFlow an
    assertion fails (eagerly and in a `tf.function`), and on every backend the
    returned flag turns the step's output into NaN (under `jax.jit` or XLA no
    error can be raised). On torch, which runs eagerly, a tensor index is read
    and checked as an int.

    Args:
        index: the `cache_update_index`.
        query_length, cache_length: `Tq` and `S`, ints where static.

    Returns:
        `None` for an int index, else a scalar bool tensor, `True` when it fits.
    """
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
        if not hasattr(index, "dtype") or not keras.backend.is_int_dtype(
            keras.backend.standardize_dtype(index.dtype)
        ):
            raise TypeError(
                "`cache_update_index` must be an int or a scalar integer tensor. "
                f"Received: cache_update_index={index!r}"
            )
        if keras.backend.backend() == "torch" and index.device.type != "meta":
            return check_index(int(index), query_length, cache_length)
        index = ops.cast(index, "int32")
        in_range = ops.logical_and(index >= 0, index + query_length <= cache_length)
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            tf.debugging.Assert(
                in_range,
                ["`cache_update_index + Tq` must be <= the cache length; index:", index],
            )
        return in_range
    # Lengths unknown at trace time (None, or symbolic in a JAX export) are not checked.
    fits = not isinstance(query_length, int) or not isinstance(cache_length, int)
    fits = fits or int(index) + query_length <= cache_length
    if index < 0 or not fits:
        raise ValueError(
            "`cache_update_index` must be >= 0, with `cache_update_index + Tq` <= the cache "
            f"length, so that the new tokens fit in the cache. Received: "
            f"cache_update_index={index}, Tq={query_length}, cache length={cache_length}"
        )
    return None
