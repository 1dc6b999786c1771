"""The device check: keras-attn on a GPU machine (JAX and torch, no TensorFlow), one table.

    bash benchmarks/device/build_wheelhouse.sh   # here: Keras, pytest, keras-attn wheels
    bash benchmarks/device/check.sh              # there: writes $OUT/device_check.md (+ .json)
    bash benchmarks/device/check.sh --dry-run    # here, in about a minute: tiny shapes, JAX on CPU

Modules:
    plan           the shapes, policies and cases; the key of each table row (pure Python)
    report         FLOP counts, the table, and the report from the steps' rows (pure Python)
    steps          training steps, timing and memory on JAX or torch
    bench          the steps check.sh runs: env, tests, speed (per length: group), fit, report
    no_tensorflow  makes `import tensorflow` fail, as on the GPU machine
"""
