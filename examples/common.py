"""What the examples share: the common flags, and loading a dataset without surprises.

A dataset is one of two kinds, and the examples say which one they trained on:

- the project's own generated tasks (`keras_attn_*`, registered by `keras_attn.models.datasets`):
  generated into `--data-dir` on first use, no network;
- a real tfds dataset (`imdb_reviews`, `ted_hrlr_translate/pt_to_en`, ...): read from
  `--data-dir` when it is prepared there. Only with `--download` does tfds fetch it (and
  then it needs the internet). Without `--download` an unprepared real dataset is an
  error with instructions, never a silent fallback to something else.
"""

import quiet  # noqa: F401  (first: hides TensorFlow's start-up notices)

# isort: split
import argparse
import os

import tensorflow_datasets as tfds

import keras_attn.models.datasets  # registers the keras_attn_* builders


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except None and False (the help says what those mean)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def parser(description, dataset_help, epochs, real_datasets=True):
    """An `ArgumentParser` with the flags every example has (`--download` with real datasets)."""
    p = argparse.ArgumentParser(description=description, formatter_class=_HelpFormatter)
    p.add_argument("--dataset", default=None, help=dataset_help)
    p.add_argument(
        "--data-dir",
        default=None,
        help="tfds data directory (default: $TFDS_DATA_DIR or ~/tensorflow_datasets)",
    )
    if real_datasets:
        p.add_argument(
            "--download",
            action="store_true",
            help="let tfds download and prepare a real dataset that is not prepared yet",
        )
    p.add_argument("--epochs", type=int, default=epochs, help="training epochs")
    p.add_argument("--batch-size", type=int, default=64, help="examples per batch")
    p.add_argument(
        "--train-examples",
        type=int,
        default=None,
        help="train on the first N examples only (default: all)",
    )
    p.add_argument("--export", default=None, help="output folder (default: out/<example>)")
    p.add_argument("--plot", default=None, help="write an attention plot to this PNG file")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="a check that everything runs: tiny sizes, 1 epoch, a few batches",
    )
    return p


def is_generated(name):
    """Whether `name` is one of the project's own generated tasks."""
    return name.split("/")[0].startswith("keras_attn_")


def is_prepared(name, data_dir):
    """Whether a tfds dataset is prepared in `data_dir` (about 0.1 s, no network)."""
    return tfds.builder(name, data_dir=data_dir).is_prepared()


def load(name, split, data_dir=None, download=False):
    """`(dataset of (inputs, targets) pairs, tfds info)` for one split.

    Generated tasks are prepared locally on first use. A real dataset must be
    prepared in `data_dir` unless `download` is set; otherwise this exits with a
    message that says how to get it (tfds would otherwise retry the network for
    minutes before failing).
    """
    if is_generated(name):
        return keras_attn.models.datasets.load(name, split, data_dir), tfds.builder(
            name, data_dir=data_dir
        ).info
    try:
        return tfds.load(
            name,
            split=split,
            data_dir=data_dir,
            download=download,
            as_supervised=True,
            with_info=True,
        )
    except AssertionError as error:  # tfds: "could not find data in ..." (download=False)
        where = tfds.builder(name, data_dir=data_dir).data_dir  # where tfds looked
        default = "" if data_dir else " (tfds' default data_dir, $TFDS_DATA_DIR if set)"
        raise SystemExit(
            f"The tfds dataset {name!r} is not prepared in {where}{default}.\n"
            "Run again with --download to prepare it there (needs internet access once), or "
            f"prepare it with `tfds build {name} --data_dir DIR` and pass --data-dir DIR."
        ) from error


def describe(name, data_dir):
    """One plain line saying which dataset an example trains on."""
    kind = (
        "generated locally by keras-attn (a synthetic task)"
        if is_generated(name)
        else "a real tfds dataset"
    )
    return f"Dataset: {name}, {kind}, in {data_dir or 'the default tfds data_dir'}"


def output_dir(args, example):
    """The example's export folder: `--export`, or `out/<example>`."""
    path = args.export or os.path.join("out", example)
    os.makedirs(path, exist_ok=True)
    return path
