"""Imported first by the examples: TensorFlow's start-up notices hidden, as the CLI hides them.

TensorFlow reads TF_CPP_MIN_LOG_LEVEL once, when it is imported, and prints some notices
while it loads whatever the level (oneDNN, CUDA, CPU features). Unless the user set the
level, this sets it to 3 and imports TensorFlow with stderr pointed at /dev/null; an import
error still shows its traceback. Copy it next to your own script and `import quiet` before
anything that imports TensorFlow (Keras, keras_attn, tensorflow_datasets) to do the same.
"""

import os
import sys

if "TF_CPP_MIN_LOG_LEVEL" not in os.environ:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
