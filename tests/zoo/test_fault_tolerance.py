"""Fault tolerance: a killed run resumes to the same weights; no half-written files.

The kill test runs this file as a script in a subprocess (a process to SIGKILL), with a
timeout on every wait, so a hang fails the test instead of hanging CI.
"""

import json
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import models as zoo
from keras_attn.models.decoding import export_seq2seq
from keras_attn.models.files import write_atomically
from keras_attn.models.recipes import BackupAndRestore, Settings
from keras_attn.models.training import build_for_fit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 300  # seconds for one run, the start of TensorFlow included
EPOCHS, STEPS, BATCH = 4, 8, 8  # of the kill test's run


def classifier():
    """A small zoo model with dropout (in its attention too): its generators must resume."""
    model = zoo.transformer_classifier(
        50, 12, 2, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32, dropout=0.2
    )
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(True))
    return model


def mlp():
    """A model that compiles in a blink, with dropout."""
    model = keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(16, "relu"), keras.layers.Dropout(0.2),
         keras.layers.Dense(2)]
    )  # fmt: skip
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(True))
    return model


def examples(count=STEPS * BATCH):
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 50, (count, 12)).astype("int32")
    return tokens, (tokens[:, 0] > 25).astype("int32")


class Interrupt(keras.callbacks.Callback):
    """Raises at the start of batch `batch` of epoch `epoch`: a crash mid-epoch."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise KeyboardInterrupt("interrupted")


class Seen(keras.callbacks.Callback):
    """Records `(epoch, batch)` of every step trained."""

    def on_train_begin(self, logs=None):
        self.steps, self.epoch = [], None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append((self.epoch, batch))


def fit(callbacks, epochs=3, build=mlp):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)  # a restart: the same start as the first run
    model = build()
    x, y = examples()
    build_for_fit(model, (x, y))
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, callbacks=callbacks, verbose=0)
    return model


def weights(model):
    return [np.asarray(v) for v in model.variables]  # the generators' states included


# ---------------------------------------------------------------------------
# Backups: what Keras does, and what `BackupAndRestore` adds
# ---------------------------------------------------------------------------


def test_keras_trains_a_mid_epoch_backup_epoch_again_from_its_start(tmp_path):
    """Keras 3.15 records the batch of a `save_freq=int` backup but does not skip to it."""
    backup = str(tmp_path / "backup")
    callback = keras.callbacks.BackupAndRestore(backup, save_freq=3)
    with pytest.raises(KeyboardInterrupt):
        fit([callback, Interrupt(1, 5)])  # backups every 3 steps: the last after (1, 3)
    metadata = json.loads((tmp_path / "backup" / "training_metadata.json").read_text())
    assert (metadata["epoch"], metadata["batch"]) == (1, 3)
    seen = Seen()
    fit([keras.callbacks.BackupAndRestore(backup, save_freq=3), seen])
    assert seen.steps[0] == (1, 0)  # batches 0-3 of epoch 1 again, on weights that trained them


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_weights_and_dropout_of_an_uninterrupted_one(tmp_path):
    expected = weights(fit([]))
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        fit([BackupAndRestore(backup), Interrupt(2, 3)])  # backups after epochs 0 and 1
    assert json.loads((tmp_path / "backup" / "training_metadata.json").read_text())["epoch"] == 2
    seen = Seen()
    resumed = weights(fit([BackupAndRestore(backup), seen]))
    assert seen.steps[0] == (2, 0) and len(seen.steps) == STEPS
    for got, want in zip(resumed, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert not os.path.exists(backup)  # a finished run deletes its backup
    # Keras' own callback leaves the dropout generators out: the masks, then weights, differ
    with pytest.raises(KeyboardInterrupt):
        fit([keras.callbacks.BackupAndRestore(backup), Interrupt(2, 3)])
    keras_resumed = weights(fit([keras.callbacks.BackupAndRestore(backup)]))
    assert any(not np.array_equal(g, w) for g, w in zip(keras_resumed, expected, strict=True))


def test_a_backup_failing_mid_write_leaves_the_previous_one_to_resume_from(tmp_path, monkeypatch):
    backup = str(tmp_path / "backup")
    save_weights, saves = keras.Model.save_weights, []

    def failing_second_save(model, path, *args, **kwargs):
        saves.append(path)
        if len(saves) == 2:
            with open(path, "wb") as f:
                f.write(b"half an HDF5 file")
            raise OSError("disk full")
        return save_weights(model, path, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "save_weights", failing_second_save)
    with pytest.raises(OSError, match="disk full"):
        fit([BackupAndRestore(backup)])
    monkeypatch.setattr(keras.Model, "save_weights", save_weights)
    metadata = json.loads((tmp_path / "backup" / "training_metadata.json").read_text())
    assert metadata["epoch"] == 1 and os.path.basename(saves[0]) == metadata["weights"]
    seen = Seen()
    fit([BackupAndRestore(backup), seen])
    assert seen.steps[0] == (1, 0)


# ---------------------------------------------------------------------------
# Exports: written aside, renamed into place
# ---------------------------------------------------------------------------


def _fail_mid_write(monkeypatch):
    """Makes every SavedModel write put a file in its directory, then fail."""

    def write_out(archive, path, *args, **kwargs):
        os.makedirs(path)
        with open(os.path.join(path, "saved_model.pb"), "wb") as f:
            f.write(b"half a SavedModel")
        raise OSError("killed mid-write")

    # `ExportArchive()` makes an instance of the backend's archive class: patch that one
    monkeypatch.setattr(type(keras.export.ExportArchive()), "write_out", write_out)


def _listing(path):
    return sorted(
        os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs
    )


def test_an_export_failing_mid_write_leaves_no_destination_and_no_litter(tmp_path, monkeypatch):
    model = zoo.rnn_seq2seq(12, 12, 8, 8)
    path = tmp_path / "out" / "savedmodel"
    _fail_mid_write(monkeypatch)
    with pytest.raises(OSError, match="killed mid-write"):
        export_seq2seq(model, str(path), max_length=4, start_id=1, end_id=2)
    assert os.listdir(tmp_path / "out") == []  # neither the destination nor a temporary


def test_an_export_failing_mid_write_leaves_the_previous_export(tmp_path, monkeypatch):
    model = zoo.rnn_seq2seq(12, 12, 8, 8)
    path = str(tmp_path / "savedmodel")
    export_seq2seq(model, path, max_length=4, start_id=1, end_id=2)
    before = {name: (tmp_path / "savedmodel" / name).read_bytes() for name in _listing(path)}
    with monkeypatch.context() as patch:
        _fail_mid_write(patch)
        with pytest.raises(OSError, match="killed mid-write"):
            export_seq2seq(model, path, max_length=4, start_id=1, end_id=2)
    assert os.listdir(tmp_path) == ["savedmodel"]
    assert {name: (tmp_path / "savedmodel" / name).read_bytes() for name in before} == before
    source = tf.constant(np.ones((1, 3), "int32"))
    assert tf.saved_model.load(path).greedy_decode(source).shape == (1, 4)


def test_write_atomically_replaces_a_directory_whole(tmp_path):
    def directory(files, fail=False):
        def write(temporary):
            os.makedirs(temporary)
            for name in files:
                (tmp_path / temporary / name).write_text(name)
            if fail:
                raise OSError("killed mid-write")

        return write

    path = str(tmp_path / "savedmodel")
    write_atomically(path, directory(["a", "b"]))
    with pytest.raises(OSError):
        write_atomically(path, directory(["c"], fail=True))
    assert os.listdir(tmp_path) == ["savedmodel"] and _listing(path) == ["a", "b"]
    write_atomically(path, directory(["c"]))
    assert os.listdir(tmp_path) == ["savedmodel"] and _listing(path) == ["c"]


def test_write_atomically_replaces_a_file_in_one_rename(tmp_path):
    path = tmp_path / "model.keras"
    path.write_text("previous")

    def fail(temporary):
        assert temporary.endswith("model.keras") and os.path.dirname(temporary) == str(tmp_path)
        with open(temporary, "w") as f:
            f.write("half")
        raise OSError("killed mid-write")

    with pytest.raises(OSError):
        write_atomically(str(path), fail)
    assert os.listdir(tmp_path) == ["model.keras"] and path.read_text() == "previous"
    write_atomically(str(path), lambda temporary: open(temporary, "w").write("next"))
    assert os.listdir(tmp_path) == ["model.keras"] and path.read_text() == "next"


# ---------------------------------------------------------------------------
# SIGKILL mid-epoch, restart
# ---------------------------------------------------------------------------


def _start(backup, out, progress):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env["CUDA_VISIBLE_DEVICES"] = "-1"
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), backup, out, progress],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _finish(process):
    try:
        _, err = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"the training run did not finish in {TIMEOUT}s")
    assert process.returncode == 0, err[-4000:]


def _read(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):  # not there yet, or being replaced
        return None


@pytest.mark.slow
def test_a_run_killed_mid_epoch_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path):
    full, resumed = str(tmp_path / "full.npz"), str(tmp_path / "resumed.npz")
    backup, progress = str(tmp_path / "backup"), str(tmp_path / "progress.json")
    _finish(_start(str(tmp_path / "unused_backup"), full, str(tmp_path / "full_progress.json")))

    process = _start(backup, resumed, progress)
    deadline = time.monotonic() + TIMEOUT
    try:
        while True:  # until a backup exists and the run is halfway through the next epoch
            assert process.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no backup appeared in time"
            metadata = _read(os.path.join(backup, "training_metadata.json"))
            step = _read(progress)
            if metadata and step and step[0] == metadata["epoch"] and step[1] >= STEPS // 2:
                break
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL and not os.path.exists(resumed)
    epoch = _read(os.path.join(backup, "training_metadata.json"))["epoch"]
    killed_at = _read(progress)
    assert killed_at[0] == epoch and killed_at[1] > 0  # killed mid-epoch, after its backup

    _finish(_start(backup, resumed, progress))
    assert _read(progress + ".first") == [epoch, 0]  # resumed at the start of that epoch
    got, want = np.load(resumed), np.load(full)
    assert sorted(got.files) == sorted(want.files)
    for name in want.files:
        np.testing.assert_array_equal(got[name], want[name])


def _train_until_done(backup, out, progress):
    """The kill test's run: `EPOCHS` epochs, a backup per epoch; final weights to `out`."""
    tf.config.experimental.enable_op_determinism()

    class Progress(keras.callbacks.Callback):
        """Writes `[epoch, batch]` after every step (the first one to `.first`), slowly."""

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if not os.path.exists(progress + ".first"):
                write_atomically(progress + ".first", lambda p: _dump([self.epoch, batch], p))
            write_atomically(progress, lambda p: _dump([self.epoch, batch], p))
            time.sleep(0.05)  # time for the test to see a step and kill in the middle

    if os.path.exists(progress + ".first"):
        os.remove(progress + ".first")  # a restart: record its own first step
    callbacks = Settings(backup_dir=backup).callbacks() + [Progress()]
    model = fit(callbacks, epochs=EPOCHS, build=classifier)
    np.savez(out, **{f"v{i}": v for i, v in enumerate(weights(model))})


def _dump(value, path):
    with open(path, "w") as f:
        json.dump(value, f)


if __name__ == "__main__":
    _train_until_done(*sys.argv[1:])
