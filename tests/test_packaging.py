"""What the package installs: `keras_attn` only (the zoo under it), and the command.

A user's own `models.py` or `models/` (common in ML projects) must neither shadow the zoo
nor be shadowed by it.
"""

import configparser
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_only_the_keras_attn_namespace_is_installed():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    included = config["options.packages.find"]["include"].split()
    assert included and all(p == "keras_attn" or p.startswith("keras_attn.") for p in included)
    assert config["options"]["scripts"].split() == ["bin/keras-attn"]


def test_a_users_models_package_and_the_zoo_coexist(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("OWNER = 'the user'\n")
    code = (
        "import models, keras_attn\n"
        "from keras_attn import zoo\n"
        "assert models.OWNER == 'the user', models\n"
        "assert callable(zoo.transformer_classifier) and callable(zoo.greedy_decode)\n"
        "assert keras_attn.zoo is zoo\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
