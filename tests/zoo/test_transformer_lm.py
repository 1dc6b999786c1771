"""`transformer_lm` and its generation: fit, reload, padding, cached steps vs the full pass.

Runs on TensorFlow, JAX and torch (`.ci/jax`, `.ci/torch`). The references are
independent of the cache: the model's own uncached full pass on the unpadded
prompt grown one token at a time (greedy: its argmax; sampling: `sample_tokens`
on its logits with the same uniform draws).
"""

import keras
import numpy as np
import pytest

from keras_attn import testing
from model_checks import check_model, favour_token, padded_tokens

pytestmark = pytest.mark.backends  # fit, reload and generation on every backend

VOCAB = 23


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _lm(position="learned", **kwargs):
    from keras_attn.models import transformer_lm

    keras.utils.set_random_seed(0)
    options = dict(num_layers=2, num_heads=4, d_model=16, intermediate_dim=32, dropout=0.0)
    options.update(kwargs)
    return transformer_lm(VOCAB, position=position, sequence_length=24, **options)


# Every position scheme, grouped-query heads, a sliding window, post-norm, untied output; the
# Llama family's options (RMS norm, gated feed-forward, no biases or q/k/v ones, rope scaling).
LLAMA = dict(normalization="rms_norm", feedforward="gated", activation="silu", use_bias=False)
VARIANTS = {
    "learned": {},
    "sinusoidal_post_norm_untied": dict(
        position="sinusoidal", normalize_first=False, tie_weights=False
    ),
    "rotary_gqa": dict(position="rotary", num_key_value_heads=2),
    "alibi_window": dict(position="alibi", sliding_window=3),
    "llama3_untied": dict(
        **LLAMA,
        position="rotary",
        num_key_value_heads=2,
        tie_weights=False,
        rope_scaling={
            "rope_type": "llama3",
            "scaling_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "qwen2_window": dict(**LLAMA, position="rotary", qkv_bias=True, sliding_window=3),
}

# Every variant on TensorFlow. On JAX and torch (where eager steps are slow: JAX compiles
# each op per shape) one variant for each generation property, and the model-level ones
# (padding, reload of each variant) are left to TensorFlow: the layers under them are
# tested on every backend by their own files.
ON_TENSORFLOW = keras.backend.backend() == "tensorflow"


def _variants(*elsewhere):
    return sorted(VARIANTS) if ON_TENSORFLOW else list(elsewhere)


PROMPTS = np.array([[5, 6, 7, 8, 9], [10, 3, 0, 0, 0], [4, 0, 0, 0, 0]], "int32")  # right-padded


def _left_padded(prompts):
    return np.stack([np.concatenate([r[r == 0], r[r != 0]]) for r in prompts])


# The references' full passes are right-padded to this one length (prompts of 5 tokens and
# up to 4 new ones): on JAX each new input shape compiles every op of the model again
# (about 5 s a shape on 2 cores), so one shape for every step of every reference.
REFERENCE_LENGTH = 10


def _last_logits(model, rows):
    """`(B, V)`: each row's (a list of tokens) next-token logits from one uncached full pass.

    The rows are right-padded to `REFERENCE_LENGTH`: causal, the padding after a
    row's last token changes nothing there.
    """
    assert max(map(len, rows)) <= REFERENCE_LENGTH, rows
    batch = np.array([row + [0] * (REFERENCE_LENGTH - len(row)) for row in rows], "int32")
    return _np(model(batch))[np.arange(len(rows)), [len(row) - 1 for row in rows]]


def _reference(model, prompts, new, choose, suppress=()):
    """Generation by the uncached full pass: `choose(logits (B, V), step) -> (B,) tokens`.

    Each step runs the model on every row's real prompt and tokens so far; padding and
    the `suppress` ids are ruled out (`-inf`) before `choose`.
    """
    rows = [[int(t) for t in prompt if t] for prompt in prompts]
    out = np.zeros((len(prompts), new), "int32")
    for t in range(new):
        logits = _last_logits(model, rows)
        logits[:, [0, *suppress]] = -np.inf  # padding is never generated
        out[:, t] = choose(logits, t)
        rows = [row + [int(token)] for row, token in zip(rows, out[:, t], strict=True)]
    return out


def _greedy_reference(model, prompts, new, suppress=()):
    """The argmax over the allowed ids (not padding, not `suppress`) at each step."""
    return _reference(model, prompts, new, lambda logits, t: np.argmax(logits, axis=-1), suppress)


def test_fits_and_reloads(tmp_path):
    model = _lm()
    tokens = padded_tokens(np.random.default_rng(0), 8, 9, VOCAB, min_length=3)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)
    check_model(model, tokens[:, :-1], tokens[:, 1:], tmp_path=tmp_path, loss=loss)


@pytest.mark.parametrize("variant", [v for v in _variants() if v != "learned"])
def test_variants_reload(variant, tmp_path):
    """`.keras` with `safe_mode=True`: the rotary, ALiBi, window, untied and post-norm models."""
    model = _lm(**VARIANTS[variant])
    inputs = {"tokens": PROMPTS}
    testing.assert_save_reload_equal(model, inputs, directory=str(tmp_path), formats=("keras",))


@pytest.mark.parametrize("variant", _variants())
def test_logits_are_causal_and_padding_free(variant):
    """A row's logits do not depend on later tokens, nor on padding before or after it."""
    model = _lm(**VARIANTS[variant])
    row = [5, 6, 7, 8, 9]
    alone = _np(model(np.array([row], "int32")))[0]  # (5, V)
    padded = np.array(
        [[0, 0] + row + [0], row + [0, 0, 0], row[:3] + [11, 12, 13, 14, 15]], "int32"
    )
    out = _np(model(padded))
    np.testing.assert_allclose(out[0, 2:7], alone, atol=1e-5)
    np.testing.assert_allclose(out[1, :5], alone, atol=1e-5)
    np.testing.assert_allclose(out[2, :3], alone[:3], atol=1e-5)  # the future changed


@pytest.mark.parametrize("variant", _variants("alibi_window"))
def test_cached_steps_equal_the_full_pass(variant):
    """Each cached step's logits equal the full pass's on the unpadded prompt and tokens so far."""
    from keras_attn.models.transformer_lm import LanguageModelSteps

    model = _lm(**VARIANTS[variant])
    steps = LanguageModelSteps(model)
    forced = np.array([[3, 4, 5], [6, 7, 8], [9, 10, 11]], "int32")  # fed after the prompts
    for prompts in (PROMPTS, _left_padded(PROMPTS)):
        state = steps.start(prompts, 3)
        tokens = steps.start_tokens(prompts)
        for index in range(3):
            logits, state = steps.step(tokens, index, state)
            rows = [[int(t) for t in p if t] for p in PROMPTS]
            rows = [row + forced[b, :index].tolist() for b, row in enumerate(rows)]
            expected = _last_logits(model, rows)
            np.testing.assert_allclose(_np(logits), expected, atol=1e-5)
            tokens = forced[:, index]


@pytest.mark.parametrize("variant", _variants("rotary_gqa"))
def test_greedy_generation_equals_the_full_pass(variant):
    from keras_attn.models import generate, greedy_decode

    model = _lm(**VARIANTS[variant])
    expected = _greedy_reference(model, PROMPTS, 4)
    np.testing.assert_array_equal(generate(model, PROMPTS, 4, jit_compile=False), expected)
    left = _left_padded(PROMPTS)
    np.testing.assert_array_equal(_np(greedy_decode(model, left, 4)), expected)


@pytest.mark.xla
def test_compiled_generation_equals_the_full_pass():
    """`generate` compiled (XLA on TensorFlow, `jax.jit`): the same tokens; sees new weights."""
    from keras_attn.models import generate

    model = _lm(position="rotary", num_key_value_heads=2, num_layers=1)
    np.testing.assert_array_equal(generate(model, PROMPTS, 4), _greedy_reference(model, PROMPTS, 4))
    for weight in model.weights:  # the compiled function reads the weights when it runs
        weight.assign(weight * 1.5)
    np.testing.assert_array_equal(generate(model, PROMPTS, 4), _greedy_reference(model, PROMPTS, 4))


@pytest.mark.xla
def test_auto_compile_chooses_by_the_size_of_the_weights(monkeypatch):
    """`jit_compile="auto"`: the one-shot loop under XLA whatever the size; a streamed step
    under XLA up to `XLA_MAX_WEIGHT_BYTES` of weights, a TensorFlow graph above (JAX:
    `jax.jit` either way); the same tokens, one-shot and streamed."""
    from keras_attn.models import generate
    from keras_attn.models.generation import compiled as lm_generation

    model = _lm(num_layers=1)
    nbytes = 4 * model.count_params()  # float32 weights
    expected = _greedy_reference(model, PROMPTS, 4)
    for limit, small in ((nbytes, True), (nbytes - 1, False)):
        monkeypatch.setattr(lm_generation, "XLA_MAX_WEIGHT_BYTES", limit)
        assert lm_generation._small(model) is small
        np.testing.assert_array_equal(generate(model, PROMPTS, 4), expected)
        streamed = np.stack(list(generate(model, PROMPTS, 4, stream=True)), axis=1)
        np.testing.assert_array_equal(streamed, expected)
    if keras.backend.backend() == "tensorflow":
        # One one-shot loop (XLA, the same settings both times); the streamed prefill and
        # step under XLA (small), then as graphs (large).
        traced = [function._jit_compile for function in lm_generation._COMPILED[model].values()]
        assert sorted(traced) == [False, False, True, True, True], traced
    with pytest.raises(ValueError, match="True, False or 'auto'. Received: jit_compile='xla'"):
        generate(model, PROMPTS, 4, jit_compile="xla")
    with pytest.raises(ValueError, match="Received: jit_compile=1"):
        generate(model, PROMPTS, 4, jit_compile=1)


def test_greedy_with_suppressed_ids_equals_the_full_pass():
    """The argmax over the allowed ids, token by token: greedy, greedy_decode, width-1 beam."""
    from keras_attn.models import generate, greedy_decode

    model = _lm()
    free = _greedy_reference(model, PROMPTS, 4)
    suppress = np.unique(free[:, :2])  # the tokens it would have started with (NumPy ints)
    expected = _greedy_reference(model, PROMPTS, 4, tuple(suppress))
    assert not np.isin(expected, suppress).any() and not (expected == free).all()
    got = generate(model, PROMPTS, 4, jit_compile=False, suppress_ids=suppress)
    np.testing.assert_array_equal(got, expected)
    left = _left_padded(PROMPTS)
    np.testing.assert_array_equal(
        _np(greedy_decode(model, left, 4, suppress_ids=suppress)), expected
    )
    end_id = int(expected[0, 1])
    beam = generate(model, PROMPTS, 4, end_id, "beam", beam_width=1, suppress_ids=list(suppress))
    stopped = generate(model, PROMPTS, 4, end_id, jit_compile=False, suppress_ids=suppress)
    np.testing.assert_array_equal(beam, stopped)
    last = int(np.flatnonzero(expected[0] == end_id)[0])  # row 0 ends there (kept)
    np.testing.assert_array_equal(stopped[0, : last + 1], expected[0, : last + 1])
    assert not stopped[0, last + 1 :].any()


@pytest.mark.xla
def test_compiled_generation_with_suppressed_ids():
    """Compiled: the same tokens as the full pass; one trace per `suppress_ids` setting."""
    from keras_attn.models import generate
    from keras_attn.models.generation.compiled import _COMPILED

    model = _lm(num_layers=1)
    suppress = tuple(np.unique(_greedy_reference(model, PROMPTS, 2)))
    expected = _greedy_reference(model, PROMPTS, 4, suppress)
    np.testing.assert_array_equal(generate(model, PROMPTS, 4, suppress_ids=suppress), expected)
    np.testing.assert_array_equal(
        generate(model, PROMPTS, 4, suppress_ids=suppress[::-1]), expected
    )
    assert len(_COMPILED[model]) == 1  # the same setting, in any order: one trace


@pytest.mark.jax_slow  # 42 s of eager sampling steps on JAX; TensorFlow and torch run it
def test_sampling_never_emits_suppressed_ids():
    """A model whose likeliest token is suppressed: never drawn, whatever the seed and
    truncation; with the same draws, the tokens of the full pass with that id ruled out."""
    from keras_attn.models import generate
    from keras_attn.models.generation.samplers import sample_tokens

    model = favour_token(_lm(num_layers=1), 7)
    prompts = np.tile(PROMPTS, (8, 1))  # 24 rows, each its own draws
    free = generate(model, prompts, 4, sampler="sample", seed=0, jit_compile=False)
    assert (free == 7).mean() > 0.5  # the favourite, when allowed
    settings = [{}, dict(temperature=3.0), dict(top_k=2), dict(top_p=0.5, temperature=2.0)]
    for seed, options in enumerate(settings):
        drawn = generate(
            model, prompts, 4, sampler="sample", seed=seed, jit_compile=False,
            suppress_ids=[7, 9], **options,
        )  # fmt: skip
        assert not np.isin(drawn, [0, 7, 9]).any(), (seed, options)
    options = dict(temperature=0.8, top_k=3, top_p=0.9)
    drawn = generate(
        model, PROMPTS, 4, sampler="sample", seed=3, jit_compile=False, suppress_ids=[7], **options
    )
    uniform = _np(keras.random.uniform((4, len(PROMPTS)), seed=3))  # generate's draws

    def choose(logits, t):
        return _np(sample_tokens(logits, uniform[t], **options))

    np.testing.assert_array_equal(drawn, _reference(model, PROMPTS, 4, choose, suppress=(7,)))


def test_bad_suppress_ids():
    from keras_attn.models import beam_search, generate, greedy_decode

    model = _lm()
    for bad in ([23], [5, -1], [1.5], 5, "5", [True], np.array([[5]]), np.array([2.0])):
        with pytest.raises(ValueError, match="`suppress_ids` must be a sequence of token ids in"):
            generate(model, PROMPTS, 2, suppress_ids=bad)
    with pytest.raises(ValueError, match=r"vocab_size=23\). Received: suppress_ids=\[3, 40\]"):
        greedy_decode(model, PROMPTS, 2, suppress_ids=[3, 40])
    with pytest.raises(ValueError, match="`suppress_ids` must be"):
        beam_search(model, PROMPTS, 2, end_id=3, suppress_ids=[23])
    with pytest.raises(ValueError, match="`suppress_ids` must leave a token besides padding"):
        generate(model, PROMPTS, 2, sampler="sample", suppress_ids=range(1, VOCAB))
    allowed = generate(model, PROMPTS, 2, jit_compile=False, suppress_ids=np.arange(1, 22))
    assert (allowed == 22).all()  # NumPy ids taken; one token left


def test_sampling_equals_the_full_pass_with_the_same_draws():
    from keras_attn.models import generate
    from keras_attn.models.generation.samplers import sample_tokens

    model = _lm(position="alibi")
    options = dict(temperature=0.8, top_k=8, top_p=0.9)
    drawn = generate(model, PROMPTS, 4, sampler="sample", seed=3, jit_compile=False, **options)
    uniform = _np(keras.random.uniform((4, len(PROMPTS)), seed=3))  # generate's draws

    def choose(logits, t):
        return _np(sample_tokens(logits, uniform[t], **options))

    np.testing.assert_array_equal(drawn, _reference(model, PROMPTS, 4, choose))
    again = generate(model, PROMPTS, 4, sampler="sample", seed=3, jit_compile=False, **options)
    np.testing.assert_array_equal(drawn, again)


def test_beam_and_end_id():
    """Width-1 beam search is greedy; `end_id` ends a row (kept, zeros after)."""
    from keras_attn.models import beam_search, generate

    model = _lm()
    greedy = _greedy_reference(model, PROMPTS, 4)
    end_id = int(greedy[0, 2])  # row 0 emits it by its third token
    beam = generate(model, PROMPTS, 4, end_id=end_id, sampler="beam", beam_width=1)
    stopped = generate(model, PROMPTS, 4, end_id=end_id, jit_compile=False)
    np.testing.assert_array_equal(beam, stopped)
    for row, full in zip(stopped, greedy, strict=True):
        ends = np.flatnonzero(full == end_id)
        last = ends[0] if len(ends) else len(full) - 1
        np.testing.assert_array_equal(row[: last + 1], full[: last + 1])
        assert not row[last + 1 :].any()
    tokens, scores = beam_search(model, PROMPTS, 4, end_id=end_id, beam_width=3)
    assert tokens.shape == (3, 4) and np.all(np.isfinite(scores))


def test_bad_input():
    from keras_attn.models import generate, greedy_decode, transformer_lm
    from keras_attn.models.transformer_lm import check_prompts

    model = _lm()
    with pytest.raises(ValueError, match="`prompts` must hold at least one real token.*\\[1\\]"):
        generate(model, np.array([[5, 6], [0, 0]], "int32"), 3)
    with pytest.raises(ValueError, match="at least one real token"):
        generate(model, np.zeros((2, 0), "int32"), 3)
    # No prompts: no tokens, from every sampler, compiled or not (the settings still checked).
    for settings in ({}, {"jit_compile": False}, {"sampler": "sample", "seed": 1},
                     {"sampler": "beam", "end_id": 2}):  # fmt: skip
        assert generate(model, np.zeros((0, 3), "int32"), 4, **settings).shape == (0, 4)
    with pytest.raises(ValueError, match="`top_p` must be"):
        generate(model, np.zeros((0, 3), "int32"), 3, sampler="sample", top_p=1.5)
    with pytest.raises(ValueError, match="length_penalty"):
        generate(model, np.zeros((0, 3), "int32"), 3, sampler="beam", end_id=2,
                 length_penalty=float("nan"))  # fmt: skip
    with pytest.raises(ValueError, match=r"token ids in \[0, vocab_size=23\).*\[23, 40\]"):
        generate(model, np.array([[5, 23], [40, 1]], "int32"), 3)
    with pytest.raises(ValueError, match="token ids"):
        generate(model, np.array([[5, -1]], "int32"), 3)
    # Fed: the 4 prompt tokens and all but the last new one, at positions 0 .. 4 + max_length - 2.
    with pytest.raises(ValueError, match="sequence_length=24.*max_length=22"):
        generate(model, np.array([[5, 6, 7, 8]], "int32"), 22)
    check_prompts(np.array([[5, 6, 7, 8]], "int32"), VOCAB, 21, 24)  # fits
    # A `max_length` below the prompt's length is fine: it counts new tokens.
    assert generate(model, PROMPTS, 1, jit_compile=False).shape == (3, 1)
    with pytest.raises(ValueError, match="`max_length` must be a positive integer"):
        generate(model, PROMPTS, 0)
    with pytest.raises(ValueError, match="continues its prompt.*start_id=1"):
        greedy_decode(model, PROMPTS, 3, start_id=1)
    with pytest.raises(ValueError, match="`sampler` must be one of"):
        generate(model, PROMPTS, 3, sampler="nucleus")
    with pytest.raises(ValueError, match="`top_p` must be"):
        generate(model, PROMPTS, 3, sampler="sample", top_p=1.5)
    with pytest.raises(ValueError, match="`end_id`.*required"):
        generate(model, PROMPTS, 3, sampler="beam")
    with pytest.raises(TypeError, match="integer token ids"):
        generate(model, np.ones((1, 3), "float32"), 3)
    with pytest.raises(ValueError, match="`position` must be one of.*'relative'"):
        transformer_lm(10, position="relative")
    with pytest.raises(ValueError, match="vocab_size"):
        transformer_lm(0)
    with pytest.raises(ValueError, match="`num_key_value_heads` must divide `num_heads`"):
        transformer_lm(10, num_heads=4, num_key_value_heads=3)
    classifier = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(
        ValueError, match="`model` must be built by keras_attn.models.transformer_lm"
    ):
        generate(classifier, PROMPTS, 3)
