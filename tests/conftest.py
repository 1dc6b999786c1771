import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(__file__))
# Under pytest-xdist (`-n N`, as CI runs), each worker gets its share of the cores: N processes
# each with thread pools the size of the machine oversubscribe it (on 2 cores, `-n 2` with one
# thread per worker took 7 % less CPU time than one process, and with the default pools 12 %
# more). XLA (JAX, and TensorFlow's jit_compile) reads its flags before its first computation.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
THREADS = max(1, (CPUS or 1) // WORKERS)
if WORKERS > 1:
    os.environ.setdefault(
        "XLA_FLAGS",
        f"--xla_cpu_multi_thread_eigen={str(THREADS > 1).lower()} "
        f"intra_op_parallelism_threads={THREADS}",
    )

import keras  # noqa: E402
import pytest  # noqa: E402

if WORKERS > 1 and keras.backend.backend() == "tensorflow":
    import tensorflow as tf

    # This process only: the subprocesses tests start keep TensorFlow's defaults.
    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
    tf.config.threading.set_inter_op_parallelism_threads(THREADS)
elif WORKERS > 1 and keras.backend.backend() == "torch":
    import torch

    torch.set_num_threads(THREADS)


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
