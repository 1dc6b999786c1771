"""The layers compared, their steps, and their FLOP counts.

A training step is forward + backward + an SGD update of every trainable
weight, in one `tf.function` (graph mode with oneDNN; XLA is not used: on
this CPU it is slower and does not reach the AMX bf16 kernels). Inference is
one forward call with `training=False`. Both return a scalar, so timing waits
for the step and copies nothing large.

The language model's step (`lm_train_step`) is the same with a next-token
cross-entropy loss on integer tokens.

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


def lm_flops(batch, length, num_layers, dim, intermediate, vocab, train):
    """Model FLOPs of a decoder-only language model on `B x L` tokens: every matmul.

    Per block the four projections `8 B L d^2`, the two attention products
    `4 B L^2 d` (the full square: the causal half is computed and masked) and
    the feed-forward `d -> I -> d`, `4 B L d I`; then the logits over the
    vocabulary, `2 B L d V`. The embedding lookups are no matmul. Training:
    3 x forward (backward = 2 x forward).
    """
    block = 8 * batch * length * dim**2 + 4 * batch * length**2 * dim
    block += 4 * batch * length * dim * intermediate
    forward = num_layers * block + 2 * batch * length * dim * vocab
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


def sgd_step(loss, variables, learning_rate=1e-4):
    """A `tf.function` of `x`: `loss(x)`, its gradient, an SGD update of `variables`; the loss."""
    optimizer = keras.optimizers.SGD(learning_rate)
    optimizer.build(variables)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            value = loss(x)
        grads = tape.gradient(value, variables)
        optimizer.apply(grads, variables)
        return value

    return step


def train_step(layer, x, learning_rate=1e-4):
    """A `tf.function` running forward, backward and an SGD update; returns the loss."""
    call = self_attention(layer)
    call(x[:, :8], False)  # builds the weights before tracing
    return sgd_step(lambda x: _loss(call(x, True)), layer.trainable_variables, learning_rate)


def lm_train_step(model, tokens, call=None, offset=0, learning_rate=1e-4):
    """A language model's training step: next-token cross-entropy, backward, SGD.

    Args:
        model: a `keras.Model` giving `(B, L, V)` logits for `(B, L)` tokens.
        tokens: `(B, L + 1)` int32 tokens, `0..V - 1`: the step reads
            `tokens[:, :-1]` and predicts `tokens[:, 1:]`.
        call: `call(ids, training)` -> logits (default: `model(ids, training=...)`;
            keras-hub's `GPT2CausalLM` takes a dict with a padding mask).
        offset: added to every token id, inputs and targets: the model's id of
            token 0 (1 for a `from_gpt2_backbone` model, whose id 0 is padding).
    """
    call = call or (lambda ids, training: model(ids, training=training))
    call(tokens[:, :8] + offset, False)  # builds the weights before tracing

    def loss(tokens):
        logits = call(tokens[:, :-1] + offset, True)
        return tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(
                tokens[:, 1:] + offset, tf.cast(logits, "float32"), from_logits=True
            )
        )

    return sgd_step(loss, model.trainable_variables, learning_rate)


def infer_step(layer, x):
    """A `tf.function` running one forward call in inference mode; returns a scalar."""
    call = self_attention(layer)
    call(x[:, :8], False)
    return tf.function(lambda x: _loss(call(x, False)))


def input_batch(batch, length, dim, seed=0):
    return tf.random.stateless_normal((batch, length, dim), seed=(seed, 0))


def token_batch(batch, length, vocab, seed=0):
    """`(B, L)` int32 tokens drawn uniformly from `0..vocab - 1`."""
    return tf.random.stateless_uniform((batch, length), (seed, 0), 0, vocab, "int32")
