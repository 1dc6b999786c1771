"""Bilinear (Luong "general") attention."""

import keras

from keras_attn._typing import InitializerLike
from keras_attn.base import FixedScoreAttention
from keras_attn.scores import BilinearScore


@keras.saving.register_keras_serializable(package="keras_attn")
class BilinearAttention(FixedScoreAttention):
    """Bilinear attention, Luong's "general" score: `s(q, k) = q^T W k`.

    `att(q, (K, V)) = sum_j softmax_j(q^T W k_j) v_j` with a learned
    `W (dq, dk)`, so query and key widths may differ (a decoder state of one
    size attending over encoder states of another).

    Args:
        kernel_initializer: initializer of `W`.
        dropout: dropout rate on the attention weights, in training.
        seed: dropout seed.
        implementation: the kernel, `"auto"` (default), `"dense"`,
            `"fused"`, `"chunked"` or `"backend"` (the score is the dot product
            of `q W` and `k`, so every kernel runs it).

    Call arguments, Returns: as `keras_attn.ScoreAttention`.

    Example:

    >>> q = keras.random.normal((2, 4, 8))
    >>> v = keras.random.normal((2, 6, 12))
    >>> print(keras_attn.BilinearAttention()(q, v).shape)
    (2, 4, 12)

    Reference:
        Luong et al., 2015, "Effective Approaches to Attention-based Neural
        Machine Translation", https://arxiv.org/abs/1508.04025
    """

    def __init__(
        self,
        kernel_initializer: InitializerLike = "glorot_uniform",
        dropout: float = 0.0,
        seed: int | None = None,
        implementation: str = "auto",
        **kwargs,
    ):
        score = BilinearScore(kernel_initializer=kernel_initializer, dtype=kwargs.get("dtype"))
        super().__init__(
            score=score, dropout=dropout, seed=seed, implementation=implementation, **kwargs
        )
        self.kernel_initializer = score.kernel_initializer

    def get_config(self):
        config = super().get_config()
        config.update({"kernel_initializer": keras.initializers.serialize(self.kernel_initializer)})
        return config
