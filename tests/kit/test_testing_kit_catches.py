"""`keras_attn.testing`'s assertions caught failing: a deliberately broken layer per
property, the argument errors, and the kit's own imports.
"""

import ast
import importlib
import inspect
import pkgutil

import keras
import numpy as np
import pytest
from layer_table import WIDTH

import keras_attn as ka
from keras_attn import testing

# As in tests/kit/test_testing_kit.py: Keras warns on any softmax over a length-1 axis.
pytestmark = pytest.mark.filterwarnings("ignore:You are using a softmax over axis -1")

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
    modules = ("_support", "differential", "generation", "invariance", "safety")
    assert internal == {f"keras_attn.testing.{m}" for m in modules}
