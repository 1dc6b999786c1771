"""`generate`: a language model's continuation of its prompts, compiled where the backend allows."""

import weakref
from collections.abc import Sequence

import keras
import numpy as np
from keras import ops

from keras_attn._typing import TensorLike
from keras_attn.models import decoding
from keras_attn.models.sampling import check_sampling, greedy_tokens, sample_tokens
from keras_attn.models.transformer_lm import LanguageModelSteps, check_prompts

SAMPLERS = ("greedy", "sample", "beam")
_COMPILED = weakref.WeakKeyDictionary()  # model -> _CompiledLoops


class _CompiledLoops(dict):
    """A model's compiled loops, by settings, for the variables they were traced with.

    A traced loop holds the model's variables and call path as they were (TensorFlow's
    graph captures the variables it read): `enable_lora` adds variables and a LoRA term,
    `quantize` replaces a kernel by an int8 one and its scale. Either changes the list of
    variables (which `model.variables` holds in its order), so the loops of another list
    are dropped and traced again; new values in the same variables need no new trace.
    """

    def __init__(self, variables):
        super().__init__()
        self.variables = variables  # held: a variable freed could give its id to a new one

    def traced_with(self, variables):
        return len(variables) == len(self.variables) and all(
            a is b for a, b in zip(variables, self.variables, strict=True)
        )


def generate(
    model: keras.Model,
    prompts: TensorLike,
    max_length: int,
    end_id: int | None = None,
    sampler: str = "greedy",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    beam_width: int = 4,
    length_penalty: float = 0.6,
    jit_compile: bool = True,
    suppress_ids: Sequence[int] | np.ndarray = (),
) -> np.ndarray:
    """The next `max_length` tokens of a `transformer_lm` after each prompt.

    A prefill of the prompts (all their tokens but the last, at once), then one
    KV-cached step per new token (`LanguageModelSteps`), through the zoo's
    decoders: `greedy_decode`'s loop with `greedy_tokens` (`"greedy"`) or
    `sample_tokens` (`"sample"`: temperature, top-k, top-p, one uniform draw
    per step and row from `seed`), or `beam_search` (`"beam"`). Token by
    token this is the uncached full pass: greedy tokens are the argmax of
    `model(prompt + tokens so far)[:, -1]` (tested).

    Padding (token 0) and the `suppress_ids` (an OOV token, say) are never
    generated: their logits are set to `-inf` inside the loop, before greedy's
    argmax, before the temperature, top-k and top-p of sampling, and before
    beam search ranks its candidates.

    Prompts may be padded (token 0) on either side: each row is continued
    from its own last real token, at its own positions, as if unpadded. The
    greedy and sampled loops run compiled with `jit_compile=True`: one
    `tf.function(jit_compile=True)` (XLA) on TensorFlow, one `jax.jit` on JAX
    (the weights passed as arguments, so later training is seen), traced
    once per model, settings (`suppress_ids` included) and prompt shape, and
    again after a change of the model's variables (`enable_lora` on its layers,
    `model.quantize`), so the loop always computes what the model computes
    now; torch runs eagerly, as does beam search (its ranking is NumPy).

    Args:
        model: a model built by `transformer_lm`.
        prompts: int tokens `(B, P)`, 0 = padding; every row needs a real
            token.
        max_length: the number of new tokens (whatever the prompts' length).
        end_id: when given, a row stops at its first `end_id` (kept) and is
            padded with 0 after it.
        sampler: `"greedy"`, `"sample"` or `"beam"`.
        temperature, top_k, top_p, seed: of `"sample"` (see
            `keras_attn.models.decoding.sample_decode`).
        beam_width, length_penalty: of `"beam"` (see `beam_search`; it needs
            `end_id`).
        jit_compile: compile the loop (TensorFlow, JAX).
        suppress_ids: token ids never generated: a list, tuple, set or 1-D
            array of ints in `[0, vocab_size)` that leaves another token than
            padding.

    Returns:
        int32 NumPy `(B, max_length)`: the new tokens.

    Raises:
        ValueError: a prompt row without a real token, a token id outside
            the vocabulary, a learned-position model whose table cannot hold
            the longest prompt and `max_length` tokens, or a bad setting; each
            names the argument.

    Example:

    >>> from keras_attn.models import transformer_lm
    >>> model = transformer_lm(50, num_layers=1, d_model=16, intermediate_dim=32)
    >>> prompts = np.array([[5, 6, 7], [8, 9, 0]], "int32")  # ragged, right-padded
    >>> print(generate(model, prompts, max_length=4).shape)
    (2, 4)
    """
    if sampler not in SAMPLERS:
        raise ValueError(f"`sampler` must be one of {SAMPLERS}. Received: sampler={sampler!r}")
    if not LanguageModelSteps.matches(model):
        raise ValueError(
            "`model` must be built by keras_attn.models.transformer_lm. "
            f"Received: model {model.name!r}"
        )
    prompts = np.asarray(ops.convert_to_numpy(prompts))
    steps = LanguageModelSteps(model)
    max_length, _, end_id = decoding.check_lengths(max_length, None, end_id, steps.vocab_size)
    check_prompts(prompts, steps.vocab_size, max_length, steps.sequence_length)
    suppress_ids = decoding.check_suppress_ids(suppress_ids, steps.vocab_size)
    prompts = prompts.astype("int32")
    if sampler == "beam":
        tokens, _ = decoding.beam_search(
            model, prompts, max_length, end_id=end_id, beam_width=beam_width,
            length_penalty=length_penalty, suppress_ids=suppress_ids,
        )  # fmt: skip
        return tokens
    if sampler == "sample":
        temperature, top_k, top_p, seed = check_sampling(temperature, top_k, top_p, seed)
        settings = (max_length, end_id, suppress_ids, temperature, top_k, top_p)
    else:
        settings = (max_length, end_id, suppress_ids)
    if prompts.shape[0] == 0:  # no prompts, no tokens (nothing to decode, nor to compile)
        return np.zeros((0, max_length), "int32")
    uniform = keras.random.uniform((max_length, prompts.shape[0]), seed=seed)  # (steps, B)
    # The compiled loops live as long as the model (`_COMPILED`'s weak key): they must not
    # hold it. A loop is traced (it calls `model_ref()`) only inside `generate(model, ...)`.
    model_ref = weakref.ref(model)

    def loop(prompts, uniform):
        def choose(logits, index):
            if sampler == "greedy":
                return greedy_tokens(logits)
            row = ops.take(uniform, index, axis=0)
            return sample_tokens(logits, row, temperature, top_k, top_p)

        return decoding._decode(
            LanguageModelSteps(model_ref()), prompts, max_length, None, end_id, choose, suppress_ids
        )

    if not jit_compile or keras.backend.backend() == "torch":
        return ops.convert_to_numpy(loop(prompts, uniform))
    variables = tuple(model.variables)
    functions = _COMPILED.get(model)
    if functions is None or not functions.traced_with(variables):
        functions = _COMPILED[model] = _CompiledLoops(variables)
    if settings + (sampler,) not in functions:
        functions[settings + (sampler,)] = _compile(variables, loop)
    return np.asarray(ops.convert_to_numpy(functions[settings + (sampler,)](prompts, uniform)))


def _compile(variables, loop):
    """`loop(prompts, uniform)` under XLA: `tf.function(jit_compile=True)` or `jax.jit`
    (`variables`, the model's, passed as arguments)."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(loop, jit_compile=True, reduce_retracing=True)
    import jax

    def stateless(values, prompts, uniform):
        with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
            return loop(prompts, uniform)

    jitted = jax.jit(stateless)
    return lambda prompts, uniform: jitted([v.value for v in variables], prompts, uniform)
