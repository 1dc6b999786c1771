"""Generation that serves: the in-graph sampler with tensor settings, and the language
model's exported `generate`, `prefill` / `decode_step` signatures, called by TensorFlow alone,
and `keras-attn predict --stream`.

The references: `sample_tokens` / `greedy_tokens` (the Python draws) for the sampler, and
Python's `keras_attn.models.generate` on the same prompts, settings and seed for the
signatures. (A seq2seq export's `generate` and `beam_search`: tests/zoo/test_models_text.py,
on its SavedModel.)
"""

import keras
import numpy as np
import pytest

from keras_attn.models.generation.samplers import greedy_tokens, sample_tokens
from keras_attn.models.generation.samplers import sample_tokens as sample_tokens_with


def np_(x):
    return keras.ops.convert_to_numpy(x)


@pytest.mark.backends
def test_the_tensor_settings_sampler_draws_sample_tokens_draws():
    """Random logits (ties and a ruled-out id), several settings as tensors: the tokens of
    `sample_tokens` with the same settings (None for off), `greedy_tokens` at temperature 0."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(64, 11)).astype("float32") * 2
    logits[:, 0] = -np.inf  # ruled out, as padding in the loop
    if keras.backend.backend() != "torch":  # (torch's top_k orders ties as k has it)
        logits[::4, 3] = logits[::4, 5]  # ties: the lowest id first
    uniform = rng.uniform(size=64).astype("float32")
    settings = [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 3, 1.0), (1.0, 0, 0.6), (0.75, 4, 0.8),
                (1.0, 1, 1.0), (1.0, 20, 0.9), (1e-40, 0, 1.0)]  # fmt: skip
    for temperature, top_k, top_p in settings:
        tensors = [keras.ops.convert_to_tensor(x, d) for x, d in
                   ((temperature, "float32"), (top_k, "int32"), (top_p, "float32"))]  # fmt: skip
        drawn = np_(sample_tokens_with(logits, uniform, *tensors))
        expected = sample_tokens(logits, uniform, temperature, top_k or None,
                                 top_p if top_p < 1 else None)  # fmt: skip
        np.testing.assert_array_equal(drawn, np_(expected), err_msg=str((temperature, top_k)))
    greedy = sample_tokens_with(logits, uniform, 0.0, 0, 1.0)
    np.testing.assert_array_equal(np_(greedy), np_(greedy_tokens(logits)))
    assert len(set(np_(sample_tokens_with(logits, uniform, 1.0, 0, 1.0)).tolist())) > 3


# ---------------------------------------------------------------------------
# The exported signatures, called by TensorFlow alone
# ---------------------------------------------------------------------------

WORDS = ["", "[UNK]", "<s>", "</s>", "the", "movie", "is", "a", "good", "bad", ".", "!"]
PROMPTS = ["the movie is", "a good", "bad bad bad movie", ""]
MAX_LENGTH, PROMPT_LENGTH, END = 6, 4, 3
# (max_length, temperature, top_k, top_p, seed, repetition_penalty): greedy, sampled
SETTINGS = [
    (6, 0.0, 0, 1.0, 0, 1.0), (6, 1.0, 0, 1.0, 5, 1.0), (4, 0.75, 3, 0.9, -7, 1.5),
    (5, 0.0, 0, 1.0, 0, 2.0), (6, 2.0, 20, 0.8, 123, 1.0),
    (6, 0.0, 0, 1.0, 0, 1e38),  # overflowed seen logits to -inf: padding was generated
]  # fmt: skip
GOOD = dict(max_length=6, temperature=1.0, top_k=0, top_p=1.0, seed=0, repetition_penalty=1.0)
BAD = [("max_length", 7), ("max_length", 0), ("temperature", -1.0), ("temperature", float("nan")),
       ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5), ("repetition_penalty", 0.0),
       ("repetition_penalty", float("inf")), ("min_new_tokens", -1)]  # fmt: skip

GENERATE = """
def generate(loaded, texts, settings):
    dtypes = dict(max_length=tf.int32, top_k=tf.int32, seed=tf.int32, min_new_tokens=tf.int32,
                  stop_sequences=tf.string)  # (no stop strings, no minimum: off)
    settings = {"stop_sequences": [], "min_new_tokens": 0, **settings}
    settings = {k: tf.constant(v, dtypes.get(k, tf.float32)) for k, v in settings.items()}
    out = loaded.signatures["generate"](text=tf.constant(texts, tf.string), **settings)
    return {k: [x.decode() if isinstance(x, bytes) else x for x in v.numpy().tolist()]
            for k, v in out.items()}

def bad(loaded, texts, argument):
    result = {}
    for name, value in argument["bad"]:
        try:
            generate(loaded, texts, {**argument["good"], name: value})
            result[f"{name}={value}"] = None
        except tf.errors.InvalidArgumentError as error:
            result[f"{name}={value}"] = [l for l in error.message.splitlines() if "must" in l]
    return result

argument = json.loads(sys.argv[2])
loaded = tf.saved_model.load(sys.argv[1])
names = ("max_length", "temperature", "top_k", "top_p", "seed", "repetition_penalty")
result = {
    "generate": [
        generate(loaded, argument["texts"], dict(zip(names, s))) for s in argument["settings"]
    ],
    "bad": bad(loaded, argument["texts"], argument),
    "empty": {k: len(v) for k, v in generate(loaded, [], argument["good"]).items()},
    "stops": [generate(loaded, argument["texts"], {**argument["good"], **more})
              for more in argument["stops"]],
}
try:  # a stop string the vocabulary cannot spell
    generate(loaded, argument["texts"], {**argument["good"], "stop_sequences": ["good zebra"]})
except tf.errors.InvalidArgumentError as error:
    result["unspelled"] = [l for l in error.message.splitlines() if "must" in l]
"""

STREAM = """
# A streaming client: `prefill` once, then `decode_step` per token, greedy (the logits come
# with padding and the suppressed tokens ruled out), stopped at the end token.
state = loaded.signatures["prefill"](tokens=tf.constant(argument["prompts"], tf.int64))
step = loaded.signatures["decode_step"]
finished, tokens = None, []
for i in range(argument["max_length"]):
    token = tf.argmax(state["logits"], axis=-1)
    if finished is not None:
        token = tf.where(finished, tf.zeros_like(token), token)
    ended = token == argument["end"]
    finished = ended if finished is None else finished | ended
    tokens.append(token.numpy().tolist())
    if i + 1 < argument["max_length"]:
        cache = {k: state[k] for k in ("keys", "values", "valid", "positions", "index")}
        state = step(token=token, **cache)
result["stream"] = [list(row) for row in zip(*tokens)]
cache["index"] = tf.constant(argument["max_length"])  # past the cache's new positions
try:
    step(token=token, **cache)
except tf.errors.InvalidArgumentError as error:
    result["past"] = [line for line in error.message.splitlines() if "must" in line]
result["modules"] = sorted(m for m in sys.modules if m.startswith("keras"))
print(json.dumps(result))
"""


def _settings_argument(texts, **more):
    return {"texts": texts, "settings": SETTINGS, "good": GOOD, "bad": BAD, **more}


@pytest.fixture(scope="module")
def language_model(tmp_path_factory):
    from keras_attn import models
    from keras_attn.models import text
    from model_checks import favour_token

    keras.utils.set_random_seed(3)
    model = models.transformer_lm(
        len(WORDS), num_layers=1, num_heads=2, d_model=16, intermediate_dim=32,
        sequence_length=12, dropout=0.0,
    )  # fmt: skip
    favour_token(model, WORDS.index("[UNK]"))  # suppressed: the export must rule it out
    text_model = text.TextLanguageModel(model, text.string_lookup(WORDS), MAX_LENGTH, PROMPT_LENGTH)
    path = tmp_path_factory.mktemp("serving") / "lm"
    text_model.export_text(str(path))
    return text_model, path


@pytest.fixture(scope="module")
def served(language_model):
    """What TensorFlow alone gets from the language model's SavedModel (one process)."""
    from tensorflow_alone import run_tensorflow_alone

    text_model, path = language_model
    prompts = np.asarray(text_model.prompt_ids(PROMPTS)).tolist()
    prompts[1] = [0] * prompts[1].count(0) + [t for t in prompts[1] if t]  # left-padded
    argument = _settings_argument(PROMPTS, prompts=prompts, max_length=MAX_LENGTH, end=END)
    argument["stops"] = _stop_settings(text_model)
    result = run_tensorflow_alone(path, GENERATE + STREAM, argument)
    assert result.pop("modules") == []
    return result


def _stop_settings(text_model):
    """The stop strings and minima the signature is called with: a word of row 1's greedy
    output and a two-word string of row 3's (read from Python's tokens), greedy and
    sampled, with and without `min_new_tokens`."""
    tokens = text_model.continue_ids(PROMPTS).tolist()
    ids = [tokens[1][2], tokens[3][3], tokens[3][4]]
    assert min(ids) > END, tokens  # words (not padding, [UNK], <s> or </s>)
    stops = [WORDS[ids[0]], f"{WORDS[ids[1]]} {WORDS[ids[2]]}"]
    greedy, sampled = dict(temperature=0.0), dict(temperature=0.75, top_k=3, seed=5)
    return [
        dict(greedy, stop_sequences=stops), dict(greedy, stop_sequences=stops, min_new_tokens=3),
        dict(sampled, stop_sequences=stops[:1], min_new_tokens=2), dict(greedy, min_new_tokens=4),
    ]  # fmt: skip


def _python_generation(text_model, max_length, temperature, top_k, top_p, seed, penalty):
    """Python's `generate` for the signature's settings (0, 1: off; temperature 0: greedy),
    eager (its XLA loop draws the same tokens: tests/decoding; an XLA compile costs ~5 s)."""
    from keras_attn.models import generate

    prompts = np.asarray(text_model.prompt_ids(PROMPTS))
    sampling = dict(sampler="sample", temperature=temperature, top_k=top_k or None,
                    top_p=top_p if top_p < 1 else None, seed=seed)  # fmt: skip
    return generate(
        text_model.language_model, prompts, max_length, END, suppress_ids=(1,),
        repetition_penalty=penalty, return_scores=True, jit_compile=False,
        **(sampling if temperature else {}),
    )  # fmt: skip


def _before_end(row):
    return row[: row.index(END)] if END in row else row


@pytest.mark.tensorflow_only
def test_generate_signature_equals_python_generate(language_model, served):
    text_model, _ = language_model
    for settings, out in zip(SETTINGS, served["generate"], strict=True):
        tokens, scores = _python_generation(text_model, *settings)
        np.testing.assert_array_equal(out["tokens"], tokens, err_msg=str(settings))
        np.testing.assert_allclose(out["scores"], scores, atol=1e-5, err_msg=str(settings))
        words = [" ".join(WORDS[t] for t in _before_end(row)) for row in tokens.tolist()]
        assert out["text"] == words and "[UNK]" not in " ".join(words)  # favoured, suppressed
        assert all(0 not in _before_end(row) for row in out["tokens"]), settings  # no padding
    greedy, sampled = served["generate"][:2]
    assert greedy["tokens"] != sampled["tokens"]


@pytest.mark.tensorflow_only
def test_generate_signature_asserts_name_each_bad_setting(served):
    for name, value in BAD:
        message = served["bad"][f"{name}={value}"]
        assert message, (name, value)  # the call failed, on an assertion
        assert f"`{name}` must be" in message[0] and f"Received: {name}=" in message[0], message
        assert f"[{value:g}]" in message[0], message  # the value received
    assert served["empty"] == {"text": 0, "tokens": 0, "scores": 0}  # no prompts: no rows


@pytest.mark.tensorflow_only
def test_generate_signature_takes_stop_strings_and_min_new_tokens(language_model, served):
    """Per request: the stop strings spelled with the vocabulary and `min_new_tokens` give
    Python's tokens (`continue_ids(stop=..., min_new_tokens=...)`, the same settings and
    seed); a string the vocabulary cannot spell fails an assert naming it."""
    text_model, _ = language_model
    acted = False
    for more, out in zip(_stop_settings(text_model), served["stops"], strict=True):
        settings = dict(max_length=6, temperature=1.0, top_k=0, top_p=1.0, seed=0)
        settings.update(more)
        stop = settings.pop("stop_sequences", None)
        temperature = settings.pop("temperature")
        sampling = dict(sampler="sample", temperature=temperature, top_k=settings.pop("top_k"),
                        top_p=None, seed=settings.pop("seed"))  # fmt: skip
        settings.pop("top_p")
        if stop is not None:
            settings["stop"] = stop
        tokens = text_model.continue_ids(
            PROMPTS, **settings, **(sampling if temperature else {}), return_scores=True
        )[0]
        np.testing.assert_array_equal(out["tokens"], tokens, err_msg=str(more))
        acted |= bool((np.asarray(out["tokens"]) != text_model.continue_ids(PROMPTS)).any())
    assert acted
    assert "`stop_sequences` must be" in served["unspelled"][0], served["unspelled"]
    assert "good zebra" in served["unspelled"][0], served["unspelled"]


@pytest.mark.tensorflow_only
def test_generate_signature_inputs_are_the_configs_exported_settings(language_model):
    """The signature's inputs come from `GenerationConfig.exported()` and its rules' dtypes:
    the names, dtypes and shapes clients have always sent."""
    import tensorflow as tf

    from keras_attn.models.generation import RULES, GenerationConfig

    _, path = language_model
    _, inputs = tf.saved_model.load(str(path)).signatures["generate"].structured_input_signature
    expected = {"text": (tf.string, [None])}
    expected |= {
        name: (tf.as_dtype(RULES[name].exported), list(RULES[name].shape))
        for name in GenerationConfig.exported()
    }
    assert {k: (v.dtype, v.shape.as_list()) for k, v in inputs.items()} == expected
    assert set(expected) == {"text", *(name for name, _ in BAD), "seed", "stop_sequences"}
    assert expected["stop_sequences"] == (tf.string, [None])  # any number of stop strings


@pytest.mark.tensorflow_only
def test_a_decode_step_loop_streams_the_greedy_tokens(language_model, served):
    text_model, _ = language_model
    np.testing.assert_array_equal(served["stream"], text_model.continue_ids(PROMPTS))
    assert f"`index` must be in [1, {MAX_LENGTH})" in served["past"][0]
    assert f"[{MAX_LENGTH}]" in served["past"][0]  # the index received


@pytest.mark.slow  # the TFLite conversion: ~10 s on 2 quiet cores
@pytest.mark.tensorflow_only
def test_decode_step_converts_to_tflite_builtins(language_model):
    import tensorflow as tf

    text_model, path = language_model
    converter = tf.lite.TFLiteConverter.from_saved_model(str(path), signature_keys=["decode_step"])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    runner = tf.lite.Interpreter(model_content=converter.convert()).get_signature_runner(
        "decode_step"
    )
    loaded = tf.saved_model.load(str(path))
    prompts = tf.cast(text_model.prompt_ids(PROMPTS[:3]), tf.int64)
    state = loaded.signatures["prefill"](tokens=prompts)
    inputs = {k: state[k].numpy() for k in ("keys", "values", "valid", "positions", "index")}
    inputs["token"] = np.argmax(state["logits"].numpy(), -1).astype("int64")
    lite = runner(**inputs)
    expected = {k: v.numpy() for k, v in loaded.signatures["decode_step"](**inputs).items()}
    finite = np.isfinite(expected["logits"])  # TFLite writes -inf as the lowest float32
    np.testing.assert_allclose(lite["logits"][finite], expected["logits"][finite], atol=1e-5)
    assert np.all(lite["logits"][~finite] < -1e38)
    np.testing.assert_allclose(lite["keys"], expected["keys"], atol=1e-5)
    assert lite["index"] == 2 and np.array_equal(lite["valid"], expected["valid"])


class _Written:
    """A stdout that keeps each write (`print(..., flush=True)`: one write per word)."""

    def __init__(self):
        self.writes = []

    def write(self, text):
        self.writes.append(text)

    def flush(self):
        pass


@pytest.mark.tensorflow_only
def test_predict_stream_prints_each_word_as_it_comes(language_model, tmp_path, monkeypatch):
    from keras_attn.models import cli

    text_model, _ = language_model
    text_model.save(tmp_path / "transformer-lm.keras")
    runs = ["--runs-dir", str(tmp_path)]
    sampling = dict(sampler="sample", temperature=0.75, top_k=3, seed=5)
    for flags, generation in [([], {}), (["--temperature", "0.75", "--top-k", "3", "--seed", "5"],
                              sampling)]:  # fmt: skip
        stdout = _Written()
        monkeypatch.setattr("sys.stdout", stdout)
        assert (
            cli.main(["predict", "transformer-lm", *PROMPTS[1:3], "--stream", *flags, *runs]) == 0
        )
        # each text continued alone (a batch of one: its own draws when sampled)
        expected = [text_model.predict_text([p], **generation)[0] for p in PROMPTS[1:3]]
        assert "".join(stdout.writes).split("\n") == [*expected, ""], flags
        words = [w.strip() for w in stdout.writes if w.strip()]
        assert words == " ".join(expected).split(), stdout.writes  # a write per word
    assert expected != text_model.predict_text(PROMPTS[1:3])  # sampled, not greedy
    assert any(expected)
    monkeypatch.undo()


@pytest.mark.tensorflow_only
def test_predict_names_a_bad_sampling_flag(tmp_path, capsys):
    from keras_attn.models import cli

    for flags, named in [(["--top-p", "1.5"], "--top-p"), (["--temperature", "-1"],
                         "--temperature"), (["--top-k", "-2"], "--top-k")]:  # fmt: skip
        status = cli.main(["predict", "transformer-lm", "a", *flags, "--runs-dir", str(tmp_path)])
        err = capsys.readouterr().err
        assert status == 2 and named in err and flags[1] in err, err


@pytest.mark.tensorflow_only
def test_predict_takes_the_repetition_controls_and_max_length(language_model, tmp_path, capsys):
    """`--repetition-penalty`, `--no-repeat-ngram-size` and `--max-length` are
    `predict_text`'s settings (one-shot and streamed); a shorter `max_length` is a prefix of
    the greedy tokens; the run's own `max_length` bounds the flag."""
    from keras_attn.models import cli

    text_model, _ = language_model
    text_model.save(tmp_path / "transformer-lm.keras")
    runs = ["--runs-dir", str(tmp_path)]
    full = text_model.continue_ids(PROMPTS)
    np.testing.assert_array_equal(text_model.continue_ids(PROMPTS, max_length=3), full[:, :3])
    flags = ["--repetition-penalty", "1.5", "--no-repeat-ngram-size", "2", "--max-length", "4"]
    settings = dict(repetition_penalty=1.5, no_repeat_ngram_size=2, max_length=4)
    expected = text_model.predict_text(PROMPTS[:3], **settings)
    assert expected != text_model.predict_text(PROMPTS[:3])  # the settings act
    for stream in ([], ["--stream"]):
        assert cli.main(["predict", "transformer-lm", *PROMPTS[:3], *flags, *stream, *runs]) == 0
        assert capsys.readouterr().out.split("\n") == [*expected, ""], stream
    for flags, named, received in [
        (["--repetition-penalty", "0"], "--repetition-penalty", "0.0"),
        (["--no-repeat-ngram-size", "-1"], "--no-repeat-ngram-size", "-1"),
        (["--max-length", "0"], "--max-length", "0"),
        (["--max-length", str(MAX_LENGTH + 1)], "--max-length", str(MAX_LENGTH + 1)),
    ]:
        status = cli.main(["predict", "transformer-lm", "a", *flags, *runs])
        err = capsys.readouterr().err
        assert status == 2 and named in err and received in err, err
    with pytest.raises(ValueError, match="max_length"):
        text_model.continue_ids(PROMPTS, max_length=MAX_LENGTH + 1)


@pytest.mark.tensorflow_only
def test_an_export_with_num_return_sequences_samples_what_python_samples(language_model, tmp_path):
    """`export_text(path, num_return_sequences=2)`: `generate` gives each prompt's 2 rows,
    Python's `generate(..., num_return_sequences=2)` (sample `j` from `seed + j`)."""
    import tensorflow as tf

    from keras_attn.models import generate

    text_model, _ = language_model
    with pytest.raises(ValueError, match="`num_return_sequences` must be a positive integer"):
        text_model.export_text(str(tmp_path / "bad"), num_return_sequences=0)
    text_model.export_text(str(tmp_path / "n2"), num_return_sequences=2)
    signature = tf.saved_model.load(str(tmp_path / "n2")).signatures["generate"]
    settings = dict(max_length=5, temperature=1.0, top_k=4, top_p=1.0, seed=-7)
    out = signature(
        text=tf.constant(PROMPTS), repetition_penalty=tf.constant(1.0),
        stop_sequences=tf.constant([], tf.string), min_new_tokens=tf.constant(0),
        **{k: tf.constant(v, tf.float32 if isinstance(v, float) else tf.int32)
           for k, v in settings.items()},
    )  # fmt: skip
    prompts = np.asarray(text_model.prompt_ids(PROMPTS))
    tokens, scores = generate(
        text_model.language_model, prompts, 5, END, suppress_ids=(1,), sampler="sample",
        top_k=4, seed=-7, num_return_sequences=2, return_scores=True, jit_compile=False,
    )  # fmt: skip
    assert out["text"].shape == (2 * len(PROMPTS),) and tokens.shape == (2 * len(PROMPTS), 5)
    np.testing.assert_array_equal(out["tokens"], tokens)
    np.testing.assert_allclose(out["scores"], scores, atol=1e-5)


def test_predict_takes_stop_strings_and_min_new_tokens(language_model, tmp_path, capsys):
    """`--stop` (repeated) and `--min-new-tokens` are `predict_text`'s `stop` and
    `min_new_tokens` (one-shot and streamed); a stop string the run's vocabulary cannot
    spell, or a bad minimum, stops the command naming the flag and the value."""
    from keras_attn.models import cli

    text_model, _ = language_model
    text_model.save(tmp_path / "transformer-lm.keras")
    runs = ["--runs-dir", str(tmp_path)]
    tokens = text_model.continue_ids(PROMPTS).tolist()
    stop = [WORDS[tokens[1][2]], f"{WORDS[tokens[3][3]]} {WORDS[tokens[3][4]]}"]
    expected = text_model.predict_text(PROMPTS[:3], stop=stop, min_new_tokens=2)
    assert expected != text_model.predict_text(PROMPTS[:3])  # the settings act
    flags = ["--stop", stop[0], "--stop", stop[1], "--min-new-tokens", "2"]
    for stream in ([], ["--stream"]):
        assert cli.main(["predict", "transformer-lm", *PROMPTS[:3], *flags, *stream, *runs]) == 0
        assert capsys.readouterr().out.split("\n") == [*expected, ""], stream
    for flags, named, received in [
        (["--stop", "good zebra"], "--stop", "good zebra"),
        (["--min-new-tokens", "-1"], "--min-new-tokens", "-1"),
    ]:
        status = cli.main(["predict", "transformer-lm", "a", *flags, *runs])
        err = capsys.readouterr().err
        assert status == 2 and named in err and received in err, err
    with pytest.raises(ValueError, match=r"`stop` strings must be .*Received: stop string '\?'"):
        text_model.predict_text(PROMPTS[:1], stop=["?"])  # "?": a word outside the vocabulary
