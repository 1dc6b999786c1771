"""The bad-input matrix: one row per case (this file: constructor arguments and ranks).

Each row is a constructor or a call with one bad value, and either the
exception it must raise (type, and a regex on the message, which names the
argument and what was received) or the documented result it must give
(empty sequences, NaN and inf). Never a crash deep in TensorFlow, never a
silent wrong answer. Every row runs on every Keras backend except those
marked `tensorflow_only` (a `tf.function` with a dynamic length: a run-time
check that only a TensorFlow graph has).
This file holds the constructor and rank rows; tests/layers/test_bad_shapes.py the
widths, masks, dtypes and lengths; tests/layers/test_bad_values.py the rows with a
documented result. The shared inputs and row builders are in tests/bad_inputs.py.
"""

import pathlib
import re

import keras
import numpy as np
import pytest
from bad_inputs import DECODER, ENCODER, MHA, POSITIVE, Q, V, X, call, make, row

import keras_attn as ka

pytestmark = pytest.mark.one_backend  # constructor arguments and static ranks: no backend op

# ---------------------------------------------------------------------------
# Rows that raise: (target, exception type, message regex)
# ---------------------------------------------------------------------------

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
     TypeError, r"`rotary_embedding` must be None or a rotary embedding layer.*type str"),
    # Red team, 2026-12-02: a positional encoding replaced q and k silently; a bias or a
    # Dense failed with "unexpected keyword argument 'start_index'".
    ("MultiHeadAttention rotary_embedding=SinusoidalPositionalEncoding()",
     make(MHA, rotary_embedding=ka.SinusoidalPositionalEncoding()), TypeError,
     r"`rotary_embedding` must be .*type SinusoidalPositionalEncoding"),
    ("MultiHeadAttention rotary_embedding=AlibiBias()",
     make(MHA, rotary_embedding=ka.AlibiBias()), TypeError,
     r"`rotary_embedding` must be .*type AlibiBias"),
    ("TransformerEncoderBlock rotary_embedding=Dense(4)",
     make(ka.TransformerEncoderBlock, 8, 2, rotary_embedding=keras.layers.Dense(4)), TypeError,
     r"`rotary_embedding` must be .*type Dense"),
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
]  # fmt: skip


@pytest.mark.parametrize("target, error, match", [row(e) for e in RAISES])
def test_bad_input_raises_a_clear_error(target, error, match):
    with pytest.raises(error, match=match):
        target()


def test_readme_states_the_case_count():
    """README: "The bad-input matrix (`tests/layers/test_bad_*.py`) has N cases"; keep N in step."""
    import test_bad_shapes
    import test_bad_values

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    stated = re.search(r"bad-input matrix.{0,80}?has\s+(\d+)\s+cases", readme, flags=re.S)
    if stated is None:
        pytest.fail("the README does not state the bad-input case count")
    count = len(RAISES) + len(test_bad_shapes.RAISES) + len(test_bad_values.RESULTS)
    assert int(stated.group(1)) == count
