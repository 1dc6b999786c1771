"""Bahdanau on real text: BLEU of three model families on the UI strings, pt -> en.

    python -m results.ui_translate [--epochs 60,120] [--data-dir DIR] [--output FILE]

Runs `keras-attn train ted-translate --dataset keras_attn_ui_strings/pt_to_en` (seed 0,
every test pair) once per model family and number of epochs: the recipe's Transformer,
`--attention additive` (the RNN encoder-decoder with Bahdanau's additive attention, the
model of `rnn-attention-reverse`) and `--attention none` (the same RNN without
attention). Each run trains, exports a SavedModel that translates text, and writes its
metrics JSON; this script copies what each wrote (BLEU on the test split, exact match,
the last training loss), the command and the wall-clock time into `--output`, rewritten
after every run, so a stopped script keeps the runs it finished. It needs Django's and
Sphinx's catalogs (`pip install --no-deps django==5.2.* sphinx==9.0.*`) and keras-hub.
"""

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATASET = "keras_attn_ui_strings/pt_to_en"
FAMILIES = {  # name in the table: the flags after the task
    "transformer": [],
    "rnn_additive": ["--attention", "additive"],
    "rnn_none": ["--attention", "none"],
}


def command(family, epochs):
    """The `keras-attn` arguments of one run (the output directory added by `main`)."""
    return [
        "train", "ted-translate", "--dataset", DATASET, "--epochs", str(epochs),
        "--test-examples", "1000", "--seed", "0", *FAMILIES[family],
    ]  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", default="60,120", help="epochs of each run, e.g. 60,120")
    parser.add_argument("--families", default=",".join(FAMILIES), help="which families to run")
    parser.add_argument("--data-dir", help="tfds data directory for the prepared builder")
    parser.add_argument("--output", default=os.path.join(HERE, "ui_translate.json"))
    args = parser.parse_args(argv)

    from keras_attn.models import cli, datasets

    test = datasets.load(DATASET, "test", args.data_dir)
    test_pairs = sum(1 for _ in test)  # every one is decoded (--test-examples 1000)
    runs = []
    for epochs in [int(e) for e in args.epochs.split(",")]:
        for family in args.families.split(","):
            argv = command(family, epochs)
            extra = ["--data-dir", args.data_dir] if args.data_dir else []
            with tempfile.TemporaryDirectory() as out:
                start = time.perf_counter()
                status = cli.main([*argv, *extra, "--output", out])
                seconds = time.perf_counter() - start
                if status != 0:
                    return status
                with open(os.path.join(out, "ted-translate_metrics.json")) as f:
                    metrics = json.load(f)
            runs.append(
                {
                    "family": family,
                    "epochs": epochs,
                    "command": "keras-attn " + " ".join(argv),
                    "bleu": metrics["bleu"],
                    "exact_match": metrics["exact_match"],
                    "final_loss": metrics["loss"][-1],
                    "seconds": round(seconds, 1),
                }
            )
            with open(args.output, "w") as f:
                json.dump(
                    {
                        "dataset": DATASET,
                        "test_pairs": test_pairs,
                        "machine": "2 CPU cores shared with other jobs, no GPU",
                        "bleu": "corpus BLEU (points, 0-100) of the test split, "
                        "keras_hub.metrics.Bleu, 13a tokenization, no smoothing",
                        "runs": runs,
                    },
                    f,
                    indent=1,
                )
            print(f"{family} {epochs} epochs: BLEU {runs[-1]['bleu']:.2f} ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
