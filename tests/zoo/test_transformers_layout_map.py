"""An imported Hugging Face checkpoint sharded by our `layout_map`: on JAX with four CPU
devices (a subprocess: this file run as a script, as tests/compat/test_model_parallel_jax.py
does), a tiny Llama that `transformers` builds and saves here (nothing downloaded) is loaded
by `from_transformers` under `keras.distribution.ModelParallel(layout_map=...)` on the mesh
(batch, model) = (2, 2): every variable is matched by one rule and laid out as the map says,
and its logits (of -1-padded tokens, 0 a real token among them) and greedy tokens equal the
one-device model's and transformers' own.
"""

import json
import os
import sys

import numpy as np
import pytest

TOKENS = [[0, 5, 17, 3, 44, 9], [-1, -1, 0, 11, 6, 60]]


def _run_script(folder, out):
    import jax
    import keras

    from keras_attn import models as zoo

    tokens = np.array(TOKENS, "int32")
    model = zoo.from_transformers(folder)
    found = {
        "devices": len(jax.devices()),
        "logits": keras.ops.convert_to_numpy(model(tokens)).tolist(),
        "tokens": zoo.generate(model, tokens, 4).tolist(),
    }
    mesh = keras.distribution.DeviceMesh((2, 2), ("batch", "model"))
    layouts = zoo.layout_map(model, mesh)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch")
    )
    sharded = zoo.from_transformers(folder)
    specs = {v.path: tuple(v.value.sharding.spec) for v in sharded.variables}
    found.update(
        check=zoo.check_layout(sharded, layouts).ok,
        mismatches=[  # the JAX array's spec (trailing None dropped) against the map's axes
            p
            for p, spec in specs.items()
            if tuple(spec) + (None,) * (len(layouts[p].axes) - len(spec)) != tuple(layouts[p].axes)
        ],  # fmt: skip
        sharded=sorted(p for p, spec in specs.items() if "model" in spec),
        sharded_logits=keras.ops.convert_to_numpy(sharded(tokens)).tolist(),
        sharded_tokens=zoo.generate(sharded, tokens, 4).tolist(),
    )
    with open(out, "w") as f:
        json.dump(found, f)


@pytest.mark.slow  # a JAX subprocess: its start and compilations take tens of seconds
def test_imported_llama_sharded_by_layout_map_computes_as_one_device(tmp_path):
    pytest.importorskip("jax")
    pytest.importorskip("safetensors")
    torch = pytest.importorskip("torch")
    from hf_models import tiny_causal_lm
    from jax_subprocess import run_on_cpu_devices

    hf = tiny_causal_lm("llama", 64, 32, 4, 2, 64, 2, tie_word_embeddings=False)
    hf.save_pretrained(tmp_path / "hf")
    out = tmp_path / "found.json"
    run_on_cpu_devices(4, os.path.abspath(__file__), str(tmp_path / "hf"), str(out))
    found = json.loads(out.read_text())
    assert found["devices"] == 4
    assert found["check"] and found["mismatches"] == []
    assert "decoder_block_0/self_attention/query/kernel" in found["sharded"]
    tokens = np.array(TOKENS)
    real = tokens >= 0
    with torch.no_grad():
        theirs = hf(torch.tensor(np.maximum(tokens, 0)), attention_mask=torch.tensor(real).long())
    np.testing.assert_allclose(
        np.array(found["logits"])[real], theirs.logits.numpy()[real], atol=1e-4
    )
    np.testing.assert_allclose(found["sharded_logits"], found["logits"], atol=1e-5)
    assert found["sharded_tokens"] == found["tokens"]


if __name__ == "__main__":
    _run_script(*sys.argv[1:])
