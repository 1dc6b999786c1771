"""pointer_network and pointer_decode: model checks, causality, masks, sorting."""

import keras
import numpy as np
import pytest

import keras_attn.models.datasets
from keras_attn.models import pointer_decode, pointer_network
from keras_attn.models.datasets import convex_hull_indices
from keras_attn.models.decoding import polygon_decode
from keras_attn.models.geometry import hull_metrics, is_simple_polygon
from keras_attn.models.layers import ChosenPositionsMask, PointerDecoderInputs
from keras_attn.models.training import build_for_fit
from layer_checks import check_layer
from model_checks import check_model

N = 5


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(ignore_class=-1)


def _sorting(rng, n, length=N):
    points = rng.uniform(size=(n, length, 1)).astype("float32")
    return points, np.argsort(points[..., 0], axis=-1).astype("int32")


def _padded_targets(pointers, lengths):
    """Keeps the first `lengths[i]` pointers of example `i`; -1 after (the padding)."""
    steps = np.arange(pointers.shape[1])
    return np.where(steps < np.asarray(lengths)[:, None], pointers, -1).astype("int32")


# ---------------------------------------------------------------------------
# The shared checks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mask_chosen, pad_value, encoder",
    [(True, None, "lstm"), (False, -1.0, "lstm"), (True, -1.0, "transformer")],
)
def test_pointer_network_model_checks(tmp_path, mask_chosen, pad_value, encoder):
    points, pointers = _sorting(np.random.default_rng(0), 6)
    pointers = _padded_targets(pointers, [5, 5, 3, 4, 1, 5])  # variable-length targets
    if pad_value is not None:  # two padding points after the five real ones
        points = np.pad(points, ((0, 0), (0, 2), (0, 0)), constant_values=pad_value)
    model = pointer_network(
        input_dim=1, units=16, encoder=encoder, mask_chosen=mask_chosen, pad_value=pad_value
    )
    x = {"points": points, "pointers": pointers}
    check_model(model, x, pointers, tmp_path=tmp_path, loss=_loss())


def test_pointer_decoder_inputs_layer_checks(tmp_path):
    rng = np.random.default_rng(1)
    check_layer(
        PointerDecoderInputs,
        {
            "inputs": rng.normal(size=(3, 4, 2)).astype("float32"),
            "pointers": np.array([[1, 0, 3, 2], [2, -1, -1, -1], [0, 1, 2, -1]], "int32"),
        },
        tmp_path=tmp_path,
    )


def test_chosen_positions_mask_layer_checks(tmp_path):
    check_layer(
        ChosenPositionsMask,
        {"pointers": np.array([[1, 0, 3], [2, -1, -1]], "int32"), "inputs": np.zeros((2, 4, 1))},
        tmp_path=tmp_path,
        expect_trainable=False,
        mixed_precision=(),
    )


# ---------------------------------------------------------------------------
# What decoding relies on
# ---------------------------------------------------------------------------


def test_output_step_depends_only_on_earlier_pointers():
    points, pointers = _sorting(np.random.default_rng(2), 4)
    model = pointer_network(input_dim=1, units=8)
    reference = _np(model({"points": points, "pointers": pointers}))
    for t in range(N):
        changed = pointers.copy()
        changed[:, t:] = -1
        out = _np(model({"points": points, "pointers": changed}))
        np.testing.assert_allclose(out[:, : t + 1], reference[:, : t + 1], atol=1e-6)


def test_chosen_positions_get_zero_probability():
    points, pointers = _sorting(np.random.default_rng(3), 4)
    probs = _np(pointer_network(input_dim=1, units=8)({"points": points, "pointers": pointers}))
    for t in range(N):
        chosen = probs[np.arange(4)[:, None], t, pointers[:, :t]]
        assert np.all(chosen == 0.0)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    assert np.all(probs[:, -1].max(-1) == pytest.approx(1.0))  # one position left


def test_padded_points_get_zero_probability_and_change_nothing():
    rng = np.random.default_rng(7)
    points = rng.uniform(size=(3, 4, 2)).astype("float32")
    padded = np.concatenate([points, np.full((3, 3, 2), -1.0, "float32")], 1)  # N: 4 -> 7
    order = np.argsort(points[..., 0], -1).astype("int32")
    model = pointer_network(input_dim=2, units=8, pad_value=-1.0)
    probs = _np(model({"points": points, "pointers": order}))
    padded_probs = _np(model({"points": padded, "pointers": order}))
    assert np.all(padded_probs[..., 4:] == 0.0)
    np.testing.assert_allclose(padded_probs[..., :4], probs, atol=1e-6)
    decoded = pointer_decode(model, padded, steps=4)
    np.testing.assert_array_equal(decoded, pointer_decode(model, points))


def test_loss_counts_only_unpadded_steps():
    points, pointers = _sorting(np.random.default_rng(4), 4)
    padded = _padded_targets(pointers, [5, 2, 3, 1])
    model = pointer_network(input_dim=1, units=8)
    probs = _np(model({"points": points, "pointers": padded}))
    picked = np.take_along_axis(probs, np.maximum(padded, 0)[..., None], -1)[..., 0]  # (B, T)
    expected = -np.log(picked[padded >= 0]).mean()
    np.testing.assert_allclose(_np(_loss()(padded, probs)), expected, rtol=1e-5)


def test_pointer_decode_yields_permutations():
    rng = np.random.default_rng(5)
    points = rng.uniform(size=(16, 7, 2)).astype("float32")
    for mask_chosen in (True, False):  # the constraint holds even if the model ignores it
        model = pointer_network(input_dim=2, units=8, mask_chosen=mask_chosen)
        order = pointer_decode(model, points)
        assert order.shape == (16, 7) and order.dtype == np.int32
        np.testing.assert_array_equal(np.sort(order, -1), np.tile(np.arange(7), (16, 1)))


def test_pointer_decode_is_greedy_over_the_model():
    points, _ = _sorting(np.random.default_rng(6), 8)
    model = pointer_network(input_dim=1, units=8)
    order = pointer_decode(model, points)
    probs = _np(model({"points": points, "pointers": order}))  # teacher-forced on the output
    np.testing.assert_array_equal(np.argmax(probs, -1), order)
    partial = pointer_decode(model, points, steps=3)
    np.testing.assert_array_equal(partial, order[:, :3])


def test_transformer_set_encoder_is_permutation_equivariant():
    rng = np.random.default_rng(1)
    points, pointers = _sorting(rng, 3, length=6)
    points = np.pad(points, ((0, 0), (0, 1), (0, 0)), constant_values=-1.0)  # one padding point
    model = pointer_network(input_dim=1, units=16, encoder="transformer", pad_value=-1.0)
    probs = _np(model({"points": points, "pointers": pointers}))
    perm = rng.permutation(7)  # new position k holds old point perm[k]
    inverse = np.argsort(perm)
    permuted = _np(model({"points": points[:, perm], "pointers": inverse[pointers]}))
    np.testing.assert_allclose(permuted, probs[:, :, perm], atol=1e-5)
    lstm = pointer_network(input_dim=1, units=16, pad_value=-1.0)  # reads in order: not so
    lstm_probs = _np(lstm({"points": points, "pointers": pointers}))
    lstm_permuted = _np(lstm({"points": points[:, perm], "pointers": inverse[pointers]}))
    assert not np.allclose(lstm_permuted, lstm_probs[:, :, perm], atol=1e-3)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"`encoder` must be one of .*Received: encoder='gru'"):
        pointer_network(input_dim=1, units=8, encoder="gru")
    with pytest.raises(ValueError, match=r"`units` must be divisible by 4"):
        pointer_network(input_dim=1, units=6, encoder="transformer")
    model = pointer_network(input_dim=1, units=8)
    with pytest.raises(ValueError, match=r"`steps` must be .* Received: steps=6"):
        pointer_decode(model, np.zeros((2, 5, 1)), steps=6)
    with pytest.raises(ValueError, match=r"`points` must have rank 3. Received: points.shape"):
        pointer_decode(model, np.zeros((2, 5)))


# ---------------------------------------------------------------------------
# Training: sorting, as in the paper
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_pointer_network_learns_to_sort_five_numbers():
    rng = np.random.default_rng(0)
    train_points, train_order = _sorting(rng, 20000)
    test_points, test_order = _sorting(rng, 1000)
    keras.utils.set_random_seed(0)
    model = pointer_network(input_dim=1, units=128)
    epochs, batch_size = 10, 128
    schedule = keras.optimizers.schedules.CosineDecay(
        0.01, epochs * len(train_points) // batch_size
    )
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss=_loss())
    build_for_fit(model, ({"points": train_points, "pointers": train_order}, train_order))
    model.fit(
        {"points": train_points, "pointers": train_order},
        train_order,
        epochs=epochs,
        batch_size=batch_size,
        verbose=0,
    )
    order = pointer_decode(model, test_points)
    accuracy = float(np.mean(np.all(order == test_order, axis=-1)))
    print(f"pointer network, sorting 5 numbers: whole-sequence accuracy {accuracy:.3f}")
    assert accuracy >= 0.95, accuracy


def test_pointer_network_trains_on_the_convex_hull_dataset(tmp_path):
    dataset = keras_attn.models.datasets.load(
        "keras_attn_convex_hull/tiny", "train", str(tmp_path / "tfds"), batch_size=32
    )
    points, hull = (_np(t) for t in next(iter(dataset)))  # padded with -1.0 / -1
    assert points.shape[-1] == 2 and (hull == -1).any()  # variable sizes, variable hulls
    model = pointer_network(input_dim=2, units=16, encoder="transformer", pad_value=-1.0)
    x = {"points": points, "pointers": hull}
    check_model(model, x, hull, tmp_path=tmp_path, loss=_loss())


class _OracleModel:
    """Stands in for a pointer network: puts all probability on the closed target hull."""

    def __init__(self, hulls, num_points):
        self.steps = np.full((len(hulls), num_points + 1), -1)
        for i, hull in enumerate(hulls):
            closed = list(hull) + [hull[0]]
            self.steps[i, : len(closed)] = closed

    def predict_on_batch(self, inputs):
        t = int(np.sum(inputs["pointers"][0] >= 0))  # the step being decoded
        assert np.all(inputs["pointers"][:, t:] == -1)
        probs = np.full(self.steps.shape + (self.steps.shape[1] - 1,), 0.01)
        rows = np.arange(len(self.steps))
        probs[rows, t, np.maximum(self.steps[:, t], 0)] = 1.0
        return probs


def test_polygon_decoding_and_hull_metrics():
    rng = np.random.default_rng(0)
    points = rng.uniform(size=(6, 9, 2)).astype("float32")
    hulls = [convex_hull_indices(p) for p in points]
    decoded = polygon_decode(_OracleModel(hulls, 9), points)
    for got, want in zip(decoded, hulls, strict=True):
        np.testing.assert_array_equal(got, want)
    padded = np.full((6, 10), -1)
    for i, hull in enumerate(hulls):
        padded[i, : len(hull) + 1] = list(hull) + [hull[0]]  # closed, then padding
    assert hull_metrics(points, decoded, padded) == (1.0, 1.0)
    wrong = [h[:-1] for h in hulls]  # one vertex short: not exact, less area
    accuracy, coverage = hull_metrics(points, wrong, padded)
    assert accuracy == 0.0 and 0.5 < coverage < 1.0

    square = np.array([[0, 0], [1, 0], [1, 1], [0, 1]], float)
    assert is_simple_polygon(square) and not is_simple_polygon(square[[0, 2, 1, 3]])
    assert not is_simple_polygon(square[:2])
