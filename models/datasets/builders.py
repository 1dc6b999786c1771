"""The project's own tfds builders: synthetic tasks generated locally, no network.

Importing this module registers `keras_attn_sorting`, `keras_attn_convex_hull` and
`keras_attn_seq2seq` with tensorflow-datasets (import it through one path only: tfds
refuses to register a name twice). Every config has `train`, `validation` and `test`
splits, each generated from its own fixed seed, so a config always holds the same data.
"""

import dataclasses
import string
import zlib

import numpy as np
import tensorflow_datasets as tfds

from ..geometry import convex_hull_indices
from .bundled import LocalBuilder

SPLITS = ("train", "validation", "test")
_POINTER_NETWORKS = "https://arxiv.org/abs/1506.03134"
_CITATION = """@inproceedings{vinyals2015pointer,
  title={Pointer Networks}, author={Vinyals, Oriol and Fortunato, Meire and Jaitly, Navdeep},
  booktitle={Advances in Neural Information Processing Systems}, year={2015}}"""


@dataclasses.dataclass
class SyntheticConfig(tfds.core.BuilderConfig):
    """A synthetic task's size: sequence lengths and examples per split.

    Args:
        name: the config name, e.g. `"n10"` (loaded as `"keras_attn_sorting/n10"`).
        min_len: the shortest sequence (points, numbers, tokens or digits per operand).
        max_len: the longest; each example draws its length uniformly in `[min_len, max_len]`.
        num_train: examples in `train`; `num_validation`, `num_test` likewise.
        seed: combined with the builder, config and split names into each split's seed.
        task: `"copy"`, `"reverse"` or `"addition"` (`keras_attn_seq2seq` only).
    """

    min_len: int = 10
    max_len: int = 10
    num_train: int = 100_000
    num_validation: int = 2_000
    num_test: int = 2_000
    seed: int = 0
    task: str = ""


def _tiny(name, **kwargs):
    return SyntheticConfig(name=name, num_train=256, num_validation=64, num_test=64, **kwargs)


def _evaluation(name, **kwargs):
    """A config for testing generalisation to a larger size: a smaller `train` split."""
    return SyntheticConfig(name=name, num_train=10_000, **kwargs)


class _SyntheticBuilder(LocalBuilder, skip_registration=True):
    """Shared split logic: seeded generation, held-out splits disjoint from `train`."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}

    def _example(self, rng: np.random.Generator) -> dict:
        raise NotImplementedError

    def _identity(self, example: dict):
        """A hashable identity to keep held-out examples out of `train`; None: no check."""
        return None

    def _length_shape(self) -> int | None:
        c = self.builder_config
        return c.max_len if c.min_len == c.max_len else None

    def _split_generators(self, dl_manager):
        del dl_manager  # everything is generated here: nothing to download
        # Validation and test are drawn first, in memory (a few thousand examples), so that
        # `train` can skip their identities whatever order tfds runs the generators in.
        held_out = set()
        splits = {s: list(self._generate_examples(s, held_out)) for s in SPLITS[1:]}
        return {"train": self._generate_examples("train", held_out), **splits}

    def _generate_examples(self, split, held_out):
        c = self.builder_config
        size = getattr(c, f"num_{split}")
        name = f"{self.name}/{c.name}/{split}".encode()
        rng = np.random.default_rng([c.seed, zlib.crc32(name)])
        count, skipped = 0, 0
        while count < size:
            example = self._example(rng)
            key = self._identity(example)
            if key is not None and key in held_out:
                skipped += 1
                if skipped > 10 * size + 1000:
                    raise ValueError(f"{c.name!r}: too few distinct examples for {size} {split}")
                continue
            if key is not None and split != "train":
                held_out.add(key)
            yield count, example
            count += 1


class KerasAttnSorting(_SyntheticBuilder):
    """Sorting for pointer networks: n floats in [0, 1) -> the argsort pointers.

    `inputs` float32 `(n, 1)` holds distinct uniform floats, `targets` int32 `(n,)` the
    indices that sort them: `inputs[targets, 0]` is ascending. Configs `n5`, `n10`, `n15`,
    `n20` and `n5-20` (n uniform in 5..20, so `inputs` is `(None, 1)`), each 100,000 train,
    2,000 validation, 2,000 test; `n50` and `n100` (10,000 train: sizes to evaluate length
    generalisation at); `tiny` (n=5; 256/64/64). Mixed sizes pad as the convex hull does.

    Example:

    ```python
    from .. import datasets  # noqa: F401
    ds = keras_attn.models.datasets.load("keras_attn_sorting/n10", "train", batch_size=128)
    # (inputs (128, 10, 1) float32, targets (128, 10) int32)
    ```

    Reference:
        O. Vinyals, S. Bengio, M. Kudlur, "Order Matters: Sequence to sequence for sets",
        ICLR 2016, https://arxiv.org/abs/1511.06391
    """

    BUILDER_CONFIGS = [
        *(SyntheticConfig(name=f"n{n}", min_len=n, max_len=n) for n in (5, 10, 15, 20)),
        SyntheticConfig(name="n5-20", min_len=5, max_len=20),
        *(_evaluation(f"n{n}", min_len=n, max_len=n) for n in (50, 100)),
        _tiny("tiny", min_len=5, max_len=5),
    ]

    def _info(self):
        n = self._length_shape()
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.__doc__.split("\n")[0],
            features=tfds.features.FeaturesDict(
                {
                    "inputs": tfds.features.Tensor(shape=(n, 1), dtype=np.float32),
                    "targets": tfds.features.Tensor(shape=(n,), dtype=np.int32),
                }
            ),
            supervised_keys=("inputs", "targets"),
            homepage="https://arxiv.org/abs/1511.06391",
        )

    def _example(self, rng):
        c = self.builder_config
        n = int(rng.integers(c.min_len, c.max_len + 1))
        x = rng.random(n).astype(np.float32)
        while np.unique(x).size < n:  # float32 ties would make the target ambiguous
            x = rng.random(n).astype(np.float32)
        return {"inputs": x[:, None], "targets": np.argsort(x, kind="stable").astype(np.int32)}


class KerasAttnConvexHull(_SyntheticBuilder):
    """Planar convex hull: n points in the unit square -> the hull's vertex indices.

    `inputs` float32 `(n, 2)` holds uniform points, `targets` int32 `(k,)` (a `Sequence`,
    k varies) the hull vertices counter-clockwise, starting at the lowest index, as in
    Pointer Networks (0-based here). Configs `n5`, `n10`, `n50`, `n5-50` (n uniform in
    5..50, so `inputs` is `(None, 2)`), each 100,000 train, 2,000 validation, 2,000 test;
    `n100` and `n200` (10,000 train: the paper's generalisation sizes); `tiny` (n in 5..10;
    256/64/64).

    Padding: `padded_batch` with `padding_values=(PAD_VALUE, PAD_INDEX)` (what `load(...,
    batch_size=B)` does) pads points with -1.0, outside the unit square, so
    `keras.layers.Masking(PAD_VALUE)` recovers the input mask, and pads targets with -1,
    never a valid index. The first -1 of a target row is its end of sequence: a decoder
    with an end pointer learns to point there; a loss should ignore the later ones.

    Example:

    ```python
    from .. import datasets  # noqa: F401
    ds = keras_attn.models.datasets.load("keras_attn_convex_hull/n5-50", "train", batch_size=128)
    # (inputs (128, None, 2) float32 padded with -1.0, targets (128, None) int32 padded with -1)
    ```

    Reference:
        O. Vinyals, M. Fortunato, N. Jaitly, "Pointer Networks", NeurIPS 2015,
        https://arxiv.org/abs/1506.03134
    """

    BUILDER_CONFIGS = [
        *(SyntheticConfig(name=f"n{n}", min_len=n, max_len=n) for n in (5, 10, 50)),
        SyntheticConfig(name="n5-50", min_len=5, max_len=50),
        *(_evaluation(f"n{n}", min_len=n, max_len=n) for n in (100, 200)),
        _tiny("tiny", min_len=5, max_len=10),
    ]

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.__doc__.split("\n")[0],
            features=tfds.features.FeaturesDict(
                {
                    "inputs": tfds.features.Tensor(
                        shape=(self._length_shape(), 2), dtype=np.float32
                    ),
                    "targets": tfds.features.Sequence(np.int32),
                }
            ),
            supervised_keys=("inputs", "targets"),
            homepage=_POINTER_NETWORKS,
            citation=_CITATION,
        )

    def _example(self, rng):
        c = self.builder_config
        n = int(rng.integers(c.min_len, c.max_len + 1))
        while True:  # the hull is computed on the stored float32 values
            points = rng.random((n, 2)).astype(np.float32)
            hull = convex_hull_indices(points)
            distinct = np.unique(points.view(np.int64)).size == n  # one int64 per (x, y)
            if hull.size >= 3 and distinct:
                return {"inputs": points, "targets": hull}


def _spaced(number: int) -> str:
    return " ".join(str(number))  # 407 -> "4 0 7"


class KerasAttnSeq2seq(_SyntheticBuilder):
    """Seq2seq toy tasks as text pairs: copy, reverse and integer addition.

    Same feature type as `ted_hrlr_translate`: `tfds.features.Translation` with languages
    `src` and `tgt` (supervised keys `("src", "tgt")`), each a string of space-separated
    one-character tokens, so one `TextVectorization` pipeline serves these and real
    translation data. Copy and reverse use the letters a-z (`"q b x"` -> `"x b q"`);
    addition writes each operand digit by digit with the word `plus` (it survives
    punctuation stripping): `"4 0 7 plus 9 5"` -> `"5 0 2"`. The lengths count tokens for
    copy and reverse, digits per operand for addition. Validation and test sources are
    distinct and never appear in `train`. Configs `copy-5-20`, `reverse-5-20`,
    `reverse-5-50`, `addition-1-5`, `addition-1-10` (100,000/2,000/2,000) and
    `tiny-copy`, `tiny-reverse`, `tiny-addition` (256/64/64).

    Example:

    ```python
    import tensorflow_datasets as tfds
    from .. import datasets  # noqa: F401   registers the builders
    ds = tfds.load("keras_attn_seq2seq/reverse-5-20", split="train", as_supervised=True)
    # (b"q b x", b"x b q"), ...: scalar strings, ready for keras.layers.TextVectorization
    ```

    Reference:
        W. Zaremba, I. Sutskever, "Learning to Execute", 2014 (copy and addition tasks),
        https://arxiv.org/abs/1410.4615
    """

    BUILDER_CONFIGS = [
        SyntheticConfig(name="copy-5-20", task="copy", min_len=5, max_len=20),
        SyntheticConfig(name="reverse-5-20", task="reverse", min_len=5, max_len=20),
        SyntheticConfig(name="reverse-5-50", task="reverse", min_len=5, max_len=50),
        SyntheticConfig(name="addition-1-5", task="addition", min_len=1, max_len=5),
        SyntheticConfig(name="addition-1-10", task="addition", min_len=1, max_len=10),
        _tiny("tiny-copy", task="copy", min_len=3, max_len=8),
        _tiny("tiny-reverse", task="reverse", min_len=3, max_len=8),
        _tiny("tiny-addition", task="addition", min_len=1, max_len=3),
    ]

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.__doc__.split("\n")[0],
            features=tfds.features.Translation(languages=("src", "tgt")),
            supervised_keys=("src", "tgt"),
            homepage="https://arxiv.org/abs/1410.4615",
        )

    def _identity(self, example):
        return example["src"]

    def _example(self, rng):
        c = self.builder_config
        if c.task == "addition":
            a, b = (self._number(rng) for _ in range(2))
            return {"src": f"{_spaced(a)} plus {_spaced(b)}", "tgt": _spaced(a + b)}
        if c.task not in ("copy", "reverse"):
            raise ValueError(f"Unknown task. Received: task={c.task!r}")
        n = int(rng.integers(c.min_len, c.max_len + 1))
        tokens = [string.ascii_lowercase[i] for i in rng.integers(0, 26, size=n)]
        target = tokens[::-1] if c.task == "reverse" else tokens
        return {"src": " ".join(tokens), "tgt": " ".join(target)}

    def _number(self, rng) -> int:
        c = self.builder_config
        digits = int(rng.integers(c.min_len, c.max_len + 1))
        low = 0 if digits == 1 else 10 ** (digits - 1)  # no leading zeros
        return int(rng.integers(low, 10**digits))
