"""Makes `import tensorflow` fail, as it does on the GPU machine (JAX and torch, no TensorFlow).

The dry run here, where TensorFlow is installed, blocks it so that anything the device
check reaches that needs TensorFlow fails here first. `None` in `sys.modules` is Python's
own way to say "absent": `import tensorflow` raises `ModuleNotFoundError` and
`importlib.util.find_spec("tensorflow")` returns `None`, as for a package not installed.
"""

import sys

BLOCKED = ("tensorflow", "tensorflow_datasets", "tf_keras")


def block():
    """Blocks the packages of `BLOCKED`; they must not be imported yet."""
    loaded = [m for m in BLOCKED if sys.modules.get(m) is not None]
    if loaded:
        raise RuntimeError(f"already imported, cannot block: {loaded}")
    for name in BLOCKED:
        sys.modules[name] = None
