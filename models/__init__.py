"""The keras-attn model zoo: functional-API builders made from `keras_attn` layers.

Each builder returns a plain `keras.Model` that trains with `model.fit`, saves
as `.keras` (reloads with `safe_mode=True`) and exports as a SavedModel.
"""

from models import decoding, layers
from models.decoding import pointer_decode
from models.han import hierarchical_attention_network
from models.pointer_network import pointer_network
from models.rnn_seq2seq import rnn_seq2seq

__all__ = [
    "decoding",
    "hierarchical_attention_network",
    "layers",
    "pointer_decode",
    "pointer_network",
    "rnn_seq2seq",
]
