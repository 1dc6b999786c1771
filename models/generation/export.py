"""Generation in a SavedModel: `export_seq2seq`, and the exported `generate` signature's
per-request settings, derived from `GenerationConfig`.

`export_seq2seq` writes a SavedModel of a seq2seq model that decodes inside its graph (also
importable from `keras_attn.models`). It needs TensorFlow (a SavedModel is TensorFlow's
format) and the tensorflow or jax backend; `greedy_decode` and the other decoders do not.

The text models' `generate` signature takes `text` and the settings that
`GenerationConfig.exported()` names, as scalars (`generation_specs`), and gates each on its
`RULES` predicate in the graph (`checked_settings`): one rule set for Python and the export.
"""

import keras
from keras import ops

from ..files import write_atomically
from .config import RULES, GenerationConfig, check_lengths
from .decoders import greedy_decode
from .loop import Decoded, decode
from .samplers import token_chooser
from .steps import decoder_vocab_size, decoding_steps


def export_seq2seq(
    model: keras.Model, path: str, max_length: int, start_id: int, end_id: int | None = None
) -> None:
    """Exports a seq2seq model as a SavedModel that decodes in its graph.

    Signatures (what TF Serving and converters see; int64 inputs, the dtype
    `TextVectorization` emits):

    - `serving_default`: `encoder_inputs` `(B, S)` -> `{"tokens": (B, max_length)}`
      int32, greedy decoding, the whole cached loop inside the graph;
    - `greedy_decode`: the same, its output unnamed (`output_0`);
    - `serve`: the teacher-forced model, `encoder_inputs` `(B, S)` and
      `decoder_inputs` `(B, T)` (by name) -> logits `(B, T, V)`.

    From Python, `serve` takes the model's input dict, and an export from
    TensorFlow takes int32 too (one from JAX: int64 only):

        loaded = tf.saved_model.load(path)
        tokens = loaded.greedy_decode(tf.constant(source_tokens, tf.int64))
        logits = loaded.serve({"encoder_inputs": source, "decoder_inputs": previous})

    Backends: on TensorFlow the loop is a `tf.function` graph (a `tf.while_loop`).
    On JAX the same Python loop (`keras.ops.fori_loop`, a `lax` loop) is
    converted with `jax2tf` (Keras' `ExportArchive`): the signatures are the
    same, with any batch size and source length, but take int64 only, and the
    graph is one `XlaCallModule` op (StableHLO, lowered for the platform the
    export ran on), which TFLite and ONNX converters do not read. Torch cannot
    write a SavedModel (`ValueError`).

    For a `transformer_seq2seq` exported from TensorFlow, `greedy_decode`
    converts to TFLite with builtin ops only
    (`tf.lite.TFLiteConverter.from_saved_model(path, signature_keys=["greedy_decode"])`);
    an `rnn_seq2seq` needs `SELECT_TF_OPS` (the Keras RNN layers' TensorList ops).

    Args:
        model: a seq2seq model with decoding steps (`register_decoding_steps`).
        path: the SavedModel directory, written atomically (`write_atomically`).
        max_length, start_id, end_id: as in `greedy_decode`.
    """
    archive, decoder = seq2seq_archive(model, max_length, start_id, end_id)

    def serving_default(encoder_inputs):
        return {"tokens": decoder(encoder_inputs)}

    add_endpoints(archive, {"serving_default": serving_default}, tuple(model.input))
    write_atomically(path, lambda temporary: archive.write_out(temporary, verbose=False))


def _specs(names, dtype):
    import tensorflow as tf

    source = tf.TensorSpec((None, None), dtype, name="encoder_inputs")
    pair = {name: tf.TensorSpec((None, None), dtype, name=name) for name in names}
    return {"serving_default": source, "greedy_decode": source, "serve": pair}


def add_endpoints(archive, endpoints, names):
    """Adds token endpoints (named as in `export_seq2seq`) to `archive`, per backend.

    `names`: the model's input names (`serve` takes them by name).
    """
    import tensorflow as tf

    if keras.backend.backend() == "jax":
        for name, fn in endpoints.items():
            # The tokens have no gradient: jax2tf need not convert one for the decoders.
            kwargs = {} if name == "serve" else {"jax2tf_kwargs": {"with_gradient": False}}
            signature = [_specs(names, tf.int64)[name]]
            archive.add_endpoint(name, fn, input_signature=signature, **kwargs)
        return
    for name, fn in endpoints.items():
        function = fn if isinstance(fn, tf.types.experimental.GenericFunction) else tf.function(fn)
        # The first trace (int64) is the signature; int32 is traced for Python callers.
        for dtype in (tf.int64, tf.int32):
            function.get_concrete_function(_specs(names, dtype)[name])
        archive.add_endpoint(name, function)


def seq2seq_archive(model, max_length, start_id, end_id=None):
    """An `ExportArchive` tracking `model`, with its `greedy_decode` and `serve` endpoints.

    Returns:
        `(archive, decoder)`: `decoder(encoder_inputs)` is the greedy decoding function
        (a `tf.function` on TensorFlow), for more endpoints built on it.
    """
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax"):
        raise ValueError(
            "`export_seq2seq` writes a SavedModel from the tensorflow or jax backend. "
            f"Received: backend={backend!r}"
        )
    steps = decoding_steps(model)
    vocab_size = decoder_vocab_size(steps, model)
    max_length, start_id, end_id = check_lengths(max_length, start_id, end_id, vocab_size)
    config = GenerationConfig(start_id=start_id, end_id=end_id)
    if not isinstance(model.input, dict):
        raise ValueError(
            "`model` must take a dict of named inputs (the zoo's `{'encoder_inputs', "
            f"'decoder_inputs'}}`). Received: model.input={model.input!r}"
        )
    import tensorflow as tf  # the SavedModel format (on JAX too: jax2tf)

    def decode(encoder_inputs):
        source = ops.cast(encoder_inputs, "int32")
        return greedy_decode(model, source, max_length, config=config, steps=steps)

    # On TensorFlow, `serving_default` calls the `greedy_decode` function: the decoding loop
    # is traced (and stored in the SavedModel) once per dtype, not once per signature.
    decoder = decode if backend == "jax" else tf.function(decode)

    def teacher_forced(inputs):
        return model({name: ops.cast(x, "int32") for name, x in inputs.items()}, training=False)

    archive = keras.export.ExportArchive()
    archive.track(model)
    add_endpoints(archive, {"greedy_decode": decoder, "serve": teacher_forced}, tuple(model.input))
    return archive, decoder


# ---------------------------------------------------------------------------
# The exported `generate`: per-request settings as scalar tensors
# ---------------------------------------------------------------------------


def generation_specs() -> list:
    """The `generate` signature's inputs: `text` `(B,)` and the settings, by name
    (`GenerationConfig.exported()`, each of its rule's dtype and shape: scalars, and the
    `stop_sequences` strings `(N,)`)."""
    import tensorflow as tf

    settings = [
        tf.TensorSpec(RULES[name].shape, RULES[name].exported, name=name)
        for name in GenerationConfig.exported()
    ]
    return [tf.TensorSpec((None,), tf.string, name="text"), *settings]


def checked_settings(limit: int, **settings) -> dict:
    """The `generate` signature's settings, each gated on a `tf.debugging.Assert` of its
    `RULES` predicate (the one Python's `GenerationConfig` applies), naming it.

    `max_length` at most `limit` too. The error names the argument and the received value,
    before anything runs on a bad one (no shape error from deep inside).
    """
    import tensorflow as tf

    asserts = []
    for name, value in settings.items():
        rule = RULES[name]
        if rule.holds is None:
            continue
        holds, must = rule.holds(value, tf.math.is_finite), rule.must
        if name == "max_length":
            holds, must = tf.logical_and(holds, value <= limit), f"{must} at most {limit}"
        message = f"`{name}` must be {must}. Received: {name}="
        asserts.append(tf.debugging.Assert(holds, [message, value]))
    with tf.control_dependencies(asserts):
        return {name: tf.identity(value) for name, value in settings.items()}


def uniform_draws(seed, max_length, batch, n=1):
    """float32 `(max_length, batch)` draws from `U[0, 1)`: on TensorFlow, what
    `keras.random.uniform((max_length, batch), seed=seed)` draws for a Python int `seed`
    (`[seed, 0]` int64, mod `2**31 - 2`, as int32: the stateless Philox seed), with a tensor
    `seed`; so an exported `generate` samples what Python's `generate` samples.

    `n > 1` (a Python int, `num_return_sequences`): `(max_length, batch * n)`, Python's
    `samplers.sample_draws`: column `i * n + j` drawn as `(max_length, 1)` from `seed + j`."""
    import tensorflow as tf

    def draw(seed, columns):
        pair = tf.stack([tf.cast(seed, tf.int64), tf.constant(0, tf.int64)])
        pair = tf.cast(tf.math.floormod(pair, tf.int32.max - 1), tf.int32)
        shape = tf.stack([tf.cast(max_length, tf.int32), tf.cast(columns, tf.int32)])
        return tf.random.stateless_uniform(
            shape, seed=pair, minval=tf.constant(0.0), maxval=tf.constant(1.0), dtype=tf.float32
        )

    if n == 1:
        return draw(seed, batch)
    samples = [draw(tf.cast(seed, tf.int64) + j, 1) for j in range(n)]  # (T, 1) each
    return tf.tile(tf.concat(samples, axis=1), tf.stack([1, tf.cast(batch, tf.int32)]))


def sampled_generation(steps, source, config: GenerationConfig, limit: int, **settings) -> Decoded:
    """The decoding loop with the `generate` signature's tensor `settings`, checked
    (`checked_settings`, `max_length` at most `limit`): `config`'s fixed settings (its ids,
    `suppress_ids`, `num_return_sequences`: `n` rows a prompt), `sample_tokens` on the
    tensors' temperature, top-k and top-p, drawing from `seed` (`uniform_draws`); returns the
    `Decoded` tokens and scores. A
    `stop_sequences` setting is token ids, int32 `(N, L)` padded with -1 (the text models
    spell the signature's strings: `keras_attn.models.text`)."""
    import tensorflow as tf

    settings = checked_settings(limit, **settings)
    n = config.num_return_sequences
    uniform = uniform_draws(settings["seed"], settings["max_length"], tf.shape(source)[0], n)
    source = tf.repeat(source, n, axis=0) if n > 1 else source  # each prompt's n rows
    config = config.replace(sampler="sample", return_scores=True)
    tensors = {k: v for k, v in settings.items() if k not in ("max_length", "seed")}
    choose = token_chooser(config, uniform, tensors)
    return decode(steps, source, settings["max_length"], config, choose, tensors)
