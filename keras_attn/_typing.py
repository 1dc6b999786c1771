"""The type aliases of the public signatures (hints for readers and tools; nothing checked)."""

from collections.abc import Callable
from typing import Any

# A tensor argument: a backend tensor (tf.Tensor, jax.Array, torch.Tensor), a symbolic
# `keras.KerasTensor`, or what `keras.ops.convert_to_tensor` takes (a NumPy array). Results
# are backend tensors (symbolic ones on symbolic inputs).
TensorLike = Any
# An initializer: a Keras name ("zeros"), a serialized config, or an initializer object
# (`keras.initializers.Initializer`, or any callable `(shape, dtype) -> tensor`).
InitializerLike = str | dict[str, Any] | Callable[..., Any]
# A regularizer: a Keras name ("l2"), a serialized config, a `keras.regularizers.Regularizer`.
RegularizerLike = str | dict[str, Any] | Callable[..., Any]
# A constraint: a Keras name ("non_neg"), a `keras.constraints.Constraint` or any callable.
ConstraintLike = str | Callable[..., Any]
# An activation: a Keras name ("relu", "gelu") or a callable.
ActivationLike = str | Callable[..., Any]
# A length, a position or an index: a Python int, or a scalar integer tensor (traced).
Length = int | TensorLike
