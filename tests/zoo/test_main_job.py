"""The README's main job, `keras-attn train transformer-reverse`, reaches the figure stated.

The figure is read from the README itself, so a change to the recipe that moves it
fails here until the README is measured again.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The README's top: "... **99.8 % exact match** ..." (the first such figure).
FIGURE = re.compile(r"\*\*(\d+(?:\.\d+)?) %\s+exact\s+match\*\*")
# Exact match over 500 test sequences moves in steps of 0.2 points; the run is
# deterministic on one machine, but float rounding differs between CPUs and builds
# (oneDNN), which may flip an answer or two: the README states this tolerance.
TOLERANCE = 0.005
REQUIRED = 0.99  # issue 17: a 2+2-layer Transformer reverses 5-20 tokens essentially always


def stated_exact_match():
    with open(os.path.join(ROOT, "README.md")) as f:
        top = f.read()[:3000]
    match = FIGURE.search(top)
    assert match, "the README's top no longer states the main job's exact match"
    return float(match.group(1)) / 100


def test_the_readme_states_the_figure_and_its_tolerance():
    assert stated_exact_match() >= REQUIRED
    with open(os.path.join(ROOT, "README.md")) as f:
        top = f.read()[:3000]
    assert f"within {TOLERANCE * 100:g} points" in " ".join(top.split())


@pytest.mark.slow
def test_the_main_job_reaches_the_figure_the_readme_states(tmp_path):
    out = tmp_path / "runs"
    # TensorFlow's warnings shown (level 1), to check that none comes from the input pipeline
    # (it warned at every epoch that a cached dataset was not read to its end).
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "1"}
    completed = subprocess.run(  # the README's command, its data generated afresh
        [sys.executable, "-m", "keras_attn.models.cli", "train", "transformer-reverse",
         "--data-dir", str(tmp_path / "tfds"), "--output", str(out)],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    console = completed.stdout + completed.stderr
    assert "did not fully read the dataset being cached" not in console, console[-3000:]
    assert "Epoch 3/3" in console  # the default: 3 epochs, shown as 3 (not checkpoint chunks)
    metrics = json.loads((out / "transformer-reverse_metrics.json").read_text())
    assert metrics["exact_match"] >= REQUIRED
    assert metrics["exact_match"] == pytest.approx(stated_exact_match(), abs=TOLERANCE)
    assert "first test pair" in completed.stdout  # the example printed and plotted
    assert (out / "transformer-reverse_attention.png").stat().st_size > 0

    # Text in, text out (README, "Text in, text out"): the command, then the SavedModel called
    # with 20 random letter sequences by TensorFlow alone (keras and keras_attn unfindable).
    predicted = subprocess.run(
        [sys.executable, "-m", "keras_attn.models.cli", "predict", "transformer-reverse",
         "n a f h g", "--runs-dir", str(out)],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert predicted.returncode == 0 and predicted.stdout == "g h f a n\n", predicted.stderr
    from test_models_text import tensorflow_alone

    rng = np.random.default_rng(0)
    letters = [" ".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(5, 21)))
               for _ in range(20)]  # fmt: skip
    served = tensorflow_alone(out / "transformer-reverse_savedmodel", letters)["text"]
    expected = [" ".join(t.split()[::-1]) for t in letters]
    reversed_right = sum(o == e for o, e in zip(served, expected, strict=True))
    assert reversed_right >= 19, list(zip(letters, served, strict=True))

    # What the quick run's tiny run of the command checks (test_cli.py, left out of CI, which
    # runs this test): the `.keras` file reloads safely; the SavedModel decodes token ids.
    import keras
    import tensorflow as tf

    assert keras.saving.load_model(out / "transformer-reverse.keras", safe_mode=True) is not None
    served = tf.saved_model.load(str(out / "transformer-reverse_savedmodel"))
    tokens = served.greedy_decode(tf.constant(np.ones((2, 5), "int32"))).numpy()
    assert tokens.shape[0] == 2 and tokens.dtype == np.int32
