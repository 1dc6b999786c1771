"""The `keras-attn` command: list, and train end to end on tiny local datasets, offline."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from models import cli, recipes


def run(capsys, *argv):
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_list_names_every_task(capsys):
    status, out, _ = run(capsys, "list")
    assert status == 0
    for task in ("pointer-sort", "pointer-hull", "transformer-reverse", "rnn-attention-reverse",
                 "imdb-transformer", "imdb-han", "ted-translate"):  # fmt: skip
        assert task in out


@pytest.mark.parametrize(
    "task,dataset,metric",
    [
        ("transformer-reverse", "keras_attn_seq2seq/tiny-reverse", "exact_match"),
        ("rnn-attention-reverse", "keras_attn_seq2seq/tiny-copy", "exact_match"),
        ("pointer-sort", "keras_attn_sorting/tiny", "sequence_accuracy"),
        ("pointer-hull", "keras_attn_convex_hull/tiny", "area_coverage"),
    ],
)
def test_train_end_to_end_on_a_tiny_local_dataset(task, dataset, metric, tmp_path, capsys):
    status, out, _ = run(
        capsys, "train", task, "--dataset", dataset, "--data-dir", str(tmp_path / "tfds"),
        "--epochs", "1", "--train-examples", "64", "--test-examples", "8",
        "--output", str(tmp_path / "out"),
    )  # fmt: skip
    assert status == 0
    assert f"trained {task} on {dataset}" in out
    stem = tmp_path / "out" / task
    metrics = json.loads((tmp_path / "out" / f"{task}_metrics.json").read_text())
    assert metrics["dataset"] == dataset and 0 <= metrics[metric] <= 1.5
    assert keras.saving.load_model(f"{stem}.keras", safe_mode=True) is not None
    served = tf.saved_model.load(f"{stem}_savedmodel")
    if metric == "exact_match":  # seq2seq: the SavedModel decodes by itself
        tokens = served.greedy_decode(tf.constant(np.ones((2, 5), "int32"))).numpy()
        assert tokens.shape[0] == 2 and tokens.dtype == np.int32
    assert (tmp_path / "out" / f"{task}_attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "task",
    ["imdb-transformer", "imdb-han", pytest.param("ted-translate", marks=pytest.mark.slow)],
)
def test_real_dataset_tasks_run_under_mock_data(task, tmp_path, capsys):
    with tfds.testing.mock_data(num_examples=16):
        status, out, _ = run(
            capsys, "train", task, "--epochs", "1", "--test-examples", "4",
            "--batch-size", "8", "--output", str(tmp_path),
        )  # fmt: skip
    assert status == 0, out
    assert os.path.exists(tmp_path / f"{task}.keras")
    assert os.path.exists(tmp_path / f"{task}_attention.png")


def test_a_real_dataset_that_is_not_prepared_fails_fast_and_plainly(tmp_path, capsys):
    status, _, err = run(capsys, "train", "imdb-han", "--data-dir", str(tmp_path))
    assert status == 1
    assert "'imdb_reviews' is not prepared" in err and "--download" in err


def test_unknown_task(capsys):
    status, _, err = run(capsys, "train", "no-such-task")
    assert status == 2 and "unknown task" in err
    with pytest.raises(ValueError, match="Unknown task"):
        recipes.train("no-such-task")
