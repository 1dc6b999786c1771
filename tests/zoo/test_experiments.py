"""The experiment commands behind results/README.md's tables, end to end at tiny sizes."""

import json

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from experiments import han_ablation, rnn_attention  # noqa: E402


def test_decoded_accuracy_counts_the_end_token_and_ignores_padding():
    labels = np.array([[5, 6, 7, 2], [8, 2, 0, 0], [9, 9, 2, 0]])
    decoded = np.array([[5, 6, 7, 2, 4], [8, 3, 1, 1, 1], [9, 9, 2, 0, 0]])
    token, sequence = rnn_attention.decoded_accuracy(decoded, labels)
    assert token == pytest.approx(8 / 9)  # 4 + 1 + 3 right of 4 + 2 + 3 real
    assert sequence == pytest.approx(2 / 3)


def test_encode_builds_teacher_forcing_pairs():
    vocab = rnn_attention.vocabulary([("a b", "b a")])
    assert vocab == {"a": 3, "b": 4}
    source, inputs, labels = rnn_attention.encode([("a b", "b a"), ("b", "b")], vocab)
    np.testing.assert_array_equal(source, [[3, 4], [4, 0]])
    np.testing.assert_array_equal(inputs, [[1, 4, 3], [1, 4, 0]])
    np.testing.assert_array_equal(labels, [[4, 3, 2], [4, 2, 0]])


def test_at_time_reads_the_curve_within_a_budget():
    curve = [{"train_seconds": 1.0}, {"train_seconds": 2.0}, {"train_seconds": 3.5}]
    assert rnn_attention.at_time(curve, 2.0) is curve[1]
    assert rnn_attention.at_time(curve, 0.5) is None


@pytest.mark.slow  # the command end to end (CI time: issue 17)
def test_rnn_attention_command_end_to_end(tmp_path):
    output, plot = tmp_path / "rnn.json", tmp_path / "rnn.png"
    argv = [
        "--lengths", "4", "--scores", "none,dot", "--steps", "4", "--eval-every", "2",
        "--train-examples", "128", "--test-examples", "16", "--units", "8",
        "--embedding-dim", "4", "--data-dir", str(tmp_path / "tfds"),
        "--output", str(output), "--plot", str(plot),
    ]  # fmt: skip
    assert rnn_attention.main(argv) == 0
    saved = json.loads(output.read_text())
    runs = saved["results"]["4"]
    assert set(runs) == {"none", "dot"}
    for run in runs.values():
        assert [p["step"] for p in run["curve"]] == [2, 4]
        times = [p["train_seconds"] for p in run["curve"]]
        assert 0 < times[0] <= times[1]
        for point in run["curve"]:
            assert 0 <= point["sequence_accuracy"] <= point["token_accuracy"] <= 1
    # Attention adds parameters (the combine layer reads [context; state]).
    assert runs["dot"]["parameters"] > runs["none"]["parameters"]
    assert plot.stat().st_size > 0
    # A second run with the same settings reuses the measured runs.
    mtime = output.stat().st_mtime_ns
    assert rnn_attention.main(argv) == 0
    assert json.loads(output.read_text())["results"] == saved["results"]
    assert output.stat().st_mtime_ns == mtime


def test_han_ablation_summary():
    mean, spread, low, high = han_ablation.summary([0.70, 0.74, 0.72])
    assert (mean, low, high) == (pytest.approx(0.72), 0.70, 0.74)
    assert spread == pytest.approx(0.02)


@pytest.mark.slow  # the command end to end (CI time: issue 17)
def test_han_ablation_command_end_to_end(tmp_path, capsys):
    output = tmp_path / "han.json"
    argv = [
        "--dataset", "imdb_reviews", "--seeds", "0", "--epochs", "1", "--batch-size", "8",
        "--train-examples", "16", "--test-examples", "8", "--output", str(output),
    ]  # fmt: skip
    with tfds.testing.mock_data(num_examples=16):
        assert han_ablation.main(argv) == 0
    results = json.loads(output.read_text())["results"]
    assert set(results) == {"attention", "mean"}
    for runs in results.values():
        assert 0 <= runs["0"]["accuracy"] <= 1
    table = capsys.readouterr().out
    assert "| attention |" in table and "| mean |" in table
