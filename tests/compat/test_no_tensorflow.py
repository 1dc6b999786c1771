"""keras_attn, its zoo and its testing kit work where TensorFlow is not installed.

The check (`tests/no_tensorflow_check.py`) runs in a subprocess on JAX, then torch, with
`tensorflow` and `tensorflow_datasets` made unimportable before Keras starts:
it imports the library, the zoo and `keras_attn.testing`, runs a property check,
trains a zoo model a step, decodes (equal to an uncached greedy decode) and
reloads a `.keras` file (equal outputs). `.ci/no-tensorflow` runs the same check in
a venv that has no TensorFlow at all.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_library_zoo_and_kit_run_with_tensorflow_unimportable(backend):
    pytest.importorskip(backend)
    env = dict(os.environ, KERAS_BACKEND=backend, JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, os.path.join("tests", "no_tensorflow_check.py"), "--block"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.startswith("ok"), result.stdout
