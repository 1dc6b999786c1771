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

The package, by concept: `base` (the text side and vocabulary files the three share, and
their base class), `seq2seq` (`TextSeq2Seq`), `language_model` (`TextLanguageModel`),
`classifier` (`TextClassifier`) and `runs` (`load_run`); every public name is importable
from `keras_attn.models.text`.
"""

from .base import (
    OOV,
    PADDING,
    SPACE,
    normalize_spaces,
    split_words,
    string_lookup,
)
from .classifier import TextClassifier
from .language_model import (
    PUNCTUATION,
    TextLanguageModel,
    split_punctuation,
)
from .runs import RUNS, load_run
from .seq2seq import TextSeq2Seq

__all__ = [
    "OOV",
    "PADDING",
    "PUNCTUATION",
    "RUNS",
    "SPACE",
    "TextClassifier",
    "TextLanguageModel",
    "TextSeq2Seq",
    "load_run",
    "normalize_spaces",
    "split_punctuation",
    "split_words",
    "string_lookup",
]
