import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(__file__))

import keras  # noqa: E402
import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "tensorflow_only: needs the TensorFlow backend (tf.function graphs, SavedModel, tfds); "
        "skipped on other Keras backends (KERAS_BACKEND=jax)",
    )
    config.addinivalue_line(
        "markers",
        "xla: checks what only an XLA-compiled call does (tf.function(jit_compile=True), "
        "jax.jit); skipped on torch, which has no XLA. A test parametrized with `jit=True` "
        "counts as marked.",
    )


def pytest_collection_modifyitems(config, items):
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return
    skip = pytest.mark.skip(reason=f"TensorFlow only (KERAS_BACKEND={backend})")
    no_xla = pytest.mark.skip(reason="XLA compilation: TensorFlow and JAX only")
    for item in items:
        if "tensorflow_only" in item.keywords:
            item.add_marker(skip)
        callspec = getattr(item, "callspec", None)
        jit = callspec is not None and callspec.params.get("jit") is True
        if backend == "torch" and ("xla" in item.keywords or jit):
            item.add_marker(no_xla)


@pytest.fixture(autouse=True)
def _reset_keras_state():
    """Each test starts from float32, seeded, with a fresh name scope.

    `clear_session(free_memory=False)`: its default also runs a full `gc.collect()`, which
    took 1-5 s per test once the session holds many objects (half the suite's time); Python's
    own collector still frees cycles as it goes.
    """
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session(free_memory=False)
