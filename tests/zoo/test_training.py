"""`build_for_fit`: the first `fit` and `evaluate` trace their step once, and train the same."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import models
from keras_attn.models.training import build_for_fit

pytestmark = pytest.mark.tensorflow_only  # elsewhere Keras builds the state itself


def _model():
    keras.utils.set_random_seed(0)
    model = models.transformer_classifier(
        20, 8, 2, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32, dropout=0.1
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.integers(1, 20, (32, 8)).astype("int32"), rng.integers(0, 2, 32).astype("int32")


def _traces(model):
    """Counts the Python calls of the train and test steps: one per trace."""
    counts = {"train": 0, "test": 0}
    train_step, test_step = model.train_step, model.test_step

    def train(data):
        counts["train"] += 1
        return train_step(data)

    def test(data):
        counts["test"] += 1
        return test_step(data)

    model.train_step, model.test_step = train, test
    return counts


def test_the_first_fit_and_evaluate_trace_their_step_once_and_train_the_same():
    x, y = _data()
    weights, counts = [], []
    for build in (False, True):
        model = _model()
        traced = _traces(model)
        if build:
            assert build_for_fit(model, (x, y)) is model
        model.evaluate(x, y, batch_size=8, verbose=0)
        keras.utils.set_random_seed(1)  # the same dropout draws
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        weights.append(model.get_weights())
        counts.append(dict(traced))
    # Keras alone: the optimizer's and the metrics' variables are made in the first trace,
    # and a tf.function that makes variables traces again. If Keras stops doing that, the
    # first count drops to 1 and `build_for_fit` has no more work to do.
    assert counts[0] == {"train": 2, "test": 2}, counts
    assert counts[1] == {"train": 1, "test": 1}, counts
    for unbuilt, built in zip(*weights, strict=True):
        np.testing.assert_array_equal(built, unbuilt)


def test_a_dataset_is_read_from_its_element_spec():
    x, y = _data()
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    model = _model()
    traced = _traces(model)
    build_for_fit(model, batches)
    assert model.optimizer.built and model._compile_metrics.built and traced["train"] == 0
    model.fit(batches, epochs=1, verbose=0)
    assert traced == {"train": 1, "test": 0}, traced


def test_a_model_under_a_strategy_is_left_to_keras():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = _model()
    build_for_fit(model, _data())
    assert not model.optimizer.built  # Keras builds it in `fit`, in the strategy's scope


def test_bad_arguments_raise_a_clear_error():
    x, y = _data()
    with pytest.raises(TypeError, match="`model` must be a `keras.Model`. Received: model=3"):
        build_for_fit(3, (x, y))
    uncompiled = models.transformer_classifier(20, 8, 2, num_layers=1, num_heads=2, d_model=16)
    with pytest.raises(ValueError, match="`model` must be compiled"):
        build_for_fit(uncompiled, (x, y))
    with pytest.raises(ValueError, match="`data` must be .* Received: data="):
        build_for_fit(_model(), x)
    with pytest.raises(ValueError, match="`data` must be .* Received: data="):
        build_for_fit(_model(), tf.data.Dataset.from_tensor_slices(x).batch(8))
