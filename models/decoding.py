"""Decoding for the zoo's autoregressive models.

**Seq2seq** (`greedy_decode`, `beam_search`, `export_seq2seq`): a model is
decoded through its *decoding steps* object (`decoding_steps(model)`):
`start(encoder_inputs, max_length) -> state` encodes the source once, and
`step(tokens, index, state) -> (logits, state)` feeds one token per example.
For `transformer_seq2seq` a step runs the decoder blocks on their KV caches
(O(T) per step instead of re-running the whole decoder, O(T^2)); for
`rnn_seq2seq` it is one RNN cell step and one attention over the source.

**Pointer networks** (`pointer_decode`, `polygon_decode`): constrained
greedy decoding that runs the functional model once per step on the pointers
decoded so far. Output row `t` of a `models.pointer_network` depends on the
pointers before it only, so step `t` feeds the first `t + 1` pointers: the
decoder costs O(t) per step, O(N^2) in all. (`models.pointer_search` has
beam search over convex polygons.)
"""

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from models.files import write_atomically
from models.geometry import open_polygon
from models.rnn_seq2seq import RNNDecodingSteps
from models.transformer_seq2seq import TransformerDecodingSteps

# ---------------------------------------------------------------------------
# Seq2seq
# ---------------------------------------------------------------------------

_STEPS = [TransformerDecodingSteps, RNNDecodingSteps]


def register_decoding_steps(steps_class):
    """Adds a decoding-steps class (with `matches(model)`, `start`, `step`) to the lookup."""
    _STEPS.append(steps_class)
    return steps_class


def decoding_steps(model):
    """The decoding-steps object of a zoo seq2seq model."""
    for steps_class in _STEPS:
        if steps_class.matches(model):
            return steps_class(model)
    raise ValueError(
        f"No decoding steps for model {model.name!r}: expected a model built by "
        "models.transformer_seq2seq or models.rnn_seq2seq."
    )


def _check_lengths(max_length, start_id, end_id):
    if not isinstance(max_length, int) or max_length <= 0:
        raise ValueError(f"`max_length` must be a positive integer. Received: {max_length!r}")
    for name, value in (("start_id", start_id), ("end_id", end_id)):
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise ValueError(
                f"`{name}` must be a positive token id (0 is padding). Received: {value!r}"
            )


def greedy_decode(model, encoder_inputs, max_length, start_id, end_id=None, steps=None):
    """Greedy decoding: `y_t = argmax_v p(v | y_<t, x)`, one cached step per token.

    Token 0 (padding) is never emitted before the end.

    Args:
        model: a zoo seq2seq model (`transformer_seq2seq` or `rnn_seq2seq`).
        encoder_inputs: int tokens `(B, S)`, 0 = padding.
        max_length: number of tokens to decode.
        start_id: the token fed at the first step.
        end_id: when given, an example stops at its first `end_id` (kept in
            the output) and is padded with 0 after it.
        steps: a decoding-steps object; by default `decoding_steps(model)`.

    Returns:
        int32 `(B, max_length)` tokens (a tensor; runs eagerly or inside a
        `tf.function`).

    Example:

    >>> from models import transformer_seq2seq
    >>> model = transformer_seq2seq(20, 30, num_layers=1, d_model=16, intermediate_dim=32)
    >>> print(greedy_decode(model, np.ones((2, 7), "int32"), max_length=4, start_id=1).shape)
    (2, 4)
    """
    _check_lengths(max_length, start_id, end_id)
    steps = steps or decoding_steps(model)
    encoder_inputs = ops.convert_to_tensor(encoder_inputs, "int32")
    batch = ops.shape(encoder_inputs)[0]
    state = steps.start(encoder_inputs, max_length)
    tokens = ops.full((batch,), start_id, "int32")
    outputs = ops.zeros((batch, max_length), "int32")
    finished = ops.zeros((batch,), "bool")

    def body(index, carry):
        tokens, outputs, finished, state = carry
        logits, state = steps.step(tokens, index, state)
        tokens = ops.cast(ops.argmax(_without_padding(logits), axis=-1), "int32")
        tokens = ops.where(finished, 0, tokens)
        if end_id is not None:
            finished = ops.logical_or(finished, ops.equal(tokens, end_id))
        outputs = ops.slice_update(outputs, (0, index), ops.expand_dims(tokens, 1))
        return tokens, outputs, finished, state

    _, outputs, _, _ = ops.fori_loop(0, max_length, body, (tokens, outputs, finished, state))
    return outputs


def _without_padding(logits):
    """Logits with token 0 (padding, never a real output token) ruled out."""
    is_padding = ops.equal(ops.arange(ops.shape(logits)[-1]), 0)
    return ops.where(is_padding, ops.cast(-1e9, logits.dtype), logits)


def _length_penalty(length, alpha):
    """GNMT's `((5 + |Y|) / 6) ** alpha` (Wu et al. 2016)."""
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(
    model, encoder_inputs, max_length, start_id, end_id, beam_width=4, length_penalty=0.6
):
    """Beam search over cached decoding steps, ranking `log p(Y | x) / lp(|Y|)`.

    Keeps the `beam_width` best prefixes of every example; a prefix that
    emitted `end_id` is finished and only extends with padding at no cost
    (padding is never emitted otherwise).
    Hypotheses are ranked by their log-probability divided by GNMT's length
    penalty `lp(|Y|) = ((5 + |Y|) / 6) ** length_penalty` (0 ranks by
    log-probability alone). With `beam_width=1` this is greedy decoding.

    Args:
        model: a zoo seq2seq model.
        encoder_inputs: int tokens `(B, S)`, 0 = padding.
        max_length: longest output.
        start_id: the token fed at the first step.
        end_id: the end-of-sequence token.
        beam_width: hypotheses kept per example.
        length_penalty: the exponent `alpha`.

    Returns:
        `(tokens, scores)`: int32 NumPy `(B, max_length)` (0 after `end_id`)
        and the best hypothesis' normalized score `(B,)`.

    Example:

    >>> from models import transformer_seq2seq
    >>> model = transformer_seq2seq(20, 30, num_layers=1, d_model=16, intermediate_dim=32)
    >>> tokens, scores = beam_search(model, np.ones((2, 7), "int32"), 4, start_id=1, end_id=2)
    >>> print(tokens.shape, scores.shape)
    (2, 4) (2,)

    Reference:
        Wu et al., 2016, "Google's Neural Machine Translation System",
        https://arxiv.org/abs/1609.08144 (length penalty)
    """
    _check_lengths(max_length, start_id, end_id)
    if not isinstance(beam_width, int) or beam_width <= 0:
        raise ValueError(f"`beam_width` must be a positive integer. Received: {beam_width!r}")
    steps = decoding_steps(model)
    source = np.asarray(encoder_inputs, "int32")
    batch, width = source.shape[0], beam_width
    state = steps.start(np.repeat(source, width, axis=0), max_length)  # (B*K, ...)
    tokens = np.full((batch * width,), start_id, "int32")
    log_probs = np.full((batch, width), -np.inf)
    log_probs[:, 0] = 0.0  # one live hypothesis to start from
    lengths = np.zeros((batch, width))
    finished = np.zeros((batch, width), bool)
    sequences = np.zeros((batch, width, max_length), "int32")
    for index in range(max_length):
        logits, state = steps.step(tokens, index, state)
        logits = _without_padding(ops.cast(logits, "float32"))
        step_log_probs = np.asarray(ops.log_softmax(logits), "float64")
        vocab = step_log_probs.shape[-1]
        step_log_probs = step_log_probs.reshape(batch, width, vocab)
        pad_only = np.full(vocab, -np.inf)
        pad_only[0] = 0.0  # a finished hypothesis extends with padding, at no cost
        step_log_probs = np.where(finished[..., None], pad_only, step_log_probs)
        candidates = log_probs[..., None] + step_log_probs  # (B, K, V)
        new_lengths = lengths + ~finished  # (B, K)
        ranked = candidates / _length_penalty(new_lengths, length_penalty)[..., None]
        best = np.argsort(-ranked.reshape(batch, -1), axis=-1, kind="stable")[:, :width]
        beam, token = best // vocab, (best % vocab).astype("int32")  # (B, K)
        rows = np.arange(batch)[:, None]
        log_probs = candidates[rows, beam, token]
        lengths, finished = new_lengths[rows, beam], finished[rows, beam]
        sequences = sequences[rows, beam]
        sequences[:, :, index] = token
        finished = finished | (token == end_id)
        flat = (rows * width + beam).reshape(-1)  # hypotheses' rows in the (B*K) state
        state = tf.nest.map_structure(lambda s, rows=flat: ops.take(s, rows, axis=0), state)
        tokens = token.reshape(-1)
        if finished.all():
            break
    final = log_probs / _length_penalty(np.maximum(lengths, 1), length_penalty)
    choice = np.argmax(final, axis=-1)
    rows = np.arange(batch)
    return sequences[rows, choice], final[rows, choice]


def export_seq2seq(model, path, max_length, start_id, end_id=None):
    """Exports a seq2seq model as a SavedModel that also decodes in its graph.

    The SavedModel has two endpoints: `serve` (the teacher-forced model:
    `{"encoder_inputs", "decoder_inputs"}` -> logits) and `greedy_decode`
    (int32 source tokens `(B, S)` -> int32 tokens `(B, max_length)`, the
    whole cached decoding loop inside the graph), so a SavedModel user gets
    outputs without any Python decoding code:

        loaded = tf.saved_model.load(path)
        tokens = loaded.greedy_decode(tf.constant(source_tokens))

    Args:
        model: a zoo seq2seq model.
        path: the SavedModel directory, written atomically (`write_atomically`).
        max_length, start_id, end_id: as in `greedy_decode`.
    """
    _check_lengths(max_length, start_id, end_id)
    steps = decoding_steps(model)
    tokens_spec = tf.TensorSpec((None, None), tf.int32)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serve",
        lambda inputs: model(inputs, training=False),
        input_signature=[{name: tokens_spec for name in model.input}],
    )
    archive.add_endpoint(
        "greedy_decode",
        lambda source: greedy_decode(model, source, max_length, start_id, end_id, steps=steps),
        input_signature=[tokens_spec],
    )
    write_atomically(path, lambda temporary: archive.write_out(temporary, verbose=False))


# ---------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------


def predict_batch(model, inputs):
    """One inference call, NumPy in and out; right for a distributed model too.

    `predict_on_batch` traces once per shape, so it is used when the model has one replica.
    """
    strategy = getattr(model, "distribute_strategy", None)  # TensorFlow backend only
    if strategy is not None and strategy.num_replicas_in_sync > 1:
        # Keras' `predict_on_batch` gives every replica the whole batch and concatenates
        # their outputs (replicas x B rows): call the model on the batch once instead.
        return np.asarray(model(inputs, training=False))
    return np.asarray(model.predict_on_batch(inputs))


# ---------------------------------------------------------------------------
# Pointer networks
# ---------------------------------------------------------------------------


def pointer_decode(model, points, steps=None, constrained=True):
    """Greedy pointer decoding that never points twice at the same position.

        C_t = argmax_{j not in C_<t} p(C_t = j | C_<t, x)

    At step `t` the model (a `models.pointer_network`) gets the pointers
    decoded so far, `-1` (padding) for the steps not yet decoded, and row `t`
    of its output is read. With `constrained=True` the positions already
    chosen are excluded whatever the model says, so for `steps == N` the
    output is always a permutation of `0..N-1` (a sort order). Padded points
    (`pointer_network(pad_value=...)`) get probability 0 and are chosen only
    once every real point is: decode at most as many steps as real points.

    Costs `steps` model calls, the call at step `t` on `t + 1` pointers.

    Args:
        model: a pointer network with inputs `{"points", "pointers"}` and
            output probabilities `(B, T, N)`.
        points: float array `(B, N, d)`.
        steps: number of pointers to decode; defaults to `N`.
        constrained: exclude the positions already chosen.

    Returns:
        int32 NumPy array `(B, steps)` of positions in `[0, N)`.

    Example:

    >>> from models import pointer_network
    >>> model = pointer_network(input_dim=1, units=8)
    >>> order = pointer_decode(model, np.random.uniform(size=(2, 4, 1)))
    >>> print(order.shape, sorted(order[0].tolist()))
    (2, 4) [0, 1, 2, 3]
    """
    points = np.asarray(points, "float32")
    if points.ndim != 3:
        raise ValueError(f"`points` must have rank 3. Received: points.shape={points.shape}")
    batch, num_points = points.shape[:2]
    steps = num_points if steps is None else steps
    if not isinstance(steps, int) or steps <= 0 or (constrained and steps > num_points):
        raise ValueError(
            "`steps` must be a positive integer, at most the number of points "
            f"({num_points}) when constrained. Received: steps={steps!r}"
        )
    pointers = np.full((batch, steps), -1, "int32")
    chosen = np.zeros((batch, num_points), bool)
    rows = np.arange(batch)
    for t in range(steps):
        inputs = {"points": points, "pointers": pointers[:, : t + 1]}
        probs = predict_batch(model, inputs)[:, t]  # (B, N)
        if constrained:
            probs = np.where(chosen, -np.inf, probs)
        pointers[:, t] = np.argmax(probs, axis=-1)
        chosen[rows, pointers[:, t]] = True
    return pointers


def polygon_decode(model, points):
    """Greedy decoding of closed polygons (convex hulls) with a pointer network.

    Positions already chosen are excluded, except the first one: pointing back
    at it (after at least 3 vertices) closes the polygon and ends the
    sequence, the end-of-sequence convention of the Pointer Networks paper
    (train on hulls with their first vertex repeated at the end, with
    `pointer_network(..., mask_chosen=False)`). Costs up to `N + 1` model calls,
    the call at step `t` on `t + 1` pointers.

    Args:
        model: a pointer network with inputs `{"points", "pointers"}`.
        points: float array `(B, N, d)`.

    Returns:
        A list of `B` int arrays: each polygon's vertices, without the closing index.

    Example:

    >>> from models import pointer_network
    >>> model = pointer_network(input_dim=2, units=8, mask_chosen=False)
    >>> hulls = polygon_decode(model, np.random.uniform(size=(2, 6, 2)))
    >>> print(len(hulls), all(len(set(h.tolist())) == len(h) for h in hulls))
    2 True
    """
    points = np.asarray(points, "float32")
    if points.ndim != 3:
        raise ValueError(f"`points` must have rank 3. Received: points.shape={points.shape}")
    batch, num_points = points.shape[:2]
    pointers = np.full((batch, num_points + 1), -1, "int32")  # -1: not decoded yet
    chosen = np.zeros((batch, num_points), bool)
    closed = np.zeros(batch, bool)
    rows = np.arange(batch)
    for t in range(num_points + 1):
        inputs = {"points": points, "pointers": pointers[:, : t + 1]}
        probs = predict_batch(model, inputs)[:, t]  # (B, N)
        allowed = ~chosen
        if t >= 3:  # pointing at the first vertex again closes the polygon
            allowed[rows, pointers[:, 0]] = True
        choice = np.argmax(np.where(allowed, probs, -1.0), axis=-1)
        pointers[:, t] = np.where(closed, -1, choice)
        chosen[rows, choice] = True
        closed |= (t >= 3) & (choice == pointers[:, 0])
        if closed.all():
            break
    return [open_polygon(row) for row in pointers]
