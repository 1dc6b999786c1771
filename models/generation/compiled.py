"""The compiled-loop cache: a model's decoding loops, compiled once per settings.

`compiled_loop(model, key, loop)` compiles `loop` (`tf.function(jit_compile=True)` on
TensorFlow, `jax.jit` on JAX, the model's variables passed as arguments) and keeps it with the
model (a weak key) under `key`: a hashable key holding the `GenerationConfig`'s
`compile_key`, the length and what else the trace depends on. It is traced again after a
change of the model's variables (`enable_lora`, `quantize`).
"""

import contextlib
import math
import weakref

import keras

from keras_attn._execution import no_gradients, xla_tracing

# TensorFlow, `jit_compile="auto"`: the weights (bytes) above which a streamed step runs as a
# TensorFlow graph (`tf.function`, oneDNN's kernels) rather than under XLA. The one-shot
# greedy and sampled loops run under XLA whatever the size: they read their kernels once,
# outside the loop (`keras_attn.matmul_einsum_dense.loop_kernels`), and there XLA's CPU
# kernels read weights faster than oneDNN's (a GPT-2-small-sized model, 474 MiB, batch 1:
# 22.7 ms a step, 95 % of the copy bandwidth, where the graph's took 43.8; benchmarks/
# README.md, "The roofline"). A streamed step is one compiled call per token: it reads the
# kernels inside, where XLA turns each matrix-vector product into a plain loop (474 MiB:
# 59.5 ms a step against the graph's 49.7; 137 MiB, 13.6 against 14.7 ms; 18 MiB, 2.2
# against 3.1 ms; `python -m benchmarks.profile decode`, the 2-core machine).
XLA_MAX_WEIGHT_BYTES = 256 * 2**20
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


def _small(model) -> bool:
    """Whether `model`'s weights fit `XLA_MAX_WEIGHT_BYTES` (`jit_compile="auto"`)."""
    nbytes = 0
    for variable in model.weights:
        bits = "".join(c for c in str(variable.dtype) if c.isdigit())  # "bfloat16" -> 16
        nbytes += math.prod(variable.shape) * max(1, int(bits or 8) // 8)
    return nbytes <= XLA_MAX_WEIGHT_BYTES


def _compile(variables, loop, xla=True):
    """`loop(*args)` compiled: `tf.function(jit_compile=xla)` or `jax.jit`
    (`variables`, the model's, passed as arguments), traced inside `no_gradients()`:
    nothing differentiates a decoding loop, so its kernels build no custom gradients."""

    inference = _Inference(loop, xla)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(inference, jit_compile=xla, reduce_retracing=True)
    import jax

    def stateless(values, *args):
        with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
            return inference(*args)

    jitted = jax.jit(stateless)
    return lambda *args: jitted([v.value for v in variables], *args)


class _Inference:
    """`loop(*args)` traced inside `no_gradients()` (and `xla_tracing()` for XLA): the
    function `_compile` gives `tf.function`. An object, not a closure: TensorFlow counts
    traces per Python code object, so every loop compiled from one closure (one per model
    and settings, each traced once) would count as retracing one function and warn."""

    def __init__(self, loop, xla):
        self.loop, self.xla = loop, xla

    def __call__(self, *args):
        with no_gradients(), xla_tracing() if self.xla else contextlib.nullcontext():
            return self.loop(*args)


def compiled_loop(model, settings, loop, xla=True):
    """`model`'s compiled `loop(*args)` for `settings` (a hashable key), traced on first use
    and again after a change of the model's variables (`_CompiledLoops`). `loop` must not
    hold `model` (the cache lives as long as the model: reach it through a weak reference).
    `xla=False`: a TensorFlow graph without XLA (`settings` must say so)."""
    variables = tuple(model.variables)
    functions = _COMPILED.get(model)
    if functions is None or not functions.traced_with(variables):
        functions = _COMPILED[model] = _CompiledLoops(variables)
    if settings not in functions:
        functions[settings] = _compile(variables, loop, xla)
    return functions[settings]
