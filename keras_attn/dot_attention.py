"""Dot-product and scaled dot-product attention."""

import keras

from keras_attn.base import FixedScoreAttention
from keras_attn.scores import ScaledDotScore


@keras.saving.register_keras_serializable(package="keras_attn")
class DotAttention(FixedScoreAttention):
    """Dot-product attention (Luong "dot"): `s(q, k) = q . k`.

    `att(q, (K, V)) = sum_j softmax_j(q . k_j) v_j`, no weights. Query and key
    must have the same width.

    Args:
        dropout: dropout rate on the attention weights, in training.
        seed: dropout seed.
        implementation: the kernel, `"auto"` (default), `"dense"`,
            `"fused"`, `"chunked"` or `"backend"`, as `keras_attn.ScoreAttention`.

    Call arguments, Returns: as `keras_attn.ScoreAttention` (the one signature
    shared by every attention layer).

    Example:

    >>> q = keras.random.normal((2, 3, 8))
    >>> v = keras.random.normal((2, 5, 8))
    >>> out, w = keras_attn.DotAttention()(q, v, return_attention_scores=True)
    >>> print(out.shape, w.shape)
    (2, 3, 8) (2, 3, 5)

    Reference:
        Luong et al., 2015, "Effective Approaches to Attention-based Neural
        Machine Translation", https://arxiv.org/abs/1508.04025
    """

    def __init__(
        self,
        dropout: float = 0.0,
        seed: int | None = None,
        implementation: str = "auto",
        **kwargs,
    ):
        super().__init__(
            score="dot", dropout=dropout, seed=seed, implementation=implementation, **kwargs
        )


@keras.saving.register_keras_serializable(package="keras_attn")
class ScaledDotAttention(FixedScoreAttention):
    """Scaled dot-product attention: `s(q, k) = q . k / sqrt(d)`.

    `att(q, (K, V)) = softmax(q K^T / sqrt(d)) V`, no weights.

    Args:
        scale: score multiplier; `None` means `1 / sqrt(d)` with `d` the key
            width.
        dropout: dropout rate on the attention weights, in training.
        seed: dropout seed.
        implementation: the kernel, `"auto"` (default), `"dense"`,
            `"fused"`, `"chunked"` or `"backend"`, as `keras_attn.ScoreAttention`.

    Call arguments, Returns: as `keras_attn.ScoreAttention`.

    Example:

    >>> x = keras.random.normal((2, 6, 16))
    >>> print(keras_attn.ScaledDotAttention()(x, x, use_causal_mask=True).shape)
    (2, 6, 16)

    Reference:
        Vaswani et al., 2017, "Attention Is All You Need",
        https://arxiv.org/abs/1706.03762
    """

    def __init__(
        self,
        scale: float | None = None,
        dropout: float = 0.0,
        seed: int | None = None,
        implementation: str = "auto",
        **kwargs,
    ):
        super().__init__(
            score=ScaledDotScore(scale=scale),
            dropout=dropout,
            seed=seed,
            implementation=implementation,
            **kwargs,
        )
        self.scale = scale

    def get_config(self):
        config = super().get_config()
        config.update({"scale": self.scale})
        return config
