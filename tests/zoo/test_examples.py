"""Every script in examples/ runs end to end in --smoke mode, offline.

The real-dataset examples run in-process (`main(argv)`) inside `tfds.testing.mock_data`
with readable stand-in text (the mock mocks `tfds.load`, so it must be the same process);
the pointer and generated-task runs use the project's tiny builders prepared into a
temporary data dir. Nothing here downloads: `DownloadManager` raises if anything tries.
"""

import importlib
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = ("common", "imdb_classifier", "imdb_han", "translate", "pointer")

REVIEWS = [
    ("A wonderful film. The acting is superb!<br /><br />I would watch it again.", 1),
    ("Boring and far too long. I fell asleep twice... Avoid it.", 0),
    ("The music was great. The story, sadly, was not.<br />Still worth seeing?Yes.", 1),
    ("Terrible script, wooden actors. What a waste of time!", 0),
] * 4
PT_EN = [
    ("o gato dorme .", "the cat sleeps ."),
    ("eu gosto de chá .", "i like tea ."),
    ("ela lê um livro .", "she reads a book ."),
    ("nós vamos para casa amanhã .", "we are going home tomorrow ."),
] * 4


# ---------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def examples():
    """The example scripts, imported as modules (they import their sibling `common`)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield {name: importlib.import_module(name) for name in SCRIPTS}
    finally:
        sys.path.remove(str(EXAMPLES))
        for name in SCRIPTS:
            sys.modules.pop(name, None)


@pytest.fixture(autouse=True)
def no_downloads(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("tests never download")

    for method in ("download", "download_and_extract"):
        monkeypatch.setattr(tfds.download.DownloadManager, method, refuse)


@pytest.fixture(scope="module")
def generated_dir(tmp_path_factory):
    """The tiny generated tasks the smoke runs use, prepared once."""
    import keras_attn.models.datasets  # noqa: F401  (registers the builders)

    data_dir = tmp_path_factory.mktemp("tfds")
    for name in ("keras_attn_sorting/tiny", "keras_attn_convex_hull/tiny"):
        tfds.builder(name, data_dir=data_dir).download_and_prepare()
    tfds.builder("keras_attn_seq2seq/tiny-reverse", data_dir=data_dir).download_and_prepare()
    return str(data_dir)


def _mock(rows, keys):
    def as_dataset(self, split, decoders=None, read_config=None, shuffle_files=False):
        columns = [np.asarray(column) for column in zip(*rows, strict=True)]  # str, int64
        return tf.data.Dataset.from_tensor_slices(dict(zip(keys, columns, strict=True)))

    return tfds.testing.mock_data(as_dataset_fn=as_dataset)


@pytest.fixture
def mock_imdb():
    """`imdb_reviews` (mocked): real features, readable reviews with <br /> and punctuation."""
    with _mock(REVIEWS, ("text", "label")):
        yield


@pytest.fixture
def mock_ted():
    """`ted_hrlr_translate/pt_to_en` (mocked): a few readable sentence pairs."""
    with _mock(PT_EN, ("pt", "en")):
        yield


def check_png(path):
    data = pathlib.Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 3000


# ---------------------------------------------------------------------------
# Real datasets, mocked
# ---------------------------------------------------------------------------


def test_imdb_classifier(examples, mock_imdb, tmp_path, capsys):
    out = tmp_path / "out"
    result = examples["imdb_classifier"].main(["--smoke", "--export", str(out)])
    printed = capsys.readouterr().out
    assert "Dataset: imdb_reviews, a real tfds dataset" in printed
    assert "imdb_reviews test: accuracy" in printed
    assert result["dataset"] == "imdb_reviews" and 0.0 <= result["accuracy"] <= 1.0
    assert (out / "model.keras").exists() and (out / "vocabulary.txt").exists()
    exported = tf.saved_model.load(str(out / "saved_model"))
    logits = exported.serve(tf.constant(["A superb film.", "Boring!"]))
    assert logits.shape == (2, 2) and np.all(np.isfinite(logits))


@pytest.mark.slow  # an example end to end (CI time: issue 17)
def test_imdb_han(examples, mock_imdb, tmp_path, capsys):
    han = examples["imdb_han"]
    sentences = han.split_sentences(tf.constant([REVIEWS[0][0], REVIEWS[2][0], ""]))
    assert sentences.to_list() == [
        [b"A wonderful film.", b"The acting is superb!", b"I would watch it again."],
        [b"The music was great.", b"The story, sadly, was not.", b"Still worth seeing?Yes."],
        [],
    ]
    out, plot = tmp_path / "out", tmp_path / "han.png"
    result = han.main(["--smoke", "--export", str(out), "--plot", str(plot)])
    printed = capsys.readouterr().out
    assert "Dataset: imdb_reviews, a real tfds dataset" in printed
    assert result["dataset"] == "imdb_reviews" and 0.0 <= result["accuracy"] <= 1.0
    assert (out / "model.keras").exists()
    check_png(plot)


@pytest.mark.slow  # an example end to end (CI time: issue 17)
def test_translate_transformer_on_ted(examples, mock_ted, tmp_path, capsys):
    out, plot = tmp_path / "out", tmp_path / "alignment.png"
    argv = ["--smoke", "--dataset", "ted_hrlr_translate/pt_to_en", "--export", str(out)]
    result = examples["translate"].main(argv + ["--plot", str(plot)])
    printed = capsys.readouterr().out
    assert "Dataset: ted_hrlr_translate/pt_to_en, a real tfds dataset" in printed
    assert "greedy decoding, 4 test sentences" in printed
    assert result["dataset"] == "ted_hrlr_translate/pt_to_en"
    assert (out / "model.keras").exists() and (out / "target_vocabulary.txt").exists()
    assert (out / "saved_model" / "saved_model.pb").exists()
    check_png(plot)


# ---------------------------------------------------------------------------
# Generated tasks
# ---------------------------------------------------------------------------


@pytest.mark.slow  # an example end to end (CI time: issue 17)
def test_translate_rnn_defaults_to_the_generated_task_offline(
    examples, generated_dir, tmp_path, capsys
):
    out, plot = tmp_path / "out", tmp_path / "alignment.png"
    argv = ["--smoke", "--model", "rnn", "--data-dir", generated_dir, "--export", str(out)]
    result = examples["translate"].main(argv + ["--plot", str(plot)])
    printed = capsys.readouterr().out
    assert "ted_hrlr_translate/pt_to_en is not prepared" in printed
    assert "Dataset: keras_attn_seq2seq/tiny-reverse, generated locally by keras-attn" in printed
    assert result["dataset"] == "keras_attn_seq2seq/tiny-reverse"
    assert (out / "saved_model" / "saved_model.pb").exists()
    check_png(plot)


@pytest.mark.slow  # an example end to end (CI time: issue 17)
@pytest.mark.parametrize("task", ["sort", "hull"])
def test_pointer(examples, generated_dir, tmp_path, capsys, task):
    out, plot = tmp_path / "out", tmp_path / "pointer.png"
    argv = ["--smoke", "--task", task, "--data-dir", generated_dir, "--export", str(out)]
    result = examples["pointer"].main(argv + ["--plot", str(plot)])
    printed = capsys.readouterr().out
    assert "generated locally by keras-attn" in printed and "whole-sequence accuracy" in printed
    assert 0.0 <= result["accuracy"] <= 1.0
    if task == "hull":
        assert 0.0 <= result["area_coverage"] <= 1.0
    assert (out / "model.keras").exists() and (out / "saved_model" / "saved_model.pb").exists()
    check_png(plot)


# ---------------------------------------------------------------------------
# Dataset choice and the hull helpers (no training)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script, argv",
    [
        ("imdb_classifier", []),
        ("imdb_han", ["--dataset", "imdb_reviews"]),
        ("translate", ["--dataset", "ted_hrlr_translate/pt_to_en"]),
    ],
)
def test_an_unprepared_real_dataset_fails_clearly(examples, tmp_path, script, argv):
    empty = str(tmp_path / "empty")
    with pytest.raises(SystemExit, match=r"is not prepared in .*empty.*\n.*--download"):
        examples[script].main(argv + ["--smoke", "--data-dir", empty])


def test_a_prepared_real_dataset_is_the_translation_default(examples, tmp_path, monkeypatch):
    translate = examples["translate"]
    args = translate.parse_args(["--data-dir", str(tmp_path)])
    assert translate.choose_dataset(args) == "keras_attn_seq2seq/reverse-5-20"
    monkeypatch.setattr(translate.common, "is_prepared", lambda name, data_dir: True)
    assert translate.choose_dataset(args) == "ted_hrlr_translate/pt_to_en"
    args = translate.parse_args(["--dataset", "keras_attn_seq2seq/addition-1-5"])
    assert translate.choose_dataset(args) == "keras_attn_seq2seq/addition-1-5"


def test_the_examples_start_without_tensorflows_notices():
    # As a user's shell runs them (no TF_CPP_MIN_LOG_LEVEL): `common` imports `quiet` first.
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    completed = subprocess.run(
        [sys.executable, "-c", "import common, keras; print(keras.ops.ones(2) + 1)"],
        cwd=EXAMPLES, env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0 and completed.stderr == "", completed.stderr
