"""The `transformer-lm` task: `TextLanguageModel` (a prompt in, its continuation out), its
SavedModel called by TensorFlow alone, `keras-attn predict`, and the recipe end to end.

The references are independent of the text model's code: prompts tokenized by a Python
dict, continued by the uncached full pass (each new token the argmax of the model's logits
on the prompt and the tokens so far, padding and `[UNK]` ruled out), and joined back by hand.
The model favours `[UNK]` everywhere (`favour_token`): without its suppression every
continuation would be `[UNK]`s.
"""

import io
import json
import os
import sys
import unicodedata
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import models
from keras_attn.models import cli, text
from keras_attn.models.recipes import language_model
from model_checks import favour_token
from tensorflow_alone import tensorflow_alone

pytestmark = pytest.mark.tensorflow_only

WORDS = ["", "[UNK]", "<s>", "</s>", "the", "movie", "is", "a", "good", "bad", ".", "!", "it's",
         "café", "crème"]  # fmt: skip
PROMPTS = [
    "the movie is", "It's GOOD!", "", "zz the bad movie is a good movie is a bad one",
    "Un CAFÉ\u00a0crème,\u2003bon.",  # letters beyond ASCII, Unicode spaces
]  # fmt: skip
MAX_LENGTH, PROMPT_LENGTH = 6, 8


@pytest.fixture(scope="module")
def text_model():
    keras.utils.set_random_seed(3)
    model = models.transformer_lm(
        len(WORDS), num_layers=1, num_heads=2, d_model=16, intermediate_dim=32,
        sequence_length=16, dropout=0.0,
    )  # fmt: skip
    favour_token(model, WORDS.index("[UNK]"))
    return text.TextLanguageModel(model, text.string_lookup(WORDS), MAX_LENGTH, PROMPT_LENGTH)


def reference_words(text):
    """Lowercased; a character neither a letter, a digit, a combining mark, `'` or `-` nor a
    space (Python's `str.split`) is a word of its own (Unicode's categories)."""
    marked = (
        c if c.isspace() or unicodedata.category(c)[0] in "LNM" or c in "'-" else f" {c} "
        for c in text.lower()
    )
    return "".join(marked).split()


def reference_ids(texts):
    """`<s>` and the last 8 words, lowercased, punctuation apart, looked up in a dict."""
    index = {word: i for i, word in enumerate(WORDS)}
    return [[2] + [index.get(w, 1) for w in reference_words(t)[-PROMPT_LENGTH:]] for t in texts]


def test_words_are_unicode_words():
    texts = [
        "Café\u00a0CRÈME, naïve?",
        "e\u0301t\u00e9 x\u3000y\u2028z\u0085w\tv",
        "l'été 2-3 ½ 東京!",
    ]
    split = tf.strings.split(text.split_punctuation(tf.constant(texts)))
    assert [[w.decode() for w in row] for row in split.to_list()] == [
        reference_words(t) for t in texts
    ]
    assert reference_words(texts[0]) == ["café", "crème", ",", "naïve", "?"]


def reference_continue(model, texts, suppress=(1,)):
    """Greedy by the uncached full pass on each unpadded prompt, stopped at `</s>` (3);
    padding (0) and the `suppress` ids (`[UNK]`, 1) never generated."""
    outputs = []
    for row in reference_ids(texts):
        tokens, words = list(row), []
        for _ in range(MAX_LENGTH):
            logits = keras.ops.convert_to_numpy(model(np.array([tokens], "int32")))[0, -1]
            logits[[0, *suppress]] = -np.inf
            token = int(np.argmax(logits))
            if token == 3:
                break
            tokens.append(token)
            words.append(WORDS[token])
        outputs.append(" ".join(words))
    return outputs


def test_prompts_are_tokenized_as_the_reference(text_model):
    ids = np.asarray(text_model.prompt_ids(PROMPTS))
    expected = reference_ids(PROMPTS)
    assert ids.shape == (5, PROMPT_LENGTH + 1)  # right-padded; the longest: <s> + its last 8
    for row, reference in zip(ids, expected, strict=True):
        assert row[row != 0].tolist() == reference and row[len(reference) :].sum() == 0
    assert expected[2] == [2]  # an empty prompt: the start token alone
    assert expected[4] == [2, 1, 13, 14, 1, 1, 10]  # un café crème , bon .
    sequences = np.asarray(text_model.sequence_ids(["It's GOOD!"]))
    assert sequences.tolist() == [[2, 12, 8, 11, 3]]  # training sequences end with </s>


def test_greedy_continuation_equals_the_full_pass(text_model):
    outputs = text_model.predict_text(PROMPTS)
    assert outputs == reference_continue(text_model.language_model, PROMPTS)
    assert any(outputs)  # (an untrained model still emits words)


def test_oov_is_never_generated(text_model, tmp_path):
    """Greedy, sampled and beam: no `[UNK]`; with `suppress_tokens=()` (kept by `.keras`),
    the model's `[UNK]`s."""
    model, lookup = text_model.language_model, text_model.lookup
    free = text.TextLanguageModel(model, lookup, MAX_LENGTH, PROMPT_LENGTH, suppress_tokens=())
    unknown = free.predict_text(PROMPTS)
    assert unknown == reference_continue(model, PROMPTS, suppress=())
    assert all(o.split()[0] == "[UNK]" for o in unknown)  # the case: [UNK] comes first
    for generation in [{}, dict(sampler="beam", beam_width=2)] + [
        dict(sampler="sample", seed=seed, temperature=2.0) for seed in range(3)
    ]:
        outputs = text_model.predict_text(PROMPTS, **generation)
        assert any(outputs) and "[UNK]" not in " ".join(outputs), generation
    assert text_model.get_config()["suppress_tokens"] == ["[UNK]"]
    free.save(tmp_path / "free.keras")
    reloaded = keras.saving.load_model(tmp_path / "free.keras", safe_mode=True)
    assert reloaded.suppress_tokens == () and reloaded.predict_text(PROMPTS) == unknown


def test_sampling_is_seeded(text_model):
    first = text_model.predict_text(PROMPTS, sampler="sample", top_k=5, seed=7)
    assert text_model.predict_text(PROMPTS, sampler="sample", top_k=5, seed=7) == first
    tokens = text_model.continue_ids(PROMPTS, sampler="sample", top_k=5, seed=7)
    assert tokens.shape == (5, MAX_LENGTH) and tokens.dtype == np.int32


def test_no_prompts_no_continuations(text_model):
    for empty in ([], np.array([], str), tf.constant([], tf.string)):
        assert text_model.predict_text(empty) == []
        assert text_model.predict_text(empty, sampler="sample", seed=1) == []
        assert text_model.continue_ids(empty).shape == (0, MAX_LENGTH)
        assert text_model.outside_training(empty) == []


def test_predict_names_predict_text_and_warns_of_unknown_words(text_model):
    with pytest.raises(TypeError, match="`predict` takes token ids.*`predict_text\\(texts\\)`"):
        text_model.predict(["the movie is"])
    assert text_model.outside_training(PROMPTS) == [
        "2 of 5 inputs have words outside its vocabulary (each read as [UNK])"
    ]  # no lengths: any prompt length is fine


def test_bad_arguments(text_model):
    with pytest.raises(TypeError, match="`text` must be strings"):
        text_model.predict_text(np.array([1, 2]))
    with pytest.raises(TypeError, match=r"`text` must be strings. Received: text\[1\]=3 \(int\)"):
        text_model.predict_text(["the movie", 3])
    with pytest.raises(TypeError, match="`text` must be a batch of strings"):
        text_model.predict_text("the movie")
    lookup = text.string_lookup(WORDS)
    with pytest.raises(ValueError, match="must fit in the model's sequence_length=16"):
        text.TextLanguageModel(text_model.language_model, lookup, 10, 7)
    with pytest.raises(ValueError, match="`max_length` must be a positive integer"):
        text.TextLanguageModel(text_model.language_model, lookup, 0, 7)
    with pytest.raises(ValueError, match="`end_token` must be a token of the vocabulary"):
        text.TextLanguageModel(text_model.language_model, lookup, 4, 4, end_token="<end>")
    with pytest.raises(ValueError, match="`suppress_tokens` must be a list or tuple.*'\\[UNK\\]'"):
        text.TextLanguageModel(text_model.language_model, lookup, 4, 4, suppress_tokens="[UNK]")
    with pytest.raises(ValueError, match="`suppress_tokens` must be a token of the vocabulary"):
        text.TextLanguageModel(text_model.language_model, lookup, 4, 4, suppress_tokens=["zz"])
    classifier = models.transformer_classifier(10, 4, 2, num_layers=1, d_model=8)
    with pytest.raises(ValueError, match="must be built by keras_attn.models.transformer_lm"):
        text.TextLanguageModel(classifier, lookup, 4, 4)


@pytest.mark.slow  # the export and a TensorFlow-alone subprocess: ~100 s on 2 busy cores
def test_keras_file_savedmodel_and_predict_command(text_model, tmp_path, capsys, monkeypatch):
    path = tmp_path / "transformer-lm.keras"
    text_model.save(path)
    with zipfile.ZipFile(path) as archive:
        (vocabulary,) = [n for n in archive.namelist() if n.endswith("vocabulary.txt")]
        assert archive.read(vocabulary).decode().split("\n") == WORDS
    expected = text_model.predict_text(PROMPTS)
    reloaded = text.load_run("transformer-lm", str(tmp_path))
    assert isinstance(reloaded, text.TextLanguageModel)
    assert reloaded.predict_text(PROMPTS) == expected

    reloaded.export_text(str(tmp_path / "savedmodel"))
    assert os.listdir(tmp_path / "savedmodel" / "assets") == ["vocabulary.txt"]
    assert tensorflow_alone(tmp_path / "savedmodel", PROMPTS) == {"text": expected}
    loaded = tf.saved_model.load(str(tmp_path / "savedmodel"))  # the token signatures
    prompts = np.asarray(text_model.prompt_ids(PROMPTS), "int64")
    np.testing.assert_array_equal(
        loaded.greedy_decode(tf.constant(prompts)), text_model.continue_ids(PROMPTS)
    )
    logits = loaded.serve(tf.constant(prompts))
    np.testing.assert_allclose(logits, text_model.language_model(prompts), atol=1e-5)
    empty = loaded.signatures["serving_default"](text=tf.constant([], tf.string))["text"]
    assert empty.shape == (0,)  # no prompts, no continuations

    runs = ["--runs-dir", str(tmp_path)]
    assert cli.main(["predict", "transformer-lm", *PROMPTS[:2], *runs]) == 0
    assert capsys.readouterr().out.split("\n") == [*expected[:2], ""]
    monkeypatch.setattr(sys, "stdin", io.StringIO("the movie is\n"))
    assert cli.main(["predict", "transformer-lm", *runs]) == 0
    assert capsys.readouterr().out == f"{expected[0]}\n"


def test_the_baseline_has_about_the_transformers_weights():
    keras.utils.set_random_seed(0)
    transformer = models.transformer_lm(500, sequence_length=16)  # d_model 64
    units = language_model.lstm_units(transformer.count_params(), 500, 64)
    baseline = language_model.lstm_lm(500, 64, units)
    assert abs(baseline.count_params() / transformer.count_params() - 1) < 0.01
    tokens = np.array([[5, 6, 7, 0, 0], [8, 9, 0, 0, 0]], "int32")
    logits = keras.ops.convert_to_numpy(baseline(tokens))
    assert logits.shape == (2, 5, 500)
    changed = tokens.copy()
    changed[0, 2] = 11  # a later token changes nothing earlier (left to right)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(baseline(changed))[0, :2], logits[0, :2])


def test_perplexity_counts_real_tokens_only():
    uniform = keras.Sequential([keras.Input((None,), dtype="int32"), keras.layers.Embedding(7, 7)])
    uniform.layers[0].set_weights([np.zeros((7, 7))])  # equal logits: perplexity = V
    targets = np.array([[3, 4, 0, 0], [5, 0, 0, 0]], "int32")
    value, count = language_model.perplexity(uniform, [(targets, targets)])
    assert count == 3 and value == pytest.approx(7.0)


@pytest.mark.slow  # trains end to end (CI time: issue 17)
@pytest.mark.parametrize("baseline", [True, False])
def test_train_predict_and_serve_end_to_end(baseline, tmp_path, capsys, monkeypatch):
    """A tiny run of the recipe through the command line: the real snippets, a tiny model."""
    monkeypatch.setattr(language_model, "TRANSFORMER", dict(num_layers=1, num_heads=2,
                        d_model=16, intermediate_dim=32))  # fmt: skip
    monkeypatch.setattr(language_model, "SAMPLE_SEEDS", (5,))
    monkeypatch.setattr(language_model, "MAX_LENGTH", 8)
    verbosity = []  # what the recipe asks of Keras' progress: stdout here is no terminal
    for method in ("fit", "evaluate", "predict"):
        original = getattr(keras.Model, method)

        def spy(self, *args, _original=original, **kwargs):
            verbosity.append(kwargs.get("verbose", "auto"))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(keras.Model, method, spy)
    out = tmp_path / "out"
    status = cli.main([
        "train", "transformer-lm", "--data-dir", str(tmp_path / "tfds"), "--epochs", "1",
        "--train-examples", "256", "--test-examples", "32", "--output", str(out),
        *([] if baseline else ["--no-baseline"]),
    ])  # fmt: skip
    assert status == 0
    printed = capsys.readouterr().out
    assert "trained transformer-lm on keras_attn_rt_polarity" in printed
    assert "Downloading and preparing" not in printed  # generated here, nothing downloaded
    assert verbosity == [2] * (2 if baseline else 1)  # one line per epoch, no redrawn bar
    metrics = json.loads((out / "transformer-lm_metrics.json").read_text())
    assert metrics["perplexity"] > 1 and metrics["epochs"] == 1 and metrics["test_tokens"] > 32
    if baseline:
        assert metrics["baseline_perplexity"] > 1
        ratio = metrics["baseline_parameters"] / metrics["parameters"]
        assert abs(ratio - 1) < 0.01
        assert "lstm" in printed
    else:  # the LSTM neither trained nor reported
        assert not [key for key in metrics if key.startswith("baseline")], metrics
        assert "lstm" not in printed
    controls = [(1.0, 0), (1.2, 0), (1.0, 3), (1.0, 0)]  # plain, penalty, n-grams; then sampled
    assert [
        (s["prompt"], s["seed"], s["repetition_penalty"], s["no_repeat_ngram_size"])
        for s in metrics["samples"]
    ] == [
        (p, seed, *control)
        for seed, control in zip((None, None, None, 5), controls, strict=True)
        for p in language_model.PROMPTS
    ]
    assert (out / "transformer-lm_attention.png").read_bytes()[:4] == b"\x89PNG"

    assert cli.main(["predict", "transformer-lm", "the movie is", "--runs-dir", str(out)]) == 0
    continuation = capsys.readouterr().out
    assert continuation.endswith("\n") and continuation.count("\n") == 1
    # (TensorFlow alone loads an export in test_keras_file_savedmodel_and_predict_command.)
    loaded = tf.saved_model.load(str(out / "transformer-lm_savedmodel"))
    served = loaded.signatures["serving_default"](text=tf.constant(["the movie is"]))["text"]
    assert served.numpy()[0].decode() == continuation[:-1]
    greedy = [s["text"] for s in metrics["samples"] if s["seed"] is None]
    assert continuation[:-1] == greedy[0]  # the recipe's greedy sample of the same prompt
