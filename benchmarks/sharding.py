"""Parameter bytes per device of a GPT-2-small `transformer_lm` sharded by `layout_map`.

    python -m benchmarks.sharding [--json PATH]

Splits the host CPU into 8 JAX devices (before JAX starts; a machine with 8 accelerators
uses them instead), then for model axes 1, 2, 4 and 8 builds GPT-2 small's shape
(`transformer_lm(50258, num_layers=12, num_heads=12, d_model=768, intermediate_dim=3072,
sequence_length=1024)`: GPT-2's 50257 tokens and our padding id) under
`keras.distribution.ModelParallel(layout_map=layout_map(...))` on the mesh
(batch, model) = (1, m) of the first m devices, without training, and reads what each
device holds from the variables' JAX arrays (`addressable_shards`). It prints a markdown
table (the one in docs/training.md) and, with `--json`, writes the numbers.
"""

import argparse
import json
import os

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import keras  # noqa: E402

from keras_attn import models  # noqa: E402

GPT2_SMALL = dict(
    vocab_size=50258,
    num_layers=12,
    num_heads=12,
    d_model=768,
    intermediate_dim=3072,
    sequence_length=1024,
    dropout=0.0,
)
MODEL_AXES = (1, 2, 4, 6, 8)  # 8 does not divide its 12 heads: the map refuses it


def bytes_per_device(variables):
    """`{device: bytes}` of the shards of `variables` (JAX arrays) each device holds."""
    held = {}
    for variable in variables:
        for shard in variable.value.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return held


def measure(size):
    """One model axis: the bytes on each device, the replicated bytes, the map's size; or
    the `ValueError` of `layout_map`."""
    mesh = keras.distribution.DeviceMesh(
        (1, size), ("batch", "model"), keras.distribution.list_devices()[:size]
    )
    try:
        with keras.StatelessScope(initialize_variables=False):  # shapes only: nothing allocated
            layouts = models.layout_map(models.transformer_lm(**GPT2_SMALL), mesh)
    except ValueError as error:
        return {"model_axis": size, "error": str(error)}
    finally:
        keras.backend.clear_session(free_memory=False)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch")
    )
    model = models.transformer_lm(**GPT2_SMALL)
    held = bytes_per_device(model.weights)
    # The variables the map leaves whole (norms, the row-parallel layers' biases, seeds).
    replicated = sum(v.value.nbytes for v in model.weights if "model" not in layouts[v.path].axes)
    keras.distribution.set_distribution(None)
    keras.backend.clear_session(free_memory=False)
    return {
        "model_axis": size,
        "parameters": int(sum(v.value.size for v in model.weights)),
        "total_bytes": int(sum(v.value.nbytes for v in model.weights)),
        "bytes_per_device": sorted(set(held.values())),
        "replicated_bytes": int(replicated),
        "keys": len(layouts),
    }


def table(rows):
    one = rows[0]["bytes_per_device"][0]
    lines = [
        "| model axis | parameter bytes per device | of one device's | 1/m of it + replicated |",
        "|---:|---:|---:|---:|",
    ]
    for row in rows:
        m = row["model_axis"]
        if "error" in row:
            lines.append(f"| {m} | `ValueError`: {row['error'].split(': ', 1)[1]} | | |")
            continue
        most = max(row["bytes_per_device"])
        bound = one / m + row["replicated_bytes"]
        lines.append(
            f"| {m} | {most:,} ({most / 2**20:.1f} MiB) | {most / one:.4f} | {bound / one:.4f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args(argv)
    rows = [measure(size) for size in MODEL_AXES]
    print(f"GPT-2 small: {rows[0]['parameters']:,} parameters, {rows[0]['keys']} keys")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": GPT2_SMALL, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
