"""Position information: sinusoidal, learned and rotary encodings.

Positions run along axis 1, features along the last axis. Every layer takes
`start_index`, so a cached decoder fed one token at a time encodes positions
`start_index, start_index + 1, ...`. The layers pass an incoming implicit mask
through; add an encoding with `keras.layers.Add()` to keep it (a plain
`x + pe(x)` is an op, not a layer, and drops Keras' implicit mask).
"""

import keras
import numpy as np
from keras import ops

from keras_attn.arguments import (
    check_floating,
    check_positive_int,
    check_positive_number,
    clone_initializer,
)


def _check_input_shape(name, shape, ranks, even=False, width=True):
    if len(shape) not in ranks:
        expected = " or ".join(str(r) for r in ranks)
        raise ValueError(
            f"`{name}` must have rank {expected}. Received: {name}.shape={tuple(shape)}"
        )
    if width and (shape[-1] is None or (even and shape[-1] % 2)):
        what = "known and even" if even else "known"
        raise ValueError(
            f"The last axis of `{name}` must be {what}. Received: {name}.shape={tuple(shape)}"
        )


class _PositionLayer(keras.layers.Layer):
    """Shared by the encodings: passes the mask through, output shaped like the input."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)


def _static_int(x):
    """`x` as a Python int when its value is known now (an int or an eager scalar), else None."""
    if isinstance(x, (int, np.integer)):
        return int(x)
    try:
        return int(x)  # an eager tensor; a traced one raises
    except Exception:
        return None


def _positions(length, start_index):
    """`start_index + [0, 1, ..., length - 1]` as float32 `(T,)`."""
    return ops.arange(length, dtype="float32") + ops.cast(start_index, "float32")


def _inverse_frequencies(max_wavelength, depth):
    """`max_wavelength^(-2i/depth)` for `i = 0 .. ceil(depth/2) - 1`, float32."""
    exponents = np.arange(0, depth, 2, dtype="float64") / depth
    return ops.convert_to_tensor(np.power(float(max_wavelength), -exponents), "float32")


@keras.saving.register_keras_serializable(package="keras_attn")
class SinusoidalPositionalEncoding(_PositionLayer):
    """Fixed sinusoidal position encoding (Vaswani et al.), interleaved.

    `PE(pos, 2i) = sin(pos / max_wavelength^(2i/d))`,
    `PE(pos, 2i+1) = cos(pos / max_wavelength^(2i/d))`: even channels sin, odd
    channels cos. No weights; any length, any `d` (odd too). Returns the
    encoding for the caller to add.

    Args:
        max_wavelength: the base of the geometric progression of wavelengths.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(B, T, d)`; only its shape and dtype are used.
        start_index: position of the first step (int or scalar tensor).

    Returns:
        The encoding of positions `start_index .. start_index + T - 1`,
        broadcast to `inputs`' shape and dtype.

    Example:

    >>> x = keras.random.normal((2, 10, 16))
    >>> print(keras_attn.SinusoidalPositionalEncoding()(x).shape)
    (2, 10, 16)

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762
    """

    def __init__(self, max_wavelength=10000, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = check_positive_number("max_wavelength", max_wavelength)

    def build(self, inputs_shape):
        _check_input_shape("inputs", inputs_shape, (3,))
        self.built = True

    def call(self, inputs, start_index=0):
        check_floating("inputs", inputs)
        depth = inputs.shape[-1]
        # Channels 2i and 2i+1 share the frequency max_wavelength^(-2i/d).
        frequencies = ops.repeat(_inverse_frequencies(self.max_wavelength, depth), 2)
        positions = _positions(ops.shape(inputs)[1], start_index)
        angles = ops.outer(positions, frequencies[:depth])  # (T, d)
        is_even = ops.arange(depth) % 2 == 0
        encoding = ops.where(is_even, ops.sin(angles), ops.cos(angles))
        return ops.broadcast_to(ops.cast(encoding, inputs.dtype), ops.shape(inputs))

    def get_config(self):
        config = super().get_config()
        config.update(max_wavelength=self.max_wavelength)
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class LearnedPositionalEmbedding(_PositionLayer):
    """Learned absolute position embedding: `PE(pos) = P[pos]`.

    A trainable table `P` of shape `(sequence_length, d)`; row `pos` encodes
    position `pos`. Returns the rows of the input's positions, for the caller
    to add.

    Args:
        sequence_length: the number of rows, i.e. the longest sequence.
        initializer: initializer of the table.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, d)`; only its shape and dtype are used.
        start_index: position of the first step (int or scalar tensor).

    Returns:
        Rows `start_index .. start_index + T - 1` of the table, broadcast to
        `inputs`' shape.

        Past the end of the table: when `T` and `start_index` are known at
        call time (eager calls, static shapes, an int or eager
        `start_index`), `start_index + T > sequence_length` or a negative
        `start_index` raises `ValueError`. When they are only known at run
        time (a compiled function with a dynamic length or a tensor
        `start_index`), a TensorFlow graph raises `InvalidArgumentError` with
        the same message; where no run-time check can run (XLA, i.e.
        `jit_compile=True`, and a traced `start_index` under JAX), the rows
        past the end are NaN. Never a silently clamped or repeated row.

    Example:

    >>> x = keras.random.normal((2, 10, 16))
    >>> print(keras_attn.LearnedPositionalEmbedding(sequence_length=64)(x).shape)
    (2, 10, 16)

    Reference:
        Gehring et al., 2017, "Convolutional Sequence to Sequence Learning",
        https://arxiv.org/abs/1705.03122
    """

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
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

    def _assert_fits(self, end):
        """The run-time form of `_check_length`, in a TensorFlow graph (XLA skips it).

        Other backends have no run-time assertion: there the rows past the
        table are NaN (see `call`).
        """
        if keras.backend.backend() != "tensorflow":
            return
        import tensorflow as tf

        tf.debugging.assert_less_equal(
            tf.cast(end, "int32"),
            self.sequence_length,
            message="The input sequence does not fit in `sequence_length` positions "
            f"(start_index + input length <= sequence_length={self.sequence_length})",
        )

    def build(self, inputs_shape):
        _check_input_shape("inputs", inputs_shape, (3,))
        self._check_length(inputs_shape[1])
        self.embeddings = self.add_weight(
            shape=(self.sequence_length, inputs_shape[-1]),
            initializer=self.initializer,
            name="embeddings",
        )
        self.built = True

    def call(self, inputs, start_index=0):
        check_floating("inputs", inputs)
        if inputs.shape[-1] != self.embeddings.shape[1]:
            raise ValueError(
                f"`inputs` must have width {self.embeddings.shape[1]}, the width this layer "
                f"was built for. Received: inputs.shape={tuple(inputs.shape)}"
            )
        start = _static_int(start_index)
        self._check_length(inputs.shape[1], start)
        length, first = ops.shape(inputs)[1], ops.cast(start_index, "int32")
        if start is None or inputs.shape[1] is None:  # only known at run time
            self._assert_fits(first + length)
        positions = ops.arange(length, dtype="int32") + first  # (T,)
        inside = ops.logical_and(positions >= 0, positions < self.sequence_length)
        rows = ops.take(self.embeddings, ops.clip(positions, 0, self.sequence_length - 1), axis=0)
        rows = ops.where(ops.expand_dims(inside, -1), rows, float("nan"))  # (T, d)
        return ops.broadcast_to(ops.cast(rows, inputs.dtype), ops.shape(inputs))

    def get_config(self):
        config = super().get_config()
        config.update(
            sequence_length=self.sequence_length,
            initializer=keras.initializers.serialize(self.initializer),
        )
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class RotaryEmbedding(_PositionLayer):
    """Rotary position embedding (RoPE, RoFormer), interleaved pairs.

    Each pair `(x_2i, x_2i+1)` is rotated by the angle `m * theta_i`, with `m`
    the position divided by `scaling_factor` and
    `theta_i = max_wavelength^(-2i/d)`:

        y_2i   = x_2i cos(m theta_i) - x_2i+1 sin(m theta_i)
        y_2i+1 = x_2i sin(m theta_i) + x_2i+1 cos(m theta_i)

    so that `<R(m) q, R(n) k>` depends on `m - n` only. Apply it to queries and
    keys before the score. Angles are computed in float32. No weights.

    Args:
        max_wavelength: the base of the frequencies `theta_i`.
        scaling_factor: positions are divided by it (linear position
            interpolation for contexts longer than in training).
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, d)` or `(B, T, H, d)`, `d` even.
        start_index: position of the first step (int or scalar tensor).

    Returns:
        `inputs` rotated, same shape and dtype.

    Example:

    >>> q = keras.random.normal((2, 10, 4, 16))  # (B, T, H, dk)
    >>> print(keras_attn.RotaryEmbedding()(q).shape)
    (2, 10, 4, 16)

    Reference:
        Su et al., 2021, "RoFormer: Enhanced Transformer with Rotary Position
        Embedding", https://arxiv.org/abs/2104.09864
    """

    def __init__(self, max_wavelength=10000, scaling_factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = check_positive_number("max_wavelength", max_wavelength)
        self.scaling_factor = check_positive_number("scaling_factor", scaling_factor)

    def build(self, inputs_shape):
        _check_input_shape("inputs", inputs_shape, (3, 4), even=True)
        self.built = True

    def call(self, inputs, start_index=0):
        _check_input_shape("inputs", inputs.shape, (3, 4), even=True)
        check_floating("inputs", inputs)
        rank, depth = len(inputs.shape), inputs.shape[-1]
        positions = _positions(ops.shape(inputs)[1], start_index) / self.scaling_factor
        angles = ops.outer(positions, _inverse_frequencies(self.max_wavelength, depth))
        # (T, d/2), or (T, 1, d/2) for (B, T, H, d) inputs.
        angles = ops.reshape(angles, (-1,) + (1,) * (rank - 3) + (depth // 2,))
        cos, sin = ops.cos(angles), ops.sin(angles)
        x = ops.cast(inputs, "float32")
        x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (B, T, [H,] d/2)
        rotated = ops.stack(
            [x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], axis=-1
        )  # (B, T, [H,] d/2, 2): pairs back in place
        return ops.cast(ops.reshape(rotated, ops.shape(inputs)), inputs.dtype)

    def get_config(self):
        config = super().get_config()
        config.update(max_wavelength=self.max_wavelength, scaling_factor=self.scaling_factor)
        return config


_POSITIONS = ("sinusoidal", "learned")


@keras.saving.register_keras_serializable(package="keras_attn")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus position encoding: `x_t = E[token_t] + PE(t)`.

    The usual input layer of a Transformer. With `mask_zero=True` token id 0
    is padding: the layer's output carries the mask `token != 0`, so
    downstream attention layers ignore padded keys.

    Args:
        vocab_size: number of token ids.
        sequence_length: rows of the learned table (sinusoidal: any length).
        embedding_dim: width of the output.
        position: `"sinusoidal"` (`SinusoidalPositionalEncoding`) or
            `"learned"` (`LearnedPositionalEmbedding`).
        mask_zero: whether token id 0 is padding.
        embeddings_initializer: of the token table (and the learned position
            table).
        max_wavelength: of the sinusoidal encoding.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: int token ids `(B, T)`.
        start_index: position of the first token (int or scalar tensor).

    Returns:
        `(B, T, embedding_dim)`, with the implicit mask `inputs != 0` when
        `mask_zero`.

    Example:

    >>> layer = keras_attn.TokenAndPositionEmbedding(1000, 64, 32)
    >>> print(layer(keras.ops.array([[5, 7, 9, 0]])).shape)
    (1, 4, 32)

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762
    """

    def __init__(
        self,
        vocab_size,
        sequence_length,
        embedding_dim,
        position="sinusoidal",
        mask_zero=True,
        embeddings_initializer="uniform",
        max_wavelength=10000,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.sequence_length = check_positive_int("sequence_length", sequence_length)
        self.embedding_dim = check_positive_int("embedding_dim", embedding_dim)
        if position not in _POSITIONS:
            raise ValueError(
                f"`position` must be one of {_POSITIONS}. Received: position={position!r}"
            )
        self.position = position
        self.mask_zero = bool(mask_zero)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.max_wavelength = check_positive_number("max_wavelength", max_wavelength)

        self.token_embedding = keras.layers.Embedding(
            vocab_size,
            embedding_dim,
            embeddings_initializer=clone_initializer(self.embeddings_initializer),
            dtype=self.dtype_policy,
            name="token_embedding",
        )  # the mask is computed here, in compute_mask
        if position == "learned":
            self.position_embedding = LearnedPositionalEmbedding(
                sequence_length,
                initializer=clone_initializer(self.embeddings_initializer),
                dtype=self.dtype_policy,
                name="position_embedding",
            )
        else:
            self.position_embedding = SinusoidalPositionalEncoding(
                max_wavelength, dtype=self.dtype_policy, name="position_embedding"
            )

    def build(self, inputs_shape):
        _check_input_shape("inputs", inputs_shape, (2,), width=False)
        self.token_embedding.build(inputs_shape)
        self.position_embedding.build(self.compute_output_shape(inputs_shape))
        self.built = True

    def call(self, inputs, start_index=0):
        tokens = self.token_embedding(inputs)  # (B, T, embedding_dim)
        return tokens + self.position_embedding(tokens, start_index=start_index)

    def compute_mask(self, inputs, mask=None):
        return ops.not_equal(inputs, 0) if self.mask_zero else None

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape) + (self.embedding_dim,)

    def get_config(self):
        config = super().get_config()
        names = ("vocab_size", "sequence_length", "embedding_dim", "position", "mask_zero")
        config.update({name: getattr(self, name) for name in names})
        config.update(
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
            max_wavelength=self.max_wavelength,
        )
        return config
