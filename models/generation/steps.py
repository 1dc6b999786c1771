"""The decoding-steps protocol: how the loop drives a model, one token per row per step.

A model is decoded through its *decoding steps* object (`decoding_steps(model)`, new kinds
of model with `register_decoding_steps`): `start(encoder_inputs, max_length) -> state`
encodes the source (or prefills a language model's prompt) once, and `step(tokens, index,
state) -> (logits, state)` feeds one token per example. For `transformer_seq2seq` a step
runs the decoder blocks on their KV caches (O(T) per step instead of re-running the whole
decoder, O(T^2)); for `rnn_seq2seq` it is one RNN cell step and one attention over the
source; for `transformer_lm` one cached step of its blocks. Whatever a step needs of the
call (`max_length`: the cache positions) travels in its state.
"""

import functools
import inspect
from typing import Any

import keras
from keras import ops

from keras_attn._typing import TensorLike

from ..rnn_seq2seq import RNNDecodingSteps
from ..transformer_lm import LanguageModelSteps
from ..transformer_seq2seq import TransformerDecodingSteps

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

    >>> from keras_attn.models import beam_search, greedy_decode, sample_decode
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


def decoding_steps(model: keras.Model, kv_cache_dtype: str | None = None) -> Any:
    """The decoding-steps object of a seq2seq or language model (see `register_decoding_steps`).

    `kv_cache_dtype` (a `GenerationConfig` setting; None: the compute dtype) goes to steps
    that take it (`LanguageModelSteps`); for others anything but None raises `ValueError`.
    """
    for steps_class in _STEPS:
        if steps_class.matches(model):
            if kv_cache_dtype is None:
                return steps_class(model)
            if "kv_cache_dtype" not in inspect.signature(steps_class).parameters:
                raise ValueError(
                    f"`kv_cache_dtype` is a setting of the steps that keep a language model's "
                    f"KV cache; {steps_class.__name__} takes none. "
                    f"Received: kv_cache_dtype={kv_cache_dtype!r}"
                )
            return steps_class(model, kv_cache_dtype=kv_cache_dtype)
    raise ValueError(
        f"No decoding steps for model {model.name!r}: expected a model built by "
        "keras_attn.models.transformer_seq2seq, keras_attn.models.rnn_seq2seq or "
        "keras_attn.models.transformer_lm, or one whose class was "
        "added with keras_attn.models.generation.register_decoding_steps."
    )


def decoder_vocab_size(steps: Any, model: keras.Model) -> int | None:
    """The number of token ids a decoder emits, where known: its steps' `vocab_size`, else
    the last axis of the model's one output, the logits `(B, T, V)`; otherwise None."""
    size = getattr(steps, "vocab_size", None)
    outputs = getattr(model, "outputs", None) or []  # a functional model's
    if size is None and len(outputs) == 1 and outputs[0].shape:
        size = outputs[0].shape[-1]
    return None if size is None else int(size)


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


def alignment_step(steps):
    """`steps.step` returning `(logits, state, alignment)`, or `ValueError` for steps that have
    no alignment (a language model's; a registered class without the keyword)."""
    parameters = inspect.signature(steps.step).parameters.values()
    if not any(p.name == "return_alignment" or p.kind is p.VAR_KEYWORD for p in parameters):
        raise ValueError(
            f"`return_alignment=True` needs decoding steps that attend to a source; "
            f"{type(steps).__name__}.step has no `return_alignment`. "
            "Received: return_alignment=True"
        )
    return functools.partial(steps.step, return_alignment=True)
