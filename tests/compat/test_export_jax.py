"""SavedModel export on JAX: `model.export` and `export_seq2seq`, reloaded by TensorFlow.

Keras exports from JAX with `jax2tf`, which converts the gradient too: it
differentiates the jitted model. The kernels' custom gradients take every
tensor they read as an argument (`keras_attn.kernels._gradient`); closed over,
a tensor became a constant of the lowered computation and the export failed.
Each test compares the reloaded SavedModel with the Keras model it came from,
or a gradient with a plain `jax.numpy` formula's.
"""

import math
import os

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import kernels
from keras_attn.kernels import bias as bias_lib
from keras_attn.kernels.chunked import chunked_attention
from keras_attn.models import export_seq2seq, greedy_decode, rnn_seq2seq, transformer_seq2seq
from model_checks import padded_tokens

# Selected by .ci/jax (`backends`); it runs on JAX only.
pytestmark = [
    pytest.mark.skipif(keras.backend.backend() != "jax", reason="the JAX export"),
    pytest.mark.backends,
]

B, H, TQ, TV, D = 2, 2, 5, 9, 4
START, END = 1, 2


def np_(x):
    return keras.ops.convert_to_numpy(x)


# ---------------------------------------------------------------------------
# The cause: differentiating a jitted function through a kernel's custom gradient
# ---------------------------------------------------------------------------


# Every kernel of the table (a new one included), and the chunked one over several blocks.
KERNEL_CALLS = {
    **kernels.KERNELS,
    "chunked (3 key blocks)": lambda q, k, v, spec: chunked_attention(q, k, v, spec, block_size=4),
}


@pytest.mark.parametrize("name", sorted(KERNEL_CALLS))
def test_grad_of_a_jitted_kernel_equals_the_formulas(name):
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(B, H, t, D)).astype("float32") for t in (TQ, TV, TV))
    bias = rng.normal(size=(1, H, TQ, TV)).astype("float32")
    keep = np.ones((B, 1, 1, TV), bool)
    keep[0, ..., :3], keep[1, ..., -2:] = False, False
    key_kept = np.swapaxes(keep, -1, -2)  # (B, 1, Tv, 1)
    k_in, v_in = np.where(key_kept, k, 1e30), np.where(key_kept, v, np.nan)  # hostile when masked
    causal = np.tril(np.ones((TQ, TV), bool), TV - TQ)  # end-aligned
    cotangent = rng.normal(size=(B, H, TQ, D)).astype("float32")

    def loss(q, k, v, bias):
        scores_bias = bias_lib.as_bias(bias, (B, H, TQ, TV))
        spec = kernels.AttentionSpec(
            mask=keep, is_causal=True, bias=scores_bias, return_weights=False
        )
        out, _ = KERNEL_CALLS[name](q, k, v, spec)
        return jnp.sum(out * cotangent)

    def reference(q, k, v, bias):
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(D) + bias
        weights = jax.nn.softmax(jnp.where(keep & causal, scores, -jnp.inf), axis=-1)
        return jnp.sum(jnp.einsum("bhqk,bhkd->bhqd", weights, v) * cotangent)

    got = jax.grad(jax.jit(loss), argnums=(0, 1, 2, 3))(q, k_in, v_in, bias)
    expected = jax.grad(reference, argnums=(0, 1, 2, 3))(q, k, v, bias)
    for what, g, e in zip("qkvb", got, expected, strict=True):
        assert np.isfinite(np_(g)).all(), what
        np.testing.assert_allclose(np_(g), np_(e), atol=2e-5, err_msg=f"d{what}")


# ---------------------------------------------------------------------------
# model.export
# ---------------------------------------------------------------------------


def token_model(implementation, position_bias):
    """Tokens (0 = padding) -> embedding -> causal MultiHeadAttention -> logits."""
    keras.utils.set_random_seed(1)
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(12, 8, mask_zero=True)(tokens)
    attention = keras_attn.MultiHeadAttention(
        num_heads=H, key_dim=4, implementation=implementation, position_bias=position_bias
    )
    x = attention(x, x, use_causal_mask=True)
    return keras.Model(tokens, keras.layers.Dense(12)(x))


@pytest.mark.parametrize(
    "implementation, position_bias",
    [("dense", None), ("fused", "t5"), ("chunked", "t5"), ("auto", "alibi")],
)
def test_model_export_serves_the_keras_models_outputs(tmp_path, implementation, position_bias):
    import tensorflow as tf

    bias = {
        None: None,
        "t5": keras_attn.RelativePositionBias(H, bidirectional=False),
        "alibi": keras_attn.AlibiBias(),
    }[position_bias]
    model = token_model(implementation, bias)
    model.export(str(tmp_path / "model"), verbose=False)  # no jax2tf_kwargs needed
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    rng = np.random.default_rng(2)
    for batch, length in [(3, 7), (1, 4)]:  # any batch and length: the shapes are polymorphic
        x = padded_tokens(rng, batch, length, 12)
        np.testing.assert_allclose(loaded.serve(x).numpy(), np_(model(x)), atol=1e-5)


# ---------------------------------------------------------------------------
# export_seq2seq: the greedy loop inside the SavedModel
# ---------------------------------------------------------------------------


SEQ2SEQ = {
    "transformer": lambda: transformer_seq2seq(
        12, 12, num_layers=2, num_heads=2, d_model=16, intermediate_dim=32
    ),
    "rnn": lambda: rnn_seq2seq(12, 12, 8, 16, score="additive"),
}


@pytest.mark.parametrize("kind", sorted(SEQ2SEQ))
def test_export_seq2seq_decodes_as_greedy_decode(tmp_path, kind):
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    model = SEQ2SEQ[kind]()
    path = os.path.join(str(tmp_path), "seq2seq")
    export_seq2seq(model, path, max_length=6, start_id=START, end_id=END)
    loaded = tf.saved_model.load(path)
    signatures = loaded.signatures
    assert set(signatures) == {"serving_default", "greedy_decode", "serve"}
    specs = [s for sig in signatures.values() for s in sig.structured_input_signature[1].values()]
    assert all(spec.dtype == tf.int64 for spec in specs)

    rng = np.random.default_rng(4)
    for batch, length in [(3, 8), (2, 5)]:
        x = {
            "encoder_inputs": padded_tokens(rng, batch, length, 12),
            "decoder_inputs": padded_tokens(rng, batch, 4, 12),
        }
        source = tf.constant(x["encoder_inputs"], tf.int64)
        tokens = np_(greedy_decode(model, x["encoder_inputs"], 6, START, END))
        np.testing.assert_array_equal(loaded.greedy_decode(source).numpy(), tokens)
        served = signatures["serving_default"](encoder_inputs=source)
        np.testing.assert_array_equal(served["tokens"].numpy(), tokens)
        logits = loaded.serve({k: tf.constant(v, tf.int64) for k, v in x.items()})
        np.testing.assert_allclose(logits.numpy(), np_(model(x)), atol=1e-5)
