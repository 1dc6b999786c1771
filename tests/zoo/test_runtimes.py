"""A language model's decoding outside TensorFlow: `export_onnx` run by ONNX Runtime and
`export_tflite` run by LiteRT (`ai_edge_litert`, not `tf.lite`).

The references: Python's greedy `keras_attn.models.generate` (the text model's
`continue_ids`) for the tokens, and the SavedModel's own `prefill` / `decode_step`, called by
TensorFlow step for step, for the logits. Each runtime is
an extra (`[onnx]`, `[litert]`): its tests skip where it is not installed.
"""

import numpy as np
import pytest

pytestmark = pytest.mark.tensorflow_only  # export_text and the converters are TensorFlow's

WORDS = ["", "[UNK]", "<s>", "</s>", "the", "movie", "is", "a", "good", "bad", ".", "!"]
PROMPTS = ["the movie is", "a good", "bad bad bad movie", ""]
MAX_LENGTH, PROMPT_LENGTH, END = 6, 4, 3
CACHE = ("keys", "values", "valid", "positions", "index")


# Module-scoped and named first, so that a test skips before the language model is made.
@pytest.fixture(scope="module")
def onnx_runtime():
    pytest.importorskip("tf2onnx")
    return pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def litert():
    return pytest.importorskip("ai_edge_litert.interpreter")


@pytest.fixture(scope="module")
def language_model(tmp_path_factory):
    """A tiny text language model (exact GELU, `[UNK]` favoured: the export rules it out),
    its SavedModel, left-padded prompts, the tokens Python's `generate` makes of them and the
    logits of the SavedModel's `prefill` and `decode_step` steps (TensorFlow) on the way."""
    import keras

    from keras_attn import models
    from keras_attn.models import text
    from model_checks import favour_token

    keras.utils.set_random_seed(7)  # two prompts end (one after a word), two do not
    model = models.transformer_lm(
        len(WORDS), num_layers=2, num_heads=2, d_model=16, intermediate_dim=32,
        sequence_length=12, dropout=0.0,
    )  # fmt: skip
    favour_token(model, WORDS.index("[UNK]"))
    text_model = text.TextLanguageModel(model, text.string_lookup(WORDS), MAX_LENGTH, PROMPT_LENGTH)
    path = tmp_path_factory.mktemp("runtimes") / "lm"
    text_model.export_text(str(path))
    prompts = np.asarray(text_model.prompt_ids(PROMPTS)).tolist()
    prompts[1] = [0] * prompts[1].count(0) + [t for t in prompts[1] if t]  # left-padded
    prompts = np.asarray(prompts, "int64")
    tokens = models.generate(
        model, prompts, MAX_LENGTH, END, suppress_ids=text_model.suppress_ids, jit_compile=False
    )
    np.testing.assert_array_equal(tokens, text_model.continue_ids(PROMPTS))
    assert (np.asarray(tokens) == END).any(axis=1).tolist() == [False, True, False, True]
    streamed, logits = tensorflow_loop(path, prompts)
    np.testing.assert_array_equal(streamed, tokens)
    return {"text_model": text_model, "path": path, "prompts": prompts,
            "tokens": np.asarray(tokens), "logits": logits}  # fmt: skip


def greedy_loop(prefill, decode_step, prompts):
    """A streaming client: `prefill`, then `decode_step` per token, greedy, stopped rows
    given 0 (as `generate`). Returns the tokens `(B, MAX_LENGTH)` and each step's logits."""
    state, finished, tokens, logits = prefill(prompts), np.zeros(len(prompts), bool), [], []
    for i in range(MAX_LENGTH):
        logits.append(state["logits"])
        token = np.where(finished, 0, np.argmax(state["logits"], axis=-1)).astype("int64")
        finished |= token == END
        tokens.append(token)
        if i + 1 < MAX_LENGTH:
            state = decode_step(token, {k: state[k] for k in CACHE})
    return np.stack(tokens, axis=1), logits


def tensorflow_loop(path, prompts):
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))

    def call(name, **inputs):
        out = loaded.signatures[name](**{k: tf.constant(v) for k, v in inputs.items()})
        return {k: v.numpy() for k, v in out.items()}

    return greedy_loop(
        lambda tokens: call("prefill", tokens=tokens),
        lambda token, cache: call("decode_step", token=token, **cache),
        prompts,
    )


def check_against_the_references(language_model, tokens, logits, lowest):
    """The runtime's greedy tokens are `generate`'s and each step's logits TensorFlow's (1e-5;
    a ruled-out token, padding and `[UNK]`: `-inf` there, `lowest` or below here)."""
    np.testing.assert_array_equal(tokens, language_model["tokens"])
    for step, (got, want) in enumerate(zip(logits, language_model["logits"], strict=True)):
        finite = np.isfinite(want)
        assert (~finite).any() and np.all(got[~finite] <= lowest), step
        np.testing.assert_allclose(got[finite], want[finite], atol=1e-5, err_msg=f"step {step}")


def test_onnx_runtime_streams_generates_greedy_tokens(onnx_runtime, language_model, tmp_path):
    from keras_attn.models import export_onnx

    written = export_onnx(
        language_model["path"], tmp_path / "onnx", signatures=("prefill", "decode_step")
    )
    assert sorted(written) == ["decode_step", "prefill"]
    vocabulary = (tmp_path / "onnx" / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    assert vocabulary[:-1] == WORDS[2:]  # ids 2, 3, ... (0: padding, 1: [UNK])
    sessions = {name: onnx_runtime.InferenceSession(file) for name, file in written.items()}

    def run(name, feed):
        session = sessions[name]
        names = [output.name for output in session.get_outputs()]
        return dict(zip(names, session.run(None, feed), strict=True))

    tokens, logits = greedy_loop(
        lambda prompts: run("prefill", {"tokens": prompts}),
        lambda token, cache: run(
            "decode_step", {"token": token, **{f"past_{k}": v for k, v in cache.items()}}
        ),
        language_model["prompts"],
    )
    check_against_the_references(language_model, tokens, logits, lowest=-np.inf)


@pytest.mark.slow  # the loop's conversion: ~10 s on 2 quiet cores
def test_onnx_greedy_decode_gives_generates_tokens(onnx_runtime, language_model, tmp_path):
    from keras_attn.models import export_onnx

    written = export_onnx(language_model["path"], tmp_path, signatures=("greedy_decode",))
    session = onnx_runtime.InferenceSession(written["greedy_decode"])
    (tokens,) = session.run(None, {"prompts": language_model["prompts"]})
    np.testing.assert_array_equal(tokens, language_model["tokens"])


def test_litert_streams_generates_greedy_tokens(litert, language_model, tmp_path):
    """One file, two signatures: LiteRT's `prefill` + `decode_step` loop."""
    from keras_attn.models import export_tflite

    file = export_tflite(language_model["path"], tmp_path, signatures=("prefill", "decode_step"))
    lite = litert.Interpreter(model_path=file)
    assert sorted(lite.get_signature_list()) == ["decode_step", "prefill"]
    prefill, decode_step = (lite.get_signature_runner(n) for n in ("prefill", "decode_step"))
    tokens, logits = greedy_loop(
        lambda prompts: prefill(tokens=prompts),
        lambda token, cache: decode_step(token=token, **cache),
        language_model["prompts"],
    )
    lowest = np.finfo("float32").min  # TFLite writes -inf as the lowest float32
    check_against_the_references(language_model, tokens, logits, lowest=lowest)
    assert (tmp_path / "vocabulary.txt").exists()


@pytest.mark.slow  # an export_text and the loop's conversion: ~20 s on 2 quiet cores
def test_litert_greedy_decode_gives_generates_tokens(litert, language_model, tmp_path):
    """The text model itself given: `export_tflite` exports it first."""
    from keras_attn.models import export_tflite

    file = export_tflite(language_model["text_model"], tmp_path, signatures=("greedy_decode",))
    runner = litert.Interpreter(model_path=file).get_signature_runner("greedy_decode")
    tokens = runner(prompts=language_model["prompts"])["output_0"]
    np.testing.assert_array_equal(tokens, language_model["tokens"])


def test_exports_name_a_bad_argument(language_model, tmp_path):
    from keras_attn.models import export_onnx, export_tflite

    for export in (export_onnx, export_tflite):
        with pytest.raises(ValueError, match="`signatures` must be of .*'serve'"):
            export(language_model["path"], tmp_path, signatures=("prefill", "serve"))
        with pytest.raises(ValueError, match="non-empty list"):
            export(language_model["path"], tmp_path, signatures="decode_step")
        with pytest.raises(TypeError, match="`model` must be a TextLanguageModel.*Received: Func"):
            export(language_model["text_model"].language_model, tmp_path)
    with pytest.raises(ValueError, match="`opset` must be an integer of at least 13"):
        export_onnx(language_model["path"], tmp_path, opset=11)
    token_model = tmp_path / "token_model"
    language_model["text_model"].language_model.export(str(token_model), verbose=False)
    with pytest.raises(ValueError, match="without prefill, decode_step, greedy_decode, assets/"):
        export_tflite(token_model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # an export_text and four conversions: ~60 s on 2 quiet cores
def test_a_llama_style_model_runs_in_both_runtimes(onnx_runtime, litert, tmp_path):
    """Rotary positions, RMS norm, a gated SiLU feed-forward, grouped keys and values, an
    untied head and a sliding window: each runtime's greedy loop and `greedy_decode` give
    the text model's tokens."""
    import keras

    from keras_attn import models
    from keras_attn.models import export_onnx, export_tflite, text

    keras.utils.set_random_seed(4)
    model = models.transformer_lm(
        len(WORDS), num_layers=2, num_heads=4, num_key_value_heads=2, d_model=16,
        intermediate_dim=32, sequence_length=12, dropout=0.0, position="rotary",
        normalization="rms_norm", feedforward="gated", activation="silu", use_bias=False,
        tie_weights=False, sliding_window=3,
    )  # fmt: skip
    text_model = text.TextLanguageModel(model, text.string_lookup(WORDS), MAX_LENGTH, PROMPT_LENGTH)
    path = tmp_path / "lm"
    text_model.export_text(str(path))
    prompts = np.asarray(text_model.prompt_ids(PROMPTS), "int64")
    expected = text_model.continue_ids(PROMPTS)

    written = export_onnx(path, tmp_path / "onnx")
    sessions = {name: onnx_runtime.InferenceSession(file) for name, file in written.items()}

    def run(name, feed):
        names = [output.name for output in sessions[name].get_outputs()]
        return dict(zip(names, sessions[name].run(None, feed), strict=True))

    tokens, _ = greedy_loop(
        lambda tokens: run("prefill", {"tokens": tokens}),
        lambda token, cache: run(
            "decode_step", {"token": token, **{f"past_{k}": v for k, v in cache.items()}}
        ),
        prompts,
    )
    np.testing.assert_array_equal(tokens, expected)
    np.testing.assert_array_equal(run("greedy_decode", {"prompts": prompts})["output_0"], expected)

    lite = litert.Interpreter(model_path=export_tflite(path, tmp_path / "tflite"))
    prefill, decode_step, decode = (
        lite.get_signature_runner(name) for name in ("prefill", "decode_step", "greedy_decode")
    )
    tokens, _ = greedy_loop(
        lambda tokens: prefill(tokens=tokens),
        lambda token, cache: decode_step(token=token, **cache),
        prompts,
    )
    np.testing.assert_array_equal(tokens, expected)
    np.testing.assert_array_equal(decode(prompts=prompts)["output_0"], expected)
