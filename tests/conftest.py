import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(__file__))

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _reset_keras_state():
    """Each test starts from float32, seeded, with a fresh name scope."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()
