"""Argument checks, sublayer randomness and config helpers shared by every layer.

Checks raise `ValueError` (bad value or shape) or `TypeError` (wrong type),
naming the argument and what was received. NumPy scalars (`np.int64(2)`,
`np.float32(0.1)`) are accepted where Python numbers are, and come back as
Python numbers (so configs stay JSON).
"""

import numbers

import keras
import numpy as np


def is_int(value):
    """A Python or NumPy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def check_rate(name, value):
    """A dropout-like rate in `[0, 1)`, as a Python float."""
    if not _is_number(value) or not 0 <= value < 1:
        raise ValueError(f"`{name}` must be a number in [0, 1). Received: {name}={value!r}")
    return float(value)


def check_positive_int(name, value, allow_none=False):
    """A positive integer (Python or NumPy), as a Python int; `None` if `allow_none`.

    The message is worded as Keras words its own (its tests match "argument `name`").
    """
    if value is None and allow_none:
        return None
    if not is_int(value) or value <= 0:
        default = " (or None, the default)" if allow_none else ""
        raise ValueError(
            f"The argument `{name}` must be a positive integer. Received: {name}={value!r}"
            + default
        )
    return int(value)


def check_positive_number(name, value):
    """A positive finite number (Python or NumPy), as a Python number."""
    if not _is_number(value) or not 0 < value < float("inf"):
        raise ValueError(f"`{name}` must be a positive number. Received: {name}={value!r}")
    return int(value) if is_int(value) else float(value)


def check_finite_number(name, value):
    """A finite number of any sign (Python or NumPy), as a Python number."""
    if not _is_number(value) or not float("-inf") < value < float("inf"):
        raise ValueError(f"`{name}` must be a finite number. Received: {name}={value!r}")
    return int(value) if is_int(value) else float(value)


def check_rank(name, shape, ranks):
    if len(shape) not in ranks:
        expected = " or ".join(str(r) for r in ranks)
        raise ValueError(
            f"`{name}` must have rank {expected}. Received: {name}.shape={tuple(shape)}"
        )


def check_dim(name_a, dim_a, name_b, dim_b, what):
    if dim_a is not None and dim_b is not None and dim_a != dim_b:
        raise ValueError(
            f"`{name_a}` and `{name_b}` must have the same {what}. Received: {dim_a} and {dim_b}"
        )


def dim(x, axis):
    """The size of `x` on `axis`: the static int where known (no shape op), else a scalar tensor."""
    size = x.shape[axis]
    if size is not None:
        return size
    if keras.backend.backend() == "tensorflow":  # `ops.shape` slices every unknown axis
        import tensorflow as tf

        return tf.shape(x)[axis]
    return keras.ops.shape(x)[axis]


def check_floating(name, x):
    """`TypeError` unless `x` is a floating-point tensor.

    Keras casts float inputs to the layer's compute dtype but leaves integer
    ones alone, and integer scores would give integer (all-zero) weights.
    """
    if not keras.backend.is_float_dtype(x.dtype):
        raise TypeError(
            f"`{name}` must be a floating-point tensor (embed token ids first). "
            f"Received: {name}.dtype={keras.backend.standardize_dtype(x.dtype)}"
        )


def clone_initializer(initializer):
    """A fresh copy of a Keras initializer, for one weight.

    A Keras 3 initializer without a seed fixes its seed when it is created, so
    one instance handed to several weights gives them identical values
    (`W_q = W_k = W_v`). Every weight of a keras-attn layer gets its own clone.
    """
    initializer = keras.initializers.get(initializer)
    if not isinstance(initializer, keras.initializers.Initializer):
        return initializer  # a plain function: no state to share
    return initializer.__class__.from_config(initializer.get_config())


def sublayer_seed(seed, index):
    """The seed of a layer's `index`-th random sublayer: `None` stays `None`.

    With an explicit `seed`, each sublayer's dropout must draw its own masks
    (the same seed in the two residual dropouts of a block drops the same
    features in both): sublayer `i` gets `seed + 1000 * (i + 1)`.
    """
    return None if seed is None else int(seed) + 1000 * (index + 1)


def serialize_optional_layer(layer):
    """A sublayer argument (e.g. `rotary_embedding`) for `get_config`: `None` or its config.

    A sublayer with weights may be shared by several layers (T5 shares one
    `RelativePositionBias` across a stack). Keras marks the configs of an object
    serialized twice with a `shared_object_id`, so that loading shares it again, but it
    copies a layer's config before the next layer's marks the first one: here every
    config of a sublayer with weights carries the mark (the same one again after a reload).
    """
    if layer is None:
        return None
    config = keras.saving.serialize_keras_object(layer)
    if layer.weights:
        config["shared_object_id"] = getattr(layer, "_shared_object_id", id(layer))
    return config


def deserialize_optional_layer(config, name):
    """`from_config` side of `serialize_optional_layer`: rebuilds `config[name]` in a copy.

    In `keras.saving.load_model`, the configs with one `shared_object_id` give one layer.
    """
    config = dict(config)
    if isinstance(config.get(name), dict):
        layer = keras.saving.deserialize_keras_object(config[name])
        if "shared_object_id" in config[name]:
            layer._shared_object_id = config[name]["shared_object_id"]
        config[name] = layer
    return config
