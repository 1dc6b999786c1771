"""The README's demo, `python examples/demo.py`, gives the figures the README states.

The figures are read from the README, so a change under the demo that moves them fails
here until the README is measured again.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# oneDNN's summation order may flip a test answer or two: 1 point is 20 of 2,000 examples.
TOLERANCE = 1.0


def readme_figures():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    match = re.search(
        r"reaches ([\d.]+) % test accuracy with `keras_attn.AdditiveAttention` and ([\d.]+) %"
        r" with mean\s+pooling",
        text,
    )
    assert match, "the README no longer states the demo's two accuracies"
    return float(match.group(1)), float(match.group(2))


def test_readme_states_the_demo_figures():
    attention, pooling = readme_figures()
    assert 0 <= pooling < attention <= 100


@pytest.mark.slow
def test_demo_reaches_the_readme_figures():
    completed = subprocess.run(
        [sys.executable, "examples/demo.py"], cwd=ROOT, capture_output=True, text=True,
        timeout=900, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    measured = dict(
        re.findall(r"(additive attention|mean pooling): test accuracy ([\d.]+)%", completed.stdout)
    )
    attention, pooling = readme_figures()
    assert float(measured["additive attention"]) == pytest.approx(attention, abs=TOLERANCE)
    assert float(measured["mean pooling"]) == pytest.approx(pooling, abs=TOLERANCE)
