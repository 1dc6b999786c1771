"""Scale-out: the zoo's models and recipes under `tf.distribute` train like one device.

Every run is a subprocess that runs this file as a script: logical CPU devices must be
set before TensorFlow starts, and each worker of a cluster is a process of its own.
Every subprocess has a timeout and is killed at it, so a hang fails the test instead of
hanging CI. The recipe runs are `keras-attn train rnn-attention-reverse` on the tiny copy
set: 12 steps of a global batch of 16, the same seed everywhere.
"""

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 300  # seconds for one run, the start of TensorFlow included
DATASET = "keras_attn_seq2seq/tiny-copy"
RECIPE = ["train", "rnn-attention-reverse", "--dataset", DATASET, "--epochs", "3",
          "--train-examples", "64", "--test-examples", "8", "--batch-size", "16"]  # fmt: skip
# The same computation split over replicas: the replicas sum their half-batch gradients
# in another order than one device sums the whole batch, and float32 rounding (~1e-7
# relative) grows a little over the steps. Measured: <2e-7 relative (docs/training.md,
# "Training on several devices").
LOSS_RTOL = 1e-4
# The recipe's loss is a mean over the real (unpadded) tokens, and Keras takes that mean
# on each replica's half-batch, then averages the replicas: halves with different token
# counts weigh their tokens differently than one device. Measured: at most 1.9e-3
# relative over the 12 steps; another shuffle of the same data moves the curve by 1.7e-2.
RECIPE_RTOL = 5e-3


# ---------------------------------------------------------------------------
# Running this file as a subprocess
# ---------------------------------------------------------------------------


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env["CUDA_VISIBLE_DEVICES"] = "-1"  # CPU replicas, the same on every machine
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def _start(log, *args, script=__file__, **env):
    """`script` (this file) run with `args` in a subprocess, its output to the file `log`."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, os.path.abspath(script), *args],
            cwd=ROOT, env=_env(**env), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def _wait(processes, logs, timeout=TIMEOUT):
    """Waits for every process; kills them all at the deadline or at the first failure
    (of any of them: the others may wait for it), and then shows every process's log."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            statuses = [process.poll() for process in processes]
            failed = [status for status in statuses if status not in (None, 0)]
            assert not failed, f"exit status {failed[0]}:\n{_tails(processes, logs)}"
            if None not in statuses:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout}s:\n{_tails(processes, logs)}")
            time.sleep(0.2)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def _tail(log, lines=40):
    with open(log) as f:
        return "".join(f.readlines()[-lines:])


def _tails(processes, logs):
    """The end of each log, under its process's exit status (`None`: still running)."""
    return "\n".join(
        f"--- {log.name} (exit status {process.poll()}):\n{_tail(log)}"
        for process, log in zip(processes, logs, strict=True)
    )


def _run(tmp_path, name, *args, timeout=TIMEOUT, **env):
    log = tmp_path / f"{name}.log"
    _wait([_start(log, *args, **env)], [log], timeout)


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _train(tmp_path, name, data_dir, devices, *flags, mode="cli"):
    """`keras-attn train` in a subprocess; returns its per-step losses."""
    losses = tmp_path / f"{name}_losses.json"
    out = tmp_path / name
    _run(tmp_path, name, mode, str(devices), str(losses), *RECIPE, "--data-dir", data_dir,
         "--output", str(out), *flags)  # fmt: skip
    return json.loads(losses.read_text())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The tiny copy set, generated once: workers must not generate it at the same time."""
    from keras_attn.models.datasets import loading

    path = str(tmp_path_factory.mktemp("tfds"))
    loading.load(DATASET, "train", path)
    return path


@pytest.fixture(scope="module")
def one_replica(data_dir, tmp_path_factory):
    """The recipe on one device, through the same code path as more replicas.

    Not the run without `--strategy`: under any strategy Keras 3.15 draws one batch to
    build the model before training, so a reshuffling `tf.data` pipeline trains on its
    second shuffle instead of its first (docs/training.md).
    Only its losses are compared: it skips the SavedModel export and the plot (`cli-losses`;
    the two-replica and multi-worker runs export theirs).
    """
    path = tmp_path_factory.mktemp("one")
    return _train(path, "one", data_dir, 1, "--strategy", "mirrored", mode="cli-losses")


@pytest.fixture(scope="module")
def two_replicas(data_dir, tmp_path_factory):
    """The recipe on two logical CPU devices; returns `(losses, output directory)`."""
    tmp_path = tmp_path_factory.mktemp("two")
    return _train(tmp_path, "two", data_dir, 2, "--strategy", "mirrored"), tmp_path / "two"


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_mirrored_model_has_mirrored_variables_and_both_replicas_compute(tmp_path):
    _run(tmp_path, "inspect", "inspect", str(tmp_path / "inspect.json"))
    found = json.loads((tmp_path / "inspect.json").read_text())
    assert found["replicas"] == 2
    assert found["variable_types"] == ["MirroredVariable"]
    assert found["copies"] == [2]  # one copy of every variable on each logical CPU
    assert found["rows_per_replica"] == [32.0, 32.0]  # 64 rows, half on each replica
    # model-level fit on NumPy data: one device without any strategy, and two replicas
    np.testing.assert_allclose(found["mirrored_losses"], found["plain_losses"], rtol=LOSS_RTOL)
    # decoding sees one row per example (Keras' predict_on_batch gives one per replica)
    assert found["predict_on_batch_rows"] == 16
    assert found["decode_rows"] == 8
    np.testing.assert_allclose(found["decode_vs_plain"], 0.0, atol=1e-5)


@pytest.mark.slow
def test_mirrored_recipe_gives_the_loss_curve_of_one_device(one_replica, two_replicas):
    losses, out = two_replicas
    assert len(losses) == len(one_replica) == 12
    np.testing.assert_allclose(losses, one_replica, rtol=RECIPE_RTOL)
    metrics = json.loads((out / "rnn-attention-reverse_metrics.json").read_text())
    assert 0 <= metrics["exact_match"] <= 1 and len(metrics["loss"]) == 3
    assert (out / "rnn-attention-reverse_savedmodel" / "saved_model.pb").exists()


@pytest.mark.slow
def test_two_workers_train_like_two_replicas_and_only_the_chief_writes(
    one_replica, two_replicas, data_dir, tmp_path
):
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes, logs = [], []
    for index in range(2):
        config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        logs.append(tmp_path / f"worker{index}.log")
        processes.append(
            _start(
                logs[-1], "cli", "1", str(tmp_path / f"losses{index}.json"), *RECIPE,
                "--data-dir", data_dir, "--output", str(tmp_path / f"out{index}"),
                "--strategy", "multi-worker", "--backup-dir", str(tmp_path / "backup"),
                TF_CONFIG=config,
            )
        )  # fmt: skip
    _wait(processes, logs)
    for index in range(2):
        losses = json.loads((tmp_path / f"losses{index}.json").read_text())
        # the same split of every global batch as two local replicas: the same curve
        np.testing.assert_allclose(losses, two_replicas[0], rtol=LOSS_RTOL)
        np.testing.assert_allclose(losses, one_replica, rtol=RECIPE_RTOL)
    chief, worker = tmp_path / "out0", tmp_path / "out1"
    assert (chief / "rnn-attention-reverse.keras").exists()
    assert (chief / "rnn-attention-reverse_savedmodel" / "saved_model.pb").exists()
    assert len(json.loads((chief / "rnn-attention-reverse_metrics.json").read_text())["loss"]) == 3
    assert not worker.exists()  # the other worker saved into temporary directories only
    assert not (tmp_path / "backup").exists()  # a finished run deletes its backup
    assert "the chief writes the files" in _tail(logs[1])


def test_multi_worker_without_tf_config_fails_plainly(capsys, monkeypatch):
    from keras_attn.models import cli
    from keras_attn.models.recipes import distribution_strategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cli.main(["train", "pointer-sort", "--strategy", "multi-worker"]) == 2
    assert "needs TF_CONFIG" in capsys.readouterr().err
    with pytest.raises(ValueError, match="TF_CONFIG"):
        distribution_strategy("multi-worker")
    with pytest.raises(ValueError, match="Received: strategy='ring'"):
        distribution_strategy("ring")
    assert distribution_strategy(None) is None


# ---------------------------------------------------------------------------
# The subprocess side
# ---------------------------------------------------------------------------


def _split_cpu(devices):
    """`devices` logical CPU devices; must run before TensorFlow starts."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    config = [tf.config.LogicalDeviceConfiguration() for _ in range(devices)]
    tf.config.set_logical_device_configuration(cpu, config)


def _inspect(path):
    """What Keras does with a model built in a `MirroredStrategy` scope of 2 CPU replicas."""
    _split_cpu(2)
    import keras

    from keras_attn import models as zoo
    from keras_attn.models.decoding import predict_batch
    from keras_attn.models.recipes import distribution_strategy

    strategy = distribution_strategy("mirrored")
    rng = np.random.default_rng(0)
    points = rng.random((64, 5, 1)).astype("float32")
    pointers = np.argsort(points[..., 0], -1).astype("int32")
    x = {"points": points, "pointers": pointers}

    def build():
        keras.utils.set_random_seed(0)
        model = zoo.pointer_network(input_dim=1, units=16)
        model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy())
        return model

    def fit(model):
        return model.fit(x, pointers, batch_size=16, epochs=3, verbose=0).history["loss"]

    plain = build()
    plain_losses = fit(plain)
    with strategy.scope():
        mirrored = build()
    mirrored_losses = fit(mirrored)

    class RowCounter(keras.layers.Layer):
        """Counts the rows each replica sees (a variable synchronized on read)."""

        def build(self, input_shape):
            self.rows = keras.Variable(
                0.0, trainable=False, aggregation="sum", synchronization="on_read"
            )

        def call(self, x):
            self.rows.assign_add(keras.ops.cast(keras.ops.shape(x)[0], "float32"))
            return x

    with strategy.scope():
        counter = RowCounter()
        inputs = keras.Input((1,))
        counting = keras.Model(inputs, keras.layers.Dense(1)(counter(inputs)))
        counting.compile("sgd", "mse")
    counting.fit(np.zeros((64, 1)), np.zeros((64, 1)), batch_size=16, verbose=0)

    first = {name: values[:8] for name, values in x.items()}
    plain.set_weights(mirrored.get_weights())
    decoded = predict_batch(mirrored, first)
    found = {
        "replicas": strategy.num_replicas_in_sync,
        "variable_types": sorted({type(v.value).__name__ for v in mirrored.variables}),
        "copies": sorted(
            {len(strategy.experimental_local_results(v.value)) for v in mirrored.variables}
        ),
        "rows_per_replica": [
            float(r) for r in strategy.experimental_local_results(counter.rows.value)
        ],
        "plain_losses": plain_losses,
        "mirrored_losses": mirrored_losses,
        "predict_on_batch_rows": len(mirrored.predict_on_batch(first)),
        "decode_rows": len(decoded),
        "decode_vs_plain": float(np.abs(decoded - predict_batch(plain, first)).max()),
    }
    with open(path, "w") as f:
        json.dump(found, f)


def _cli(devices, path, argv, losses_only=False):
    """`keras-attn` with `devices` logical CPUs, writing the loss after every step to `path`.

    `losses_only`: the same training and evaluation, but no SavedModel export (an empty
    directory in its place) and no plot, for a run whose losses alone are compared.
    """
    if devices > 1:
        _split_cpu(devices)
    import dataclasses

    import keras

    from keras_attn.models import cli, recipes

    class StepLosses(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.losses = []

        def on_train_batch_end(self, batch, logs=None):
            self.losses.append(float(logs["loss"]))  # the epoch's mean so far

        def on_train_end(self, logs=None):
            with open(path, "w") as f:
                json.dump(self.losses, f)

    callbacks = recipes.Settings.callbacks
    recipes.Settings.callbacks = lambda settings: [*callbacks(settings), StepLosses()]
    if losses_only:
        train = recipes.train
        recipes.train = lambda task, settings=None: dataclasses.replace(
            train(task, settings), export=os.makedirs, plot=None
        )
    return cli.main(argv)


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "inspect":
        _inspect(rest[0])
    else:
        sys.exit(_cli(int(rest[0]), rest[1], rest[2:], losses_only=mode == "cli-losses"))
