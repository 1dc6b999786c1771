"""Pointer network (Vinyals et al., 2015) on sorting or planar convex hull, generated locally.

    python examples/pointer.py --task sort                          # keras_attn_sorting/n5
    python examples/pointer.py --task hull --plot hull.png          # keras_attn_convex_hull/n5
    python examples/pointer.py --task hull --dataset keras_attn_convex_hull/n10 --epochs 20

The datasets are the project's own tfds builders, generated into `--data-dir` on first
use (no network). Sorting: the targets are the argsort pointers, decoded with the
constrained `models.pointer_decode` (never the same position twice), scored by
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

import models
from models.datasets import PAD_VALUE, padding_values, polygon_area

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
# Convex hull: closed-polygon decoding and its metrics
# ---------------------------------------------------------------------------


def decode_hull(model, points):
    """Greedy decoding of closed hulls: positions already chosen are excluded, except the
    first one, which closes the polygon and ends the sequence (after at least 3 vertices).

    Returns one index array per example, without the closing index.
    """
    batch, num_points = points.shape[:2]
    pointers = np.full((batch, num_points + 1), -1, "int32")  # -1: not decoded (padding)
    chosen = np.zeros((batch, num_points), bool)
    closed = np.zeros(batch, bool)
    rows = np.arange(batch)
    for t in range(num_points + 1):
        probs = model.predict_on_batch({"points": points, "pointers": pointers})[:, t]  # (B, N)
        allowed = ~chosen
        if t >= 3:  # pointing at the first vertex again closes the polygon
            allowed[rows, pointers[:, 0]] = True
        choice = np.argmax(np.where(allowed, probs, -1.0), axis=-1)
        pointers[:, t] = np.where(closed, -1, choice)
        chosen[rows, choice] = True
        closed |= (t >= 3) & (choice == pointers[:, 0])
        if closed.all():
            break
    return [open_hull(row) for row in pointers]


def open_hull(pointers):
    """A closed pointer sequence (maybe padded with -1) without its padding and closing index."""
    pointers = pointers[pointers >= 0]
    return pointers[:-1] if len(pointers) > 1 and pointers[-1] == pointers[0] else pointers


def is_simple(polygon):
    """Whether a closed polygon `(k, 2)` has at least 3 vertices and no crossing edges."""
    k = len(polygon)
    if k < 3:
        return False

    def cross(o, a, b):
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    for i in range(k):
        for j in range(i + 2, k):
            if i == 0 and j == k - 1:
                continue  # adjacent through the closing edge
            p, q = polygon[i], polygon[(i + 1) % k]
            r, s = polygon[j], polygon[(j + 1) % k]
            if cross(p, q, r) * cross(p, q, s) < 0 and cross(r, s, p) * cross(r, s, q) < 0:
                return False
    return True


def hull_metrics(points, predicted, targets):
    """(whole-sequence accuracy, mean area coverage) over examples."""
    exact, coverage = [], []
    for x, hull, target in zip(points, predicted, targets, strict=True):
        target = open_hull(target)
        exact.append(len(hull) == len(target) and np.array_equal(hull, target))
        simple = is_simple(x[hull]) and len(set(hull.tolist())) == len(hull)
        coverage.append(abs(polygon_area(x, hull)) / polygon_area(x, target) if simple else 0.0)
    return float(np.mean(exact)), float(np.mean(coverage))


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
            predicted = decode_hull(model, points)
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
            real, predicted, target=open_hull(target) if hull else None, title=f"{name}: test 0"
        )
        plotting.save_figure(fig, args.plot)
        print(f"Saved the pointer plot {args.plot}")
    results = {"dataset": name, "accuracy": accuracy, "export": out}
    return results | ({"area_coverage": sum(coverages) / count} if hull else {})


if __name__ == "__main__":
    main()
