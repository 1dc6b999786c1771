"""Decoding for the zoo's autoregressive models.

**Seq2seq** (`greedy_decode`, `beam_search`, `sample_decode`, `export_seq2seq`):
a model is decoded through its *decoding steps* object (`decoding_steps(model)`,
new kinds of model with `register_decoding_steps`):
`start(encoder_inputs, max_length) -> state` encodes the source once, and
`step(tokens, index, state) -> (logits, state)` feeds one token per example.
For `transformer_seq2seq` a step runs the decoder blocks on their KV caches
(O(T) per step instead of re-running the whole decoder, O(T^2)); for
`rnn_seq2seq` it is one RNN cell step and one attention over the source.

The pointer networks' decoding (`pointer_decode`, `polygon_decode`,
`predict_batch`) lives in `keras_attn.models.pointer_decoding`, and `export_seq2seq` in
`keras_attn.models.seq2seq_export`; both are importable from here too. Decoding itself needs
no TensorFlow (only the export does).
"""

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from keras_attn._typing import TensorLike
from keras_attn.arguments import check_finite_number, check_positive_int, is_int
from keras_attn.models.pointer_decoding import pointer_decode, polygon_decode, predict_batch  # noqa: F401
from keras_attn.models.rnn_seq2seq import RNNDecodingSteps
from keras_attn.models.sampling import check_sampling, greedy_tokens, sample_tokens
from keras_attn.models.transformer_lm import LanguageModelSteps
from keras_attn.models.transformer_seq2seq import TransformerDecodingSteps

# ---------------------------------------------------------------------------
# Seq2seq
# ---------------------------------------------------------------------------

_STEPS = [TransformerDecodingSteps, RNNDecodingSteps, LanguageModelSteps]


def register_decoding_steps(steps_class: type) -> type:
    """Teaches greedy, beam, sampled decoding and `export_seq2seq` a new kind of model.

    `decoding_steps(model)` returns `steps_class(model)` for the first
    registered class whose `matches(model)` is true; classes registered later
    are tried first (so one can take over a variant of a zoo model), and
    registering a class twice changes nothing. The class implements:

    - `matches(model) -> bool` (a static method): whether it decodes `model`;
    - `__init__(model)`: picks the layers it needs from the model;
    - `start(encoder_inputs, max_length) -> state`: encodes the int32 source
      `(B, S)` once; `state` is a nest of tensors with a leading batch axis
      (beam search reorders its rows with `keras.tree`): a dict, or a `NamedTuple`
      as the zoo's steps carry (`TransformerDecodingState`, `RNNDecodingState`,
      `LanguageModelState`); not a dataclass, which `keras.tree` takes for one leaf;
    - `step(tokens, index, state) -> (logits, state)`: feeds the `(B,)` tokens
      at position `index` and returns the next-token logits `(B, V)`;
    - optionally `start_tokens(encoder_inputs) -> (B,)`: a model that continues
      its input (a language model: `encoder_inputs` is the prompt) gives the
      tokens fed at the first step, and is decoded with `start_id=None`.

    Written with `keras.ops`, the steps also run inside `export_seq2seq`'s
    graph. For `export_seq2seq` the model takes `{"encoder_inputs",
    "decoder_inputs"}` and returns logits `(B, T, V)` (teacher forcing).

    Args:
        steps_class: the class described above.

    Returns:
        `steps_class`, so this works as a class decorator.

    Example: a hand-built model whose next token depends on the source (mean
    embedding) and on the previous token only, so a step needs no cache.

    >>> embed = keras.layers.Embedding(10, 8, name="embedding")
    >>> logits_layer = keras.layers.Dense(10, name="logits")
    >>> source = keras.Input((None,), dtype="int32", name="encoder_inputs")
    >>> previous = keras.Input((None,), dtype="int32", name="decoder_inputs")
    >>> context = keras.layers.GlobalAveragePooling1D(name="source_mean")(embed(source))
    >>> hidden = embed(previous) + keras.ops.expand_dims(context, 1)  # (B, T, 8)
    >>> model = keras.Model({"encoder_inputs": source, "decoder_inputs": previous},
    ...                     logits_layer(hidden), name="bigram")
    >>> @register_decoding_steps
    ... class BigramSteps:
    ...     @staticmethod
    ...     def matches(model):
    ...         return {"embedding", "source_mean", "logits"} <= {l.name for l in model.layers}
    ...     def __init__(self, model):
    ...         self.embed, self.logits = model.get_layer("embedding"), model.get_layer("logits")
    ...         self.mean = model.get_layer("source_mean")
    ...     def start(self, encoder_inputs, max_length):
    ...         return {"context": self.mean(self.embed(encoder_inputs))}  # (B, 8)
    ...     def step(self, tokens, index, state):
    ...         return self.logits(self.embed(tokens) + state["context"]), state
    >>> source_tokens = np.array([[3, 4, 5], [6, 7, 0]], "int32")
    >>> print(greedy_decode(model, source_tokens, max_length=4, start_id=1).shape)
    (2, 4)
    >>> tokens, _ = beam_search(model, source_tokens, 4, start_id=1, end_id=2, beam_width=3)
    >>> drawn = sample_decode(model, source_tokens, 4, start_id=1, top_p=0.9, seed=0)
    >>> print(tokens.shape, drawn.shape)
    (2, 4) (2, 4)
    """
    for method in ("matches", "start", "step"):
        if not callable(getattr(steps_class, method, None)):
            raise ValueError(
                f"`steps_class` must define `{method}` (see `register_decoding_steps`). "
                f"Received: steps_class={steps_class!r}"
            )
    if steps_class not in _STEPS:
        _STEPS.insert(0, steps_class)
    return steps_class


def decoding_steps(model: keras.Model) -> Any:
    """The decoding-steps object of a seq2seq or language model (see `register_decoding_steps`)."""
    for steps_class in _STEPS:
        if steps_class.matches(model):
            return steps_class(model)
    raise ValueError(
        f"No decoding steps for model {model.name!r}: expected a model built by "
        "keras_attn.models.transformer_seq2seq, keras_attn.models.rnn_seq2seq or "
        "keras_attn.models.transformer_lm, or one whose class was "
        "added with keras_attn.models.decoding.register_decoding_steps."
    )


def decoder_vocab_size(steps: Any, model: keras.Model) -> int | None:
    """The number of token ids a decoder emits, where known: its steps' `vocab_size`, else
    the last axis of the model's one output, the logits `(B, T, V)`; otherwise None."""
    size = getattr(steps, "vocab_size", None)
    outputs = getattr(model, "outputs", None) or []  # a functional model's
    if size is None and len(outputs) == 1 and outputs[0].shape:
        size = outputs[0].shape[-1]
    return None if size is None else int(size)


def check_lengths(
    max_length: int, start_id: int | None, end_id: int | None, vocab_size: int | None = None
) -> tuple[int, int | None, int | None]:
    """The arguments as Python ints (NumPy ones taken), or `ValueError` naming the bad one.

    `max_length` must be a positive integer, the token ids (or None) in `[1, vocab_size)`
    (0 is padding; any positive id when `vocab_size` is None).
    """
    max_length = check_positive_int("max_length", max_length)
    below = f" below vocab_size={vocab_size}" if vocab_size is not None else ""
    for name, value in (("start_id", start_id), ("end_id", end_id)):
        if value is not None and (not is_int(value) or not 0 < value < (vocab_size or np.inf)):
            raise ValueError(
                f"`{name}` must be a positive token id (0 is padding){below}. "
                f"Received: {name}={value!r}"
            )
    return max_length, *(None if v is None else int(v) for v in (start_id, end_id))


def check_suppress_ids(
    suppress_ids: Sequence[int] | np.ndarray, vocab_size: int | None = None
) -> tuple[int, ...]:
    """`suppress_ids` as a sorted tuple of Python ints (NumPy ones taken), or `ValueError`.

    A list, tuple, set or 1-D array of token ids in `[0, vocab_size)` (when `vocab_size` is
    given) that leaves a token besides padding to generate.
    """
    values = suppress_ids
    if isinstance(values, np.ndarray):
        values = values.tolist() if values.ndim == 1 else None  # NumPy ints -> Python ints
    in_range = f" in [0, vocab_size={vocab_size})" if vocab_size is not None else ""
    if not isinstance(values, list | tuple | set | frozenset | range) or not all(
        is_int(v) and 0 <= v < (vocab_size or np.inf) for v in values
    ):
        raise ValueError(
            f"`suppress_ids` must be a sequence of token ids{in_range}. "
            f"Received: suppress_ids={suppress_ids!r}"
        )
    values = tuple(sorted({int(v) for v in values}))
    if vocab_size is not None and len({0, *values}) >= vocab_size:
        raise ValueError(
            "`suppress_ids` must leave a token besides padding (0) to generate. "
            f"Received: suppress_ids={suppress_ids!r}"
        )
    return values


def first_tokens(steps: Any, encoder_inputs: TensorLike, start_id: int | None) -> TensorLike:
    """The `(B,)` int32 tokens fed at the first step: `start_id`, or a language model's prompt's.

    Raises:
        ValueError: `start_id` given for a model that continues its prompt
            (its steps have `start_tokens`), or missing for a seq2seq model.
    """
    continues = hasattr(steps, "start_tokens")
    if continues and start_id is not None:
        raise ValueError(
            "A language model continues its prompt: pass `start_id=None` (the prompt's last "
            f"token is fed first; put a start token in the prompt). Received: start_id={start_id}"
        )
    if not continues and start_id is None:
        raise ValueError(
            "`start_id` (the token fed at the first step) is required for a seq2seq model."
        )
    if continues:
        return ops.cast(steps.start_tokens(encoder_inputs), "int32")
    batch = ops.shape(ops.convert_to_tensor(encoder_inputs))[0]
    return ops.full((batch,), start_id, "int32")


def greedy_decode(
    model: keras.Model,
    encoder_inputs: TensorLike,
    max_length: int,
    start_id: int | None = None,
    end_id: int | None = None,
    steps: Any = None,
    suppress_ids: Sequence[int] | np.ndarray = (),
) -> TensorLike:
    """Greedy decoding: `y_t = argmax_v p(v | y_<t, x)`, one cached step per token.

    Token 0 (padding) and the `suppress_ids` are never emitted before the end.

    Args:
        model: a zoo seq2seq model (`transformer_seq2seq` or `rnn_seq2seq`),
            or a language model (`transformer_lm`).
        encoder_inputs: int tokens `(B, S)`, 0 = padding: the source, or a
            language model's prompts (padded on either side; see
            `keras_attn.models.transformer_lm.LanguageModelSteps`).
        max_length: number of tokens to decode (a language model's new
            tokens, whatever the prompt's length).
        start_id: the token fed at the first step (seq2seq); `None` for a
            language model, which continues its prompt.
        end_id: when given, an example stops at its first `end_id` (kept in
            the output) and is padded with 0 after it.
        steps: a decoding-steps object; by default `decoding_steps(model)`.
        suppress_ids: token ids never emitted (an OOV token, say): their logits are
            `-inf` before the argmax (the argmax over the other tokens).

    Returns:
        int32 `(B, max_length)` tokens (a tensor; runs eagerly or inside a
        `tf.function` or `jax.jit`).

    Raises:
        ValueError: a `max_length` that is not a positive integer, or a
            `start_id` or `end_id` outside `[1, vocab_size)` (where the
            decoder's vocabulary is known: see `decoder_vocab_size`).

    Example:

    >>> from keras_attn.models import transformer_seq2seq
    >>> model = transformer_seq2seq(20, 30, num_layers=1, d_model=16, intermediate_dim=32)
    >>> print(greedy_decode(model, np.ones((2, 7), "int32"), max_length=4, start_id=1).shape)
    (2, 4)
    """
    steps = steps or decoding_steps(model)
    vocab_size = decoder_vocab_size(steps, model)
    max_length, start_id, end_id = check_lengths(max_length, start_id, end_id, vocab_size)
    suppress_ids = check_suppress_ids(suppress_ids, vocab_size)

    def choose(logits, index):
        return greedy_tokens(logits)

    return _decode(steps, encoder_inputs, max_length, start_id, end_id, choose, suppress_ids)


def sample_decode(
    model: keras.Model,
    encoder_inputs: TensorLike,
    max_length: int,
    start_id: int | None = None,
    end_id: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    steps: Any = None,
    suppress_ids: Sequence[int] | np.ndarray = (),
) -> TensorLike:
    """Sampled decoding: `y_t ~ softmax(logits_t / temperature)`, truncated to top-k / top-p.

    The same cached steps as `greedy_decode`; each step draws its token with
    `keras_attn.models.sampling.sample_tokens` (temperature, then the `top_k` most likely
    tokens, then the top-p nucleus: the smallest most-likely-first set with
    mass >= `top_p`). `top_k=1`, or a temperature going to 0, gives the greedy
    tokens. The uniform draws, one per step and example, come from
    `keras.random.uniform` with `seed`: a fixed integer seed gives the same
    tokens at every call; `None` draws from Keras' global seed generator
    (`keras.utils.set_random_seed`). Token 0 (padding) and the `suppress_ids` are never
    drawn: their logits are `-inf` before the temperature, top-k and top-p.

    Args:
        model, encoder_inputs, max_length, start_id, end_id, steps, suppress_ids: as in
            `greedy_decode`.
        temperature: positive number dividing the logits (1 samples the
            model's distribution; below 1 is sharper).
        top_k: None, or sample among the `top_k` most likely tokens.
        top_p: None, or the nucleus mass in `(0, 1]`.
        seed: None or an integer.

    Returns:
        int32 `(B, max_length)` tokens (a tensor).

    Example:

    >>> from keras_attn.models import transformer_seq2seq
    >>> model = transformer_seq2seq(20, 30, num_layers=1, d_model=16, intermediate_dim=32)
    >>> source = np.ones((2, 7), "int32")
    >>> a = sample_decode(model, source, 5, start_id=1, top_k=10, top_p=0.9, seed=7)
    >>> b = sample_decode(model, source, 5, start_id=1, top_k=10, top_p=0.9, seed=7)
    >>> print(a.shape, bool(np.all(np.asarray(a) == np.asarray(b))))
    (2, 5) True

    References:
        Fan et al., 2018, "Hierarchical Neural Story Generation",
        https://arxiv.org/abs/1805.04833 (top-k);
        Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration",
        https://arxiv.org/abs/1904.09751 (top-p)
    """
    steps = steps or decoding_steps(model)
    vocab_size = decoder_vocab_size(steps, model)
    max_length, start_id, end_id = check_lengths(max_length, start_id, end_id, vocab_size)
    temperature, top_k, top_p, seed = check_sampling(temperature, top_k, top_p, seed)
    suppress_ids = check_suppress_ids(suppress_ids, vocab_size)
    batch = ops.shape(ops.convert_to_tensor(encoder_inputs))[0]
    uniform = keras.random.uniform((max_length, batch), seed=seed)  # one draw per step and row

    def choose(logits, index):
        return sample_tokens(logits, ops.take(uniform, index, axis=0), temperature, top_k, top_p)

    return _decode(steps, encoder_inputs, max_length, start_id, end_id, choose, suppress_ids)


def _decode(steps, encoder_inputs, max_length, start_id, end_id, choose, suppress_ids=()):
    """The cached decoding loop; `choose(logits (B, V), index) -> (B,)` picks each token
    among those not ruled out (padding, `suppress_ids`: `_ruled_out`)."""
    encoder_inputs = ops.convert_to_tensor(encoder_inputs, "int32")
    batch = ops.shape(encoder_inputs)[0]
    tokens = first_tokens(steps, encoder_inputs, start_id)
    state = steps.start(encoder_inputs, max_length)
    outputs = ops.zeros((batch, max_length), "int32")
    finished = ops.zeros((batch,), "bool")

    def body(index, carry):
        tokens, outputs, finished, state = carry
        logits, state = steps.step(tokens, index, state)
        tokens = choose(_ruled_out(logits, suppress_ids), index)
        tokens = ops.where(finished, 0, tokens)
        if end_id is not None:
            finished = ops.logical_or(finished, ops.equal(tokens, end_id))
        outputs = ops.slice_update(outputs, (0, index), ops.expand_dims(tokens, 1))
        return tokens, outputs, finished, state

    _, outputs, _, _ = ops.fori_loop(0, max_length, body, (tokens, outputs, finished, state))
    return outputs


def _ruled_out(logits, suppress_ids=()):
    """Logits `(B, V)` with token 0 (padding, never a real output token) and the
    `suppress_ids` (checked Python ints) ruled out: `-inf`.

    The ids are a constant of the trace: one compiled loop per setting.
    """
    ids = ops.convert_to_tensor(np.array((0, *suppress_ids), "int32"))  # (K,)
    vocabulary = ops.arange(ops.shape(logits)[-1], dtype="int32")  # (V,)
    ruled_out = ops.any(ops.equal(ops.expand_dims(vocabulary, -1), ids), axis=-1)  # (V,)
    return ops.where(ruled_out, ops.cast(float("-inf"), logits.dtype), logits)


def _length_penalty(length, alpha):
    """GNMT's `((5 + |Y|) / 6) ** alpha` (Wu et al. 2016)."""
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(
    model: keras.Model,
    encoder_inputs: TensorLike,
    max_length: int,
    start_id: int | None = None,
    end_id: int | None = None,
    beam_width: int = 4,
    length_penalty: float = 0.6,
    suppress_ids: Sequence[int] | np.ndarray = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Beam search over cached decoding steps, ranking `log p(Y | x) / lp(|Y|)`.

    Keeps the `beam_width` best prefixes of every example; a prefix that
    emitted `end_id` is finished and only extends with padding at no cost
    (padding is never emitted otherwise, nor are the `suppress_ids`).
    Hypotheses are ranked by their log-probability divided by GNMT's length
    penalty `lp(|Y|) = ((5 + |Y|) / 6) ** length_penalty` (0 ranks by
    log-probability alone). With `beam_width=1` this is greedy decoding.

    Args:
        model: a zoo seq2seq model, or a language model (`transformer_lm`).
        encoder_inputs: int tokens `(B, S)`, 0 = padding (a language model's
            prompts).
        max_length: longest output.
        start_id: the token fed at the first step; `None` for a language
            model (it continues its prompt).
        end_id: the end-of-sequence token (required).
        beam_width: hypotheses kept per example.
        length_penalty: the exponent `alpha`, a finite number.
        suppress_ids: token ids never emitted (as in `greedy_decode`).

    Returns:
        `(tokens, scores)`: int32 NumPy `(B, max_length)` (0 after `end_id`)
        and the best hypothesis' normalized score `(B,)`.

    Raises:
        ValueError: as `greedy_decode`, a missing `end_id`, a `beam_width`
            that is not a positive integer, or a `length_penalty` that is
            not a finite number (NaN would rank every hypothesis alike).

    Example:

    >>> from keras_attn.models import transformer_seq2seq
    >>> model = transformer_seq2seq(20, 30, num_layers=1, d_model=16, intermediate_dim=32)
    >>> tokens, scores = beam_search(model, np.ones((2, 7), "int32"), 4, start_id=1, end_id=2)
    >>> print(tokens.shape, scores.shape)
    (2, 4) (2,)

    Reference:
        Wu et al., 2016, "Google's Neural Machine Translation System",
        https://arxiv.org/abs/1609.08144 (length penalty)
    """
    steps = decoding_steps(model)
    vocab_size = decoder_vocab_size(steps, model)
    max_length, start_id, end_id = check_lengths(max_length, start_id, end_id, vocab_size)
    if end_id is None:
        raise ValueError("`end_id` (the end-of-sequence token) is required by beam search.")
    beam_width = check_positive_int("beam_width", beam_width)
    length_penalty = check_finite_number("length_penalty", length_penalty)
    suppress_ids = check_suppress_ids(suppress_ids, vocab_size)
    source = np.asarray(encoder_inputs, "int32")
    batch, width = source.shape[0], beam_width
    if batch == 0:  # no examples: no hypotheses to rank
        return np.zeros((0, max_length), "int32"), np.zeros((0,))
    source = np.repeat(source, width, axis=0)  # (B*K, S)
    tokens = ops.convert_to_numpy(first_tokens(steps, source, start_id))
    state = steps.start(source, max_length)  # (B*K, ...)
    log_probs = np.full((batch, width), -np.inf)
    log_probs[:, 0] = 0.0  # one live hypothesis to start from
    lengths = np.zeros((batch, width))
    finished = np.zeros((batch, width), bool)
    sequences = np.zeros((batch, width, max_length), "int32")
    for index in range(max_length):
        logits, state = steps.step(tokens, index, state)
        logits = _ruled_out(ops.cast(logits, "float32"), suppress_ids)
        step_log_probs = ops.convert_to_numpy(ops.log_softmax(logits)).astype("float64")
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
        state = keras.tree.map_structure(lambda s, rows=flat: ops.take(s, rows, axis=0), state)
        tokens = token.reshape(-1)
        if finished.all():
            break
    final = log_probs / _length_penalty(np.maximum(lengths, 1), length_penalty)
    choice = np.argmax(final, axis=-1)
    rows = np.arange(batch)
    return sequences[rows, choice], final[rows, choice]


def __getattr__(name):
    # `export_seq2seq` lives in `keras_attn.models.seq2seq_export` (which imports this
    # module, and TensorFlow when it runs); importable from here too.
    if name == "export_seq2seq":
        from keras_attn.models.seq2seq_export import export_seq2seq

        return export_seq2seq
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
