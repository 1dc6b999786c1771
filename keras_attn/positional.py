"""Additive position encodings: sinusoidal and learned; helpers shared with rotary.

Both layers return an encoding shaped like their input, for the caller to add;
the sequence runs along the second-to-last axis and the features along the
last, as keras-hub's `SinePositionEncoding` and `PositionEmbedding` (so
`(B, T, d)`, or `(B, ..., T, d)` for more axes). Positions are
`start_index, start_index + 1, ...` (a cached decoder fed one token at a time)
or any `positions=` of shape `(T,)` or `(B, T)`. The layers pass an incoming
implicit mask through; add an encoding with `keras.layers.Add()` to keep it (a
plain `x + pe(x)` is an op, not a layer, and drops Keras' implicit mask).
`RotaryEmbedding` lives in `keras_attn.rotary`, `TokenAndPositionEmbedding` in
`keras_attn.embeddings`.
"""

import keras
import numpy as np
from keras import ops

from keras_attn._execution import xla_traced
from keras_attn._typing import InitializerLike, TensorLike
from keras_attn.arguments import check_floating, check_positive_int, check_positive_number


def check_min_rank(name, shape, rank):
    if len(shape) < rank:
        raise ValueError(
            f"`{name}` must have rank >= {rank}. Received: {name}.shape={tuple(shape)}"
        )


def check_width(name, shape, even=False):
    if shape[-1] is None or (even and shape[-1] % 2):
        what = "known and even" if even else "known"
        raise ValueError(
            f"The last axis of `{name}` must be {what}. Received: {name}.shape={tuple(shape)}"
        )


class PositionLayer(keras.layers.Layer):
    """Shared by the encodings: passes the mask through, output shaped like the input."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)


def static_int(x):
    """`x` as a Python int when its value is known now (an int or an eager scalar), else None."""
    if isinstance(x, (int, np.integer)):
        return int(x)
    try:
        return int(x)  # an eager tensor; a traced one raises
    except Exception:
        return None


def static_array(x):
    """`x` as a NumPy array when its values are known now (array, list, eager tensor), else None."""
    if isinstance(x, (np.ndarray, list, tuple)):
        return np.asarray(x)
    try:
        return np.asarray(ops.convert_to_numpy(x))  # a traced tensor raises
    except Exception:
        return None


def check_positions(positions, length, start_index):
    """`positions` as a tensor `(T,)` or `(B, T)`; refuses a `start_index` next to it.

    `positions` replaces `start_index` (keras-hub ignores `start_index` then);
    a `start_index` other than 0 given with it is a contradiction, refused.
    """
    if static_int(start_index) != 0:
        raise ValueError(
            "Pass `positions` or `start_index`, not both: `positions` gives every "
            f"step's position. Received: start_index={start_index!r} with positions"
        )
    positions = ops.convert_to_tensor(positions)
    shape = tuple(positions.shape)
    if len(shape) not in (1, 2):
        raise ValueError(
            f"`positions` must have shape (T,) or (B, T). Received: positions.shape={shape}"
        )
    if shape[-1] is not None and length is not None and shape[-1] != length:
        raise ValueError(
            "The last axis of `positions` must be the sequence length of `inputs` "
            f"({length}). Received: positions.shape={shape}"
        )
    return positions


def step_positions(length, start_index):
    """`start_index + [0, 1, ..., length - 1]` as float32 `(T,)`."""
    return ops.arange(length, dtype="float32") + ops.cast(start_index, "float32")


def inverse_frequencies(max_wavelength, depth):
    """`max_wavelength^(-2i/depth)` for `i = 0 .. ceil(depth/2) - 1`, float32."""
    exponents = np.arange(0, depth, 2, dtype="float64") / depth
    return ops.convert_to_tensor(np.power(float(max_wavelength), -exponents), "float32")


def broadcast_encoding(encoding, inputs):
    """A `(T, d)` or `(B|1, T, d)` encoding broadcast to `inputs` `(B, ..., T, d)`, in its dtype."""
    if len(encoding.shape) == 3:
        for _ in range(len(inputs.shape) - 3):
            encoding = ops.expand_dims(encoding, 1)  # (B|1, 1, ..., T, d)
    return ops.broadcast_to(ops.cast(encoding, inputs.dtype), ops.shape(inputs))


@keras.saving.register_keras_serializable(package="keras_attn")
class SinePositionEncoding(PositionLayer):
    """Fixed sinusoidal position encoding (Vaswani et al.), sin and cos interleaved.

    `PE(pos, 2i) = sin(pos / max_wavelength^(2i/d))`,
    `PE(pos, 2i+1) = cos(pos / max_wavelength^(2i/d))`: even channels sin, odd
    channels cos, the channel layout of keras-hub's `SinePositionEncoding`
    (equal outputs, tested). No weights; any length, any `d` (odd too); angles
    are computed in float32. Returns the encoding for the caller to add.

    Args:
        max_wavelength: the base of the geometric progression of wavelengths.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(B, T, d)` or `(B, ..., T, d)`: the sequence is the
            second-to-last axis. Only its shape and dtype are used.
        start_index: position of the first step (int or scalar tensor).
        positions: `None`, or every step's position, `(T,)` or `(B, T)` (int
            or float); replaces `start_index`.

    Returns:
        The encoding of positions `start_index .. start_index + T - 1` (or of
        `positions`), broadcast to `inputs`' shape and dtype.

    Example:

    >>> x = keras.random.normal((2, 10, 16))
    >>> print(keras_attn.SinePositionEncoding()(x).shape)
    (2, 10, 16)
    >>> pe = keras_attn.SinePositionEncoding()(x[:, :2], positions=np.array([7, 3]))
    >>> print(pe.shape)  # the encodings of positions 7 and 3
    (2, 2, 16)

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762
    """

    def __init__(self, max_wavelength: float = 10000, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = check_positive_number("max_wavelength", max_wavelength)

    def build(self, inputs_shape):
        check_min_rank("inputs", inputs_shape, 3)
        check_width("inputs", inputs_shape)
        self.built = True

    def call(
        self,
        inputs: TensorLike,
        start_index: int | TensorLike = 0,
        positions: TensorLike | None = None,
    ) -> TensorLike:
        check_floating("inputs", inputs)
        depth = inputs.shape[-1]
        if positions is None:
            positions = step_positions(ops.shape(inputs)[-2], start_index)  # (T,)
        else:
            positions = check_positions(positions, inputs.shape[-2], start_index)
        # Channels 2i and 2i+1 share the frequency max_wavelength^(-2i/d).
        frequencies = ops.repeat(inverse_frequencies(self.max_wavelength, depth), 2)[:depth]
        angles = ops.expand_dims(ops.cast(positions, "float32"), -1) * frequencies
        is_even = ops.arange(depth) % 2 == 0
        encoding = ops.where(is_even, ops.sin(angles), ops.cos(angles))  # ([B,] T, d)
        return broadcast_encoding(encoding, inputs)

    def get_config(self):
        config = super().get_config()
        config.update(max_wavelength=self.max_wavelength)
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class PositionEmbedding(PositionLayer):
    """Learned absolute position embedding: `PE(pos) = P[pos]`.

    A trainable table `P` (the attribute `position_embeddings`, a variable
    named `embeddings`, as keras-hub's `PositionEmbedding`, whose weights load
    with `set_weights`) of shape `(sequence_length, d)`; row `pos` encodes
    position `pos`. Returns the rows of the input's positions, for the caller
    to add.

    Args:
        sequence_length: the number of rows, i.e. the longest sequence.
        initializer: initializer of the table.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, d)` or `(B, ..., T, d)`: the sequence is the
            second-to-last axis. Only its shape and dtype are used.
        start_index: position of the first step (int or scalar tensor).
        positions: `None`, or every step's position, int `(T,)` or `(B, T)`;
            replaces `start_index`.

    Returns:
        Rows `start_index .. start_index + T - 1` of the table (or the rows of
        `positions`), broadcast to `inputs`' shape.

        Outside the table: when the positions are known at call time (eager
        calls, static shapes, an int or eager `start_index`, eager
        `positions`), a position `< 0` or `>= sequence_length` raises
        `ValueError`. When they are only known at run time (a compiled
        function with a dynamic length or tensor positions), a TensorFlow
        graph raises `InvalidArgumentError` with the same message; where no
        run-time check can run (XLA, i.e. `jit_compile=True`, and traced
        positions under JAX), the rows outside are NaN. Never a silently
        clamped or repeated row.

    Example:

    >>> x = keras.random.normal((2, 10, 16))
    >>> layer = keras_attn.PositionEmbedding(sequence_length=64)
    >>> print(layer(x).shape, layer.position_embeddings.shape)
    (2, 10, 16) (64, 16)
    >>> print(layer(x[:, :2], positions=np.array([5, 9])).shape)
    (2, 2, 16)

    Reference:
        Gehring et al., 2017, "Convolutional Sequence to Sequence Learning",
        https://arxiv.org/abs/1705.03122
    """

    def __init__(
        self, sequence_length: int, initializer: InitializerLike = "glorot_uniform", **kwargs
    ):
        super().__init__(**kwargs)
        self.sequence_length = check_positive_int("sequence_length", sequence_length)
        self.initializer = keras.initializers.get(initializer)

    def _check_length(self, length, start_index=0):
        """`ValueError` when the positions are known now and not all in the table."""
        if start_index is not None and start_index < 0:
            raise ValueError(f"`start_index` must be >= 0. Received: start_index={start_index}")
        if length is None or start_index is None:
            return
        if start_index + length > self.sequence_length:
            raise ValueError(
                "The input sequence does not fit in `sequence_length` positions. Received: "
                f"input length={length}, start_index={start_index}, "
                f"sequence_length={self.sequence_length}"
            )

    def _check_positions_fit(self, positions):
        """`ValueError` when `positions` are known now and one lies outside the table."""
        values = static_array(positions)
        if values is None or values.size == 0:
            return
        if values.min() < 0 or values.max() >= self.sequence_length:
            raise ValueError(
                f"`positions` must lie in [0, sequence_length={self.sequence_length}). "
                f"Received: positions from {values.min()} to {values.max()}"
            )

    def _assert_fits(self, first, end, message):
        """The run-time form of the checks, in a TensorFlow graph (XLA skips it):
        `0 <= first` and `end <= sequence_length`.

        Other backends have no run-time assertion: there the rows outside the
        table are NaN (see `call`); neither has a trace for XLA, which drops
        TensorFlow's asserts (with a warning each).
        """
        if keras.backend.backend() != "tensorflow" or xla_traced():
            return
        import tensorflow as tf

        tf.debugging.assert_non_negative(tf.cast(first, "int32"), message=message)
        end = tf.cast(end, "int32")
        tf.debugging.assert_less_equal(end, self.sequence_length, message=message)

    def build(self, inputs_shape):
        check_min_rank("inputs", inputs_shape, 3)
        check_width("inputs", inputs_shape)
        self._check_length(inputs_shape[-2])
        self.position_embeddings = self.add_weight(
            shape=(self.sequence_length, inputs_shape[-1]),
            initializer=self.initializer,
            name="embeddings",
        )
        self.built = True

    def call(
        self,
        inputs: TensorLike,
        start_index: int | TensorLike = 0,
        positions: TensorLike | None = None,
    ) -> TensorLike:
        check_floating("inputs", inputs)
        width = self.position_embeddings.shape[1]
        if inputs.shape[-1] != width:
            raise ValueError(
                f"`inputs` must have width {width}, the width this layer "
                f"was built for. Received: inputs.shape={tuple(inputs.shape)}"
            )
        length = ops.shape(inputs)[-2]
        if positions is None:
            start = static_int(start_index)
            self._check_length(inputs.shape[-2], start)
            first = ops.cast(start_index, "int32")
            if start is None or inputs.shape[-2] is None:  # only known at run time
                message = (
                    "The input sequence does not fit in `sequence_length` positions "
                    f"(start_index + input length <= sequence_length={self.sequence_length})"
                )
                self._assert_fits(first, first + length, message)
            positions = ops.arange(length, dtype="int32") + first  # (T,)
        else:
            positions = check_positions(positions, inputs.shape[-2], start_index)
            if keras.backend.is_float_dtype(positions.dtype):
                raise TypeError(
                    "`positions` must be integers (rows of the table). Received: "
                    f"positions.dtype={keras.backend.standardize_dtype(positions.dtype)}"
                )
            positions = ops.cast(positions, "int32")  # ([B,] T)
            if static_array(positions) is None:
                message = f"`positions` must lie in [0, sequence_length={self.sequence_length})"
                self._assert_fits(ops.min(positions), ops.max(positions) + 1, message)
            else:
                self._check_positions_fit(positions)
        inside = ops.logical_and(positions >= 0, positions < self.sequence_length)
        table = ops.convert_to_tensor(self.position_embeddings)
        rows = ops.take(table, ops.clip(positions, 0, self.sequence_length - 1), axis=0)
        rows = ops.where(ops.expand_dims(inside, -1), rows, float("nan"))  # ([B,] T, d)
        return broadcast_encoding(rows, inputs)

    def get_config(self):
        config = super().get_config()
        config.update(
            sequence_length=self.sequence_length,
            initializer=keras.initializers.serialize(self.initializer),
        )
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class SinusoidalPositionalEncoding(SinePositionEncoding):
    """`SinePositionEncoding` under its former name: the files saved under that name load.

    The same layer. Keras keys a model's weights by each layer's snake-cased
    class name, so this subclass keeps `sinusoidal_positional_encoding` for the `.keras`
    and weights files written before the rename; new code writes
    `SinePositionEncoding`, whose files load into keras-hub's and back.
    """


@keras.saving.register_keras_serializable(package="keras_attn")
class LearnedPositionalEmbedding(PositionEmbedding):
    """`PositionEmbedding` under its former name: the files saved under that name load.

    The same layer. Keras keys a model's weights by each layer's snake-cased
    class name, so this subclass keeps `learned_positional_embedding` for the `.keras`
    and weights files written before the rename; new code writes
    `PositionEmbedding`, whose files load into keras-hub's and back.
    """
