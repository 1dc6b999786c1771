"""Every Python block of README.md and docs/*.md runs as written, as a user pastes it.

Each block runs alone (a fresh namespace; a fresh interpreter where it configures devices
before TensorFlow starts) in a folder holding what the blocks read: `keras_attn_runs/` with
a small text language model (`.keras` and SavedModel) and a reversal SavedModel, the names
`keras-attn train` writes. Blocks that a named test already runs, with assertions on what
they make, are listed in `RUN_ELSEWHERE` and not run twice; every block is either run here
or named there (a new block is run; a stale name fails). A block that needs a package of an
extra (`EXTRAS`) skips where it is not installed, as the tests that `importorskip` it (CI runs
the skipped tests again with every extra).
"""

import ast
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.tensorflow_only  # the blocks are TensorFlow's (SavedModels, tf.data)

ROOT = pathlib.Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)

# A line only that block has -> the test that runs it.
RUN_ELSEWHERE = {
    "x = keras_attn.KeyValueAttention(key_dim=32": (
        "tests/tools/test_docs.py::test_readme_tour_runs"
    ),
    "cache, cross, steps = block.empty_cache(2, 5), None, []": (
        "tests/tools/test_docs.py::test_readme_cached_decoding_runs_and_matches_the_full_pass"
    ),
    "clf = models.transformer_classifier(": "tests/tools/test_docs.py::test_readme_zoo_runs",
    "mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)": (
        "tests/tools/test_docs.py::test_readme_testing_snippet_runs"
    ),
    "block = keras_hub.layers.TransformerEncoder(": (
        "tests/tools/test_docs.py::test_readme_coming_from_keras_runs"
    ),
    "AlibiBias()": "tests/tools/test_docs.py::test_biases_doc_runs",
    'transformers.LlamaForCausalLM(config).save_pretrained("tiny-llama")': (
        "tests/zoo/test_transformers_checkpoints.py::test_the_docs_round_trip_runs (transformers)"
    ),
    "keras.distribution.DataParallel(devices=devices)": (
        "tests/compat/test_distribute_jax.py (JAX, several devices)"
    ),
    "keras.distribution.ModelParallel(layout_map=layouts": (
        "tests/compat/test_model_parallel_jax.py (JAX, several devices)"
    ),
}
# Blocks that must start their own interpreter: they configure devices before TensorFlow starts.
OWN_PROCESS = ("set_logical_device_configuration",)
# The packages of extras that a block may import (-> the extra), and calls that import one.
EXTRAS = {"onnxruntime": "onnx", "tf2onnx": "onnx", "onnx": "onnx", "ai_edge_litert": "litert"}
CALLS_NEEDING = {"export_onnx(": ("tf2onnx", "onnx")}

LM_WORDS = ["", "[UNK]", ".", "<s>", "</s>", "the", "movie", "is", "a", "good", "bad", "film"]
REVERSE_SOURCE = ["", "[UNK]"] + list("abcdefghn")
REVERSE_TARGET = ["", "[UNK]", "<s>", "</s>"] + list("abcdefghn")


def doc_blocks():
    """`(name, code)` of every ```python block (indented ones dedented), in file order."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text[: match.start()].count("\n") + 1
            yield f"{path.relative_to(ROOT)}:{line}", textwrap.dedent(match.group(2))


def needed_extras(code):
    """The packages of extras that `code` imports, or needs through a call of `CALLS_NEEDING`."""
    imported = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.split(".")[0])
    imported |= {name for call, names in CALLS_NEEDING.items() if call in code for name in names}
    return sorted(imported & set(EXTRAS))


def missing_extras(code):
    return [name for name in needed_extras(code) if importlib.util.find_spec(name) is None]


def _elsewhere(code):
    return [marker for marker in RUN_ELSEWHERE if marker in code]


BLOCKS = [(name, code) for name, code in doc_blocks() if not _elsewhere(code)]
OWN = [(name, code) for name, code in BLOCKS if any(m in code for m in OWN_PROCESS)]
HERE = [(name, code) for name, code in BLOCKS if (name, code) not in OWN]


def test_every_block_is_run_here_or_by_the_test_named():
    names = {marker: [n for n, code in doc_blocks() if marker in code] for marker in RUN_ELSEWHERE}
    for marker, found in names.items():
        assert len(found) == 1, f"{marker!r} ({RUN_ELSEWHERE[marker]}) is in blocks {found}"
    assert len(BLOCKS) + len(RUN_ELSEWHERE) == len(list(doc_blocks()))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A folder with `keras_attn_runs/` as `keras-attn train` leaves it, small models."""
    from keras_attn import models
    from keras_attn.models import text

    folder = tmp_path_factory.mktemp("docs")
    out = folder / "keras_attn_runs"
    out.mkdir()
    keras.utils.set_random_seed(0)
    lm = models.transformer_lm(
        len(LM_WORDS), num_layers=1, num_heads=2, d_model=16, intermediate_dim=32,
        sequence_length=24, dropout=0.0,
    )  # fmt: skip
    language_model = text.TextLanguageModel(lm, text.string_lookup(LM_WORDS), 12, 6)
    language_model.save(out / "transformer-lm.keras")
    language_model.export_text(str(out / "transformer-lm_savedmodel"))
    s2s = models.transformer_seq2seq(
        len(REVERSE_SOURCE), len(REVERSE_TARGET), num_layers=1, num_heads=2, d_model=16,
        intermediate_dim=32,
    )  # fmt: skip
    reverse = text.TextSeq2Seq(
        s2s, text.string_lookup(REVERSE_SOURCE), text.string_lookup(REVERSE_TARGET), 6, 7
    )
    reverse.export_text(str(out / "transformer-reverse_savedmodel"))
    return folder, language_model


def _streamed_words_are_the_greedy_continuation(namespace, printed, language_model):
    """docs/serving.md's streaming client: the ids read from the export's vocabulary, its
    greedy words are the text model's continuation (hard-coded ids printed other words)."""
    (expected,) = language_model.predict_text(["the movie is"])
    assert printed.split() == expected.split(), (printed, expected)
    assert namespace["max_length"] == language_model.max_length


def _token_model_generates_what_the_text_model_does(namespace, printed, language_model):
    """README's token-model call: `suppress_ids` given, the tokens of `continue_ids`."""
    np.testing.assert_array_equal(namespace["new"], language_model.continue_ids(["the movie is"]))
    assert not np.isin(namespace["new"], language_model.suppress_ids).any()


def _runtime_words_are_the_greedy_continuation(namespace, printed, language_model):
    """docs/serving.md's ONNX Runtime and LiteRT clients print the text model's greedy words."""
    (expected,) = language_model.predict_text(["the movie is"])
    assert printed.split() == expected.split(), (printed, expected)


CHECKS = {
    'state = loaded.signatures["prefill"](tokens=prompts)': (
        _streamed_words_are_the_greedy_continuation
    ),
    'state = run(prefill, {"tokens":': _runtime_words_are_the_greedy_continuation,
    "tokens = greedy(prompts=": _runtime_words_are_the_greedy_continuation,
    "new = models.generate(run.language_model, prompts, run.max_length, run.end_id,": (
        _token_model_generates_what_the_text_model_does
    ),
}


@pytest.mark.parametrize("code", [code for _, code in HERE], ids=[name for name, _ in HERE])
def test_doc_block_runs_as_written(code, runs, tmp_path, monkeypatch, capsys):
    missing = missing_extras(code)
    if missing:
        pytest.skip(
            f"the block needs {', '.join(missing)} (extras {sorted({EXTRAS[m] for m in missing})})"
        )
    folder, language_model = runs
    (tmp_path / "keras_attn_runs").symlink_to(folder / "keras_attn_runs")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(code, "doc block", "exec"), namespace)
    finally:
        keras.config.set_dtype_policy("float32")
    printed = capsys.readouterr().out
    for marker, check in CHECKS.items():
        if marker in code:
            check(namespace, printed, language_model)


@pytest.mark.slow  # trains a task (about a minute on 2 cores)
@pytest.mark.parametrize("code", [code for _, code in OWN], ids=[name for name, _ in OWN])
def test_doc_block_runs_in_its_own_interpreter(code, tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=environment, capture_output=True,
        text=True, timeout=900,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]


def test_only_the_runtime_blocks_need_an_extra():
    assert needed_extras("import onnxruntime.capi as c\nimport numpy") == ["onnxruntime"]
    assert needed_extras("from ai_edge_litert.interpreter import Interpreter") == ["ai_edge_litert"]
    assert needed_extras("from . import onnx\nimport keras_attn") == []  # relative, not extras
    assert needed_extras("from keras_attn.models import export_onnx\nexport_onnx(a, b)") == [
        "onnx", "tf2onnx",
    ]  # fmt: skip
    needing = {name: needed_extras(code) for name, code in BLOCKS if needed_extras(code)}
    assert sorted(needing.values()) == [["ai_edge_litert"], ["onnx", "onnxruntime", "tf2onnx"]]
    assert all(name.startswith("docs/serving.md:") for name in needing), needing


def test_checks_name_blocks_that_exist():
    for marker in CHECKS:
        assert sum(marker in code for _, code in BLOCKS) == 1, marker
