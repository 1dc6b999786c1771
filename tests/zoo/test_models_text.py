"""Text in, text out (`keras_attn.models.text`): the zoo's models with their vocabularies.

Each check compares with an independent reference: the words looked up in a Python dict,
decoded by `greedy_decode` on those ids, and joined back by hand (seq2seq); NumPy's softmax
of the token model's logits (classifiers). The SavedModels are loaded in a process where
`keras` and `keras_attn` cannot be imported: TensorFlow alone.
"""

import json
import os
import sys
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import models
from keras_attn.models import cli, text
from tensorflow_alone import tensorflow_alone

pytestmark = pytest.mark.tensorflow_only

SOURCE = ["", "[UNK]"] + list("abcdefgh")
TARGET = ["", "[UNK]", "<s>", "</s>"] + list("abcdefgh")
# blank, OOV, too long; Unicode spaces (no-break, ideographic, line separator) separate words
TEXTS = ["a b c", "h g", "", "   ", "a zz b", "a b c d e f g h a b", "a\u00a0b\u3000c\u2028d"]


@pytest.fixture(scope="module")
def seq2seq_model():
    keras.utils.set_random_seed(1)
    model = models.transformer_seq2seq(
        len(SOURCE), len(TARGET), num_layers=1, num_heads=2, d_model=16, intermediate_dim=32
    )
    return text.TextSeq2Seq(model, text.string_lookup(SOURCE), text.string_lookup(TARGET), 6, 7)


def reference_decode(text_model, texts):
    """The text path by hand: dict lookup, first 6 words, greedy ids, words before </s>."""
    index = {word: i for i, word in enumerate(SOURCE)}
    rows = [[index.get(w, 1) for w in t.split()][:6] for t in texts]
    ids = np.zeros((len(rows), max(1, max(map(len, rows)))), "int32")
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    tokens = np.asarray(models.greedy_decode(text_model.seq2seq, ids, 7, 2, 3))
    outputs = []
    for row, source in zip(tokens, rows, strict=True):
        words = []
        for token in row:
            if token == 3:
                break
            if token:
                words.append(TARGET[token])
        outputs.append(" ".join(words) if source else "")
    return outputs


def test_seq2seq_text_path_equals_the_reference(seq2seq_model):
    outputs = seq2seq_model.predict_text(TEXTS)
    assert outputs == reference_decode(seq2seq_model, TEXTS)
    assert outputs[2] == outputs[3] == ""  # empty and blank inputs: empty outputs
    assert any(outputs)  # (an untrained model still emits words)


def test_bad_text_inputs(seq2seq_model):
    ids = np.asarray(seq2seq_model.source_ids(["a zz b", "a b c d e f g h a b", ""]))
    assert ids.shape == (3, 6)  # truncated to source_length = 6
    np.testing.assert_array_equal(ids[0, :3], [2, 1, 3])  # zz: the OOV id
    np.testing.assert_array_equal(ids[1], [2, 3, 4, 5, 6, 7])  # the first 6 words
    np.testing.assert_array_equal(ids[2], 0)
    assert np.asarray(seq2seq_model.source_ids([""])).shape == (1, 1)  # never a 0-length source
    with pytest.raises(TypeError, match="`text` must be strings. Received: text with dtype=int"):
        seq2seq_model.predict_text(np.array([1, 2]))
    with pytest.raises(TypeError, match="`text` must be strings.*dtype=int32"):
        seq2seq_model.predict_text(tf.constant([1, 2]))
    with pytest.raises(TypeError, match="`text` must be a batch of strings"):
        seq2seq_model.predict_text("a b")
    with pytest.raises(ValueError, match="`text` must have shape"):
        seq2seq_model.predict_text([["a b"]])


@pytest.mark.parametrize(
    "empty", [[], (), np.array([]), np.array([], str), tf.constant([], tf.string)]
)
def test_an_empty_batch_gives_an_empty_result(seq2seq_model, empty):
    assert seq2seq_model.predict_text(empty) == []
    assert np.asarray(seq2seq_model.source_ids(empty)).shape[0] == 0


def test_text_must_be_strings_item_by_item(seq2seq_model, classifier_model):
    """NumPy would read `["a", 3]` as the words "a" and "3": each item is checked instead."""
    for model in (seq2seq_model, classifier_model):
        with pytest.raises(
            TypeError, match=r"`text` must be strings. Received: text\[1\]=3 \(int\)"
        ):
            model.predict_text(["a", 3])
        with pytest.raises(TypeError, match=r"text\[0\]=None \(NoneType\)"):
            model.predict_text((None, "a"))
        assert model.predict_text([b"a b"]) == model.predict_text(["a b"])  # bytes are text


def test_seq2seq_keras_file_holds_the_vocabularies(seq2seq_model, tmp_path):
    path = tmp_path / "m.keras"
    seq2seq_model.save(path)
    with zipfile.ZipFile(path) as archive:
        vocabularies = [n for n in archive.namelist() if n.endswith("vocabulary.txt")]
        contents = sorted(archive.read(n).decode().split("\n") for n in vocabularies)
    assert len(vocabularies) == 2 and contents == sorted([SOURCE, TARGET])
    reloaded = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(reloaded, text.TextSeq2Seq)
    assert reloaded.predict_text(TEXTS) == seq2seq_model.predict_text(TEXTS)
    # Keras' `predict` takes the token model's inputs; text gets a pointer to `predict_text`.
    for texts in (["a b"], np.array(["a b"]), tf.constant(["a b"])):
        with pytest.raises(TypeError, match="`predict` takes token ids.*`predict_text\\(texts\\)`"):
            reloaded.predict(texts)
    ids = {"encoder_inputs": np.array([[2, 3]]), "decoder_inputs": np.array([[2]])}
    np.testing.assert_allclose(
        reloaded.predict(ids, verbose=0), seq2seq_model.seq2seq(ids), atol=1e-5
    )


def test_seq2seq_savedmodel_takes_text_with_tensorflow_alone(seq2seq_model, tmp_path):
    path = tmp_path / "savedmodel"
    seq2seq_model.export_text(str(path))
    assert sorted(os.listdir(path / "assets")) == ["source_vocabulary.txt", "target_vocabulary.txt"]
    served = tensorflow_alone(path, TEXTS)
    assert served == {"text": seq2seq_model.predict_text(TEXTS)}
    loaded = tf.saved_model.load(str(path))  # the token signatures stay
    empty = loaded.signatures["serving_default"](text=tf.constant([], tf.string))["text"]
    assert empty.shape == (0,)
    source = np.asarray(seq2seq_model.source_ids(TEXTS[:2]))
    np.testing.assert_array_equal(
        loaded.greedy_decode(tf.constant(source, tf.int64)),
        models.greedy_decode(seq2seq_model.seq2seq, source, 7, 2, 3),
    )
    # `generate` (settings per request) and `beam_search` (width 4): Python's tokens, scores
    settings = dict(max_length=5, temperature=0.75, top_k=3, top_p=0.9, seed=-7)
    out = loaded.signatures["generate"](
        text=tf.constant(TEXTS[:2]), repetition_penalty=tf.constant(1.5),
        stop_sequences=tf.constant([], tf.string), min_new_tokens=tf.constant(0),
        **{k: tf.constant(v, tf.float32 if isinstance(v, float) else tf.int32)
           for k, v in settings.items()},
    )  # fmt: skip
    tokens, scores = models.decoding.sample_decode(
        seq2seq_model.seq2seq, source, start_id=2, end_id=3, repetition_penalty=1.5,
        return_scores=True, **settings,
    )  # fmt: skip
    np.testing.assert_array_equal(out["tokens"], tokens)
    np.testing.assert_allclose(out["scores"], scores, atol=1e-5)
    # Stop strings (target words, split at spaces) and `min_new_tokens`, per request: a
    # word the first output made (so the stop acts), Python's `stop_sequences` of its id
    stop = TARGET[int(np.asarray(tokens)[0, 1])]
    out = loaded.signatures["generate"](
        text=tf.constant(TEXTS[:2]), repetition_penalty=tf.constant(1.5),
        stop_sequences=tf.constant([stop]), min_new_tokens=tf.constant(1),
        **{k: tf.constant(v, tf.float32 if isinstance(v, float) else tf.int32)
           for k, v in settings.items()},
    )  # fmt: skip
    stopped = models.decoding.sample_decode(
        seq2seq_model.seq2seq, source, start_id=2, end_id=3, repetition_penalty=1.5,
        stop_sequences=[[TARGET.index(stop)]], min_new_tokens=1, **settings,
    )  # fmt: skip
    np.testing.assert_array_equal(out["tokens"], stopped)
    assert not np.array_equal(stopped, tokens)
    beams = loaded.signatures["beam_search"](text=tf.constant(TEXTS[:2]))
    tokens, score = models.beam_search(seq2seq_model.seq2seq, source, 7, 2, 3, jit_compile=False)
    words = [" ".join(TARGET[t] for t in row if t) for row in np.where(
        np.cumsum(tokens == 3, axis=1) > 0, 0, tokens)]  # fmt: skip
    assert [t.decode() for t in beams["text"].numpy()] == words
    np.testing.assert_allclose(beams["score"], score, atol=1e-5)
    with pytest.raises(ValueError, match="`beam_width` must be a positive integer. Received: "):
        seq2seq_model.export_text(str(tmp_path / "none"), beam_width=0)


REVIEWS = [
    "A fine film.\u00a0I liked it!<br />Great\u2003acting",  # a no-break space, an em space
    "Terrible. Boring plot? Yes",
    "",
    "unseenword " * 40,
]


@pytest.fixture(scope="module", params=["transformer", "han"])
def classifier_model(request):
    keras.utils.set_random_seed(2)
    han = request.param == "han"
    vectorizer = keras.layers.TextVectorization(50, output_sequence_length=4 if han else 12)
    vectorizer.adapt(["a fine film i liked it great acting", "terrible boring plot yes"])
    size = vectorizer.vocabulary_size()
    if han:
        model = models.hierarchical_attention_network(size, 8, 4, 4, 2, 3, 4)
    else:
        model = models.transformer_classifier(
            size, 12, 2, num_layers=1, num_heads=2, d_model=8, intermediate_dim=16
        )
    return text.TextClassifier(
        model, vectorizer, ["neg", "pos"], max_sentences=3 if han else None, markup="<br />"
    )


def test_classifier_text_path_equals_the_reference(classifier_model):
    ids = np.asarray(classifier_model.token_ids(REVIEWS))
    vocabulary = {w: i for i, w in enumerate(classifier_model.vectorizer.get_vocabulary())}

    def vectorize(sentence, length):
        words = "".join(c for c in sentence.lower() if c.isalnum() or c.isspace()).split()
        return ([vocabulary.get(w, 1) for w in words] + [0] * length)[:length]

    if classifier_model.max_sentences:  # documents (B, 3 sentences, 4 words)
        assert ids.shape == (4, 3, 4)
        assert ids[0].tolist() == [vectorize(s, 4) for s in ("A fine film.", "I liked it!",
                                                             "Great acting")]  # fmt: skip
        np.testing.assert_array_equal(ids[2], 0)
    else:
        assert ids.shape == (4, 12)
        assert ids[0].tolist() == vectorize("A fine film. I liked it! Great acting", 12)
        assert ids[3].tolist() == [1] * 12  # unknown words: OOV; too long: truncated
    labels, probabilities = classifier_model.classify(REVIEWS)
    logits = np.asarray(classifier_model.classifier(ids)).astype("float64")
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(probabilities, expected, atol=1e-6)
    assert labels == [["neg", "pos"][i] for i in expected.argmax(-1)]
    assert classifier_model.predict_text(REVIEWS) == labels


def test_classifier_keras_file_and_savedmodel(classifier_model, tmp_path):
    classifier_model.save(tmp_path / "m.keras")
    reloaded = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    labels, probabilities = classifier_model.classify(REVIEWS)
    again = reloaded.classify(REVIEWS)
    assert again[0] == labels
    np.testing.assert_allclose(again[1], probabilities, atol=1e-6)
    reloaded.export_text(str(tmp_path / "savedmodel"))
    assert os.listdir(tmp_path / "savedmodel" / "assets") == ["vocabulary.txt"]
    served = tensorflow_alone(tmp_path / "savedmodel", REVIEWS)
    assert served["label"] == labels
    np.testing.assert_allclose(served["probabilities"], probabilities, atol=1e-5)
    loaded = tf.saved_model.load(str(tmp_path / "savedmodel"))
    empty = loaded.signatures["serving_default"](text=tf.constant([], tf.string))
    assert empty["label"].shape == (0,) and empty["probabilities"].shape == (0, 2)
    assert reloaded.predict_text([]) == [] and reloaded.classify([])[1].shape == (0, 2)


def test_predict_command_and_load_run(seq2seq_model, tmp_path, capsys, monkeypatch):
    seq2seq_model.save(tmp_path / "transformer-reverse.keras")
    expected = seq2seq_model.predict_text(TEXTS[:2])
    assert text.load_run("transformer-reverse", str(tmp_path)).predict_text(TEXTS[:2]) == expected
    runs = ["--runs-dir", str(tmp_path)]
    assert cli.main(["predict", "transformer-reverse", *TEXTS[:2], *runs]) == 0
    assert capsys.readouterr().out.split("\n") == [*expected, ""]
    # Options anywhere: before the task, between the task and the texts, after the texts.
    for argv in (
        ["predict", *runs, "transformer-reverse", *TEXTS[:2]],
        ["predict", "transformer-reverse", *runs, *TEXTS[:2]],
        ["predict", "transformer-reverse", TEXTS[0], *runs, TEXTS[1]],
    ):
        assert cli.main(argv) == 0, argv
        assert capsys.readouterr().out.split("\n") == [*expected, ""], argv
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO("a b c\nh g\n"))
    assert cli.main(["predict", "transformer-reverse", *runs]) == 0
    assert capsys.readouterr().out.split("\n") == [*expected, ""]
    assert cli.main(["predict", "imdb-han", *runs]) == 1
    err = capsys.readouterr().err
    assert "No run of 'imdb-han'" in err and "keras-attn train imdb-han" in err
    # An unknown task: the tasks that `predict` takes, no advice to train it.
    assert cli.main(["predict", "no-such-task", *runs]) == 1
    err = capsys.readouterr().err
    assert "'no-such-task' is no task of keras-attn" in err and "train no-such-task" not in err
    assert "transformer-reverse, rnn-attention-reverse" in err and "pointer-sort" not in err
    assert cli.main(["predict", "pointer-sort", *runs]) == 1  # a task, but not a text task
    err = capsys.readouterr().err
    assert "'pointer-sort' is no text task" in err and "train pointer-sort" not in err
    models.transformer_classifier(10, 4, 2, num_layers=1, d_model=8).save(tmp_path / "x.keras")
    assert cli.main(["predict", "x", *runs]) == 1
    assert "holds no text model" in capsys.readouterr().err


def test_predict_warns_of_inputs_outside_the_training_data(seq2seq_model, tmp_path, capsys):
    """One warning per kind and run, on stderr, counting the inputs: shorter or longer than
    the training sources (a model that stores their lengths), or with words outside the
    vocabulary. The outputs are unchanged."""
    trained = text.TextSeq2Seq(
        seq2seq_model.seq2seq, seq2seq_model.source_lookup, seq2seq_model.target_lookup,
        6, 7, trained_lengths=(3, 5),
    )  # fmt: skip
    assert trained.get_config()["trained_lengths"] == [3, 5]
    trained.save(tmp_path / "transformer-reverse.keras")
    texts = ["a b", "h g", "a b c d", "a zz b", "", "a b c d e f g h a b", "x y"]
    expected = seq2seq_model.predict_text(texts)
    assert trained.predict_text(texts) == expected
    assert trained.outside_training(texts) == [
        "3 of 7 inputs are shorter than the sources it was trained on (3-5 words)",
        "1 of 7 inputs is longer than the sources it was trained on (3-5 words)",
        "2 of 7 inputs have words outside its vocabulary (each read as [UNK])",
    ]
    assert trained.outside_training(["a b c", "h g f e d", ""]) == []  # blank: no words
    status = cli.main(["predict", "transformer-reverse", *texts, "--runs-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert status == 0 and out.split("\n") == [*expected, ""]
    lines = err.splitlines()
    assert len(lines) == 3 and all(
        line.startswith("keras-attn predict: warning: ") for line in lines
    )
    assert "3 of 7 inputs are shorter than the sources it was trained on (3-5 words)" in lines[0]
    # A model without stored lengths (one written before they were stored, its config without
    # the key): it loads, and warns of unknown words only.
    assert seq2seq_model.get_config()["trained_lengths"] is None
    older = tmp_path / "older.keras"
    with zipfile.ZipFile(tmp_path / "transformer-reverse.keras") as saved:
        with zipfile.ZipFile(older, "w") as written:
            for item in saved.infolist():
                data = saved.read(item)
                if item.filename == "config.json":
                    config = json.loads(data)
                    del config["config"]["trained_lengths"]
                    data = json.dumps(config)
                written.writestr(item, data)
    older = keras.saving.load_model(older, safe_mode=True)
    assert older.trained_lengths is None and older.predict_text(texts) == expected
    assert older.outside_training(texts) == trained.outside_training(texts)[2:]
    with pytest.raises(ValueError, match=r"`trained_lengths` must be None or .*\(5, 3\)"):
        text.TextSeq2Seq(
            trained.seq2seq,
            trained.source_lookup,
            trained.target_lookup,
            6,
            7,
            trained_lengths=(5, 3),
        )
