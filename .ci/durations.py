"""Writes tests/durations.json: each test file's measured time per CI step, from pytest logs.

    python .ci/durations.py STEP LOG [STEP LOG ...]
    # STEP: tensorflow (the quick run), tensorflow-slow (-m slow), jax, torch

CI runs the quick and the slow tests on TensorFlow in one run (`-m "slow or not slow"`),
whose log cannot be told apart by step: measure each step with its own run for this.

Each LOG is the output of a step run with `--durations=0`. tests/conftest.py sends the files
to the xdist workers longest first (so that no long file starts last while the other worker
idles); the figures only order the files, a stale one costs wall time, never a result.
"""

import collections
import json
import os
import re
import sys

LINE = re.compile(r"^([\d.]+)s (?:call|setup|teardown)\s+(tests/[^:]+)::", re.MULTILINE)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "tests", "durations.json")


def main(argv):
    if not argv or len(argv) % 2:
        sys.exit(__doc__)
    table = {}
    if os.path.exists(PATH):
        with open(PATH) as f:
            table = json.load(f)
    for step, log in zip(argv[::2], argv[1::2], strict=True):
        seconds = collections.Counter()
        with open(log) as f:
            for match in LINE.finditer(f.read()):
                seconds[os.path.basename(match.group(2))] += float(match.group(1))
        table[step] = {name: round(s, 1) for name, s in seconds.most_common()}
    with open(PATH, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
