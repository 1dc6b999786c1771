"""The key/value cache of `MultiHeadAttention`: keys, values, and which positions are valid keys.

A cached decoding step attends over keys and values kept from earlier steps.
The cache remembers, per position, whether it holds a real key: positions not
written yet, and padded tokens of a prompt (a left-padded prefill), stay
invalid, so step-by-step decoding sees exactly the keys a full pass would.

`RingKVCache` keeps the last `S` positions only, in a ring buffer (a
sliding-window model's generation in memory flat in its length): position `p`
sits in slot `p mod S`, and `ring_update` gives the keys a step attends over
with each slot's position, for the masks and the position biases to read.

keras-hub's blocks keep a cache as one tensor `(B, 2, S, g, d)`, keys and
values stacked, with no record of which positions are valid: `is_stacked`,
`KVCache.from_stacked`, `KVCache.to_stacked` and `written_before` convert it at
the edge of a layer that takes it (`TransformerDecoder`).

An int8 cache (`empty_cache(..., dtype="int8")`) holds its keys and values as
`Int8Heads`: int8 with a float32 scale per position and head (symmetric,
`absmax / 127`), quantized as they are written (`write`, `ring_update`) and
read back in the compute dtype (`dequantize`) before the attention.
"""

import functools
from typing import Any, NamedTuple

import keras
import numpy as np
from keras import ops

from keras_attn._execution import transpose, xla_traced
from keras_attn._typing import Length, TensorLike
from keras_attn.arguments import check_rank, dim


class Int8Heads(NamedTuple):
    """Keys or values stored as int8, with a float32 scale per position and head.

    `x ~ values * scale`: each position's head vector `x` (of `d` numbers) is
    stored as `round(x / scale)` in `[-127, 127]` with `scale = max|x| / 127`
    (symmetric absmax), so each number is read back within `max|x| / 254` of
    it (half a step; float32 rounding aside). A position written as padding
    (not valid) holds zeros and scale 0, whatever its keys held: a padded
    token's NaN, inf or huge key reaches neither its own read (exactly 0) nor
    any other position's scale (each position has its own). A non-finite real
    key is kept non-finite (its scale is NaN or inf), as a float cache keeps it.

    Bytes per position and head: `d + 4` against `4 d` in float32 (3.76x
    fewer at `d = 64`).

    A `NamedTuple` (a nest of two tensors through `tf.function`, `jax.jit` and
    the decoding loops), standing in a `KVCache` for its `key` or `value`;
    `shape` and `dtype` are the int8 tensor's.

    Args:
        values: int8 `(B, g, S, d)`.
        scale: float32 `(B, g, S, 1)`.
    """

    values: Any
    scale: Any

    @property
    def shape(self):
        return self.values.shape

    @property
    def dtype(self):
        return self.values.dtype

    @classmethod
    def zeros(cls, shape: tuple) -> "Int8Heads":
        """An int8 tensor of `shape` `(B, g, S, d)`, all zeros, with zero scales."""
        return cls(ops.zeros(shape, "int8"), ops.zeros((*shape[:3], 1), "float32"))


def quantize(x: TensorLike, valid: TensorLike | None = None) -> Int8Heads:
    """`x` `(B, g, T, d)` as `Int8Heads`: int8 with a float32 scale per position and head.

    Args:
        x: the keys or values, heads first, in any float dtype (quantized in float32).
        valid: bool `(B, T)`, the real positions (padding stored as zeros, scale 0), or
            `None`: all real.

    Returns:
        `Int8Heads(values, scale)`: `values * scale` within `max|x| / 254` of `x` per
        number, per position and head.
    """
    x = ops.cast(x, "float32")
    scale = ops.max(ops.abs(x), axis=-1, keepdims=True) / 127.0  # (B, g, T, 1)
    if valid is not None:  # padding: zeros, whatever it holds
        scale = ops.where(ops.expand_dims(ops.expand_dims(valid, 1), -1), scale, 0.0)
    steps = x / ops.where(scale > 0, scale, 1.0)  # in [-127, 127] (float rounding aside)
    # padding, and 0 / 0 or inf / inf of a non-finite vector: 0 (its scale keeps NaN or inf)
    steps = ops.where(ops.logical_and(ops.isfinite(steps), scale > 0), steps, 0.0)
    return Int8Heads(ops.cast(ops.clip(ops.round(steps), -127.0, 127.0), "int8"), scale)


def dequantize(heads: TensorLike, dtype: str) -> TensorLike:
    """`heads` read in `dtype`: an `Int8Heads` as `values * scale`, a float tensor cast."""
    if isinstance(heads, Int8Heads):
        return ops.cast(heads.values, dtype) * ops.cast(heads.scale, dtype)
    return ops.cast(heads, dtype)


def _stored(cache_heads: TensorLike, new: TensorLike, valid: TensorLike | None) -> TensorLike:
    """`new` `(B, g, T, d)` in the form of `cache_heads`: quantized for an `Int8Heads`."""
    if isinstance(cache_heads, Int8Heads):
        return quantize(new, valid)
    return ops.cast(new, cache_heads.dtype)


def _tensor(heads: TensorLike) -> TensorLike:
    """The tensor of `heads` that has its shape: an `Int8Heads`' int8 numbers."""
    return heads.values if isinstance(heads, Int8Heads) else heads


def _each(fn, *heads):
    """`fn` on the tensors of `heads` (plain tensors, or `Int8Heads` field by field)."""
    if isinstance(heads[0], Int8Heads):
        return Int8Heads(*(fn(*fields) for fields in zip(*heads, strict=True)))
    return fn(*heads)


def map_cache(fn, cache: "KVCache") -> "KVCache":
    """The cache (of its type) with `fn` applied to each of its tensors (an int8 cache's too)."""
    return type(cache)(*(_each(fn, part) for part in cache))


class KVCache(NamedTuple):
    """Keys and values of multi-head attention, and which of their positions are valid.

    A `NamedTuple`, so it passes through `tf.function`, `jax.jit`, Keras
    layers and `tf.while_loop`s as a plain nest of three tensors.

    Args:
        key: `(B, g, S, key_dim)`: the keys, heads first (rotated, when the
            layer has a rotary embedding); an `Int8Heads` in an int8 cache.
        value: `(B, g, S, value_dim)`; an `Int8Heads` in an int8 cache.
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

        Keys and values must have the same width (keras-hub's always do); not of an int8
        cache (`ValueError`).
        """
        if isinstance(self.key, Int8Heads):
            raise ValueError(
                "keras-hub's stacked cache holds float keys and values: an int8 cache "
                "(Int8Heads) has no such form. Received: an int8 KVCache"
            )
        return ops.stack([transpose(c, (0, 2, 1, 3)) for c in (self.key, self.value)], axis=1)


class RingKVCache(KVCache):
    """A `KVCache` that keeps the last `S` positions only: a ring buffer for a sliding window.

    Position `p` (the count of positions written before it, padding
    included) goes to slot `p mod S`, over position `p - S`; once the
    positions before `end` are written, slot `s` holds

        p_s = end - 1 - ((end - 1 - s) mod S)             (`ring_positions`)

    (negative: not written yet, and not valid). A layer whose
    `sliding_window = w <= S` lets a causal query at `p` see keys
    `p - w + 1 .. p` only, all of them still in the ring, so decoding through
    it equals decoding through a `KVCache` of every position, in memory that
    does not grow with the sequence. `MultiHeadAttention` tells it by its
    type: `cache_update_index` is the position of the first new token (not a
    slot: it grows past `S`), and the causal mask, the window and a position
    bias read each slot's `p_s` (`ring_update`); the rotary keys are
    written rotated at their position, as in a `KVCache`.

    The same three fields as `KVCache` (it is one, so code reading a
    `KVCache` reads it); make one from an empty cache.

    Returns:
        The tuple `(key, value, valid)`, as `KVCache`.

    Example:

    >>> mha = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, sliding_window=2)
    >>> x = keras.random.normal((1, 5, 8))
    >>> full = mha(x, x, use_causal_mask=True)
    >>> ring, steps = keras_attn.cache.RingKVCache(*mha.empty_cache(1, 2)), []
    >>> for i in range(5):
    ...     y, ring = mha(x[:, i : i + 1], x[:, i : i + 1], use_causal_mask=True,
    ...                   cache=ring, cache_update_index=i)
    ...     steps.append(y)
    >>> error = keras.ops.max(keras.ops.abs(keras.ops.concatenate(steps, 1) - full))
    >>> print(ring.key.shape, bool(error < 1e-5))
    (1, 2, 2, 4) True
    """

    __slots__ = ()


def as_kv_cache(cache: KVCache | tuple[TensorLike, TensorLike, TensorLike]) -> KVCache:
    """`cache` as a `KVCache`; a plain 3-tuple `(key, value, valid)` is accepted.

    Raises:
        TypeError: anything else (e.g. a `(key, value)` pair: a cache must say
            which positions are valid).
    """
    if isinstance(cache, KVCache):  # a `RingKVCache` too
        return cache
    if isinstance(cache, (tuple, list)) and len(cache) == 3:
        return KVCache(*cache)
    raise TypeError(
        "`cache` must be a keras_attn.KVCache(key, value, valid), from `empty_cache` or "
        "`compute_cache` (keras-hub's stacked cache tensor: the TransformerDecoder blocks). "
        f"Received: cache of type {type(cache).__name__}"
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
        key, value: the new keys and values, heads first (quantized into an int8
            cache, `quantize`).
        valid: bool `(B, Tq)`, which new tokens are real (padding is not), or
            `None` (all real).

    Returns:
        `(cache, in_range)`: the updated `KVCache`, and `None` or, for a tensor
        `index`, a scalar bool tensor: whether the new tokens fit (see
        `check_index`).
    """
    query_length = dim(key, 2)
    in_range = check_index(index, query_length, dim(_tensor(cache.key), 2))
    if in_range is None:  # an int index: static start indices, no op to build them
        zero, index = 0, int(index)
    else:
        zero, index = ops.zeros((), "int32"), ops.cast(index, "int32")
    start = (zero, zero, index, zero)
    cache_length = dim(_tensor(cache.key), 2)
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

    def update(old, new):
        return ops.slice_update(old, start, new)

    updated = KVCache(
        _each(update, cache.key, _stored(cache.key, key, valid)),
        _each(update, cache.value, _stored(cache.value, value, valid)),
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
        if keras.backend.backend() == "tensorflow" and not xla_traced():  # XLA drops it
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


def ring_positions(end: Length, length: int) -> TensorLike:
    """int32 `(length,)`: each slot's position in a `RingKVCache` of `length` slots.

    Once the positions before `end` are written, slot `s` holds the latest
    position congruent to it, `end - 1 - ((end - 1 - s) mod length)`; a
    negative one was never written.

    Example:

    >>> print(keras.ops.convert_to_numpy(ring_positions(6, 4)).tolist())
    [4, 5, 2, 3]
    """
    last = ops.cast(end, "int32") - 1
    return last - ops.mod(last - ops.arange(length, dtype="int32"), length)


def ring_update(
    cache: RingKVCache,
    index: Length,
    key: TensorLike,
    value: TensorLike,
    valid: TensorLike | None = None,
) -> tuple[RingKVCache, KVCache, TensorLike | None]:
    """The ring with `key`, `value` (`(B, g, Tq, d)`) written at positions `index, index + 1, ...`.

    One new token (a decoding step) goes to slot `index mod S`, in place, and
    attends over the ring itself, each slot at its position
    (`ring_positions`): the position it replaced, `index - S`, lies outside
    any window `w <= S`. Several (a prefill; a prompt longer than `S`) attend
    over the ring's positions in order (`index - S .. index - 1`; none when
    `index` is the int 0) followed by the new tokens: consecutive positions
    ending at the last new token, as the kernels' end-aligned masks and
    position biases take them (no per-key positions, no `(Tq, S)` tensor);
    then the last `S` of them are written, each to its slot.

    Args:
        cache: a `RingKVCache` of `S` slots.
        index: int or scalar integer tensor, the position of the first new token.
        key, value: the new keys and values, heads first (quantized into an int8 ring).
        valid: bool `(B, Tq)`, which new tokens are real, or `None` (all).

    Returns:
        `(ring, seen, positions)`: the updated `RingKVCache`; a `KVCache` of
        the keys, values and valid mask the new tokens attend over (the ring
        `(B, g, S, d)`, or up to `S` positions before the new tokens and
        them); and the int32 `(S,)` positions of the ring's keys, or `None`
        where the keys are consecutive positions ending at the last new token.
    """
    length, query_length = dim(_tensor(cache.key), 2), dim(key, 2)
    static = isinstance(index, (int, np.integer))
    if isinstance(query_length, int) and query_length == 1:
        slot = index % length if static else ops.mod(ops.cast(index, "int32"), length)
        ring = RingKVCache(*write(cache, slot, key, value, valid)[0])
        return ring, ring, ring_positions(ops.cast(index, "int32") + 1, length)
    first_write = static and int(index) == 0
    index = ops.cast(index, "int32")
    if valid is None:
        valid = ops.ones((dim(key, 0), query_length), "bool")
    key, value = _stored(cache.key, key, valid), _stored(cache.value, value, valid)
    if first_write:  # nothing written before: the new tokens alone
        seen = KVCache(key, value, valid)
    else:  # the ring in position order (slot (index + j) mod S holds index - S + j), then them
        order = ops.mod(ops.arange(length, dtype="int32") + index, length)  # (S,)

        def in_order(old, new):
            return ops.concatenate([ops.take(old, order, axis=2), new], axis=2)

        seen = KVCache(
            _each(in_order, cache.key, key),
            _each(in_order, cache.value, value),
            ops.concatenate([ops.take(cache.valid, order, axis=1), valid], axis=1),
        )
    # Slot s keeps its key, or takes the last new token j congruent to it,
    # j = r + S * ((Tq - 1 - r) // S) with r = (s - index) mod S, where r < Tq: one gather
    # from [ring, new tokens] (never empty, whatever Tq).
    first = ops.mod(ops.arange(length, dtype="int32") - index, length)  # (S,)
    last = first + length * ops.floor_divide(query_length - 1 - first, length)
    source = ops.where(first < query_length, length + last, ops.arange(length, dtype="int32"))

    def kept(axis):
        return lambda old, new: ops.take(ops.concatenate([old, new], axis=axis), source, axis=axis)

    ring = RingKVCache(
        _each(kept(2), cache.key, key), _each(kept(2), cache.value, value),
        kept(1)(cache.valid, valid),
    )  # fmt: skip
    return ring, seen, None
