"""Pointer-network recipes: sorting and planar convex hull on the local builders."""

import keras
import numpy as np

import models
from models.datasets import loading
from models.datasets.geometry import polygon_area
from models.recipes.common import Result, load_supervised, numpy_pairs, take

# ---------------------------------------------------------------------------
# Pointer networks: sorting and planar convex hull
# ---------------------------------------------------------------------------


def pointer_task(task_name, default_dataset, encoder, mask_chosen):
    def run(settings):
        name = settings.dataset or default_dataset
        train = take(load_supervised(name, "train", settings), settings.train_examples or 20000)
        points, targets = numpy_pairs(train)
        test_points, test_targets = numpy_pairs(
            take(load_supervised(name, "test", settings), settings.test_examples)
        )
        keras.utils.set_random_seed(settings.seed)
        model = models.pointer_network(
            input_dim=points.shape[-1], units=128, encoder=encoder,
            mask_chosen=mask_chosen, pad_value=loading.PAD_VALUE,
        )  # fmt: skip
        epochs = settings.epochs or 10
        steps = epochs * -(-len(points) // settings.batch_size)
        schedule = keras.optimizers.schedules.CosineDecay(
            1e-2 if encoder == "lstm" else 1e-3, steps
        )
        model.compile(
            optimizer=keras.optimizers.Adam(schedule),
            loss=keras.losses.SparseCategoricalCrossentropy(ignore_class=-1),
        )
        model.fit(
            {"points": points, "pointers": targets}, targets,
            epochs=epochs, batch_size=settings.batch_size,
        )  # fmt: skip
        metrics = _pointer_metrics(model, test_points, test_targets)

        def plot(path):
            from keras_attn import plotting

            real = ~np.all(test_points[0] == loading.PAD_VALUE, axis=-1)
            chosen = models.pointer_decode(model, test_points[:1])[0]
            fig = plotting.plot_pointer(test_points[0][real], chosen[chosen < real.sum()])
            plotting.save_figure(fig, path)

        return Result(name, model, metrics, model.export, plot)

    run.__name__ = task_name
    return run


def _pointer_metrics(model, points, targets):
    """Whole-sequence accuracy of constrained decoding; for 2-D points also hull area coverage."""
    lengths = (targets >= 0).sum(-1)
    decoded = models.pointer_decode(model, points, steps=targets.shape[1])
    correct = [
        np.array_equal(d[:n], t[:n]) for d, t, n in zip(decoded, targets, lengths, strict=True)
    ]
    metrics = {"sequence_accuracy": float(np.mean(correct))}
    if points.shape[-1] == 2:
        coverage = [
            abs(polygon_area(p, d[:n])) / polygon_area(p, t[:n])
            for p, d, t, n in zip(points, decoded, targets, lengths, strict=True)
        ]
        metrics["area_coverage"] = float(np.mean(coverage))
    return metrics
