"""Run the peers' own test files with only the class swapped for ours.

    python tools/peer_suites.py PEER_TEST_FILE_OR_DIR ... [--keep DIR] [-- PYTEST_ARGS ...]

Each file (a directory stands for its `*_test.py` files) is rewritten so that
the peer's class names ours and nothing else changes: Keras' tests reach their
layer as `layers.MultiHeadAttention` / `layers.GroupedQueryAttention`
(`from keras.src import layers`), which become `keras_attn.MultiHeadAttention`
/ `keras_attn.GroupedQueryAttention`; keras-hub's tests import their class
(`from keras_hub.src.layers.modeling.transformer_encoder import
TransformerEncoder`), which becomes `from keras_attn import TransformerEncoder`.
The peers' test helpers (`keras.src.testing`, `keras_hub.src.tests.test_case`)
stay theirs: the test is the peer's, only the layer is ours. A file with
nothing to swap is refused, never run against the peer's own class.

The rewritten files are run by pytest in one temporary folder (`--keep` keeps
them there), on the Keras backend of the environment (`KERAS_BACKEND`), and
a table is printed: per file the tests collected, passed, skipped and failed,
and each failing test with the first line of its error. Exit status: 0 when
no test failed, 1 otherwise, 2 for bad arguments.

The peers' files are not in this repository: take them from the installed
`keras` (`keras/src/layers/attention/*_test.py` ship with it) or from the
peers' repositories (keras-hub's tests do not ship with its wheel, and its
`test_case` module imports `grain`). docs/coming-from-keras.md has the
table for Keras 3.15 and keras-hub 0.32 and the command that made it.
"""

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

# The peers' classes that keras_attn answers to under the same name.
PEER_CLASSES = (
    "MultiHeadAttention",
    "GroupedQueryAttention",
    "GroupQueryAttention",
    "TransformerEncoder",
    "TransformerDecoder",
    "PositionEmbedding",
    "SinePositionEncoding",
    "RotaryEmbedding",
    "TokenAndPositionEmbedding",
    "AlibiBias",
)
_NAMES = "|".join(PEER_CLASSES)
# `layers.MultiHeadAttention`, `keras.layers.MultiHeadAttention`, `keras_hub.layers.X`: an
# attribute of a peer's layers module (not `ours.layers.X`, not a longer dotted path).
_ATTRIBUTE = re.compile(rf"(?<![\w.])(?:keras\.|keras_hub\.)?layers\.({_NAMES})\b")
# `from keras_hub.src.layers.modeling.x import X` (or `import (X,)`, or `keras_hub.layers`,
# or Keras' `keras.src.layers...`): a peer's import of its own class.
_IMPORT = re.compile(
    r"^from\s+(?:keras_hub|keras)(?:\.\w+)*\s+import\s+(\([^)]*\)|[^\n(]+)$", re.MULTILINE
)
_PEER_MODULE = re.compile(r"^from\s+(keras_hub|keras)\.(?:src\.)?layers\b")


def _imported_names(clause):
    names = [n.strip() for n in clause.strip("() \n").replace("\n", " ").split(",")]
    return [n for n in names if n]


def rewrite(source):
    """`(source with the peers' classes swapped for keras_attn's, number of swaps)`.

    Only a peer's import of a class in `PEER_CLASSES` (from its layers
    modules) and attribute access `layers.<Class>` change; every other line is
    kept as written. `import keras_attn` is added at the top when an attribute
    was swapped.
    """
    swaps = 0

    def swap_import(match):
        nonlocal swaps
        names = _imported_names(match.group(1))
        statement = match.group(0)
        if not _PEER_MODULE.match(statement) or not names:
            return statement
        if any(n.split(" as ")[0].strip() not in PEER_CLASSES for n in names):
            return statement  # an import of something else from the peer stays the peer's
        swaps += len(names)
        return f"from keras_attn import {', '.join(names)}"

    def swap_attribute(match):
        nonlocal swaps
        swaps += 1
        return f"keras_attn.{match.group(1)}"

    source = _IMPORT.sub(swap_import, source)
    imported = swaps
    source = _ATTRIBUTE.sub(swap_attribute, source)
    if swaps > imported and not re.search(r"^import keras_attn$", source, re.MULTILINE):
        source = "import keras_attn\n" + source
    return source, swaps


def _collect(paths):
    files = []
    for path in map(pathlib.Path, paths):
        if path.is_dir():
            files += sorted(path.glob("*_test.py")) + sorted(path.glob("test_*.py"))
        elif path.is_file():
            files.append(path)
        else:
            raise SystemExit(f"peer_suites: no such file or directory: {path}")
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise SystemExit(f"peer_suites: two files share a name: {sorted(names)}")
    return files


def _results(junit):
    """`{file stem: [(test id, outcome, message)]}` from pytest's JUnit XML."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        stem = case.get("classname", "").split(".")[0]
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", (child.get("message") or "").strip()
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        out.setdefault(stem, []).append((case.get("name"), outcome, message.splitlines()[:1]))
    return out


def table(results, files):
    """The markdown table of `results` (from `_results`), one row per file and a total."""
    lines = [
        "| file | tests | passed | skipped | failed | failing tests |",
        "|---|---|---|---|---|---|",
    ]
    totals = [0, 0, 0, 0]
    for path in files:
        cases = results.get(path.stem, [])
        counts = [len(cases)] + [
            sum(o == k for _, o, _ in cases) for k in ("passed", "skipped", "failed")
        ]
        totals = [t + c for t, c in zip(totals, counts, strict=True)]
        failing = "; ".join(
            f"`{name}`" + (f" ({msg[0][:100]})" if msg else "")
            for name, o, msg in cases
            if o == "failed"
        )
        lines.append(f"| {path.name} | " + " | ".join(map(str, counts)) + f" | {failing} |")
    lines.append("| total | " + " | ".join(map(str, totals)) + " | |")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    pytest_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="the peers' test files, or folders of them")
    parser.add_argument("--keep", help="write the rewritten files here and keep them")
    args = parser.parse_args(argv)
    files = _collect(args.paths)
    folder = args.keep or tempfile.mkdtemp(prefix="keras-attn-peers-")
    os.makedirs(folder, exist_ok=True)
    try:
        for path in files:
            source, swaps = rewrite(path.read_text())
            if not swaps:
                print(f"peer_suites: {path}: no peer class to swap; refused", file=sys.stderr)
                return 2
            (pathlib.Path(folder) / path.name).write_text(source)
        junit = os.path.join(folder, "junit.xml")
        root = str(pathlib.Path(__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   "--rootdir", folder, "-o", "addopts=", f"--junitxml={junit}",
                   *pytest_args, *(p.name for p in files)]  # fmt: skip
        subprocess.run(command, cwd=folder, env=env, check=False)
        if not os.path.exists(junit):
            print("peer_suites: pytest wrote no results", file=sys.stderr)
            return 2
        results = _results(junit)
        print(f"\nKeras backend: {os.environ.get('KERAS_BACKEND', 'tensorflow')}")
        print(table(results, files))
        return int(any(o == "failed" for cases in results.values() for _, o, _ in cases))
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
