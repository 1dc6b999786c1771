"""What every recipe shares: run settings, the result, distribution, backups, data loading."""

import bisect
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import uuid

import keras
import numpy as np
import tensorflow as tf

from keras_attn.arguments import is_int

from ..datasets import loading

START, END = "<s>", "</s>"


@dataclasses.dataclass
class Settings:
    """What a run may change: dataset, sizes, epochs (`None`: the task's default)."""

    dataset: str | None = None
    data_dir: str | None = None
    epochs: int | None = None
    train_examples: int | None = None
    test_examples: int = 500
    batch_size: int = 64
    download: bool = False
    seed: int = 0
    # Problem sizes for tasks that have one (pointer tasks): "50" or a range "5-50".
    n: str | None = None
    # Sizes to evaluate at besides the training size, e.g. "50,100,200".
    eval_n: str | None = None
    # Distribution: None (one device), "mirrored" or "multi-worker" (TF_CONFIG).
    strategy: str | None = None
    # Model parallel on JAX: a device mesh (batch, model), e.g. (2, 4): the batch split over
    # `batch` devices, the model's weights over `model` (`build_model`). None: one device.
    mesh: tuple[int, int] | None = None
    # Checkpoint directory for `keras.callbacks.BackupAndRestore`: a killed run resumes.
    backup_dir: str | None = None
    # Text classifiers: "attention" (the task's default) or "mean" (the ablation).
    pooling: str | None = None
    # Seq2seq tasks that take it: the RNN with "additive" attention or with "none"
    # instead of the task's model (None: the task's model).
    attention: str | None = None
    # The language-model task: train and report the LSTM baseline too (None: the task's
    # default, True).
    baseline: bool | None = None

    def __post_init__(self):
        for name, low in (("epochs", 1), ("train_examples", 1), ("test_examples", 1),
                          ("batch_size", 1), ("seed", 0)):  # fmt: skip
            value = getattr(self, name)
            optional = name in ("epochs", "train_examples")
            if (value is None and optional) or (isinstance(value, int) and value >= low):
                continue
            kind = "a positive integer" if low else "a non-negative integer"
            raise ValueError(
                f"`{name}` must be {kind}{' or None' if optional else ''}. "
                f"Received: {name}={value!r}"
            )
        if self.baseline not in (None, True, False):
            raise ValueError(f"`baseline` must be None, True or False. Received: {self.baseline!r}")
        if self.mesh is not None:
            mesh = self.mesh
            if not (
                isinstance(mesh, tuple) and len(mesh) == 2
                and all(is_int(n) and n >= 1 for n in mesh)
            ):  # fmt: skip
                raise ValueError(
                    "`mesh` must be None or (batch, model), two positive integers. "
                    f"Received: mesh={mesh!r}"
                )
            if self.strategy is not None:
                raise ValueError(
                    "`mesh` (model parallel, JAX) and `strategy` (tf.distribute) exclude each "
                    f"other. Received: mesh={mesh!r}, strategy={self.strategy!r}"
                )

    def callbacks(self):
        """The callbacks every recipe passes to `model.fit`."""
        if self.backup_dir is None:
            return []
        return [BackupAndRestore(self.backup_dir)]


@dataclasses.dataclass
class Result:
    """A trained model, its metrics, and how to export and plot it."""

    dataset: str
    model: keras.Model
    metrics: dict
    export: object  # callable(path): writes a SavedModel; None: none from this backend
    plot: object  # callable(path): writes a PNG of attention weights; None: a model without
    # Text tasks: the model with its preprocessing (`keras_attn.models.text`), saved as
    # TASK.keras instead of `model`; `export` writes its text SavedModel.
    text_model: keras.Model | None = None


# ---------------------------------------------------------------------------
# Distribution: `Settings.strategy`
# ---------------------------------------------------------------------------

STRATEGIES = ("mirrored", "multi-worker")


def distribution_strategy(name):
    """The `tf.distribute` strategy named by `Settings.strategy`; None for one device.

    `"mirrored"`: `MirroredStrategy` over the local GPUs, or over the logical CPU devices
    when there is no GPU (split a CPU with `tf.config.set_logical_device_configuration`
    before TensorFlow starts). `"multi-worker"`: `MultiWorkerMirroredStrategy` over the
    workers that `TF_CONFIG` names; create it before any other TensorFlow work.
    """
    if name is None:
        return None
    if name == "mirrored":
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([device.name for device in devices])
    if name == "multi-worker":
        if not os.environ.get("TF_CONFIG"):
            raise ValueError(
                "strategy='multi-worker' needs the cluster in the TF_CONFIG environment "
                "variable (see docs/training.md, 'Several machines'). Received: no TF_CONFIG."
            )
        return _MultiWorkerMirroredStrategy()
    raise ValueError(f"`strategy` must be None or one of {STRATEGIES}. Received: strategy={name!r}")


class _MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """`MultiWorkerMirroredStrategy` whose `reduce` takes what Keras 3's `fit` gives it.

    Keras 3.15 calls `reduce` with a nest (the first batch, to build the model) and with
    `axis=0` on scalar metrics; `MultiWorkerMirroredStrategy` rejects both, so `fit`
    fails before its first step (keras-team/keras#20585). Here each value of the nest is
    reduced on its own, a scalar across replicas only.
    """

    def reduce(self, reduce_op, value, axis):
        parent = super().reduce

        def one(v):
            scalar = self.experimental_local_results(v)[0].shape.rank == 0
            return parent(reduce_op, v, None if scalar else axis)

        return tf.nest.map_structure(one, value)


MESH_AXES = ("batch", "model")  # `Settings.mesh`: the axes of its `DeviceMesh`


def mesh_error(mesh):
    """Why this process cannot train on the device mesh `(batch, model)`; None if it can.

    Reads the backend and counts its devices: reads no data, builds no model.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return (
            "model parallel (keras.distribution) runs on the jax backend only "
            "(KERAS_BACKEND=jax); on tensorflow, --strategy mirrored (the local devices) or "
            "--strategy multi-worker (TF_CONFIG) trains data parallel"
        )
    if backend != "jax":
        return (
            f"model parallel (keras.distribution) runs on the jax backend only "
            f"(KERAS_BACKEND=jax); on {backend} keras-attn trains on one device (it has no "
            "data-parallel option there either)"
        )
    devices = keras.distribution.list_devices()
    if mesh[0] * mesh[1] > len(devices):
        kind = devices[0].split(":")[0]
        return (
            f"a mesh of {mesh[0]} x {mesh[1]} needs {mesh[0] * mesh[1]} devices, and jax has "
            f"{len(devices)} ({kind}; on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N "
            "set before jax starts splits it into N)"
        )
    return None


def build_model(build, settings):
    """`build()`: on one device, or split over the device mesh `settings.mesh` (JAX).

    With a mesh `(batch, model)`: `build()` once in a
    `keras.StatelessScope(initialize_variables=False)` (shapes only, nothing allocated) for
    `keras_attn.models.layout_map`'s map, then again from the same random state (the same
    initial weights as one device) under
    `keras.distribution.ModelParallel(layout_map=..., batch_dim_name="batch")`, so that its
    variables are created split (docs/training.md). That distribution stays set for the rest
    of the recipe (`fit`, evaluation, generation; `train` restores the one before). Prints
    the mesh and how many weights are split.
    """
    if settings.mesh is None:
        return build()
    from ... import models

    batch, parts = settings.mesh
    devices = keras.distribution.list_devices()[: batch * parts]
    mesh = keras.distribution.DeviceMesh(settings.mesh, MESH_AXES, devices)
    state = random.getstate(), np.random.get_state()  # the seeds Keras draws from
    with keras.StatelessScope(initialize_variables=False):
        layouts = models.layout_map(build(), mesh)  # its axes: "model", "batch"
    random.setstate(state[0])
    np.random.set_state(state[1])
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch")
    )
    model = build()
    split = [w for w in model.weights if "model" in layouts[w.path].axes]
    print(
        f"{model.name}: model parallel on a mesh of {batch} (batch) x {parts} (model) "
        f"{devices[0].split(':')[0]} devices; {len(split)} of its {len(model.weights)} weights "
        "split over the model axis"
    )
    return model


def writes_files(model):
    """Whether this process writes the run's files: all but the non-chief workers.

    Under `MultiWorkerMirroredStrategy` every worker must still make the same saves (a
    save may need the others' variables), the non-chief ones into temporary directories.
    """
    strategy = getattr(model, "distribute_strategy", None)  # TensorFlow backend only
    return strategy is None or strategy.extended.should_checkpoint


def progress_verbosity():
    """Keras' `verbose` for the recipes' `fit`, `evaluate` and `predict`: the progress bar on
    a terminal (1), one line per epoch when stdout is a file or a pipe (2).

    Keras redraws its bar with backspaces and carriage returns every 0.05 s whatever stdout
    is (it takes any POSIX system for a terminal); a log file keeps every redraw.
    """
    isatty = getattr(sys.stdout, "isatty", None)
    return 1 if isatty is not None and isatty() else 2


class EpochProgress(keras.callbacks.Callback):
    """Keras' progress bar over the run's epochs when `fit` trains in shorter chunks.

    A recipe that checkpoints every `chunk` steps gives `fit` one "epoch" per chunk;
    this shows the user's `epochs` instead: epoch `e` (from 0) covers steps
    `round(e * steps / epochs) + 1` to `round((e + 1) * steps / epochs)`. Use it with
    `fit(..., verbose=0)`. The metrics shown are the means of the current chunk. A bar on
    a terminal, one line per epoch otherwise (`progress_verbosity`).

    Args:
        steps: the steps of the whole run.
        epochs: the epochs to show.
        chunk: `fit`'s `steps_per_epoch`.
    """

    def __init__(self, steps, epochs, chunk):
        super().__init__()
        self.ends = [round((e + 1) * steps / epochs) for e in range(epochs)]
        self.chunk = chunk
        self._first_step, self._epoch, self._bar = 0, None, None

    def on_epoch_begin(self, epoch, logs=None):
        self._first_step = epoch * self.chunk  # a resumed run begins at a later chunk

    def on_train_batch_end(self, batch, logs=None):
        step = self._first_step + batch + 1  # counted from 1
        epoch = bisect.bisect_left(self.ends, step)
        start = self.ends[epoch - 1] if epoch else 0
        if epoch != self._epoch:
            print(f"Epoch {epoch + 1}/{len(self.ends)}", flush=True)
            names = list(logs or {})
            self._epoch = epoch
            self._bar = keras.utils.Progbar(
                self.ends[epoch] - start, verbose=progress_verbosity(), stateful_metrics=names
            )
        values = [(name, float(value)) for name, value in (logs or {}).items()]
        self._bar.update(step - start, values=values, finalize=step == self.ends[epoch])


# ---------------------------------------------------------------------------
# Backups: `Settings.backup_dir`
# ---------------------------------------------------------------------------

METADATA = "training_metadata.json"  # Keras' names, kept: a backup reads like Keras' own
LATEST = "latest.weights.h5"


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` that a kill at any moment leaves resumable.

    Keras (3.15) rewrites `latest.weights.h5` in place, then the epoch in
    `training_metadata.json`: a kill during the first write leaves weights it cannot
    load, between the two, weights of one epoch under the number of another. Here each
    backup writes a new weights file, then replaces the metadata, which names that file,
    with one rename (the commit); `latest.weights.h5` follows as a link. The metadata
    also holds the states of the layers' random generators (dropout), which weights
    files leave out, so a resumed run draws the masks an uninterrupted one would.

    A restart resumes at the start of the epoch of the last backup: Keras does not skip
    the batches of a mid-epoch backup (`save_freq=int`), it trains the whole epoch again.
    With backups at epoch ends (the default), and data whose order depends only on the
    epoch, a killed and restarted run ends with the weights of an uninterrupted one.

    Under multi-worker training every worker saves, the non-chief ones into a temporary
    directory, and all restore from `backup_dir`: a directory every worker can read.
    """

    def on_train_begin(self, logs=None):
        self._directory = self.backup_dir
        if not writes_files(self.model):
            self._directory = tempfile.mkdtemp(prefix="keras_attn_backup_")
        metadata = _read_json(os.path.join(self.backup_dir, METADATA))
        if metadata is None:
            return
        self._weights_path = os.path.join(self.backup_dir, metadata.get("weights", LATEST))
        self._load_model()  # Keras': builds the optimizer, loads the weights, sets the epoch
        states = metadata.get("generators")
        if states is not None:  # None: a backup written by Keras' own callback
            for variable, state in zip(_generator_states(self.model), states, strict=True):
                variable.assign(np.asarray(state, variable.dtype))

    def _save_model(self):
        os.makedirs(self._directory, exist_ok=True)
        name = f"weights-{uuid.uuid4().hex[:12]}.weights.h5"
        weights = os.path.join(self._directory, name)
        self.model.save_weights(weights)
        _fsync(weights)
        metadata = {
            "epoch": self._current_epoch,
            "batch": self._last_batch_seen,
            "weights": name,
            "generators": [np.asarray(v).tolist() for v in _generator_states(self.model)],
        }
        _write_json_atomically(os.path.join(self._directory, METADATA), metadata)  # the commit
        latest = os.path.join(self._directory, f".tmp-{name}")
        try:
            os.link(weights, latest)
        except OSError:  # a file system without hard links
            shutil.copyfile(weights, latest)
        os.replace(latest, os.path.join(self._directory, LATEST))
        for entry in os.listdir(self._directory):  # older backups, and what a kill left
            if entry != name and entry.startswith(("weights-", ".tmp-")):
                os.remove(os.path.join(self._directory, entry))

    def on_train_end(self, logs=None):
        if self._directory != self.backup_dir:
            shutil.rmtree(self._directory, ignore_errors=True)
        elif self.delete_checkpoint:
            shutil.rmtree(self.backup_dir, ignore_errors=True)


def _generator_states(model):
    """The model's variables that are not weights: its random generators' states."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def _read_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _write_json_atomically(path, value):
    temporary = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex[:12]}.json")
    with open(temporary, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def _fsync(path):
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def load_supervised(name, split, settings):
    """`(inputs, targets)` pairs of `name`: ours are prepared locally; others must exist.

    Under multi-worker training each worker reads the whole dataset and takes its
    replicas' share of every global batch (`AutoShardPolicy.DATA`), so the global
    batches are those of one device, whatever the number of files.
    """
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    if name.startswith("keras_attn_"):
        return loading.load(name, split, settings.data_dir).with_options(options)
    import tensorflow_datasets as tfds

    try:
        return tfds.load(
            name,
            split=split,
            data_dir=settings.data_dir,
            as_supervised=True,
            download=settings.download,
            read_config=loading.read_config(),
        ).with_options(options)
    except (AssertionError, FileNotFoundError) as error:  # tfds: "could not find data"
        where = tfds.builder(name, data_dir=settings.data_dir).data_dir  # where tfds looked
        root = (
            "--data-dir" if settings.data_dir else "tfds' default data_dir, $TFDS_DATA_DIR if set"
        )
        raise FileNotFoundError(
            f"The tfds dataset {name!r} is not prepared in {where} (under {root}). "
            "keras-attn does not download unless asked: pass --download to prepare it there "
            "(needs network once), or prepare it elsewhere with `tfds build "
            f"{name} --data_dir DIR` and pass --data-dir DIR, or run a task on one of the "
            "local datasets (`keras-attn list`)."
        ) from error


def adam_warmup_cosine(steps, peak_learning_rate, warmup_steps=500, clipnorm=None):
    """Adam whose rate rises linearly from 0 for `min(warmup_steps, steps // 10)` steps to
    `peak_learning_rate`, then falls to 0 along a cosine by step `steps`."""
    warmup = min(warmup_steps, steps // 10)
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, steps - warmup, warmup_target=peak_learning_rate, warmup_steps=warmup
    )
    return keras.optimizers.Adam(schedule, clipnorm=clipnorm)


def dataset_error(name):
    """Why tfds has no dataset `name` ("builder" or "builder/config"); None if it has one.

    Looks only at the registered builder classes: reads no data, needs no network.
    Namespaced names (`"namespace:dataset"`) are left to tfds.
    """
    import tensorflow_datasets as tfds

    builder, _, config = name.partition("/")
    if ":" in builder:  # a namespace, or a version after the builder: tfds decides
        return None
    try:
        builder_class = tfds.builder_cls(builder)
    except tfds.core.DatasetNotFoundError:
        return f"tfds has no dataset {builder!r}"
    configs = [c.name for c in getattr(builder_class, "BUILDER_CONFIGS", None) or []]
    config = config.split(":")[0]  # "config:1.0.0"
    if config and configs and config not in configs:
        return f"{builder} has no config {config!r} (configs: {', '.join(configs)})"
    return None


def dataset_size(ds):
    """The number of elements of a finite dataset (counted when tf.data does not know it)."""
    size = int(ds.cardinality())
    if size >= 0:
        return size
    return int(ds.reduce(0, lambda n, _: n + 1))


def take(ds, count):
    return ds if count is None else ds.take(count)


def numpy_pairs(ds):
    """A small dataset of `(x, y)` pairs as two stacked NumPy arrays (padded with -1)."""
    batches = list(ds.padded_batch(1 << 16, padding_values=loading.padding_values(ds.element_spec)))
    return tuple(np.asarray(t) for t in batches[0])


def text_vectorizer(texts, max_tokens=None):
    """A `TextVectorization` adapted on `texts` (0 = padding, 1 = unknown), its words split at
    any Unicode space, as the text models split them (`text.split_words`)."""
    from .. import text

    vectorizer = keras.layers.TextVectorization(
        max_tokens=max_tokens, standardize=None, split=text.split_words
    )
    vectorizer.adapt(texts)
    return vectorizer
