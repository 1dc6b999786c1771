"""`AttentionSpec`: everything one attention call asks of a kernel, in one immutable object.

A layer (or `keras_attn.ops.attention`) builds one spec per call and hands it,
with the query, key and value, to the kernel the registry chooses
(`keras_attn.kernels.choose`); every kernel is `kernel(query, key, value,
spec) -> (output, weights or None)`.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

from keras_attn import masks
from keras_attn.kernels import bias as bias_lib
from keras_attn.kernels.bias import AttentionBias


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionSpec:
    """What a call asks: masks, positions, bias, scale, score, dropout and the weights.

    Attributes:
        mask: boolean, broadcastable to `(..., Tq, Tv)`, `True` = attend, or
            `None`. Keep it factored (`(B, 1, 1, Tv)` for padded keys): the
            chunked kernel slices it per key block.
        is_causal: query `i` sees keys `j <= query_start + i` only.
        query_start: the position of the first query among the keys (the
            causal mask's, the window's and the position biases'); `None`
            means `Tv - Tq` (end-aligned). A cached step passes its index.
        window: `None`, or a positive int: query `i` sees key `j` only if
            `|query_start + i - j| < window`.
        bias: `None` or an `AttentionBias` (`keras_attn.kernels.bias.as_bias`),
            added to the scores in float32.
        scale: multiplier of the dot-product scores; `None` means
            `1 / sqrt(dk)`. Unused with a `score`.
        score: `None` (the dot product `q . k * scale`), or a pairwise score
            (`keras_attn.scores.Score`: `pairwise(q, k, parameters)` on
            inputs it already prepared, e.g. Bahdanau's `v^T tanh(q + k)`).
        dropout_rate, seed, training: dropout on the weights, active when
            `dropout_rate` and `training` are both truthy.
        return_weights: whether the caller needs the `(..., Tq, Tv)` weights.
        normalize: `None` (the masked softmax), or `normalize(scores, mask)
            -> weights` (hard attention's selection); masked positions must
            get exactly zero weight.
        every_row_sees_a_key: the caller knows that every query row sees a
            key (a self-attention decoding step without padding: each new
            token is written valid and sees itself); the kernels then skip
            zeroing the rows that see none (`rows_visible`).
    """

    mask: Any = None
    is_causal: bool = False
    query_start: Any = None
    window: int | None = None
    bias: AttentionBias | None = None
    scale: float | None = None
    score: Any = None
    dropout_rate: float = 0.0
    seed: Any = None
    training: bool | None = False
    return_weights: bool = True
    normalize: Callable | None = None
    every_row_sees_a_key: bool = False

    @property
    def dropout(self) -> bool:
        """Whether dropout is active in this call."""
        return bool(self.dropout_rate) and not (self.training is None or self.training is False)

    @property
    def has_position_bias(self) -> bool:
        """Whether the bias holds a position bias (a function of positions)."""
        return self.bias is not None and bool(self.bias.position_biases)

    def whole_mask(self, query_length, value_length, constant=False):
        """The mask merged with the causal and window masks over the whole `(Tq, Tv)` grid.

        `constant`: the position masks as a NumPy constant where the lengths
        are static (an eager call: `keras_attn.masks.position_mask`).
        """
        positions = masks.position_mask(
            query_length,
            value_length,
            self.is_causal,
            self.window,
            self.query_start,
            constant=constant,
        )
        return masks.merge_masks(self.mask, positions)

    def visible_query_rows(
        self,
        query_length,
        value_length,
        query_mask=None,
        key_padding_mask=None,
        attention_mask=None,
    ):
        """Which query rows see a key under this call's masks: `(B|1, Tq|1, 1)` bool, or `None`.

        `keras_attn.masks.visible_query_rows` with this spec's causal mask,
        window and query start, for a layer's padding masks (`query_mask`
        `(B, Tq)`, `key_padding_mask` `(B, Tv)`) and explicit `attention_mask`
        `(B|1, Tq, Tv)`: the rows a layer zeroes after its output projection.
        """
        return masks.visible_query_rows(
            query_length, value_length, query_mask, key_padding_mask, attention_mask,
            self.is_causal, self.query_start, self.window,
        )  # fmt: skip

    def rows_visible(self, query_length, value_length) -> bool:
        """Whether every query row is known to see a key (no mask and static position masks,
        or `every_row_sees_a_key`)."""
        if self.every_row_sees_a_key:
            return True
        return self.mask is None and masks.position_rows_visible(
            query_length, value_length, self.is_causal, self.window, self.query_start
        )

    def whole_bias(self, query, query_length, value_length):
        """The float32 bias over the whole `(Tq, Tv)` grid of `query`'s heads, or `None`."""
        if self.bias is None:
            return None
        return self.bias.full(
            masks.query_positions(query_length, value_length, self.query_start),
            masks.key_positions(value_length),
            bias_lib.num_heads_of(query),
        )

    def replace(self, **changes) -> "AttentionSpec":
        return dataclasses.replace(self, **changes)
