"""The keras-attn model zoo, `keras_attn.models`: functional-API builders made from `keras_attn`
layers, their decoding, text preprocessing and export, the tfds builders, the training recipes
and the `keras-attn` command.

    from keras_attn import models

    model = models.transformer_classifier(vocab_size=20000, sequence_length=256, num_classes=2)

Its source is the repository's top-level `models/` folder, installed as `keras_attn.models`
(never as a top-level `models`, so a user's own `models` package is left alone). The layer
library, `keras_attn`, never imports it.

Each builder returns a plain `keras.Model` that trains with `model.fit`, saves
as `.keras` (reloads with `safe_mode=True` after `import keras_attn.models`, which registers
the zoo's glue layers) and exports as a SavedModel. `keras_attn.models.decoding` decodes the
seq2seq models (greedy, beam search, sampling, an export that decodes inside the SavedModel),
the language model and the pointer network; `keras_attn.models.generate` continues a language
model's prompts, compiled.

The decoding functions load on first use; `keras_attn.models.datasets` (the tfds builders)
and `keras_attn.models.recipes` (the CLI's training recipes) are imported explicitly.
"""

if __name__ != "keras_attn.models":  # e.g. `import models` from the repository root
    raise ImportError(
        "The model zoo is the package `keras_attn.models`: import it under that name "
        f"(`from keras_attn import models`). Received: import {__name__}"
    )

from . import decoding, generation, layers, text
from .checkpoints import from_transformers, to_transformers
from .distribution import check_layout, layout_map
from .generation import (
    GenerationConfig,
    beam_search,
    export_seq2seq,
    generate,
    greedy_decode,
    sample_decode,
)
from .han import hierarchical_attention_network
from .pointer_decoding import pointer_decode
from .pointer_network import pointer_network
from .rnn_seq2seq import rnn_seq2seq
from .runtimes import export_onnx, export_tflite
from .transformer_classifier import transformer_classifier
from .transformer_lm import transformer_lm
from .transformer_seq2seq import transformer_seq2seq

__all__ = [
    "GenerationConfig",
    "beam_search",
    "check_layout",
    "decoding",
    "export_onnx",
    "export_seq2seq",
    "export_tflite",
    "from_transformers",
    "generate",
    "generation",
    "greedy_decode",
    "hierarchical_attention_network",
    "layers",
    "layout_map",
    "pointer_decode",
    "pointer_network",
    "rnn_seq2seq",
    "sample_decode",
    "text",
    "to_transformers",
    "transformer_classifier",
    "transformer_lm",
    "transformer_seq2seq",
]
