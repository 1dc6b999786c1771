"""`keras_attn._execution.plain_calls` (opened by `no_gradients(model)`, the decoders' loops):
the layers' calls skip Keras' `__call__` on torch only where that changes nothing (inside
`no_gradients()`, built layers, no conversion, no mask to fill, ...), and every other call goes
through it. Each case is compared with Keras' own call of the layer."""

import keras
import numpy as np
import pytest
from keras.src.backend.common.masking import get_keras_mask, set_keras_mask

from keras_attn import _execution
from keras_attn._execution import no_gradients

TORCH = keras.backend.backend() == "torch"


@pytest.fixture
def keras_calls(monkeypatch):
    """A list that gets one entry per `Layer.__call__` (the layer's class name)."""
    calls = []
    original = keras.layers.Layer.__call__

    def counted(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(keras.layers.Layer, "__call__", counted)
    return calls


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _built_dense(dtype=None):
    keras.utils.set_random_seed(0)
    layer = keras.layers.Dense(3, dtype=dtype)
    layer(np.zeros((1, 2, 4), "float32"))
    return layer


def test_inside_no_gradients_a_plain_call_skips_keras_call_on_torch_only(keras_calls):
    layer = _built_dense()
    x = keras.random.normal((2, 5, 4), seed=1)
    expected = _np(layer(x))
    keras_calls.clear()
    with no_gradients(layer):
        out = layer(x)
    np.testing.assert_array_equal(_np(out), expected)
    assert keras_calls == ([] if TORCH else ["Dense"])
    assert type(layer) is keras.layers.Dense  # its own class again
    keras_calls.clear()
    np.testing.assert_array_equal(_np(layer(x)), expected)  # after the context: Keras' call
    assert keras_calls == ["Dense"]
    with no_gradients():  # the loop did not name it: Keras' call
        np.testing.assert_array_equal(_np(layer(x)), expected)
    assert keras_calls == ["Dense"] * 2
    keras_calls.clear()
    with _execution.plain_calls(layer):  # outside `no_gradients()`: Keras' call
        np.testing.assert_array_equal(_np(layer(x)), expected)
    assert keras_calls == ["Dense"]


@pytest.mark.skipif(not TORCH, reason="the shortcut is torch's: elsewhere every call is Keras'")
def test_every_case_keras_call_would_change_goes_through_it(keras_calls):
    torch = pytest.importorskip("torch")

    x = keras.random.normal((2, 5, 4), seed=1)

    def through_keras(layer, *args, **kwargs):
        keras_calls.clear()
        with no_gradients(layer):
            out = layer(*args, **kwargs)
        # The layer's call first; its sublayers' (an attention's projections) after it go
        # through Keras too: an outer Keras `__call__` hands them its call context.
        assert keras_calls[:1] == [type(layer).__name__]
        assert set(keras_calls[1:]) <= {"MatmulEinsumDense"}
        return out

    keras.utils.set_random_seed(0)
    fresh = keras.layers.Dense(3)
    assert through_keras(fresh, x).shape == (2, 5, 3) and fresh.built  # built by the call

    dense = _built_dense()
    expected = _np(dense(x))
    # Converted by Keras: float64 and NumPy inputs come out float32, as from `layer(x)`.
    out = through_keras(dense, keras.ops.cast(x, "float64"))
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    np.testing.assert_allclose(_np(out), expected, rtol=1e-6)
    np.testing.assert_allclose(_np(through_keras(dense, _np(x))), expected, rtol=1e-6)

    import keras_attn

    attention = keras_attn.MultiHeadAttention(num_heads=2, key_dim=2)
    attention(x, x)
    causal = np.tril(np.ones((2, 5, 5), bool))  # a NumPy keyword argument: converted by Keras
    np.testing.assert_allclose(
        _np(through_keras(attention, x, x, attention_mask=causal)),
        _np(attention(x, x, use_causal_mask=True)),
        rtol=1e-6,
    )

    mixed = _built_dense(dtype="mixed_bfloat16")  # autocast: bfloat16 compute, float32 weights
    out = through_keras(mixed, keras.ops.cast(x, "bfloat16"))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"

    dropout = keras.layers.Dropout(0.5)
    dropout.build(x.shape)
    assert np.any(_np(through_keras(dropout, x, training=True)) == 0)

    seen = []
    handle = dense.register_forward_hook(lambda *_: seen.append(1))
    through_keras(dense, x)
    handle.remove()
    assert seen == [1]

    # A Keras mask Keras would pass to `call` as `mask`: the pooling averages real steps only.
    pool = keras.layers.GlobalAveragePooling1D()
    pool.build(x.shape)
    masked = x * 1.0
    valid = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    set_keras_mask(masked, keras.ops.convert_to_tensor(valid))
    np.testing.assert_allclose(
        _np(through_keras(pool, masked)),
        np.stack([_np(x)[0, :2].mean(0), _np(x)[1].mean(0)]),
        rtol=1e-6,
    )
    # A mask on a second argument, which Keras would pass as `<name>_mask`.
    dot = keras.layers.Attention()
    dot([x, x])
    assert through_keras(dot, [x, masked]).shape == x.shape  # a list: Keras' call
    assert torch.is_grad_enabled()


@pytest.mark.skipif(not TORCH, reason="the shortcut is torch's: elsewhere every call is Keras'")
def test_the_output_mask_is_keras_own_and_a_quantized_layer_runs_its_quantized_call(keras_calls):
    x = keras.random.normal((2, 5, 4), seed=1)
    valid = keras.ops.convert_to_tensor(np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], bool))
    masked = x * 1.0
    set_keras_mask(masked, valid)
    dense = _built_dense()
    keras_calls.clear()
    tokens = keras.ops.convert_to_tensor(np.array([[3, 0, 5]], "int32"))
    embedding = keras.layers.Embedding(9, 4, mask_zero=True)
    with no_gradients(dense):
        out = dense(masked)  # Dense passes its input's mask on
    with no_gradients(embedding):
        embedded = embedding(tokens[:, :1])
    with no_gradients(embedding):
        from_tokens = embedding(tokens)  # Embedding's `compute_mask`: tokens != 0
    assert keras_calls == ["Embedding"]  # its first call builds it; the rest skip `__call__`
    assert embedded.shape == (1, 1, 4)
    np.testing.assert_array_equal(_np(get_keras_mask(out)), _np(valid))
    np.testing.assert_array_equal(_np(get_keras_mask(from_tokens)), [[True, False, True]])
    np.testing.assert_array_equal(_np(get_keras_mask(embedding(tokens))), [[True, False, True]])

    quantized = _built_dense()
    quantized.quantize("int8")
    expected = _np(quantized(x))
    keras_calls.clear()
    with no_gradients(quantized):
        out = quantized(x)
    assert keras_calls == []
    np.testing.assert_array_equal(_np(out), expected)
    assert np.abs(expected - _np(dense(x))).max() > 0  # the int8 kernel, not the float one


def _lm_step():
    """A language model and its cached step after a prefill: `run()` -> its logits and cache."""
    from keras_attn.models import transformer_lm
    from keras_attn.models.transformer_lm import LanguageModelSteps

    keras.utils.set_random_seed(0)
    model = transformer_lm(30, num_layers=2, d_model=16, intermediate_dim=32, dropout=0.0)
    steps = LanguageModelSteps(model)
    prompts = np.array([[0, 5, 6, 7], [8, 9, 3, 4]], "int32")  # left padding in the first row
    state = steps.start(prompts, 4)
    return model, lambda: steps.step(keras.ops.convert_to_tensor([7, 4]), 0, state)


def _seq2seq_step():
    """A seq2seq model and its second cached step, with the alignment (cross-attention weights)."""
    from keras_attn.models import transformer_seq2seq
    from keras_attn.models.transformer_seq2seq import TransformerDecodingSteps

    keras.utils.set_random_seed(0)
    model = transformer_seq2seq(20, 30, num_layers=2, num_heads=2, d_model=16,
                                intermediate_dim=32, dropout=0.0)  # fmt: skip
    steps = TransformerDecodingSteps(model)
    source = np.array([[5, 6, 7, 0], [8, 9, 3, 4]], "int32")  # right padding in the first row
    state = steps.start(source, 3)
    _, state = steps.step(keras.ops.convert_to_tensor([1, 1]), 0, state)
    return model, lambda: steps.step(
        keras.ops.convert_to_tensor([7, 4]), 1, state, return_alignment=True
    )


@pytest.mark.parametrize("make_step", [_lm_step, _seq2seq_step], ids=["lm", "seq2seq"])
def test_a_decoding_step_is_the_same_through_keras_call(monkeypatch, keras_calls, make_step):
    with no_gradients():
        model, step = make_step()

    def run():
        with no_gradients(model):  # as the decoding loops run a model's steps
            keras_calls.clear()
            logits, state, *alignment = step()
            caches = state.caches if hasattr(state, "caches") else state.self_attention_caches
            return [_np(t) for t in (logits, *caches[1], *alignment)], list(keras_calls)

    plain, plain_calls = run()
    monkeypatch.setattr(_execution, "_calls_plainly", lambda *_: False)
    through_keras, keras_only = run()
    for a, b in zip(plain, through_keras, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(keras_only) >= 2 * 9  # every block's sublayers, the blocks, embeddings, norm
    assert plain_calls == ([] if TORCH else keras_only)


@pytest.mark.skipif(not TORCH, reason="the shortcut is torch's: elsewhere every call is Keras'")
def test_every_decoding_loop_runs_its_steps_without_keras_call(keras_calls):
    """Each loop opens `no_gradients(model)`: a step calls no Keras `__call__`, so the calls of
    a decode do not grow with the number of steps (what the prefill or encoder calls stays)."""
    from keras_attn.models import (
        beam_search,
        generate,
        greedy_decode,
        transformer_lm,
        transformer_seq2seq,
    )

    keras.utils.set_random_seed(0)
    lm = transformer_lm(30, num_layers=2, d_model=16, intermediate_dim=32, dropout=0.0)
    s2s = transformer_seq2seq(20, 30, num_layers=2, num_heads=2, d_model=16,
                              intermediate_dim=32, dropout=0.0)  # fmt: skip
    prompts = np.array([[0, 5, 6, 7], [8, 9, 3, 4]], "int32")
    decodes = {
        "generate": lambda n: generate(lm, prompts, n, jit_compile=False),
        "stream": lambda n: list(generate(lm, prompts, n, jit_compile=False, stream=True)),
        "beam": lambda n: beam_search(lm, prompts, n, end_id=29),
        "greedy_decode": lambda n: greedy_decode(s2s, prompts, n, start_id=1),
        "beam_seq2seq": lambda n: beam_search(s2s, prompts, n, start_id=1, end_id=29),
    }
    for name, decode in decodes.items():
        decode(1)  # builds what a first call builds
        counts = []
        for steps in (1, 3):
            keras_calls.clear()
            decode(steps)
            counts.append(len(keras_calls))
        assert counts[0] == counts[1], (name, counts)
