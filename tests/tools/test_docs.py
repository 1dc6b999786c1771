"""The examples users copy: docstring examples and the README run as written."""

import doctest
import importlib
import pathlib
import pkgutil
import re

import keras
import numpy as np
import pytest

import keras_attn

MODULES = sorted(
    m.name
    for package in (keras_attn,)
    for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
)
README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples(module_name):
    module = importlib.import_module(module_name)
    globs = {"keras": keras, "keras_attn": keras_attn, "np": np}
    result = doctest.testmod(module, extraglobs=globs, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {module_name}"


def test_every_public_layer_has_a_documented_example():
    for name in keras_attn.__all__:
        obj = getattr(keras_attn, name)
        if isinstance(obj, type):
            doc = obj.__doc__ or ""
            for section in ("Args:", "Example", "Returns"):
                assert section in doc, f"{name} docstring lacks {section!r}"


def test_readme_tour_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    tour = blocks[0]
    namespace = {}
    exec(compile(tour, "README tour", "exec"), namespace)
    model = namespace["model"]
    ids = np.array([[5, 6, 7, 0, 0], [1, 2, 0, 0, 0]], "int32")
    assert model(ids).shape == (2, 2)


def test_readme_cached_decoding_runs_and_matches_the_full_pass():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (snippet,) = [b for b in blocks if "empty_cache" in b]
    namespace = {}
    exec(compile(snippet, "README cached decoding", "exec"), namespace)
    stepped = keras.ops.concatenate(namespace["steps"], axis=1)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(stepped),
        keras.ops.convert_to_numpy(namespace["full"]),
        atol=1e-5,
    )


def test_readme_zoo_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (snippet,) = [b for b in blocks if "clf = models.transformer_classifier(" in b]
    namespace = {}
    exec(compile(snippet, "README zoo", "exec"), namespace)
    assert sorted(namespace["order"][0].tolist()) == [0, 1, 2, 3, 4]
    assert namespace["tokens"].shape == (1, 8) and namespace["best"].shape == (1, 8)
    assert namespace["scores"].shape == (1, 8) and namespace["alignment"].shape == (1, 8, 6)
    assert namespace["step"].shape == (2,) and namespace["new"].shape == (2, 8)
    assert namespace["outputs"]["sentence_attention"].shape == (1, 6)


def test_biases_doc_runs():
    biases = README.parent / "docs" / "biases.md"
    blocks = re.findall(r"```python\n(.*?)```", biases.read_text(), flags=re.S)
    (snippet,) = [b for b in blocks if "AlibiBias()" in b]
    namespace = {}
    exec(compile(snippet, "docs/biases.md", "exec"), namespace)
    assert namespace["y"].shape == namespace["z"].shape == namespace["w"].shape == (2, 64, 32)


def test_readme_coming_from_keras_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (snippet,) = [b for b in blocks if "keras_hub.layers.TransformerEncoder" in b]
    namespace = {}
    exec(compile(snippet, "README coming from Keras", "exec"), namespace)
    for name in ("layer", "block"):
        assert type(namespace[name]).__module__.startswith("keras_attn")


def test_readme_testing_snippet_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (snippet,) = [b for b in blocks if "assert_padding_invariance" in b]
    exec(compile(snippet, "README testing", "exec"), {})  # the check passes: no AssertionError
