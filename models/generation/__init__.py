"""Generation: the zoo's decoders, on one settings object and one loop.

The package, bottom up (each module imports only those before it):

- `config`: `GenerationConfig`, every setting, checked once (`RULES`: one rule per setting,
  for Python values and an exported graph's tensors); the compile key;
- `samplers`: the token choice (`greedy_tokens`, `sample_tokens`: one draw, settings as
  numbers or tensors; `token_chooser(config)`);
- `processors`: the logits processors (`logits_processors(config)`: padding and
  `suppress_ids` ruled out, CTRL's repetition penalty, no-repeat n-grams);
- `steps`: the decoding-steps protocol (`decoding_steps`, `register_decoding_steps`);
- `loop`: `DecodingLoop` and its `Carry`, `decode`; `contrastive`: `ContrastiveLoop`
  (contrastive search, a `DecodingLoop`);
- `compiled`: the compiled-loop cache (`compiled_loop`);
- `decoders`: `greedy_decode`, `sample_decode`; `beam`: `beam_search`, `beam_search_loop`;
  `speculative`: speculative decoding with a draft model; `lm`: `generate` (a language
  model, compiled, streamed; `draft_model=`: speculative);
- `export`: `export_seq2seq`, the exported `generate` signature's settings.

A new setting is a field of `GenerationConfig` with its rule, and one processor (or sampler).
"""

from .beam import Beams, beam_search, beam_search_loop
from .config import RULES, GenerationConfig
from .decoders import greedy_decode, sample_decode
from .export import export_seq2seq
from .lm import generate
from .loop import Carry, Decoded, DecodingLoop, decode
from .steps import decoder_vocab_size, decoding_steps, first_tokens, register_decoding_steps

__all__ = [
    "RULES",
    "Beams",
    "Carry",
    "Decoded",
    "DecodingLoop",
    "GenerationConfig",
    "beam_search",
    "beam_search_loop",
    "decode",
    "decoder_vocab_size",
    "decoding_steps",
    "export_seq2seq",
    "first_tokens",
    "generate",
    "greedy_decode",
    "register_decoding_steps",
    "sample_decode",
]
