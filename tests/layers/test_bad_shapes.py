"""The bad-input matrix, continued: mismatched widths, lengths and batch sizes, mask shapes
and dtypes, input dtypes, sequences longer than a position table, the functional core.

Rows as in tests/layers/test_bad_arguments.py: `(id, target, exception type, message regex)`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from bad_inputs import (
    DECODER,
    ENCODER,
    LEARNED,
    MHA,
    V10,
    Q,
    V,
    X,
    call,
    call_built,
    make,
    row,
)

import keras_attn as ka
from keras_attn import ops


def _learned_in_graph(length, start_index=0):
    """A LearnedPositionalEmbedding(8) traced with a dynamic length, then run."""

    def run():
        layer = LEARNED()
        layer.build((None, None, 8))
        signature = [tf.TensorSpec((None, None, 8)), tf.TensorSpec((), "int32")]
        function = tf.function(lambda x, s: layer(x, start_index=s), input_signature=signature)
        return function(np.zeros((1, length, 8), "float32"), np.int32(start_index))

    return run


def _mha_cache_step(index, new_tokens=1):
    def run():
        layer = MHA()
        layer(Q, Q)
        cache = layer.empty_cache(2, 4)
        step = Q[:, :new_tokens]
        return layer(step, step, cache=cache, cache_update_index=index)

    return run


RAISES = [
    # -- mismatched widths, lengths, batch sizes ------------------------------------------
    ("DotAttention query width 6, key width 10", call(ka.DotAttention, Q, V10),
     ValueError, r"The last axis of `query` and `key` must match.*"
                 r"Received: query\.shape=\(2, 4, 6\), key\.shape=\(2, 5, 10\)"),
    ("ScaledDotAttention query width 6, key width 10",
     call(ka.ScaledDotAttention, Q, V10),
     ValueError, r"The last axis of `query` and `key` must match"),
    ("DotAttention key length 3, value length 5", call(ka.DotAttention, Q, V, V[:, :3]),
     ValueError, r"`key` and `value` must have the same length \(axis 1\)\. Received: 3 and 5"),
    ("DotAttention query batch 1, value batch 2", call(ka.DotAttention, Q[:1], V),
     ValueError, r"`query` and `value` must have the same batch size\. Received: 1 and 2"),
    ("AdditiveAttention built for width 6, query width 4",
     call_built(make(ka.AdditiveAttention, 3), (Q, V), Q[..., :4], V),
     ValueError, r"`query` must have width 6, the width this layer was built for\. "
                 r"Received: query\.shape=\(2, 4, 4\)"),
    ("BilinearAttention built for key width 6, key width 4",
     call_built(ka.BilinearAttention, (Q, V), Q, V[..., :4]),
     ValueError, r"`key` must have width 6, the width this layer was built for\. "
                 r"Received: key\.shape=\(2, 5, 4\)"),
    ("KeyValueAttention built for width 6, query width 4",
     call_built(make(ka.KeyValueAttention, 4), (Q, V), Q[..., :4], V),
     ValueError, r"layer 'query' is incompatible .*expected axis -1 of input shape to have "
                 r"value 6, but received input with shape \(2, 4, 4\)"),
    ("MultiHeadAttention built for width 6, query width 4",
     call_built(MHA, (Q, V), Q[..., :4], V),
     ValueError, r"`query` must have width 6, the width this layer was built for\. "
                 r"Received: query\.shape=\(2, 4, 4\)"),
    ("MultiHeadAttention built for key width 6, key width 10",
     call_built(MHA, (Q, V), Q, V, V10),
     ValueError, r"`key` must have width 6, the width this layer was built for\. "
                 r"Received: key\.shape=\(2, 5, 10\)"),
    ("AttentionPooling built for width 6, inputs width 4",
     call_built(make(ka.AttentionPooling, 3), (V,), V[..., :4]),
     ValueError, r"`inputs` must have width 6, the width this layer was built for\. "
                 r"Received: inputs\.shape=\(2, 5, 4\)"),
    ("LearnedPositionalEmbedding built for width 8, inputs width 6",
     call_built(LEARNED, (X,), V),
     ValueError, r"`inputs` must have width 8, the width this layer was built for\. "
                 r"Received: inputs\.shape=\(2, 5, 6\)"),
    ("TransformerEncoderBlock built for width 8, inputs width 6",
     call_built(ENCODER, (X,), V),
     ValueError, r"`inputs` must have width 8, the width this block was built for\. "
                 r"Received: inputs\.shape=\(2, 5, 6\)"),
    ("TransformerDecoderBlock built for source width 8, encoder width 6",
     call_built(DECODER, (X, X), X, V),
     ValueError, r"`encoder_sequence` must have width 8, the width this block was built for"),
    ("TransformerEncoder width 6 below num_heads=8",
     call(make(ka.TransformerEncoder, 8, 8), V),
     ValueError, r"The width of `inputs` \(6\) must be at least `num_heads` \(8\)"),
    ("RotaryEmbedding odd width", call(ka.RotaryEmbedding, np.zeros((1, 3, 5), "float32")),
     ValueError, r"The feature axis \(-1\) of `inputs` must be known and even\. "
                 r"Received: inputs\.shape=\(1, 3, 5\)"),
    # -- wrong mask shapes and dtypes -------------------------------------------------------
    ("value_mask length 4, value length 5",
     call(ka.DotAttention, Q, V, value_mask=np.ones((2, 4), bool)),
     ValueError, r"`value_mask` and `value` must have the same length\. Received: 4 and 5"),
    ("value_mask rank 3", call(ka.DotAttention, Q, V, value_mask=np.ones((2, 5, 1), bool)),
     ValueError, r"`value_mask` must have rank 2\. Received: value_mask\.shape=\(2, 5, 1\)"),
    ("value_mask batch 3, value batch 2",
     call(ka.DotAttention, Q, V, value_mask=np.ones((3, 5), bool)),
     ValueError, r"`value_mask` and `value` must have the same batch size\. Received: 3 and 2"),
    ("query_mask length 5, query length 4",
     call(ka.DotAttention, Q, V, query_mask=np.ones((2, 5), bool)),
     ValueError, r"`query_mask` and `query` must have the same length\. Received: 5 and 4"),
    ("query_mask batch 1, query batch 2",
     call(ka.AdditiveAttention, Q, V, query_mask=np.ones((1, 4), bool)),
     ValueError, r"`query_mask` and `query` must have the same batch size\. Received: 1 and 2"),
    ("attention_mask rank 2 for a rank-3 query",
     call(ka.DotAttention, Q, V, attention_mask=np.ones((4, 5), bool)),
     ValueError, r"`attention_mask` must have rank 3\. Received: attention_mask\.shape=\(4, 5\)"),
    ("attention_mask query length 3",
     call(ka.DotAttention, Q, V, attention_mask=np.ones((2, 3, 5), bool)),
     ValueError, r"`attention_mask` and `query` must have the same query length \(axis 1\)\. "
                 r"Received: 3 and 4"),
    ("attention_mask value length 6",
     call(ka.DotAttention, Q, V, attention_mask=np.ones((2, 4, 6), bool)),
     ValueError, r"`attention_mask` and `value` must have the same value length.*"
                 r"Received: 6 and 5"),
    ("attention_mask batch 3",
     call(ka.BilinearAttention, Q, V, attention_mask=np.ones((3, 4, 5), bool)),
     ValueError, r"`attention_mask` and `query` must have the same batch size \(or 1\)\. "
                 r"Received: 3 and 2"),
    ("rank-2 query, attention_mask rank 3",
     call(ka.DotAttention, Q[:, 0], V, attention_mask=np.ones((2, 1, 5), bool)),
     ValueError, r"`attention_mask` must have rank 2\. "
                 r"Received: attention_mask\.shape=\(2, 1, 5\)"),
    ("rank-2 query, query_mask (B, Tq)",
     call(ka.DotAttention, Q[:, 0], V, query_mask=np.ones((2, 4), bool)),
     ValueError, r"With a rank-2 query .*`query_mask` must have shape \(batch,\)\. "
                 r"Received: query_mask\.shape=\(2, 4\)"),
    ("MultiHeadAttention chunked, rank-2 query, query_mask (B, Tq)",
     call(make(MHA, implementation="chunked"), Q[:, 0], V, query_mask=np.ones((2, 4), bool)),
     ValueError, r"With a rank-2 query .*`query_mask` must have shape \(batch,\)"),
    ("additive float value_mask (read as 0/1 it would be inverted)",
     call(ka.DotAttention, Q, V, value_mask=np.array([[0, 0, 0, -1e9, -1e9]] * 2, "float32")),
     ValueError, r"`value_mask` must be a boolean mask .*an additive mask .*"
                 r"Received: value_mask\.dtype=float32 holding -1e\+09"),
    ("float attention_mask of 0.5",
     call(make(ka.KeyValueAttention, 4), Q, V, attention_mask=np.full((2, 4, 5), 0.5, "f4")),
     ValueError, r"`attention_mask` must be a boolean mask .*"
                 r"Received: attention_mask\.dtype=float32 holding 0\.5"),
    ("MultiHeadAttention float query_mask holding NaN",
     call(MHA, Q, V, query_mask=np.array([[1, 1, 1, np.nan]] * 2, "float16")),
     ValueError, r"`query_mask` must be a boolean mask .*Received: query_mask\.dtype=float\d+ "
                 r"holding nan"),
    ("MultiHeadAttention complex attention_mask",
     call(MHA, Q, V, attention_mask=np.ones((2, 4, 5), "complex64")),
     TypeError, r"`attention_mask` must be a boolean mask .*"
                r"Received: attention_mask\.dtype=complex64"),
    ("MultiHeadAttention value_mask length 4",
     call(MHA, Q, V, value_mask=np.ones((2, 4), bool)),
     ValueError, r"`value_mask` and `value` must have the same length\. Received: 4 and 5"),
    ("AttentionPooling mask length 4",
     call(make(ka.AttentionPooling, 4), V, mask=np.ones((2, 4), bool)),
     ValueError, r"`mask` and `inputs` must have the same length\. "
                 r"Received: mask\.shape=\(2, 4\), inputs\.shape=\(2, 5, 6\)"),
    ("AttentionPooling float mask of 2s",
     call(make(ka.AttentionPooling, 4), V, mask=np.full((2, 5), 2.0, "float32")),
     ValueError, r"`mask` must be a boolean mask .*Received: mask\.dtype=float32 holding 2"),
    ("TransformerEncoderBlock padding_mask length 4",
     call(ENCODER, X, padding_mask=np.ones((2, 4), bool)),
     ValueError, r"`padding_mask` and `inputs` must have the same length\. Received: 4 and 5"),
    ("TransformerEncoderBlock additive float padding_mask",
     call(ENCODER, X, padding_mask=np.array([[0, 0, 0, 0, -1e9]] * 2, "float32")),
     ValueError, r"`padding_mask` must be a boolean mask .*"
                 r"Received: padding_mask\.dtype=float32 holding -1e\+09"),
    ("TransformerDecoderBlock float encoder_padding_mask of -1",
     call(DECODER, X, X, encoder_padding_mask=np.full((2, 5), -1.0, "float32")),
     ValueError, r"`encoder_padding_mask` must be a boolean mask .*holding -1"),
    ("TransformerDecoderBlock encoder_padding_mask length 3",
     call(DECODER, X, X, encoder_padding_mask=np.ones((2, 3), bool)),
     ValueError, r"`encoder_padding_mask` and `encoder_sequence` must have the same length\. "
                 r"Received: 3 and 5"),
    # -- wrong dtypes of the inputs ---------------------------------------------------------
    ("DotAttention int32 query and value (token ids)",
     call(ka.DotAttention, Q.astype("int32"), V.astype("int32")),
     TypeError, r"`query` must be a floating-point tensor .*Received: query\.dtype=int32"),
    ("AdditiveAttention int32 value", call(make(ka.AdditiveAttention, 3), Q, V.astype("int32")),
     TypeError, r"`value` must be a floating-point tensor .*Received: value\.dtype=int32"),
    ("MultiHeadAttention bool query", call(MHA, Q > 0, V),
     TypeError, r"`query` must be a floating-point tensor .*Received: query\.dtype=bool"),
    ("MultiHeadAttention chunked int32 query",
     call(make(MHA, implementation="chunked"), Q.astype("int32"), V),
     TypeError, r"`query` must be a floating-point tensor"),
    ("AttentionPooling int32 inputs", call(make(ka.AttentionPooling, 4), V.astype("int32")),
     TypeError, r"`inputs` must be a floating-point tensor .*Received: inputs\.dtype=int32"),
    ("SinusoidalPositionalEncoding int32 inputs",
     call(ka.SinusoidalPositionalEncoding, X.astype("int32")),
     TypeError, r"`inputs` must be a floating-point tensor .*Received: inputs\.dtype=int32"),
    ("RotaryEmbedding int32 inputs", call(ka.RotaryEmbedding, X.astype("int32")),
     TypeError, r"`inputs` must be a floating-point tensor .*Received: inputs\.dtype=int32"),
    ("LearnedPositionalEmbedding int32 inputs", call(LEARNED, X.astype("int32")),
     TypeError, r"`inputs` must be a floating-point tensor .*Received: inputs\.dtype=int32"),
    ("TransformerEncoderBlock int32 inputs", call(ENCODER, X.astype("int32")),
     TypeError, r"`inputs` must be a floating-point tensor .*Received: inputs\.dtype=int32"),
    # -- sequences longer than a learned position table ----------------------------------
    ("LearnedPositionalEmbedding(8), static length 9", call(LEARNED, np.zeros((1, 9, 8), "f4")),
     ValueError, r"does not fit in `sequence_length` positions\. Received: input length=9, "
                 r"start_index=0, sequence_length=8"),
    ("LearnedPositionalEmbedding(8), start_index=5 + length 5",
     call(LEARNED, X, start_index=5),
     ValueError, r"input length=5, start_index=5, sequence_length=8"),
    ("LearnedPositionalEmbedding(8), eager tensor start_index=6",
     call(LEARNED, X, start_index=keras.ops.convert_to_tensor(6)),
     ValueError, r"input length=5, start_index=6, sequence_length=8"),
    ("LearnedPositionalEmbedding(8), start_index=-1", call(LEARNED, X, start_index=-1),
     ValueError, r"`start_index` must be >= 0\. Received: start_index=-1"),
    pytest.param(
        "LearnedPositionalEmbedding(8), dynamic length 9 in a tf.function",
        _learned_in_graph(9),
        tf.errors.InvalidArgumentError, r"does not fit in `sequence_length` positions.*"
                                        r"sequence_length=8.*\[9\]",
        marks=pytest.mark.tensorflow_only,
    ),
    pytest.param(
        "LearnedPositionalEmbedding(8), dynamic start_index 6 + length 4 in a tf.function",
        _learned_in_graph(4, 6),
        tf.errors.InvalidArgumentError, r"does not fit in `sequence_length` positions.*\[10\]",
        marks=pytest.mark.tensorflow_only,
    ),
    ("TokenAndPositionEmbedding(learned, 6), length 7",
     call(make(ka.TokenAndPositionEmbedding, 20, 6, 4, position="learned"),
          np.ones((1, 7), "int32")),
     ValueError, r"input length=7, start_index=0, sequence_length=6"),
    ("MultiHeadAttention cache of 4, cache_update_index=6", _mha_cache_step(6),
     ValueError, r"`cache_update_index` .*Received: cache_update_index=6"),
    ("MultiHeadAttention cache_update_index=-1", _mha_cache_step(-1),
     ValueError, r"`cache_update_index` .*Received: cache_update_index=-1"),
    ("MultiHeadAttention cache of 4, 2 new tokens at cache_update_index=3",
     _mha_cache_step(3, new_tokens=2),
     ValueError, r"`cache_update_index` .*Received: cache_update_index=3, Tq=2, cache length=4"),
    # -- the functional core ---------------------------------------------------------------
    ("ops.attention query width 6, key width 10", lambda: ops.attention(Q, V10, V10),
     ValueError, r"The last axis of `query` and `key` must match.*query\.shape=\(2, 4, 6\)"),
    ("ops.attention rank-1 query", lambda: ops.attention(Q[0, 0], V[0], V[0]),
     ValueError, r"`query` must have rank >= 2"),
    ("ops.masked_softmax mask (3, 5) for scores (2, 4, 5)",
     lambda: ops.masked_softmax(np.zeros((2, 4, 5), "float32"), np.ones((3, 5), bool)),
     ValueError, r"`mask` .*broadcast.*Received: mask\.shape=\(3, 5\)"),
    ("ops.attention additive float mask",
     lambda: ops.attention(Q, V, V, mask=np.full((2, 4, 5), -1e9, "f4")),
     ValueError, r"`mask` must be a boolean mask .*holding -1e\+09"),
    ("ops.attention key rank 2, query rank 3", lambda: ops.attention(Q, V[0], V[0]),
     ValueError, r"`query`, `key` and `value` must have the same rank\. Received: "
                 r"query\.shape=\(2, 4, 6\), key\.shape=\(5, 6\)"),
    ("ops.attention(return_weights=False) mask (2, 3, 5) for scores (2, 4, 5)",
     lambda: ops.attention(Q, V, V, mask=np.ones((2, 3, 5), bool), return_weights=False),
     ValueError, r"`mask` must broadcast to the shape of the scores, \(2, 4, 5\)\. "
                 r"Received: mask\.shape=\(2, 3, 5\)"),
]  # fmt: skip


@pytest.mark.parametrize("target, error, match", [row(e) for e in RAISES])
def test_bad_input_raises_a_clear_error(target, error, match):
    with pytest.raises(error, match=match):
        target()
