"""What the package installs: `keras_attn` only (the zoo, `models/`, under it), and the command.

A user's own `models.py` or `models/` (common in ML projects) must neither shadow the zoo
nor be shadowed by it.
"""

import configparser
import os
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_only_the_keras_attn_namespace_is_installed():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    listed = config["options"]["packages"].split()
    assert listed and all(p == "keras_attn" or p.startswith("keras_attn.") for p in listed)
    mapping = dict(
        line.replace(" ", "").split("=") for line in config["options"]["package_dir"].split("\n")
        if line.strip()
    )  # fmt: skip
    assert mapping == {"keras_attn.models": "models"}
    # Every package folder is listed: keras_attn/... as is, models/... under keras_attn.models.
    folders = []
    for top, name in (("keras_attn", "keras_attn"), ("models", "keras_attn.models")):
        for directory, _, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" in files:
                relative = os.path.relpath(directory, os.path.join(ROOT, top))
                folders.append(
                    name if relative == "." else f"{name}.{relative.replace(os.sep, '.')}"
                )
    assert sorted(folders) == sorted(listed)
    assert config["options"]["scripts"].split() == ["bin/keras-attn"]


def test_the_wheel_holds_the_zoo_under_keras_attn_and_no_top_level_models(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), ROOT],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    (wheel,) = tmp_path.glob("keras_attn-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"keras_attn"}
    for module in (
        "__init__.py",
        "cli.py",
        "layers.py",
        "datasets/builders.py",
        "recipes/seq2seq.py",
    ):
        assert f"keras_attn/models/{module}" in names


def test_import_keras_attn_loads_no_zoo_module_and_no_tfds():
    code = (
        "import sys, keras_attn\n"
        "zoo = ('keras_attn.models', 'tensorflow_datasets')\n"
        "loaded = [m for m in sys.modules if m.startswith(zoo)]\n"
        "assert not loaded, loaded\n"
        "import keras_attn.models, os\n"
        "assert keras_attn.models.__file__ == os.path.join(sys.argv[1], 'models', '__init__.py')\n"
    )  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    completed = subprocess.run(
        [sys.executable, "-c", code, ROOT], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert completed.returncode == 0, completed.stderr[-2000:]


def test_the_models_folder_is_not_a_top_level_package():
    """From the repository root `models/` is on the path, but importing it as `models` (a
    second copy of the zoo, registering its layers twice) is refused with the right name."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    completed = subprocess.run(
        [sys.executable, "-c", "import models"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert completed.returncode != 0
    assert "ImportError: The model zoo is the package `keras_attn.models`" in completed.stderr


def test_a_users_models_package_and_the_zoo_coexist(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("OWNER = 'the user'\n")
    code = (
        "import models, keras_attn\n"
        "from keras_attn import models as zoo\n"
        "assert models.OWNER == 'the user', models\n"
        "assert callable(zoo.transformer_classifier) and callable(zoo.greedy_decode)\n"
        "assert keras_attn.models is zoo\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert completed.returncode == 0, completed.stderr[-2000:]


def test_the_installed_command_starts_without_tensorflow_notices(tmp_path):
    """`bin/keras-attn` (what pip installs) hides TensorFlow's start-up lines (oneDNN, CUDA,
    CPU features), which TensorFlow prints while it loads unless its log level is set."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = ROOT
    completed = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bin", "keras-attn"), "list"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "transformer-reverse" in completed.stdout
    for notice in ("oneDNN", "cuda", "cpu_feature_guard", "absl::InitializeLog"):
        assert notice not in completed.stderr, completed.stderr[-2000:]


def test_the_public_api_has_type_hints_that_resolve():
    """Every parameter of the public functions, constructors and calls is annotated, and the
    annotations resolve (`typing.get_type_hints`: a name not imported raises NameError)."""
    import inspect
    import typing

    import keras_attn
    from keras_attn import models as zoo

    missing = []
    for module in (keras_attn, zoo):
        for name in module.__all__:
            obj = getattr(module, name)
            methods = [getattr(obj, m) for m in ("__init__", "call") if hasattr(obj, m)]
            for function in methods if inspect.isclass(obj) else [obj]:
                if not getattr(function, "__module__", "").startswith("keras_attn"):
                    continue  # inherited from Keras (a NamedTuple's __init__, ...)
                hints = typing.get_type_hints(function)
                for parameter in inspect.signature(function).parameters.values():
                    plain = parameter.kind in (
                        parameter.POSITIONAL_OR_KEYWORD,
                        parameter.KEYWORD_ONLY,
                    )
                    if plain and parameter.name != "self" and parameter.name not in hints:
                        missing.append(f"{name}: {function.__qualname__}({parameter.name})")
    assert not missing, missing
