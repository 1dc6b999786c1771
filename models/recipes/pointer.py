"""Pointer-network recipes: sorting and planar convex hull on the local builders."""

import keras
import numpy as np

import models
from models.datasets import loading
from models.geometry import hull_metrics, open_polygon
from models.recipes.common import Result, load_supervised, numpy_pairs, take

# ---------------------------------------------------------------------------
# Pointer networks: sorting and planar convex hull
# ---------------------------------------------------------------------------


def pointer_task(task_name, default_dataset):
    """Sorting (constrained pointer decoding) or convex hull (closed polygons), by the data."""

    def run(settings):
        name = settings.dataset or default_dataset
        train = take(load_supervised(name, "train", settings), settings.train_examples or 20000)
        points, targets = numpy_pairs(train)
        test_points, test_targets = numpy_pairs(
            take(load_supervised(name, "test", settings), settings.test_examples)
        )
        hull = points.shape[-1] == 2
        if hull:  # close each hull: pointing back at its first vertex ends the sequence
            targets = _closed(targets)
        keras.utils.set_random_seed(settings.seed)
        model = models.pointer_network(
            input_dim=points.shape[-1], units=128, mask_chosen=not hull,
            pad_value=loading.PAD_VALUE,
        )  # fmt: skip
        epochs = settings.epochs or 10
        steps = epochs * -(-len(points) // settings.batch_size)
        model.compile(
            optimizer=keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(1e-2, steps)),
            loss=keras.losses.SparseCategoricalCrossentropy(ignore_class=-1),
        )
        model.fit(
            {"points": points, "pointers": targets}, targets,
            epochs=epochs, batch_size=settings.batch_size,
        )  # fmt: skip
        if hull:
            decoded = models.decoding.polygon_decode(model, test_points)
            accuracy, coverage = hull_metrics(test_points, decoded, test_targets)
            metrics = {"sequence_accuracy": accuracy, "area_coverage": coverage}
        else:
            decoded = models.pointer_decode(model, test_points)
            metrics = {"sequence_accuracy": float(np.mean(np.all(decoded == test_targets, -1)))}

        def plot(path):
            from keras_attn import plotting

            real = ~np.all(test_points[0] == loading.PAD_VALUE, axis=-1)
            target = open_polygon(test_targets[0]) if hull else None
            fig = plotting.plot_pointer(test_points[0][real], decoded[0], target=target)
            plotting.save_figure(fig, path)

        return Result(name, model, metrics, model.export, plot)

    run.__name__ = task_name
    return run


def _closed(targets):
    """Hull targets padded with -1, each with its first vertex repeated after its last."""
    lengths = (targets >= 0).sum(-1)
    closed = np.concatenate([targets, np.full((len(targets), 1), -1, targets.dtype)], 1)
    closed[np.arange(len(targets)), lengths] = targets[:, 0]
    return closed
