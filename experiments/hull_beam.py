"""Convex hull: exact match against the beam width, for a trained pointer-hull run.

The `pointer-hull` recipe reports greedy decoding and a beam of 4. This command
decodes the same test sets with other widths, from the weights a
`keras-attn train pointer-hull --backup-dir DIR` run left in `DIR`
(`final.weights.h5`, or the latest checkpoint of an unfinished run):

    python -m experiments.hull_beam --backup-dir DIR --eval-n 50,100 --widths 1,4,8,16

Width 1 is the paper's greedy decoding (no point twice, not constrained to convex
polygons); every other width is `keras_attn.models.pointer_search.polygon_beam_search` over
convex counter-clockwise polygons. Each decoded polygon is rotated to start at its
lowest index before it is compared with the target, as in the recipe. Every
(size, width) pair is one entry of `--output`, saved as soon as it is measured, so
a killed run resumes.
"""

import argparse
import os
import sys
import time

from experiments import store


def decode(model, points, width, batch_size):
    """Polygons for `points (B, N, 2)`: greedy for `width=1`, else the convex beam."""
    from keras_attn.models.pointer_search import polygon_beam_search
    from keras_attn.models.recipes.pointer import MAX_VERTICES

    polygons = []
    for i in range(0, len(points), batch_size):
        batch = points[i : i + batch_size]
        polygons += polygon_beam_search(
            model, batch, width, convex=width > 1, max_vertices=MAX_VERTICES
        )[0]
    return polygons


def measure(model, points, targets, width, batch_size):
    """`{exact_match, area_coverage, valid, decode_seconds}` of one width on one test set."""
    from keras_attn.models.datasets import loading
    from keras_attn.models.geometry import hull_report, rotate_to_lowest_index

    start = time.perf_counter()
    polygons = decode(model, points, width, batch_size)
    seconds = time.perf_counter() - start
    polygons = [rotate_to_lowest_index(p) for p in polygons]
    report = hull_report(points, polygons, targets, pad_value=loading.PAD_VALUE)
    return {
        "exact_match": report["exact_match"],
        "area_coverage": report["area_coverage"],
        "valid": report["valid"],
        "decode_seconds": round(seconds, 1),
    }


def table(results):
    """A Markdown table: one row per test size, one column per width (exact %, seconds)."""
    sizes = sorted({key.split("/")[0] for key in results}, key=lambda s: (len(s), s))
    widths = sorted({int(key.split("/w")[1]) for key in results})
    lines = [
        "| test n | " + " | ".join(f"width {w}" for w in widths) + " |",
        "|---|" + "---|" * len(widths),
    ]
    for size in sizes:
        cells = []
        for w in widths:
            found = results.get(f"{size}/w{w}")
            cells.append(
                "-" if found is None
                else f"{100 * found['exact_match']:.1f} % ({found['decode_seconds']:.0f} s)"
            )  # fmt: skip
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backup-dir", required=True, help="the training run's --backup-dir")
    parser.add_argument("--n", default="5-50", help="the sizes the run was trained on")
    parser.add_argument("--eval-n", default="50,100", help="test sizes")
    parser.add_argument("--widths", default="1,4,8,16")
    parser.add_argument("--test-examples", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64, help="examples decoded at once")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--output", default="results/hull_beam.json")
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    from keras_attn.models.recipes import Settings
    from keras_attn.models.recipes.pointer import (
        FINAL_WEIGHTS,
        LATEST_WEIGHTS,
        build_model,
        parse_sizes,
        sized_dataset,
        test_set,
    )

    widths = [int(w) for w in args.widths.split(",")]
    if any(w < 1 for w in widths):
        raise ValueError(f"`--widths` must be positive integers. Received: {args.widths!r}")
    final = os.path.join(args.backup_dir, FINAL_WEIGHTS)
    weights = final if os.path.exists(final) else os.path.join(args.backup_dir, LATEST_WEIGHTS)
    if not os.path.exists(weights):
        raise ValueError(f"No weights in `--backup-dir`. Received: --backup-dir={args.backup_dir}")
    settings = {"weights": os.path.abspath(weights), "n": args.n,
                "test_examples": args.test_examples}  # fmt: skip
    results = store.load(args.output, settings)
    model = build_model(hull=True)
    model.load_weights(weights)
    recipe = Settings(data_dir=args.data_dir, test_examples=args.test_examples)
    for n in parse_sizes(args.eval_n):
        points, targets = test_set(sized_dataset("keras_attn_convex_hull", str(n)), recipe, True)
        for width in widths:
            key = f"n{n}/w{width}"
            if key in results:
                continue
            results[key] = measure(model, points, targets, width, args.batch_size)
            store.save(args.output, settings, results)
            print(f"{key}: {results[key]}", flush=True)
    print(table(results))


if __name__ == "__main__":
    sys.exit(main())
