"""Score functions as small layers, so that a score can own its weights.

A score layer is called `score(query, key)` with `query (B, Tq, dq)` and
`key (B, Tv, dk)` and returns `(B, Tq, Tv)`. Attention layers take a score by
name (`"dot"`, `"scaled_dot"`, `"additive"`, `"bilinear"`) or as an instance,
and hand it to the kernels (`keras_attn.ops.attention`) in two parts:
`prepare(query, key)`, the per-position work done once (projections), and the
pairwise part that the kernel evaluates, whole or per key block. A score's
`kind` says which kernels run it:

- `"dot"`: the pairwise part is `q . k * dot_scale(q)` (dot, scaled dot, and
  bilinear after `prepare` gives `q W`): every kernel;
- `"blockwise"`: `pairwise(q, k, parameters)` with a written-out
  `pairwise_gradient` (additive): the dense and chunked kernels;
- `"any"` (a `Score` subclass that only overrides `call`): the dense kernel.
"""

import keras
from keras import ops as kops

from keras_attn import ops as attn_ops
from keras_attn._typing import InitializerLike, TensorLike
from keras_attn.arguments import clone_initializer

_REGISTRY = keras.saving.register_keras_serializable(package="keras_attn")


class Score(keras.layers.Layer):
    """Base class of the scores: `call(query, key) -> (..., Tq, Tv)`.

    A subclass overrides `call` (then it runs on the dense kernel), or the
    parts the kernels call: `kind`, `prepare`, `dot_scale` (`"dot"`), or
    `pairwise`, `score_parameters` and `pairwise_gradient` (`"blockwise"`).
    """

    kind = "any"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Masks are the attention layer's business: accept inputs that carry
        # one without a warning, and put none on the scores.
        self.supports_masking = True

    def check_inputs(self, query, key):
        """`ValueError` unless `query` and `key` have widths this score takes."""

    def prepare(self, query, key):
        """The per-position part, done once before the kernel: `(query, key)` for `pairwise`."""
        return query, key

    def dot_scale(self, query):
        """`"dot"` scores: the multiplier of `q . k` (of the prepared query)."""
        return 1.0

    def score_parameters(self):
        """The weights `pairwise` reads, as tensors (arguments of the kernels' gradients)."""
        return ()

    def pairwise(self, query, key, parameters=()):
        """Scores `(..., Tq, Tk)` of prepared inputs; `parameters` from `score_parameters`."""
        return self.call(query, key)

    def pairwise_gradient(self, d_scores, query, key, parameters):
        """`"blockwise"` scores: `(d_query, d_key, d_parameters)` from `d_scores (..., Tq, Tk)`."""
        raise NotImplementedError

    def call(self, query, key):
        query, key = self.prepare(query, key)
        if self.kind == "dot":
            query = kops.multiply(query, kops.cast(self.dot_scale(query), query.dtype))
            return kops.matmul(query, kops.swapaxes(key, -1, -2))
        return self.pairwise(query, key, self.score_parameters())

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

    kind = "dot"

    def build(self, query_shape, key_shape):
        attn_ops._check_widths("query", query_shape, "key", key_shape)

    def check_inputs(self, query, key):
        attn_ops._check_widths("query", query.shape, "key", key.shape)

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

    kind = "dot"

    def build(self, query_shape, key_shape):
        attn_ops._check_widths("query", query_shape, "key", key_shape)

    def check_inputs(self, query, key):
        attn_ops._check_widths("query", query.shape, "key", key.shape)

    def dot_scale(self, query):
        return self.scale if self.scale is not None else attn_ops.default_scale(query)

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

    kind = "blockwise"

    def check_inputs(self, query, key):
        self.check_built_widths(query, key, self.query_kernel.shape[0], self.key_kernel.shape[0])

    def prepare(self, query, key):
        """`(U q, W k + b)`: `(..., Tq, units)`, `(..., Tv, units)`."""
        projected_query = kops.matmul(query, self.query_kernel)
        projected_key = kops.matmul(key, self.key_kernel)
        if self.bias is not None:
            projected_key = projected_key + self.bias
        return projected_query, projected_key

    def score_parameters(self):
        # A tensor, not the variable: TensorFlow refuses variables read in a custom gradient.
        return (kops.copy(self.score_vector),)

    def pairwise(self, query, key, parameters=()):
        (v,) = parameters or self.score_parameters()
        dtype = self.compute_dtype  # the score's, whatever a backend promoted its inputs to
        query, key, v = (kops.cast(t, dtype) for t in (query, key, v))
        return attn_ops.additive_score(query, key, v)

    def pairwise_gradient(self, d_scores, query, key, parameters):
        """`s_ij = v . tanh(q_i + k_j)`: `dh = dS v (1 - h^2)`, summed over j (dq), i (dk)."""
        (v,) = parameters
        v = kops.cast(v, "float32")
        hidden = kops.tanh(
            kops.expand_dims(kops.cast(query, "float32"), -2)
            + kops.expand_dims(kops.cast(key, "float32"), -3)
        )  # (..., Tq, Tk, units)
        d_scores = kops.cast(d_scores, "float32")
        weighted = kops.expand_dims(d_scores, -1) * hidden  # (..., Tq, Tk, units)
        d_v = kops.sum(kops.reshape(weighted, (-1, hidden.shape[-1])), axis=0)
        d_pre = kops.expand_dims(d_scores, -1) * v * (1.0 - hidden * hidden)
        return kops.sum(d_pre, axis=-2), kops.sum(d_pre, axis=-3), (d_v,)

    def call(self, query: TensorLike, key: TensorLike) -> TensorLike:
        self.check_inputs(query, key)
        return self.pairwise(*self.prepare(query, key))

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

    kind = "dot"

    def check_inputs(self, query, key):
        self.check_built_widths(query, key, *self.kernel.shape)

    def prepare(self, query, key):
        """`(q W, k)`: the pairwise part is then the dot product."""
        return kops.matmul(query, self.kernel), key

    def call(self, query: TensorLike, key: TensorLike) -> TensorLike:
        self.check_inputs(query, key)
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
