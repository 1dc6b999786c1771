import collections
import json
import os
import shutil
import sys
import tempfile

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
XLA_FLAGS = []
if WORKERS > 1:
    XLA_FLAGS += [
        f"--xla_cpu_multi_thread_eigen={str(THREADS > 1).lower()}",
        f"intra_op_parallelism_threads={THREADS}",
    ]
# Most of the JAX step's time, and most of the TensorFlow differential's, is XLA compiling small
# programs (on JAX every eager loop, the chunked kernel's fori_loop, and custom gradient compiles
# anew: 773 compiles took 87 s of 148 s in tests/layers/test_attention.py). Tests need them
# compiled, not fast: XLA's HLO passes (fusion included) still run, with LLVM at optimization
# level 0 and the CPU's older loop emitters instead of the MLIR fusion emitters. Measured on
# 2 cores: ~200 small JAX programs 52-55 -> 30-36 ms each for the second flag on top of the
# first; TensorFlow jit_compile 110 -> 44 ms a compile for both (-O0 alone: 90 ms), and
# tests/layers/test_differential.py 154 s -> 125 s (187 -> 133 s of CPU). TensorFlow's fit
# does not use XLA on a CPU (Keras' jit_compile="auto"), so its training tests are unchanged.
# On JAX, also a persistent compilation cache for the run, shared by the workers and the
# subprocesses tests start, which serves a program compiled before (keyed by its HLO, so a
# re-traced loop with the same shapes is a hit). A user's own XLA_FLAGS /
# JAX_COMPILATION_CACHE_DIR are kept as they are.
XLA_FLAGS += ["--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false"]
MADE_JAX_CACHE = None  # the directory this process made (and removes at the end)
if os.environ["KERAS_BACKEND"] == "jax":
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # the first process makes it; workers inherit
        MADE_JAX_CACHE = tempfile.mkdtemp(prefix="keras-attn-jax-cache-")
        os.environ["JAX_COMPILATION_CACHE_DIR"] = MADE_JAX_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("XLA_FLAGS", " ".join(XLA_FLAGS))

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
    if config.getoption("dist", "no") == "loadfile":  # the files in tests/conftest.py's order
        config.option.loadscopereorder = False
    config.addinivalue_line(
        "markers",
        "tensorflow_only: needs the TensorFlow backend (tf.function graphs, SavedModel, tfds); "
        "skipped on other Keras backends (KERAS_BACKEND=jax)",
    )
    config.addinivalue_line(
        "markers",
        "backends: runs on every Keras backend in CI (.ci/jax, .ci/torch select it). Every test "
        f"under tests/{{{','.join(BACKEND_FOLDERS)}}}/ carries it (the code that differs per "
        "backend), unless its module is marked `one_backend`; elsewhere a module opts in.",
    )
    config.addinivalue_line(
        "markers",
        "one_backend: a core module whose checks involve no backend op (constructor arguments, "
        "Keras' own layers): the TensorFlow run is enough.",
    )
    config.addinivalue_line(
        "markers",
        "jax_slow: hundreds of small eager calls, each compiled anew on JAX (minutes on 2 cores); "
        ".ci/jax leaves them to the TensorFlow and torch runs.",
    )
    config.addinivalue_line(
        "markers",
        "other_backends: JAX and torch only; on TensorFlow other files run the same checks "
        "(skipped there).",
    )
    config.addinivalue_line(
        "markers",
        "slow_covered: a quick test whose every check a slow test repeats at full size; CI, "
        "which runs both, leaves it out (.ci/run: `not slow_covered`).",
    )
    config.addinivalue_line(
        "markers",
        "xla: checks what only an XLA-compiled call does (tf.function(jit_compile=True), "
        "jax.jit); skipped on torch, which has no XLA. A test parametrized with `jit=True` "
        "counts as marked.",
    )


def pytest_runtest_logreport(report):
    """Under `KERAS_ATTN_SKIPPED_TO=FILE`, appends the node id of every skipped test to FILE.

    CI runs the README's test command in the README's venv (`.[test]`, without JAX, torch or
    the packages whose files the offline text builders read), where the tests that need them
    skip; it then installs those and runs the skipped tests again (.ci/run). Workers append a
    line each, in append mode.
    """
    path = os.environ.get("KERAS_ATTN_SKIPPED_TO")
    if path and report.skipped and report.when in ("setup", "call"):
        with open(path, "a") as f:
            f.write(report.nodeid + "\n")


def pytest_collectreport(report):
    """Under `KERAS_ATTN_SKIPPED_TO=FILE`, a test file skipped whole (a module-level
    `pytest.importorskip`) is listed too, by its path: it has no test to report."""
    path = os.environ.get("KERAS_ATTN_SKIPPED_TO")
    if path and report.skipped:
        with open(path, "a") as f:
            f.write(report.nodeid + "\n")


def pytest_unconfigure(config):
    if MADE_JAX_CACHE:
        shutil.rmtree(MADE_JAX_CACHE, ignore_errors=True)


def _steps(config):
    """The CI steps this run is, for tests/durations.json: the backend, `-slow` for `-m slow`,
    and both for a run of the quick and the training tests together (`-m "slow or not slow"`,
    as CI runs them on TensorFlow)."""
    marks = (config.getoption("markexpr", "") or "").replace(" ", "")
    marks = marks.replace("andnotslow_covered", "").strip("()")  # CI's run leaves those out
    backend = keras.backend.backend()
    if marks in ("", "slowornotslow", "notsloworslow"):
        return [backend, backend + "-slow"]
    slow = "slow" in marks and "notslow" not in marks
    return [backend + ("-slow" if slow else "")]


def _longest_files_first(config, items):
    """Under xdist's `--dist loadfile`: the test files in the order of their measured time.

    xdist hands each worker a file at a time, by default the files with the most tests first;
    a file of one long test (the main job's, 160 s) then starts last while the other worker
    idles. The measured seconds per file and CI step (tests/durations.json, written by
    `.ci/durations.py` from `--durations=0` logs) order them longest first instead; a file
    not measured counts 1 s per test. Within a file the order stays. Only the order changes.
    """
    path = os.path.join(os.path.dirname(__file__), "durations.json")
    with open(path) as f:
        table = json.load(f)
    seconds = collections.Counter()
    for step in _steps(config):  # a file in both steps (quick and slow tests) sums its times
        seconds.update(table.get(step, {}))
    counts = collections.Counter(item.path.name for item in items)
    weight = {name: seconds.get(name, float(n)) for name, n in counts.items()}
    items.sort(key=lambda item: -weight[item.path.name])  # stable: a file's tests stay together


# The tests of the code that differs per backend: ops, kernels, masks, the layers, positions,
# the blocks, the cache and decoding. Marked `backends` (see pytest_configure).
BACKEND_FOLDERS = ("kernels", "layers", "positions", "blocks", "decoding")
TESTS = os.path.dirname(os.path.abspath(__file__))


def _mark_backends(items):
    for item in items:
        folder = os.path.relpath(str(item.path), TESTS).split(os.sep)[0]
        if folder in BACKEND_FOLDERS and "one_backend" not in item.keywords:
            item.add_marker(pytest.mark.backends)


@pytest.hookimpl(tryfirst=True)  # before pytest deselects by `-m`
def pytest_collection_modifyitems(config, items):
    _mark_backends(items)
    if WORKERS > 1:  # an xdist worker (where `--dist` reads "no")
        _longest_files_first(config, items)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        others = pytest.mark.skip(reason="run on JAX and torch: other files check TensorFlow")
        for item in items:
            if "other_backends" in item.keywords:
                item.add_marker(others)
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
