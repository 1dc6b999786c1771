"""Differential checks: every path of a layer agrees with a reference that saw clean inputs."""

from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np

from keras_attn.testing._support import (
    _as_arrays,
    _backend,
    _call,
    _compare,
    _compile,
    _flatten,
    _freeze,
    _is_float,
    _marks,
    _to_numpy,
    _tolerance,
    _value_and_gradients,
)

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
CONTENTS = ("huge", "inf", "nan")
# The largest finite value of each float dtype (NumPy has no bfloat16).
_MAX = {"float16": 65504.0, "bfloat16": 3.3895e38, "float32": 3.4028e38, "float64": 1.7976e308}


def _adversarial(x, padded, content, dtype):
    """`x` with `content` where `padded` (bool, the leading axes of `x`), one value per step.

    `"huge"` cycles `+-max / 4` and `+-sqrt(max)` of the smaller of `dtype`
    and `x.dtype` (finite in both); `"inf"` cycles `+inf, -inf`; `"nan"` is
    NaN; `"zeros"` is 0.
    """
    if content == "huge":
        big = min(_MAX.get(str(dtype), _MAX["float32"]), _MAX.get(str(x.dtype), _MAX["float32"]))
        pattern = [big / 4, -big / 4, big**0.5, -(big**0.5)]
    else:
        pattern = {"inf": [np.inf, -np.inf], "nan": [np.nan], "zeros": [0.0]}[content]
    order = np.cumsum(padded.ravel()).reshape(padded.shape) - 1  # the n-th padded step
    values = np.asarray(pattern, x.dtype)[order % len(pattern)]
    expand = (1,) * (x.ndim - padded.ndim)
    return np.where(padded.reshape(padded.shape + expand), values.reshape(values.shape + expand), x)


def _with_policy(config, policy):
    """`config` with every dtype policy in it (the layer's, its sublayers') set to `policy`,
    and no `name` (two layers that differ only by name share their compilations)."""
    if isinstance(config, dict):
        return {k: policy if k == "dtype" and _is_policy(v) else _with_policy(v, policy)
                for k, v in config.items() if k != "name"}  # fmt: skip
    if isinstance(config, (list, tuple)):
        return type(config)(_with_policy(v, policy) for v in config)
    return config


def _is_policy(value):
    if isinstance(value, str):
        return "float" in value
    return isinstance(value, dict) and str(value.get("class_name", "")).endswith("DTypePolicy")


# (class, config under the policy, XLA, inputs' shapes and dtypes, call_kwargs) -> (layer, step):
# the checks run on one layer's paths, one after the other, share layers and compilations.
_PATHS = {}
_MAX_PATHS = 256


def _path(layer, overrides, policy, jit_compile, tensors, floats, call_kwargs):
    """`(path_layer, step)`, `step(tensors, keep, cotangents) -> (outputs, gradients)`.

    `path_layer` is `layer` rebuilt under `policy` with `overrides`, holding
    its weights. The gradients, with respect to the inputs `floats` then the
    trainable weights, are those of `sum(c_i * output_i)` over the rows where
    `keep` (bool, or `None`: all) with the cotangents `c_i` (`None` for a
    non-float output).
    """
    config = _with_policy({**layer.get_config(), **overrides}, policy)
    signature = [(n, tuple(t.shape), str(t.dtype)) for n, t in tensors.items()]
    key = (type(layer), repr(config), jit_compile, repr(signature),
           tuple(sorted((k, _freeze(v)) for k, v in call_kwargs.items())))  # fmt: skip
    if key not in _PATHS:
        new = type(layer).from_config(config)
        _call(new, tensors, call_kwargs)  # builds it
        if [w.shape for w in new.weights] != [w.shape for w in layer.weights]:
            raise ValueError(f"The variant {dict(overrides)} has other weights than `layer`.")
        weights = list(new.trainable_weights)

        def step(tensors, keep, cotangents):
            def function(*sources):
                named = {**tensors, **dict(zip(floats, sources, strict=True))}
                return _flatten(_call(new, named, call_kwargs))

            def loss(outputs):
                total = keras.ops.zeros((), "float64" if policy == "float64" else "float32")
                for out, c in zip(outputs, cotangents, strict=True):
                    if c is None:
                        continue
                    term = keras.ops.cast(out, total.dtype) * keras.ops.cast(c, total.dtype)
                    rank = 0 if keep is None else len(keep.shape)
                    if keep is not None and tuple(out.shape[:rank]) == tuple(keep.shape):
                        shape = tuple(keep.shape) + (1,) * (len(out.shape) - rank)
                        rows = keras.ops.reshape(keep, shape)
                        term = keras.ops.where(rows, term, keras.ops.zeros_like(term))
                    total = total + keras.ops.sum(term)
                return total

            return _value_and_gradients(function, [tensors[n] for n in floats], weights, loss)

        if len(_PATHS) >= _MAX_PATHS:
            del _PATHS[next(iter(_PATHS))]
        _PATHS[key] = new, _compile(step, new.variables) if jit_compile else step
    new, step = _PATHS[key]
    new.set_weights(layer.get_weights())
    return new, step


def _arrays(tensors, shapes, dtype):
    """Tensors as NumPy arrays of `dtype`; `None` (no gradient) as zeros of its shape."""
    return [np.zeros(s, dtype) if t is None else np.asarray(keras.ops.convert_to_numpy(
        keras.ops.cast(t, dtype))) for t, s in zip(tensors, shapes, strict=True)]  # fmt: skip


def _check_outputs(what, actual, expected, tol, keep, zero):
    _compare(f"{what}: an output differs from the float64 reference", actual, expected, tol, keep)
    for i, out in enumerate(actual):
        if zero is not None and out.shape[: zero.ndim] == zero.shape and np.any(out[zero] != 0):
            with np.errstate(invalid="ignore"):
                largest = np.abs(out[zero].astype("float64")).max()
            raise AssertionError(
                f"{what}: output {i} is not exactly zero on the rows that must be (padded query "
                f"rows, rows that see no key; largest |value| {largest:.3g})"
            )


def _check_gradients(what, grads, names, expected, padded, tol):
    """Finite; exactly zero at the padded steps (`padded`: name -> bool); close to `expected`."""
    for g, e, name in zip(grads, expected, names, strict=True):
        if not np.all(np.isfinite(g)):
            index = tuple(int(j) for j in np.argwhere(~np.isfinite(g))[0])
            raise AssertionError(f"{what}: the gradient of {name} is not finite, at index {index}")
        where = padded.get(name)
        if where is not None and np.any(g[where] != 0):
            raise AssertionError(
                f"{what}: the gradient of {name} is not zero at its padded steps (largest "
                f"|value| {np.abs(g[where]).max():.3g})"
            )
        scale = max(1.0, float(np.abs(e).max())) if e.size else 1.0
        _compare(f"{what}: the gradient of {name} (/ {scale:.3g}) differs from the reference's",
                 [g / scale], [e / scale], tol)  # fmt: skip


def assert_paths_agree(
    layer: keras.layers.Layer,
    inputs: Mapping[str, Any],
    padding: Mapping[str, Any] | None = None,
    *,
    variants: Sequence[Mapping[str, Any]] = ({},),
    reference: Mapping[str, Any] | None = None,
    policies: Sequence[str] = POLICIES,
    contents: Sequence[str] = CONTENTS,
    jit_compile: Sequence[bool] = (False, True),
    gradients: bool = True,
    output_mask: Any = None,
    zero_rows: Any = None,
    call_kwargs: Mapping[str, Any] | None = None,
    atol: float | None = None,
    seed: int = 0,
) -> None:
    """Asserts that every path of a layer gives the outputs and gradients of a float64 reference.

    The reference is `layer` rebuilt from its config under `"float64"` (every
    dtype policy in the config replaced) with its weights and the `reference`
    overrides, called eagerly on clean inputs: padded steps zeroed. A path is
    `layer` rebuilt with one of `variants` (constructor overrides, e.g.
    `{"implementation": "fused"}`) under one of `policies`, called eagerly or
    compiled with XLA, on `inputs` holding one of `contents` at the padded
    steps: `"huge"` (finite, near the largest value of the compute dtype),
    `"inf"` (+-inf), `"nan"`, or `"zeros"` (the clean inputs). On each path:

    - the compared outputs (all, or the rows of `output_mask`) equal the
      reference's, to a tolerance by dtype (so they are finite);
    - the outputs at `zero_rows` are exactly zero (in the reference too);
    - with `gradients`, the gradients of `sum(c * outputs)` (fixed random
      `c`, compared rows only) with respect to every float input and every
      trainable weight are finite, exactly zero at the padded steps, and equal
      the reference's (both divided by the reference's largest, if above 1).

    The layers and XLA compilations of the paths are kept, and shared by the
    checks that follow on layers of the same class and config.

    Args:
        layer: a Keras layer; built on `inputs` if it is not.
        inputs, call_kwargs: see the module docstring (`inputs` include the
            masks).
        padding: dict `float input name -> bool (B, T)`, `True` = real step,
            or the name of that mask in `inputs`. `None`: nothing is padded;
            each path runs once, on `inputs`.
        variants: constructor overrides, one per family of paths.
        reference: constructor overrides of the float64 reference.
        policies: dtype policies of the paths.
        contents: written into the padded steps, one run each.
        jit_compile: `False` (eager), `True` (XLA), or both.
        gradients: check the gradients too (they are computed either way).
        output_mask: bool `(B, T)` or the name of an input: outputs whose
            leading axes are `(B, T)` are compared only where it is `True`
            (the padded rows of a residual block are not defined).
        zero_rows: bool array: outputs whose leading axes have its shape must
            be exactly zero where it is `True` (padded query rows, rows that
            see no key, every row when `Tv = 0`).
        atol: absolute and relative tolerance; `None` picks one by dtype.
        seed: of the cotangents `c`.

    Returns:
        None.

    Raises:
        AssertionError: naming the layer, the path (variant, policy, eager or
            XLA, content), the output or gradient and the largest difference.
        ValueError: `padding` naming a non-float input, an unknown content, a
            variant with other weights than `layer`.

    Example:

    >>> from keras_attn import testing
    >>> x = np.random.default_rng(0).normal(size=(2, 4, 8)).astype("float32")
    >>> mask = np.array([[True, True, True, False], [False, True, True, True]])
    >>> testing.assert_paths_agree(
    ...     keras_attn.MultiHeadAttention(2, 4), {"query": x, "value": x, "value_mask": mask},
    ...     {"value": "value_mask"}, variants=[{"implementation": "fused"}],
    ...     reference={"implementation": "dense"}, policies=["mixed_float16"])
    """
    _backend("assert_paths_agree (gradients, XLA)")
    inputs = _as_arrays(inputs)
    marks = _marks(inputs, padding) if padding else {}
    floats = [name for name, v in inputs.items() if _is_float(v.dtype)]
    if set(contents) - {*CONTENTS, "zeros"} or set(marks) - set(floats):
        raise ValueError(
            "`padding` may name float inputs only, and `contents` hold 'huge', 'inf', 'nan' "
            f"or 'zeros'. Received: padding of {sorted(marks)}, contents={tuple(contents)}"
        )
    keep, zero = (None if m is None else np.asarray(inputs[m] if isinstance(m, str) else m, bool)
                  for m in (output_mask, zero_rows))  # fmt: skip
    padded = {f"input `{n}`": ~real for n, real in marks.items()}
    clean = {n: _adversarial(x, ~marks[n], "zeros", x.dtype) if n in marks else x
             for n, x in inputs.items()}  # fmt: skip
    kwargs, name = dict(call_kwargs or {}), type(layer).__name__
    as_tensors = lambda arrays: {n: keras.ops.convert_to_tensor(x) for n, x in arrays.items()}  # noqa: E731
    if not layer.built:
        _call(layer, as_tensors(clean), kwargs)
    names = [f"input `{n}`" for n in floats] + [f"weight `{w.path}`" for w in layer.trainable_weights]
    shapes = [inputs[n].shape for n in floats] + [w.shape for w in layer.trainable_weights]

    # The reference: float64, eager, on the clean inputs.
    wide = as_tensors({n: x.astype("float64") if n in floats else x for n, x in clean.items()})
    ref_layer, step = _path(layer, dict(reference or {}), "float64", False, wide, floats, kwargs)
    probe = _flatten(_call(ref_layer, wide, kwargs))
    rng = np.random.default_rng(seed)
    cotangents = [rng.normal(size=tuple(t.shape)) if _is_float(t.dtype) else None for t in probe]
    keep_t = None if keep is None else keras.ops.convert_to_tensor(keep)
    outputs, grads = step(wide, keep_t, [None if c is None else keras.ops.convert_to_tensor(c)
                                         for c in cotangents])  # fmt: skip
    expected = [np.asarray(keras.ops.convert_to_numpy(t)) for t in outputs]
    expected_grads = _arrays(grads, shapes, "float64")
    what = f"{name}: the float64 reference, on clean inputs"
    for i, out in enumerate(expected):
        if _is_float(out.dtype) and not np.all(np.isfinite(out)):
            raise AssertionError(f"{what}: output {i} is not finite")
    _check_outputs(what, expected, expected, 0.0, None, zero)
    if gradients:
        _check_gradients(what, expected_grads, names, expected_grads, padded, 0.0)

    cotangents = [None if c is None else keras.ops.convert_to_tensor(c.astype("float32"))
                  for c in cotangents]  # fmt: skip
    for overrides in variants:
        variant = ", ".join(f"{k}={v!r}" for k, v in overrides.items()) or "default"
        for policy in policies:
            for jit in jit_compile:
                path, step = _path(layer, dict(overrides), policy, jit, as_tensors(inputs),
                                   floats, kwargs)  # fmt: skip
                for content in contents if marks else ("no",):
                    sources = {n: _adversarial(x, ~marks[n], content, path.compute_dtype)
                               if n in marks else x for n, x in inputs.items()}  # fmt: skip
                    what = (f"{name} [{variant}, {policy}, {'XLA' if jit else 'eager'}, "
                            f"{content} content at padded steps]")  # fmt: skip
                    outputs, grads = step(as_tensors(sources), keep_t, cotangents)
                    tol = _tolerance(atol, [keras.backend.standardize_dtype(t.dtype)
                                            for t in outputs])  # fmt: skip
                    _check_outputs(what, [_to_numpy(t) for t in outputs], expected, tol, keep,
                                   zero)  # fmt: skip
                    if gradients:
                        grads = _arrays(grads, shapes, "float32")
                        _check_gradients(what, grads, names, expected_grads, padded, tol)


def _cached_calls(layer, with_source):
    """`(full, step, empty_cache)` for keras-attn's two cached call signatures.

    `full(x, mask, source, source_mask)` is the causal pass;
    `step(x, mask, cache, index, source, source_mask, cross) -> (out, cache, cross)`.
    """
    if hasattr(layer, "empty_cache"):  # MultiHeadAttention: `cache=`, `cache_update_index=`
        if with_source:
            raise ValueError("A `MultiHeadAttention` decodes without an `encoder_sequence`.")
        causal = lambda x, m: {"query_mask": m, "value_mask": m, "use_causal_mask": True}  # noqa: E731

        def step(x, mask, cache, index, source, source_mask, cross):
            out, cache = layer(x, x, **causal(x, mask), cache=cache, cache_update_index=index)
            return out, cache, cross

        return lambda x, mask, *_: layer(x, x, **causal(x, mask)), step, layer.empty_cache

    def full(x, mask, source, source_mask):  # a decoder block: `self_attention_cache=`, ...
        return layer(x, source, decoder_padding_mask=mask, encoder_padding_mask=source_mask)

    def step(x, mask, cache, index, source, source_mask, cross):
        return layer(x, source, decoder_padding_mask=mask, encoder_padding_mask=source_mask,
                     self_attention_cache=cache, self_attention_cache_update_index=index,
                     cross_attention_cache=cross)  # fmt: skip

    return full, step, lambda batch, length: layer.self_attention.empty_cache(batch, length)


def _filled(cache, content, dtype):
    """`cache` (a `KVCache`) with `content` in every key and value."""

    def fill(c):
        values = _adversarial(_to_numpy(c), np.ones(c.shape[:3], bool), content, dtype)
        return keras.ops.cast(keras.ops.convert_to_tensor(values), c.dtype)

    return cache._replace(key=fill(cache.key), value=fill(cache.value))


def assert_cached_decoding_agrees(
    layer: keras.layers.Layer,
    sequence: Any,
    padding_mask: Any,
    *,
    prompt_length: int | None = None,
    encoder_sequence: Any = None,
    encoder_padding_mask: Any = None,
    contents: Sequence[str] = CONTENTS,
    jit_compile: Sequence[bool] = (False, True),
    atol: float | None = None,
) -> None:
    """Asserts that a padded prefill, then one step at a time, gives the full causal pass.

    The full pass runs eagerly on the clean `sequence` (padded steps zeroed).
    Then `layer.empty_cache` (or its `self_attention`'s), holding `contents`
    at every position (none valid yet), takes the prompt `sequence[:, :P]` at
    index 0, and the next steps one at a time at indices `P, ..., T - 1`, with
    `contents` at the padded steps of the sequence (and of the encoder
    sequence); eagerly, and under XLA with a tensor index. At the real steps
    the outputs must equal the full pass's.

    Two cached call signatures are known: a `keras_attn.MultiHeadAttention`
    (`layer(x, x, query_mask=m, value_mask=m, use_causal_mask=True,
    cache=..., cache_update_index=i) -> (out, cache)`) and a
    `keras_attn.TransformerDecoderBlock` (`self_attention_cache=...`,
    `self_attention_cache_update_index=i`, `cross_attention_cache=...`; the
    first step passes the encoder sequence).

    Args:
        layer: the layer; built by the full pass if it is not.
        sequence: float `(B, T, d)`.
        padding_mask: bool `(B, T)`, `True` = real token; padding anywhere.
        prompt_length: `P`, the steps prefilled at once; `T // 2` by default.
        encoder_sequence, encoder_padding_mask: a decoder block's source
            `(B, S, d)` and its bool `(B, S)` mask (all real by default).
        contents: `"huge"`, `"inf"`, `"nan"` or `"zeros"`, one run each.
        jit_compile: `False` (eager), `True` (XLA), or both.
        atol: tolerance; `None` picks one by the output dtype.

    Returns:
        None.

    Raises:
        AssertionError: naming the run (eager or XLA, content) and the largest
            difference.

    Example:

    >>> from keras_attn import testing
    >>> x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    >>> mask = np.array([[False, True, True, True, True], [True, True, False, True, False]])
    >>> testing.assert_cached_decoding_agrees(keras_attn.MultiHeadAttention(2, 4), x, mask)
    """
    x, mask = np.asarray(sequence), np.asarray(padding_mask, bool)
    (batch, length), name = mask.shape, type(layer).__name__
    prompt = length // 2 if prompt_length is None else prompt_length
    if not 1 <= prompt <= length or x.shape[:2] != mask.shape:
        raise ValueError(
            f"`padding_mask` must be (B, T) of `sequence`, and 1 <= prompt_length <= T. Received: "
            f"sequence.shape={x.shape}, padding_mask.shape={mask.shape}, prompt_length={prompt}"
        )
    source = None if encoder_sequence is None else np.asarray(encoder_sequence)
    source_mask = None if source is None else np.ones(source.shape[:2], bool)
    if source is not None and encoder_padding_mask is not None:
        source_mask = np.asarray(encoder_padding_mask, bool)
    full, step, empty_cache = _cached_calls(layer, source is not None)
    t = lambda a: None if a is None else keras.ops.convert_to_tensor(a)  # noqa: E731
    pad = lambda a, m, c: None if a is None else _adversarial(a, ~m, c, layer.compute_dtype)  # noqa: E731
    expected = [_to_numpy(full(t(pad(x, mask, "zeros")), t(mask), t(pad(source, source_mask,
                "zeros")), t(source_mask)))]  # fmt: skip
    tol = _tolerance(atol, [keras.backend.standardize_dtype(layer.compute_dtype)])
    for jit in jit_compile:
        run = _compile(step, layer.variables) if jit else step
        index = (lambda i: keras.ops.convert_to_tensor(i, "int32")) if jit else (lambda i: i)
        for content in contents:
            xs, cache = pad(x, mask, content), empty_cache(batch, length)
            cache = _filled(cache, content, layer.compute_dtype)
            out, cache, cross = run(t(xs[:, :prompt]), t(mask[:, :prompt]), cache, index(0),
                                    t(pad(source, source_mask, content)), t(source_mask), None)  # fmt: skip
            outputs = [out]
            for i in range(prompt, length):
                out, cache, cross = run(t(xs[:, i : i + 1]), t(mask[:, i : i + 1]), cache,
                                        index(i), None, None, cross)  # fmt: skip
                outputs.append(out)
            actual = [np.concatenate([_to_numpy(o) for o in outputs], axis=1)]
            what = (f"{name} [cached decoding, prompt of {prompt}, {'XLA' if jit else 'eager'}, "
                    f"{content} content at padded steps and in the empty cache]")  # fmt: skip
            _compare(f"{what}: a step differs from the full causal pass", actual, expected, tol,
                     mask)  # fmt: skip
