"""Pointer-network recipes: sorting and planar convex hull on the local builders.

Both train `keras_attn.models.pointer_network(encoder="transformer")` (a set encoder:
no positions, so the order the points come in does not matter) on the
project's tfds builders. `Settings.n` picks the training size, `"50"` or a
range `"5-50"` (the builder config `n50` or `n5-50`; mixed sizes are padded
with `PAD_VALUE`, which the model masks); `Settings.eval_n` adds test sets of
other sizes (`"50,100,200"`). Every metric is measured on the test split.

Steps: `epochs` passes over `train_examples` (default: the whole train
split), in batches of similar sizes (bucketed by the number of points). A
Keras "epoch" of `fit` is one chunk of at most `CHUNK` steps, so
`--backup-dir` checkpoints every `CHUNK` steps, and a resumed run skips the
batches it already trained on.
"""

import json
import math
import os
import time

import keras
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from ... import models
from ..datasets import loading
from ..geometry import hull_report, open_polygon, rotate_to_lowest_index
from ..pointer_search import polygon_beam_search, sort_decode
from ..training import build_for_fit
from .common import (
    EpochProgress,
    Result,
    adam_warmup_cosine,
    load_supervised,
    numpy_pairs,
    take,
)

EPOCHS = 10  # passes over the training examples unless `Settings.epochs` says otherwise
CHUNK = 250  # steps between two checkpoints of `--backup-dir`
UNITS = 128
PEAK_LEARNING_RATE = 1e-3
BEAM_WIDTH = 4
DECODE_BATCH = 64  # examples decoded at once: bounds the (B, T, N, units) pointer scores
MAX_VERTICES = 64  # a hull decoding that has not closed by then gives up (uniform n=200: ~20)
LATEST_WEIGHTS = "latest.weights.h5"  # what `BackupAndRestore` checkpoints
FINAL_WEIGHTS = "final.weights.h5"  # in `backup_dir` after training, for `evaluate_backup`

# ---------------------------------------------------------------------------
# Pointer networks: sorting and planar convex hull
# ---------------------------------------------------------------------------


DEFAULT_DATASETS = {}  # task name -> its default dataset, as `pointer_task` made it


def pointer_task(task_name, default_dataset):
    """Sorting (constrained pointer decoding) or convex hull (closed polygons), by the data."""

    def run(settings):
        name = settings.dataset or sized_dataset(default_dataset, settings.n)
        hull = name.startswith("keras_attn_convex_hull")
        model = build_model(hull)
        train, steps, chunk = training_data(name, settings, hull)
        skipped = _resumed_epoch(settings.backup_dir) * chunk  # batches a resumed run did
        model.compile(
            optimizer=adam_warmup_cosine(steps, PEAK_LEARNING_RATE, clipnorm=1.0), loss=_loss()
        )
        build_for_fit(model, train)  # TensorFlow traces the train step once, not twice
        start = time.perf_counter()
        progress = EpochProgress(steps, settings.epochs or EPOCHS, chunk)  # not the chunks
        model.fit(
            train.skip(skipped), epochs=steps // chunk, steps_per_epoch=chunk,
            callbacks=[*settings.callbacks(), progress], verbose=0, shuffle=False,
        )  # fmt: skip
        metrics = {"train_steps": float(steps), "train_seconds": time.perf_counter() - start}
        if settings.backup_dir:  # an interrupted evaluation need not train again
            os.makedirs(settings.backup_dir, exist_ok=True)
            model.save_weights(os.path.join(settings.backup_dir, FINAL_WEIGHTS))
        test_points, test_targets, decoded = None, None, None
        for n in [None, *parse_sizes(settings.eval_n)]:
            test_name = name if n is None else sized_dataset(name, str(n))
            prefix = "" if n is None else f"n{n}_"
            points, targets = test_set(test_name, settings, hull)
            found, predicted = evaluate(model, points, targets, hull)
            metrics.update({prefix + key: value for key, value in found.items()})
            print(f"{test_name} test: {json.dumps(found)}", flush=True)
            if n is None:
                test_points, test_targets, decoded = points, targets, predicted

        def plot(path):
            from keras_attn import plotting

            real = ~np.all(test_points[0] == loading.PAD_VALUE, axis=-1)
            target = open_polygon(test_targets[0]) if hull else None
            prediction = decoded[0] if hull else decoded[0][: real.sum()]
            fig = plotting.plot_pointer(test_points[0][real], prediction, target=target)
            plotting.save_figure(fig, path)

        def export(path):
            model.export(path, verbose=False)

        return Result(name, model, metrics, export, plot)

    run.__name__ = task_name
    run.default_dataset = DEFAULT_DATASETS[task_name] = default_dataset
    run.options = {"n", "eval_n"}  # the `Settings` fields only this kind of task reads
    run.text = False  # no text model: `keras-attn predict` does not take it
    run.defaults = f"{EPOCHS} epochs over the whole train split"
    return run


def build_model(hull):
    """The recipe's model: a Transformer set encoder; hulls revisit their first point."""
    return models.pointer_network(
        input_dim=2 if hull else 1, units=UNITS, encoder="transformer",
        mask_chosen=not hull, pad_value=loading.PAD_VALUE,
    )  # fmt: skip


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(ignore_class=loading.PAD_INDEX)


# ---------------------------------------------------------------------------
# Data: sizes, training batches, test sets
# ---------------------------------------------------------------------------


def parse_sizes(text):
    """`"50,100,200"` -> `[50, 100, 200]`; None or `""` -> `[]`."""
    if not text:
        return []
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 3:
        raise ValueError(f"`eval_n` must be sizes like '50,100,200'. Received: {text!r}")
    return sizes


def sized_dataset(dataset, n):
    """The builder config of the same task for size `n` (`"50"` or `"5-50"`): `.../n50`.

    Raises:
        ValueError: no config of that builder has that size.
    """
    builder = dataset.split("/")[0]
    if n is None:
        return dataset
    name = f"{builder}/n{n}"
    configs = [c.name for c in tfds.builder_cls(builder).BUILDER_CONFIGS]
    if f"n{n}" not in configs:
        raise ValueError(f"No {builder} config for n={n!r}. Configs: {', '.join(configs)}")
    return name


def _examples(name, split, settings, hull):
    """`({"points", "pointers"}, pointers)` pairs; hulls start at their leftmost vertex."""
    ds = load_supervised(name, split, settings)
    if hull:
        ds = ds.map(lambda x, y: (x, _leftmost_first_closed(x, y)))
    return ds.map(lambda x, y: ({"points": x, "pointers": y}, y))


def _leftmost_first_closed(points, hull):
    """A hull rotated to start at its leftmost vertex, then closed by that vertex again.

    The builders' hulls start at their lowest index, as in the paper: a Transformer set
    encoder (no positions) cannot see indices, so it learns a start it can see, the
    leftmost vertex (the smallest x), and `evaluate` rotates its polygons back to start at
    their lowest index before comparing them with the paper's targets.
    """
    start = tf.argmin(tf.gather(points[:, 0], hull), output_type=tf.int32)
    rotated = tf.roll(hull, -start, axis=0)
    return tf.concat([rotated, rotated[:1]], 0)  # pointing back at the start closes it


def schedule(name, settings):
    """`(examples, steps, chunk)`: `epochs` passes over the examples, in whole chunks."""
    config = tfds.builder(name, data_dir=settings.data_dir).builder_config
    count = settings.train_examples or config.num_train
    steps = max(1, math.ceil((settings.epochs or EPOCHS) * count / settings.batch_size))
    chunk = min(CHUNK, steps)
    return count, chunk * math.ceil(steps / chunk), chunk


def training_data(name, settings, hull):
    """Shuffled, repeated batches bucketed by size; `(dataset, steps, chunk)`."""
    config = tfds.builder(name, data_dir=settings.data_dir).builder_config
    count, steps, chunk = schedule(name, settings)
    ds = _examples(name, "train", settings, hull).take(count).cache()
    ds = ds.shuffle(min(count, 100_000), seed=settings.seed).repeat()
    padding = loading.padding_values(ds.element_spec)
    low, high = config.min_len, config.max_len
    width = max(5, (high - low) // 5)  # about five buckets of sizes
    boundaries = list(range(low + width, high + 1, width))
    if boundaries:
        ds = ds.bucket_by_sequence_length(
            lambda x, y: tf.shape(x["points"])[0], boundaries,
            [settings.batch_size] * (len(boundaries) + 1), padding_values=padding,
        )  # fmt: skip
    else:
        ds = ds.padded_batch(settings.batch_size, padding_values=padding)
    return ds.prefetch(2), steps, chunk


def _resumed_epoch(backup_dir):
    """The chunk a run resumes at: what `BackupAndRestore` wrote, 0 without a backup."""
    path = os.path.join(backup_dir or "", "training_metadata.json")
    if backup_dir is None or not os.path.exists(path):
        return 0
    with open(path) as f:
        return int(json.load(f).get("epoch", 0))


def test_set(name, settings, hull):
    """`(points (B, N, d), targets (B, T))` of the test split, padded with -1."""
    points, targets = numpy_pairs(
        take(load_supervised(name, "test", settings), settings.test_examples)
    )
    return points, _closed(targets) if hull else targets


def _closed(targets):
    """Hull targets padded with -1, each with its first vertex repeated after its last."""
    lengths = (targets >= 0).sum(-1)
    closed = np.concatenate([targets, np.full((len(targets), 1), -1, targets.dtype)], 1)
    closed[np.arange(len(targets)), lengths] = targets[:, 0]
    return closed


# ---------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------


def evaluate(model, points, targets, hull, beam_width=BEAM_WIDTH):
    """The task's metrics on a test set; `(metrics, greedy predictions)`.

    Sorting: `sequence_accuracy` (every position right) and `per_position_accuracy`
    (the share of right positions), greedy constrained decoding. Convex hull: greedy
    `polygon_decode` and convex `polygon_beam_search`, each with `hull_report`'s
    exact match (`sequence_accuracy`), `area_coverage` and `valid_polygons`; each polygon
    is first rotated to start at its lowest index, the start of the targets.
    """
    batches = range(0, len(points), DECODE_BATCH)
    if not hull:
        decoded = np.concatenate(
            [sort_decode(model, points[i : i + DECODE_BATCH]) for i in batches]
        )
        return sorting_report(decoded, targets), decoded
    greedy, beam = [], []
    for i in batches:  # greedy: `polygon_decode`'s choices, feeding only the steps so far
        batch = points[i : i + DECODE_BATCH]
        greedy += polygon_beam_search(model, batch, 1, convex=False, max_vertices=MAX_VERTICES)[0]
        beam += polygon_beam_search(model, batch, beam_width, max_vertices=MAX_VERTICES)[0]
    greedy = [rotate_to_lowest_index(p) for p in greedy]  # the targets' start
    beam = [rotate_to_lowest_index(p) for p in beam]
    metrics = {}
    for prefix, predicted in (("", greedy), (f"beam{beam_width}_", beam)):
        report = hull_report(points, predicted, targets, pad_value=loading.PAD_VALUE)
        metrics[prefix + "sequence_accuracy"] = report["exact_match"]
        metrics[prefix + "area_coverage"] = report["area_coverage"]
        metrics[prefix + "valid_polygons"] = report["valid"]
    return metrics, greedy


def sorting_report(decoded, targets):
    """Exact match and per-position accuracy over the real (`targets >= 0`) positions."""
    decoded = np.asarray(decoded)[:, : targets.shape[1]]
    real = targets >= 0
    right = (decoded == targets) & real
    return {
        "sequence_accuracy": float(np.mean(np.all(right | ~real, axis=-1))),
        "per_position_accuracy": float(right.sum() / real.sum()),
    }


def evaluate_backup(task_name, settings):
    """Metrics of the weights a `--backup-dir` run last checkpointed (an unfinished run).

    Builds the recipe's model for `settings` (dataset from `task_name`'s default and
    `settings.n`), loads the weights of `settings.backup_dir` (`final.weights.h5`, which
    the recipe writes there once training is over, else `BackupAndRestore`'s
    `latest.weights.h5`), and evaluates like the recipe does, at the training size and
    every `settings.eval_n`. Returns `(metrics, steps trained)`.
    """
    default = DEFAULT_DATASETS[task_name]  # (recipes.TASKS made the task: it is there)
    name = settings.dataset or sized_dataset(default, settings.n)
    hull = name.startswith("keras_attn_convex_hull")
    model = build_model(hull)
    final = os.path.join(settings.backup_dir, FINAL_WEIGHTS)
    trained = os.path.exists(final)
    model.load_weights(final if trained else os.path.join(settings.backup_dir, LATEST_WEIGHTS))
    metrics = {}
    for n in [None, *parse_sizes(settings.eval_n)]:
        prefix = "" if n is None else f"n{n}_"
        test_name = name if n is None else sized_dataset(name, str(n))
        found, _ = evaluate(model, *test_set(test_name, settings, hull), hull)
        metrics.update({prefix + key: value for key, value in found.items()})
    _, steps, chunk = schedule(name, settings)
    return metrics, steps if trained else _resumed_epoch(settings.backup_dir) * chunk
