"""`TextSeq2Seq`: a seq2seq model with its vocabularies, text in, decoded text out."""

import tempfile

import keras
import numpy as np

from ..files import write_atomically
from .base import (
    _REGISTER,
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
    split_words,
)


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

        from ..generation import greedy_decode

        source = self.source_ids(text)
        start_id, end_id = self._ids()
        tokens = greedy_decode(self.seq2seq, np.asarray(source), self.max_length, start_id, end_id)
        vocabulary = tf.constant(self.target_lookup.get_vocabulary())
        out = self._ids_to_text(np.asarray(tokens), source, vocabulary)
        return [t.decode("utf-8") for t in out.numpy()]

    def export_text(self, path: str, beam_width: int = 4) -> None:
        """A SavedModel of text in, text out, its vocabularies in `assets/`.

        Signatures:

        - `serving_default`: `text` tf.string `(None,)` -> `{"text": (None,)}`, greedy;
        - `generate`: `text` `(B,)` and scalars `max_length` int32 (at most the model's
          `max_length`), `temperature` float32 (0 = greedy), `top_k` int32 (0 = off),
          `top_p` float32 (1 = off), `seed` int32, `repetition_penalty` float32 (1 = off),
          `stop_sequences` tf.string `(N,)` (stop strings, `N = 0`: none; each split at
          spaces into target words, the decoding ends after them), `min_new_tokens` int32
          (0 = off) -> `{"text": (B,), "tokens": (B, max_length) int32, "scores": (B, max_length)
          float32}` (each token's log-probability under the model, 0 after the end): for
          the same settings and seed, the tokens of Python's `sample_decode` on TensorFlow
          (`greedy_decode` for temperature 0). A bad setting fails a `tf.debugging` assert
          naming it;
        - `beam_search`: `text` `(B,)` -> `{"text": (B,), "score": (B,) float32}`: beam
          search of width `beam_width` (length penalty 0.6, at most `max_length` tokens),
          the tokens of Python's `beam_search`, and the best hypothesis' normalized score;
        - `greedy_decode`: source ids `encoder_inputs` `(B, S)` int64 -> tokens
          `(B, max_length)` int32 (TFLite: builtin ops for a Transformer); `serve`: the
          teacher-forced logits (as `export_seq2seq`).

        Args:
            path: the SavedModel directory, written atomically.
            beam_width: the `beam_search` signature's hypotheses per example.

        Raises:
            ValueError: a `beam_width` that is not a positive integer, or a backend other
                than TensorFlow.
        """
        import tensorflow as tf

        from ..generation import GenerationConfig, beam_search_loop, decoding_steps
        from ..generation.export import generation_specs, sampled_generation, seq2seq_archive

        _check_export_backend(" (`export_seq2seq` exports the token model from jax)")
        if not _positive(beam_width):
            raise ValueError(
                f"`beam_width` must be a positive integer. Received: beam_width={beam_width!r}"
            )
        start_id, end_id = self._ids()
        archive, decoder = seq2seq_archive(self.seq2seq, self.max_length, start_id, end_id)
        with tempfile.TemporaryDirectory() as scratch:
            source_vocabulary = self.source_lookup.get_vocabulary()
            target_vocabulary = self.target_lookup.get_vocabulary()
            source_file = _vocabulary_file(scratch, "source_vocabulary.txt", source_vocabulary)
            target_file = _vocabulary_file(scratch, "target_vocabulary.txt", target_vocabulary)
            # Tables read from files: the SavedModel copies the files into its assets/.
            source_lookup = _asset_lookup(source_file)
            target_lookup = _asset_lookup(target_file)  # the stop strings' words
            target_words = _asset_lookup(target_file, invert=True)
            for layer in (source_lookup, target_lookup, target_words):
                archive.track(layer)
            all_ids = tf.range(len(target_vocabulary), dtype=tf.int64)

            @tf.function(input_signature=[tf.TensorSpec((None,), tf.string, name="text")])
            def serving_default(text):
                source = self.source_ids(text, source_lookup)
                tokens = decoder(tf.cast(source, tf.int64))
                vocabulary = target_words(all_ids)  # (V,) the words, from the asset
                return {"text": self._ids_to_text(tokens, source, vocabulary)}

            archive.add_endpoint("serving_default", serving_default)

            config = GenerationConfig(start_id=start_id, end_id=end_id)

            # The settings' inputs and checks: `GenerationConfig.exported()` and its `RULES`
            @tf.function(input_signature=generation_specs(), autograph=False)
            def generate(text, *settings):
                source = self.source_ids(text, source_lookup)
                settings = dict(zip(GenerationConfig.exported(), settings, strict=True))
                settings["stop_sequences"] = checked_stop_ids(
                    settings["stop_sequences"], split_words, target_lookup
                )
                decoded = sampled_generation(
                    decoding_steps(self.seq2seq), source, config, self.max_length, **settings
                )
                text = self._ids_to_text(decoded.tokens, source, target_words(all_ids))
                return {"text": text, "tokens": decoded.tokens, "scores": decoded.scores}

            @tf.function(
                input_signature=[tf.TensorSpec((None,), tf.string, name="text")], autograph=False
            )
            def beam_search(text):
                source = self.source_ids(text, source_lookup)
                beams = beam_search_loop(
                    self.seq2seq, source, self.max_length,
                    config=config.replace(sampler="beam", beam_width=beam_width),
                )  # fmt: skip
                text = self._ids_to_text(beams.tokens, source, target_words(all_ids))
                return {"text": text, "score": beams.sequence_scores}

            archive.add_endpoint("generate", generate)
            archive.add_endpoint("beam_search", beam_search)
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
