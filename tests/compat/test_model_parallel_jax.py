"""Model parallel on JAX: the zoo's Transformers sharded by `layout_map` train like one device.

A subprocess (this file run as a script) splits the host CPU into eight JAX devices, as
tests/compat/test_distribute_jax.py does for data parallel. For `transformer_lm`,
`transformer_seq2seq` and `transformer_classifier` (2 blocks, d=16, 8 heads, no dropout):
a few `fit` steps (SGD with momentum, float32) on one device, then from the same initial
weights under `keras.distribution.ModelParallel(layout_map=layout_map(...))` on the meshes
(batch, model) = (1, 8), (2, 4), (4, 2). The losses and the weights equal one device's;
each variable's sharding (its JAX array's `.sharding.spec`) is the map's; the map leaves
no variable and no key unmatched on the model built under the distribution. On one mesh
the language model also generates the tokens one device generates, and a `.keras` file
saved from the sharded model loads on one device with equal outputs. Last, the example of
docs/training.md. Runs whatever the current backend (the subprocess is JAX; XLA at -O0 as
tests/conftest.py sets it); skips only when JAX is not installed.

The sizes are chosen so that every kind of split happens: tables over their rows and
over their width, the seq2seq logits over their units and over their input, the language
model's key/value heads kept whole (`kv_heads="replicate"`, 4 heads on a model axis of 8)
and sharded.
"""

import dataclasses
import json
import os
import re
import sys

import numpy as np
import pytest
from jax_subprocess import run_on_cpu_devices
from test_distribute_jax import ROOT, WEIGHTS_ATOL

MESHES = ((1, 8), (2, 4), (4, 2))  # (batch, model)
BATCH, STEPS = 8, 2  # a global batch of 8; 2 epochs of 2 steps
VOCAB = {"lm": 64, "source": 20, "target": 30, "classifier": 50}
NAMES = ("lm", "seq2seq", "classifier")


def _builders():
    from keras_attn import models as zoo

    tiny = dict(num_layers=2, num_heads=8, d_model=16, intermediate_dim=32, dropout=0.0)
    return {
        # 4 key/value heads: whole on a model axis of 8, sharded on 4 and 2.
        "lm": lambda: zoo.transformer_lm(
            VOCAB["lm"], num_key_value_heads=4, sequence_length=16, **tiny
        ),
        "seq2seq": lambda: zoo.transformer_seq2seq(VOCAB["source"], VOCAB["target"], **tiny),
        "classifier": lambda: zoo.transformer_classifier(
            VOCAB["classifier"], 12, 3, position="learned", **tiny
        ),
    }


def _data(name):
    rng = np.random.default_rng(0)
    n = BATCH * STEPS
    if name == "lm":
        tokens = rng.integers(1, VOCAB["lm"], size=(n, 13)).astype("int32")
        tokens[::3, 9:] = 0  # padded rows
        return tokens[:, :-1], tokens[:, 1:]
    if name == "seq2seq":
        source = rng.integers(1, VOCAB["source"], size=(n, 10)).astype("int32")
        source[::3, 7:] = 0
        target = rng.integers(1, VOCAB["target"], size=(n, 9)).astype("int32")
        inputs = {"encoder_inputs": source, "decoder_inputs": target[:, :-1]}
        return inputs, target[:, 1:]
    tokens = rng.integers(1, VOCAB["classifier"], size=(n, 12)).astype("int32")
    tokens[::3, 7:] = 0
    return tokens, (tokens[:, 0] % 3).astype("int32")


def _train(model, data, batch_size=BATCH):
    """Per-epoch losses of 2 epochs of `fit` (SGD with momentum) on `data` in batches of
    `batch_size` (a process's share of the global batch of `BATCH` across processes)."""
    import keras

    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = data
    history = model.fit(x, y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
    return history.history["loss"]


def _spec(variable):
    """The variable's sharding as a tuple of mesh axes, one per dimension."""
    spec = tuple(variable.value.sharding.spec)
    return spec + (None,) * (len(variable.shape) - len(spec))


def _max_diff(a, b):
    return max(
        float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(a, b, strict=True)
    )


def _case(name, build, out_dir):
    """One device, then each mesh from the same initial weights: what each gives."""
    import keras

    from keras_attn import models as zoo

    keras.utils.set_random_seed(0)
    data = _data(name)
    model = build()
    initial = model.get_weights()
    found = {"loss": _train(model, data), "meshes": {}}
    trained = model.get_weights()
    found["moved"] = _max_diff(trained, initial)
    for shape in MESHES:
        mesh = keras.distribution.DeviceMesh(shape, ("batch", "model"))
        # Read from the one-device model; the names restart, and its keys match either way.
        layouts = zoo.layout_map(model, mesh, kv_heads="replicate")
        keras.backend.clear_session(free_memory=False)
        keras.distribution.set_distribution(
            keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch")
        )
        sharded = build()
        sharded.set_weights(initial)
        expected = {v.path: tuple(layouts[v.path].axes) for v in sharded.variables}
        specs = {v.path: _spec(v) for v in sharded.variables}
        found["meshes"][str(shape)] = mesh_found = {
            "check": dataclasses.asdict(zoo.check_layout(sharded, layouts)),
            "spec_mismatches": {
                p: [specs[p], expected[p]] for p in specs if specs[p] != expected[p]
            },
            "sharded": sorted(p for p, axes in specs.items() if "model" in axes),
            "loss": _train(sharded, data),
            "weights_diff": _max_diff(sharded.get_weights(), trained),
        }
        if name == "lm" and shape == MESHES[-1]:
            mesh_found.update(_generation_and_reload(model, sharded, out_dir))
        keras.distribution.set_distribution(None)
        keras.backend.clear_session(free_memory=False)
    return found


def _generation_and_reload(model, sharded, out_dir):
    """`generate` under the distribution, and the sharded model saved, then loaded on one
    device (`model`: the same model trained on one device)."""
    import keras

    from keras_attn import models as zoo

    prompts = np.array([[5, 6, 7, 0], [0, 9, 3, 2]], "int32")
    tokens = np.asarray(zoo.generate(sharded, prompts, max_length=6))
    path = os.path.join(out_dir, "sharded.keras")
    sharded.save(path)
    distribution = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    one_tokens = np.asarray(zoo.generate(model, prompts, max_length=6))
    reloaded = keras.saving.load_model(path)
    x = _data("lm")[0][:BATCH]
    found = {
        "tokens": tokens.tolist(),
        "one_device_tokens": one_tokens.tolist(),
        # Its weights are the sharded model's, gathered; its outputs the one-device model's.
        "reload_weights_equal": all(
            np.array_equal(a, b)
            for a, b in zip(reloaded.get_weights(), sharded.get_weights(), strict=True)
        ),
        "reload_diff": float(np.abs(np.asarray(reloaded(x)) - np.asarray(model(x))).max()),
        "reload_devices": sorted({len(v.value.sharding.device_set) for v in reloaded.variables}),
    }
    keras.distribution.set_distribution(distribution)
    return found


def _docs_example():
    """Runs the example of docs/training.md: its model's specs and `check_layout`."""
    text = open(os.path.join(ROOT, "docs", "training.md")).read()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "layout_map(" in b]
    namespace = {}
    exec(compile(block, "docs/training.md", "exec"), namespace)
    model, layouts = namespace["model"], namespace["layouts"]
    return {
        "check_ok": namespace["models"].check_layout(model, layouts).ok,
        "specs_equal": all(_spec(v) == tuple(layouts[v.path].axes) for v in model.variables),
        "devices": sorted({len(v.value.sharding.device_set) for v in model.variables}),
    }


def _run_script(out):
    import jax

    result = {"devices": len(jax.devices())}
    for name, build in _builders().items():
        result[name] = _case(name, build, os.path.dirname(out))
    result["docs_example"] = _docs_example()  # last: it sets the distribution for good
    with open(out, "w") as f:
        json.dump(result, f)


def test_model_parallel_on_eight_devices_trains_like_one(tmp_path):
    pytest.importorskip("jax")
    out = tmp_path / "result.json"
    run_on_cpu_devices(8, os.path.abspath(__file__), str(out))
    found = json.loads(out.read_text())
    assert found["devices"] == 8
    for name in NAMES:
        case = found[name]
        assert case["moved"] > 1000 * WEIGHTS_ATOL  # training moved the weights far more
        for shape, mesh in case["meshes"].items():
            context = f"{name} on mesh {shape}"
            assert mesh["check"] == {"unmatched": [], "ambiguous": [], "unused": []}, context
            assert mesh["spec_mismatches"] == {}, context
            np.testing.assert_allclose(
                mesh["loss"], case["loss"], rtol=0, atol=1e-5, err_msg=context
            )
            assert mesh["weights_diff"] < WEIGHTS_ATOL, context
    # Every kind of split happened (the specs equal the map's, checked above).
    lm, seq2seq, classifier = (found[name]["meshes"] for name in NAMES)
    query, key = (f"decoder_block_1/self_attention/{p}/kernel" for p in ("query", "key"))
    assert query in lm["(1, 8)"]["sharded"] and key not in lm["(1, 8)"]["sharded"]  # 4 kv heads
    assert key in lm["(2, 4)"]["sharded"]
    assert "token_embedding/embeddings" in lm["(1, 8)"]["sharded"]  # over the vocabulary
    assert "logits/kernel" in seq2seq["(1, 8)"]["sharded"]  # 30 units: over the input
    assert "logits/bias" not in seq2seq["(1, 8)"]["sharded"]
    assert "logits/bias" in seq2seq["(4, 2)"]["sharded"]  # over the units
    assert "embedding/position_embedding/embeddings" in classifier["(1, 8)"]["sharded"]
    assert "encoder_block_0/feedforward_layer_norm/gamma" not in classifier["(1, 8)"]["sharded"]
    # The language model on mesh (4, 2): generation and a .keras file reloaded on one device.
    last = lm[str(MESHES[-1])]
    assert last["tokens"] == last["one_device_tokens"]
    assert last["reload_devices"] == [1]
    assert last["reload_weights_equal"]
    assert last["reload_diff"] < 1e-5
    # The example of docs/training.md: its model split over 4 devices, replicated over 2 x 4.
    assert found["docs_example"] == {"check_ok": True, "specs_equal": True, "devices": [8]}


if __name__ == "__main__":
    _run_script(sys.argv[1])
