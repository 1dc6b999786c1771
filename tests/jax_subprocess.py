"""A JAX program on several virtual CPU devices, in a subprocess of the test.

JAX reads its device count once, when it starts (`XLA_FLAGS`'s
`--xla_force_host_platform_device_count`), so the tests of data and model parallelism run
their script in a fresh interpreter: `KERAS_BACKEND=jax` on the CPU, `devices` devices and
tests/conftest.py's XLA flags (XLA at -O0: these programs need compiling, not speed), from
the repository root.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_devices_env(devices):
    """The environment variables of a JAX process on `devices` CPU devices (with os.environ)."""
    flags = os.environ.get("XLA_FLAGS", "")
    return dict(
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        CUDA_VISIBLE_DEVICES="",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {flags}",
        # The repository, and tests/ for the shared helpers (this module) a test script imports
        PYTHONPATH=os.pathsep.join([ROOT, os.path.dirname(os.path.abspath(__file__))]),
    )


def run_on_cpu_devices(devices, *arguments, timeout=600):
    """`python ARGUMENTS...` on `devices` JAX CPU devices; the finished process.

    Fails the test with the end of its output unless it exits with 0.
    """
    result = subprocess.run(
        [sys.executable, *arguments],
        cwd=ROOT,
        env=dict(os.environ, **cpu_devices_env(devices)),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result
