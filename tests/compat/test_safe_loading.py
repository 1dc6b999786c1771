"""Safe loading: every registered class reloads with `safe_mode=True`; tampered files are refused.

The shared checks (`layer_checks`, `model_checks`, `keras_attn.testing`) already
save and reload every layer and zoo model in the test process. What is added here:

- a reload in a fresh Python process that imports only `keras_attn.models`
  (what a user does to reload a zoo model; it imports `keras_attn`), with
  `safe_mode=True` and no `custom_objects`, covering every class registered under
  `keras_attn>` and `keras_attn.models>` (a new class without a case fails the test),
  nested objects included (score layers, rotary embeddings);
- no code in the project asks for `safe_mode=False`, `custom_objects` or unsafe
  deserialization;
- a `.keras` file whose config was tampered with (an unknown class, a system
  function, a Python lambda, a nested object of the wrong kind) is refused with
  the exact error.
"""

import json
import pathlib
import subprocess
import sys
import textwrap
import zipfile

import keras
import numpy as np
import pytest

import keras_attn as ka
from keras_attn import models as zoo

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("keras_attn>", "keras_attn.models>")
rng = np.random.default_rng(0)
Q = rng.normal(size=(2, 4, 8)).astype("float32")
V = rng.normal(size=(2, 5, 8)).astype("float32")
V_MASK = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], bool)


def _wrapped(layer, inputs, **call_kwargs):
    """A functional model around `layer`: one named `keras.Input` per entry of `inputs`."""
    symbolic = {
        name: keras.Input(value.shape[1:], dtype=str(value.dtype), name=name)
        for name, value in inputs.items()
    }
    return keras.Model(symbolic, layer(**symbolic, **call_kwargs)), inputs


def _attention(layer, **call_kwargs):
    return _wrapped(layer, {"query": Q, "value": V, "value_mask": V_MASK}, **call_kwargs)


def _tokens(batch, length, vocab):
    tokens = rng.integers(3, vocab, size=(batch, length)).astype("int32")
    tokens[1, length // 2 :] = 0
    return tokens


def _hf_tokens(batch, length, vocab):
    """`_tokens` with the padding -1 and a real token 0 (a Hugging Face checkpoint's ids)."""
    tokens = _tokens(batch, length, vocab)
    tokens[tokens == 0] = -1
    tokens[0, 1] = 0
    return tokens


def _seq2seq_inputs():
    return {"encoder_inputs": _tokens(2, 6, 15), "decoder_inputs": _tokens(2, 5, 15)}


# name -> () -> (model, inputs): every registered class appears in at least one.
# A learned table drawn at random: a reload that lost it would not give the same outputs.
T5_BIAS = lambda: ka.RelativePositionBias(2, num_buckets=8, embeddings_initializer="normal")  # noqa: E731

CASES = {
    "DotAttention": lambda: _attention(ka.DotAttention(dropout=0.1, seed=2)),
    "ScaledDotAttention": lambda: _attention(
        ka.ScaledDotAttention(scale=0.3), use_causal_mask=True
    ),
    "AdditiveAttention": lambda: _attention(ka.AdditiveAttention(units=4, use_bias=True)),
    "BilinearAttention": lambda: _attention(ka.BilinearAttention(), return_attention_scores=True),
    "KeyValueAttention+ScaledDotScore": lambda: _attention(
        ka.KeyValueAttention(key_dim=4, score=ka.scores.ScaledDotScore(scale=0.3), output_dim=5)
    ),
    "ScoreAttention+DotScore": lambda: _attention(ka.ScoreAttention(score=ka.scores.DotScore())),
    "ScoreAttention+AdditiveScore": lambda: _attention(
        ka.ScoreAttention(score=ka.scores.AdditiveScore(units=3, use_bias=True))
    ),
    "HardAttention+BilinearScore": lambda: _attention(
        ka.HardAttention(score=ka.scores.BilinearScore(), temperature=0.5)
    ),
    "PointerAttention": lambda: _attention(ka.PointerAttention(units=4)),
    "MultiHeadAttention+RotaryEmbedding": lambda: _attention(
        ka.MultiHeadAttention(
            2, 4, num_key_value_heads=1, rotary_embedding=ka.RotaryEmbedding(max_wavelength=100)
        ),
        use_causal_mask=True,
    ),
    "GroupedQueryAttention+AlibiBias": lambda: _attention(
        ka.GroupedQueryAttention(
            4, 2, 1, sliding_window=3, use_gate=True, position_bias=ka.AlibiBias()
        ),  # fmt: skip
        use_causal_mask=True,
    ),
    "MultiHeadAttention+RelativePositionBias": lambda: _attention(
        ka.MultiHeadAttention(2, 4, position_bias=T5_BIAS()), use_causal_mask=True
    ),
    "AttentionPooling": lambda: _wrapped(
        ka.AttentionPooling(units=4), {"inputs": V, "mask": V_MASK}
    ),
    "SinusoidalPositionalEncoding": lambda: _wrapped(
        ka.SinusoidalPositionalEncoding(max_wavelength=100), {"inputs": V}, start_index=2
    ),
    "LearnedPositionalEmbedding": lambda: _wrapped(ka.LearnedPositionalEmbedding(8), {"inputs": V}),
    "SinePositionEncoding": lambda: _wrapped(ka.SinePositionEncoding(), {"inputs": V}),
    "PositionEmbedding": lambda: _wrapped(ka.PositionEmbedding(8), {"inputs": V}),
    "RotaryEmbedding": lambda: _wrapped(ka.RotaryEmbedding(scaling_factor=2.0), {"inputs": V}),
    "TokenAndPositionEmbedding": lambda: _wrapped(
        ka.TokenAndPositionEmbedding(20, 8, 6, position="learned"), {"inputs": _tokens(2, 5, 20)}
    ),
    "FeedForward": lambda: _wrapped(ka.FeedForward(16, activation="gelu"), {"inputs": V}),
    "TransformerEncoderBlock(mixed_bfloat16)": lambda: _wrapped(
        ka.TransformerEncoderBlock(
            16,
            2,
            normalize_first=True,
            num_key_value_heads=1,
            rotary_embedding=ka.RotaryEmbedding(),
            dtype="mixed_bfloat16",
        ),
        {"inputs": V, "padding_mask": V_MASK},
    ),  # fmt: skip
    "TransformerDecoderBlock": lambda: _wrapped(
        ka.TransformerDecoderBlock(16, 2),
        {"decoder_sequence": Q, "encoder_sequence": V, "encoder_padding_mask": V_MASK},
    ),
    "transformer_classifier": lambda: (
        zoo.transformer_classifier(
            20, 8, 3, num_layers=1, num_heads=2, d_model=8, intermediate_dim=16, pooling="attention"
        ),
        {"tokens": _tokens(2, 8, 20)},
    ),  # fmt: skip
    "transformer_lm(llama)+MaskedRMSNormalization": lambda: (
        zoo.transformer_lm(
            20,
            num_layers=1,
            num_heads=2,
            d_model=8,
            intermediate_dim=16,
            position="rotary",
            num_key_value_heads=1,
            normalization="rms_norm",
            feedforward="gated",
            activation="silu",
            use_bias=False,
            qkv_bias=True,
            tie_weights=False,
            rope_scaling={"rope_type": "llama3", "scaling_factor": 4.0},
        ),
        {"tokens": _tokens(2, 8, 20)},
    ),
    "transformer_lm(padding_id=-1)+TokenPadding+DropMask": lambda: (
        zoo.transformer_lm(
            20, num_layers=1, num_heads=2, d_model=8, intermediate_dim=16, padding_id=-1
        ),
        {"tokens": _hf_tokens(2, 8, 20)},
    ),
    "transformer_seq2seq": lambda: (
        zoo.transformer_seq2seq(15, 15, num_layers=1, num_heads=2, d_model=8, intermediate_dim=16),
        _seq2seq_inputs(),
    ),  # fmt: skip
    "rnn_seq2seq": lambda: (
        zoo.rnn_seq2seq(15, 15, embedding_dim=8, units=8, score="bilinear"),
        _seq2seq_inputs(),
    ),
    "TextSeq2Seq": lambda: (
        zoo.text.TextSeq2Seq(
            zoo.transformer_seq2seq(6, 6, num_layers=1, num_heads=2, d_model=8, intermediate_dim=8),
            zoo.text.string_lookup(["", "[UNK]", "a", "b", "c", "d"]),
            zoo.text.string_lookup(["", "[UNK]", "<s>", "</s>", "a", "b"]),
            4,
            5,
        ),
        {"encoder_inputs": _tokens(2, 5, 6), "decoder_inputs": _tokens(2, 4, 6)},
    ),  # fmt: skip
    "TextClassifier": lambda: (
        zoo.text.TextClassifier(
            zoo.transformer_classifier(8, 4, 2, num_layers=1, d_model=8, intermediate_dim=8),
            keras.layers.TextVectorization(vocabulary=["a", "b"], output_sequence_length=4),
            ["no", "yes"],
        ),
        {"tokens": _tokens(2, 4, 4)},
    ),
    "TextLanguageModel": lambda: (
        zoo.text.TextLanguageModel(
            zoo.transformer_lm(6, num_layers=1, num_heads=2, d_model=8, intermediate_dim=8),
            zoo.text.string_lookup(["", "[UNK]", "<s>", "</s>", "a", "b"]),
            4,
            5,
        ),
        {"tokens": _tokens(2, 5, 6)},
    ),  # fmt: skip
    "transformer_lm(gelu_approximate)": lambda: (
        zoo.transformer_lm(
            15,
            num_layers=1,
            num_heads=2,
            d_model=8,
            intermediate_dim=16,
            sequence_length=6,
            activation=zoo.layers.gelu_approximate,
        ),  # fmt: skip
        {"tokens": _tokens(2, 6, 15)},
    ),
    "pointer_network": lambda: (
        zoo.pointer_network(input_dim=1, units=8),
        {
            "points": rng.uniform(size=(2, 4, 1)).astype("float32"),
            "pointers": np.array([[2, 0, 1, 3], [1, 3, 0, 2]], "int32"),
        },
    ),
    "hierarchical_attention_network": lambda: (
        zoo.hierarchical_attention_network(30, 8, 4, 4, 3, max_sentences=2, max_words=4),
        {"tokens": rng.integers(0, 30, size=(2, 2, 4)).astype("int32")},
    ),
    "hierarchical_attention_network(pooling=mean)": lambda: (
        zoo.hierarchical_attention_network(
            30, 8, 4, 4, 3, max_sentences=2, max_words=4, pooling="mean"
        ),
        {"tokens": rng.integers(0, 30, size=(2, 2, 4)).astype("int32")},
    ),
}


def _feed(model, inputs):
    """`inputs` (a dict by input name) in the structure the model was built with."""
    structure = model.input
    if isinstance(structure, dict):
        return inputs
    if isinstance(structure, list):
        return [inputs[t.name] for t in structure]
    return next(iter(inputs.values()))


# Run in a fresh interpreter: loads every `<name>.keras` of a directory with
# safe_mode=True and compares with the outputs stored next to it.
LOADER = textwrap.dedent(
    """
    import os, pathlib, sys
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras, numpy as np
    import keras_attn.models  # what a user imports; no custom_objects

    failures, paths = [], sorted(pathlib.Path(sys.argv[1]).glob("*.keras"))
    for path in paths:
        data = np.load(path.with_suffix(".npz"))
        inputs = {k[3:]: data[k] for k in data.files if k.startswith("in_")}
        try:
            model = keras.saving.load_model(path, safe_mode=True)
            structure = model.input
            if isinstance(structure, dict):
                feed = inputs
            elif isinstance(structure, list):
                feed = [inputs[t.name] for t in structure]
            else:
                feed = next(iter(inputs.values()))
            outputs = keras.tree.flatten(model(feed))
            for i, out in enumerate(outputs):
                out = keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))
                np.testing.assert_allclose(out, data[f"out_{i}"], atol=1e-5, rtol=1e-5)
        except Exception as error:
            failures.append(f"{path.stem}: {type(error).__name__}: {error}"[:2000])
    print("\\n".join(failures) or f"reloaded {len(paths)} models")
    sys.exit(1 if failures else 0)
    """
)


def _registered_names(path):
    """Every `registered_name` of our packages in a `.keras` file's config."""
    names = set()

    def walk(node):
        if isinstance(node, dict):
            name = node.get("registered_name")
            if name == "function":  # a registered function: its name is the config
                name = node.get("config")
            if isinstance(name, str) and name.startswith(PACKAGES):
                names.add(name)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    with zipfile.ZipFile(path) as archive:
        walk(json.loads(archive.read("config.json")))
    return names


def test_every_registered_class_reloads_in_a_fresh_process(tmp_path):
    covered = set()
    for name, build in CASES.items():
        keras.utils.set_random_seed(0)
        model, inputs = build()
        outputs = keras.tree.flatten(model(_feed(model, inputs)))
        path = tmp_path / f"{name}.keras"
        model.save(path)
        np.savez(
            path.with_suffix(".npz"),
            **{f"in_{k}": v for k, v in inputs.items()},
            **{
                f"out_{i}": keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))
                for i, out in enumerate(outputs)
            },
        )
        covered |= _registered_names(path)
    registered = {n for n in keras.saving.get_custom_objects() if n.startswith(PACKAGES)}
    assert registered <= covered, f"no reload case for {sorted(registered - covered)}"

    result = subprocess.run(
        [sys.executable, "-c", LOADER, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert f"reloaded {len(CASES)} models" in result.stdout


def test_nothing_in_the_project_asks_for_unsafe_loading():
    unsafe = ("safe_mode=False", "enable_unsafe_deserialization", "custom_objects=")
    offenders = [
        f"{path.relative_to(ROOT)}: {word}"
        for folder in ("keras_attn", "experiments", "examples", "tests", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for word in unsafe
        if word in path.read_text() and path != pathlib.Path(__file__).resolve()
    ]  # this file quotes Keras' refusal message
    assert not offenders, offenders


# ---------------------------------------------------------------------------
# Tampered files
# ---------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    """A `.keras` file of a model with a ScoreAttention (nested BilinearScore) and an MHA."""
    x = keras.Input((4, 8), name="x")
    y = ka.ScoreAttention(score=ka.scores.BilinearScore(), name="attention")(x, x)
    y = ka.MultiHeadAttention(2, 4, rotary_embedding=ka.RotaryEmbedding(), name="mha")(y, y)
    path = tmp_path / "model.keras"
    keras.Model(x, y).save(path)
    return path


def _tamper(path, edit):
    """A copy of the `.keras` file at `path` with `edit(layer_configs)` applied to its config."""
    tampered = path.with_name("tampered.keras")
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(tampered, "w") as target:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename == "config.json":
                config = json.loads(data)
                edit({layer["config"]["name"]: layer for layer in config["config"]["layers"]})
                data = json.dumps(config)
            target.writestr(item, data)
    return tampered


def _load_error(path):
    with pytest.raises(Exception) as info:
        keras.saving.load_model(path, safe_mode=True)
    return info.value


def _cause(error):
    """The innermost message: Keras wraps the failing object's error in its parents'."""
    return str(error).rsplit("Exception encountered: ", 1)[-1]


LOCATE = (
    "Could not locate {kind} '{name}'. Make sure custom classes and functions are decorated "
    "with `@keras.saving.register_keras_serializable()`. If they are already decorated, make "
    "sure they are all imported so that the decorator is run before trying to load them. "
    "Full object config: "
)
LAMBDA = (
    "Requested the deserialization of a `Lambda` layer whose `function` is a Python lambda. "
    "This carries a potential risk of arbitrary code execution and thus it is disallowed by "
    "default. If you trust the source of the artifact, you can override this error by passing "
    "`safe_mode=False` to the loading function, or calling "
    "`keras.config.enable_unsafe_deserialization()."
)


def test_the_untampered_file_loads(saved):
    keras.saving.load_model(saved, safe_mode=True)


def test_an_unknown_class_is_refused(saved):
    def edit(layers):
        layers["attention"]["class_name"] = "EvilAttention"
        layers["attention"]["registered_name"] = "keras_attn>EvilAttention"

    error = _load_error(_tamper(saved, edit))
    assert isinstance(error, TypeError)
    assert _cause(error).startswith(LOCATE.format(kind="class", name="EvilAttention"))


def test_a_system_function_as_a_layer_is_refused(saved):
    def edit(layers):
        layers["attention"].update(module="os", class_name="system", registered_name=None)

    error = _load_error(_tamper(saved, edit))
    assert isinstance(error, TypeError)
    assert _cause(error).startswith(LOCATE.format(kind="class", name="system"))


def test_a_builtin_function_as_a_nested_score_is_refused(saved):
    def edit(layers):
        layers["attention"]["config"]["score"] = {
            "module": "builtins", "class_name": "function", "config": "eval",
            "registered_name": "function",
        }  # fmt: skip

    error = _load_error(_tamper(saved, edit))
    assert isinstance(error, TypeError)
    assert _cause(error).startswith(LOCATE.format(kind="function", name="eval"))


def test_a_lambda_layer_is_refused(tmp_path):
    x = keras.Input((4,), name="x")
    keras.Model(x, keras.layers.Lambda(lambda t: t * 2.0)(x)).save(tmp_path / "lambda.keras")
    error = _load_error(tmp_path / "lambda.keras")
    assert isinstance(error, ValueError) and str(error) == LAMBDA


def test_a_lambda_as_a_nested_score_is_refused(saved):
    lambda_config = keras.saving.serialize_keras_object(keras.layers.Lambda(lambda t: t))

    def edit(layers):
        layers["attention"]["config"]["score"] = lambda_config

    error = _load_error(_tamper(saved, edit))
    assert isinstance(error, ValueError) and str(error) == LAMBDA


def test_a_lambda_as_a_nested_rotary_embedding_is_refused(saved):
    lambda_config = keras.saving.serialize_keras_object(keras.layers.Lambda(lambda t: t))

    def edit(layers):
        layers["mha"]["config"]["rotary_embedding"] = lambda_config

    error = _load_error(_tamper(saved, edit))
    assert isinstance(error, ValueError) and str(error) == LAMBDA


def test_a_layer_of_the_wrong_kind_as_a_nested_score_is_refused(saved):
    """A registered Keras class, but not a score: keras_attn refuses it by name."""
    dense_config = keras.saving.serialize_keras_object(keras.layers.Dense(2))

    def edit(layers):
        layers["attention"]["config"]["score"] = dense_config

    error = _load_error(_tamper(saved, edit))
    assert isinstance(error, TypeError)
    assert _cause(error).startswith(
        "A `score` config must deserialize to a keras_attn.scores.Score layer. "
        "Received: Dense from config {'module': 'keras.layers', 'class_name': 'Dense', "
    )
