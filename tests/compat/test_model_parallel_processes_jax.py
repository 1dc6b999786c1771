"""Model parallel across processes on JAX: a mesh over two processes trains like one device.

The test starts this file as a script twice, two JAX processes on localhost
(`keras.distribution.initialize`, which calls `jax.distributed.initialize`; JAX's CPU
collectives between the processes, gloo over TCP, JAX's default), each with two virtual CPU
devices: a mesh of four devices, two per process. Both processes build the
`transformer_lm` of tests/compat/test_model_parallel_jax.py from the same seed; process 0
trains it on one device (the reference). Then, from those initial weights, both train it
under `keras.distribution.ModelParallel(layout_map=layout_map(...))` on the meshes
(batch, model) = (1, 4), the model split over both processes (each process feeds the whole
global batch), and (2, 2), the batch split over the processes (each feeds its half of every
global batch, as Keras expects for arrays: it splits only a `tf.data.Dataset` itself). The
losses and the weights (gathered from both processes) equal one device's; each variable's
sharding is the map's. Keras' `get_weights` and `save` fail on (1, 4), where a process holds
a part of a weight, and work on (2, 2), where it holds a whole copy. Runs whatever the
current backend (the subprocesses are JAX; XLA at -O0 as tests/conftest.py sets it); skips
only when JAX is not installed.
"""

import json
import math
import os
import sys

import numpy as np
import pytest
from jax_subprocess import cpu_devices_env
from test_distribute import _free_ports, _start, _wait
from test_distribute_jax import WEIGHTS_ATOL
from test_model_parallel_jax import BATCH, _builders, _data, _max_diff, _spec, _train

PROCESSES, DEVICES = 2, 2  # devices per process
MESHES = ((1, 4), (2, 2))  # (batch, model): the model, then the batch, split over the processes
TIMEOUT = 300  # seconds for both processes, the start of JAX included
QUERY = "decoder_block_1/self_attention/query/kernel"  # split over the heads
NOT_ADDRESSABLE = "RuntimeError: Fetching value for `jax.Array` that spans non-addressable"


def _share(data, distribution):
    """This process's share of every global batch of `data` (in global batches of `BATCH`).

    Keras puts the batches of arrays on the mesh as each process's share of the global
    batch (`jax.make_array_from_process_local_data`): the processes that hold the same
    rows of the batch axis feed the same rows.
    """
    shards = min(distribution.num_model_replicas, distribution.num_processes)
    index, size = distribution.data_shard_id, BATCH // shards

    def share(array):
        batches = array.reshape(-1, BATCH, *array.shape[1:])
        return batches[:, index * size : (index + 1) * size].reshape(-1, *array.shape[1:])

    return tuple(share(a) for a in data), size


def _pieces(value):
    """How many distinct pieces of the JAX array `value` this process holds, of how many."""
    here = {str(shard.index) for shard in value.addressable_shards}
    return [len(here), value.size // math.prod(value.sharding.shard_shape(value.shape))]


def _gathered(model):
    """The model's weights as whole NumPy arrays (from every process's shards)."""
    from jax.experimental import multihost_utils

    return [
        np.asarray(multihost_utils.process_allgather(w.value, tiled=True)) for w in model.weights
    ]


def _error(function, *args):
    """The error `function(*args)` raises, as text (`None`: none)."""
    try:
        function(*args)
    except Exception as error:  # noqa: BLE001 -- what fails is the finding
        return f"{type(error).__name__}: {error}"
    return None


def _run_script(port, process_id, out):
    import jax
    import keras

    from keras_attn import models as zoo

    keras.utils.set_random_seed(0)  # before `initialize`, which would draw a common seed
    keras.distribution.initialize(f"localhost:{port}", PROCESSES, process_id)
    build = _builders()["lm"]
    data = _data("lm")
    model = build()
    initial = model.get_weights()
    found = {"devices": [jax.device_count(), jax.local_device_count()], "meshes": {}}
    if process_id == 0:  # the reference: one device, one process
        found["loss"] = _train(model, data)
        trained = model.get_weights()
        found["weights"] = [w.tolist() for w in trained]
        found["moved"] = _max_diff(trained, initial)
    for shape in MESHES:
        mesh = keras.distribution.DeviceMesh(shape, ("batch", "model"))
        layouts = zoo.layout_map(model, mesh, kv_heads="replicate")
        keras.backend.clear_session(free_memory=False)
        # Arrays, each process's share already (`_share`): Keras splits only a tf.data.Dataset.
        distribution = keras.distribution.ModelParallel(
            layout_map=layouts, batch_dim_name="batch", auto_shard_dataset=False
        )
        keras.distribution.set_distribution(distribution)
        sharded = build()
        sharded.set_weights(initial)
        specs = {v.path: _spec(v) for v in sharded.variables}
        share, batch_size = _share(data, distribution)
        found["meshes"][str(shape)] = {
            "spec_mismatches": {
                p: [s, tuple(layouts[p].axes)]
                for p, s in specs.items()
                if s != tuple(layouts[p].axes)
            },
            "query_pieces": _pieces(next(v.value for v in sharded.variables if v.path == QUERY)),
            "batch_size": batch_size,
            "loss": _train(sharded, share, batch_size),
            "weights": [w.tolist() for w in _gathered(sharded)],
            # What Keras 3.15 cannot do with weights split over processes (docs/training.md).
            "get_weights": _error(sharded.get_weights),
            "save": _error(sharded.save, os.path.join(os.path.dirname(out), f"{process_id}.keras")),
        }
        keras.distribution.set_distribution(None)
        keras.backend.clear_session(free_memory=False)
    with open(out, "w") as f:
        json.dump(found, f)


def test_model_parallel_across_two_processes_trains_like_one(tmp_path):
    pytest.importorskip("jax")
    (port,) = _free_ports(1)
    env = cpu_devices_env(DEVICES)  # with tests/conftest.py's flags (XLA at -O0)
    logs = [tmp_path / f"process_{i}.log" for i in range(PROCESSES)]
    outs = [tmp_path / f"process_{i}.json" for i in range(PROCESSES)]
    processes = [
        _start(log, str(port), str(i), str(out), script=__file__, **env)
        for i, (log, out) in enumerate(zip(logs, outs, strict=True))
    ]
    _wait(processes, logs, TIMEOUT)
    found = [json.loads(out.read_text()) for out in outs]
    one = found[0]
    assert one["moved"] > 1000 * WEIGHTS_ATOL  # training moved the weights far more
    for process_id, process in enumerate(found):
        assert process["devices"] == [PROCESSES * DEVICES, DEVICES]
        for shape, mesh in process["meshes"].items():
            context = f"process {process_id}, mesh {shape}"
            assert mesh["spec_mismatches"] == {}, context
            assert mesh["batch_size"] == BATCH // (2 if shape == "(2, 2)" else 1), context
            np.testing.assert_allclose(
                mesh["loss"], one["loss"], rtol=0, atol=1e-5, err_msg=context
            )
            assert _max_diff(mesh["weights"], one["weights"]) < WEIGHTS_ATOL, context
        # (1, 4): each process holds half of the query kernel's 4 pieces; (2, 2): both hold
        # both pieces (the model axis is within a process, the batch axis across them).
        split, whole = process["meshes"]["(1, 4)"], process["meshes"]["(2, 2)"]
        assert split["query_pieces"] == [2, 4] and whole["query_pieces"] == [2, 2]
        # Keras reads a variable's value on one process: it fails where the process holds
        # only a part of it, and works where it holds a whole copy.
        for call in ("get_weights", "save"):
            assert split[call].startswith(NOT_ADDRESSABLE), (process_id, call, split[call])
            assert whole[call] is None, (process_id, call, whole[call])


if __name__ == "__main__":
    _run_script(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
