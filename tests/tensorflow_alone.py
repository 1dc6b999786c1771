"""A SavedModel's `serving_default` called with TensorFlow alone, in a process of its own.

`keras` and `keras_attn` are not found there, as where they are not installed (every
meta-path finder wrapped, as tests/no_tensorflow_check.py does for TensorFlow).
"""

import json
import os
import subprocess
import sys

HIDDEN = """
import json, sys

class Hide:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("keras", "keras_attn"):
            return None
        find_spec = getattr(self.finder, "find_spec", None)
        return None if find_spec is None else find_spec(name, path, target)

    def __getattr__(self, name):
        return getattr(self.finder, name)

sys.meta_path[:] = [Hide(finder) for finder in sys.meta_path]
import tensorflow as tf
"""

TF_ALONE = (
    HIDDEN
    + """
loaded = tf.saved_model.load(sys.argv[1])
texts = tf.constant(json.loads(sys.argv[2]))
out = loaded.signatures["serving_default"](text=texts)
result = {k: v.numpy().tolist() for k, v in out.items()}
result = {k: [x.decode() if isinstance(x, bytes) else x for x in v] for k, v in result.items()}
try:
    loaded.serving_default(tf.constant([1, 2]))
except TypeError as error:
    result["error"] = str(error)
print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith("keras")), **result}))
"""
)


def tensorflow_alone(path, texts):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("PYTHONPATH", None)
    completed = subprocess.run(
        [sys.executable, "-c", TF_ALONE, str(path), json.dumps(texts)],
        cwd=path.parent, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result.pop("modules") == []
    assert "name='text'" in result.pop("error")  # a number tensor: refused, naming `text`
    return result


def run_tensorflow_alone(path, script, argument):
    """Runs `script` where `keras` and `keras_attn` cannot be imported, with `sys.argv[1]` the
    SavedModel `path` and `sys.argv[2]` `argument` as JSON; returns what its last printed
    line holds (JSON)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("PYTHONPATH", None)
    completed = subprocess.run(
        [sys.executable, "-c", HIDDEN + script, str(path), json.dumps(argument)],
        cwd=path.parent, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])
