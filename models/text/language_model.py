"""`TextLanguageModel`: a language model with its vocabulary, a prompt in, its continuation out."""

import tempfile
from collections.abc import Iterator

import keras
import numpy as np

from ..files import write_atomically
from .base import (
    _REGISTER,
    OOV,
    _asset_lookup,
    _at_least_one_column,
    _check_export_backend,
    _check_tokens,
    _join_words,
    _positive,
    _strings,
    _TextModel,
    _unfamiliar,
    _vocabulary_file,
    checked_stop_ids,
    normalize_spaces,
    split_words,
    stop_sequences_of,
)

# After `normalize_spaces`: a character that is no letter, digit, combining mark (Unicode's
# categories), apostrophe, hyphen or space, with the combining marks after it.
PUNCTUATION = r"([^\p{L}\p{N}\p{M} '-]\p{M}*)"


def split_punctuation(text):
    """Lowercased text `(B,)`, its spaces ASCII ones (`normalize_spaces`), every punctuation
    mark a word of its own (TensorFlow).

    `"It's a must-see!"` -> `"it's a must-see ! "`, `"Café crème."` -> `"café crème . "`:
    letters, digits and combining marks (Unicode's, not ASCII's only), apostrophes and hyphens
    stay inside their words; split on spaces afterwards.
    """
    import tensorflow as tf

    lower = normalize_spaces(tf.strings.lower(text, encoding="utf-8"))
    return tf.strings.regex_replace(lower, PUNCTUATION, r" \1 ")


def _suppress_by_default(generation, suppress_ids):
    """The model's `suppress_ids` unless the settings (keywords or a config) give theirs."""
    config = generation.get("config")
    if "suppress_ids" not in generation and not (config and config.suppress_ids):
        generation["suppress_ids"] = suppress_ids


def split_prompt_words(text):
    """Strings `(B,)` -> their words `(B, None)` as a prompt's are split (`split_punctuation`,
    then spaces), ragged (TensorFlow)."""
    return split_words(split_punctuation(text))


@_REGISTER
class TextLanguageModel(_TextModel):
    """A language model with its vocabulary: a prompt in, its continuation out.

    A prompt is lowercased, its punctuation split off (`split_punctuation`) and split at
    spaces (any Unicode space); its last `prompt_length` words are looked up (unknown words:
    `[UNK]`) after the start token, as every training sequence began.
    `keras_attn.models.generate` then continues it by at most `max_length` tokens (greedy,
    sampled or beam, KV-cached; the prompts are right-padded here and `generate`
    left-aligns them), and the new words up to the end token are joined with spaces: the
    continuation, without the prompt. The `suppress_tokens` (by default the OOV token
    `[UNK]`: a word, not a placeholder) are never generated, nor is padding; `predict_text`,
    `continue_ids` and the SavedModel alike.

    Args:
        language_model: the token model, a `transformer_lm`: tokens `(B, T)` -> logits.
        lookup: a `StringLookup` (`string_lookup`): word -> id; its vocabulary holds
            `start_token` and `end_token`.
        max_length: the most new tokens (the end token included).
        prompt_length: the most prompt words kept (its last ones). With learned positions
            `prompt_length + max_length` must fit in the model's `sequence_length`.
        start_token, end_token: the vocabulary's start and end tokens.
        suppress_tokens: tokens of the vocabulary never generated (`generate`'s
            `suppress_ids`); `()` lets the model generate `[UNK]`.

    Call arguments:
        inputs: the token model's inputs; returns its logits (`model.fit` trains it).

    Example:

    >>> text_model = TextLanguageModel(lm, string_lookup(words), 24, 32)  # doctest: +SKIP
    >>> text_model.predict_text(["the movie is"])  # doctest: +SKIP
    ['a lot of fun .']
    """

    def __init__(
        self,
        language_model: keras.Model,
        lookup: keras.layers.Layer,
        max_length: int,
        prompt_length: int,
        start_token: str = "<s>",
        end_token: str = "</s>",
        suppress_tokens: tuple | list = (OOV,),
        **kwargs,
    ):
        from ..transformer_lm import LanguageModelSteps

        super().__init__(**kwargs)
        for name, value in (("max_length", max_length), ("prompt_length", prompt_length)):
            if not _positive(value):
                raise ValueError(f"`{name}` must be a positive integer. Received: {value!r}")
        if not LanguageModelSteps.matches(language_model):
            raise ValueError(
                "`language_model` must be built by keras_attn.models.transformer_lm. "
                f"Received: model {language_model.name!r}"
            )
        positions = LanguageModelSteps(language_model).sequence_length
        if positions is not None and prompt_length + max_length > positions:
            raise ValueError(
                "`prompt_length` + `max_length` (the start token, the prompt and the new tokens "
                f"but the last) must fit in the model's sequence_length={positions}. Received: "
                f"prompt_length={prompt_length}, max_length={max_length}"
            )
        self.language_model = language_model
        self.lookup = lookup
        self.max_length = max_length
        self.prompt_length = prompt_length
        self.start_token = start_token
        self.end_token = end_token
        if isinstance(suppress_tokens, str) or not all(isinstance(t, str) for t in suppress_tokens):
            raise ValueError(
                "`suppress_tokens` must be a list or tuple of tokens of the vocabulary. "
                f"Received: suppress_tokens={suppress_tokens!r}"
            )
        self.suppress_tokens = tuple(suppress_tokens)
        _check_tokens(lookup, start_token=start_token, end_token=end_token)
        for token in self.suppress_tokens:
            _check_tokens(lookup, suppress_tokens=token)
        self.built = True

    @property
    def input(self):
        """The token model's input (what `call` takes)."""
        return self.language_model.input

    def call(self, inputs, training=None):
        return self.language_model(inputs, training=training)

    def sequence_ids(self, text, lookup=None, end=True, words=None):
        """`text` `(B,)` -> `start_token`, its words (the last `words`, if given), `end_token`
        (if `end`): ids `(B, T)` int32, right-padded with 0 (TensorFlow). Training sequences."""
        import tensorflow as tf

        text = _strings(text)
        pieces = split_prompt_words(text)  # (B, None) ragged
        if words is not None:
            pieces = pieces[:, -words:]
        batch = tf.shape(text, out_type=tf.int64)[:1]
        start = tf.RaggedTensor.from_tensor(tf.fill(tf.concat([batch, [1]], 0), self.start_token))
        parts = [start, pieces]
        if end:
            parts.append(
                tf.RaggedTensor.from_tensor(tf.fill(tf.concat([batch, [1]], 0), self.end_token))
            )
        ids = (lookup or self.lookup)(tf.concat(parts, axis=1))
        return _at_least_one_column(tf.cast(ids, tf.int32).to_tensor(0))  # no rows: (0, 1)

    def prompt_ids(self, text, lookup=None):
        """`text` `(B,)` -> the start token and the last `prompt_length` words: `(B, P)` int32,
        right-padded with 0, `1 <= P <= prompt_length + 1` (TensorFlow)."""
        return self.sequence_ids(text, lookup, end=False, words=self.prompt_length)

    @property
    def end_id(self) -> int:
        """The id of `end_token`: `generate`'s `end_id` for the token model."""
        return self.lookup.get_vocabulary().index(self.end_token)

    @property
    def suppress_ids(self) -> tuple:
        """The ids of `suppress_tokens`: `generate`'s `suppress_ids` for the token model.

        `keras_attn.models.generate(text_model.language_model, text_model.prompt_ids(texts),
        text_model.max_length, text_model.end_id, suppress_ids=text_model.suppress_ids)` is
        `continue_ids(texts)`: without `suppress_ids` the token model may generate `[UNK]`.
        """
        vocabulary = self.lookup.get_vocabulary()
        return tuple(vocabulary.index(token) for token in self.suppress_tokens)

    def _length(self, max_length):
        """`max_length` checked against the model's (None: the model's)."""
        if max_length is None:
            return self.max_length
        if not _positive(max_length) or max_length > self.max_length:
            raise ValueError(
                f"`max_length` must be an integer in [1, {self.max_length}] (the text model's "
                f"`max_length`). Received: max_length={max_length!r}"
            )
        return int(max_length)

    def _stop(self, generation):
        """`generation`'s `stop` strings (popped) spelled with the vocabulary, added to its
        `stop_sequences` (`ValueError` naming a string it cannot spell)."""
        if "stop" not in generation:
            return
        stops = stop_sequences_of(generation.pop("stop"), split_prompt_words, self.lookup)
        config = generation.get("config")
        given = generation.get("stop_sequences", config.stop_sequences if config else ())
        generation["stop_sequences"] = tuple(map(tuple, given)) + stops

    def continue_ids(self, text, max_length: int | None = None, **generation) -> np.ndarray:
        """The new tokens after each prompt: int32 `(B, max_length)`, 0 after the end token.

        Args:
            text: prompts `(B,)`.
            max_length: the most new tokens, at most the text model's `max_length` (None:
                that).
            **generation: `config` (a `GenerationConfig`) or its keywords, `sampler`
                (`"greedy"`, `"sample"`, `"beam"`), `temperature`, `top_k`, `top_p`, `seed`,
                `repetition_penalty`, `no_repeat_ngram_size`, `suppress_ids` (here the ids of
                `suppress_tokens` unless given), `min_new_tokens`, `stop_sequences` ..., and
                `jit_compile` (here False unless given), of `keras_attn.models.generate`;
                and `stop`: stop strings (a list of str), each split and looked up as a
                prompt's words into a stop sequence (the row ends after it, its words kept).

        Raises:
            ValueError: a `stop` string the vocabulary cannot spell (a word outside it, or
                no word), or a bad setting, naming it.

        Example:

        >>> run = text.load_run("transformer-lm")  # doctest: +SKIP
        >>> run.predict_text(["the movie is"], stop=["of the"], min_new_tokens=6)  # doctest: +SKIP
        ['a film of a film of the']
        """
        from ..generation import generate

        self._stop(generation)
        max_length = self._length(max_length)
        prompts = np.asarray(self.prompt_ids(text))
        if not len(prompts):  # no prompts, no continuations
            return np.zeros((0, max_length), "int32")
        # Eager by default: compiling the loop (XLA) takes longer than a few prompts' decoding.
        generation.setdefault("jit_compile", False)
        _suppress_by_default(generation, self.suppress_ids)
        return generate(self.language_model, prompts, max_length, self.end_id, **generation)

    def predict_text(self, text, **generation) -> list:
        """Continues a batch of prompts: one string per prompt, its new words up to the end.

        Args:
            text: strings `(B,)`: a list, a NumPy array or a tf.string tensor.
            **generation: as in `continue_ids` (default: greedy).

        Returns:
            A list of `B` Python strings.
        """
        import tensorflow as tf

        tokens = self.continue_ids(text, **generation)
        vocabulary = tf.constant(self.lookup.get_vocabulary())
        return [t.decode("utf-8") for t in _join_words(tokens, vocabulary, self.end_token).numpy()]

    def stream_text(self, text, max_length: int | None = None, **generation) -> Iterator[list]:
        """Continues a batch of prompts word by word, as the words are made.

        `keras_attn.models.generate(..., stream=True)`: the same tokens as `continue_ids`
        (the same settings), read one step at a time; it stops once every prompt has ended.
        `" ".join` of a prompt's non-empty words is its `predict_text` output.

        Args:
            text: strings `(B,)`.
            max_length: as in `continue_ids`.
            **generation: as in `continue_ids` (greedy or `sampler="sample"`).

        Yields:
            A list of `B` Python strings per step: each prompt's new word, `""` once it
            has ended (the end token is not a word); `B * n` with `num_return_sequences=n`.

        Example:

        >>> for words in text_model.stream_text(["the movie is"]):  # doctest: +SKIP
        ...     print(words[0], end=" ", flush=True)
        """
        from ..generation import generate

        self._stop(generation)
        max_length = self._length(max_length)
        prompts = np.asarray(self.prompt_ids(text))
        if not len(prompts):  # no prompts, no words
            return
        generation.setdefault("jit_compile", False)
        _suppress_by_default(generation, self.suppress_ids)
        vocabulary, end_id = self.lookup.get_vocabulary(), self.end_id
        ended = None  # (B,), or (B * n,) with num_return_sequences=n
        steps = generate(
            self.language_model, prompts, max_length, end_id, stream=True, **generation
        )
        for tokens in steps:
            ended = (tokens == end_id) | (tokens == 0) | (False if ended is None else ended)
            # (0: ended at a stop sequence)
            yield ["" if t == end_id else vocabulary[t] for t in tokens.tolist()]  # 0: ""
            if ended.all():
                return

    def outside_training(self, text) -> list:
        """What sets prompts of `text` apart from the training texts, in sentences (none:
        nothing): how many have words outside the vocabulary (of the words kept)."""
        return _unfamiliar(self.prompt_ids(text))

    def export_text(
        self, path: str, num_return_sequences: int = 1, kv_cache_dtype: str | None = None
    ) -> None:
        """A SavedModel of a prompt in, its continuation out (never a `suppress_tokens` token),
        the vocabulary in `assets/`.

        Signatures:

        - `serving_default`: `text` tf.string `(None,)` -> `{"text": (None,)}`, greedy;
        - `generate`: `text` `(B,)` and scalars `max_length` int32 (at most the model's
          `max_length`), `temperature` float32 (0 = greedy), `top_k` int32 (0 = off), `top_p`
          float32 (1 = off), `seed` int32, `repetition_penalty` float32 (1 = off),
          `stop_sequences` tf.string `(N,)` (stop strings, any number, `N = 0`: none; each
          spelled with the vocabulary as a prompt's words), `min_new_tokens` int32 (0 =
          off) -> `{"text": (B,), "tokens": (B, max_length) int32, "scores": (B, max_length)
          float32}` (each token's log-probability under the model, 0 after the end): for
          the same settings and seed, the tokens of Python's `continue_ids` /
          `keras_attn.models.generate` on TensorFlow (`sampler="sample"`, or `"greedy"` for
          temperature 0; `stop=` the strings). A bad setting, or a stop string the
          vocabulary cannot spell, fails a `tf.debugging` assert naming it;
        - `prefill`: prompt ids `tokens` `(B, P)` int64 (0 = padding, either side; -1 for a
          `padding_id=-1` model, an imported checkpoint's) -> `logits` `(B, V)` of the first
          new token (padding and `suppress_tokens` at `-inf`), the KV cache: `keys` and
          `values` `(B, L, S, g, d)` (every block's, in keras-hub's layout; `L` blocks, `g`
          key/value heads, `S = P - 1 + max_length` positions) and `valid` bool `(B, S)`
          (its real positions), `positions` int32 `(B,)` (each row's next position) and
          `index` int32 `()` (1);
        - `decode_step`: `token` int64 `(B,)` (the last chosen), `keys`, `values`, `valid`,
          `positions`, `index` -> the next `logits` and the updated `keys`, `values`, `valid`,
          `positions`, `index` (+ 1; at most `max_length - 1` steps after `prefill`: an
          `index` outside `[1, max_length)` fails a `tf.debugging` assert naming it).
          Converts to TFLite with builtin ops only;
        - `greedy_decode`: prompt ids `prompts` `(B, P)` int64 (0 = padding, either side) ->
          the new tokens `(B, max_length)` int32; `serve`: the token model (ids -> logits).

        With `num_return_sequences=n` (fixed at export: a signature input would be one more
        that every client must send), `generate` returns `n` samples per prompt: `text`
        `(B * n,)`, `tokens` and `scores` `(B * n, max_length)`, prompt `i`'s at rows
        `i * n` to `i * n + n - 1`, sample `j` drawn from `seed + j` (Python's
        `generate(..., num_return_sequences=n)`; at temperature 0 the `n` rows are equal).

        With `kv_cache_dtype="int8"` every signature decodes through int8 KV caches
        (`keras_attn.models.generate`'s setting, fixed at export): `prefill` and
        `decode_step` pass `keys` and `values` as int8 and two more tensors, `key_scales` and
        `value_scales` float32 `(B, L, S, g, 1)` (each position's and head's scale: a key is
        `keys * key_scales`).

        Args:
            path: the SavedModel directory, written atomically.
            num_return_sequences: samples per prompt of the `generate` signature.
            kv_cache_dtype: None or `"float"` (the model's compute dtype), or `"int8"`.

        Raises:
            ValueError: a `num_return_sequences` that is not a positive integer, a
                `kv_cache_dtype` other than those.
        """
        import tensorflow as tf

        from ..generation import GenerationConfig, greedy_decode
        from ..generation.config import check_setting
        from ..generation.export import generation_specs, sampled_generation
        from ..transformer_lm import LanguageModelSteps

        _check_export_backend()
        # (checked first: a bad value fails before anything is traced)
        sampled = GenerationConfig(sampler="sample", num_return_sequences=num_return_sequences)
        kv_cache_dtype = check_setting("kv_cache_dtype", kv_cache_dtype)
        kv_cache_dtype = None if kv_cache_dtype == "float" else kv_cache_dtype
        model, end_id, suppress_ids = self.language_model, self.end_id, self.suppress_ids
        archive = keras.export.ExportArchive()
        archive.track(model)

        # No AutoGraph: the loop is `keras.ops.fori_loop` already (and the closures confuse it).
        @tf.function(
            input_signature=[tf.TensorSpec((None, None), tf.int64, name="prompts")], autograph=False
        )
        def decoder(prompts):
            prompts = tf.cast(prompts, tf.int32)
            return greedy_decode(
                model, prompts, self.max_length, None, end_id, suppress_ids=suppress_ids,
                kv_cache_dtype=kv_cache_dtype,
            )  # fmt: skip

        archive.add_endpoint("greedy_decode", decoder)
        archive.add_endpoint(
            "serve",
            lambda tokens: model(tf.cast(tokens, tf.int32), training=False),
            input_signature=[tf.TensorSpec((None, None), tf.int64, name="tokens")],
        )
        self._add_streaming(archive, kv_cache_dtype)
        with tempfile.TemporaryDirectory() as scratch:
            vocabulary = self.lookup.get_vocabulary()
            vocabulary_file = _vocabulary_file(scratch, "vocabulary.txt", vocabulary)
            lookup = _asset_lookup(vocabulary_file)  # both tables read the one asset
            words = _asset_lookup(vocabulary_file, invert=True)
            for layer in (lookup, words):
                archive.track(layer)
            all_ids = tf.range(len(vocabulary), dtype=tf.int64)

            @tf.function(
                input_signature=[tf.TensorSpec((None,), tf.string, name="text")], autograph=False
            )
            def serving_default(text):
                tokens = decoder(tf.cast(self.prompt_ids(text, lookup), tf.int64))
                return {"text": _join_words(tokens, words(all_ids), self.end_token)}

            archive.add_endpoint("serving_default", serving_default)

            config = sampled.replace(end_id=end_id, suppress_ids=suppress_ids)

            # The settings' inputs and checks: `GenerationConfig.exported()` and its `RULES`
            @tf.function(input_signature=generation_specs(), autograph=False)
            def generate(text, *settings):
                settings = dict(zip(GenerationConfig.exported(), settings, strict=True))
                settings["stop_sequences"] = checked_stop_ids(
                    settings["stop_sequences"], split_prompt_words, lookup
                )
                decoded = sampled_generation(
                    LanguageModelSteps(model, kv_cache_dtype=kv_cache_dtype),
                    self.prompt_ids(text, lookup), config,
                    self.max_length, **settings,
                )  # fmt: skip
                text = _join_words(decoded.tokens, words(all_ids), self.end_token)
                return {"text": text, "tokens": decoded.tokens, "scores": decoded.scores}

            archive.add_endpoint("generate", generate)
            write_atomically(path, lambda temporary: archive.write_out(temporary, verbose=False))

    def _add_streaming(self, archive, kv_cache_dtype=None):
        """The `prefill` and `decode_step` endpoints (`export_text`): the KV cache in and out
        as tensors, every block's keys and values in keras-hub's layout (`KVCache.to_stacked`
        / `from_stacked`), stacked on axis 1; an int8 cache's scales beside them."""
        import tensorflow as tf

        from keras_attn.cache import Int8Heads, KVCache

        from ..generation.processors import rule_out
        from ..transformer_lm import LanguageModelState, LanguageModelSteps

        model, suppress_ids, max_length = self.language_model, self.suppress_ids, self.max_length
        padding_id = LanguageModelSteps(model).padding_id  # -1: token 0 is a token
        int8 = kv_cache_dtype == "int8"
        names = ("keys", "values", "valid", "positions", "index")
        names += ("key_scales", "value_scales") if int8 else ()

        def heads_last(x):  # (B, g, S, d) <-> (B, S, g, d): keras-hub's layout
            return tf.transpose(x, (0, 2, 1, 3))

        def outputs(logits, state, index):
            if int8:  # L of Int8Heads (B, g, S, d): int8 and scales, each (B, L, S, g, d|1)
                keys, values = ([c.key for c in state.caches], [c.value for c in state.caches])
                cache = {
                    "keys": tf.stack([heads_last(k.values) for k in keys], axis=1),
                    "values": tf.stack([heads_last(v.values) for v in values], axis=1),
                    "key_scales": tf.stack([heads_last(k.scale) for k in keys], axis=1),
                    "value_scales": tf.stack([heads_last(v.scale) for v in values], axis=1),
                }
            else:
                stacked = [c.to_stacked() for c in state.caches]  # L of (B, 2, S, g, d)
                cache = {
                    "keys": tf.stack([s[:, 0] for s in stacked], axis=1),  # (B, L, S, g, dk)
                    "values": tf.stack([s[:, 1] for s in stacked], axis=1),  # (B, L, S, g, dv)
                }
            return {
                "logits": rule_out(tf.cast(logits, tf.float32), suppress_ids, padding_id),
                **cache,
                "valid": state.caches[0].valid,  # (B, S): the same in every block
                "positions": state.positions,  # (B,)
                "index": index,
            }

        def caches_of(tensors, valid, blocks):
            """The `KVCache` of each of `blocks` blocks from the signature's tensors."""
            if int8:
                return [
                    KVCache(
                        *(
                            Int8Heads(
                                heads_last(tensors[name][:, i]),
                                heads_last(tensors[name[:-1] + "_scales"][:, i]),
                            )
                            for name in ("keys", "values")
                        ),
                        valid,
                    )
                    for i in range(blocks)
                ]
            keys, values = tensors["keys"], tensors["values"]
            return [  # (5-D tensors at most: TFLite's slices take no more)
                KVCache.from_stacked(tf.stack([keys[:, i], values[:, i]], axis=1), valid)
                for i in range(blocks)
            ]

        @tf.function(
            input_signature=[tf.TensorSpec((None, None), tf.int64, name="tokens")], autograph=False
        )
        def prefill(tokens):
            # Full caches (a sliding window's ring too: its positions are the signature's)
            steps = LanguageModelSteps(model, ring=False, kv_cache_dtype=kv_cache_dtype)
            tokens = tf.cast(tokens, tf.int32)
            state = steps.start(tokens, max_length)
            logits, state = steps.step(steps.start_tokens(tokens), 0, state)
            return outputs(logits, state, tf.constant(1, tf.int32))

        traced = prefill.get_concrete_function().structured_outputs

        def spec(name):
            return tf.TensorSpec(traced[name].shape, traced[name].dtype, name=name)

        @tf.function(
            input_signature=[
                tf.TensorSpec((None,), tf.int64, name="token"),
                *(spec(name) for name in names),
            ],
            autograph=False,
        )
        def decode_step(token, *tensors):
            tensors = dict(zip(names, tensors, strict=True))
            keys, valid, positions, index = (
                tensors[name] for name in ("keys", "valid", "positions", "index")
            )
            in_range = tf.logical_and(index >= 1, index < max_length)
            message = f"`index` must be in [1, {max_length}) (prefill's, then decode_step's)."
            with tf.control_dependencies([tf.debugging.Assert(in_range, [message, index])]):
                index = tf.identity(index)
            steps = LanguageModelSteps(model, ring=False, kv_cache_dtype=kv_cache_dtype)
            caches = caches_of(tensors, valid, len(steps.blocks))
            # The cache position of this token: the prefill's `P - 1`, then one a step
            written = tf.shape(keys)[2] - max_length + index
            state = LanguageModelState(caches, positions, tf.fill(tf.shape(positions), written))
            logits, state = steps.step(tf.cast(token, tf.int32), index, state)
            return outputs(logits, state, index + 1)

        archive.add_endpoint("prefill", prefill)
        archive.add_endpoint("decode_step", decode_step)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "language_model": keras.saving.serialize_keras_object(self.language_model),
                "lookup": keras.saving.serialize_keras_object(self.lookup),
                "max_length": self.max_length,
                "prompt_length": self.prompt_length,
                "start_token": self.start_token,
                "end_token": self.end_token,
                "suppress_tokens": list(self.suppress_tokens),
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("language_model", "lookup"):
            config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)
