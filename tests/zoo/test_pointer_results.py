"""What the pointer-network results rest on: metrics by hand, polygon beam search, recipes."""

import json

import numpy as np
import pytest

from keras_attn.models import geometry, pointer_decode, pointer_network
from keras_attn.models.datasets import convex_hull_indices
from keras_attn.models.decoding import polygon_decode
from keras_attn.models.pointer_search import convex_candidates, polygon_beam_search, sort_decode
from keras_attn.models.recipes import Settings, pointer, train

# A unit square with its centre and an edge midpoint: the hull is [0, 1, 2, 3].
SQUARE = np.array([[0, 0], [1, 0], [1, 1], [0, 1], [0.5, 0.5], [0.5, 0]], "float64")


# ---------------------------------------------------------------------------
# Metrics, against hand-computed cases
# ---------------------------------------------------------------------------


def test_validity_by_hand():
    assert geometry.is_valid_hull(SQUARE, [0, 1, 2, 3])
    assert geometry.is_valid_hull(SQUARE, [2, 1, 0, 3]), "any start, either orientation"
    assert geometry.is_valid_hull(SQUARE, [0, 1, 2, 3, 0, -1]), "closed and padded"
    assert not geometry.is_valid_hull(SQUARE, [0, 1, 2]), "misses the point [0, 1]"
    assert not geometry.is_valid_hull(SQUARE, [0, 2, 1, 3]), "a bow tie: not simple"
    assert not geometry.is_valid_hull(SQUARE, [0, 1, 2, 4, 3]), "a dent: not convex"
    assert not geometry.is_valid_hull(SQUARE, [0, 5, 1, 2, 3]), "a straight angle at [.5, 0]"
    assert not geometry.is_valid_hull(SQUARE, [0, 1, 2, 3, 1]), "repeats a vertex"
    assert not geometry.is_valid_hull(SQUARE, [0, 1]), "fewer than 3 vertices"


def test_convexity_and_containment_by_hand():
    pentagram = [[np.cos(a), np.sin(a)] for a in np.pi / 2 + 4 * np.pi / 5 * np.arange(5)]
    assert not geometry.is_convex_polygon(pentagram), "turns one way but crosses itself"
    assert geometry.is_convex_polygon(SQUARE[[3, 2, 1, 0]]), "clockwise is convex too"
    assert geometry.contains_points(SQUARE[:4], SQUARE), "the edge midpoint counts"
    assert geometry.contains_points(SQUARE[[3, 2, 1, 0]], SQUARE)
    assert not geometry.contains_points(SQUARE[[0, 1, 2]], SQUARE)


def test_hull_report_by_hand():
    points = np.concatenate([SQUARE, np.full((2, 2), -1.0)])[None]  # two padding points
    target = [[0, 1, 2, 3, 0, -1]]
    cases = {  # prediction: (exact, area, valid, simple)
        (0, 1, 2, 3): (1, 1.0, 1, 1),
        (1, 2, 3, 0): (0, 1.0, 1, 1),  # valid, but starts elsewhere
        (0, 1, 2): (0, 0.5, 0, 1),  # a triangle: half the square
        (0, 1, 2, 4, 3): (0, 0.75, 0, 1),  # a dent to the centre loses a quarter
        (0, 2, 1, 3): (0, 0.0, 0, 0),  # not simple: no area
        (0, 1, 1, 2): (0, 0.0, 0, 0),  # repeats a vertex
    }
    for predicted, (exact, area, valid, simple) in cases.items():
        report = geometry.hull_report(points, [np.array(predicted)], target, pad_value=-1.0)
        expected = {"exact_match": exact, "area_coverage": area, "valid": valid, "simple": simple}
        assert report == pytest.approx(expected), predicted
    with_padding = geometry.hull_report(points, [np.array([0, 1, 2, 3])], target)
    assert with_padding["valid"] == 0.0, "without pad_value the padding point is outside"
    assert geometry.hull_metrics(points, [np.array([0, 1, 2])], target) == (0.0, 0.5)


def test_hulls_train_from_their_leftmost_vertex_and_rotate_back_to_the_lowest_index():
    diamond = np.array([[0.5, 0], [1, 0.5], [0.5, 1], [0, 0.5], [0.5, 0.5]], "float32")
    closed = pointer._leftmost_first_closed(diamond, np.array([0, 1, 2, 3], "int32"))
    assert np.asarray(closed).tolist() == [3, 0, 1, 2, 3]  # [0, 0.5] is leftmost
    assert geometry.rotate_to_lowest_index(closed).tolist() == [0, 1, 2, 3]
    assert geometry.rotate_to_lowest_index([2, 5, 1, -1]).tolist() == [1, 2, 5]


def test_sorting_report_by_hand():
    targets = np.array([[2, 0, 1, -1], [0, 1, 2, 3]])  # the first example has 3 numbers
    decoded = np.array([[2, 0, 1, 3], [0, 2, 1, 3]])  # right; two of four positions wrong
    report = pointer.sorting_report(decoded, targets)
    assert report == {"sequence_accuracy": 0.5, "per_position_accuracy": 5 / 7}


# ---------------------------------------------------------------------------
# Decoding: sorting, polygon beam search
# ---------------------------------------------------------------------------


def test_prefix_decoding_makes_the_choices_of_full_array_decoding():
    # The decoders feed step t the first t + 1 pointers; the reference below feeds the
    # whole pointer array (-1 for the steps not decoded yet), as the model is trained.
    rng = np.random.default_rng(0)
    points = rng.uniform(size=(6, 9, 1)).astype("float32")
    points[2, 6:] = -1.0  # padding comes last
    model = pointer_network(input_dim=1, units=8, encoder="transformer", pad_value=-1.0)
    reference = np.full((6, 9), -1, "int32")
    for t in range(9):
        probs = np.asarray(model({"points": points, "pointers": reference}))[:, t]
        chosen = np.zeros((6, 9), bool)
        chosen[np.arange(6)[:, None], reference[:, :t]] = True
        reference[:, t] = np.argmax(np.where(chosen, -np.inf, probs), axis=-1)
    order = sort_decode(model, points)
    np.testing.assert_array_equal(order, reference)
    np.testing.assert_array_equal(order, pointer_decode(model, points))
    assert sorted(order[2, :6].tolist()) == list(range(6))


class _TableModel:
    """A stand-in pointer network: step t's probabilities depend on the last pointer only."""

    def __init__(self, table, first):
        self.table, self.first = np.asarray(table, float), np.asarray(first, float)

    def predict_on_batch(self, inputs):
        pointers = inputs["pointers"]
        probs = np.zeros(pointers.shape + (len(self.first),))
        probs[:, 0] = self.first
        for t in range(1, pointers.shape[1]):
            probs[:, t] = self.table[np.maximum(pointers[:, t - 1], 0)]
        return probs


def test_convex_candidates_by_hand():
    points = SQUARE[None, :5]
    assert convex_candidates(points, np.array([[0, -1]]), 1).tolist() == [[0, 1, 1, 1, 1]]
    after_edge = convex_candidates(points, np.array([[0, 1, -1]]), 2)  # left of 0 -> 1
    assert after_edge.tolist() == [[0, 0, 1, 1, 1]]
    assert convex_candidates(points, np.array([[0, 1, 2, -1]]), 3).tolist() == [[0, 0, 0, 1, 0]]
    assert not convex_candidates(points, np.array([[0, 1, 4, -1]]), 3)[0, 2], "would dent"


def test_beam_search_beats_a_greedy_trap():
    points = SQUARE[None, [0, 3, 1, 2, 4]].astype("float32")  # (0,0) (0,1) (1,0) (1,1) centre
    table = np.full((5, 5), 1e-3)  # p(next | last pointer)
    table[0, [1, 2]] = [0.6, 0.4]  # 0 -> 1 goes clockwise: no convex CCW polygon continues
    table[1, [0, 4]] = [0.8, 0.15]  # greedy may not close yet (t = 2): it takes the centre
    table[2, 3] = 1.0
    table[3, [0, 1]] = [0.1, 0.9]
    table[4, 3] = 1.0
    table /= table.sum(-1, keepdims=True)
    model = _TableModel(table, first=[1, 0, 0, 0, 0])
    greedy = polygon_decode(model, points)[0].tolist()
    assert greedy == [0, 1, 4, 3] and not geometry.is_valid_hull(points[0], greedy)
    polygons, scores = polygon_beam_search(model, points, beam_width=3)
    assert polygons[0].tolist() == [0, 2, 3, 1] == convex_hull_indices(points[0]).tolist()
    assert scores[0] == pytest.approx(np.log(table[0, 2] * table[2, 3] * table[3, 1] * table[1, 0]))
    plain, _ = polygon_beam_search(model, points, beam_width=1, convex=False)
    assert plain[0].tolist() == greedy, "width 1 without the constraint is greedy"


def test_beam_search_finds_the_hull_of_an_oracle():
    rng = np.random.default_rng(0)
    points = rng.uniform(size=(4, 9, 2)).astype("float32")
    points[1, 7:] = -1.0  # padding points: probability 0
    hulls = [convex_hull_indices(p[p[:, 0] >= 0]) for p in points]
    probs = np.full((4, 10, 9), 0.01)
    for i, hull in enumerate(hulls):
        closed = list(hull) + [hull[0]]
        probs[i, np.arange(len(closed)), closed] = 1.0
    probs[1, :, 7:] = 0.0

    class Oracle:
        def predict_on_batch(self, inputs):
            return np.repeat(probs, len(inputs["points"]) // 4, axis=0)

    polygons, scores = polygon_beam_search(Oracle(), points, beam_width=2)
    for got, want in zip(polygons, hulls, strict=True):
        np.testing.assert_array_equal(got, want)
    assert np.isfinite(scores).all()
    cut, cut_scores = polygon_beam_search(Oracle(), points, beam_width=2, max_vertices=2)
    for got, want in zip(cut, hulls, strict=True):  # gave up before closing: open prefixes
        np.testing.assert_array_equal(got, want[:3])
    assert np.isneginf(cut_scores).all()
    model = pointer_network(input_dim=2, units=8, mask_chosen=False, pad_value=-1.0)
    polygons, _ = polygon_beam_search(model, points, beam_width=3)  # an untrained model
    for polygon, p in zip(polygons, points, strict=True):
        assert len(polygon) >= 3 and len(set(polygon.tolist())) == len(polygon)
        assert geometry.is_convex_polygon(p[polygon]) and (p[polygon] >= 0).all()
    with pytest.raises(ValueError, match="`beam_width` must be a positive integer"):
        polygon_beam_search(model, points, beam_width=0)


# ---------------------------------------------------------------------------
# Recipes: sizes, end to end, an unfinished run
# ---------------------------------------------------------------------------


def test_sizes_name_builder_configs():
    assert pointer.parse_sizes("50,100,200") == [50, 100, 200]
    assert pointer.parse_sizes(None) == []
    with pytest.raises(ValueError, match="Received: 'fifty'"):
        pointer.parse_sizes("fifty")
    hull = "keras_attn_convex_hull/n5"
    assert pointer.sized_dataset(hull, "5-50") == "keras_attn_convex_hull/n5-50"
    assert pointer.sized_dataset(hull, "200") == "keras_attn_convex_hull/n200"
    assert pointer.sized_dataset("keras_attn_sorting/n5", "5-20") == "keras_attn_sorting/n5-20"
    assert pointer.sized_dataset(hull, None) == hull
    with pytest.raises(ValueError, match="No keras_attn_sorting config for n='7'"):
        pointer.sized_dataset("keras_attn_sorting/n5", "7")


@pytest.fixture
def tiny_sizes(monkeypatch):
    """Every size maps to the builder's tiny config: prepared in seconds."""
    monkeypatch.setattr(pointer, "sized_dataset", lambda name, n: name.split("/")[0] + "/tiny")


@pytest.mark.slow
@pytest.mark.parametrize("task", ["pointer-sort", "pointer-hull"])
def test_recipe_trains_on_mixed_sizes_and_evaluates_other_sizes(task, tiny_sizes, tmp_path):
    settings = Settings(
        data_dir=str(tmp_path / "tfds"), n="5-10", eval_n="20", epochs=1,
        train_examples=128, test_examples=8, batch_size=32,
    )  # fmt: skip
    result = train(task, settings)
    assert result.dataset.endswith("/tiny") and result.metrics["train_steps"] == 4
    names = ["sequence_accuracy"] + (
        ["area_coverage", "valid_polygons", "beam4_valid_polygons"]
        if task == "pointer-hull"
        else ["per_position_accuracy"]
    )
    for name in names:
        assert 0 <= result.metrics[name] <= 1 and 0 <= result.metrics[f"n20_{name}"] <= 1


@pytest.mark.slow
def test_an_unfinished_run_resumes_and_can_be_evaluated(tiny_sizes, tmp_path):
    backup = tmp_path / "backup"
    settings = Settings(
        data_dir=str(tmp_path / "tfds"), epochs=1, train_examples=64, test_examples=4,
        batch_size=8, backup_dir=str(backup),
    )  # fmt: skip
    model = pointer.build_model(hull=True)
    backup.mkdir()
    model.save_weights(str(backup / "latest.weights.h5"))  # as BackupAndRestore leaves it
    (backup / "training_metadata.json").write_text(json.dumps({"epoch": 1, "batch": 0}))
    metrics, steps = pointer.evaluate_backup("pointer-hull", settings)
    assert steps == 8 and 0 <= metrics["area_coverage"] <= 1  # one chunk of 64 / 8 steps
    result = train("pointer-hull", settings)  # 8 steps, chunks of 8: nothing left to run
    assert result.metrics["train_steps"] == 8
    assert sorted(p.name for p in backup.iterdir()) == ["final.weights.h5"]
    metrics, steps = pointer.evaluate_backup("pointer-hull", settings)  # the final weights
    assert steps == 8 and 0 <= metrics["beam4_sequence_accuracy"] <= 1


def test_hull_beam_command_measures_each_width_once_and_resumes(
    tiny_sizes, tmp_path, capsys, monkeypatch
):
    from experiments import hull_beam

    backup = tmp_path / "backup"
    backup.mkdir()
    pointer.build_model(hull=True).save_weights(str(backup / "final.weights.h5"))
    argv = ["--backup-dir", str(backup), "--eval-n", "20", "--widths", "1,2",
            "--test-examples", "4", "--data-dir", str(tmp_path / "tfds"),
            "--output", str(tmp_path / "beam.json")]  # fmt: skip
    hull_beam.main(argv)
    results = json.loads((tmp_path / "beam.json").read_text())["results"]
    assert sorted(results) == ["n20/w1", "n20/w2"]
    for found in results.values():
        assert 0 <= found["exact_match"] <= found["valid"] <= 1, "exact implies valid"
        assert 0 <= found["area_coverage"] <= 1
    assert "| n20 | " in capsys.readouterr().out

    def measured_again(*args):
        raise AssertionError("a saved width was decoded again")

    monkeypatch.setattr(hull_beam, "measure", measured_again)
    hull_beam.main(argv)  # every pair is in the JSON already
    with pytest.raises(ValueError, match="No weights in `--backup-dir`"):
        hull_beam.main(["--backup-dir", str(tmp_path)])
