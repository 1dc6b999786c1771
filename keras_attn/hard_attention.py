"""Hard attention: one position selected, straight-through Gumbel-softmax in training."""

import keras
import numpy as np
from keras import ops as kops

from keras_attn import ops as attn_ops
from keras_attn.arguments import check_positive_number
from keras_attn.base import ScoreAttention
from keras_attn.scores import Score

# Smallest uniform sample, so that the Gumbel noise `-log(-log(u))` is finite.
_TINY = float(np.finfo(np.float32).tiny)


@keras.saving.register_keras_serializable(package="keras_attn")
class HardAttention(ScoreAttention):
    """Hard attention: the output is the value at one selected position.

    At inference the selection is the best visible key,
    `j* = argmax_j s(q, k_j)`, `att(q, (K, V)) = v_{j*}`. In training the
    selection is sampled and made differentiable with the straight-through
    Gumbel-softmax estimator:

        g_j ~ Gumbel(0, 1)
        soft = masked_softmax((s(q, k) + g) / temperature)
        hard = one_hot(argmax_j soft_j)          # visible positions only
        weights = hard + (soft - stop_gradient(soft))

    so the forward weights are exactly one-hot (the output is exactly one
    value row) and the gradient is that of the soft sample. Only the
    normalization differs from `keras_attn.ScoreAttention`; masks, dropout
    (applied to the one-hot weights, in training) and the output are the
    shared pipeline.

    Args:
        score: `"dot"` (default), `"scaled_dot"`, `"additive"`, `"bilinear"`
            or a `keras_attn.scores.Score` layer.
        temperature: positive temperature of the Gumbel-softmax; lower is
            closer to the hard sample (and has noisier gradients).
        dropout: dropout rate on the attention weights, in training.
        seed: seed of the Gumbel noise and of the dropout.

    Call arguments:
        As `keras_attn.ScoreAttention`. `training=True` samples with Gumbel
        noise; otherwise the selection is the argmax, with no noise.

    Returns:
        Output `(B, Tq, dv)` (or `(B, dv)` for a rank-2 query): the selected
        value rows; with `return_attention_scores=True` also the one-hot
        weights `(B, Tq, Tv)`. A query row with no visible key gets zero
        weights and a zero output, with finite gradients. As in every layer,
        a NaN or inf at a masked position never reaches the output; a NaN
        score at a visible key makes its row NaN (no position is selected).

    Example:

    >>> query = keras.random.normal((2, 8))              # (B, dq)
    >>> value = keras.random.normal((2, 6, 8))           # (B, Tv, dv)
    >>> out, w = keras_attn.HardAttention()(query, value, return_attention_scores=True)
    >>> print(out.shape, w.shape)                             # w is one-hot on axis -1
    (2, 8) (2, 6)

    Reference:
        Xu et al., 2015, "Show, Attend and Tell", https://arxiv.org/abs/1502.03044;
        Jang et al., 2017, "Categorical Reparameterization with Gumbel-Softmax",
        https://arxiv.org/abs/1611.01144
    """

    def __init__(
        self,
        score: str | dict | Score = "dot",
        temperature: float = 1.0,
        dropout: float = 0.0,
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(score=score, dropout=dropout, seed=seed, **kwargs)
        self.temperature = float(check_positive_number("temperature", temperature))

    needs_weights = True

    def normalization(self, training):
        return lambda scores, mask: self.select(scores, mask, training)

    def select(self, scores, mask, training):
        """Scores -> one-hot weights: the argmax, or a Gumbel sample in training."""
        if scores.shape[-1] == 0:  # no key to select (Tv = 0): all-zero weights
            return kops.zeros_like(scores)
        # Selection and noise in float32 whatever the policy, as the softmax.
        logits = kops.cast(scores, "float32")  # (B, Tq, Tv)
        if training:
            uniform = keras.random.uniform(
                kops.shape(logits), minval=_TINY, maxval=1.0, seed=self.seed_generator
            )
            gumbel = -kops.log(-kops.log(uniform))
            soft = attn_ops.masked_softmax((logits + gumbel) / self.temperature, mask)
        else:
            soft = attn_ops.masked_softmax(logits, mask)
        # softmax is monotone and gives masked keys 0, so the argmax of a row
        # with a visible key is a visible key; rows with none get zeros.
        hard = kops.one_hot(kops.argmax(soft, axis=-1), kops.shape(soft)[-1])
        if mask is not None:  # (B|1, Tq|1, Tv)
            hard = hard * kops.cast(attn_ops.visible_rows(mask), hard.dtype)
        # argmax would pick some position of a row with a NaN score: keep the NaN.
        hard = kops.where(kops.any(kops.isnan(soft), axis=-1, keepdims=True), soft, hard)
        if training:
            # Forward value exactly `hard`; gradient of the soft sample.
            hard = hard + (soft - kops.stop_gradient(soft))
        return kops.cast(hard, scores.dtype)

    def get_config(self):
        config = super().get_config()
        config.update({"temperature": self.temperature})
        return config
