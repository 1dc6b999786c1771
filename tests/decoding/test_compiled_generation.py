"""`generate`'s compiled loop (`tf.function(jit_compile=True)`, `jax.jit`) decodes the model
as it is now: after LoRA or quantization (new variables, another call path) as after new
weights, the tokens of the uncached full pass; and the loop is compiled once per model state.
"""

import contextlib
import gc
import weakref

import keras
import numpy as np
import pytest

from keras_attn.models import generate, transformer_lm
from keras_attn.models.generation.compiled import _COMPILED

pytestmark = pytest.mark.xla  # TensorFlow and JAX: torch runs `generate` eagerly

VOCAB, LENGTH, NEW = 23, 10, 4
PROMPTS = np.array([[5, 6, 7, 8], [10, 3, 0, 0], [4, 0, 0, 0]], "int32")  # right-padded


def np_(x):
    return keras.ops.convert_to_numpy(x)


def tiny_lm():
    keras.utils.set_random_seed(0)
    return transformer_lm(
        VOCAB, num_layers=1, num_heads=2, d_model=16, intermediate_dim=32, sequence_length=16
    )


def full_pass_greedy(model, prompts, new):
    """Greedy tokens by the uncached full pass on each row's real tokens so far (padding
    never generated); the batch right-padded to one length (one shape: one JAX compile)."""
    rows = [[int(t) for t in prompt if t] for prompt in prompts]
    for _ in range(new):
        batch = np.array([row + [0] * (LENGTH - len(row)) for row in rows], "int32")
        logits = np_(model(batch))[np.arange(len(rows)), [len(row) - 1 for row in rows]]
        logits[:, 0] = -np.inf
        rows = [row + [int(t)] for row, t in zip(rows, logits.argmax(-1), strict=True)]
    return np.array([row[-new:] for row in rows], "int32")


def projections(model):
    """The model's Dense and EinsumDense sublayers (attention projections, feed-forward)."""
    kinds = (keras.layers.Dense, keras.layers.EinsumDense)
    return [layer for layer in model._flatten_layers() if isinstance(layer, kinds)]


def enable_lora(model, rank=2):
    rng = np.random.default_rng(1)
    for layer in projections(model):
        layer.enable_lora(rank)
        b = layer.lora_kernel_b  # zeros by default: LoRA would change nothing yet
        b.assign(rng.normal(scale=2.0, size=b.shape).astype("float32"))


def quantize_and_rescale(model):
    """`quantize("int8")`, then every quantized kernel's scale moved, so that the tokens
    of the quantized model differ from the float model's."""
    model.quantize("int8")
    rng = np.random.default_rng(2)
    for layer in projections(model):
        scale = layer.kernel_scale
        scale.assign(np_(scale) * rng.uniform(0.2, 5.0, size=scale.shape).astype("float32"))


@pytest.fixture
def hoisted(monkeypatch):
    """The kernels `loop_kernels` read, per traced loop (`models.lm_generation`'s)."""
    from keras_attn.models.generation import lm as lm_generation

    read = []
    original = lm_generation.loop_kernels

    @contextlib.contextmanager
    def recording(layers):
        with original(layers) as kernels:
            read.append(len(kernels))
            yield kernels

    monkeypatch.setattr(lm_generation, "loop_kernels", recording)
    return read


@pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method")
@pytest.mark.parametrize("change", [enable_lora, quantize_and_rescale], ids=["lora", "int8"])
@pytest.mark.parametrize("rows", [3, 1])  # one row: the products kept apart (loop_kernels)
def test_compiled_generation_follows_lora_and_quantization(change, rows, hoisted):
    model, prompts = tiny_lm(), PROMPTS[:rows]
    before = generate(model, prompts, NEW)  # compiled and cached for the float model
    np.testing.assert_array_equal(before, full_pass_greedy(model, prompts, NEW))
    change(model)
    expected = full_pass_greedy(model, prompts, NEW)
    assert not np.array_equal(expected, before)  # the change changes the tokens
    np.testing.assert_array_equal(generate(model, prompts, NEW, jit_compile=False), expected)
    np.testing.assert_array_equal(generate(model, prompts, NEW), expected)
    # One compiled loop per setting for the model as it is now (the float one let go),
    # reused by the next call.
    (loop,) = _COMPILED[model].values()
    np.testing.assert_array_equal(generate(model, prompts, NEW), expected)
    assert list(_COMPILED[model].values()) == [loop]
    # TensorFlow read the float model's six kernels (q, k, v, o, two feed-forward) before its
    # loop, LoRA's too; a quantized layer reads its own (none hoisted). JAX: none.
    tensorflow = keras.backend.backend() == "tensorflow"
    assert [n for n in hoisted if n] == [6] * (1 + (change is enable_lora)) * tensorflow


def test_compiled_loops_let_the_model_go():
    """The cache is weak in the model: its loops must not hold it (they did, in a closure)."""
    model = tiny_lm()
    generate(model, PROMPTS, 2)
    model_ref = weakref.ref(model)
    del model
    gc.collect()
    assert model_ref() is None


@pytest.mark.tensorflow_only  # TensorFlow's Assert ops and its retracing warning
def test_compiled_loops_build_no_assert_under_xla_and_warn_of_no_retracing(caplog):
    """XLA drops TensorFlow's `Assert` ops and logs "Ignoring Assert operator" for each (two
    per generate call for a 2-block model, in the README's zoo snippet; more with learned
    positions): a trace for XLA builds none (a graph keeps the cache's index check and the
    position table's range checks). Each settings' loop is its own
    traced function, so six settings are six first traces, not "retracing" of one."""
    import tensorflow as tf

    import keras_attn
    from keras_attn.cache import check_index
    from keras_attn.models.generation.compiled import _compile

    table = keras_attn.PositionEmbedding(8)
    table.build((1, 1, 4))

    def check(index):
        check_index(index, 1, 4)  # the cache's index
        return table(keras.ops.zeros((1, 1, 4)), start_index=index)  # a learned table's rows

    for xla, expected in ((True, 0), (False, 3)):
        traced = _compile((), check, xla).get_concrete_function(tf.constant(2))
        ops = [op.type for op in traced.graph.get_operations()]
        asserts = [op for op in ops if op in ("Assert", "AssertV2")]
        assert len(asserts) == expected, (xla, ops)
    model = tiny_lm()
    with caplog.at_level("WARNING"):
        for top_k in range(1, 7):  # a compile each
            generate(model, PROMPTS, 2, sampler="sample", top_k=top_k, seed=0, jit_compile=True)
    assert not [r for r in caplog.records if "retracing" in r.getMessage()], caplog.text
