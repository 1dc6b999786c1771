"""`keras_attn.testing` over every layer and every zoo builder; each assertion caught failing.

Every layer is checked on inputs hypothesis draws (batch, lengths, widths, mask
patterns, start indices) in one of float32 / mixed_float16 / mixed_bfloat16,
with the options that change its code path drawn too (dropout in training,
`return_attention_scores`, the causal mask, a rank-2 query, pre-norm, grouped
heads with rotary positions, NaN in the padding). The same checks run once more
per layer under `jit_compile=True`. A few deliberately broken layers show that
each assertion fails when its property does not hold.
"""

import ast
import importlib
import inspect
import pkgutil

import hypothesis
import keras
import numpy as np
import pytest
from hypothesis import strategies as st
from layer_table import LAYERS, WIDTH  # the table of every layer, shared

import keras_attn as ka
from keras_attn import testing, zoo

SETTINGS = hypothesis.settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        hypothesis.HealthCheck.too_slow,
        hypothesis.HealthCheck.function_scoped_fixture,
    ],
)
# `.keras` everywhere; SavedModel (TensorFlow's format) on the TensorFlow backend.
SAVE_FORMATS = ("keras", "saved_model") if keras.backend.backend() == "tensorflow" else ("keras",)
# Keras warns on any softmax over a length-1 axis; hypothesis draws length-1 sequences.
pytestmark = pytest.mark.filterwarnings("ignore:You are using a softmax over axis -1")


# ---------------------------------------------------------------------------
# Drawing a configuration: from hypothesis, or from a seed (the jit runs)
# ---------------------------------------------------------------------------


class HypothesisPick:
    def __init__(self, data):
        self.data = data

    def bool(self):
        return self.data.draw(st.booleans())

    def int(self, low, high):
        return self.data.draw(st.integers(low, high))

    def choice(self, options):
        return self.data.draw(st.sampled_from(options))

    def mask(self, batch, length):
        row = st.lists(st.booleans(), min_size=length, max_size=length)
        rows = self.data.draw(st.lists(row, min_size=batch, max_size=batch))
        return np.array(rows, bool).reshape(batch, length)


class SeededPick:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def bool(self):
        return bool(self.rng.integers(2))

    def int(self, low, high):
        return int(self.rng.integers(low, high + 1))

    def choice(self, options):
        return options[int(self.rng.integers(len(options)))]

    def mask(self, batch, length):
        return self.rng.random((batch, length)) < 0.7


def run_checks(setup, jit_compile=False, batch=True):
    kwargs = setup.call_kwargs
    inference = {k: v for k, v in kwargs.items() if k != "training"}
    common = {"call_kwargs": kwargs, "jit_compile": jit_compile}
    if setup.padding is not None:
        testing.assert_padding_invariance(
            setup.layer, setup.inputs, setup.padding, **setup.padding_kwargs, **common
        )
    if setup.causal is not None:
        testing.assert_causal_invariance(setup.layer, setup.inputs, **setup.causal, **common)
    if batch:
        testing.assert_batch_invariance(
            setup.layer, setup.inputs, call_kwargs=inference, jit_compile=jit_compile
        )
    if setup.empty is not None:
        testing.assert_fully_masked_rows_safe(
            setup.layer, setup.inputs, setup.empty, zero_outputs=setup.zero_outputs, **common
        )


@pytest.mark.parametrize("name", sorted(LAYERS))
@SETTINGS
@hypothesis.given(data=st.data())
def test_kit_on_every_layer(name, data):
    setup = LAYERS[name](HypothesisPick(data))
    try:
        run_checks(setup)
    finally:
        keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_kit_on_every_layer_under_xla(name):
    """One drawn configuration per layer, every call compiled with XLA (TF or JAX)."""
    setup = LAYERS[name](SeededPick(sorted(LAYERS).index(name)))
    run_checks(setup, jit_compile=True, batch=False)  # batch: one more compile per size


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_kit_save_reload_on_every_layer(name, tmp_path):
    setup = LAYERS[name](SeededPick(100 + sorted(LAYERS).index(name)))
    kwargs = {k: v for k, v in setup.call_kwargs.items() if k != "training"}
    testing.assert_save_reload_equal(
        setup.layer, setup.inputs, call_kwargs=kwargs, directory=tmp_path, formats=("keras",)
    )


@pytest.mark.tensorflow_only  # SavedModel export
def test_kit_save_reload_saved_model(tmp_path):
    setup = LAYERS["MultiHeadAttention"](SeededPick(7))
    kwargs = {k: v for k, v in setup.call_kwargs.items() if k != "training"}
    testing.assert_save_reload_equal(setup.layer, setup.inputs, call_kwargs=kwargs)


@pytest.mark.parametrize(
    "implementation, return_scores",
    [("dense", False), ("dense", True), ("chunked", False)],
    ids=["fused", "dense-with-weights", "chunked"],
)
def test_kit_nonfinite_padding_on_every_multi_head_path(implementation, return_scores):
    """NaN, inf and -inf in padded values: fused (no weights), dense (weights), chunked."""
    x = np.random.default_rng(0).normal(size=(2, 4, WIDTH)).astype("float32")
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    testing.assert_padding_invariance(
        ka.MultiHeadAttention(2, 4, implementation=implementation),
        {"query": x, "value": x, "value_mask": mask},
        {"value": "value_mask"},
        nonfinite=True,
        call_kwargs={"return_attention_scores": return_scores},
    )


# ---------------------------------------------------------------------------
# The zoo: one cheap model per builder
# ---------------------------------------------------------------------------


def _tokens(rng, batch, length, vocab, low=3):
    tokens = rng.integers(low, vocab, size=(batch, length)).astype("int32")
    for row, size in zip(tokens, [length, 1, length - 2, 2][:batch], strict=True):
        row[size:] = 0
    return tokens


def _seq2seq_inputs(rng):
    source = _tokens(rng, 4, 6, 15)
    target = _tokens(rng, 4, 5, 15, low=1)
    return {"encoder_inputs": source, "decoder_inputs": target}


def classifier_checks(rng, tmp_path):
    model = zoo.transformer_classifier(
        20, 12, 3, num_layers=1, num_heads=2, d_model=8, intermediate_dim=16,
        pooling="attention", position="learned", dropout=0.1,
    )  # fmt: skip
    tokens = _tokens(rng, 4, 8, 20)
    tokens[1] = 0  # an empty example
    inputs = {"tokens": tokens}
    testing.assert_padding_invariance(model, inputs, {"tokens": tokens != 0}, pad_value=0)
    testing.assert_padding_invariance(
        model, inputs, {"tokens": tokens != 0}, pad_value=0, jit_compile=True
    )
    testing.assert_batch_invariance(model, inputs)
    testing.assert_fully_masked_rows_safe(model, inputs, empty=1, zero_outputs=False)
    testing.assert_save_reload_equal(model, inputs, directory=tmp_path, formats=SAVE_FORMATS)


def seq2seq_checks(rng, tmp_path):
    model = zoo.transformer_seq2seq(15, 15, num_layers=1, num_heads=2, d_model=8,
                                       intermediate_dim=16)  # fmt: skip
    inputs = _seq2seq_inputs(rng)
    padding = {"encoder_inputs": inputs["encoder_inputs"] != 0}
    testing.assert_padding_invariance(model, inputs, padding, pad_value=0)
    testing.assert_causal_invariance(model, inputs, sequences=["decoder_inputs"])
    testing.assert_batch_invariance(model, inputs)
    testing.assert_save_reload_equal(model, inputs, directory=tmp_path, formats=("keras",))


def rnn_checks(rng, tmp_path):
    model = zoo.rnn_seq2seq(15, 15, embedding_dim=8, units=8, score="additive")
    inputs = _seq2seq_inputs(rng)
    padding = {"encoder_inputs": inputs["encoder_inputs"] != 0}
    testing.assert_padding_invariance(model, inputs, padding, pad_value=0)
    testing.assert_causal_invariance(model, inputs, sequences=["decoder_inputs"])
    testing.assert_batch_invariance(model, inputs)
    testing.assert_save_reload_equal(model, inputs, directory=tmp_path, formats=("keras",))


def pointer_checks(rng, tmp_path):
    model = zoo.pointer_network(input_dim=1, units=8, pad_value=-1.0)
    points = rng.uniform(size=(3, 5, 1)).astype("float32")
    points[1, 3:] = -1.0  # padding points
    pointers = np.argsort(np.where(points[..., 0] < 0, 9, points[..., 0]), -1).astype("int32")
    inputs = {"points": points, "pointers": pointers}
    testing.assert_padding_invariance(
        model, inputs, {"points": points[..., 0] >= 0}, pad_value=-1.0
    )
    testing.assert_causal_invariance(model, inputs, sequences=["pointers"])
    testing.assert_batch_invariance(model, inputs)
    testing.assert_save_reload_equal(model, inputs, directory=tmp_path, formats=("keras",))


def han_checks(rng, tmp_path):
    keras.config.set_dtype_policy("mixed_bfloat16")  # the zoo under a mixed policy
    model = zoo.hierarchical_attention_network(
        vocab_size=30, embedding_dim=8, word_units=4, sentence_units=4, num_classes=3,
        max_sentences=3, max_words=5,
    )  # fmt: skip
    docs = rng.integers(1, 30, size=(3, 3, 5)).astype("int32")
    docs[:, :, 3:] = 0
    docs[1] = 0  # an empty document
    inputs = {"tokens": docs}
    testing.assert_batch_invariance(model, inputs)
    testing.assert_fully_masked_rows_safe(model, inputs, empty=1, zero_outputs=False)
    testing.assert_save_reload_equal(model, inputs, directory=tmp_path, formats=("keras",))


ZOO = {
    "transformer_classifier": classifier_checks,
    "transformer_seq2seq": seq2seq_checks,
    "rnn_seq2seq": rnn_checks,
    "pointer_network": pointer_checks,
    "hierarchical_attention_network": han_checks,
}


@pytest.mark.parametrize("builder", sorted(ZOO))
def test_kit_on_every_zoo_builder(builder, tmp_path):
    ZOO[builder](np.random.default_rng(0), tmp_path)


# ---------------------------------------------------------------------------
# Broken layers: each assertion fails when its property does not hold
# ---------------------------------------------------------------------------

X = np.random.default_rng(1).normal(size=(3, 5, WIDTH)).astype("float32")
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], bool)
FEED = {"query": X, "value": X, "value_mask": MASK}


class AttendsToPadding(ka.DotAttention):
    """Drops the value mask."""

    def call(self, query, value, key=None, value_mask=None, **kwargs):
        return super().call(query, value, key, **kwargs)


class PeeksAtTheFuture(ka.DotAttention):
    """Drops the causal mask when dropout is on in training: keras#23038."""

    def call(self, query, value, key=None, use_causal_mask=False, training=None, **kwargs):
        causal = use_causal_mask and not (training and self.dropout)
        return super().call(query, value, key, use_causal_mask=causal, training=training, **kwargs)


class SharesTheBatch(ka.DotAttention):
    """Adds the batch mean (as a batch normalization in training mode would)."""

    def call(self, query, value, key=None, **kwargs):
        output = super().call(query, value, key, **kwargs)
        return output + keras.ops.mean(output, axis=0, keepdims=True)


class NaNGradient(keras.layers.Layer):
    """`where(visible, e / sum(e), 0)`: zeros forward, `0 / 0` (NaN) backward on an empty row."""

    def call(self, query, value, value_mask):
        scores = keras.ops.matmul(query, keras.ops.transpose(value, (0, 2, 1)))
        mask = value_mask[:, None, :]  # (B, 1, Tv)
        e = keras.ops.exp(scores - keras.ops.max(scores, -1, keepdims=True))
        e = e * keras.ops.cast(mask, e.dtype)
        weights = e / keras.ops.sum(e, -1, keepdims=True)
        weights = keras.ops.where(keras.ops.any(mask, -1, keepdims=True), weights, 0.0)
        return keras.ops.matmul(weights, value)


class NaNOnEmptyRows(keras.layers.Layer):
    """A softmax over `-inf` fills: NaN on a row with no visible key."""

    def call(self, query, value, value_mask):
        scores = keras.ops.matmul(query, keras.ops.transpose(value, (0, 2, 1)))
        scores = keras.ops.where(value_mask[:, None, :], scores, float("-inf"))
        return keras.ops.matmul(keras.ops.softmax(scores), value)


class NotRegistered(keras.layers.Layer):
    def call(self, x):
        return x * 2.0


@keras.saving.register_keras_serializable(package="keras_attn_tests")
class UnsavedState(keras.layers.Layer):
    """A random projection kept as a NumPy array, not a weight: lost on reload."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.projection = np.random.default_rng().normal(size=(WIDTH, WIDTH)).astype("float32")

    def call(self, x):
        return keras.ops.matmul(x, self.projection)


@keras.saving.register_keras_serializable(package="keras_attn_tests")
class GraphOnly(keras.layers.Layer):
    """Another answer when traced (as in a SavedModel) than when eager."""

    def call(self, x):
        import tensorflow as tf

        return x if tf.executing_eagerly() else x + 1.0


def test_padding_invariance_catches_attention_to_padding():
    testing.assert_padding_invariance(ka.DotAttention(), FEED, {"value": "value_mask"})
    with pytest.raises(AssertionError, match=r"^Padding invariance: changing `value` at padded "):
        testing.assert_padding_invariance(AttendsToPadding(), FEED, {"value": "value_mask"})


def test_padding_invariance_catches_a_nan_leak():
    class PlainCombine(keras.layers.Layer):  # a weighted sum without the NaN guard
        def call(self, query, value, value_mask=None):
            scores = keras.ops.matmul(query, keras.ops.swapaxes(value, 1, 2))
            weights = ka.ops.masked_softmax(scores, value_mask[:, None, :])
            return keras.ops.matmul(weights, value)  # 0 * NaN at a masked key

    padding = {"value": "value_mask"}
    testing.assert_padding_invariance(ka.DotAttention(), FEED, padding, nonfinite=True)
    with pytest.raises(AssertionError, match=r"nan instead of .*largest difference not finite"):
        testing.assert_padding_invariance(PlainCombine(), FEED, padding, nonfinite=True)


def test_padding_invariance_catches_padding_that_is_not_masked():
    """A token model without `mask_zero`: more padding changes the mean."""
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10, 4)(tokens)
    model = keras.Model(tokens, keras.layers.GlobalAveragePooling1D()(x))
    ids = np.array([[3, 4, 0], [5, 0, 0]], "int32")
    with pytest.raises(AssertionError, match=r"^Padding invariance: 2 more padded steps"):
        testing.assert_padding_invariance(model, {"tokens": ids}, {"tokens": ids != 0}, pad_value=0)


def test_causal_invariance_catches_a_mask_dropped_with_dropout():
    layer = PeeksAtTheFuture(dropout=0.5, seed=0)
    kwargs = {"use_causal_mask": True}
    testing.assert_causal_invariance(layer, {"query": X, "value": X}, call_kwargs=kwargs)
    with pytest.raises(AssertionError, match=r"^Causal invariance: changing steps >= 1 of"):
        testing.assert_causal_invariance(
            layer, {"query": X, "value": X}, call_kwargs={**kwargs, "training": True}
        )


def test_batch_invariance_catches_a_batch_statistic():
    testing.assert_batch_invariance(ka.DotAttention(), FEED)
    with pytest.raises(AssertionError, match=r"^Batch invariance: example 0 alone differs"):
        testing.assert_batch_invariance(SharesTheBatch(), FEED)


def test_fully_masked_rows_catch_nan_outputs_and_nan_gradients():
    testing.assert_fully_masked_rows_safe(ka.DotAttention(), FEED, empty=2)
    with pytest.raises(AssertionError, match=r"^Fully masked rows: output 0 has non-finite"):
        testing.assert_fully_masked_rows_safe(NaNOnEmptyRows(), FEED, empty=2)
    with pytest.raises(AssertionError, match=r"^Fully masked rows: the gradient of input `query`"):
        testing.assert_fully_masked_rows_safe(NaNGradient(), FEED, empty=2)


def test_fully_masked_rows_catch_keras_attention_averaging_the_padding():
    attention = keras.layers.Attention()

    def keras_attention(query, value, value_mask):
        return attention([query, value], mask=[None, value_mask])

    with pytest.raises(AssertionError, match=r"^Fully masked rows: output 0 is not zero"):
        testing.assert_fully_masked_rows_safe(keras_attention, FEED, empty=2)


def test_save_reload_catches_unregistered_classes_lambdas_and_lost_state():
    x = {"x": X}
    with pytest.raises(
        AssertionError, match=r"(?s)safe_mode=True failed: TypeError: .*'NotRegistered'"
    ):
        testing.assert_save_reload_equal(NotRegistered(), x, formats=("keras",))
    inputs = keras.Input((5, WIDTH), name="x")
    lambda_model = keras.Model(inputs, keras.layers.Lambda(lambda t: t * 2.0)(inputs))
    with pytest.raises(AssertionError, match=r"(?s)safe_mode=True failed: ValueError: .*lambda"):
        testing.assert_save_reload_equal(lambda_model, x, formats=("keras",))
    with pytest.raises(AssertionError, match=r"^`\.keras` reload: the reloaded model's output"):
        testing.assert_save_reload_equal(UnsavedState(), x, formats=("keras",))


@pytest.mark.tensorflow_only  # SavedModel export
def test_save_reload_catches_a_saved_model_that_differs(tmp_path):
    with pytest.raises(AssertionError, match=r"^SavedModel: the served output differs"):
        testing.assert_save_reload_equal(GraphOnly(), {"x": X}, directory=tmp_path)


def test_kit_argument_errors():
    with pytest.raises(ValueError, match=r"`padding` names 'keys', which is not in `inputs`"):
        testing.assert_padding_invariance(ka.DotAttention(), FEED, {"keys": "value_mask"})
    with pytest.raises(ValueError, match=r"must share one length T >= 2"):
        testing.assert_causal_invariance(ka.DotAttention(), {"query": X[:, :1], "value": X})
    with pytest.raises(ValueError, match=r"at least 2 examples"):
        testing.assert_batch_invariance(ka.DotAttention(), {"query": X[:1], "value": X[:1]})
    with pytest.raises(TypeError, match=r"`inputs` must be a non-empty dict"):
        testing.assert_batch_invariance(ka.DotAttention(), X)


def test_kit_imports_only_keras_and_numpy():
    """Importable without pytest or hypothesis (standard library, keras, numpy; TensorFlow
    only inside the checks that need it), in each module of the package."""
    top_level, internal = set(), set()
    names = [info.name for info in pkgutil.iter_modules(testing.__path__, "keras_attn.testing.")]
    for name in ["keras_attn.testing", *names]:
        tree = ast.parse(inspect.getsource(importlib.import_module(name)))
        for node in tree.body:
            if isinstance(node, ast.Import):
                top_level |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                name = node.module
                (internal if name.startswith("keras_attn.testing") else top_level).add(
                    name if name.startswith("keras_attn.testing") else name.split(".")[0]
                )
    assert top_level == {"os", "tempfile", "weakref", "collections", "typing", "keras", "numpy"}
    modules = ("_support", "differential", "invariance", "safety")
    assert internal == {f"keras_attn.testing.{m}" for m in modules}
