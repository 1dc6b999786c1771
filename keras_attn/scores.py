"""Score functions as small layers, so that a score can own its weights.

A score layer is called `score(query, key)` with `query (B, Tq, dq)` and
`key (B, Tv, dk)` and returns `(B, Tq, Tv)`. Attention layers take a score by
name (`"dot"`, `"scaled_dot"`, `"additive"`, `"bilinear"`) or as an instance.
"""

import keras
from keras import ops as kops

from keras_attn import ops as attn_ops
from keras_attn._typing import InitializerLike, TensorLike
from keras_attn.arguments import clone_initializer

_REGISTRY = keras.saving.register_keras_serializable(package="keras_attn")


class Score(keras.layers.Layer):
    """Base class of the scores: `call(query, key) -> (..., Tq, Tv)`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Masks are the attention layer's business: accept inputs that carry
        # one without a warning, and put none on the scores.
        self.supports_masking = True

    def compute_mask(self, query, mask=None):
        return None

    def compute_output_shape(self, query_shape, key_shape):
        return tuple(query_shape[:-1]) + (key_shape[-2],)

    def check_built_widths(self, query, key, query_width, key_width):
        """`ValueError` unless the inputs have the widths the weights were built for."""
        for name, x, width in (("query", query, query_width), ("key", key, key_width)):
            if x.shape[-1] is not None and x.shape[-1] != width:
                raise ValueError(
                    f"`{name}` must have width {width}, the width this layer was built for. "
                    f"Received: {name}.shape={tuple(x.shape)}"
                )


@_REGISTRY
class DotScore(Score):
    """`s(q, k) = q . k`. Query and key widths must match."""

    def build(self, query_shape, key_shape):
        attn_ops._check_widths("query", query_shape, "key", key_shape)

    def call(self, query: TensorLike, key: TensorLike) -> TensorLike:
        return attn_ops.dot_score(query, key)


@_REGISTRY
class ScaledDotScore(Score):
    """`s(q, k) = q . k * scale`, `scale = 1 / sqrt(d)` by default."""

    def __init__(self, scale: float | None = None, **kwargs):
        super().__init__(**kwargs)
        if scale is not None and (not isinstance(scale, (int, float)) or isinstance(scale, bool)):
            raise TypeError(f"`scale` must be a number or None. Received: scale={scale!r}")
        if scale is not None and not 0 < scale < float("inf"):
            raise ValueError(f"`scale` must be positive and finite. Received: scale={scale!r}")
        self.scale = scale

    def build(self, query_shape, key_shape):
        attn_ops._check_widths("query", query_shape, "key", key_shape)

    def call(self, query: TensorLike, key: TensorLike) -> TensorLike:
        return attn_ops.scaled_dot_score(query, key, scale=self.scale)

    def get_config(self):
        config = super().get_config()
        config.update({"scale": self.scale})
        return config


@_REGISTRY
class AdditiveScore(Score):
    """Bahdanau's `s(q, k) = v^T tanh(W k + U q)` with learned `W`, `U`, `v`.

    Args:
        units: width of the hidden layer; `None` means the key width.
        use_bias: add a bias inside the tanh (Bahdanau's formula has none).
    """

    def __init__(
        self,
        units: int | None = None,
        use_bias: bool = False,
        kernel_initializer: InitializerLike = "glorot_uniform",
        bias_initializer: InitializerLike = "zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if units is not None and (
            not isinstance(units, int) or isinstance(units, bool) or units <= 0
        ):
            raise ValueError(
                f"`units` must be a positive integer or None. Received: units={units!r}"
            )
        self.units = units
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, query_shape, key_shape):
        units = self.units or key_shape[-1]
        self.query_kernel = self.add_weight(  # U
            name="query_kernel",
            shape=(query_shape[-1], units),
            initializer=clone_initializer(self.kernel_initializer),
        )
        self.key_kernel = self.add_weight(  # W
            name="key_kernel",
            shape=(key_shape[-1], units),
            initializer=clone_initializer(self.kernel_initializer),
        )
        self.bias = (
            self.add_weight(name="bias", shape=(units,), initializer=self.bias_initializer)
            if self.use_bias
            else None
        )
        self.score_vector = self.add_weight(  # v
            name="score_vector",
            shape=(units,),
            initializer=clone_initializer(self.kernel_initializer),
        )

    def call(self, query: TensorLike, key: TensorLike) -> TensorLike:
        self.check_built_widths(query, key, self.query_kernel.shape[0], self.key_kernel.shape[0])
        projected_query = kops.matmul(query, self.query_kernel)  # (B, Tq, units)
        projected_key = kops.matmul(key, self.key_kernel)  # (B, Tv, units)
        if self.bias is not None:
            projected_key = projected_key + self.bias
        return attn_ops.additive_score(projected_query, projected_key, self.score_vector)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


@_REGISTRY
class BilinearScore(Score):
    """Luong's "general" score `s(q, k) = q^T W k`, `W` of shape `(dq, dk)`."""

    def __init__(self, kernel_initializer: InitializerLike = "glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, query_shape, key_shape):
        self.kernel = self.add_weight(
            name="kernel",
            shape=(query_shape[-1], key_shape[-1]),
            initializer=self.kernel_initializer,
        )

    def call(self, query: TensorLike, key: TensorLike) -> TensorLike:
        self.check_built_widths(query, key, *self.kernel.shape)
        return attn_ops.bilinear_score(query, key, self.kernel)

    def get_config(self):
        config = super().get_config()
        config.update({"kernel_initializer": keras.initializers.serialize(self.kernel_initializer)})
        return config


SCORES = {
    "dot": DotScore,
    "scaled_dot": ScaledDotScore,
    "additive": AdditiveScore,
    "bilinear": BilinearScore,
}


def get(identifier: str | dict | Score, dtype: str | keras.DTypePolicy | None = None) -> Score:
    """Returns a `Score` layer from a name, a config dict or an instance."""
    if isinstance(identifier, Score):
        return identifier
    if isinstance(identifier, str):
        if identifier not in SCORES:
            raise ValueError(
                f"`score` must be one of {sorted(SCORES)} or a Score layer. "
                f"Received: score={identifier!r}"
            )
        return SCORES[identifier](dtype=dtype)
    if isinstance(identifier, dict):
        score = keras.saving.deserialize_keras_object(identifier)
        if not isinstance(score, Score):
            raise TypeError(
                "A `score` config must deserialize to a keras_attn.scores.Score layer. "
                f"Received: {type(score).__name__} from config {identifier!r}"
            )
        return score
    raise TypeError(
        f"`score` must be a string, a config dict or a Score layer. Received: "
        f"score={identifier!r} of type {type(identifier).__name__}"
    )


def serialize(score: str | Score) -> str | dict:
    """Config value for a `score` argument: names stay names."""
    if isinstance(score, str):
        return score
    return keras.saving.serialize_keras_object(score)
