"""Parameter bytes per device of `transformer_lm` sharded by `layout_map`, and its step time.

    python -m benchmarks.sharding [--json PATH]
    python -m benchmarks.sharding --step-time [--repeats N] [--json PATH]

Splits the host CPU into 8 JAX devices (before JAX starts; a machine with 8 accelerators
uses them instead).

Bytes (the default): for model axes 1, 2, 4, 6 and 8 builds GPT-2 small's shape
(`transformer_lm(50258, num_layers=12, num_heads=12, d_model=768, intermediate_dim=3072,
sequence_length=1024)`: GPT-2's 50257 tokens and our padding id), and for model axes 1, 2,
4 and 8 the same model with 16 heads of 48 (whose heads 8 devices divide), under
`keras.distribution.ModelParallel(layout_map=layout_map(...))` on the mesh
(batch, model) = (1, m) of the first m devices, without training, and reads what each
device holds from the variables' JAX arrays (`addressable_shards`). It prints a markdown
table per model (the ones in docs/training.md) and whether the bytes on each device at
m = 8 are at most 1/8 of one device's plus the replicated variables' (computed, not
asserted).

`--step-time`: one training step (`train_on_batch`, Adam) of a small `transformer_lm`
(2 layers, 8 heads, d_model 256, sequence 128, global batch 16) on one device and on the
8 devices as meshes (8, 1), (1, 8) and (2, 4), timed in interleaved repeats
(`benchmarks.timing.time_group`: the first two calls, tracing and warm-up, untimed). The
8 virtual CPU devices share the host's cores, so this measures what splitting costs, not
what 8 real devices gain.

`--tiny`: the same code on tiny models, to check it quickly (the tests' smoke run).
"""

import argparse
import json
import os

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import timing  # noqa: E402
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
# name -> (the model's arguments, the model axes measured)
BYTES_MODELS = {
    # 8 does not divide its 12 heads: the map refuses it
    "GPT-2 small": (GPT2_SMALL, (1, 2, 4, 6, 8)),
    "GPT-2 small, 16 heads": (dict(GPT2_SMALL, num_heads=16), (1, 2, 4, 8)),
}
STEP_MODEL = dict(
    vocab_size=2048,
    num_layers=2,
    num_heads=8,
    d_model=256,
    intermediate_dim=1024,
    sequence_length=128,
    dropout=0.0,
)
STEP_BATCH = 16  # the global batch
STEP_MESHES = (None, (8, 1), (1, 8), (2, 4))  # (batch, model); None: one device, no distribution


def tiny(config):
    """`config` shrunk to check the code: 2 layers of width 4 per head, 66 tokens (like
    GPT-2's 50258, a multiple of 2 but not of 4 or 8), 16 positions."""
    heads = config["num_heads"]
    return dict(
        config,
        vocab_size=66,
        num_layers=2,
        d_model=4 * heads,
        intermediate_dim=8 * heads,
        sequence_length=16,
    )


def bytes_per_device(variables):
    """`{device: bytes}` of the shards of `variables` (JAX arrays) each device holds."""
    held = {}
    for variable in variables:
        for shard in variable.value.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return held


def sharded(config, mesh_shape):
    """`transformer_lm(**config)` built under `ModelParallel` on the first devices as a
    (batch, model) mesh, and its layout map; `ValueError` where `layout_map` refuses it.

    Sets the distribution (for good: `set_distribution(None)` to leave it)."""
    devices = keras.distribution.list_devices()[: int(np.prod(mesh_shape))]
    mesh = keras.distribution.DeviceMesh(mesh_shape, ("batch", "model"), devices)
    try:
        with keras.StatelessScope(initialize_variables=False):  # shapes only: nothing allocated
            layouts = models.layout_map(models.transformer_lm(**config), mesh)
    finally:
        keras.backend.clear_session(free_memory=False)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch")
    )
    return models.transformer_lm(**config), layouts


def measure(config, size):
    """One model axis: the bytes on each device, the replicated bytes, the map's size; or
    the `ValueError` of `layout_map`."""
    try:
        model, layouts = sharded(config, (1, size))
    except ValueError as error:
        return {"model_axis": size, "error": str(error)}
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


def bound(rows, size=8):
    """Whether the most bytes a device holds at model axis `size` are at most one device's
    bytes / `size` + the replicated bytes; `None` where that row is missing or refused."""
    one = rows[0]["bytes_per_device"][0]
    row = next((r for r in rows if r["model_axis"] == size and "error" not in r), None)
    if row is None:
        return None
    most, limit = max(row["bytes_per_device"]), one / size + row["replicated_bytes"]
    return {"model_axis": size, "bytes": most, "limit": limit, "holds": bool(most <= limit)}


def bytes_tables(configs):
    """`{name: {"model", "rows", "bound"}}` for `{name: (config, model axes)}`; prints them."""
    report = {}
    for name, (config, axes) in configs.items():
        rows = [measure(config, size) for size in axes]
        report[name] = {"model": config, "rows": rows, "bound": bound(rows)}
        print(f"\n{name}: {rows[0]['parameters']:,} parameters, {rows[0]['keys']} keys")
        print(table(rows))
        found = report[name]["bound"]
        if found is not None:
            print(
                f"bytes(1, 8) <= bytes(1) / 8 + replicated: {found['holds']} "
                f"({found['bytes']:,} <= {found['limit']:,.0f})"
            )
    return report


def mesh_name(shape):
    return "one device" if shape is None else f"({shape[0]}, {shape[1]})"


def train_step(config, shape, tokens):
    """A compiled `train_on_batch` of `transformer_lm(**config)` on the mesh `shape` (or one
    device), as a callable that sets its distribution first and returns the loss."""
    if shape is None:
        keras.distribution.set_distribution(None)
        model = models.transformer_lm(**config)
        distribution = None
    else:
        model, _ = sharded(config, shape)
        distribution = keras.distribution.distribution()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    keras.distribution.set_distribution(None)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step():
        # Repeats interleave the meshes: each step runs under its own model's distribution
        # (Keras splits the batch by the distribution set when the step is called).
        keras.distribution.set_distribution(distribution)
        try:
            return model.train_on_batch(x, y)
        finally:
            keras.distribution.set_distribution(None)

    return step


def step_times(config, batch=STEP_BATCH, meshes=STEP_MESHES, repeats=5, min_time=0.2):
    """`timing.time_group` of one training step per mesh (first: one device); prints a table."""
    keras.utils.set_random_seed(0)
    tokens = np.random.default_rng(0).integers(
        1, config["vocab_size"], size=(batch, config["sequence_length"] + 1)
    )
    steps = {mesh_name(shape): train_step(config, shape, tokens) for shape in meshes}
    keras.backend.clear_session(free_memory=False)
    result = timing.time_group(steps, (), repeats=repeats, min_time=min_time)
    cores = timing.cpu_info()["count"]
    print(
        f"\ntransformer_lm {config}, global batch {batch}: seconds per training step, median "
        f"[min-max] of {repeats} repeats; {len(keras.distribution.list_devices())} virtual "
        f"CPU devices share this host's {cores} cores (the point is correctness and memory)"
    )
    print("| mesh (batch, model) | step time (s) | / one device's |")
    print("|---|---:|---:|")
    for name in steps:
        row = result[name]
        ratio = result["ratio"].get(name)
        versus = (
            "1"
            if ratio is None
            else f"{ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}]"
        )
        print(
            f"| {name} | {row['median_s']:.3f} [{row['min_s']:.3f}-{row['max_s']:.3f}] | {versus} |"
        )
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument(
        "--step-time", action="store_true", help="time a training step per mesh instead"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (--step-time)")
    parser.add_argument("--tiny", action="store_true", help="tiny models: checks the code only")
    args = parser.parse_args(argv)
    meta = {"loadavg_start": timing.loadavg(), "cpu": timing.cpu_info(), "tiny": args.tiny}
    if args.step_time:
        config = tiny(STEP_MODEL) if args.tiny else STEP_MODEL
        result = step_times(config, repeats=args.repeats, min_time=0 if args.tiny else 0.2)
        report = {"model": config, "batch": STEP_BATCH, "step_time": result}
    else:
        configs = BYTES_MODELS
        if args.tiny:
            configs = {name: (tiny(config), axes) for name, (config, axes) in configs.items()}
        report = {"models": bytes_tables(configs)}
    meta["loadavg_end"] = timing.loadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, **report}, f, indent=1)
    return report


if __name__ == "__main__":
    main()
