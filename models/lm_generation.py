"""`generate`: a language model's continuation of its prompts, compiled where the backend allows."""

import contextlib
import math
import weakref
from collections.abc import Iterator, Sequence

import keras
import numpy as np
from keras import ops

from keras_attn._execution import no_gradients, xla_tracing
from keras_attn._typing import TensorLike
from keras_attn.matmul_einsum_dense import loop_kernels
from keras_attn.models import decoding
from keras_attn.models.logits_processors import (
    check_no_repeat_ngram_size,
    check_repetition_penalty,
)
from keras_attn.models.sampling import check_sampling, greedy_tokens, sample_tokens
from keras_attn.models.transformer_lm import LanguageModelSteps, check_prompts

SAMPLERS = ("greedy", "sample", "beam")
# TensorFlow, `jit_compile="auto"`: the weights (bytes) above which a streamed step runs as a
# TensorFlow graph (`tf.function`, oneDNN's kernels) rather than under XLA. The one-shot
# greedy and sampled loops run under XLA whatever the size: they read their kernels once,
# outside the loop (`keras_attn.matmul_einsum_dense.loop_kernels`), and there XLA's CPU
# kernels read weights faster than oneDNN's (a GPT-2-small-sized model, 474 MiB, batch 1:
# 22.7 ms a step, 95 % of the copy bandwidth, where the graph's took 43.8; benchmarks/
# README.md, "The roofline"). A streamed step is one compiled call per token: it reads the
# kernels inside, where XLA turns each matrix-vector product into a plain loop (474 MiB:
# 59.5 ms a step against the graph's 49.7; 137 MiB, 13.6 against 14.7 ms; 18 MiB, 2.2
# against 3.1 ms; `python -m benchmarks.profile decode`, the 2-core machine).
XLA_MAX_WEIGHT_BYTES = 256 * 2**20
_COMPILED = weakref.WeakKeyDictionary()  # model -> _CompiledLoops


class _CompiledLoops(dict):
    """A model's compiled loops, by settings, for the variables they were traced with.

    A traced loop holds the model's variables and call path as they were (TensorFlow's
    graph captures the variables it read): `enable_lora` adds variables and a LoRA term,
    `quantize` replaces a kernel by an int8 one and its scale. Either changes the list of
    variables (which `model.variables` holds in its order), so the loops of another list
    are dropped and traced again; new values in the same variables need no new trace.
    """

    def __init__(self, variables):
        super().__init__()
        self.variables = variables  # held: a variable freed could give its id to a new one

    def traced_with(self, variables):
        return len(variables) == len(self.variables) and all(
            a is b for a, b in zip(variables, self.variables, strict=True)
        )


def generate(
    model: keras.Model,
    prompts: TensorLike,
    max_length: int,
    end_id: int | None = None,
    sampler: str = "greedy",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    beam_width: int = 4,
    length_penalty: float = 0.6,
    jit_compile: bool | str = "auto",
    suppress_ids: Sequence[int] | np.ndarray = (),
    repetition_penalty: float | None = None,
    no_repeat_ngram_size: int = 0,
    return_scores: bool = False,
    stream: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray] | Iterator:
    """The next `max_length` tokens of a `transformer_lm` after each prompt.

    A prefill of the prompts (all their tokens but the last, at once), then one
    KV-cached step per new token (`LanguageModelSteps`), through the zoo's
    decoders: `greedy_decode`'s loop with `greedy_tokens` (`"greedy"`) or
    `sample_tokens` (`"sample"`: temperature, top-k, top-p, one uniform draw
    per step and row from `seed`; `temperature=0` is `"greedy"`, exactly), or
    `beam_search` (`"beam"`). Token by
    token this is the uncached full pass: greedy tokens are the argmax of
    `model(prompt + tokens so far)[:, -1]` (tested).

    Padding (token 0) and the `suppress_ids` (an OOV token, say) are never
    generated: their logits are set to `-inf` inside the loop, before greedy's
    argmax, before the temperature, top-k and top-p of sampling, and before
    beam search ranks its candidates. Then the repetition controls, on a row's prompt
    and the tokens it generated: CTRL's `repetition_penalty` (a positive logit of a token
    already in the row divided by it, a negative one multiplied) and
    `no_repeat_ngram_size=n` (a token that would repeat an n-gram of the row ruled out;
    not enforced at a step where it would rule out every token).

    Prompts may be padded (token 0) on either side: each row is continued
    from its own last real token, at its own positions, as if unpadded. The
    greedy and sampled loops run compiled: one `jax.jit` on JAX (the weights
    passed as arguments, so later training is seen); on TensorFlow one
    `tf.function(jit_compile=True)` (XLA), its kernels read once before the
    loop (`keras_attn.matmul_einsum_dense.loop_kernels`); with `"auto"` (the
    default) a streamed step runs under XLA for a model of up to
    `XLA_MAX_WEIGHT_BYTES` (256 MiB) of weights and as a `tf.function` graph
    (oneDNN's kernels, faster at reading large weights inside a step) above
    it; traced once per model, settings
    (`suppress_ids` and the repetition controls included) and prompt shape, and
    again after a change of the model's variables (`enable_lora` on its layers,
    `model.quantize`), so the loop always computes what the model computes
    now (beam search too: `beam_search` compiles its own loop); torch runs eagerly.

    With `stream=True` the tokens come as they are made: an iterator of `max_length`
    int32 NumPy `(B,)` arrays, the new token of every row at each step (greedy and
    sampling), whose concatenation (`np.stack(list(...), axis=1)`) is the one-shot call's
    tokens. It runs a compiled prefill and a compiled one-step function (the same
    settings, the same loop body); once every row has ended (`end_id`), the remaining
    steps yield zeros without running the model. With `return_scores` it yields
    `(tokens, scores)` pairs of `(B,)` arrays. The settings are checked at the call, the
    model runs as the iterator is read.

    Args:
        model: a model built by `transformer_lm`.
        prompts: int tokens `(B, P)`, 0 = padding; every row needs a real
            token.
        max_length: the number of new tokens (whatever the prompts' length).
        end_id: when given, a row stops at its first `end_id` (kept) and is
            padded with 0 after it.
        sampler: `"greedy"`, `"sample"` or `"beam"`.
        temperature, top_k, top_p, seed: of `"sample"` (see
            `keras_attn.models.decoding.sample_decode`).
        beam_width, length_penalty: of `"beam"` (see `beam_search`; it needs
            `end_id`).
        jit_compile: `"auto"`, `True` (XLA on TensorFlow, whatever the size) or
            `False` (eager: op by op). JAX compiles with `jax.jit` unless `False`;
            torch runs eagerly.
        suppress_ids: token ids never generated: a list, tuple, set or 1-D
            array of ints in `[0, vocab_size)` that leaves another token than
            padding.
        repetition_penalty: None or 1 (off), or a positive number (above 1 discourages
            repeats).
        no_repeat_ngram_size: 0 (off), or `n >= 1`: no n-gram twice in a row's prompt and
            output.
        return_scores: also return the float32 `(B, max_length)` scores: the
            log-probability of each new token under the model's own distribution
            (`log_softmax` of its raw logits: before the suppression, the repetition
            controls, the temperature, top-k and top-p), 0.0 after a row's end. For
            `"beam"`, the chosen sequence's per-token log-probabilities.
        stream: return an iterator of each step's tokens (not with `"beam"`).

    Returns:
        int32 NumPy `(B, max_length)`: the new tokens; `(tokens, scores)` with
        `return_scores`; an iterator with `stream`. An empty batch gives empty results.

    Raises:
        ValueError: a prompt row without a real token, a token id outside
            the vocabulary, a learned-position model whose table cannot hold
            the longest prompt and `max_length` tokens, or a bad setting
            (`max_length`, `end_id`, `temperature`, `top_k`, `top_p`, `seed`,
            `repetition_penalty`, `no_repeat_ngram_size`, `jit_compile`, `stream` with
            `"beam"`); each names the argument.

    Example:

    >>> from keras_attn.models import transformer_lm
    >>> model = transformer_lm(50, num_layers=1, d_model=16, intermediate_dim=32)
    >>> prompts = np.array([[5, 6, 7], [8, 9, 0]], "int32")  # ragged, right-padded
    >>> print(generate(model, prompts, max_length=4).shape)
    (2, 4)
    >>> tokens, scores = generate(model, prompts, 4, repetition_penalty=1.3,
    ...                           no_repeat_ngram_size=2, return_scores=True)
    >>> streamed = np.stack(list(generate(model, prompts, 4, repetition_penalty=1.3,
    ...                                   no_repeat_ngram_size=2, stream=True)), axis=1)
    >>> print(scores.shape, bool(np.all(streamed == tokens)))
    (2, 4) True
    """
    if sampler not in SAMPLERS:
        raise ValueError(f"`sampler` must be one of {SAMPLERS}. Received: sampler={sampler!r}")
    if not isinstance(jit_compile, bool) and not (
        isinstance(jit_compile, str) and jit_compile == "auto"
    ):
        raise ValueError(
            f"`jit_compile` must be True, False or 'auto'. Received: jit_compile={jit_compile!r}"
        )
    if not LanguageModelSteps.matches(model):
        raise ValueError(
            "`model` must be built by keras_attn.models.transformer_lm. "
            f"Received: model {model.name!r}"
        )
    prompts = np.asarray(ops.convert_to_numpy(prompts))
    steps = LanguageModelSteps(model)
    max_length, _, end_id = decoding.check_lengths(max_length, None, end_id, steps.vocab_size)
    check_prompts(prompts, steps.vocab_size, max_length, steps.sequence_length, steps.padding_id)
    suppress_ids = decoding.check_suppress_ids(suppress_ids, steps.vocab_size)
    repetition_penalty = check_repetition_penalty(repetition_penalty)
    no_repeat_ngram_size = check_no_repeat_ngram_size(no_repeat_ngram_size)
    prompts = prompts.astype("int32")
    if sampler == "beam" and stream:
        raise ValueError(
            "`stream=True` streams greedy and sampled generation; beam search only knows its "
            "tokens at the end. Received: stream=True, sampler='beam'"
        )
    if sampler == "beam":
        tokens, _, *scores = decoding.beam_search(
            model, prompts, max_length, end_id=end_id, beam_width=beam_width,
            length_penalty=length_penalty, suppress_ids=suppress_ids,
            jit_compile=bool(jit_compile),
            repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
            return_scores=return_scores,
        )  # fmt: skip
        return (tokens, *scores) if return_scores else tokens
    if sampler == "sample":
        temperature, top_k, top_p, seed = check_sampling(temperature, top_k, top_p, seed)
        if temperature == 0:
            sampler = "greedy"  # the argmax, exactly
    options = dict(
        repetition_penalty=repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size,
        return_scores=return_scores,
    )
    # TensorFlow: a streamed step of a large model as a graph (`XLA_MAX_WEIGHT_BYTES`).
    xla = jit_compile is True or keras.backend.backend() != "tensorflow" or not stream
    xla = xla or _small(model)
    settings = (max_length, end_id, suppress_ids, *options.values(), sampler, xla)
    if sampler == "sample":
        settings += (temperature, top_k, top_p)
    batch = prompts.shape[0]
    uniform = keras.random.uniform((max_length, batch), seed=seed)  # (steps, B)
    # The compiled loops live as long as the model (`_COMPILED`'s weak key): they must not
    # hold it. A loop is traced (it calls `model_ref()`) only inside `generate(model, ...)`.
    model_ref = weakref.ref(model)

    def decoding_loop(uniform, steps=None):
        """The loop drawing from `uniform` (a traced argument: never a constant of the trace)."""

        def choose(logits, index):
            if sampler == "greedy":
                return greedy_tokens(logits)
            row = ops.take(uniform, index, axis=0)
            return sample_tokens(logits, row, temperature, top_k, top_p)

        steps = steps or LanguageModelSteps(model_ref())
        return decoding.DecodingLoop(steps, None, end_id, choose, suppress_ids, **options)

    compiled = jit_compile and keras.backend.backend() != "torch"
    if stream:
        if batch == 0:
            return _stream_empty(max_length, return_scores)
        prefill, step = _stream_functions(model, settings, decoding_loop, compiled, xla)
        return _stream(prefill, step, prompts, uniform, max_length, end_id, return_scores)
    if batch == 0:  # no prompts, no tokens (nothing to decode, nor to compile)
        tokens, scores = np.zeros((0, max_length), "int32"), np.zeros((0, max_length), "float32")
        return (tokens, scores) if return_scores else tokens

    def loop(prompts, uniform):
        decode = decoding_loop(uniform)
        carry = decode.start(prompts, max_length)
        # TensorFlow under XLA (a one-shot loop always is): the kernels read here, once, not
        # in every step (issue 47).
        with loop_kernels(model_ref()._flatten_layers()):
            carry = ops.fori_loop(0, max_length, decode.step, carry)
        return tuple(value for value in decode.result(carry) if value is not None)

    if compiled:
        loop = _compiled_loop(model, settings, loop, xla)
    with no_gradients():  # torch: nothing to record for a backward pass
        outputs = tuple(np.asarray(ops.convert_to_numpy(v)) for v in loop(prompts, uniform))
    return outputs if return_scores else outputs[0]


def _stream_functions(model, settings, decoding_loop, compiled, xla=True):
    """`prefill(prompts) -> carry` and `step(index, carry, uniform) -> carry` of the
    `DecodingLoop`s `decoding_loop(uniform, steps)` makes, compiled and kept with the
    model's other loops when `compiled`. The step feeds the decoding steps that the
    prefill (called first) started."""
    started = {}  # the prefill's decoding steps

    def prefill(prompts):
        decode = decoding_loop(None)  # starting draws nothing
        started["steps"] = decode.steps
        return decode.start(prompts, settings[0])

    def step(index, carry, uniform):
        return decoding_loop(uniform, started["steps"]).step(index, carry)

    if not compiled:
        return prefill, step
    return (
        _compiled_loop(model, settings + ("prefill",), prefill, xla),
        _compiled_loop(model, settings + ("step",), step, xla),
    )


def _stream(prefill, step, prompts, uniform, max_length, end_id, return_scores):
    """The iterator of `generate(..., stream=True)`: each step's `(B,)` tokens (and scores)."""
    with no_gradients():  # per call: a generator must not hold it across its yields
        carry = prefill(prompts)
    ended = np.zeros(prompts.shape[0], bool)
    for index in range(max_length):
        if ended.all():  # every row has ended: zeros, as the one-shot call pads
            tokens, scores = np.zeros(len(ended), "int32"), np.zeros(len(ended), "float32")
        else:
            with no_gradients():
                carry = step(np.int32(index), carry, uniform)
            tokens = np.asarray(ops.convert_to_numpy(carry["tokens"]))
            if return_scores:
                scores = np.asarray(ops.convert_to_numpy(carry["scores"][:, index]))
            if end_id is not None:
                ended |= tokens == end_id
        yield (tokens, scores) if return_scores else tokens


def _stream_empty(max_length, return_scores):
    """The stream of an empty batch: `max_length` steps of no tokens."""
    tokens, scores = np.zeros(0, "int32"), np.zeros(0, "float32")
    return iter([(tokens, scores) if return_scores else tokens] * max_length)


def _small(model) -> bool:
    """Whether `model`'s weights fit `XLA_MAX_WEIGHT_BYTES` (`jit_compile="auto"`)."""
    nbytes = 0
    for variable in model.weights:
        bits = "".join(c for c in str(variable.dtype) if c.isdigit())  # "bfloat16" -> 16
        nbytes += math.prod(variable.shape) * max(1, int(bits or 8) // 8)
    return nbytes <= XLA_MAX_WEIGHT_BYTES


def _compile(variables, loop, xla=True):
    """`loop(*args)` compiled: `tf.function(jit_compile=xla)` or `jax.jit`
    (`variables`, the model's, passed as arguments), traced inside `no_gradients()`:
    nothing differentiates a decoding loop, so its kernels build no custom gradients."""

    inference = _Inference(loop, xla)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(inference, jit_compile=xla, reduce_retracing=True)
    import jax

    def stateless(values, *args):
        with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
            return inference(*args)

    jitted = jax.jit(stateless)
    return lambda *args: jitted([v.value for v in variables], *args)


class _Inference:
    """`loop(*args)` traced inside `no_gradients()` (and `xla_tracing()` for XLA): the
    function `_compile` gives `tf.function`. An object, not a closure: TensorFlow counts
    traces per Python code object, so every loop compiled from one closure (one per model
    and settings, each traced once) would count as retracing one function and warn."""

    def __init__(self, loop, xla):
        self.loop, self.xla = loop, xla

    def __call__(self, *args):
        with no_gradients(), xla_tracing() if self.xla else contextlib.nullcontext():
            return self.loop(*args)


def _compiled_loop(model, settings, loop, xla=True):
    """`model`'s compiled `loop(*args)` for `settings` (a hashable key), traced on first use
    and again after a change of the model's variables (`_CompiledLoops`). `loop` must not
    hold `model` (the cache lives as long as the model: reach it through a weak reference).
    `xla=False`: a TensorFlow graph without XLA (`settings` must say so)."""
    variables = tuple(model.variables)
    functions = _COMPILED.get(model)
    if functions is None or not functions.traced_with(variables):
        functions = _COMPILED[model] = _CompiledLoops(variables)
    if settings not in functions:
        functions[settings] = _compile(variables, loop, xla)
    return functions[settings]
