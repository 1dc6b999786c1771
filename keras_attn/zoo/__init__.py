"""The keras-attn model zoo: functional-API builders made from `keras_attn` layers.

    from keras_attn import zoo

    model = zoo.transformer_classifier(vocab_size=20000, num_classes=2)

Each builder returns a plain `keras.Model` that trains with `model.fit`, saves
as `.keras` (reloads with `safe_mode=True` after `import keras_attn`) and exports as a
SavedModel. `keras_attn.zoo.decoding` decodes the seq2seq models (greedy, beam search,
sampling, an export that decodes inside the SavedModel), the language model and the
pointer network; `keras_attn.zoo.generate` continues a language model's prompts, compiled.

The decoding functions load on first use; `keras_attn.zoo.datasets` (the tfds builders)
and `keras_attn.zoo.recipes` (the CLI's training recipes) are imported explicitly.
"""

import importlib

from keras_attn.zoo import layers
from keras_attn.zoo.han import hierarchical_attention_network
from keras_attn.zoo.pointer_network import pointer_network
from keras_attn.zoo.rnn_seq2seq import rnn_seq2seq
from keras_attn.zoo.transformer_classifier import transformer_classifier
from keras_attn.zoo.transformer_lm import transformer_lm
from keras_attn.zoo.transformer_seq2seq import transformer_seq2seq

# Decoding loads on first use (`export_seq2seq` imports TensorFlow only when it runs).
_DECODING = ("beam_search", "export_seq2seq", "greedy_decode", "pointer_decode", "sample_decode")

__all__ = [
    "beam_search",
    "decoding",
    "export_seq2seq",
    "generate",
    "greedy_decode",
    "hierarchical_attention_network",
    "layers",
    "pointer_decode",
    "pointer_network",
    "rnn_seq2seq",
    "sample_decode",
    "transformer_classifier",
    "transformer_lm",
    "transformer_seq2seq",
]


def __getattr__(name):
    if name == "generate":  # a language model's continuation (`transformer_lm`)
        return importlib.import_module("keras_attn.zoo.lm_generation").generate
    if name == "decoding" or name in _DECODING:
        decoding = importlib.import_module("keras_attn.zoo.decoding")
        return decoding if name == "decoding" else getattr(decoding, name)
    raise AttributeError(f"module 'keras_attn.zoo' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
