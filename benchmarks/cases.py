"""The layers compared, their steps, and their FLOP counts.

A training step is forward + backward + an SGD update of every trainable
weight, in one `tf.function` (graph mode with oneDNN; XLA is not used: on
this CPU it is slower and does not reach the AMX bf16 kernels). Inference is
one forward call with `training=False`. Both return a scalar, so timing waits
for the step and copies nothing large.

FLOPs count a multiply-add as 2 and leave out softmax, layer norm, biases and
the optimizer; a training step is 3 x the forward matmuls.
"""

import keras
import tensorflow as tf

import keras_attn

NUM_HEADS = 8
# (batch B, length L, model width d): the shapes of the issue and the baseline.
SHAPES = ((32, 128, 256), (8, 512, 512), (2, 2048, 256))
SMOKE_SHAPES = ((2, 16, 32),)
POLICIES = ("float32", "mixed_bfloat16")


def mha_flops(batch, length, dim, train):
    """`8 B L d^2` (Q, K, V, O projections) `+ 4 B L^2 d` (Q K^T and P V)."""
    forward = 8 * batch * length * dim**2 + 4 * batch * length**2 * dim
    return 3 * forward if train else forward


def encoder_flops(batch, length, dim, train):
    """MHA plus the feed-forward `d -> 4d -> d`: `24 B L d^2 + 4 B L^2 d`."""
    forward = 24 * batch * length * dim**2 + 4 * batch * length**2 * dim
    return 3 * forward if train else forward


def keras_hub_or_none():
    """The `keras_hub` module, or `None` when it is not installed."""
    try:
        import keras_hub
    except ImportError:
        return None
    return keras_hub


def make_mha(kind, dim, dtype, implementation=None):
    """`kind="ours"`: `keras_attn.MultiHeadAttention`; `"peer"`: Keras' layer."""
    if kind == "ours":
        kwargs = {} if implementation is None else {"implementation": implementation}
        return keras_attn.MultiHeadAttention(NUM_HEADS, dim // NUM_HEADS, dtype=dtype, **kwargs)
    return keras.layers.MultiHeadAttention(NUM_HEADS, dim // NUM_HEADS, dtype=dtype)


def make_key_value(dim, dtype, implementation=None):
    """`keras_attn.KeyValueAttention`, single head of width `dim`, scaled-dot score."""
    kwargs = {} if implementation is None else {"implementation": implementation}
    return keras_attn.KeyValueAttention(dim, dtype=dtype, **kwargs)


def make_encoder(kind, dim, dtype):
    """Post-norm block, ReLU FFN of width 4d, no dropout: ours or keras-hub's."""
    if kind == "ours":
        return keras_attn.TransformerEncoder(4 * dim, NUM_HEADS, dtype=dtype)
    return keras_hub_or_none().layers.TransformerEncoder(4 * dim, NUM_HEADS, dtype=dtype)


def self_attention(layer):
    """The call of a self-attention layer: `layer(x, x)` for MHA, `layer(x)` for blocks."""
    two_inputs = (keras.layers.MultiHeadAttention, keras_attn.MultiHeadAttention)
    if isinstance(layer, (*two_inputs, keras_attn.ScoreAttention)):
        return lambda x, training: layer(x, x, training=training)
    return lambda x, training: layer(x, training=training)


def _loss(y):
    return tf.reduce_mean(tf.square(tf.cast(y, "float32")))


def train_step(layer, x, learning_rate=1e-4):
    """A `tf.function` running forward, backward and an SGD update; returns the loss."""
    call = self_attention(layer)
    call(x[:, :8], False)  # builds the weights before tracing
    optimizer = keras.optimizers.SGD(learning_rate)
    optimizer.build(layer.trainable_variables)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = _loss(call(x, True))
        grads = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply(grads, layer.trainable_variables)
        return loss

    return step


def infer_step(layer, x):
    """A `tf.function` running one forward call in inference mode; returns a scalar."""
    call = self_attention(layer)
    call(x[:, :8], False)
    return tf.function(lambda x: _loss(call(x, False)))


def input_batch(batch, length, dim, seed=0):
    return tf.random.stateless_normal((batch, length, dim), seed=(seed, 0))
