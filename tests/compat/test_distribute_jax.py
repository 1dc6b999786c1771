"""Scale-out on JAX: `keras.distribution.DataParallel` trains a zoo model like one device.

A subprocess (this file run as a script) splits the host CPU into two JAX devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=2`, before JAX starts), trains a
`transformer_classifier` on one device, then again, from the same initial weights, on
both under `DataParallel`: the same NumPy batches, the same global batch; then the
example of docs/training.md. Runs whatever the current backend (the subprocess is JAX);
skips only when JAX is not installed.
"""

import json
import os
import re
import sys

import numpy as np
import pytest
from jax_subprocess import ROOT, run_on_cpu_devices

STEPS, BATCH = 4, 8  # 2 epochs of 4 steps, a global batch of 8 (4 examples per device)
# Two devices sum their half-batch gradients (an all-reduce) in another order than one
# device sums the whole batch: float32 rounding, ~1e-7. Measured after the 8 SGD steps:
# at most 2.4e-7 on any weight, which moved by up to 0.64 (docs/training.md, "JAX").
# (Adam would scale the rounding up where a gradient entry is near zero, as it divides
# by its root mean square: 3.2e-5 with Adam(1e-2) on the same run.)
WEIGHTS_ATOL = 1e-5


def train(devices):
    """Weights and per-epoch losses after `STEPS` steps on `devices` JAX devices."""
    import jax
    import keras

    from keras_attn import models as zoo

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 50, size=(STEPS * BATCH, 12)).astype("int32")
    tokens[::3, 7:] = 0  # padded rows: the mask reaches every block and the pooling
    labels = (tokens[:, 0] % 2).astype("int32")
    if devices > 1:
        names = keras.distribution.list_devices()[:devices]  # "cpu:0", "cpu:1"
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=names))
    model = zoo.transformer_classifier(
        50, 12, 2, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32, dropout=0.0
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    shards = {len(v.value.sharding.device_set) for v in model.trainable_variables}
    initial = [np.asarray(w) for w in model.get_weights()]
    history = model.fit(tokens, labels, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    weights = model.get_weights()
    return {
        "weights": [np.asarray(w).tolist() for w in weights],
        "moved": max(float(np.abs(w - w0).max()) for w, w0 in zip(weights, initial, strict=True)),
        "loss": history.history["loss"],
        "variable_devices": sorted(shards),
        "devices": len(jax.devices()),
    }


def docs_example():
    """Runs the example of docs/training.md; how many devices hold its model's variables."""
    text = open(os.path.join(ROOT, "docs", "training.md")).read()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "DataParallel" in b]
    namespace = {}
    exec(compile(block, "docs/training.md", "exec"), namespace)
    return sorted({len(v.value.sharding.device_set) for v in namespace["model"].variables})


def _run_script(out):
    result = {"one": train(1)}
    result["two"] = train(2)
    result["docs_example_devices"] = docs_example()  # last: it sets the distribution for good
    with open(out, "w") as f:
        json.dump(result, f)


def test_data_parallel_on_two_devices_trains_like_one(tmp_path):
    pytest.importorskip("jax")
    out = tmp_path / "result.json"
    run_on_cpu_devices(2, os.path.abspath(__file__), str(out))
    found = json.loads(out.read_text())
    one, two = found["one"], found["two"]
    assert one["devices"] == two["devices"] == 2
    assert one["variable_devices"] == [1] and two["variable_devices"] == [2]  # replicated
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-5)
    for a, b in zip(one["weights"], two["weights"], strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=WEIGHTS_ATOL, rtol=0)
    assert one["moved"] > 1000 * WEIGHTS_ATOL  # training moved the weights far more
    assert found["docs_example_devices"] == [2]


if __name__ == "__main__":
    _run_script(sys.argv[1])
