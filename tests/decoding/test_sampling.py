"""Sampled decoding: the per-step draw against NumPy, and `sample_decode` against greedy."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.models import greedy_decode, transformer_seq2seq
from keras_attn.models.decoding import sample_decode
from keras_attn.models.generation.samplers import (
    greedy_tokens,
    sample_tokens,
    top_k_lowest_first,
)
from keras_attn.models.generation.samplers import sample_tokens as sample_tokens_with
from model_checks import padded_tokens

pytestmark = pytest.mark.jax_slow  # on TensorFlow and torch in CI

START, END = 1, 2
rng = np.random.default_rng(0)

# A fixed logits table: distinct probabilities, a tie (row 1, ids 2 and 4), a ruled-out id.
LOGITS = np.array(
    [
        [0.3, 2.0, -1.0, 1.2, 0.0, 0.7],
        [-np.inf, 0.5, 1.5, -0.3, 1.5, 0.1],
        [4.0, 3.9, 0.2, -2.0, 1.0, 3.0],
    ],
    "float32",
)
GRID = 20_000  # uniforms (i + 1/2) / GRID: each token's share of the grid is its probability


def np_(x):
    return keras.ops.convert_to_numpy(x)


def reference_distribution(logits, temperature, top_k, top_p):
    """The truncated distribution by definition: subsets enumerated, float64."""
    logits = logits.astype("float64") / temperature
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    order = np.argsort(-logits, kind="stable")  # ties: the lower id first
    allowed = set(order[: top_k or len(order)].tolist())
    if top_p is not None:
        mass = probs[list(allowed)] / probs[list(allowed)].sum()  # renormalized over top-k
        mass = dict(zip(sorted(allowed), mass, strict=True))
        # The smallest set with mass >= p; among sets of that size, the most probable one.
        for size in range(1, len(allowed) + 1):
            sets = [s for s in itertools.combinations(sorted(allowed), size)]
            reaching = [s for s in sets if sum(mass[i] for i in s) >= top_p - 1e-12]
            if reaching:
                allowed = set(max(reaching, key=lambda s: sum(mass[i] for i in s)))
                break
    kept = np.zeros_like(probs)
    kept[list(allowed)] = probs[list(allowed)]
    return kept / kept.sum()


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, None, None), (0.5, None, None), (2.0, 3, None), (1.0, None, 0.6), (0.7, 4, 0.8),
     (1.0, None, 0.99), (1.0, 1, None), (1.0, 10, None)],
)  # fmt: skip
def test_sampled_token_frequencies_equal_the_truncated_distribution(temperature, top_k, top_p):
    uniform = (np.arange(GRID) + 0.5) / GRID
    for row in LOGITS:
        tokens = np_(sample_tokens(np.tile(row, (GRID, 1)), uniform, temperature, top_k, top_p))
        frequencies = np.bincount(tokens, minlength=len(row)) / GRID
        expected = reference_distribution(row, temperature, top_k, top_p)
        np.testing.assert_allclose(frequencies, expected, atol=2.0 / GRID)
        assert set(np.flatnonzero(frequencies)) <= set(np.flatnonzero(expected))  # never outside


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = np.log(np.array([[0.1, 0.4, 0.2, 0.3]], "float32"))
    uniform = (np.arange(1000) + 0.5) / 1000
    cases = [(0.39, {1}), (0.41, {1, 3}), (0.69, {1, 3}), (0.71, {1, 2, 3}), (1.0, {0, 1, 2, 3})]
    for top_p, kept in cases:  # (p away from the float32 sums 0.4, 0.7)
        tokens = np_(sample_tokens(np.tile(logits, (1000, 1)), uniform, top_p=top_p))
        assert set(tokens.tolist()) == kept, top_p


def test_top_k_one_and_a_cold_temperature_are_greedy_per_step():
    logits = np.concatenate([LOGITS[[0, 2]], rng.normal(size=(50, 6)).astype("float32")])
    uniform = rng.uniform(size=len(logits))
    greedy = np_(greedy_tokens(logits))
    np.testing.assert_array_equal(greedy, np.argmax(logits, -1))
    np.testing.assert_array_equal(np_(sample_tokens(logits, uniform, top_k=1)), greedy)
    np.testing.assert_array_equal(np_(sample_tokens(logits, uniform, temperature=1e-4)), greedy)


TIED = [
    np.array([[-1.0, 3.0, 3.0, 0.0, 3.0]], "float32"),  # ids 1, 2, 4 tie
    np.array([[-np.inf] + [0.0] * 63], "float32"),  # 63 tied tokens after padding
    np.array([[0.5, 2.0, -1.0, 2.0, 2.0, 2.0, 1.0, 2.0]] * 3, "float32"),  # a batch of them
]


@pytest.mark.parametrize("logits", TIED, ids=["five", "sixty-four", "batch"])
def test_ties_go_to_the_lowest_id_in_every_sampler(logits):
    """Every draw that is the argmax (greedy, top-k 1, a temperature of 0 or near it, beam's
    choice) takes the lowest of the tied ids on every backend; torch's `topk` orders equal
    values arbitrarily (it gave 2 and 15 for the first two rows). Where top-k cuts through a
    tie, the lowest tied ids are the candidates."""
    expected = np.argmax(logits, -1)  # NumPy: the first maximal index
    uniform = rng.uniform(size=len(logits))
    drawn = {
        "greedy_tokens": greedy_tokens(logits),
        "top_k=1": sample_tokens(logits, uniform, top_k=1),
        "temperature=1e-39": sample_tokens(logits, uniform, temperature=1e-39),
        "with temperature=0": sample_tokens_with(logits, uniform, 0.0, 0, 1.0),
        "with top_k=1": sample_tokens_with(logits, uniform, 1.0, 1, 1.0),
        "beam": top_k_lowest_first(logits, 1)[1][:, 0],
    }
    for name, tokens in drawn.items():
        np.testing.assert_array_equal(np_(tokens), expected, err_msg=name)
    ties = np.flatnonzero(logits[0] == logits[0].max())
    for u in (np.arange(GRID // 100) + 0.5) / (GRID // 100):  # top-k 2 keeps the lowest two
        uniform = np.full(len(logits), u)
        for tokens in (
            sample_tokens(logits, uniform, top_k=2),
            sample_tokens_with(logits, uniform, 1.0, 2, 1.0),
        ):
            assert set(np_(tokens).tolist()) <= set(ties[:2].tolist()), u
    values, ids = top_k_lowest_first(logits, 3)
    np.testing.assert_array_equal(np_(ids), np.argsort(-logits, -1, kind="stable")[:, :3])
    np.testing.assert_array_equal(np_(values), -np.sort(-logits, -1)[:, :3])


@pytest.mark.parametrize("dtype", ["float32", "float16"])  # float16: mixed precision's logits
@pytest.mark.parametrize("temperature", [1e-30, 1e-37, 1e-39, 1e-45, 5e-324])
def test_a_temperature_near_zero_is_greedy_and_never_draws_padding(temperature, dtype):
    """Where `logits / temperature` overflows float32 (+-inf, then NaN probabilities), the
    draw is still the argmax (the limit as the temperature goes to 0), never padding (-inf)."""
    logits = np.concatenate(
        [
            LOGITS[[0, 2]],  # no ties (a tie is drawn from evenly in the limit)
            [[-np.inf, -0.3, -0.1, -2.0, -0.5, -1.0]],  # all real logits negative
            [[-np.inf, 50.0, 60.0, -3.0, 1.0, 0.0]],  # large ones
            rng.normal(size=(20, 6)) * [0.0, 1, 1, 1, 1, 1] + [-np.inf, 0, 0, 0, 0, 0],
        ]
    ).astype(dtype)
    uniform = rng.uniform(size=len(logits))
    expected = np.argmax(logits.astype("float64"), -1)
    for options in ({}, {"top_k": 3}, {"top_p": 0.9}):
        drawn = np_(sample_tokens(logits, uniform, temperature, **options))
        np.testing.assert_array_equal(drawn, expected, err_msg=str(options))


def small_transformer():
    keras.utils.set_random_seed(3)
    return transformer_seq2seq(12, 12, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32)


def test_sample_decode_is_reproducible_and_reduces_to_greedy():
    model = small_transformer()
    source = padded_tokens(rng, 4, 8, 12)
    greedy = np_(greedy_decode(model, source, 6, START, END))
    first = np_(sample_decode(model, source, 6, START, END, seed=5))
    np.testing.assert_array_equal(np_(sample_decode(model, source, 6, START, END, seed=5)), first)
    assert not np.array_equal(np_(sample_decode(model, source, 6, START, END, seed=6)), first)
    for kwargs in (
        {"top_k": 1}, {"temperature": 1e-4}, {"temperature": 1e-40},
        {"top_k": 1, "top_p": 0.3, "seed": 2},
    ):  # fmt: skip
        sampled = np_(sample_decode(model, source, 6, START, END, **kwargs))
        np.testing.assert_array_equal(sampled, greedy, err_msg=str(kwargs))
    # End handling as in greedy decoding: padding only after the first end token, never before.
    for row in first:
        ends = np.flatnonzero(row == END)
        cut = ends[0] + 1 if len(ends) else len(row)
        assert np.all(row[:cut] > 0) and np.all(row[cut:] == 0)


@pytest.mark.tensorflow_only  # a tf.function
def test_sample_decode_runs_in_a_tf_function_with_the_same_draws():
    model = small_transformer()
    source = padded_tokens(rng, 3, 8, 12)
    eager = np_(sample_decode(model, source, 5, START, top_p=0.9, seed=11))

    @tf.function
    def graph(x):
        return sample_decode(model, x, 5, START, top_p=0.9, seed=11)

    np.testing.assert_array_equal(graph(tf.constant(source)).numpy(), eager)


@pytest.mark.parametrize(
    "kwargs,name",
    [({"temperature": -1e-3}, "temperature"), ({"temperature": -1.0}, "temperature"),
     ({"temperature": float("nan")}, "temperature"), ({"temperature": "1"}, "temperature"),
     ({"top_k": -1}, "top_k"), ({"top_k": 2.5}, "top_k"), ({"top_k": True}, "top_k"),
     ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_p": "0.9"}, "top_p"),
     ({"top_p": float("nan")}, "top_p"), ({"temperature": float("inf")}, "temperature"),
     ({"end_id": 12}, "end_id"), ({"end_id": -1}, "end_id"), ({"start_id": 40}, "start_id"),
     ({"seed": 1.5}, "seed"), ({"seed": "a"}, "seed")],
)  # fmt: skip
def test_bad_sampling_arguments_name_the_argument(kwargs, name):
    model = small_transformer()
    ((key, value),) = kwargs.items()
    with pytest.raises(ValueError, match=rf"`{name}` must be .*Received: {name}={value!r}"):
        sample_decode(model, np.ones((1, 3), "int32"), 3, **{"start_id": START, **kwargs})
