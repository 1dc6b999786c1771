"""Pointer network (Vinyals et al., 2015) on sorting or planar convex hull, generated locally.

    python examples/pointer.py --task sort                          # keras_attn_sorting/n5
    python examples/pointer.py --task hull --plot hull.png          # keras_attn_convex_hull/n5
    python examples/pointer.py --task hull --dataset keras_attn_convex_hull/n10 --epochs 20

The datasets are the project's own tfds builders, generated into `--data-dir` on first
use (no network). Sorting: the targets are the argsort pointers, decoded with the
constrained `keras_attn.models.pointer_decode` (never the same position twice), scored by
whole-sequence accuracy. Convex hull: the targets are the hull's vertices, counter-
clockwise from the lowest index, closed by pointing back at the first vertex (the end of
the sequence, as in the paper); decoding may revisit only that first vertex, which ends
the polygon. Scored by whole-sequence accuracy (the exact vertex sequence) and area
coverage (predicted polygon area / true hull area, a non-simple or unclosed polygon
counting 0), the paper's two metrics. Writes `model.keras` and a SavedModel of the
teacher-forced model (`{"points", "pointers"}` -> pointer probabilities).
"""

import os

import common  # the examples' shared flags and dataset loading
import keras
import numpy as np
import tensorflow as tf

from keras_attn import models
from keras_attn.models.datasets import PAD_VALUE, padding_values
from keras_attn.models.geometry import hull_metrics, open_polygon

DATASETS = {"sort": "keras_attn_sorting/n5", "hull": "keras_attn_convex_hull/n5"}
SMOKE_DATASETS = {"sort": "keras_attn_sorting/tiny", "hull": "keras_attn_convex_hull/tiny"}


def parse_args(argv=None):
    p = common.parser(
        __doc__.splitlines()[0],
        "a keras_attn_sorting/... or keras_attn_convex_hull/... config "
        f"(default: {DATASETS['sort']} or {DATASETS['hull']}, by --task)",
        epochs=10,
        real_datasets=False,
    )
    p.add_argument("--task", choices=("sort", "hull"), default="sort", help="task")
    p.add_argument("--units", type=int, default=128, help="encoder and decoder width")
    p.add_argument(
        "--encoder",
        choices=("lstm", "transformer"),
        default="lstm",
        help="lstm: reads the points in order, as in the paper; transformer: a set encoder "
        "without positions (it cannot tell which hull vertex has the lowest index, where "
        "the dataset's hulls start, so it finds the right polygon but often starts it elsewhere)",
    )
    p.add_argument("--test-examples", type=int, default=1000, help="test examples")
    p.set_defaults(batch_size=128)
    args = p.parse_args(argv)
    if args.smoke:
        args.epochs, args.batch_size, args.train_examples = 1, 16, 32
        args.units, args.test_examples = 16, 16
    return args


# ---------------------------------------------------------------------------
# The example
# ---------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    name = args.dataset or (SMOKE_DATASETS if args.smoke else DATASETS)[args.task]
    hull = args.task == "hull"

    # -- load: (points (N, d), pointers (T,)) --------------------------------
    train, _ = common.load(name, "train", args.data_dir)
    test, _ = common.load(name, "test", args.data_dir)
    print(common.describe(name, args.data_dir))
    if args.train_examples:
        train = train.take(args.train_examples)
    test = test.take(args.test_examples)

    # -- preprocess: close each hull (its end of sequence); pad a batch with -1 --
    def close(points, pointers):
        return points, tf.concat([pointers, pointers[:1]], axis=0)

    def batches(ds, shuffle=False):
        ds = ds.map(close) if hull else ds
        ds = ds.shuffle(10_000, seed=args.seed) if shuffle else ds
        ds = ds.padded_batch(args.batch_size, padding_values=padding_values(ds.element_spec))
        ds = ds.map(lambda points, pointers: ({"points": points, "pointers": pointers}, pointers))
        return ds.prefetch(tf.data.AUTOTUNE)

    # -- build --------------------------------------------------------------
    model = models.pointer_network(
        input_dim=train.element_spec[0].shape[-1],
        units=args.units,
        encoder=args.encoder,
        mask_chosen=not hull,  # a closed hull points at its first vertex twice
        pad_value=PAD_VALUE,  # padded points (-1.0) are never pointed at
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(ignore_class=-1),  # padded steps
    )

    # -- fit ----------------------------------------------------------------
    model.fit(batches(train, shuffle=True), epochs=args.epochs, verbose=2)

    # -- evaluate: greedy decoding, never pointing twice ----------------------
    accuracies, coverages, count, first = [], [], 0, None
    for inputs, targets in batches(test):
        points, targets = inputs["points"].numpy(), targets.numpy()
        if hull:
            predicted = models.decoding.polygon_decode(model, points)
            accuracy, coverage = hull_metrics(points, predicted, targets)
            coverages.append(coverage * len(points))
        else:
            predicted = models.pointer_decode(model, points)  # (B, N), a permutation
            accuracy = float(np.mean(np.all(predicted == targets, axis=-1)))
        accuracies.append(accuracy * len(points))
        count += len(points)
        first = first or (points[0], predicted[0], targets[0])
    accuracy = sum(accuracies) / count
    print(f"{name} test, {count} examples: whole-sequence accuracy {accuracy:.4f}", end="")
    print(f", area coverage {sum(coverages) / count:.4f}" if hull else "")

    # -- export -------------------------------------------------------------
    out = common.output_dir(args, f"pointer_{args.task}")
    model.save(os.path.join(out, "model.keras"))
    model.export(os.path.join(out, "saved_model"), verbose=False)
    print(f"Saved {out}/model.keras and the SavedModel {out}/saved_model")

    # -- plot: the first test example --------------------------------------
    if args.plot:
        from keras_attn import plotting

        points, predicted, target = first
        real = points[~np.all(points == PAD_VALUE, axis=-1)]  # drop padding points
        fig = plotting.plot_pointer(
            real, predicted, target=open_polygon(target) if hull else None, title=f"{name}: test 0"
        )
        plotting.save_figure(fig, args.plot)
        print(f"Saved the pointer plot {args.plot}")
    results = {"dataset": name, "accuracy": accuracy, "export": out}
    return results | ({"area_coverage": sum(coverages) / count} if hull else {})


if __name__ == "__main__":
    main()
