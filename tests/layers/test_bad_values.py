"""The bad-input matrix, continued: the rows with a documented result (empty sequences,
NaN and inf at masked and at visible positions): `(id, target, check of the result)`.
"""

import numpy as np
import pytest
import tensorflow as tf
from bad_inputs import (
    DECODER,
    ENCODER,
    LEARNED,
    MHA,
    Q_MASK,
    V_MASK,
    Q,
    V,
    X,
    call,
    make,
    np_,
    row,
)
from bad_inputs import set_at as _set

import keras_attn as ka
import layer_checks

V_NAN_PAD = _set(V, (0, 4), np.nan)  # NaN in a padded step of example 0 (V_MASK[0, 4] is False)
X_NAN_LAST = _set(X, (slice(None), 4), np.nan)  # NaN at the last step of every example


def same_visible_output(clean):
    """The result (each output) equals `clean()` (the same call without the NaN), and is finite."""

    def check(result):
        reference = clean()
        pairs = zip(
            *(x if isinstance(x, tuple) else (x,) for x in (result, reference)), strict=True
        )
        for out, ref in pairs:
            out, ref = np_(out), np_(ref)
            assert np.all(np.isfinite(out))
            np.testing.assert_allclose(out, ref, atol=1e-6)

    return check


def earlier_rows_unchanged(clean, before):
    def check(result):
        result, reference = np_(result)[:, :before], np_(clean())[:, :before]
        assert np.all(np.isfinite(result))
        np.testing.assert_allclose(result, reference, atol=1e-6)

    return check


def zeros(shape):
    def check(result):
        result = [np_(r) for r in (result if isinstance(result, tuple) else (result,))]
        assert result[0].shape == shape and np.all(result[0] == 0), result[0]
        for other in result[1:]:
            assert other.size == 0, other.shape  # weights with an empty axis

    return check


def shape_is(shape):
    def check(result):
        assert tuple(result.shape) == shape

    return check


def nan_rows(rows):
    """Rows `rows` (bool (B, Tq)) of the output are NaN, the others finite."""

    def check(result):
        result = np_(result)
        assert np.all(np.isnan(result[rows])) and np.all(np.isfinite(result[~rows]))

    return check


def _twice(factory, clean_args, dirty_args, kwargs, checker):
    """`(target, check)`: one layer called on the dirty inputs, checked against the clean ones."""
    layers = []

    def layer():
        if not layers:
            layers.append(factory())
            layers[0](*clean_args, **kwargs)  # build: both calls use the same weights
        return layers[0]

    return (lambda: layer()(*dirty_args, **kwargs),
            checker(lambda: layer()(*clean_args, **kwargs)))  # fmt: skip


def _learned_xla_overflow():
    layer = LEARNED()
    layer.build((None, None, 8))
    signature = [tf.TensorSpec((None, None, 8))]
    function = tf.function(lambda x: layer(x), input_signature=signature, jit_compile=True)
    return function(np.zeros((1, 10, 8), "float32"))


def _learned_compiled_start(start_index):
    """A LearnedPositionalEmbedding(8) compiled (XLA) with a traced `start_index`, then run."""

    def run():
        layer = LEARNED()
        layer.build((None, 4, 8))
        compiled = layer_checks.compiled(lambda x, s: layer(x, start_index=s))
        return compiled(np.zeros((1, 4, 8), "float32"), np.int32(start_index))

    return run


def nan_from(step):
    """Steps before `step` are finite, the steps from `step` on NaN."""

    def check(result):
        result = np_(result)
        assert np.all(np.isfinite(result[:, :step])) and np.all(np.isnan(result[:, step:]))

    return check


CAUSAL_ROWS = np.arange(5)[None, :].repeat(2, 0) >= 4  # rows that see step 4 under a causal mask


def _results():
    vm = {"value_mask": V_MASK}
    return [
        # -- empty sequences: every row sees nothing, so zeros; empty weights -------------
        ("DotAttention Tv=0", call(ka.DotAttention, Q, V[:, :0], return_attention_scores=True),
         zeros((2, 4, 6))),
        ("KeyValueAttention(output_dim, bias 1) Tv=0",
         call(make(ka.KeyValueAttention, 3, output_dim=5, bias_initializer="ones"), Q, V[:, :0],
              return_attention_scores=True), zeros((2, 4, 5))),
        ("MultiHeadAttention(bias 1) Tv=0",
         call(make(MHA, bias_initializer="ones"), Q, V[:, :0], return_attention_scores=True),
         zeros((2, 4, 6))),
        ("AdditiveAttention causal, Tv=0",
         call(make(ka.AdditiveAttention, 3), Q, V[:, :0], use_causal_mask=True),
         zeros((2, 4, 6))),
        ("AdditiveAttention Tq=0", call(make(ka.AdditiveAttention, 3), Q[:, :0], V),
         shape_is((2, 0, 6))),
        ("KeyValueAttention batch 0", call(make(ka.KeyValueAttention, 3), Q[:0], V[:0]),
         shape_is((0, 4, 3))),
        ("AttentionPooling T=0",
         call(make(ka.AttentionPooling, 3), V[:, :0], return_attention_scores=True),
         zeros((2, 6))),
        ("TransformerEncoderBlock T=0", call(ENCODER, X[:, :0]), shape_is((2, 0, 8))),
        ("TransformerDecoderBlock T=0, source T=0", call(DECODER, X[:, :0], X[:, :0]),
         shape_is((2, 0, 8))),
        ("TokenAndPositionEmbedding(learned) T=0",
         call(make(ka.TokenAndPositionEmbedding, 10, 4, 8, position="learned"),
              np.zeros((2, 0), "int32")), shape_is((2, 0, 8))),
        # -- NaN / inf at a masked position never reaches a visible output -------------------
        ("DotAttention NaN in a padded value",
         *_twice(ka.DotAttention, (Q, V), (Q, V_NAN_PAD), vm, same_visible_output)),
        ("AdditiveAttention inf in a padded key",
         *_twice(make(ka.AdditiveAttention, 3), (Q, V, V), (Q, V, _set(V, (0, 4), np.inf)), vm,
                 same_visible_output)),
        ("BilinearAttention -inf in a padded value",
         *_twice(ka.BilinearAttention, (Q, V), (Q, _set(V, (1, 3), -np.inf)), vm,
                 same_visible_output)),
        ("KeyValueAttention NaN in a padded value",
         *_twice(make(ka.KeyValueAttention, 3, output_dim=4), (Q, V), (Q, V_NAN_PAD), vm,
                 same_visible_output)),
        ("HardAttention NaN in a padded value",
         *_twice(ka.HardAttention, (Q, V), (Q, V_NAN_PAD), vm, same_visible_output)),
        ("PointerAttention NaN in a padded value",
         *_twice(make(ka.PointerAttention, 3), (Q, V), (Q, V_NAN_PAD), vm, same_visible_output)),
        ("AttentionPooling NaN at a masked step",
         *_twice(make(ka.AttentionPooling, 3), (V,), (V_NAN_PAD,), {"mask": V_MASK},
                 same_visible_output)),
        ("ScaledDotAttention NaN at the last step, causal: earlier rows unchanged",
         *_twice(ka.ScaledDotAttention, (X, X), (X_NAN_LAST, X_NAN_LAST),
                 {"use_causal_mask": True}, lambda clean: earlier_rows_unchanged(clean, 4))),
        ("DotAttention NaN in a padded query row: zeros",
         call(ka.DotAttention, _set(Q, (0, 3), np.nan), V, query_mask=Q_MASK),
         lambda out: np.testing.assert_array_equal(np_(out)[0, 3], 0.0)),
        pytest.param("LearnedPositionalEmbedding(8) dynamic length 10 under XLA: NaN past the "
                     "table", _learned_xla_overflow, nan_from(8),
                     marks=pytest.mark.tensorflow_only),
        pytest.param("LearnedPositionalEmbedding(8) traced start_index 6 + length 4, compiled: "
                     "NaN past the table", _learned_compiled_start(6), nan_from(2),
                     marks=pytest.mark.xla),
        # -- NaN / inf at a visible position propagates to the rows that see it --------------
        ("ScaledDotAttention NaN at the last step, causal: that row is NaN",
         call(ka.ScaledDotAttention, X_NAN_LAST, X_NAN_LAST, use_causal_mask=True),
         nan_rows(CAUSAL_ROWS)),
        ("DotAttention inf in a visible value: every row that sees it NaN",
         call(ka.DotAttention, Q, _set(V, (0, 0), np.inf), V),
         nan_rows(np.array([[1, 1, 1, 1], [0, 0, 0, 0]], bool))),
        ("HardAttention NaN in a visible key: NaN, no position selected",
         call(ka.HardAttention, Q, V, _set(V, (1, 2), np.nan)),
         nan_rows(np.array([[0, 0, 0, 0], [1, 1, 1, 1]], bool))),
        ("AttentionPooling NaN at an unmasked step: NaN",
         call(make(ka.AttentionPooling, 3), V_NAN_PAD),
         lambda out: np.testing.assert_array_equal(np.isnan(np_(out)).all(-1), [True, False])),
        # -- the same guarantee through MultiHeadAttention (its combine is ops.weighted_sum) --
        # The fused path (no weights returned), the dense path (weights returned), chunked.
        ("MultiHeadAttention NaN in a padded value",
         *_twice(MHA, (Q, V), (Q, V_NAN_PAD), vm, same_visible_output)),
        ("MultiHeadAttention(return_attention_scores) -inf in a padded value",
         *_twice(MHA, (Q, V), (Q, _set(V, (1, 3), -np.inf)),
                 {**vm, "return_attention_scores": True}, same_visible_output)),
        ("MultiHeadAttention chunked, NaN in a padded value",
         *_twice(make(MHA, implementation="chunked"), (Q, V), (Q, V_NAN_PAD), vm,
                 same_visible_output)),
        ("TransformerDecoderBlock NaN at the last step: earlier rows unchanged",
         *_twice(DECODER, (X,), (X_NAN_LAST,), {},
                 lambda clean: earlier_rows_unchanged(clean, 4))),
        ("MultiHeadAttention inf in a visible value: every row that sees it NaN",
         call(MHA, Q, _set(V, (0, 0), np.inf), V),
         nan_rows(np.array([[1, 1, 1, 1], [0, 0, 0, 0]], bool))),
        ("MultiHeadAttention chunked, NaN in a visible key: every row that sees it NaN",
         call(make(MHA, implementation="chunked"), Q, V, _set(V, (1, 2), np.nan)),
         nan_rows(np.array([[0, 0, 0, 0], [1, 1, 1, 1]], bool))),
    ]  # fmt: skip


RESULTS = _results()


@pytest.mark.parametrize("target, check", [row(e) for e in RESULTS])
def test_bad_input_gives_the_documented_result(target, check):
    check(target())
