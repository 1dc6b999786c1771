"""`generate`: a language model's continuation of its prompts, compiled where the backend allows."""

import weakref
from collections.abc import Iterator

import keras
import numpy as np
from keras import ops

from keras_attn._execution import no_gradients
from keras_attn._typing import TensorLike
from keras_attn.matmul_einsum_dense import loop_kernels

from ..transformer_lm import LanguageModelSteps, check_prompts
from .beam import beam_search
from .compiled import _small, compiled_loop
from .config import GenerationConfig, check_setting, config_from
from .contrastive import ContrastiveLoop
from .loop import DecodingLoop
from .samplers import sample_draws, token_chooser
from .speculative import speculative_generate

_POSITIONAL = (
    "end_id", "sampler", "temperature", "top_k", "top_p", "seed", "beam_width",
    "length_penalty", "jit_compile", "suppress_ids", "repetition_penalty",
    "no_repeat_ngram_size", "return_scores", "stream",
)  # fmt: skip


def generate(
    model: keras.Model,
    prompts: TensorLike,
    max_length: int,
    *args,
    config: GenerationConfig | None = None,
    **settings,
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

    The settings are a `GenerationConfig` (`config=`), or today's keywords, which build one
    (the same tokens; positional after `max_length` in this order: `end_id`, `sampler`,
    `temperature`, `top_k`, `top_p`, `seed`, `beam_width`, `length_penalty`, `jit_compile`,
    `suppress_ids`, `repetition_penalty`, `no_repeat_ngram_size`, `return_scores`,
    `stream`); keywords given with a config replace its fields.

    Args:
        model: a model built by `transformer_lm`.
        prompts: int tokens `(B, P)`, 0 = padding; every row needs a real
            token.
        max_length: the number of new tokens (whatever the prompts' length).
        end_id: when given, a row stops at its first `end_id` (kept) and is
            padded with 0 after it.
        sampler: `"greedy"`, `"sample"`, `"beam"` or `"contrastive"`.
        temperature, top_k, top_p, seed: of `"sample"` (see
            `keras_attn.models.sample_decode`).
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
        kv_cache_dtype: None or `"float"` (the model's compute dtype), or `"int8"`: the
            KV caches (full or ring) hold int8 keys and values with a float32 scale per
            position and head, quantized as written and read back before the attention
            (4 bytes less per number; see `keras_attn.cache.Int8Heads`). Keyword only.
        config: a `GenerationConfig` holding the settings (None: from the keywords).
        num_return_sequences: `n` continuations per prompt (`"sample"`: `n` draws, sample
            `j` of a prompt drawing what the prompt alone draws with `seed + j`, in any
            batch; `"beam"`: the `n <= beam_width` best beams, best first, the first
            `n = 1`'s): `B * n` rows, prompt `i`'s at rows `i * n` to `i * n + n - 1` (as
            Hugging Face's). `"greedy"` and `"contrastive"` take 1 only.
        penalty_alpha: of `"contrastive"`: contrastive search (Su et al. 2022; keras-hub's
            `ContrastiveSampler`, Hugging Face's `penalty_alpha`) chooses, among the
            `top_k` most likely tokens `v` (`top_k` required), the argmax of
            `(1 - penalty_alpha) p(v) - penalty_alpha max_j cos(h_v, h_j)`, `h` the final
            hidden states, `j` over the row's real prompt tokens and its outputs so far
            (`keras_attn.models.generation.contrastive`); 0 is greedy. It runs the model on
            `B * top_k` candidates a step, and needs one position past the last output (a
            learned-position model: `P + max_length` at most its `sequence_length`). It
            streams.
        stop_sequences: token-id sequences (e.g. `[[13, 9], [4]]`; keyword only): a row
            ends after the first one its new tokens complete (kept, 0 after it, as at
            `end_id`; one begun in the prompt does not count). Beam search finishes a
            hypothesis that completes one.
        min_new_tokens: 0 (off) or `m` (keyword only): `end_id`, and a token that would
            complete a stop sequence, are ruled out while a row has fewer than `m` new
            tokens (Hugging Face's `min_new_tokens`).
        draft_model: a smaller `transformer_lm` of the same vocabulary: speculative decoding
            (`keras_attn.models.generation.speculative`: the draft proposes
            `num_speculative_tokens` tokens (a config field; None: 4), the target verifies
            them in one step; greedy gives the target's own tokens, sampling its
            distribution exactly). Greedy and `"sample"` only.
        return_acceptance: with `draft_model`, also return a `SpeculativeStats` (the
            draft's acceptance rate, the new tokens per target step) after the outputs.

    Returns:
        int32 NumPy `(B, max_length)`: the new tokens (`(B * n, max_length)` with
        `num_return_sequences=n`); `(tokens, scores)` with `return_scores`; an iterator
        with `stream`; the `SpeculativeStats` last with `return_acceptance`. An empty batch
        gives empty results.

    Raises:
        ValueError: a prompt row without a real token, a token id outside
            the vocabulary, a learned-position model whose table cannot hold
            the longest prompt and `max_length` tokens, or a bad setting
            (`max_length`, `end_id`, `temperature`, `top_k`, `top_p`, `seed`,
            `repetition_penalty`, `no_repeat_ngram_size`, `jit_compile`, `stream` with
            `"beam"`, `penalty_alpha`, `num_return_sequences` above 1 with `"greedy"` or
            `"contrastive"` or above `beam_width`, `"contrastive"` without `top_k`); each
            names the argument.

    Example:

    >>> from keras_attn.models import GenerationConfig, transformer_lm
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
    >>> config = GenerationConfig(repetition_penalty=1.3, no_repeat_ngram_size=2)
    >>> bool(np.all(generate(model, prompts, 4, config=config) == tokens))
    True
    """
    config, other = config_from(
        config, _POSITIONAL, args, settings, "generate",
        ("jit_compile", "stream", "draft_model", "return_acceptance"),
    )  # fmt: skip
    draft_model = other.get("draft_model")
    jit_compile, stream = other.get("jit_compile", "auto"), other.get("stream", False)
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
    if config.start_id is not None:
        raise ValueError(
            "A language model continues its prompt: pass `start_id=None` (the prompt's last "
            f"token is fed first; put a start token in the prompt). Received: "
            f"start_id={config.start_id}"
        )
    if config.return_alignment:
        raise ValueError(
            "`return_alignment=True` needs decoding steps that attend to a source; "
            "a language model has none. Received: return_alignment=True"
        )
    prompts = np.asarray(ops.convert_to_numpy(prompts))
    steps = LanguageModelSteps(model, kv_cache_dtype=config.kv_cache_dtype)
    max_length = check_setting("max_length", max_length)
    config.check_vocabulary(steps.vocab_size)
    positions = max_length + (config.sampler == "contrastive")  # one more: the last candidates
    check_prompts(prompts, steps.vocab_size, positions, steps.sequence_length, steps.padding_id)
    prompts = prompts.astype("int32")
    if config.sampler == "beam" and stream:
        raise ValueError(
            "`stream=True` streams greedy and sampled generation; beam search only knows its "
            "tokens at the end. Received: stream=True, sampler='beam'"
        )
    if draft_model is None and other.get("return_acceptance"):
        raise ValueError(
            "`return_acceptance` reports speculative decoding's acceptance: it needs a "
            "`draft_model`. Received: return_acceptance=True, draft_model=None"
        )
    if draft_model is not None or config.num_speculative_tokens is not None:
        if draft_model is None:
            raise ValueError(
                "`num_speculative_tokens` is the draft's tokens per round: it needs a "
                f"`draft_model`. Received: num_speculative_tokens={config.num_speculative_tokens}"
                ", draft_model=None"
            )
        return speculative_generate(
            model, draft_model, prompts, max_length, config, jit_compile,
            bool(other.get("return_acceptance", False)), stream,
        )  # fmt: skip
    if config.sampler == "beam":
        tokens, _, *scores = beam_search(
            model, prompts, max_length, config=config, jit_compile=bool(jit_compile)
        )
        return (tokens, *scores) if config.return_scores else tokens
    # TensorFlow: a streamed step of a large model as a graph (`XLA_MAX_WEIGHT_BYTES`).
    xla = jit_compile is True or keras.backend.backend() != "tensorflow" or not stream
    xla = xla or _small(model)
    key = (config.compile_key, max_length, xla)
    uniform = sample_draws(config, max_length, prompts.shape[0])  # (steps, B * n)
    prompts = np.repeat(prompts, config.num_return_sequences, axis=0)  # each prompt's n rows
    batch = prompts.shape[0]
    # The compiled loops live as long as the model (`_COMPILED`'s weak key): they must not
    # hold it. A loop is traced (it calls `model_ref()`) only inside `generate(model, ...)`.
    model_ref = weakref.ref(model)

    def decoding_loop(uniform, steps=None):
        """The loop drawing from `uniform` (a traced argument: never a constant of the trace)."""
        steps = steps or LanguageModelSteps(model_ref(), kv_cache_dtype=config.kv_cache_dtype)
        loop = ContrastiveLoop if config.sampler == "contrastive" else DecodingLoop
        return loop(steps, config, token_chooser(config, uniform))

    compiled = jit_compile and keras.backend.backend() != "torch"
    if stream:
        if batch == 0:
            return _stream_empty(max_length, config.return_scores)
        prefill, step = _stream_functions(model, key, max_length, decoding_loop, compiled, xla)
        return _stream(model, prefill, step, prompts, uniform, max_length, config)
    if batch == 0:  # no prompts, no tokens (nothing to decode, nor to compile)
        tokens, scores = np.zeros((0, max_length), "int32"), np.zeros((0, max_length), "float32")
        return (tokens, scores) if config.return_scores else tokens

    def loop(prompts, uniform):
        decode = decoding_loop(uniform)
        carry = decode.start(prompts, max_length)
        # TensorFlow under XLA (a one-shot loop always is): the kernels read here, once, not
        # in every step (issue 47).
        with loop_kernels(model_ref()._flatten_layers()):
            carry = ops.fori_loop(0, max_length, decode.step, carry)
        return tuple(value for value in decode.result(carry) if value is not None)

    if compiled:
        loop = compiled_loop(model, key, loop, xla)
    with no_gradients(model):  # torch: nothing recorded; the model's layers call plainly
        outputs = tuple(np.asarray(ops.convert_to_numpy(v)) for v in loop(prompts, uniform))
    return outputs if config.return_scores else outputs[0]


def _stream_functions(model, key, max_length, decoding_loop, compiled, xla=True):
    """`prefill(prompts) -> carry` and `step(index, carry, uniform) -> carry` of the
    `DecodingLoop`s `decoding_loop(uniform, steps)` makes, compiled and kept with the
    model's other loops when `compiled`. The step feeds the decoding steps that the
    prefill (called first) started."""
    started = {}  # the prefill's decoding steps

    def prefill(prompts):
        decode = decoding_loop(None)  # starting draws nothing
        started["steps"] = decode.steps
        return decode.start(prompts, max_length)

    def step(index, carry, uniform):
        return decoding_loop(uniform, started["steps"]).step(index, carry)

    if not compiled:
        return prefill, step
    return (
        compiled_loop(model, key + ("prefill",), prefill, xla),
        compiled_loop(model, key + ("step",), step, xla),
    )


def _stream(model, prefill, step, prompts, uniform, max_length, config):
    """The iterator of `generate(..., stream=True)`: each step's `(B,)` tokens (and scores)."""
    with no_gradients(model):  # per call: a generator must not hold it across its yields
        carry = prefill(prompts)
    ended = np.zeros(prompts.shape[0], bool)
    for index in range(max_length):
        if ended.all():  # every row has ended: zeros, as the one-shot call pads
            tokens, scores = np.zeros(len(ended), "int32"), np.zeros(len(ended), "float32")
        else:
            with no_gradients(model):
                carry = step(np.int32(index), carry, uniform)
            tokens = np.asarray(ops.convert_to_numpy(carry.tokens))
            if config.return_scores:
                scores = np.asarray(ops.convert_to_numpy(carry.scores[:, index]))
            if config.end_id is not None or config.stop_sequences:
                ended |= np.asarray(ops.convert_to_numpy(carry.finished))
        yield (tokens, scores) if config.return_scores else tokens


def _stream_empty(max_length, return_scores):
    """The stream of an empty batch: `max_length` steps of no tokens."""
    tokens, scores = np.zeros(0, "int32"), np.zeros(0, "float32")
    return iter([(tokens, scores) if return_scores else tokens] * max_length)
