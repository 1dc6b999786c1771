"""Property checks for attention layers and models: the invariants, as assertions.

The bugs people hit with attention are silent: a mask dropped on one code path,
real tokens attending to padding, a future token leaking into the past, NaN or
a uniform average on a row with nothing to attend to, weights lost on reload.
Each check below calls a layer or model a few times with related inputs and
raises `AssertionError`, naming the property, the output and the largest
difference, when the property does not hold:

| check | property |
|---|---|
| `assert_padding_invariance` | new padded content, or more padding, changes no visible output |
| `assert_causal_invariance` | changing the inputs from step `t` on changes no output before `t` |
| `assert_batch_invariance` | an example's output does not depend on the rest of its batch |
| `assert_fully_masked_rows_safe` | rows that see nothing output zeros; outputs, gradients finite |
| `assert_save_reload_equal` | `.keras` (safe mode) and SavedModel copies give the same outputs |
| `assert_paths_agree` | every path (variant, policy, eager, XLA) gives the float64 reference's |
| | outputs and gradients, with huge, inf or NaN at the padded steps |
| `assert_cached_decoding_agrees` | a padded prefill, then one step at a time, gives the full pass |
| `assert_generation_batch_invariance` | a language model's greedy tokens for a prompt alone, in a |
| | batch, padded on the left and on the right, are the same |

They work on any Keras layer or model, not only keras-attn's (the two
differential checks: on a layer that round-trips its config; the cached one on
keras-attn's cache signature; the generation check on a language model that
`keras_attn.models.generate` continues, given its prompts), and need no test
framework. Every other check takes the same first arguments:

- `fn`: a layer, a model or any callable. A `keras.Model` is called
  `fn(inputs, **call_kwargs)`, with `inputs` arranged as the model's inputs
  (matched by name); anything else `fn(**inputs, **call_kwargs)`.
- `inputs`: dict `name -> array` of every argument with a batch axis (axis 0),
  masks included; sequences have their steps on axis 1.
- `call_kwargs`: other arguments, passed unchanged (`use_causal_mask=True`,
  `return_attention_scores=True`, `training=True`, ...).
- `jit_compile=True` runs each call compiled with XLA: `tf.function(jit_compile=True)`
  on the TensorFlow backend, `jax.jit` on JAX (the variables of a layer or
  model `fn` passed in, through a `keras.StatelessScope`); the checks run on
  one `fn` with the same `call_kwargs` share the compilations. torch has no XLA:
  there `jit_compile=True` raises `ValueError`, and `assert_paths_agree` and
  `assert_cached_decoding_agrees` run their eager paths only by default.

A layer's non-trainable state (its seed generators, ...) is put back before
every call, so with `training=True` seeded dropout draws the same randomness
each time and the comparisons stay exact. Tolerances default to `1e-5`
(absolute and relative), `1e-2` for float16 outputs and `5e-2` for bfloat16.
The checks run on the TensorFlow, JAX and torch backends (gradients with
`torch.autograd` there); TensorFlow (or JAX, or torch) is imported only by what
needs it (SavedModel, gradients, XLA).
"""

from keras_attn.testing.differential import assert_cached_decoding_agrees, assert_paths_agree
from keras_attn.testing.generation import assert_generation_batch_invariance
from keras_attn.testing.invariance import (
    assert_batch_invariance,
    assert_causal_invariance,
    assert_padding_invariance,
)
from keras_attn.testing.safety import assert_fully_masked_rows_safe, assert_save_reload_equal

__all__ = [
    "assert_batch_invariance",
    "assert_cached_decoding_agrees",
    "assert_causal_invariance",
    "assert_fully_masked_rows_safe",
    "assert_generation_batch_invariance",
    "assert_padding_invariance",
    "assert_paths_agree",
    "assert_save_reload_equal",
]
