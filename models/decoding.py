"""`keras_attn.models.decoding`: the decoders by the name they have always had.

Generation lives in `keras_attn.models.generation` (a `GenerationConfig`, one loop, the
samplers, logits processors, beam search, the export); the pointer networks' decoding in
`keras_attn.models.pointer_decoding`. This module hands their public names on, so
`models.decoding.sample_decode(...)` and `from keras_attn.models.decoding import
register_decoding_steps` keep working.
"""

from .generation import (
    Beams,
    Decoded,
    DecodingLoop,
    GenerationConfig,
    beam_search,
    beam_search_loop,
    decoder_vocab_size,
    decoding_steps,
    export_seq2seq,
    first_tokens,
    greedy_decode,
    register_decoding_steps,
    sample_decode,
)
from .generation.config import check_lengths, check_suppress_ids
from .pointer_decoding import pointer_decode, polygon_decode, predict_batch

__all__ = [
    "Beams",
    "Decoded",
    "DecodingLoop",
    "GenerationConfig",
    "beam_search",
    "beam_search_loop",
    "check_lengths",
    "check_suppress_ids",
    "decoder_vocab_size",
    "decoding_steps",
    "export_seq2seq",
    "first_tokens",
    "greedy_decode",
    "pointer_decode",
    "polygon_decode",
    "predict_batch",
    "register_decoding_steps",
    "sample_decode",
]
