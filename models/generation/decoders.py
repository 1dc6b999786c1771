"""The seq2seq decoders' entry points: `greedy_decode` and `sample_decode`.

Both build a `GenerationConfig` from their keywords (or take one) and run the cached loop
(`loop.decode`) over a model's decoding steps; they also decode a language model (its prompt
continued). Decoding itself needs no TensorFlow (only the export does).
"""

from typing import Any

import keras
from keras import ops

from keras_attn._execution import no_gradients
from keras_attn._typing import TensorLike

from .config import GenerationConfig, check_lengths, config_from
from .loop import Decoded, decode
from .samplers import sample_draws, token_chooser
from .steps import alignment_step, decoder_vocab_size, decoding_steps

_GREEDY = (
    "start_id", "end_id", "steps", "suppress_ids", "repetition_penalty",
    "no_repeat_ngram_size", "return_scores", "return_alignment",
)  # fmt: skip
_SAMPLE = (
    "start_id", "end_id", "temperature", "top_k", "top_p", "seed", "steps", "suppress_ids",
    "repetition_penalty", "no_repeat_ngram_size", "return_scores", "return_alignment",
)  # fmt: skip


def greedy_decode(
    model: keras.Model,
    encoder_inputs: TensorLike,
    max_length: int,
    *args,
    config: GenerationConfig | None = None,
    **settings,
) -> TensorLike | tuple[TensorLike, ...]:
    """Greedy decoding: `y_t = argmax_v p(v | y_<t, x)`, one cached step per token.

    Token 0 (padding) and the `suppress_ids` are never emitted before the end. With the
    repetition controls the argmax is taken over the controlled logits: CTRL's
    `repetition_penalty` divides the positive logits and multiplies the negative ones of
    the tokens already in the row (`keras_attn.models.generation.processors`), and
    `no_repeat_ngram_size=n` rules out every token that would repeat an n-gram of the row
    (unless that rules out every token: then the n-grams are not enforced at that step).
    A row's tokens so far are a language model's prompt and outputs, or a seq2seq
    decoder's start token and outputs.

    The settings are today's keywords (and positional arguments, in this order: `start_id`,
    `end_id`, `steps`, `suppress_ids`, `repetition_penalty`, `no_repeat_ngram_size`,
    `return_scores`, `return_alignment`), or a `GenerationConfig` as `config=` (keywords given
    too replace its fields; the sampler is greedy).

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
        config: a `GenerationConfig` holding the settings (None: from the keywords).
        suppress_ids: token ids never emitted (an OOV token, say): their logits are
            `-inf` before the argmax (the argmax over the other tokens).
        repetition_penalty: None or 1 (off), or a positive number (above 1 discourages
            repeats).
        no_repeat_ngram_size: 0 (off) or the n-gram size `n >= 1`.
        return_scores: also return the float32 `(B, max_length)` scores: each token's
            `log p(y_t | y_<t, x)` under the model's own distribution (before the
            suppression and the repetition controls), 0.0 after a row's end.
        return_alignment: also return the float32 `(B, max_length, S)` alignment: each
            step's attention over the source (a `transformer_seq2seq`: its last decoder
            block's cross-attention, averaged over the heads; an `rnn_seq2seq`: its
            attention weights), 0 on source padding and after a row's end.

    Returns:
        int32 `(B, max_length)` tokens (a tensor; runs eagerly or inside a
        `tf.function` or `jax.jit`); with `return_scores` or `return_alignment`, a tuple
        `(tokens, scores, alignment)` of the tokens and what was asked, in that order. An
        empty batch gives empty results.

    Raises:
        ValueError: a `max_length` that is not a positive integer, a
            `start_id` or `end_id` outside `[1, vocab_size)` (where the
            decoder's vocabulary is known: see `decoder_vocab_size`), a
            `repetition_penalty` that is not a positive finite number, a negative or
            non-integer `no_repeat_ngram_size`, or `return_alignment=True` for a model
            without a source to attend to (a language model).

    Example:

    >>> from keras_attn.models import transformer_seq2seq
    >>> model = transformer_seq2seq(20, 30, num_layers=1, d_model=16, intermediate_dim=32)
    >>> source = np.ones((2, 7), "int32")
    >>> print(greedy_decode(model, source, max_length=4, start_id=1).shape)
    (2, 4)
    >>> tokens, scores, alignment = greedy_decode(
    ...     model, source, 4, start_id=1, repetition_penalty=1.2, no_repeat_ngram_size=2,
    ...     return_scores=True, return_alignment=True)
    >>> print(tokens.shape, scores.shape, alignment.shape)
    (2, 4) (2, 4) (2, 4, 7)
    """
    config, other = config_from(
        config, _GREEDY, args, settings, "greedy_decode", ("steps",), sampler="greedy"
    )
    return decode_model(model, encoder_inputs, max_length, config, other.get("steps"))


def sample_decode(
    model: keras.Model,
    encoder_inputs: TensorLike,
    max_length: int,
    *args,
    config: GenerationConfig | None = None,
    **settings,
) -> TensorLike | tuple[TensorLike, ...]:
    """Sampled decoding: `y_t ~ softmax(logits_t / temperature)`, truncated to top-k / top-p.

    The same cached steps as `greedy_decode`; each step draws its token with
    `keras_attn.models.generation.samplers.sample_tokens` (temperature, then the `top_k` most likely
    tokens, then the top-p nucleus: the smallest most-likely-first set with
    mass >= `top_p`). `top_k=1`, or a temperature going to 0, gives the greedy
    tokens; `temperature=0` is greedy decoding (`greedy_tokens`, exactly). The uniform
    draws, one per step and example, come from
    `keras.random.uniform` with `seed`: a fixed integer seed gives the same
    tokens at every call; `None` draws from Keras' global seed generator
    (`keras.utils.set_random_seed`). Token 0 (padding) and the `suppress_ids` are never
    drawn: their logits are `-inf` before the repetition controls (as in `greedy_decode`),
    the temperature, top-k and top-p.

    The settings: as `greedy_decode` (positional order `start_id`, `end_id`, `temperature`,
    `top_k`, `top_p`, `seed`, `steps`, `suppress_ids`, `repetition_penalty`,
    `no_repeat_ngram_size`, `return_scores`, `return_alignment`), or `config=` (the sampler is
    `"sample"`).

    Args:
        model, encoder_inputs, max_length, start_id, end_id, steps, config, suppress_ids,
            repetition_penalty, no_repeat_ngram_size, return_scores, return_alignment:
            as in `greedy_decode` (the scores are the model's log-probabilities, before
            the temperature, top-k and top-p).
        temperature: a number >= 0 dividing the logits (1 samples the
            model's distribution; below 1 is sharper; 0 is greedy).
        top_k: None or 0 (off), or sample among the `top_k` most likely tokens.
        top_p: None, or the nucleus mass in `(0, 1]`.
        seed: None or an integer.
        num_return_sequences: `n` samples per example: `B * n` rows, example `i`'s at rows
            `i * n` to `i * n + n - 1`; sample `j` draws what the example alone draws with
            `seed + j` (`keras_attn.models.generation.samplers.sample_draws`).

    Returns:
        int32 `(B * n, max_length)` tokens (a tensor); with `return_scores` or
        `return_alignment` a tuple, as in `greedy_decode`.

    Raises:
        ValueError: as `greedy_decode`, a negative, NaN or infinite `temperature`, a
            negative `top_k`, a `top_p` outside `(0, 1]`, or a `seed` that is not an
            integer; each names the argument.

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
    config, other = config_from(
        config, _SAMPLE, args, settings, "sample_decode", ("steps",), sampler="sample"
    )
    return decode_model(model, encoder_inputs, max_length, config, other.get("steps"))


def decode_model(
    model: keras.Model, encoder_inputs: TensorLike, max_length: int, config: GenerationConfig,
    steps: Any = None,
):  # fmt: skip
    """`greedy_decode` / `sample_decode` for a checked `config`: the checks that need the
    model, then the loop; their return value (`returned`)."""
    steps = steps or decoding_steps(model, config.kv_cache_dtype)
    max_length, _, _ = check_lengths(max_length, None, None)
    config.check_vocabulary(decoder_vocab_size(steps, model))
    if config.return_alignment:
        alignment_step(steps)  # raises for steps without an alignment
    encoder_inputs = ops.convert_to_tensor(encoder_inputs, "int32")
    if encoder_inputs.shape[0] == 0:  # no examples: nothing to decode
        decoded = _empty(encoder_inputs, max_length)
    else:
        uniform = None
        if config.sampler == "sample" and not config.greedy:  # a draw per step and row
            batch = ops.shape(encoder_inputs)[0]
            uniform = sample_draws(config, max_length, batch)  # (T, B * n)
        if config.num_return_sequences > 1:  # each example's n rows
            encoder_inputs = ops.repeat(encoder_inputs, config.num_return_sequences, axis=0)
        with no_gradients(model):  # torch: nothing recorded; the model's layers call plainly
            choose = token_chooser(config, uniform)
            decoded = decode(steps, encoder_inputs, max_length, config, choose)
    return returned(decoded, config)


def returned(decoded: Decoded, config: GenerationConfig):
    """The decoders' return value: the tokens alone, or a tuple `(tokens, scores, alignment)`
    of the tokens and what was asked, in that order."""
    if not (config.return_scores or config.return_alignment):
        return decoded.tokens
    asked = ((True, decoded.tokens), (config.return_scores, decoded.scores))
    asked += ((config.return_alignment, decoded.alignment),)
    return tuple(value for wanted, value in asked if wanted)


def _empty(encoder_inputs, max_length):
    """The `Decoded` of an empty batch: tokens, scores and alignment with 0 rows."""
    source = ops.shape(encoder_inputs)[1]
    return Decoded(
        ops.zeros((0, max_length), "int32"),
        ops.zeros((0, max_length), "float32"),
        ops.zeros((0, max_length, source), "float32"),
    )
