"""`keras-attn`: list the tasks, or train one (fit, evaluate, save, export, plot).

    keras-attn list
    keras-attn train TASK [--dataset NAME] [--data-dir DIR] [--epochs N]
                          [--export DIR] [--plot FILE] [--output DIR] ...

The default of every generated task needs no network: its tfds builder
generates the data into `--data-dir`.

With `--strategy multi-worker` every worker of `TF_CONFIG` runs the same command;
the chief writes the files, the other workers make the same saves into temporary
directories and delete them (README: "Training on several devices").
"""

import argparse
import json
import os
import sys
import tempfile


def _parser():
    parser = argparse.ArgumentParser(prog="keras-attn", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the tasks: a zoo model and a dataset each")
    train = commands.add_parser("train", help="train a task, evaluate, save, export, plot")
    train.add_argument("task", help="a task name from `keras-attn list`")
    train.add_argument("--dataset", help="tfds name (with config) instead of the task's default")
    train.add_argument("--data-dir", help="tfds data directory (default: tfds' own)")
    train.add_argument("--epochs", type=int, help="training epochs (default: the task's)")
    train.add_argument("--train-examples", type=int, help="use only this many training examples")
    train.add_argument("--test-examples", type=int, default=500, help="examples to evaluate on")
    train.add_argument("--batch-size", type=int, default=64)
    train.add_argument("--download", action="store_true", help="let tfds download (network)")
    train.add_argument("--output", default="keras_attn_runs", help="where the model files go")
    train.add_argument("--export", help="SavedModel directory (default: OUTPUT/TASK_savedmodel)")
    train.add_argument("--plot", help="attention plot PNG (default: OUTPUT/TASK_attention.png)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--n", help="problem size of a pointer task: 50, or a range 5-50")
    train.add_argument("--eval-n", help="also evaluate at these sizes, e.g. 50,100,200")
    train.add_argument(
        "--strategy", choices=["mirrored", "multi-worker"],
        help="tf.distribute: all local devices, or the workers named by TF_CONFIG",
    )  # fmt: skip
    train.add_argument(
        "--pooling", choices=["attention", "mean"],
        help="imdb tasks: the classifier's pooling (default attention; mean is the ablation)",
    )  # fmt: skip
    train.add_argument(
        "--backup-dir",
        help="checkpoint here every epoch; a killed run resumes from it (delete it to start over)",
    )
    return parser


def main(argv=None):
    """Runs the command line; returns the process exit status."""
    args = _parser().parse_args(argv)
    from models import recipes  # imports TensorFlow: after argument parsing
    from models.files import write_atomically

    if args.command == "list":
        width = max(map(len, recipes.TASKS))
        for name, (description, _) in recipes.TASKS.items():
            print(f"{name:<{width}}  {description}")
        return 0
    if args.task not in recipes.TASKS:
        print(f"keras-attn: unknown task {args.task!r}; see `keras-attn list`", file=sys.stderr)
        return 2
    if args.strategy == "multi-worker" and not os.environ.get("TF_CONFIG"):
        print("keras-attn: --strategy multi-worker needs TF_CONFIG", file=sys.stderr)
        return 2
    settings = recipes.Settings(
        dataset=args.dataset,
        data_dir=args.data_dir,
        epochs=args.epochs,
        train_examples=args.train_examples,
        test_examples=args.test_examples,
        batch_size=args.batch_size,
        download=args.download,
        seed=args.seed,
        n=args.n,
        eval_n=args.eval_n,
        strategy=args.strategy,
        backup_dir=args.backup_dir,
        pooling=args.pooling,
    )
    try:
        result = recipes.train(args.task, settings)
    except FileNotFoundError as error:
        print(f"keras-attn: {error}", file=sys.stderr)
        return 1
    if not recipes.writes_files(result.model):  # a non-chief worker: the same saves, discarded
        with tempfile.TemporaryDirectory() as scratch:
            result.model.save(os.path.join(scratch, "model.keras"))
            result.export(os.path.join(scratch, "savedmodel"))
        print(f"trained {args.task} on {result.dataset} (a worker: the chief writes the files)")
        return 0
    os.makedirs(args.output, exist_ok=True)
    stem = os.path.join(args.output, args.task)
    paths = {
        "keras": f"{stem}.keras",
        "savedmodel": args.export or f"{stem}_savedmodel",
        "plot": args.plot or f"{stem}_attention.png",
    }
    # Written next to their paths and renamed into place: a kill leaves no half files.
    write_atomically(paths["keras"], result.model.save)
    write_atomically(paths["savedmodel"], result.export)
    result.plot(paths["plot"])
    print(f"trained {args.task} on {result.dataset}")
    for metric, value in result.metrics.items():
        print(f"  {metric}: {value:.4f}")
    for what, path in paths.items():
        print(f"  {what}: {path}")
    history = getattr(result.model, "history", None)  # Keras' `History` of the last `fit`
    losses = {"loss": history.history.get("loss", [])} if history else {}
    with open(f"{stem}_metrics.json", "w") as f:
        json.dump(
            {"task": args.task, "dataset": result.dataset, **result.metrics, **losses}, f, indent=1
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
