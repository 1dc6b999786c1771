"""The int8 KV cache (`empty_cache(..., dtype="int8")`, `generate(..., kv_cache_dtype="int8")`).

References: a NumPy absmax quantizer and a hand-computed case (the stored numbers and
scales); the float cache (what each read is within a bound of, element by element: half a
step, `max|x| / 254`, per position and head); the cache of every position for the ring;
the eager loop for the compiled one; Python's `generate` for the exported signatures.
"""

import keras
import numpy as np
import pytest

import keras_attn
import layer_checks
from keras_attn.cache import Int8Heads, RingKVCache, dequantize, quantize, write

rng = np.random.default_rng(11)


def np_(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def t(x, dtype=None):
    return keras.ops.convert_to_tensor(x, dtype)


def half_step(x):
    """The bound of one read: `max|x| / 254` over each head vector (last axis), with a
    float32 rounding's slack."""
    return np.max(np.abs(x), axis=-1, keepdims=True) / 254 * (1 + 1e-5) + 1e-30


# ---------------------------------------------------------------------------
# Quantizing: the numbers stored, and the bound of a read
# ---------------------------------------------------------------------------


def test_quantize_stores_absmax_steps_and_reads_within_half_a_step():
    # (B, g, T, d): magnitudes from 1e-3 to 1e3, a zero vector, one number far above the rest
    x = rng.normal(size=(2, 3, 5, 16)) * 10.0 ** rng.integers(-3, 4, size=(2, 3, 5, 1))
    x[0, 0, 0] = 0.0
    x[1, 2, 4, 3] = 1e4
    x = x.astype("float32")
    heads = quantize(t(x))
    values, scale = keras.ops.convert_to_numpy(heads.values), np_(heads.scale)
    assert values.dtype == np.int8 and scale.shape == (2, 3, 5, 1)
    expected_scale = np.max(np.abs(x), -1, keepdims=True) / np.float32(127)  # NumPy absmax
    np.testing.assert_allclose(scale, expected_scale, rtol=1e-6)
    expected = np.round(x / np.where(expected_scale > 0, expected_scale, 1))
    assert np.abs(values - expected).max() <= 1  # (a float rounding at .5 may go either way)
    assert np.abs(values).max() == 127 and np.all(values[0, 0, 0] == 0)
    error = np.abs(np_(dequantize(heads, "float32")) - x)
    assert np.all(error <= half_step(x)), (error / half_step(x)).max()


def test_quantize_a_hand_computed_vector():
    # absmax 1.27: scale 0.01, steps 127, -30, 12.4 -> 12, 0
    heads = quantize(t(np.array([1.27, -0.3, 0.124, 0.0], "float32").reshape(1, 1, 1, 4)))
    assert keras.ops.convert_to_numpy(heads.values).ravel().tolist() == [127, -30, 12, 0]
    np.testing.assert_allclose(np_(heads.scale).ravel(), [0.01], rtol=1e-6)
    np.testing.assert_allclose(
        np_(dequantize(heads, "float32")).ravel(), [1.27, -0.3, 0.12, 0.0], rtol=1e-6
    )


def test_padding_is_stored_as_zeros_whatever_it_holds():
    """NaN, inf and huge keys at padded positions: stored as 0 with scale 0 (read as exactly
    0); the real positions' numbers and scales are those of a clean cache's."""
    x = rng.normal(size=(1, 2, 6, 8)).astype("float32")
    valid = np.array([[0, 1, 0, 1, 0, 1]], bool)
    hostile = x.copy()
    for position, value in ((0, np.nan), (2, np.inf), (4, 3e38)):
        hostile[:, :, position] = value
    clean, poisoned = quantize(t(x), t(valid)), quantize(t(hostile), t(valid))
    for a, b in zip(clean, poisoned, strict=True):
        np.testing.assert_array_equal(np_(a), np_(b))
    read = np_(dequantize(poisoned, "float32"))
    assert np.all(read[:, :, ~valid[0]] == 0)
    assert np.all(np_(poisoned.scale)[:, :, ~valid[0]] == 0)


def test_a_non_finite_real_key_stays_non_finite():
    """As a float cache holds it: int8 cannot, its scale does (NaN or inf)."""
    x = rng.normal(size=(1, 1, 3, 4)).astype("float32")
    x[0, 0, 1, 2] = np.nan
    read = np_(dequantize(quantize(t(x)), "float32"))
    assert np.all(np.isnan(read[0, 0, 1])) and np.all(np.isfinite(read[0, 0, [0, 2]]))


# ---------------------------------------------------------------------------
# The cache in the attention: full caches, rings, GQA, every kernel, eager and XLA
# ---------------------------------------------------------------------------


def _steps(layer, x, cache, prefill=3, mask=None, jit=False):
    """A prefill of `prefill` tokens, then one cached step per token at a tensor index: the
    outputs `(B, T, d)` and the cache; `jit`: each call compiled (`layer_checks.compiled`)."""

    def attend(x, cache, index, mask):
        masks = {} if mask is None else dict(query_mask=mask, value_mask=mask)
        return layer(x, x, use_causal_mask=True, cache=cache, cache_update_index=index, **masks)

    call = layer_checks.compiled(attend) if jit else attend
    prefill_mask = None if mask is None else t(mask[:, :prefill])
    out, cache = call(t(x[:, :prefill]), cache, t(0, "int32"), prefill_mask)
    outputs = [np_(out)]
    for i in range(prefill, x.shape[1]):
        out, cache = call(t(x[:, i : i + 1]), cache, t(i, "int32"), None)
        outputs.append(np_(out))
    return np.concatenate(outputs, 1), cache


# The tolerance of an output: each key and value is read within half a step of the float
# cache's (1/254 of its head vector's largest number, 0.4 %); through the softmax and the
# output projection of these small layers the outputs moved by 0.25-0.53 % of the float
# output's largest (measured on TensorFlow, the four kernels, eager): asserted at 2 %.
OUTPUT_TOLERANCE = 0.02


@pytest.mark.parametrize("implementation", ["dense", "fused", "chunked", "backend"])
@pytest.mark.parametrize("jit", [False, True])
def test_int8_cached_steps_are_within_tolerance_of_the_float_cache(implementation, jit):
    """GQA (4 query heads on 2), a left-padded prefill, a tensor index: the int8 cache's reads
    within half a step of the float cache's keys and values, its outputs within
    `OUTPUT_TOLERANCE`, the same valid positions."""
    layer = keras_attn.MultiHeadAttention(
        num_heads=4, key_dim=8, num_key_value_heads=2, implementation=implementation
    )
    x = rng.normal(size=(2, 8, 16)).astype("float32")
    mask = np.array([[1] * 8, [0, 0, 1, 1, 1, 1, 1, 1]], bool)
    layer(t(x), t(x))
    floats, float_cache = _steps(layer, x, layer.empty_cache(2, 8), mask=mask, jit=jit)
    ints, int8_cache = _steps(layer, x, layer.empty_cache(2, 8, "int8"), mask=mask, jit=jit)
    assert isinstance(int8_cache.key, Int8Heads)
    assert keras.backend.standardize_dtype(int8_cache.key.dtype) == "int8"
    for ours, reference in ((int8_cache.key, float_cache.key),
                            (int8_cache.value, float_cache.value)):  # fmt: skip
        reference = np_(reference)
        assert np.all(np.abs(np_(dequantize(ours, "float32")) - reference) <= half_step(reference))
    np.testing.assert_array_equal(np_(int8_cache.valid), np_(float_cache.valid))
    error = np.abs(ints - floats).max()
    assert 0 < error <= OUTPUT_TOLERANCE * np.abs(floats).max(), error / np.abs(floats).max()
    assert np.all(ints[~mask] == 0)  # padded rows: zeros


@pytest.mark.parametrize("jit", [False, True])
def test_an_int8_ring_reads_what_an_int8_cache_of_every_position_reads(jit):
    """A sliding window of 3 through a ring of 3 slots, a prefill longer than the ring: the
    outputs of the int8 cache of every position (each position's numbers are quantized
    alone, so the two hold the same), and the ring holds the last 3 positions' int8 keys."""
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=8, sliding_window=3)
    x = rng.normal(size=(1, 9, 16)).astype("float32")
    layer(t(x), t(x))
    full, cache = _steps(layer, x, layer.empty_cache(1, 9, "int8"), prefill=5, jit=jit)
    ring_outputs, ring = _steps(
        layer, x, RingKVCache(*layer.empty_cache(1, 3, "int8")), prefill=5, jit=jit
    )
    assert isinstance(ring, RingKVCache) and isinstance(ring.key, Int8Heads)
    np.testing.assert_allclose(ring_outputs, full, atol=1e-5)
    slots = [p % 3 for p in (6, 7, 8)]  # the ring's slots of the last 3 positions
    for part in ("key", "value"):
        for field in ("values", "scale"):
            ours = np_(getattr(getattr(ring, part), field))[:, :, slots]
            np.testing.assert_array_equal(ours, np_(getattr(getattr(cache, part), field))[:, :, 6:])


def test_hostile_keys_at_masked_positions_change_no_visible_output():
    """A cache written with NaN, inf and huge keys and values at positions it marks invalid
    (a padded prefill's): a step's output is the output over the same cache with zeros
    there, exactly (the padded positions are stored as zeros, scale 0, and masked)."""
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    x = rng.normal(size=(1, 1, 8)).astype("float32")
    layer(t(x), t(x))
    keys = rng.normal(size=(1, 2, 4, 4)).astype("float32")
    values = rng.normal(size=(1, 2, 4, 4)).astype("float32")
    valid = np.array([[0, 1, 0, 1]], bool)
    outputs = []
    for poison in (0.0, np.nan, np.inf, 3e38):
        k, v = keys.copy(), values.copy()
        k[:, :, ~valid[0]], v[:, :, ~valid[0]] = poison, -poison
        cache, _ = write(layer.empty_cache(1, 5, "int8"), 0, t(k), t(v), t(valid))
        out, _ = layer(t(x), t(x), cache=cache, cache_update_index=4, use_causal_mask=True)
        outputs.append(np_(out))
    assert np.all(np.isfinite(outputs[0]))
    for out in outputs[1:]:
        np.testing.assert_array_equal(out, outputs[0])


def test_the_symbolic_call_gives_an_int8_cache():
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4)
    layer.build((None, None, 8), (None, None, 8))
    cache = layer.empty_cache(2, 5, "int8")
    x = keras.KerasTensor((2, 1, 8))
    _, spec = layer.compute_output_spec(x, x, cache=cache, cache_update_index=0)
    assert isinstance(spec.key, Int8Heads) and spec.key.values.dtype == "int8"
    assert spec.key.scale.shape == (2, 2, 5, 1) and spec.value.scale.dtype == "float32"


# ---------------------------------------------------------------------------
# A language model's generation
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm():
    from keras_attn.models import transformer_lm

    keras.utils.set_random_seed(5)
    return transformer_lm(40, num_layers=2, d_model=32, num_heads=4, num_key_value_heads=2,
                          intermediate_dim=64, dropout=0.0)  # fmt: skip


PROMPTS = np.array([[5, 6, 7, 8, 9, 3], [0, 0, 12, 13, 14, 15], [21, 22, 0, 0, 0, 0]], "int32")


def test_generate_int8_tokens_agree_with_the_float_cache(lm):
    """Greedy, compiled (XLA on TensorFlow, jax.jit; torch eagerly) and eager: the int8 tokens
    are the eager int8 loop's, and the float cache's at 48 of 48 positions of this model
    (measured; asserted: at least 90 %). Beam search and streaming take the setting too."""
    from keras_attn.models import generate

    floats = generate(lm, PROMPTS, 16)
    ints = generate(lm, PROMPTS, 16, kv_cache_dtype="int8")
    eager = generate(lm, PROMPTS, 16, kv_cache_dtype="int8", jit_compile=False)
    np.testing.assert_array_equal(ints, eager)
    assert np.mean(ints == floats) >= 0.9, np.mean(ints == floats)
    streamed = np.stack(list(generate(lm, PROMPTS, 16, kv_cache_dtype="int8", stream=True)), 1)
    np.testing.assert_array_equal(streamed, ints)
    beams = generate(lm, PROMPTS, 6, sampler="beam", end_id=3, kv_cache_dtype="int8")
    assert beams.shape == (3, 6)


def test_int8_steps_logits_are_near_the_float_caches(lm):
    """A prefill and 6 steps of `LanguageModelSteps`: int8 logits within 2 % of the float
    logits' range (measured: 0.5 %), and a `"float"` setting is the float cache."""
    from keras_attn.models.transformer_lm import LanguageModelSteps

    def logits(**setting):
        steps = LanguageModelSteps(lm, **setting)
        state, tokens, out = steps.start(t(PROMPTS), 6), steps.start_tokens(t(PROMPTS)), []
        for i in range(6):
            step_logits, state = steps.step(tokens, i, state)
            out.append(np_(step_logits))
            tokens = keras.ops.argmax(step_logits, -1)
        return np.stack(out, 1), state

    floats, _ = logits()
    ints, state = logits(kv_cache_dtype="int8")
    assert isinstance(state.caches[0].key, Int8Heads)
    error = np.abs(ints - floats).max() / np.ptp(floats)
    assert 0 < error < 0.02, error
    np.testing.assert_array_equal(logits(kv_cache_dtype="float")[0], floats)


def test_a_sliding_window_models_int8_rings_decode_as_int8_full_caches():
    from keras_attn.models import generate, transformer_lm

    keras.utils.set_random_seed(6)
    model = transformer_lm(30, num_layers=1, d_model=16, num_heads=2, intermediate_dim=32,
                           sliding_window=3, position="rotary", dropout=0.0)  # fmt: skip
    from keras_attn.models.transformer_lm import LanguageModelSteps

    assert LanguageModelSteps(model, kv_cache_dtype="int8").ring
    ring = generate(model, PROMPTS, 8, kv_cache_dtype="int8", jit_compile=False)
    steps = LanguageModelSteps(model, ring=False, kv_cache_dtype="int8")
    from keras_attn.models.generation import GenerationConfig
    from keras_attn.models.generation.loop import DecodingLoop
    from keras_attn.models.generation.samplers import token_chooser

    config = GenerationConfig(kv_cache_dtype="int8")
    decode = DecodingLoop(steps, config, token_chooser(config, None))
    carry = keras.ops.fori_loop(0, 8, decode.step, decode.start(t(PROMPTS), 8))
    np.testing.assert_array_equal(ring, np_(decode.result(carry)[0]).astype("int32"))


def test_bad_kv_cache_dtypes_are_named(lm):
    from keras_attn.models import GenerationConfig, generate, transformer_seq2seq
    from keras_attn.models.generation.steps import decoding_steps
    from keras_attn.models.transformer_lm import LanguageModelSteps

    for value in ("int4", "bfloat16", 8, True):
        with pytest.raises(ValueError, match=f"`kv_cache_dtype` must be .*{value!r}"):
            GenerationConfig(kv_cache_dtype=value)
    with pytest.raises(ValueError, match="Received: kv_cache_dtype='float16'"):
        generate(lm, PROMPTS, 2, kv_cache_dtype="float16")
    with pytest.raises(ValueError, match="Received: kv_cache_dtype='uint8'"):
        LanguageModelSteps(lm, kv_cache_dtype="uint8")
    seq2seq = transformer_seq2seq(10, 10, num_layers=1, d_model=8, intermediate_dim=16)
    with pytest.raises(ValueError, match="TransformerDecodingSteps takes none"):
        decoding_steps(seq2seq, "int8")
    assert GenerationConfig(kv_cache_dtype="float") == GenerationConfig()  # one compiled loop


def test_predict_takes_the_kv_cache_dtype_flag():
    from keras_attn.models import cli

    args = cli._parser().parse_args(["predict", "transformer-lm", "hi", "--kv-cache-dtype", "int8"])
    assert cli._generation(args)["config"].kv_cache_dtype == "int8"
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["predict", "transformer-lm", "--kv-cache-dtype", "int4"])


@pytest.mark.tensorflow_only
def test_an_int8_export_streams_and_generates_pythons_int8_tokens(tmp_path):
    """`export_text(path, kv_cache_dtype="int8")`: `prefill` / `decode_step` pass int8 keys
    and values with float32 scales; a greedy client loop over them, `greedy_decode` and the
    `generate` signature at temperature 0 give Python's int8 greedy tokens."""
    import tensorflow as tf

    from keras_attn.models import generate, text, transformer_lm

    words = ["", "[UNK]", "<s>", "</s>", "the", "movie", "is", "a", "good", "bad", "."]
    keras.utils.set_random_seed(3)
    model = transformer_lm(len(words), num_layers=2, num_heads=2, d_model=16,
                           intermediate_dim=32, sequence_length=16, dropout=0.0)  # fmt: skip
    text_model = text.TextLanguageModel(model, text.string_lookup(words), 6, 4)
    with pytest.raises(ValueError, match="Received: kv_cache_dtype='int4'"):
        text_model.export_text(str(tmp_path / "bad"), kv_cache_dtype="int4")
    text_model.export_text(str(tmp_path / "lm"), kv_cache_dtype="int8")
    loaded = tf.saved_model.load(str(tmp_path / "lm"))
    prompts = np.asarray(text_model.prompt_ids(["the movie is", "a good", "bad"]))
    expected = generate(model, prompts, 6, kv_cache_dtype="int8", suppress_ids=(1,),
                        jit_compile=False)  # fmt: skip
    state = loaded.signatures["prefill"](tokens=tf.constant(prompts, tf.int64))
    assert state["keys"].dtype == tf.int8 and state["key_scales"].dtype == tf.float32
    assert state["key_scales"].shape[-1] == 1 and state["values"].shape[1] == 2  # (B, L, S, g, d)
    names = ("keys", "values", "key_scales", "value_scales", "valid", "positions", "index")
    tokens = []
    for i in range(6):
        token = tf.argmax(state["logits"], -1)
        tokens.append(token.numpy())
        if i < 5:
            state = loaded.signatures["decode_step"](token=token, **{k: state[k] for k in names})
    np.testing.assert_array_equal(np.stack(tokens, 1), expected)
    decoded = loaded.greedy_decode(tf.constant(prompts, tf.int64)).numpy()
    np.testing.assert_array_equal(
        decoded,
        generate(model, prompts, 6, 3, kv_cache_dtype="int8", suppress_ids=(1,), jit_compile=False),
    )
    settings = dict(max_length=6, temperature=0.0, top_k=0, top_p=1.0, seed=0,
                    repetition_penalty=1.0)  # fmt: skip
    dtypes = dict(max_length=tf.int32, top_k=tf.int32, seed=tf.int32)
    out = loaded.signatures["generate"](
        text=tf.constant(["the movie is", "a good", "bad"]),
        **{k: tf.constant(v, dtypes.get(k, tf.float32)) for k, v in settings.items()},
    )
    ended = generate(model, prompts, 6, 3, kv_cache_dtype="int8", suppress_ids=(1,),
                     jit_compile=False)  # fmt: skip
    np.testing.assert_array_equal(out["tokens"].numpy(), ended)
