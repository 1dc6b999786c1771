"""The `keras-attn` command: list, and train end to end on tiny local datasets, offline."""

import json
import os
import re
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from keras_attn.models import cli, recipes
from keras_attn.models.recipes import pointer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(capsys, *argv):
    try:
        status = cli.main(list(argv))
    except SystemExit as exit:  # argparse: --help, or a value its type refuses
        status = exit.code
    out, err = capsys.readouterr()
    return status, out, err


def run_command(tmp_path, *argv, **env):
    """`keras-attn` in a fresh process, as a user's shell runs it (no TF_CPP_MIN_LOG_LEVEL).

    TensorFlow reads its log level once, when imported: the command runs `bin/keras-attn`
    (the installed command's script) as the program, so that nothing imports TensorFlow
    before the command sets it. (Not `models/cli.py` as a path: the zoo imports itself
    relatively, as a package.)
    """
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    program = "import runpy; runpy.run_path('bin/keras-attn', run_name='__main__')"
    completed = subprocess.run(
        [sys.executable, "-c", program, *argv], cwd=ROOT, env={**environment, **env},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout + completed.stderr


def test_list_names_every_task(capsys):
    status, out, _ = run(capsys, "list")
    assert status == 0
    for task in ("pointer-sort", "pointer-hull", "transformer-reverse", "rnn-attention-reverse",
                 "imdb-transformer", "imdb-han", "ted-translate", "transformer-lm"):  # fmt: skip
        assert task in out


@pytest.mark.parametrize(
    "task,dataset,metric",
    [
        pytest.param(  # CI runs the full command instead (tests/zoo/test_main_job.py)
            "transformer-reverse",
            "keras_attn_seq2seq/tiny-reverse",
            "exact_match",
            marks=pytest.mark.slow_covered,
        ),
        pytest.param(
            "rnn-attention-reverse",
            "keras_attn_seq2seq/tiny-copy",
            "exact_match",
            marks=pytest.mark.slow,
        ),
        pytest.param(  # CI: the slow console test runs the same command and checks its outputs
            "pointer-sort",
            "keras_attn_sorting/tiny",
            "sequence_accuracy",
            marks=pytest.mark.slow_covered,
        ),
        pytest.param(
            "pointer-hull", "keras_attn_convex_hull/tiny", "area_coverage", marks=pytest.mark.slow
        ),
    ],
)
def test_train_end_to_end_on_a_tiny_local_dataset(task, dataset, metric, tmp_path, capsys):
    status, out, _ = run(
        capsys, "train", task, "--dataset", dataset, "--data-dir", str(tmp_path / "tfds"),
        "--epochs", "1", "--train-examples", "64", "--test-examples", "8",
        "--output", str(tmp_path / "out"),
    )  # fmt: skip
    assert status == 0
    check_outputs(out, tmp_path / "out", task, dataset, metric)


def check_outputs(out, folder, task, dataset, metric):
    """A training run's console line and outputs: metrics, `.keras`, SavedModel, heatmap."""
    assert f"trained {task} on {dataset}" in out
    stem = folder / task
    metrics = json.loads((folder / f"{task}_metrics.json").read_text())
    assert metrics["dataset"] == dataset and 0 <= metrics[metric] <= 1.5
    assert keras.saving.load_model(f"{stem}.keras", safe_mode=True) is not None
    served = tf.saved_model.load(f"{stem}_savedmodel")
    if metric == "exact_match":  # seq2seq: the SavedModel decodes by itself
        tokens = served.greedy_decode(tf.constant(np.ones((2, 5), "int32"))).numpy()
        assert tokens.shape[0] == 2 and tokens.dtype == np.int32
    assert (folder / f"{task}_attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # trains end to end (CI time: issue 17)
@pytest.mark.parametrize(
    "task",
    ["imdb-transformer", "imdb-han", "ted-translate"],
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
    # the directory it looked in, and how to prepare one
    assert f"in {tmp_path}{os.sep}imdb_reviews" in err and "tfds build imdb_reviews" in err


def test_version(capsys):
    import keras_attn

    status, out, _ = run(capsys, "--version")
    assert status == 0 and out == f"keras-attn {keras_attn.__version__}\n"


def test_unknown_task(capsys):
    status, _, err = run(capsys, "train", "no-such-task")
    assert status == 2 and "unknown task" in err
    with pytest.raises(ValueError, match="Unknown task"):
        recipes.train("no-such-task")


# ---------------------------------------------------------------------------
# Bad flags: refused before any work, one line naming the flag and the value, exit 2
# ---------------------------------------------------------------------------

BAD_FLAGS = [
    ("transformer-reverse", ["--epochs", "0"], "--epochs", "'0'"),
    ("transformer-reverse", ["--epochs", "-2"], "--epochs", "'-2'"),
    ("transformer-reverse", ["--epochs", "two"], "--epochs", "'two'"),
    ("transformer-reverse", ["--train-examples", "-5"], "--train-examples", "'-5'"),
    ("transformer-reverse", ["--test-examples", "0"], "--test-examples", "'0'"),
    ("transformer-reverse", ["--batch-size", "0"], "--batch-size", "'0'"),
    ("transformer-reverse", ["--seed", "-1"], "--seed", "'-1'"),
    ("pointer-sort", ["--n", "5-3"], "--n", "'5-3'"),
    ("pointer-sort", ["--n", "five"], "--n", "'five'"),
    ("pointer-sort", ["--n", "7"], "--n", "'7'"),  # no such builder config
    ("pointer-sort", ["--eval-n", "x,y"], "--eval-n", "'x,y'"),
    ("pointer-hull", ["--eval-n", "50,30"], "--eval-n", "'50,30'"),  # no n30 config
    ("pointer-sort", ["--dataset", "keras_attn_sorting/n5", "--n", "10"], "--n", "'10'"),
    ("transformer-reverse", ["--n", "5"], "--n", "'5'"),
    ("transformer-reverse", ["--eval-n", "50"], "--eval-n", "'50'"),
    ("pointer-sort", ["--pooling", "mean"], "--pooling", "'mean'"),
    ("imdb-han", ["--n", "50"], "--n", "'50'"),
    ("transformer-reverse", ["--pooling", "median"], "--pooling", "'median'"),
    ("transformer-reverse", ["--dataset", "no_such_dataset"], "--dataset", "'no_such_dataset'"),
    ("transformer-reverse", ["--dataset", "keras_attn_seq2seq/reverse-9"], "--dataset",
     "'keras_attn_seq2seq/reverse-9'"),
    ("transformer-reverse", ["--strategy", "multi-worker"], "--strategy", "'multi-worker'"),
    ("transformer-reverse", ["--no-baseline"], "--baseline", "False"),
    ("pointer-sort", ["--baseline"], "--baseline", "True"),
    ("transformer-lm", ["--mesh", "3"], "--mesh", "'3'"),
    ("transformer-lm", ["--mesh", "0x4"], "--mesh", "'0x4'"),
    ("transformer-lm", ["--mesh", "2x4x1"], "--mesh", "'2x4x1'"),
    ("transformer-reverse", ["--mesh", "2x4"], "--mesh", "'2x4'"),
    ("transformer-lm", ["--mesh", "1x2", "--strategy", "mirrored"], "--mesh", "'1x2'"),
    # On TensorFlow (torch: below; too few JAX devices: tests/compat/test_cli_mesh_jax.py)
    ("transformer-lm", ["--mesh", "2x4"], "--mesh", "'2x4'"),
]  # fmt: skip


@pytest.fixture
def no_training(monkeypatch):
    """Fails a test that gets as far as training (building data or a model)."""

    def train(task, settings=None):
        raise AssertionError(f"{task} started training")

    monkeypatch.setattr(recipes, "train", train)
    monkeypatch.delenv("TF_CONFIG", raising=False)


@pytest.mark.parametrize("task,flags,flag,value", BAD_FLAGS)
def test_a_bad_flag_stops_at_once_with_one_line(task, flags, flag, value, no_training, capsys):
    status, out, err = run(capsys, "train", task, *flags)
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("keras-attn train: error: ") and flag in lines[0], err
    assert value in lines[0], err


@pytest.mark.parametrize(
    "backend,points_to",
    [("tensorflow", "--strategy mirrored"), ("torch", "trains on one device")],
)
def test_a_mesh_off_jax_points_to_what_works_there(
    backend, points_to, request, monkeypatch, capsys
):
    monkeypatch.setattr(keras.backend, "backend", lambda: backend)
    with pytest.raises(ValueError, match=f"Cannot train on mesh=\\(2, 4\\): .*{points_to}"):
        recipes.train("transformer-lm", recipes.Settings(mesh=(2, 4)))  # before any work
    request.getfixturevalue("no_training")
    status, _, err = run(capsys, "train", "transformer-lm", "--mesh", "2x4")
    assert status == 2 and err.count("\n") == 1, err
    assert "runs on the jax backend only" in err and points_to in err, err


@pytest.mark.parametrize(
    "task,flags",
    [
        ("transformer-reverse", []),
        ("transformer-reverse", ["--epochs", "1", "--train-examples", "5", "--seed", "0"]),
        ("pointer-sort", ["--n", "5-20", "--eval-n", "50,100"]),
        ("pointer-hull", ["--dataset", "keras_attn_convex_hull/n5-50", "--eval-n", "100"]),
        ("imdb-han", ["--pooling", "mean", "--dataset", "imdb_reviews"]),
        ("transformer-lm", ["--no-baseline"]),
        ("transformer-lm", ["--baseline", "--epochs", "1"]),
    ],
)
def test_good_flags_go_through_to_training(task, flags, no_training, capsys):
    with pytest.raises(AssertionError, match=f"{task} started training"):
        cli.main(["train", task, *flags])
    assert capsys.readouterr().err == ""


def test_options_come_anywhere_and_reach_the_settings(monkeypatch, capsys):
    """As argparse users expect: the options of a command before, between or after its
    positional arguments (`train`; `predict`: tests/zoo/test_models_text.py)."""
    seen = []

    def train(task, settings=None):
        seen.append((task, settings.epochs, settings.baseline))
        raise KeyboardInterrupt  # stops the command before any work

    monkeypatch.setattr(recipes, "train", train)
    for argv in (
        ["train", "--epochs", "2", "transformer-lm", "--no-baseline"],
        ["train", "--no-baseline", "transformer-lm", "--epochs", "2"],
    ):
        with pytest.raises(KeyboardInterrupt):
            cli.main(argv)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["train", "transformer-lm"])
    assert seen == [("transformer-lm", 2, False)] * 2 + [("transformer-lm", None, None)]
    assert run(capsys, "list", "--help")[0] == 0
    status, _, err = run(capsys, "predict")
    assert status == 2 and "required: task (see" in err, err  # the texts may come from stdin


def test_settings_refuse_what_the_command_line_refuses():
    for field, value in (("epochs", 0), ("train_examples", -5), ("batch_size", 0),
                         ("test_examples", 0), ("seed", -1), ("epochs", 2.5)):  # fmt: skip
        with pytest.raises(ValueError, match=f"`{field}` must be .*Received: {field}="):
            recipes.Settings(**{field: value})
    assert recipes.Settings(epochs=None, train_examples=None).epochs is None
    with pytest.raises(ValueError, match="`baseline` must be None, True or False. Received: 'no'"):
        recipes.Settings(baseline="no")
    for mesh in ((2,), (0, 4), "2x4", (2.0, 4), (True, True)):
        with pytest.raises(ValueError, match=r"`mesh` must be None or \(batch, model\)"):
            recipes.Settings(mesh=mesh)
    with pytest.raises(ValueError, match="`mesh` .* and `strategy` .* exclude each other"):
        recipes.Settings(mesh=(1, 2), strategy="mirrored")


def test_help_says_where_the_outputs_go_and_the_defaults(capsys):
    status, out, _ = run(capsys, "train", "--help")
    assert status == 0
    flat = " ".join(out.split())
    assert "./keras_attn_runs" in flat and "OUTPUT/TASK_savedmodel" in flat
    for default in ("(default: 64)", "(default: 500)", "(default: 0)", "(default: the task's)"):
        assert default in flat
    assert "--mesh BATCHxMODEL JAX: model parallel on a device mesh, e.g. 2x4" in flat
    status, out, _ = run(capsys, "list")
    assert status == 0
    assert re.search(r"transformer-reverse .*default: 3 epochs over 20,000 examples", out)


@pytest.mark.slow  # trains end to end (CI time: issue 17)
def test_epochs_are_the_users_not_the_checkpoint_chunks(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(pointer, "CHUNK", 3)  # 8 steps in chunks of 3: 3 Keras epochs
    status, out, _ = run(
        capsys, "train", "pointer-sort", "--dataset", "keras_attn_sorting/tiny",
        "--data-dir", str(tmp_path / "tfds"), "--epochs", "2", "--train-examples", "64",
        "--batch-size", "16", "--test-examples", "8", "--output", str(tmp_path / "out"),
    )  # fmt: skip
    assert status == 0
    assert re.findall(r"Epoch \d+/\d+", out) == ["Epoch 1/2", "Epoch 2/2"]
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)  # without the bar's colours
    assert "4/4 " in plain and "5/5 " in plain, out  # 8 steps, rounded up to 3 chunks: 9


# ---------------------------------------------------------------------------
# The console of a run: progress, metrics, outputs, and no TensorFlow chatter
# ---------------------------------------------------------------------------

TF_LOG_LINE = re.compile(r"^[IWEF]\d{4} ", re.MULTILINE)  # I1201 12:00:00.0 file.cc:1] ...


@pytest.mark.slow  # trains end to end (CI time: issue 17)
def test_a_default_run_shows_progress_metrics_and_outputs_only(tmp_path):
    out = run_command(
        tmp_path, "train", "pointer-sort", "--dataset", "keras_attn_sorting/tiny",
        "--data-dir", str(tmp_path / "tfds"), "--epochs", "1", "--train-examples", "64",
        "--test-examples", "8", "--output", str(tmp_path / "out"),
    )  # fmt: skip
    assert TF_LOG_LINE.search(out) is None, out
    for noise in ("WARNING", "Warning", "oneDNN", "XLA", "Captures", "Saved artifact", ".tmp-"):
        assert noise not in out, out
    assert "Epoch 1/1" in out and "sequence_accuracy: " in out
    assert f"savedmodel: {tmp_path / 'out' / 'pointer-sort_savedmodel'}" in out
    # The quick in-process run of the same command (CI leaves it out: `slow_covered`).
    check_outputs(out, tmp_path / "out", "pointer-sort", "keras_attn_sorting/tiny",
                  "sequence_accuracy")  # fmt: skip


def test_progress_is_one_line_per_epoch_unless_stdout_is_a_terminal(monkeypatch, capsys):
    """A bar that redraws itself on a terminal; in a log file (stdout redirected) one line per
    epoch, as Keras' `verbose=2`: a redrawn bar there is a line per update."""
    from keras_attn.models.recipes import common

    class Terminal(__import__("io").StringIO):
        def isatty(self):
            return True

    assert common.progress_verbosity() == 2  # pytest captures stdout: not a terminal
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert common.progress_verbosity() == 1
    monkeypatch.undo()
    progress = common.EpochProgress(steps=6, epochs=2, chunk=6)  # the pointer recipes' bar
    progress.on_epoch_begin(0)
    for step in range(6):
        time.sleep(0.06)  # longer than the bar's redraw interval (0.05 s)
        progress.on_train_batch_end(step, {"loss": 1.0 / (step + 1)})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ")[0] for line in lines] == ["Epoch", "3/3", "Epoch", "3/3"], lines


# The input pipeline warns of no discarded cache: checked on the main job itself, with
# TensorFlow's warnings shown (tests/zoo/test_main_job.py, slow).
