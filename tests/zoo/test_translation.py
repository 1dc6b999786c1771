"""Translation on real text: corpus BLEU, the `--attention` families, BLEU in the metrics.

`keras_attn.models.bleu.corpus_bleu` (keras-hub's `Bleu`) is checked against Papineni's
formula written out in NumPy here and against hand-counted cases; the command's flag
without training; the whole command, once, on fixture gettext catalogs (slow): BLEU in
the metrics JSON, the decoding cap from the training targets, a SavedModel that translates.
"""

import collections
import doctest
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.models import bleu, cli, datasets, recipes
from keras_attn.models.datasets import bundled
from keras_attn.models.recipes import seq2seq

# ---------------------------------------------------------------------------
# BLEU
# ---------------------------------------------------------------------------


def reference_bleu(hypotheses, references, max_order=4):
    """Papineni et al.'s corpus BLEU in points, texts split on whitespace."""
    matches, possible = np.zeros(max_order), np.zeros(max_order)
    c = r = 0
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        h, ref = hypothesis.split(), reference.split()
        c, r = c + len(h), r + len(ref)
        for n in range(1, max_order + 1):
            h_counts = collections.Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
            r_counts = collections.Counter(tuple(ref[i : i + n]) for i in range(len(ref) - n + 1))
            matches[n - 1] += sum(min(k, r_counts[g]) for g, k in h_counts.items())  # clipped
            possible[n - 1] += max(len(h) - n + 1, 0)
    if c == 0 or (matches == 0).any():
        return 0.0
    brevity = min(1.0, np.exp(1 - r / c))
    return 100 * brevity * np.exp(np.mean(np.log(matches / possible)))


PAIRS = [  # (hypothesis, reference): no punctuation, so 13a splits them on whitespace
    ("the cat sat on the mat", "the cat sat on the mat"),
    ("a cat is on the mat today", "there is a cat on the mat"),
    ("save the changes to this page", "save your changes to the page"),
    ("this field is required", "this field is required"),
    ("the page was not found on this server", "the requested page was not found"),
]


def test_bleu_equals_papineni_formula_in_numpy():
    hypotheses, references = zip(*PAIRS, strict=True)
    expected = reference_bleu(hypotheses, references)
    assert 0 < expected < 100
    assert bleu.corpus_bleu(hypotheses, references) == pytest.approx(expected, abs=1e-3)
    for order in (1, 2, 3):
        assert bleu.corpus_bleu(hypotheses, references, order) == pytest.approx(
            reference_bleu(hypotheses, references, order), abs=1e-3
        )


def test_bleu_by_hand():
    # Papineni's example: 7 words "the", clipped to the reference's 2: p1 = 2/7, c >= r.
    assert bleu.corpus_bleu(["the the the the the the the"], ["the cat is on the mat"], 1) == (
        pytest.approx(100 * 2 / 7, abs=1e-3)
    )
    # Short: p1 = p2 = 1 but c = 2 < r = 6: brevity penalty exp(1 - 6/2).
    assert bleu.corpus_bleu(["the cat"], ["the cat sat on the mat"], 2) == pytest.approx(
        100 * np.exp(-2), abs=1e-3
    )
    # 13a tokenization: punctuation apart, so "mat." and "mat ." are the same words.
    assert bleu.corpus_bleu(["the cat sat on the mat."], ["the cat sat on the mat ."]) == 100
    # No 4-gram matches anywhere: 0 without smoothing; nothing decoded: 0.
    assert bleu.corpus_bleu(["the cat"], ["the cat"]) == 0
    assert bleu.corpus_bleu(["", " "], ["a b c d", "e f g h"]) == 0


def test_bleu_refuses_what_it_cannot_score():
    with pytest.raises(ValueError, match="same length. Received: 2 hypotheses and 1"):
        bleu.corpus_bleu(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="non-empty"):
        bleu.corpus_bleu([], [])
    with pytest.raises(TypeError, match="`hypotheses` must be strings. Received: bytes"):
        bleu.corpus_bleu([b"a b"], ["a b"])


def test_bleu_docstring_example():
    assert doctest.testmod(bleu).failed == 0


# ---------------------------------------------------------------------------
# --attention: the RNN with additive attention or none, where a task takes it
# ---------------------------------------------------------------------------


def run(capsys, *argv):
    try:
        status = cli.main(list(argv))
    except SystemExit as exit:  # argparse refuses a value
        status = exit.code
    out, err = capsys.readouterr()
    return status, out, err


class Stop(Exception):
    """Raised in place of training: `main` stops before it writes anything."""


@pytest.fixture
def trained_settings(monkeypatch):
    """Records the `Settings` a command would train with, and trains nothing."""
    seen = []

    def train(task, settings=None):
        seen.append((task, settings))
        raise Stop

    monkeypatch.setattr(recipes, "train", train)
    return seen


@pytest.mark.parametrize(
    "task,value", [("ted-translate", "additive"), ("ted-translate", "none"),
                   ("rnn-attention-reverse", "none"), ("ted-translate", None)],
)  # fmt: skip
def test_attention_flag_reaches_the_settings(task, value, trained_settings):
    flags = ["--attention", value] if value else []
    with pytest.raises(Stop):
        cli.main(["train", task, *flags])
    assert trained_settings == [(task, trained_settings[0][1])]
    assert trained_settings[0][1].attention == value


@pytest.mark.parametrize(
    "task,flags,message",
    [
        ("transformer-reverse", ["--attention", "none"],
         "argument --attention: does not apply to transformer-reverse (only to "
         "rnn-attention-reverse, ted-translate). Received: 'none'"),
        ("pointer-sort", ["--attention", "additive"], "--attention: does not apply to"),
        ("ted-translate", ["--attention", "dot"], "--attention: invalid choice: 'dot'"),
    ],
)  # fmt: skip
def test_attention_flag_refused_with_one_line(task, flags, message, trained_settings, capsys):
    status, out, err = run(capsys, "train", task, *flags)
    assert status == 2 and out == "" and trained_settings == []
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_families():
    assert seq2seq._family("transformer", None) == ("transformer", None)
    assert seq2seq._family("rnn", None) == ("rnn", "additive")
    assert seq2seq._family("transformer", "additive") == ("rnn", "additive")
    assert seq2seq._family("transformer", "none") == ("rnn", None)
    with pytest.raises(ValueError, match="`attention` must be None or one of .*attention='dot'"):
        seq2seq._family("rnn", "dot")


# ---------------------------------------------------------------------------
# The whole command on real-looking catalogs (slow)
# ---------------------------------------------------------------------------

CATALOG = "".join(
    f'msgid "{en}"\nmsgstr "{pt}"\n\n'
    for en, pt in [
        ("Save", "Salvar"), ("Delete", "Apagar"), ("Search", "Buscar"),
        ("This field is required.", "Este campo é obrigatório."),
        ("Enter a valid date.", "Informe uma data válida."),
        ("Enter a valid email address.", "Informe um endereço de email válido."),
    ]
    + [(f"Page {i}", f"Página {i}") for i in range(40)]
)  # fmt: skip


@pytest.fixture
def catalogs(tmp_path, monkeypatch):
    """`django` and `sphinx` folders with one pt_BR catalog, where the builder looks."""
    roots = {}
    for package in ("django", "sphinx"):
        folder = tmp_path / package / "locale" / "pt_BR" / "LC_MESSAGES"
        folder.mkdir(parents=True)
        (folder / f"{package}.po").write_text(CATALOG if package == "django" else "", "utf-8")
        roots[package] = str(tmp_path / package)
    monkeypatch.setattr(bundled, "package_dir", lambda name: roots[name])


@pytest.mark.slow  # trains, exports and serves (about 20 s on 2 cores)
def test_translate_command_exports_a_translator_and_writes_bleu(catalogs, tmp_path, capsys):
    name, data_dir, out = "keras_attn_ui_strings/pt_to_en", str(tmp_path / "tfds"), tmp_path / "out"
    status, stdout, _ = run(
        capsys, "train", "ted-translate", "--dataset", name, "--data-dir", data_dir,
        "--attention", "none", "--epochs", "1", "--batch-size", "16", "--output", str(out),
    )  # fmt: skip
    assert status == 0, stdout
    metrics = json.loads((out / "ted-translate_metrics.json").read_text())
    assert metrics["dataset"] == name and metrics["attention"] == "none"
    assert 0 <= metrics["bleu"] <= 100 and "bleu: " in stdout
    assert not (out / "ted-translate_attention.png").exists()  # no attention, nothing to draw

    text_model = keras.saving.load_model(out / "ted-translate.keras", safe_mode=True)
    assert "attention" not in {layer.name for layer in text_model.seq2seq.layers}
    train = list(datasets.load(name, "train", data_dir).as_numpy_iterator())
    longest = max(len(english.split()) for _, english in train)
    assert text_model.max_length == longest + 1  # the training targets' words and the end
    sources = [len(pt.decode().split()) for pt, _ in train]  # what `predict` compares with
    assert (
        text_model.trained_lengths
        == (min(sources), max(sources))
        == (text_model.trained_lengths[0], text_model.source_length)
    )

    served = tf.saved_model.load(str(out / "ted-translate_savedmodel"))
    english = served.signatures["serving_default"](text=tf.constant(["Salvar", "Página 3"]))
    assert english["text"].dtype == tf.string and english["text"].shape == (2,)


def test_lengths_count_the_fewest_and_most_words_of_a_string_across_batches():
    rng = np.random.default_rng(0)
    counts = rng.integers(2, 12, 5000)  # more strings than one batch of the count (4096)
    counts[4500], counts[4700] = 17, 1  # the longest and the shortest, in the second batch
    texts = [" ".join(["w"] * int(n)) for n in counts] + ["", "  a   b  ", "a\u00a0b\u3000c"]
    assert seq2seq._lengths(tf.data.Dataset.from_tensor_slices(texts)) == (1, 17)  # blank: none
    assert seq2seq._lengths(tf.data.Dataset.from_tensor_slices(["a\u00a0b", "c d e"])) == (2, 3)
    assert seq2seq._lengths(tf.data.Dataset.from_tensor_slices(["", " "])) == (1, 1)
