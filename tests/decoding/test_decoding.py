"""Seq2seq decoding: cached steps equal the full model, beam search, in-graph export, TFLite."""

import itertools
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.models import (
    beam_search,
    export_seq2seq,
    greedy_decode,
    rnn_seq2seq,
    transformer_seq2seq,
)
from keras_attn.models.decoding import register_decoding_steps, sample_decode
from model_checks import padded_tokens

pytestmark = pytest.mark.jax_slow  # on TensorFlow and torch in CI

START, END = 1, 2
rng = np.random.default_rng(0)


def np_(x):
    return keras.ops.convert_to_numpy(x)


BUILDERS = {
    "transformer": lambda vocab: transformer_seq2seq(
        vocab, vocab, num_layers=2, num_heads=2, d_model=16, intermediate_dim=32
    ),
    "transformer_pre_norm": lambda vocab: transformer_seq2seq(
        vocab,
        vocab,
        num_layers=2,
        num_heads=2,
        d_model=16,
        intermediate_dim=32,
        normalize_first=True,
    ),
    "rnn_additive_lstm": lambda vocab: rnn_seq2seq(vocab, vocab, 8, 16, score="additive"),
    "rnn_bilinear_gru": lambda vocab: rnn_seq2seq(vocab, vocab, 8, 16, "bilinear", cell="gru"),
    "rnn_no_attention": lambda vocab: rnn_seq2seq(vocab, vocab, 8, 16, score=None),
}


def small_seq2seq(kind="transformer", vocab=12):
    keras.utils.set_random_seed(3)
    return BUILDERS[kind](vocab)


def uncached_greedy(model, source, max_length):
    """Greedy decoding by re-running the whole teacher-forced model on each prefix."""
    decoder_inputs = np.full((len(source), 1), START, "int32")
    for t in range(max_length):
        logits = np_(model({"encoder_inputs": source, "decoder_inputs": decoder_inputs}))
        next_tokens = logits[:, t, 1:].argmax(-1) + 1  # padding (0) is never emitted
        decoder_inputs = np.concatenate([decoder_inputs, next_tokens[:, None]], 1)
    return decoder_inputs[:, 1:]


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_step_by_step_greedy_decoding_equals_the_full_model(kind):
    model = small_seq2seq(kind)
    source = padded_tokens(rng, 4, 8, 12)
    cached = np_(greedy_decode(model, source, max_length=6, start_id=START))
    np.testing.assert_array_equal(cached, uncached_greedy(model, source, 6))


def test_greedy_stops_at_the_end_token_and_pads():
    model = small_seq2seq()
    source = padded_tokens(rng, 4, 8, 12)
    free = np_(greedy_decode(model, source, max_length=6, start_id=START))
    end_id = int(free[0, 2])  # make the third token of example 0 the end token
    stopped = np_(greedy_decode(model, source, max_length=6, start_id=START, end_id=end_id))
    for row_free, row in zip(free, stopped, strict=True):
        hits = np.flatnonzero(row_free == end_id)
        cut = hits[0] + 1 if len(hits) else 6
        np.testing.assert_array_equal(row[:cut], row_free[:cut])
        assert np.all(row[cut:] == 0)


@pytest.mark.parametrize("kind", ["transformer", "rnn_additive_lstm"])
def test_beam_search_width_one_equals_greedy(kind):
    model = small_seq2seq(kind)
    source = padded_tokens(rng, 4, 8, 12)
    greedy = np_(greedy_decode(model, source, max_length=6, start_id=START, end_id=END))
    beam, _ = beam_search(model, source, 6, start_id=START, end_id=END, beam_width=1)
    np.testing.assert_array_equal(beam, greedy)


def exhaustive_best(model, source, max_length, vocab, alpha):
    """The best normalized score over every output sequence, scored by the full model."""
    best = np.full(len(source), -np.inf)
    for sequence in itertools.product(range(vocab), repeat=max_length):
        sequence = np.array(sequence, "int32")
        ends = np.flatnonzero(sequence == END)
        length = ends[0] + 1 if len(ends) else max_length
        if np.any(sequence[length:] != 0) or np.any(sequence[:length] == 0):
            continue  # after the end only padding; padding is never a real token
        decoder_inputs = np.concatenate([[START], sequence[:-1]])[None].repeat(len(source), 0)
        logits = np_(model({"encoder_inputs": source, "decoder_inputs": decoder_inputs}))
        # Decoders never emit padding: normalize over the real tokens 1..V-1.
        log_probs = logits - np.log(np.exp(logits[..., 1:]).sum(-1, keepdims=True))
        score = log_probs[:, np.arange(length), sequence[:length]].sum(-1)
        best = np.maximum(best, score / ((5.0 + length) / 6.0) ** alpha)
    return best


@pytest.mark.parametrize("kind,alpha", [("transformer", 0.0), ("rnn_additive_lstm", 1.0)])
def test_wide_beam_search_finds_the_exhaustive_optimum(kind, alpha):
    vocab, max_length = 4, 3
    model = small_seq2seq(kind, vocab=vocab)
    source = padded_tokens(rng, 3, 5, vocab)
    _, scores = beam_search(
        model, source, max_length, START, END, beam_width=vocab**max_length, length_penalty=alpha
    )
    np.testing.assert_allclose(scores, exhaustive_best(model, source, max_length, vocab, alpha),
                               atol=1e-4)  # fmt: skip


def export(model, directory, max_length=6):
    path = os.path.join(str(directory), "seq2seq")
    export_seq2seq(model, path, max_length=max_length, start_id=START, end_id=END)
    return path


@pytest.fixture(scope="module")
def exported_transformer(tmp_path_factory):
    """One export shared by the tests below, with the Keras model's outputs to compare with."""
    model = small_seq2seq()
    x = {
        "encoder_inputs": padded_tokens(rng, 3, 8, 12),
        "decoder_inputs": padded_tokens(rng, 3, 5, 12),
    }
    # Length 7, a NumPy int: a clip of the int positions to [0, 6] lowered to Relu6 on int32,
    # which TFLite's builtins lack (the test below); a config's lengths may be NumPy ints.
    return {
        "path": export(model, tmp_path_factory.mktemp("transformer"), max_length=np.int64(7)),
        "inputs": x,
        "tokens": np_(greedy_decode(model, x["encoder_inputs"], 7, START, END)),
        "logits": np_(model(x)),
    }


def check_python_endpoints(path, inputs, tokens, logits):
    loaded = tf.saved_model.load(path)
    for dtype in ("int32", "int64"):  # int64: what TextVectorization emits
        source = tf.constant(inputs["encoder_inputs"].astype(dtype))
        np.testing.assert_array_equal(loaded.greedy_decode(source).numpy(), tokens)
        np.testing.assert_array_equal(loaded.serving_default(source)["tokens"].numpy(), tokens)
        served = loaded.serve({k: tf.constant(v.astype(dtype)) for k, v in inputs.items()})
        np.testing.assert_allclose(served.numpy(), logits, atol=1e-5)


@pytest.mark.tensorflow_only  # a SavedModel export
def test_transformer_export_decodes_in_the_graph_from_int32_and_int64(exported_transformer):
    check_python_endpoints(**exported_transformer)


@pytest.mark.tensorflow_only  # a SavedModel export
def test_rnn_export_decodes_in_the_graph_from_int32_and_int64(tmp_path):
    model = small_seq2seq("rnn_additive_lstm")
    x = {
        "encoder_inputs": padded_tokens(rng, 3, 8, 12),
        "decoder_inputs": padded_tokens(rng, 3, 5, 12),
    }
    tokens = np_(greedy_decode(model, x["encoder_inputs"], 6, START, END))
    check_python_endpoints(export(model, tmp_path), x, tokens, np_(model(x)))


@pytest.mark.tensorflow_only  # a SavedModel export
def test_export_signatures_are_named_and_the_default_decodes(exported_transformer):
    loaded = tf.saved_model.load(exported_transformer["path"])
    x = {k: tf.constant(v, tf.int64) for k, v in exported_transformer["inputs"].items()}
    signatures = loaded.signatures
    assert set(signatures) == {"serving_default", "greedy_decode", "serve"}
    specs = {k: signatures[k].structured_input_signature[1] for k in signatures}
    assert {k: sorted(v) for k, v in specs.items()} == {
        "serving_default": ["encoder_inputs"],
        "greedy_decode": ["encoder_inputs"],
        "serve": ["decoder_inputs", "encoder_inputs"],
    }
    assert all(spec.dtype == tf.int64 for v in specs.values() for spec in v.values())

    # The default signature is the decoder: tokens in, tokens out.
    tokens = signatures["serving_default"](encoder_inputs=x["encoder_inputs"])
    assert list(tokens) == ["tokens"]
    np.testing.assert_array_equal(tokens["tokens"].numpy(), exported_transformer["tokens"])

    # Inputs are bound by name: the keyword order does not matter, a wrong name fails.
    logits = signatures["serve"](
        decoder_inputs=x["decoder_inputs"], encoder_inputs=x["encoder_inputs"]
    )["output_0"]
    np.testing.assert_allclose(logits.numpy(), exported_transformer["logits"], atol=1e-5)
    with pytest.raises(TypeError, match="source"):
        signatures["serving_default"](source=x["encoder_inputs"])


@pytest.mark.tensorflow_only  # a SavedModel export, then TFLite
@pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated")
def test_greedy_decode_export_converts_to_tflite_with_builtin_ops(exported_transformer):
    path = exported_transformer["path"]
    converter = tf.lite.TFLiteConverter.from_saved_model(path, signature_keys=["greedy_decode"])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]  # no SELECT_TF_OPS
    runner = tf.lite.Interpreter(model_content=converter.convert()).get_signature_runner(
        "greedy_decode"
    )
    source = padded_tokens(rng, 4, 7, 12)  # another batch and length than the fixture's
    tflite_tokens = runner(encoder_inputs=source.astype("int64"))["output_0"]
    loaded = tf.saved_model.load(path)  # kept referenced: its variables live as long as it
    saved_tokens = loaded.greedy_decode(tf.constant(source)).numpy()
    np.testing.assert_array_equal(tflite_tokens, saved_tokens)
    assert np.any(saved_tokens > 0)


class MeanSourceSteps:
    """Decoding steps of `hand_built_seq2seq`: the last token and the mean source embedding."""

    @staticmethod
    def matches(model):
        return {"hb_embedding", "hb_source_mean", "hb_logits"} <= {x.name for x in model.layers}

    def __init__(self, model):
        self.embed = model.get_layer("hb_embedding")
        self.mean = model.get_layer("hb_source_mean")
        self.logits = model.get_layer("hb_logits")

    def start(self, encoder_inputs, max_length):
        return {"context": self.mean(self.embed(encoder_inputs))}  # (B, 8)

    def step(self, tokens, index, state):
        return self.logits(keras.ops.tanh(self.embed(tokens) + state["context"])), state


def hand_built_seq2seq(vocab=12):
    embed = keras.layers.Embedding(vocab, 8, name="hb_embedding")
    source = keras.Input((None,), dtype="int32", name="encoder_inputs")
    previous = keras.Input((None,), dtype="int32", name="decoder_inputs")
    context = keras.layers.GlobalAveragePooling1D(name="hb_source_mean")(embed(source))
    hidden = keras.ops.tanh(embed(previous) + keras.ops.expand_dims(context, 1))  # (B, T, 8)
    logits = keras.layers.Dense(vocab, name="hb_logits")(hidden)
    return keras.Model({"encoder_inputs": source, "decoder_inputs": previous}, logits)


def test_registered_steps_decode_and_export_a_hand_built_model(tmp_path):
    register_decoding_steps(MeanSourceSteps)
    model = hand_built_seq2seq()
    source = padded_tokens(rng, 3, 6, 12)
    # The mean embedding counts padding here, in the model and in the steps alike.
    tokens = np_(greedy_decode(model, source, 5, START))
    np.testing.assert_array_equal(tokens, uncached_greedy(model, source, 5))
    if keras.backend.backend() != "tensorflow":
        return  # the export is a TensorFlow SavedModel
    loaded = tf.saved_model.load(export(model, tmp_path, max_length=5))
    expected = np_(greedy_decode(model, source, 5, START, END))
    np.testing.assert_array_equal(loaded.greedy_decode(tf.constant(source)).numpy(), expected)


def test_register_decoding_steps_refuses_an_incomplete_class():
    class NoStep:
        @staticmethod
        def matches(model):
            return True

        def start(self, encoder_inputs, max_length):
            return {}

    with pytest.raises(ValueError, match="`steps_class` must define `step`"):
        register_decoding_steps(NoStep)


def test_decoding_argument_errors():
    model = small_seq2seq()
    with pytest.raises(ValueError, match="`max_length` must be a positive integer"):
        greedy_decode(model, np.ones((1, 3), "int32"), 0, START)
    with pytest.raises(ValueError, match="`start_id` must be a positive token id"):
        greedy_decode(model, np.ones((1, 3), "int32"), 3, 0)
    with pytest.raises(ValueError, match="`beam_width` must be .*Received: beam_width=0"):
        beam_search(model, np.ones((1, 3), "int32"), 3, START, END, beam_width=0)
    with pytest.raises(ValueError, match="No decoding steps"):
        greedy_decode(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), [[1]], 3, 1)


@pytest.mark.parametrize(
    "kwargs,message",
    [({"length_penalty": float("nan")}, "`length_penalty` must be a finite number"),
     ({"length_penalty": float("inf")}, "`length_penalty` must be a finite number"),
     ({"length_penalty": "0.6"}, "`length_penalty` must be a finite number"),
     ({"end_id": 12}, r"`end_id` must be a positive token id .*vocab_size=12"),
     ({"end_id": 40}, r"`end_id` must be a positive token id .*vocab_size=12"),
     ({"start_id": 12}, r"`start_id` must be a positive token id .*vocab_size=12")],
)  # fmt: skip
def test_beam_search_refuses_a_nan_length_penalty_and_ids_outside_the_vocabulary(kwargs, message):
    """Each names the argument and the value (before: NaN scores ranked, or an end never met)."""
    model = small_seq2seq()  # a target vocabulary of 12 ids
    ((name, value),) = kwargs.items()
    arguments = {"start_id": START, "end_id": END, **kwargs}
    with pytest.raises(ValueError, match=rf"{message}.*Received: {name}={value!r}"):
        beam_search(model, np.ones((1, 3), "int32"), 3, **arguments)
    if name != "length_penalty":  # the ids: the same check in greedy decoding
        with pytest.raises(ValueError, match=rf"{message}.*Received: {name}={value!r}"):
            greedy_decode(model, np.ones((1, 3), "int32"), 3, **arguments)


def test_language_model_generation_refuses_an_end_id_outside_the_vocabulary():
    from keras_attn.models import generate, transformer_lm

    model = transformer_lm(23, num_layers=1, num_heads=2, d_model=8, intermediate_dim=16)
    for sampler in ("greedy", "sample", "beam"):
        with pytest.raises(ValueError, match=r"`end_id` .*vocab_size=23.*Received: end_id=23"):
            generate(model, np.ones((1, 3), "int32"), 3, end_id=23, sampler=sampler)
    with pytest.raises(ValueError, match="`length_penalty` .*Received: length_penalty=nan"):
        generate(model, np.ones((1, 3), "int32"), 3, end_id=2, sampler="beam",
                 length_penalty=float("nan"))  # fmt: skip


def test_decoders_take_numpy_integers_as_python_ones():
    model = small_seq2seq()
    source = padded_tokens(rng, 2, 6, 12)
    i = np.int64
    expected = np_(greedy_decode(model, source, 4, START, END))
    np.testing.assert_array_equal(
        np_(greedy_decode(model, source, i(4), i(START), i(END))), expected
    )
    tokens, scores = beam_search(model, source, 4, START, END, beam_width=2)
    beam = beam_search(model, source, i(4), i(START), i(END), beam_width=np.int32(2))
    np.testing.assert_array_equal(np_(beam[0]), np_(tokens))
    np.testing.assert_allclose(np_(beam[1]), np_(scores), rtol=1e-6)
    sampled = np_(sample_decode(model, source, 4, START, END, top_k=3, seed=7))
    np.testing.assert_array_equal(
        np_(sample_decode(model, source, i(4), i(START), i(END), top_k=i(3), seed=i(7))), sampled
    )
