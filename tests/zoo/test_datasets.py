"""The project's tfds builders: tiny configs prepared offline, labels checked independently."""

import functools
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import keras_attn.models.datasets
from keras_attn.models import geometry
from keras_attn.models.datasets import convex_hull_indices, loading

SEQ2SEQ = ("keras_attn_seq2seq/tiny-copy", "keras_attn_seq2seq/tiny-reverse")
ADDITION = "keras_attn_seq2seq/tiny-addition"
TINY = ("keras_attn_sorting/tiny", "keras_attn_convex_hull/tiny", *SEQ2SEQ, ADDITION)
SIZES = {"train": 256, "validation": 64, "test": 64}


def prepare(data_dir):
    for name in TINY:
        tfds.builder(name, data_dir=data_dir).download_and_prepare()
    return str(data_dir)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return prepare(tmp_path_factory.mktemp("tfds"))


@functools.cache
def examples(name, split, data_dir):
    """All `(inputs, targets)` of a split as NumPy, read once per test session."""
    ds = tfds.load(name, split=split, as_supervised=True, data_dir=data_dir, download=False)
    return list(tfds.as_numpy(ds))


def check_hull(points, hull):
    """Asserts that `hull` is the convex hull of `points`, CCW from its lowest index."""
    p = np.asarray(points, np.float64)  # exact signs: float32 differences and products fit
    assert hull.ndim == 1 and 3 <= hull.size <= len(p) and len(set(hull.tolist())) == hull.size
    assert 0 <= hull.min() and hull.max() < len(p)
    assert hull[0] == hull.min(), "starts at the lowest index"
    v = p[hull]  # (k, 2) vertices in order
    edge = np.roll(v, -1, axis=0) - v  # (k, 2) edge i goes v_i -> v_{i+1}
    rel = p[None, :, :] - v[:, None, :]  # (k, n, 2)
    side = edge[:, None, 0] * rel[..., 1] - edge[:, None, 1] * rel[..., 0]  # (k, n)
    assert (side >= 0).all(), "a point lies outside (right of) a hull edge"
    x, y = v[:, 0], v[:, 1]
    assert np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y) > 0, "counter-clockwise"
    # Extreme: the sum of the outward normals of a vertex's two edges gives a direction in
    # which that vertex is the unique farthest input point.
    normal = np.stack([edge[:, 1], -edge[:, 0]], axis=1)  # (k, 2) outward for CCW
    direction = normal + np.roll(normal, 1, axis=0)  # (k, 2) edges i-1 and i meet at v_i
    reach = direction @ p.T  # (k, n)
    others = np.ones_like(reach, dtype=bool)
    others[np.arange(len(hull)), hull] = False
    vertex_reach = np.sum(direction * v, axis=1)  # (k,)
    assert (reach[others].reshape(len(hull), -1) < vertex_reach[:, None]).all(), "not extreme"


@pytest.mark.parametrize("name", TINY)
def test_features_dtypes_and_splits(name, data_dir):
    builder = tfds.builder(name, data_dir=data_dir)
    assert {s: builder.info.splits[s].num_examples for s in SIZES} == SIZES
    ds = builder.as_dataset(split="train", as_supervised=True)
    spec = {
        "keras_attn_sorting": ((5, 1), tf.float32, (5,), tf.int32),
        "keras_attn_convex_hull": ((None, 2), tf.float32, (None,), tf.int32),
        "keras_attn_seq2seq": ((), tf.string, (), tf.string),
    }[builder.name]
    x, y = ds.element_spec
    assert (tuple(x.shape), x.dtype, tuple(y.shape), y.dtype) == spec
    if builder.name == "keras_attn_seq2seq":
        assert builder.info.supervised_keys == ("src", "tgt")
        assert isinstance(builder.info.features, tfds.features.Translation)
    else:
        assert builder.info.supervised_keys == ("inputs", "targets")
    if builder.name == "keras_attn_convex_hull":
        assert isinstance(builder.info.features["targets"], tfds.features.Sequence)


def test_seq2seq_has_the_feature_type_of_real_translation_data(tmp_path):
    ted = tfds.builder("ted_hrlr_translate/pt_to_en", data_dir=tmp_path)  # code only, no data
    ours = tfds.builder("keras_attn_seq2seq/tiny-copy", data_dir=tmp_path)
    assert type(ours.info.features) is type(ted.info.features)


def test_every_builder_has_a_tiny_config():
    for builder in (
        keras_attn.models.datasets.KerasAttnSorting,
        keras_attn.models.datasets.KerasAttnConvexHull,
    ):
        assert "tiny" in builder.builder_configs
    tiny = [
        c for c in keras_attn.models.datasets.KerasAttnSeq2seq.BUILDER_CONFIGS if "tiny" in c.name
    ]
    assert sorted(c.task for c in tiny) == ["addition", "copy", "reverse"]


@pytest.mark.parametrize("split", list(SIZES))
def test_sorting_targets_sort_the_inputs(split, data_dir):
    for x, y in examples("keras_attn_sorting/tiny", split, data_dir):
        assert sorted(y.tolist()) == list(range(5))
        np.testing.assert_array_equal(x[y, 0], np.sort(x[:, 0]))
        assert (np.diff(x[y, 0]) > 0).all() and (x >= 0).all() and (x < 1).all()


@pytest.mark.parametrize("split", list(SIZES))
def test_convex_hull_targets_are_the_hull(split, data_dir):
    lengths = set()
    for points, hull in examples("keras_attn_convex_hull/tiny", split, data_dir):
        assert points.dtype == np.float32 and ((points >= 0) & (points < 1)).all()
        lengths.add(len(points))
        check_hull(points, hull)
    assert lengths <= set(range(5, 11)) and len(lengths) > 1


def test_convex_hull_by_hand():
    square = [[0, 0], [1, 1], [0.5, 0.5], [1, 0], [0, 1], [0.5, 0]]  # interior, on an edge
    assert convex_hull_indices(square).tolist() == [0, 3, 1, 4]
    clockwise = [[1, 1], [0, 0], [0, 1], [1, 0]]
    assert convex_hull_indices(clockwise).tolist() == [0, 2, 1, 3]
    grid = np.stack(np.meshgrid(np.arange(4.0), np.arange(4.0)), -1).reshape(-1, 2)
    hull = convex_hull_indices(grid)  # collinear points on every edge: corners only
    assert sorted(grid[hull].tolist()) == [[0, 0], [0, 3], [3, 0], [3, 3]]
    check_hull(grid, hull)
    assert convex_hull_indices(np.zeros((0, 2))).tolist() == []
    with pytest.raises(ValueError, match="points.shape"):
        convex_hull_indices(np.zeros((4, 3)))


def test_convex_hull_random_point_sets():
    rng = np.random.default_rng(0)
    for n in [3, 4, 5, 8, 20, 50, 200] * 10:
        points = rng.random((n, 2)).astype(np.float32)
        check_hull(points, convex_hull_indices(points))
    area = geometry.polygon_area(points, convex_hull_indices(points))
    assert 0.9 < area < 1.0  # 200 uniform points nearly fill the unit square


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_copy_and_reverse_targets(name, data_dir):
    for split in SIZES:
        for src, tgt in examples(name, split, data_dir):
            tokens = src.decode().split(" ")
            assert 3 <= len(tokens) <= 8 and all(t.isalpha() and len(t) == 1 for t in tokens)
            expected = tokens if name.endswith("copy") else tokens[::-1]
            assert tgt.decode().split(" ") == expected


def test_addition_targets(data_dir):
    for split in SIZES:
        for src, tgt in examples(ADDITION, split, data_dir):
            a, b = src.decode().split(" plus ")
            digits = [s.replace(" ", "") for s in (a, b, tgt.decode())]
            assert all(1 <= len(d) <= 3 for d in digits[:2])
            assert all(d == str(int(d)) for d in digits), "one digit per token, no leading zeros"
            assert int(digits[0]) + int(digits[1]) == int(digits[2])


@pytest.mark.parametrize("name", [*SEQ2SEQ, ADDITION])
def test_held_out_sources_are_disjoint(name, data_dir):
    sources = {s: {src for src, _ in examples(name, s, data_dir)} for s in SIZES}
    assert len(sources["validation"]) == 64 and len(sources["test"]) == 64
    assert not sources["train"] & (sources["validation"] | sources["test"])
    assert not sources["validation"] & sources["test"]


def test_generation_is_deterministic(data_dir, tmp_path):
    again = prepare(tmp_path)
    everything = "+".join(SIZES)  # one read per config
    for name in TINY:
        first, second = examples(name, everything, data_dir), examples(name, everything, again)
        assert len(first) == len(second) == sum(SIZES.values())
        for a, b in zip(first, second, strict=True):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
        train, test = examples(name, "train", data_dir), examples(name, "test", data_dir)
        assert {bytes(np.asarray(x).tobytes()) for x, _ in train[:64]}.isdisjoint(
            {bytes(np.asarray(x).tobytes()) for x, _ in test}
        ), "each split has its own seed"


def test_load_prepares_and_pads(tmp_path, capsys):
    ds = keras_attn.models.datasets.load(
        "keras_attn_convex_hull/tiny", "train", str(tmp_path), batch_size=32
    )
    assert tfds.builder("keras_attn_convex_hull/tiny", data_dir=tmp_path).is_prepared()
    # Generated here, nothing downloaded: none of tfds' "Downloading and preparing" lines.
    assert "prepar" not in capsys.readouterr().out
    for points, hull in tfds.as_numpy(ds):
        pad = (points == loading.PAD_VALUE).all(axis=-1)  # (B, T) padded positions
        assert (points[~pad] >= 0).all()
        n = (~pad).sum(axis=1)
        assert not any(pad[i, : n[i]].any() for i in range(len(n))), "padding comes last"
        for i in range(len(hull)):
            k = int((hull[i] != loading.PAD_INDEX).sum())
            assert (hull[i, k:] == loading.PAD_INDEX).all()
            check_hull(points[i, : n[i]], hull[i, :k])
    ds = keras_attn.models.datasets.load("keras_attn_sorting/tiny", "test", tmp_path, batch_size=16)
    x, y = next(iter(ds))
    assert x.shape == (16, 5, 1) and y.shape == (16, 5)


def test_load_never_downloads(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloads"):
        keras_attn.models.datasets.load("mnist", "train", str(tmp_path))


def test_importing_the_zoo_does_not_import_tfds():
    code = "import sys, keras_attn.models; assert 'tensorflow_datasets' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_size_configs_for_length_generalisation(tmp_path):
    sorting = keras_attn.models.datasets.KerasAttnSorting.builder_configs
    hull = keras_attn.models.datasets.KerasAttnConvexHull.builder_configs
    assert (sorting["n5-20"].min_len, sorting["n5-20"].max_len) == (5, 20)
    assert (hull["n5-50"].min_len, hull["n5-50"].max_len) == (5, 50)
    for config in (sorting["n50"], sorting["n100"], hull["n100"], hull["n200"]):
        assert config.min_len == config.max_len and config.num_train == 10_000
        assert config.num_test == 2_000
    mixed = tfds.builder("keras_attn_sorting/n5-20", data_dir=tmp_path)  # code only, no data
    assert mixed.info.features["inputs"].shape == (None, 1)
    rng = np.random.default_rng(0)
    lengths = set()
    for _ in range(50):  # the generator itself, without preparing 100,000 examples
        example = mixed._example(rng)
        x, y = example["inputs"], example["targets"]
        lengths.add(len(x))
        assert (np.diff(x[y, 0]) > 0).all() and sorted(y.tolist()) == list(range(len(x)))
    assert lengths <= set(range(5, 21)) and len(lengths) > 5
    big = tfds.builder("keras_attn_convex_hull/n200", data_dir=tmp_path)
    example = big._example(rng)
    assert example["inputs"].shape == (200, 2)
    check_hull(example["inputs"], example["targets"])
