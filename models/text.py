"""Text in, text out: a zoo model together with its preprocessing.

A trained text task is its token model plus the vocabularies that turn text into token ids
and back. `TextSeq2Seq`, `TextLanguageModel` and `TextClassifier` hold both: the token model
and Keras `StringLookup` / `TextVectorization` layers, whose vocabularies are saved with the
`.keras` file (as its assets). `export_text` writes a SavedModel whose `serving_default` takes
`text` (tf.string `(None,)`) and reads its vocabularies from the SavedModel's `assets/`:
callable with TensorFlow alone.

The text side is TensorFlow's string ops (whatever the Keras backend: the token model runs
on the backend, the strings on TensorFlow).

Bad text input, the same in Python and in the SavedModel:

- an empty (or all-blank) string gives an empty output (seq2seq), the model's answer
  on no words (classifiers), or a continuation of the start token alone (language model);
- a word the vocabulary does not hold becomes the OOV token `[UNK]` (id 1); a language
  model never generates `[UNK]` (`TextLanguageModel`'s `suppress_tokens`);
- an input longer than the model's length is truncated: its first `source_length`
  words (seq2seq), the first `sequence_length` words of a review, the first
  `max_sentences` sentences of `max_words` words (HAN), the last `prompt_length` words of
  a prompt (language model);
- an empty batch gives an empty result (a list of no strings; a SavedModel: tensors of no
  rows);
- anything but strings is refused with a `TypeError` naming `text` (and the first item
  that is no string).

`outside_training(text)` says which inputs are unlike the training data: outside the
lengths a model was trained on (a seq2seq model that stores them) or holding words its
vocabulary does not hold (`keras-attn predict` prints it on stderr).

Words are Unicode words, the same in Python, in the `.keras` file and in the SavedModel
(RE2 regular expressions in the graph): any Unicode space separates them, as Python's
`str.split()` (`SPACE`; RE2's class of spaces is ASCII only), and letters, digits and
combining marks beyond ASCII stay inside them (`split_punctuation`; RE2's class of word
characters is ASCII only).
"""

import os
import reprlib
import tempfile

import keras
import numpy as np

from keras_attn.models.files import write_atomically

_REGISTER = keras.saving.register_keras_serializable(package="keras_attn.models")

PADDING, OOV = "", "[UNK]"  # ids 0 and 1, as `TextVectorization` numbers them


def string_lookup(vocabulary, invert=False, name=None):
    """A `StringLookup` with `vocabulary` (its first two entries the padding and OOV tokens).

    The vocabulary is set, not passed to the constructor, so a `.keras` file keeps it as an
    asset (`vocabulary.txt`) rather than in its config.
    """
    vocabulary = list(vocabulary)
    if vocabulary[:2] != [PADDING, OOV]:
        raise ValueError(
            f"`vocabulary` must begin with the padding and OOV tokens {[PADDING, OOV]}. "
            f"Received: vocabulary[:2]={vocabulary[:2]!r}"
        )
    lookup = keras.layers.StringLookup(mask_token=PADDING, oov_token=OOV, invert=invert, name=name)
    lookup.set_vocabulary(vocabulary)
    return lookup


def _strings(text):
    """`text` as a tf.string `(B,)` tensor; a `TypeError` naming `text` for anything else.

    Lists, tuples and arrays are checked item by item (NumPy alone would read `[]` as floats
    and `["a", 3]` as the words "a" and "3"); an empty one is an empty batch.
    """
    import tensorflow as tf

    if isinstance(text, str | bytes):
        raise TypeError(
            "`text` must be a batch of strings (a list, an array or a tf.string tensor of "
            f"shape (B,)), not one string. Received: text={text!r}"
        )
    if tf.is_tensor(text):
        if text.dtype != tf.string:
            raise TypeError(f"`text` must be strings. Received: text with dtype={text.dtype.name}")
        shape = text.shape
    else:
        if isinstance(text, np.ndarray) and text.dtype.kind not in "OUS" and text.size:
            raise TypeError(f"`text` must be strings. Received: text with dtype={text.dtype}")
        items = np.asarray(text, dtype=object)  # each item as given
        shape = items.shape
        for i, item in enumerate(items if items.ndim == 1 else ()):
            if not isinstance(item, str | bytes):
                raise TypeError(
                    f"`text` must be strings. Received: text[{i}]={item!r} ({type(item).__name__})"
                )
    if len(shape) != 1:
        raise ValueError(
            f"`text` must have shape (B,): one string per example. Received: shape={shape}"
        )
    return text if tf.is_tensor(text) else tf.constant(items.tolist(), tf.string, shape=shape)


# What Python's `str.split()` splits at: Unicode's space separators (`\p{Z}`: the no-break,
# em, ideographic ... spaces, the line and paragraph separators) and the ASCII controls
# `\t\n\v\f\r`, `\x1c`-`\x1f`, `\x85`. RE2's `\s` holds the ASCII ones only.
SPACE = r"[\p{Z}\t\n\x{0B}\f\r\x{1C}-\x{1F}\x{85}]"


def normalize_spaces(text):
    """Strings `(B,)` with every Unicode space (`SPACE`) an ASCII space (TensorFlow)."""
    import tensorflow as tf

    return tf.strings.regex_replace(text, SPACE, " ")


def split_words(text):
    """Strings `(B,)` -> their words `(B, None)`, ragged (TensorFlow): split at any Unicode
    space, as Python's `str.split()`; `tf.strings.split` alone splits at ASCII ones."""
    import tensorflow as tf

    return tf.strings.split(normalize_spaces(text))


def _at_least_one_column(ids):
    """Ids `(B, T)` padded to `T >= 1` with 0 (a batch of blank or no strings gives `T = 0`)."""
    import tensorflow as tf

    return tf.pad(ids, [[0, 0], [0, 1 - tf.minimum(tf.shape(ids)[1], 1)]])


def _unfamiliar(ids, words=None, lengths=None, what="inputs"):
    """The sentences of `outside_training`: how many of the `B` inputs have words outside
    the vocabulary (`ids` `(B, ...)` holding the OOV id 1), and, with `lengths` (the
    shortest and longest training input, in words), how many non-blank inputs have fewer
    or more `words` `(B,)` than those."""
    ids = np.asarray(ids)
    counts = []  # (inputs, their verb for one input, for several, the rest of the sentence)
    if lengths is not None:
        low, high = lengths
        words = np.asarray(words)
        span = f"than the {what} it was trained on ({low}-{high} words)"
        counts.append((((words > 0) & (words < low)).sum(), "is shorter", "are shorter", span))
        counts.append(((words > high).sum(), "is longer", "are longer", span))
    unknown = (ids == 1).any(axis=tuple(range(1, ids.ndim)))  # (B,)
    vocabulary = "words outside its vocabulary (each read as [UNK])"
    counts.append((unknown.sum(), "has", "have", vocabulary))
    total = f"{len(ids)} input{'s' if len(ids) > 1 else ''}"
    return [
        f"{count} of {total} {one if count == 1 else several} {rest}"
        for count, one, several, rest in counts
        if count
    ]


def _holds_text(x):
    """Whether `x` (what Keras' `predict` was given) is strings rather than token ids."""
    import tensorflow as tf

    if tf.is_tensor(x):
        return x.dtype == tf.string
    if isinstance(x, np.ndarray):
        return x.dtype.kind in "US" or (
            x.dtype.kind == "O" and any(isinstance(t, str | bytes) for t in x.flat)
        )
    return isinstance(x, str | bytes) or (
        isinstance(x, list | tuple) and any(isinstance(t, str | bytes) for t in x)
    )


class _TextModel(keras.Model):
    """What the text models share: Keras' `predict` takes token ids, `predict_text` text."""

    def predict(self, x, *args, **kwargs):
        """Keras' `predict` on the token model's inputs (ids); text goes to `predict_text`."""
        if _holds_text(x):
            raise TypeError(
                "Keras' `predict` takes token ids (the token model's inputs) and returns its "
                f"logits; for text in, text out call the {type(self).__name__}'s "
                f"`predict_text(texts)`. Received: x={reprlib.repr(x)}"
            )
        return super().predict(x, *args, **kwargs)


def _vocabulary_file(directory, name, vocabulary):
    """Writes the tokens after padding and OOV, one a line (the `StringLookup` file form)."""
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(f"{token}\n" for token in vocabulary[2:]))
    return path


def _asset_lookup(path, invert=False):
    """A built `StringLookup` whose table reads the vocabulary file `path` (`_vocabulary_file`).

    Tracked by an `ExportArchive`, the file becomes one of the SavedModel's `assets/`.
    """
    lookup = keras.layers.StringLookup(
        vocabulary=path, mask_token=PADDING, oov_token=OOV, invert=invert
    )
    lookup.build(None)
    return lookup


def _check_export_backend(alternative=""):
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            f"`export_text` writes its string signature from the tensorflow backend{alternative}. "
            f"Received: backend={keras.backend.backend()!r}"
        )


def _join_words(tokens, vocabulary, end_token):
    """Tokens `(B, T)` -> their words before `end_token`, padding left out, joined with spaces.

    `vocabulary`: the `(V,)` words of the ids (TensorFlow).
    """
    import tensorflow as tf

    tokens = tf.cast(tokens, tf.int64)
    end = tf.cast(tf.reshape(tf.where(tf.equal(vocabulary, end_token)), [-1])[0], tf.int64)
    ended = tf.cumsum(tf.cast(tf.equal(tokens, end), tf.int32), axis=1) > 0
    keep = tf.logical_and(tf.not_equal(tokens, 0), tf.logical_not(ended))
    words = tf.ragged.boolean_mask(tf.gather(vocabulary, tokens), keep)
    return tf.strings.reduce_join(words, axis=1, separator=" ")


def _positive(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_tokens(lookup, **tokens):
    vocabulary = lookup.get_vocabulary()
    for name, token in tokens.items():
        # (A lookup deserialized from a `.keras` file gets its vocabulary after this.)
        if len(vocabulary) > 2 and token not in vocabulary:
            raise ValueError(f"`{name}` must be a token of the vocabulary. Received: {token!r}")


# ---------------------------------------------------------------------------
# Seq2seq
# ---------------------------------------------------------------------------


@_REGISTER
class TextSeq2Seq(_TextModel):
    """A seq2seq model with its vocabularies: text in, decoded text out (greedy).

    Source text is split at spaces (`split_words`), each word looked up in the source
    vocabulary (unknown words: `[UNK]`) and cut to `source_length` words; the model decodes
    at most `max_length` tokens greedily (`greedy_decode`, KV-cached); the target words up
    to the end token are joined with spaces.

    Args:
        seq2seq: the token model (`transformer_seq2seq`, `rnn_seq2seq`, or one with
            registered decoding steps).
        source_lookup, target_lookup: `StringLookup` layers (`string_lookup`): word -> id.
        source_length: the longest source kept, in words (longer ones are truncated).
        max_length: the most target tokens decoded (the end token included).
        start_token, end_token: the target vocabulary's start and end tokens.
        trained_lengths: None, or `(shortest, longest)`: the source lengths in words the
            model was trained on, which `outside_training` compares inputs with.

    Call arguments:
        inputs: the token model's inputs; returns its logits (`model.fit` trains it).

    Example:

    >>> text_model = TextSeq2Seq(seq2seq, string_lookup(source_words),
    ...                          string_lookup(target_words), 20, 21)  # doctest: +SKIP
    >>> text_model.predict_text(["n a f h g"])  # doctest: +SKIP
    ['g h f a n']
    """

    def __init__(
        self,
        seq2seq: keras.Model,
        source_lookup: keras.layers.Layer,
        target_lookup: keras.layers.Layer,
        source_length: int,
        max_length: int,
        start_token: str = "<s>",
        end_token: str = "</s>",
        trained_lengths: tuple | list | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (("source_length", source_length), ("max_length", max_length)):
            if not _positive(value):
                raise ValueError(f"`{name}` must be a positive integer. Received: {value!r}")
        if trained_lengths is not None:
            if (
                not isinstance(trained_lengths, tuple | list)
                or len(trained_lengths) != 2
                or not all(map(_positive, trained_lengths))
                or trained_lengths[0] > trained_lengths[1]
            ):
                raise ValueError(
                    "`trained_lengths` must be None or `(shortest, longest)`, positive integers. "
                    f"Received: trained_lengths={trained_lengths!r}"
                )
            trained_lengths = tuple(trained_lengths)
        self.trained_lengths = trained_lengths
        self.seq2seq = seq2seq
        self.source_lookup = source_lookup
        self.target_lookup = target_lookup
        self.source_length = source_length
        self.max_length = max_length
        self.start_token = start_token
        self.end_token = end_token
        _check_tokens(target_lookup, start_token=start_token, end_token=end_token)
        self.built = True

    @property
    def input(self):
        """The token model's inputs (what `call` takes)."""
        return self.seq2seq.input

    def call(self, inputs, training=None):
        return self.seq2seq(inputs, training=training)

    def source_ids(self, text, lookup=None):
        """`text` `(B,)` -> source ids `(B, S)` int32, `1 <= S <= source_length` (TensorFlow)."""
        import tensorflow as tf

        words = split_words(_strings(text))[:, : self.source_length]  # (B, None) ragged
        ids = tf.cast((lookup or self.source_lookup)(words), tf.int32).to_tensor(0)
        return _at_least_one_column(ids)  # S >= 1

    def outside_training(self, text) -> list:
        """What sets inputs of `text` apart from the training sources, in sentences (none:
        nothing): how many have fewer or more words than `trained_lengths` (if known; blank
        inputs aside) or words outside the source vocabulary."""
        text = _strings(text)
        words = split_words(text).row_lengths().numpy()
        return _unfamiliar(self.source_ids(text), words, self.trained_lengths, "sources")

    def _ids_to_text(self, tokens, source_ids, vocabulary):
        """Tokens `(B, T)` -> the words before the end token, joined with spaces (TensorFlow)."""
        import tensorflow as tf

        text = _join_words(tokens, vocabulary, self.end_token)
        empty = tf.reduce_all(tf.equal(source_ids, 0), axis=1)  # "" in, "" out
        return tf.where(empty, tf.constant(""), text)

    def _ids(self):
        vocabulary = self.target_lookup.get_vocabulary()
        return vocabulary.index(self.start_token), vocabulary.index(self.end_token)

    def predict_text(self, text) -> list:
        """Decodes a batch of strings: one output string per input string.

        Args:
            text: strings `(B,)`: a list, a NumPy array or a tf.string tensor.

        Returns:
            A list of `B` Python strings.
        """
        import tensorflow as tf

        from keras_attn.models.decoding import greedy_decode

        source = self.source_ids(text)
        start_id, end_id = self._ids()
        tokens = greedy_decode(self.seq2seq, np.asarray(source), self.max_length, start_id, end_id)
        vocabulary = tf.constant(self.target_lookup.get_vocabulary())
        out = self._ids_to_text(np.asarray(tokens), source, vocabulary)
        return [t.decode("utf-8") for t in out.numpy()]

    def export_text(self, path: str) -> None:
        """A SavedModel of text in, text out, its vocabularies in `assets/`.

        Signatures: `serving_default`: `text` tf.string `(None,)` -> `{"text": (None,)}`;
        `greedy_decode`: source ids `encoder_inputs` `(B, S)` int64 -> tokens
        `(B, max_length)` int32 (TFLite: builtin ops for a Transformer); `serve`: the
        teacher-forced logits (as `export_seq2seq`).

        Args:
            path: the SavedModel directory, written atomically.
        """
        import tensorflow as tf

        from keras_attn.models.seq2seq_export import seq2seq_archive

        _check_export_backend(" (`export_seq2seq` exports the token model from jax)")
        start_id, end_id = self._ids()
        archive, decoder = seq2seq_archive(self.seq2seq, self.max_length, start_id, end_id)
        with tempfile.TemporaryDirectory() as scratch:
            source_vocabulary = self.source_lookup.get_vocabulary()
            target_vocabulary = self.target_lookup.get_vocabulary()
            source_file = _vocabulary_file(scratch, "source_vocabulary.txt", source_vocabulary)
            target_file = _vocabulary_file(scratch, "target_vocabulary.txt", target_vocabulary)
            # Tables read from files: the SavedModel copies the files into its assets/.
            source_lookup = _asset_lookup(source_file)
            target_words = _asset_lookup(target_file, invert=True)
            for layer in (source_lookup, target_words):
                archive.track(layer)
            all_ids = tf.range(len(target_vocabulary), dtype=tf.int64)

            @tf.function(input_signature=[tf.TensorSpec((None,), tf.string, name="text")])
            def serving_default(text):
                source = self.source_ids(text, source_lookup)
                tokens = decoder(tf.cast(source, tf.int64))
                vocabulary = target_words(all_ids)  # (V,) the words, from the asset
                return {"text": self._ids_to_text(tokens, source, vocabulary)}

            archive.add_endpoint("serving_default", serving_default)
            write_atomically(path, lambda temporary: archive.write_out(temporary, verbose=False))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "seq2seq": keras.saving.serialize_keras_object(self.seq2seq),
                "source_lookup": keras.saving.serialize_keras_object(self.source_lookup),
                "target_lookup": keras.saving.serialize_keras_object(self.target_lookup),
                "source_length": self.source_length,
                "max_length": self.max_length,
                "start_token": self.start_token,
                "end_token": self.end_token,
                "trained_lengths": self.trained_lengths and list(self.trained_lengths),
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("seq2seq", "source_lookup", "target_lookup"):
            config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)


# ---------------------------------------------------------------------------
# Language model
# ---------------------------------------------------------------------------

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
        from keras_attn.models.transformer_lm import LanguageModelSteps

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
        pieces = split_words(split_punctuation(text))  # (B, None) ragged
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

    def _end_id(self):
        return self.lookup.get_vocabulary().index(self.end_token)

    def _suppress_ids(self):
        vocabulary = self.lookup.get_vocabulary()
        return tuple(vocabulary.index(token) for token in self.suppress_tokens)

    def continue_ids(self, text, **generation) -> np.ndarray:
        """The new tokens after each prompt: int32 `(B, max_length)`, 0 after the end token.

        Args:
            text: prompts `(B,)`.
            **generation: `sampler` (`"greedy"`, `"sample"`, `"beam"`), `temperature`,
                `top_k`, `top_p`, `seed`, `jit_compile` (here False unless given),
                `suppress_ids` (here the ids of `suppress_tokens` unless given) ... of
                `keras_attn.models.generate`.
        """
        from keras_attn.models.lm_generation import generate

        prompts = np.asarray(self.prompt_ids(text))
        if not len(prompts):  # no prompts, no continuations
            return np.zeros((0, self.max_length), "int32")
        # Eager by default: compiling the loop (XLA) takes longer than a few prompts' decoding.
        generation.setdefault("jit_compile", False)
        generation.setdefault("suppress_ids", self._suppress_ids())
        return generate(self.language_model, prompts, self.max_length, self._end_id(), **generation)

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

    def outside_training(self, text) -> list:
        """What sets prompts of `text` apart from the training texts, in sentences (none:
        nothing): how many have words outside the vocabulary (of the words kept)."""
        return _unfamiliar(self.prompt_ids(text))

    def export_text(self, path: str) -> None:
        """A SavedModel of a prompt in, its greedy continuation out (no `suppress_tokens`), the
        vocabulary in `assets/`.

        Signatures: `serving_default`: `text` tf.string `(None,)` -> `{"text": (None,)}`;
        `greedy_decode`: prompt ids `prompts` `(B, P)` int64 (0 = padding, either side) ->
        the new tokens `(B, max_length)` int32; `serve`: the token model (ids -> logits).

        Args:
            path: the SavedModel directory, written atomically.
        """
        import tensorflow as tf

        from keras_attn.models.decoding import greedy_decode

        _check_export_backend()
        model, end_id, suppress_ids = self.language_model, self._end_id(), self._suppress_ids()
        archive = keras.export.ExportArchive()
        archive.track(model)

        # No AutoGraph: the loop is `keras.ops.fori_loop` already (and the closures confuse it).
        @tf.function(
            input_signature=[tf.TensorSpec((None, None), tf.int64, name="prompts")], autograph=False
        )
        def decoder(prompts):
            prompts = tf.cast(prompts, tf.int32)
            return greedy_decode(
                model, prompts, self.max_length, None, end_id, suppress_ids=suppress_ids
            )

        archive.add_endpoint("greedy_decode", decoder)
        archive.add_endpoint(
            "serve",
            lambda tokens: model(tf.cast(tokens, tf.int32), training=False),
            input_signature=[tf.TensorSpec((None, None), tf.int64, name="tokens")],
        )
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
            write_atomically(path, lambda temporary: archive.write_out(temporary, verbose=False))

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


# ---------------------------------------------------------------------------
# Classifiers
# ---------------------------------------------------------------------------


@_REGISTER
class TextClassifier(_TextModel):
    """A text classifier with its vectorizer: text in, a class name and probabilities out.

    A review is cleaned (`markup` and every Unicode space replaced by a space:
    `normalize_spaces`), then vectorized by `vectorizer` (a
    `TextVectorization` with `output_sequence_length`: its first words, padded). With
    `max_sentences` (a hierarchical model, documents `(B, S, W)`), the text is first split
    into sentences after `.`, `!` or `?` and the first `max_sentences` kept, each vectorized.

    Args:
        classifier: the token model: ids `(B, T)` (or `(B, S, W)`) -> logits `(B, C)`.
        vectorizer: an adapted `keras.layers.TextVectorization` with an
            `output_sequence_length`.
        class_names: the `C` class names, in the order of the logits.
        max_sentences: None, or the sentences per document of a hierarchical model.
        markup: a regular expression replaced by a space before vectorizing (None: none).

    Call arguments:
        inputs: the token model's inputs; returns its logits.

    Example:

    >>> text_model = TextClassifier(model, vectorizer, ["neg", "pos"])  # doctest: +SKIP
    >>> labels, probabilities = text_model.classify(["A fine film."])  # doctest: +SKIP
    """

    def __init__(
        self,
        classifier: keras.Model,
        vectorizer: keras.layers.Layer,
        class_names: list,
        max_sentences: int | None = None,
        markup: str | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not class_names or not all(isinstance(c, str) for c in class_names):
            raise ValueError(f"`class_names` must be strings. Received: {class_names!r}")
        if max_sentences is not None and (not isinstance(max_sentences, int) or max_sentences < 1):
            raise ValueError(
                f"`max_sentences` must be None or a positive integer. Received: {max_sentences!r}"
            )
        self.classifier = classifier
        self.vectorizer = vectorizer
        self.class_names = list(class_names)
        self.max_sentences = max_sentences
        self.markup = markup
        self.built = True

    @property
    def input(self):
        """The token model's inputs (what `call` takes)."""
        return self.classifier.input

    def call(self, inputs, training=None):
        return self.classifier(inputs, training=training)

    def token_ids(self, text, vectorizer=None):
        """`text` `(B,)` -> the classifier's ids `(B, T)` or `(B, S, W)` (TensorFlow)."""
        import tensorflow as tf

        vectorizer = vectorizer or self.vectorizer
        text = _strings(text)
        if self.markup:
            text = tf.strings.regex_replace(text, self.markup, " ")
        text = normalize_spaces(text)
        if self.max_sentences is None:
            return vectorizer(text)
        marked = tf.strings.regex_replace(text, r"([.!?])\s+", "\\1\n")
        sentences = tf.strings.split(marked, "\n")[:, : self.max_sentences]  # (B, None) ragged
        ids = sentences.with_flat_values(vectorizer(sentences.flat_values))  # (B, None, W)
        words = vectorizer.get_config()["output_sequence_length"]
        return ids.to_tensor(0, shape=[None, self.max_sentences, words])

    def _outputs(self, logits):
        import tensorflow as tf

        probabilities = tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
        label = tf.gather(tf.constant(self.class_names), tf.argmax(probabilities, axis=-1))
        return {"label": label, "probabilities": probabilities}

    def classify(self, text):
        """`(labels, probabilities)`: a list of `B` class names and a `(B, C)` float32 array."""
        logits = self.classifier(np.asarray(self.token_ids(text)), training=False)
        outputs = self._outputs(np.asarray(keras.ops.convert_to_numpy(logits)))
        labels = [t.decode("utf-8") for t in outputs["label"].numpy()]
        return labels, outputs["probabilities"].numpy()

    def predict_text(self, text) -> list:
        """The class name of each string of `text` (see `classify`)."""
        return self.classify(text)[0]

    def outside_training(self, text) -> list:
        """What sets reviews of `text` apart from the training texts, in sentences (none:
        nothing): how many have words outside the vocabulary (of the words read)."""
        return _unfamiliar(self.token_ids(text))

    def export_text(self, path: str) -> None:
        """A SavedModel: `serving_default` `text` tf.string `(None,)` -> `label` tf.string
        `(None,)` and `probabilities` float32 `(None, C)`; `serve`: the token model (ids ->
        logits). The vocabulary is in `assets/`.

        Args:
            path: the SavedModel directory, written atomically.
        """
        import tensorflow as tf

        _check_export_backend()
        archive = keras.export.ExportArchive()
        archive.track(self.classifier)
        ids_shape = (None,) + tuple(self.classifier.input.shape[1:])
        archive.add_endpoint(
            "serve",
            lambda ids: self.classifier(ids, training=False),
            input_signature=[tf.TensorSpec(ids_shape, tf.int64, name="inputs")],
        )
        with tempfile.TemporaryDirectory() as scratch:
            config = self.vectorizer.get_config()
            vocabulary = self.vectorizer.get_vocabulary()
            config["vocabulary"] = _vocabulary_file(scratch, "vocabulary.txt", vocabulary)
            config.pop("vocabulary_size", None)
            vectorizer = keras.layers.TextVectorization.from_config(config)
            vectorizer.build(None)
            archive.track(vectorizer)

            @tf.function(input_signature=[tf.TensorSpec((None,), tf.string, name="text")])
            def serving_default(text):
                logits = self.classifier(self.token_ids(text, vectorizer), training=False)
                return self._outputs(logits)

            archive.add_endpoint("serving_default", serving_default)
            write_atomically(path, lambda temporary: archive.write_out(temporary, verbose=False))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "classifier": keras.saving.serialize_keras_object(self.classifier),
                "vectorizer": keras.saving.serialize_keras_object(self.vectorizer),
                "class_names": self.class_names,
                "max_sentences": self.max_sentences,
                "markup": self.markup,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("classifier", "vectorizer"):
            config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)


# ---------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------

RUNS = "keras_attn_runs"


def load_run(task: str, runs_dir: str = RUNS) -> keras.Model:
    """The text model of `task`'s last run in `runs_dir` (what `keras-attn train` wrote).

    Args:
        task: a text task of `keras-attn list` (seq2seq, language model or classifier).
        runs_dir: the run directory (`keras-attn train --output`).

    Returns:
        A `TextSeq2Seq`, `TextLanguageModel` or `TextClassifier`: `predict_text(["..."])`
        gives one string per input; `export_text(path)` the SavedModel.

    Example:

    >>> from keras_attn.models import text
    >>> model = text.load_run("transformer-reverse")  # doctest: +SKIP
    >>> model.predict_text(["n a f h g"])  # doctest: +SKIP
    ['g h f a n']
    """
    path = os.path.join(runs_dir, f"{task}.keras")
    if not os.path.exists(path):
        tasks = _tasks()
        if tasks is not None and not tasks.get(task):  # no text task: no use training it
            what = "no text task" if task in tasks else "no task of keras-attn"
            raise FileNotFoundError(
                f"No run of {task!r} in {runs_dir!r} (no {path}), and {task!r} is {what}: "
                f"`predict` takes the text tasks {', '.join(t for t in tasks if tasks[t])} "
                "(`keras-attn list`), or a run of your own saved as RUNS_DIR/NAME.keras."
            )
        raise FileNotFoundError(
            f"No run of {task!r} in {runs_dir!r} (no {path}): train it first with "
            f"`keras-attn train {task} --output {runs_dir}`."
        )
    model = keras.saving.load_model(path, safe_mode=True)
    if not isinstance(model, TextSeq2Seq | TextLanguageModel | TextClassifier):
        raise ValueError(
            f"The run of {task!r} holds no text model (a {type(model).__name__}): `predict` "
            f"takes the text tasks (seq2seq, language model, classifiers). Received: task={task!r}"
        )
    return model


def _tasks():
    """`{task: whether it is a text task}` of `keras-attn train`; None where the recipes
    cannot be imported (they need tensorflow-datasets, which loading a run does not)."""
    try:
        from keras_attn.models import recipes
    except ImportError:
        return None
    return {name: run.text for name, (_, run) in recipes.TASKS.items()}
