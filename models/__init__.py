"""The keras-attn model zoo: functional-API builders made from `keras_attn` layers.

Each builder returns a plain `keras.Model` that trains with `model.fit`, saves
as `.keras` (reloads with `safe_mode=True`) and exports as a SavedModel.
`models.decoding` decodes the seq2seq models (greedy, beam search, sampling, an export
that decodes inside the SavedModel) and the pointer network.
"""

from models import decoding, layers
from models.decoding import (
    beam_search,
    export_seq2seq,
    greedy_decode,
    pointer_decode,
    sample_decode,
)
from models.han import hierarchical_attention_network
from models.pointer_network import pointer_network
from models.rnn_seq2seq import rnn_seq2seq
from models.transformer_classifier import transformer_classifier
from models.transformer_seq2seq import transformer_seq2seq

__all__ = [
    "beam_search",
    "decoding",
    "export_seq2seq",
    "greedy_decode",
    "hierarchical_attention_network",
    "layers",
    "pointer_decode",
    "pointer_network",
    "rnn_seq2seq",
    "sample_decode",
    "transformer_classifier",
    "transformer_seq2seq",
]
