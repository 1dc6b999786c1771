"""Rotary position embedding (RoPE): keras-hub's arguments, two channel layouts, Llama 3's
frequency scaling."""

import math

import keras
import numpy as np
from keras import ops

from keras_attn._typing import TensorLike
from keras_attn.arguments import check_floating, check_positive_number, is_int
from keras_attn.positional import (
    PositionLayer,
    check_min_rank,
    check_positions,
    inverse_frequencies,
    step_positions,
)

LAYOUTS = ("half", "interleaved")
ROPE_TYPES = ("linear", "llama3")


def llama3_inverse_frequencies(
    max_wavelength,
    depth,
    factor,
    low_freq_factor,
    high_freq_factor,
    original_max_position_embeddings,
):
    """Llama 3's scaled `theta_j`, float64 NumPy `(depth // 2,)`.

    transformers' `_compute_llama3_parameters` (modeling_rope_utils.py), step
    for step: wavelengths `2 pi / theta_j` shorter than
    `original_max_position_embeddings / high_freq_factor` are kept, longer than
    `original_max_position_embeddings / low_freq_factor` divided by `factor`,
    and those between interpolated with
    `s = (original_max_position_embeddings / wavelength - low_freq_factor) /
    (high_freq_factor - low_freq_factor)`: `(1 - s) theta_j / factor + s theta_j`.
    """
    theta = np.power(float(max_wavelength), -np.arange(0, depth, 2, dtype="float64") / depth)
    low_freq_wavelength = original_max_position_embeddings / low_freq_factor
    high_freq_wavelength = original_max_position_embeddings / high_freq_factor
    wavelength = 2 * math.pi / theta
    scaled = np.where(wavelength > low_freq_wavelength, theta / factor, theta)
    smooth = (original_max_position_embeddings / wavelength - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < high_freq_wavelength) & ~(wavelength > low_freq_wavelength)
    return np.where(medium, smoothed, scaled)


def _check_axis(name, value):
    if not is_int(value):
        raise TypeError(f"`{name}` must be an int. Received: {name}={value!r}")
    return int(value)


def check_rotary_embedding(layer, key_dim=None):
    """`layer` if it rotates heads as `keras_attn.RotaryEmbedding` does, else an error.

    Accepted: `None`, and layers of a class named `RotaryEmbedding` or
    derived from one (ours, keras-hub's, a user's own), whose call takes
    `(x, start_index=0)` on `(B, T, h, d)` and keeps its shape. Any other layer
    (a positional encoding, a bias, a `Dense`) would replace or reshape the
    query and key heads: `TypeError`. With `key_dim` (the width `d` of the
    heads it rotates): `ValueError` unless `key_dim` is even and the layer's
    `sequence_axis` and `feature_axis` are those of the heads (1 and -1).
    """
    names = {c.__name__ for c in type(layer).__mro__}
    if layer is not None and not (
        isinstance(layer, keras.layers.Layer) and "RotaryEmbedding" in names
    ):
        raise TypeError(
            "`rotary_embedding` must be None or a rotary embedding layer: "
            "keras_attn.RotaryEmbedding (or keras-hub's, or a subclass), called as "
            "`layer(x, start_index=...)` on the heads. "
            f"Received: rotary_embedding of type {type(layer).__name__}"
        )
    if layer is None or key_dim is None:
        return layer
    if key_dim % 2:
        raise ValueError(
            "`key_dim` must be even to rotate pairs of features with "
            f"`rotary_embedding`. Received: key_dim={key_dim}"
        )
    axes = (getattr(layer, "sequence_axis", 1), getattr(layer, "feature_axis", -1))
    if axes[0] not in (1, -3) or axes[1] not in (-1, 3):
        raise ValueError(
            "`rotary_embedding` rotates the heads (B, T, h, d): its `sequence_axis` must be "
            "1 and its `feature_axis` -1. Received: "
            f"sequence_axis={axes[0]}, feature_axis={axes[1]}"
        )
    return layer


@keras.saving.register_keras_serializable(package="keras_attn")
class RotaryEmbedding(PositionLayer):
    """Rotary position embedding (RoPE): channel pairs rotated by their position.

    Pair `j` of the feature axis, `(x_a, x_b)`, is rotated by the angle
    `m * theta_j`, with `m` the position divided by `scaling_factor` and
    `theta_j = max_wavelength^(-2j/d)`, `j = 0 .. d/2 - 1`:

        y_a = x_a cos(m theta_j) - x_b sin(m theta_j)
        y_b = x_b cos(m theta_j) + x_a sin(m theta_j)

    `max_wavelength` is Hugging Face's `rope_theta`. Scaling (`rope_type`):
    `"linear"` (default; Hugging Face's `"linear"`, keras-hub's default)
    divides the positions by `scaling_factor`; `"llama3"` (Llama 3.1 and
    later) leaves the positions and scales the frequencies instead, with
    `scaling_factor` as Llama 3's `factor` (`keras_attn.rotary.
    llama3_inverse_frequencies`): high frequencies (wavelengths under
    `original_max_position_embeddings / high_freq_factor`) are kept, low ones
    (over `original_max_position_embeddings / low_freq_factor`) divided by
    `scaling_factor`, those between interpolated smoothly.

    so that `<R(m) q, R(n) k>` depends on `m - n` only. The layout says which
    channels pair up: `"half"` pairs `(x_j, x_{j + d/2})`, the two halves
    (keras-hub, Llama, GPT-NeoX and most checkpoints); `"interleaved"` pairs
    `(x_2j, x_2j+1)` (RoFormer, GPT-J). With `layout="half"` the outputs equal
    keras-hub's `RotaryEmbedding` (its default `rope_type="linear"`; tested).
    Apply it to queries and keys before the score. Angles are computed in
    float32. No weights.

    Args:
        max_wavelength: the base of the frequencies `theta_j`.
        scaling_factor: positions are divided by it (linear position
            interpolation for contexts longer than in training).
        sequence_axis: the axis of `inputs` that holds the positions.
        feature_axis: the axis of `inputs` whose channels are rotated.
        layout: `"half"` or `"interleaved"` (which channels pair up, above).
        rope_type: `"linear"` or `"llama3"` (the scaling, above).
        low_freq_factor, high_freq_factor, original_max_position_embeddings:
            Llama 3's (with `rope_type="llama3"`; Llama 3.1's values by
            default: 1, 4, 8192). `high_freq_factor` must exceed
            `low_freq_factor`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: rank >= 3, e.g. `(B, T, d)` or `(B, T, H, d)` with the default
            axes; the feature axis must be known and even.
        start_index: position of the first step (int or scalar tensor).
        positions: `None`, or every step's position, `(T,)` or `(B, T)` (int
            or float); replaces `start_index`.

    Returns:
        `inputs` rotated, same shape and dtype.

    Example:

    >>> q = keras.random.normal((2, 10, 4, 16))  # (B, T, H, dk)
    >>> print(keras_attn.RotaryEmbedding()(q).shape)
    (2, 10, 4, 16)
    >>> x = np.array([[[1.0, 0.0], [0.0, 1.0]]], "float32")  # (B, T, d) = (1, 2, 2)
    >>> y = keras_attn.RotaryEmbedding(layout="interleaved")(x, positions=np.array([1, 1]))
    >>> print(np.round(keras.ops.convert_to_numpy(y), 4))  # [cos 1, sin 1], [-sin 1, cos 1]
    [[[ 0.5403  0.8415]
      [-0.8415  0.5403]]]

    Llama 3.1's scaling (frequencies of wavelengths beyond 8192 / 1 divided by 8):

    >>> rope = keras_attn.RotaryEmbedding(500000, scaling_factor=8.0, rope_type="llama3")
    >>> print(rope(q).shape)
    (2, 10, 4, 16)

    Reference:
        Su et al., 2021, "RoFormer: Enhanced Transformer with Rotary Position
        Embedding", https://arxiv.org/abs/2104.09864; Chen et al., 2023,
        "Extending Context Window of Large Language Models via Positional
        Interpolation" (linear), https://arxiv.org/abs/2306.15595; Llama 3's
        scaling: Meta's `apply_scaling` in llama-models and transformers'
        `_compute_llama3_parameters`
        (src/transformers/modeling_rope_utils.py).
    """

    def __init__(
        self,
        max_wavelength: float = 10000,
        scaling_factor: float = 1.0,
        sequence_axis: int = 1,
        feature_axis: int = -1,
        layout: str = "half",
        *,
        rope_type: str = "linear",
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        original_max_position_embeddings: int = 8192,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.max_wavelength = check_positive_number("max_wavelength", max_wavelength)
        self.scaling_factor = check_positive_number("scaling_factor", scaling_factor)
        self.sequence_axis = _check_axis("sequence_axis", sequence_axis)
        self.feature_axis = _check_axis("feature_axis", feature_axis)
        if sequence_axis == feature_axis:
            raise ValueError(
                "`sequence_axis` and `feature_axis` must differ. Received: "
                f"sequence_axis={sequence_axis}, feature_axis={feature_axis}"
            )
        if layout not in LAYOUTS:
            raise ValueError(f"`layout` must be one of {LAYOUTS}. Received: layout={layout!r}")
        self.layout = layout
        if rope_type not in ROPE_TYPES:
            raise ValueError(
                f"`rope_type` must be one of {ROPE_TYPES}. Received: rope_type={rope_type!r}"
            )
        self.rope_type = rope_type
        self.low_freq_factor = check_positive_number("low_freq_factor", low_freq_factor)
        self.high_freq_factor = check_positive_number("high_freq_factor", high_freq_factor)
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                "`high_freq_factor` must be greater than `low_freq_factor`. Received: "
                f"low_freq_factor={low_freq_factor}, high_freq_factor={high_freq_factor}"
            )
        self.original_max_position_embeddings = check_positive_number(
            "original_max_position_embeddings", original_max_position_embeddings
        )

    def _axes(self, shape):
        """`(sequence_axis, feature_axis)` as non-negative axes of `shape`, checked."""
        check_min_rank("inputs", shape, 3)
        rank, axes = len(shape), []
        for name, axis in (
            ("sequence_axis", self.sequence_axis),
            ("feature_axis", self.feature_axis),
        ):
            if not -rank <= axis < rank:
                raise ValueError(
                    f"`{name}` must be an axis of `inputs`. Received: {name}={axis}, "
                    f"inputs.shape={tuple(shape)}"
                )
            axes.append(axis % rank)
        if axes[0] == axes[1]:
            raise ValueError(
                "`sequence_axis` and `feature_axis` must be different axes of `inputs`. "
                f"Received: sequence_axis={self.sequence_axis}, "
                f"feature_axis={self.feature_axis}, inputs.shape={tuple(shape)}"
            )
        depth = shape[axes[1]]
        if depth is None or depth % 2:
            raise ValueError(
                f"The feature axis ({self.feature_axis}) of `inputs` must be known and even. "
                f"Received: inputs.shape={tuple(shape)}"
            )
        return tuple(axes)

    def build(self, inputs_shape):
        self._axes(inputs_shape)
        self.built = True

    def call(
        self,
        inputs: TensorLike,
        start_index: int | TensorLike = 0,
        positions: TensorLike | None = None,
    ) -> TensorLike:
        sequence_axis, feature_axis = self._axes(inputs.shape)
        check_floating("inputs", inputs)
        # (B, T, ..., d): the sequence second, the features last.
        x = ops.moveaxis(ops.cast(inputs, "float32"), (sequence_axis, feature_axis), (1, -1))
        depth = x.shape[-1]
        if positions is None:
            positions = step_positions(ops.shape(x)[1], start_index)  # (T,)
        else:
            positions = check_positions(positions, x.shape[1], start_index)
        positions = ops.cast(positions, "float32")
        if self.rope_type == "linear":
            positions = positions / self.scaling_factor
        angles = ops.expand_dims(positions, -1) * self._frequencies(depth)
        if len(angles.shape) == 2:
            angles = ops.expand_dims(angles, 0)  # (1, T, d/2)
        for _ in range(len(x.shape) - 3):
            angles = ops.expand_dims(angles, 2)  # (B|1, T, 1, ..., d/2)
        cos, sin = ops.cos(angles), ops.sin(angles)
        if self.layout == "half":
            x_a, x_b = x[..., : depth // 2], x[..., depth // 2 :]
            rotated = ops.concatenate([x_a * cos - x_b * sin, x_b * cos + x_a * sin], axis=-1)
        else:
            x_a, x_b = x[..., 0::2], x[..., 1::2]
            rotated = ops.stack([x_a * cos - x_b * sin, x_b * cos + x_a * sin], axis=-1)
            rotated = ops.reshape(rotated, ops.shape(x))  # (..., d/2, 2): pairs back in place
        rotated = ops.moveaxis(rotated, (1, -1), (sequence_axis, feature_axis))
        return ops.cast(rotated, inputs.dtype)

    def _frequencies(self, depth):
        """float32 `(d/2,)`: what a position multiplies (`theta_j`; Llama 3's, scaled)."""
        if self.rope_type == "llama3":
            frequencies = llama3_inverse_frequencies(
                self.max_wavelength, depth, self.scaling_factor, self.low_freq_factor,
                self.high_freq_factor, self.original_max_position_embeddings,
            )  # fmt: skip
            return ops.convert_to_tensor(frequencies, "float32")
        return inverse_frequencies(self.max_wavelength, depth)

    def get_config(self):
        config = super().get_config()
        config.update(
            max_wavelength=self.max_wavelength,
            scaling_factor=self.scaling_factor,
            sequence_axis=self.sequence_axis,
            feature_axis=self.feature_axis,
            layout=self.layout,
            rope_type=self.rope_type,
            low_freq_factor=self.low_freq_factor,
            high_freq_factor=self.high_freq_factor,
            original_max_position_embeddings=self.original_max_position_embeddings,
        )
        return config
