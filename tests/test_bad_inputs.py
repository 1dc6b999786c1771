"""The bad-input matrix: one row per case.

Each row is a constructor or a call with one bad value, and either the
exception it must raise (type, and a regex on the message, which names the
argument and what was received) or the documented result it must give
(empty sequences, NaN and inf). Never a crash deep in TensorFlow, never a
silent wrong answer. Every row runs on every Keras backend except those
marked `tensorflow_only` (a `tf.function` with a dynamic length: a run-time
check that only a TensorFlow graph has).
"""

import functools
import pathlib
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_attn as ka
import layer_checks
from keras_attn import ops

rng = np.random.default_rng(0)
Q = rng.normal(size=(2, 4, 6)).astype("float32")  # (B, Tq, dq)
V = rng.normal(size=(2, 5, 6)).astype("float32")  # (B, Tv, dv)
V10 = rng.normal(size=(2, 5, 10)).astype("float32")
X = rng.normal(size=(2, 5, 8)).astype("float32")  # a d_model = 8 sequence
V_MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], bool)
Q_MASK = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)


def np_(x):
    return keras.ops.convert_to_numpy(x)


def make(cls, *args, **kwargs):
    """Row target: the constructor call itself."""
    return functools.partial(cls, *args, **kwargs)


def call(factory, *args, **kwargs):
    """Row target: a fresh layer from `factory`, called once."""
    return lambda: factory()(*args, **kwargs)


def call_built(factory, build_args, *args, **kwargs):
    """Row target: a layer built by a first call on `build_args`, then called again."""

    def run():
        layer = factory()
        layer(*build_args)
        return layer(*args, **kwargs)

    return run


MHA = functools.partial(ka.MultiHeadAttention, num_heads=2, key_dim=4)
ENCODER = functools.partial(ka.TransformerEncoderBlock, intermediate_dim=8, num_heads=2)
DECODER = functools.partial(ka.TransformerDecoderBlock, intermediate_dim=8, num_heads=2)
LEARNED = functools.partial(ka.LearnedPositionalEmbedding, sequence_length=8)


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


# ---------------------------------------------------------------------------
# Rows that raise: (target, exception type, message regex)
# ---------------------------------------------------------------------------

POSITIVE = r"must be a positive integer\. Received: "
RAISES = [
    # -- constructor arguments: negative, zero, wrong type --------------------------------
    ("DotAttention dropout=1.5", make(ka.DotAttention, dropout=1.5),
     ValueError, r"`dropout` must be a number in \[0, 1\)\. Received: dropout=1\.5"),
    ("DotAttention dropout=-0.1", make(ka.DotAttention, dropout=-0.1),
     ValueError, r"`dropout` must be .*Received: dropout=-0\.1"),
    ("ScaledDotAttention scale=0", make(ka.ScaledDotAttention, scale=0),
     ValueError, r"`scale` must be positive and finite\. Received: scale=0"),
    ("ScaledDotAttention scale=-1.0", make(ka.ScaledDotAttention, scale=-1.0),
     ValueError, r"`scale` must be positive and finite\. Received: scale=-1\.0"),
    ("ScaledDotAttention scale='big'", make(ka.ScaledDotAttention, scale="big"),
     TypeError, r"`scale` must be a number or None\. Received: scale='big'"),
    ("ScaledDotAttention scale=True", make(ka.ScaledDotAttention, scale=True),
     TypeError, r"`scale` must be a number or None\. Received: scale=True"),
    ("AdditiveAttention units=0", make(ka.AdditiveAttention, units=0),
     ValueError, r"`units` must be a positive integer or None\. Received: units=0"),
    ("AdditiveAttention units=-3", make(ka.AdditiveAttention, units=-3),
     ValueError, r"`units` must be a positive integer or None\. Received: units=-3"),
    ("AdditiveAttention units=2.5", make(ka.AdditiveAttention, units=2.5),
     ValueError, r"`units` must be a positive integer or None\. Received: units=2\.5"),
    ("AdditiveAttention units=True", make(ka.AdditiveAttention, units=True),
     ValueError, r"`units` must be a positive integer or None\. Received: units=True"),
    ("ScoreAttention score='cosine'", make(ka.ScoreAttention, score="cosine"),
     ValueError, r"`score` must be one of .*Received: score='cosine'"),
    ("ScoreAttention score=3", make(ka.ScoreAttention, score=3),
     TypeError, r"`score` must be a string, a config dict or a Score layer\. Received: score=3"),
    ("ScoreAttention score=<Dense config>",
     make(ka.ScoreAttention, score=keras.saving.serialize_keras_object(keras.layers.Dense(2))),
     TypeError, r"A `score` config must deserialize to a keras_attn\.scores\.Score layer\. "
                r"Received: Dense"),
    ("KeyValueAttention key_dim=0", make(ka.KeyValueAttention, key_dim=0),
     ValueError, r"`key_dim` " + POSITIVE + "key_dim=0"),
    ("KeyValueAttention value_dim=-1", make(ka.KeyValueAttention, key_dim=4, value_dim=-1),
     ValueError, r"`value_dim` " + POSITIVE + "value_dim=-1"),
    ("KeyValueAttention output_dim=0", make(ka.KeyValueAttention, key_dim=4, output_dim=0),
     ValueError, r"`output_dim` " + POSITIVE + "output_dim=0"),
    ("HardAttention temperature=0", make(ka.HardAttention, temperature=0),
     ValueError, r"`temperature` must be a positive number\. Received: temperature=0"),
    ("HardAttention temperature=-1.0", make(ka.HardAttention, temperature=-1.0),
     ValueError, r"`temperature` must be a positive number\. Received: temperature=-1\.0"),
    ("PointerAttention units=0", make(ka.PointerAttention, units=0),
     ValueError, r"`units` " + POSITIVE + "units=0"),
    ("MultiHeadAttention num_heads=0", make(ka.MultiHeadAttention, num_heads=0, key_dim=4),
     ValueError, r"`num_heads` " + POSITIVE + "num_heads=0"),
    ("MultiHeadAttention key_dim=0", make(ka.MultiHeadAttention, num_heads=2, key_dim=0),
     ValueError, r"`key_dim` " + POSITIVE + "key_dim=0"),
    ("MultiHeadAttention num_key_value_heads=3 of 4",
     make(ka.MultiHeadAttention, num_heads=4, key_dim=4, num_key_value_heads=3),
     ValueError, r"`num_key_value_heads` must divide `num_heads`\. "
                 r"Received: num_key_value_heads=3, num_heads=4"),
    ("MultiHeadAttention num_key_value_heads=8 of 4",
     make(ka.MultiHeadAttention, num_heads=4, key_dim=4, num_key_value_heads=8),
     ValueError, r"`num_key_value_heads` must divide `num_heads`\. "
                 r"Received: num_key_value_heads=8, num_heads=4"),
    ("MultiHeadAttention num_key_value_heads=0",
     make(ka.MultiHeadAttention, num_heads=4, key_dim=4, num_key_value_heads=0),
     ValueError, r"`num_key_value_heads` " + POSITIVE + "num_key_value_heads=0"),
    ("MultiHeadAttention dropout=1.0", make(MHA, dropout=1.0),
     ValueError, r"`dropout` must be a number in \[0, 1\)\. Received: dropout=1\.0"),
    ("MultiHeadAttention implementation='flash'", make(MHA, implementation="flash"),
     ValueError, r"`implementation` must be one of .*Received: implementation='flash'"),
    ("MultiHeadAttention odd key_dim with rotary",
     make(ka.MultiHeadAttention, 2, 3, rotary_embedding=ka.RotaryEmbedding()),
     ValueError, r"`key_dim` must be even .*Received: key_dim=3"),
    ("MultiHeadAttention rotary_embedding='rope'", make(MHA, rotary_embedding="rope"),
     TypeError, r"`rotary_embedding` must be None or a layer .*Received: rotary_embedding='rope'"),
    ("AttentionPooling units=0", make(ka.AttentionPooling, units=0),
     ValueError, r"`units` " + POSITIVE + "units=0"),
    ("AttentionPooling dropout=1.0", make(ka.AttentionPooling, units=4, dropout=1.0),
     ValueError, r"`dropout` must be a number in \[0, 1\)\. Received: dropout=1\.0"),
    ("FeedForward intermediate_dim=0", make(ka.FeedForward, intermediate_dim=0),
     ValueError, r"`intermediate_dim` " + POSITIVE + "intermediate_dim=0"),
    ("FeedForward output_dim=-2", make(ka.FeedForward, intermediate_dim=4, output_dim=-2),
     ValueError, r"`output_dim` " + POSITIVE + "output_dim=-2"),
    ("TransformerEncoderBlock num_heads=0",
     make(ka.TransformerEncoderBlock, intermediate_dim=8, num_heads=0),
     ValueError, r"`num_heads` " + POSITIVE + "num_heads=0"),
    ("TransformerEncoderBlock num_key_value_heads=3 of 4",
     make(ka.TransformerEncoderBlock, intermediate_dim=8, num_heads=4, num_key_value_heads=3),
     ValueError, r"`num_key_value_heads` must divide `num_heads`\. "
                 r"Received: num_key_value_heads=3, num_heads=4"),
    ("TransformerDecoderBlock num_key_value_heads=0", make(DECODER, num_key_value_heads=0),
     ValueError, r"`num_key_value_heads` " + POSITIVE + "num_key_value_heads=0"),
    ("TransformerEncoderBlock layer_norm_epsilon=-1e-5", make(ENCODER, layer_norm_epsilon=-1e-5),
     ValueError, r"`layer_norm_epsilon` must be a positive number\. "
                 r"Received: layer_norm_epsilon=-1e-05"),
    ("TransformerEncoderBlock key_dim=0", make(ENCODER, key_dim=0),
     ValueError, r"`key_dim` " + POSITIVE + "key_dim=0"),
    ("TransformerEncoderBlock normalize_first='yes'", make(ENCODER, normalize_first="yes"),
     TypeError, r"`normalize_first` must be a bool\. Received: normalize_first='yes'"),
    ("SinusoidalPositionalEncoding max_wavelength=0",
     make(ka.SinusoidalPositionalEncoding, max_wavelength=0),
     ValueError, r"`max_wavelength` must be a positive number\. Received: max_wavelength=0"),
    ("LearnedPositionalEmbedding sequence_length=0",
     make(ka.LearnedPositionalEmbedding, sequence_length=0),
     ValueError, r"`sequence_length` " + POSITIVE + "sequence_length=0"),
    ("RotaryEmbedding scaling_factor=-1", make(ka.RotaryEmbedding, scaling_factor=-1),
     ValueError, r"`scaling_factor` must be a positive number\. Received: scaling_factor=-1"),
    ("TokenAndPositionEmbedding vocabulary_size=0", make(ka.TokenAndPositionEmbedding, 0, 8, 4),
     ValueError, r"`vocabulary_size` " + POSITIVE + "vocabulary_size=0"),
    ("TokenAndPositionEmbedding sequence_length=-1",
     make(ka.TokenAndPositionEmbedding, 10, -1, 4),
     ValueError, r"`sequence_length` " + POSITIVE + "sequence_length=-1"),
    ("TokenAndPositionEmbedding position='rope'",
     make(ka.TokenAndPositionEmbedding, 10, 8, 4, position="rope"),
     ValueError, r"`position` must be one of .*Received: position='rope'"),
    # -- wrong ranks -----------------------------------------------------------------------
    ("DotAttention query rank 4", call(ka.DotAttention, Q[..., None], V),
     ValueError, r"`query` must have rank 2 or 3\. Received: query\.shape=\(2, 4, 6, 1\)"),
    ("DotAttention query rank 1", call(ka.DotAttention, Q[0, 0], V),
     ValueError, r"`query` must have rank 2 or 3\. Received: query\.shape=\(6,\)"),
    ("DotAttention value rank 2", call(ka.DotAttention, Q, V[:, 0]),
     ValueError, r"`value` must have rank 3\. Received: value\.shape=\(2, 6\)"),
    ("DotAttention key rank 4", call(ka.DotAttention, Q, V, V[..., None]),
     ValueError, r"`key` must have rank 3\. Received: key\.shape=\(2, 5, 6, 1\)"),
    ("MultiHeadAttention value rank 2", call(MHA, Q, V[:, 0]),
     ValueError, r"`value` must have rank 3\. Received: value\.shape=\(2, 6\)"),
    ("AttentionPooling inputs rank 2", call(make(ka.AttentionPooling, 4), V[:, 0]),
     ValueError, r"`inputs` must have rank 3\. Received: inputs\.shape=\(2, 6\)"),
    ("TransformerEncoderBlock inputs rank 2", call(ENCODER, X[:, 0]),
     ValueError, r"`inputs` must have shape \(batch, length, features\).*"
                 r"Received: inputs\.shape=\(2, 8\)"),
    ("TransformerDecoderBlock encoder_sequence rank 2", call(DECODER, X, X[:, 0]),
     ValueError, r"`encoder_sequence` must have shape \(batch, length, features\).*"
                 r"Received: encoder_sequence\.shape=\(2, 8\)"),
    ("SinusoidalPositionalEncoding inputs rank 2", call(ka.SinusoidalPositionalEncoding, X[:, 0]),
     ValueError, r"`inputs` must have rank >= 3\. Received: inputs\.shape=\(2, 8\)"),
    ("RotaryEmbedding inputs rank 2", call(ka.RotaryEmbedding, X[:, 0]),
     ValueError, r"`inputs` must have rank >= 3\. Received: inputs\.shape=\(2, 8\)"),
    ("TokenAndPositionEmbedding inputs rank 1",
     call(make(ka.TokenAndPositionEmbedding, 10, 8, 4), np.ones((3,), "int32")),
     ValueError, r"`inputs` must have rank >= 2\. Received: inputs\.shape=\(3,\)"),
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
    ("TransformerEncoderBlock width 6 not divisible by num_heads=4",
     call(make(ka.TransformerEncoderBlock, 8, 4), V),
     ValueError, r"The width of `inputs` \(6\) must be divisible by `num_heads` \(4\)"),
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
    ("float value_mask (an additive mask would be inverted)",
     call(ka.DotAttention, Q, V, value_mask=np.zeros((2, 5), "float32")),
     TypeError, r"`value_mask` must be a boolean mask .*Received: value_mask\.dtype=float32"),
    ("float attention_mask",
     call(make(ka.KeyValueAttention, 4), Q, V, attention_mask=np.ones((2, 4, 5), "float32")),
     TypeError, r"`attention_mask` must be a boolean mask .*"
                r"Received: attention_mask\.dtype=float32"),
    ("MultiHeadAttention float query_mask",
     call(MHA, Q, V, query_mask=np.ones((2, 4), "float16")),
     TypeError, r"`query_mask` must be a boolean mask .*Received: query_mask\.dtype=float\d+"),
    ("MultiHeadAttention value_mask length 4",
     call(MHA, Q, V, value_mask=np.ones((2, 4), bool)),
     ValueError, r"`value_mask` and `value` must have the same length\. Received: 4 and 5"),
    ("AttentionPooling mask length 4",
     call(make(ka.AttentionPooling, 4), V, mask=np.ones((2, 4), bool)),
     ValueError, r"`mask` and `inputs` must have the same length\. "
                 r"Received: mask\.shape=\(2, 4\), inputs\.shape=\(2, 5, 6\)"),
    ("AttentionPooling float mask",
     call(make(ka.AttentionPooling, 4), V, mask=np.ones((2, 5), "float32")),
     TypeError, r"`mask` must be a boolean mask .*Received: mask\.dtype=float32"),
    ("TransformerEncoderBlock padding_mask length 4",
     call(ENCODER, X, padding_mask=np.ones((2, 4), bool)),
     ValueError, r"`padding_mask` and `inputs` must have the same length\. Received: 4 and 5"),
    ("TransformerEncoderBlock float padding_mask",
     call(ENCODER, X, padding_mask=np.ones((2, 5), "float32")),
     TypeError, r"`padding_mask` must be a boolean mask .*Received: padding_mask\.dtype=float32"),
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
    ("ops.attention float mask", lambda: ops.attention(Q, V, V, mask=np.zeros((2, 4, 5), "f4")),
     TypeError, r"`mask` must be a boolean mask"),
    ("ops.attention key rank 2, query rank 3", lambda: ops.attention(Q, V[0], V[0]),
     ValueError, r"`query`, `key` and `value` must have the same rank\. Received: "
                 r"query\.shape=\(2, 4, 6\), key\.shape=\(5, 6\)"),
    ("ops.attention(return_weights=False) mask (2, 3, 5) for scores (2, 4, 5)",
     lambda: ops.attention(Q, V, V, mask=np.ones((2, 3, 5), bool), return_weights=False),
     ValueError, r"`mask` must broadcast to the shape of the scores, \(2, 4, 5\)\. "
                 r"Received: mask\.shape=\(2, 3, 5\)"),
]  # fmt: skip


def _row(entry):
    """`pytest.param` of a row: a tuple `(id, *values)` or a `pytest.param` with marks."""
    if hasattr(entry, "marks"):  # a pytest.param
        return pytest.param(*entry.values[1:], id=entry.values[0], marks=entry.marks)
    return pytest.param(*entry[1:], id=entry[0])


@pytest.mark.parametrize("target, error, match", [_row(e) for e in RAISES])
def test_bad_input_raises_a_clear_error(target, error, match):
    with pytest.raises(error, match=match):
        target()


# ---------------------------------------------------------------------------
# Rows with a documented result: (target, check of the result)
# ---------------------------------------------------------------------------


def _set(x, index, value):
    x = x.copy()
    x[index] = value
    return x


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


@pytest.mark.parametrize("target, check", [_row(e) for e in _results()])
def test_bad_input_gives_the_documented_result(target, check):
    check(target())


def test_readme_states_the_case_count():
    """README: "The bad-input matrix (`tests/test_bad_inputs.py`) has N cases"; keep N in step."""
    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    stated = re.search(r"bad-input matrix.{0,80}?has\s+(\d+)\s+cases", readme, flags=re.S)
    if stated is None:
        pytest.fail("the README does not state the bad-input case count")
    assert int(stated.group(1)) == len(RAISES) + len(_results())
