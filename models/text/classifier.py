"""`TextClassifier`: a text classifier with its vectorizer, text in, a class name out."""

import tempfile

import keras
import numpy as np

from ..files import write_atomically
from .base import (
    _REGISTER,
    _check_export_backend,
    _strings,
    _TextModel,
    _unfamiliar,
    _vocabulary_file,
    normalize_spaces,
)


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
