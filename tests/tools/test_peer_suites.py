"""tools/peer_suites.py: only the peers' class names are swapped, and the table adds up.

Small inline peer files (written as Keras' and keras-hub's tests are): no network, no peer
checkout. The run itself is checked on one tiny file in a subprocess.
"""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import peer_suites  # noqa: E402

KERAS_STYLE = """\
from keras.src import layers
from keras.src import testing


class MultiHeadAttentionTest(testing.TestCase):
    def test_basics(self):
        self.run_layer_test(layers.MultiHeadAttention, init_kwargs={"num_heads": 2})
        layer = layers.GroupedQueryAttention(head_dim=2, num_query_heads=2)
        dense = layers.Dense(3)  # not a peer class: stays Keras'

        class Sub(layers.MultiHeadAttention):
            pass

        restored = layers.MultiHeadAttention.from_config(layer.get_config())
"""

HUB_STYLE = """\
from keras_hub.src.layers.modeling.sine_position_encoding import (
    SinePositionEncoding,
)
from keras_hub.src.layers.modeling.transformer_encoder import TransformerEncoder
from keras_hub.src.layers.modeling.transformer_layer_utils import compute_causal_mask
from keras_hub.src.tests.test_case import TestCase


class TransformerEncoderTest(TestCase):
    def test_layer_behaviors(self):
        self.run_layer_test(cls=TransformerEncoder, init_kwargs={})
        encoding = SinePositionEncoding()
"""


def test_keras_style_file_swaps_the_attribute_uses_and_nothing_else():
    source, swaps = peer_suites.rewrite(KERAS_STYLE)
    assert swaps == 4
    assert source.startswith("import keras_attn\n")
    assert "layers.MultiHeadAttention" not in source.replace("keras_attn.", "")
    assert source.count("keras_attn.MultiHeadAttention") == 3
    assert "keras_attn.GroupedQueryAttention(head_dim=2" in source
    # The test class, the helpers and other layers stay the peer's.
    assert "class MultiHeadAttentionTest(testing.TestCase)" in source
    assert "layers.Dense(3)" in source and "from keras.src import layers" in source
    assert source.replace("import keras_attn\n", "").replace("keras_attn.", "layers.") == (
        KERAS_STYLE
    )


def test_keras_hub_style_file_swaps_the_class_imports_only():
    source, swaps = peer_suites.rewrite(HUB_STYLE)
    assert swaps == 2
    assert "from keras_attn import SinePositionEncoding\n" in source
    assert "from keras_attn import TransformerEncoder\n" in source
    # A helper of the peer, and its test case, stay the peer's; no import added.
    assert "from keras_hub.src.layers.modeling.transformer_layer_utils import" in source
    assert "from keras_hub.src.tests.test_case import TestCase" in source
    assert "import keras_attn\n" not in source
    assert "cls=TransformerEncoder" in source and "keras_hub.src.layers.modeling.sine" not in source


def test_a_rewrite_is_stable_and_every_peer_class_is_ours():
    import keras_attn

    for source in (KERAS_STYLE, HUB_STYLE):
        once, _ = peer_suites.rewrite(source)
        assert peer_suites.rewrite(once) == (once, 0)
    for name in peer_suites.PEER_CLASSES:
        assert isinstance(getattr(keras_attn, name), type), name


def test_a_file_with_nothing_to_swap_is_refused(tmp_path, capsys):
    path = tmp_path / "dense_test.py"
    path.write_text("from keras.src import layers\n\nlayers.Dense(3)\n")
    assert peer_suites.main([str(path)]) == 2
    assert "no peer class to swap" in capsys.readouterr().err


def test_table_counts_per_file_and_total():
    results = {
        "a_test": [("test_x", "passed", []), ("test_y", "failed", ["AssertionError: no"])],
        "b_test": [("test_z", "skipped", [])],
    }
    table = peer_suites.table(results, [pathlib.Path("a_test.py"), pathlib.Path("b_test.py")])
    lines = table.splitlines()
    assert lines[2] == "| a_test.py | 2 | 1 | 0 | 1 | `test_y` (AssertionError: no) |"
    assert lines[3] == "| b_test.py | 1 | 0 | 1 | 0 |  |"
    assert lines[4] == "| total | 3 | 1 | 1 | 1 | |"


@pytest.mark.skipif(
    os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow", reason="one run is enough"
)
def test_the_command_runs_a_swapped_file_and_prints_the_table(tmp_path):
    peers = tmp_path / "peers"
    peers.mkdir()
    (peers / "tiny_test.py").write_text(
        "import numpy as np\n"
        "from keras import layers\n\n\n"
        "def test_ours_is_used():\n"
        "    layer = layers.MultiHeadAttention(num_heads=1, key_dim=2)\n"
        "    assert type(layer).__module__.startswith('keras_attn')\n\n\n"
        "def test_fails():\n"
        "    layers.MultiHeadAttention(num_heads=1, key_dim=2)\n"
        "    assert False, 'on purpose'\n"
    )
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "peer_suites.py"), str(peers)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert run.returncode == 1, run.stderr[-2000:]
    assert "| tiny_test.py | 2 | 1 | 0 | 1 | `test_fails` (AssertionError: on purpose" in run.stdout
