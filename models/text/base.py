"""What the text models share: the text side (TensorFlow string ops), vocabularies as files,
and `_TextModel`, the base class of `TextSeq2Seq`, `TextLanguageModel` and `TextClassifier`.

Words are split at any Unicode space (`SPACE`, `split_words`); `string_lookup` makes the word
<-> id tables (`PADDING` id 0, `OOV` id 1); an export reads its vocabularies from files
(`_vocabulary_file`, `_asset_lookup`) that become the SavedModel's `assets/`.
"""

import os
import reprlib

import keras
import numpy as np

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


def _stop_ids(stop, split, lookup):
    """Stop strings `(N,)` -> `(ids, spelled)` (TensorFlow): each string's words (`split`:
    strings `(N,)` -> words `(N, None)`, ragged) looked up, int32 `(N, L)` padded at the end
    with -1 (`L >= 1`), and bool `(N,)`: which strings the vocabulary spells (at least one
    word, none out of the vocabulary)."""
    import tensorflow as tf

    words = split(stop)
    ids = tf.cast(lookup(words), tf.int32)  # (N, None) ragged, OOV 1
    known = tf.reduce_all(tf.greater(ids.to_tensor(2), 1), axis=1)  # (N,)
    spelled = tf.logical_and(known, ids.row_lengths() > 0)
    ids = ids.to_tensor(-1)
    ids = tf.pad(ids, [[0, 0], [0, 1 - tf.minimum(tf.shape(ids)[1], 1)]], constant_values=-1)
    return ids, spelled


def stop_sequences_of(stop, split, lookup) -> tuple:
    """Python's stop strings (a list or tuple of str; None: none) -> `stop_sequences`, the
    token ids of each (`_stop_ids`), or `ValueError` naming a string the vocabulary cannot
    spell (a word outside it, or no word)."""
    import tensorflow as tf

    if stop is None:
        return ()
    if (
        isinstance(stop, str)
        or not isinstance(stop, list | tuple)
        or not all(isinstance(s, str) for s in stop)
    ):
        raise ValueError(f"`stop` must be a list of strings. Received: stop={stop!r}")
    if not stop:
        return ()
    ids, spelled = _stop_ids(tf.constant(stop, tf.string), split, lookup)
    for text, ok in zip(stop, spelled.numpy().tolist(), strict=True):
        if not ok:
            raise ValueError(
                f"`stop` strings must be spelled with the model's vocabulary (its words, "
                f"none unknown). Received: stop string {text!r}"
            )
    return tuple(tuple(i for i in row if i >= 0) for row in ids.numpy().tolist())


def checked_stop_ids(stop, split, lookup):
    """An exported `generate`'s `stop_sequences` strings `(N,)` -> ids int32 `(N, L)` padded
    with -1 (`_stop_ids`), gated on a `tf.debugging.Assert` naming an unspelled string."""
    import tensorflow as tf

    ids, spelled = _stop_ids(stop, split, lookup)
    message = (
        "`stop_sequences` must be strings the model's vocabulary spells (its words, none "
        "unknown). Received: stop_sequences="
    )
    check = tf.debugging.Assert(tf.reduce_all(spelled), [message, stop], summarize=16)
    with tf.control_dependencies([check]):
        return tf.identity(ids)
