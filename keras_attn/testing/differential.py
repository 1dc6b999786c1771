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
    _float64,
    _freeze,
    _is_float,
    _jit_modes,
    _marks,
    _to_numpy,
    _tolerance,
    _value_and_gradients,
)

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
CONTENTS = ("huge", "inf", "nan")
# The largest finite value of each float dtype (NumPy has no bfloat16).
_MAX = {"float16": 65504.0, "bfloat16": 3.3895e38, "float32": 3.4028e38, "float64": 1.7976e308}
# (class, config, inputs' signature, call_kwargs) -> [the layer rebuilt so, its compiled step]:
# kept, so that the checks on one layer's paths share them (each check sets the weights).
_PATHS = {}


def _adversarial(x, padded, content, dtype):
    """`x` with `content` where `padded` (bool, the leading axes of `x`), one value per step.

    `"huge"`: `+-max / 4`, `+-sqrt(max)` of the smaller of `dtype`, `x.dtype`.
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
    """`config` with every dtype policy in it (its sublayers' too) set to `policy`, and no name."""
    if isinstance(config, (list, tuple)):
        return type(config)(_with_policy(v, policy) for v in config)
    if not isinstance(config, dict):
        return config
    new = {k: _with_policy(v, policy) for k, v in config.items() if k != "name"}
    dtype = config.get("dtype")
    if isinstance(dtype, str) and "float" in dtype or isinstance(dtype, dict):
        new["dtype"] = policy  # a policy's name, or a serialized `keras.DTypePolicy`
    return new


def _keep(cache, key, make, size=32):
    """`cache[key]`, made if missing; the least recently used of `size` entries goes."""
    cache[key] = cache.pop(key) if key in cache else make()
    if len(cache) > size:
        del cache[next(iter(cache))]
    return cache[key]


def _path(layer, overrides, policy, tensors, floats, call_kwargs, jit_compile):
    """`(new, step)`: `layer` rebuilt under `policy` with `overrides` and `layer`'s weights;
    `step(tensors, keep, cotangents, gradients) -> (outputs, gradients)`, the gradients
    (inputs `floats`, trainable weights) of `sum(c_i * output_i)` on the rows where `keep`."""
    config = _with_policy({**layer.get_config(), **overrides}, policy)
    signature = repr([(n, tuple(t.shape), str(t.dtype)) for n, t in tensors.items()])
    frozen = tuple(sorted((k, _freeze(v)) for k, v in call_kwargs.items()))
    key = (type(layer), repr(config), signature, frozen)  # the built layer depends on all

    def rebuild():
        new = type(layer).from_config(config)
        _call(new, tensors, call_kwargs)  # builds it
        return [new, None]

    entry = _keep(_PATHS, key, rebuild)
    new = entry[0]
    new.set_weights(layer.get_weights())

    def step(tensors, keep, cotangents, gradients=True):
        def function(*sources):
            named = {**tensors, **dict(zip(floats, sources, strict=True))}
            return _flatten(_call(new, named, call_kwargs))

        def loss(outputs):
            total = keras.ops.zeros((), "float64" if policy == "float64" else "float32")
            for out, c in zip(outputs, cotangents, strict=True):
                term = 0 if c is None else keras.ops.cast(out, total.dtype) * c
                rank = 0 if keep is None else len(keep.shape)
                if c is not None and rank and tuple(out.shape[:rank]) == tuple(keep.shape):
                    rows = keras.ops.reshape(keep, tuple(keep.shape) + (1,) * (term.ndim - rank))
                    term = keras.ops.where(rows, term, keras.ops.zeros_like(term))
                total = total + keras.ops.sum(term)
            return total

        sources = [tensors[n] for n in floats]
        if not gradients:
            return function(*sources), []
        return _value_and_gradients(function, sources, new.trainable_weights, loss)

    if not jit_compile:
        return new, step
    entry[1] = entry[1] or _compile(step, new.variables)
    return new, lambda tensors, keep, cotangents, gradients: entry[1](tensors, keep, cotangents)


def _check(what, outputs, expected, tol, keep, zero, gradients=()):
    """Outputs close to `expected` and zero at `zero`; each of `gradients`, `(name, g, e,
    padded)`, finite, zero where padded, close to `e` (both divided by `max(1, max |e|)`)."""
    _compare(f"{what}: an output differs from the float64 reference", outputs, expected, tol, keep)
    for i, out in enumerate(outputs):
        if zero is not None and out.shape[: zero.ndim] == zero.shape and np.any(out[zero] != 0):
            raise AssertionError(
                f"{what}: output {i} is not exactly zero on the rows that must be (padded query "
                f"rows, rows that see no key): largest |value| {np.abs(out[zero]).max()!r}"
            )
    for name, g, e, padded in gradients:
        if not np.all(np.isfinite(g)):
            index = tuple(int(j) for j in np.argwhere(~np.isfinite(g))[0])
            raise AssertionError(f"{what}: the gradient of {name} is not finite, at index {index}")
        if padded is not None and np.any(g[padded] != 0):
            largest = np.abs(g[padded]).max()
            raise AssertionError(
                f"{what}: the gradient of {name} is {largest:.3g} at a padded step"
            )
        scale = max(1.0, float(np.abs(e).max(initial=0.0)))
        what_g = f"{what}: the gradient of {name} (/ {scale:.3g}) differs from the reference's"
        _compare(what_g, [g / scale], [e / scale], tol)


def assert_paths_agree(
    layer: keras.layers.Layer,
    inputs: Mapping[str, Any],
    padding: Mapping[str, Any] | None = None,
    *,
    variants: Sequence[Mapping[str, Any]] = ({},),
    reference: Mapping[str, Any] | None = None,
    policies: Sequence[str] = POLICIES,
    contents: Sequence[str] = CONTENTS,
    jit_compile: Sequence[bool] | None = None,
    gradients: bool = True,
    output_mask: Any = None,
    zero_rows: Any = None,
    call_kwargs: Mapping[str, Any] | None = None,
    atol: float | None = None,
    seed: int = 0,
) -> None:
    """Asserts that every path of a layer gives the outputs and gradients of a float64 reference.

    The reference is `layer` rebuilt from its config in `"float64"` (every
    dtype policy in it replaced) with the `reference` overrides and `layer`'s
    weights, called eagerly on clean inputs (padded steps zeroed). A path is
    `layer` rebuilt so with one of `variants` under one of `policies`, eager
    or compiled with XLA, on `inputs` with one of `contents` at the padded
    steps: `"huge"` (finite, near the compute dtype's largest), `"inf"`,
    `"nan"` or `"zeros"`. Its outputs must equal the reference's (tolerance by
    dtype) and be exactly zero at `zero_rows`; its gradients of `sum(c *
    outputs)` (random `c`) with respect to each float input and trainable
    weight must be finite, exactly zero at the padded steps, and equal the
    reference's. Rebuilt layers and compilations are kept for later checks.

    Args:
        layer: a Keras layer whose config round-trips; built on `inputs`.
        inputs, call_kwargs: see the module docstring.
        padding: dict `float input name -> bool (B, T)` (`True` = real step)
            or the name of that mask in `inputs`; `None`: nothing padded.
        variants, reference: constructor overrides, one per family of paths
            (`{"implementation": "fused"}`); the reference's.
        policies, contents, jit_compile: the paths' dtype policies; what the
            padded steps hold, one run each; `False` (eager) and/or `True`
            (XLA). `None`: both, eager only on torch (which has no XLA).
        gradients: check the gradients too.
        output_mask: bool `(B, T)` or an input's name: outputs with leading
            axes `(B, T)` are compared where it is `True` (a residual block's
            padded rows are not defined); the loss covers those rows only.
        zero_rows: bool array: outputs whose leading axes have its shape must
            be exactly 0 where it is `True` (padded query rows, rows that see
            no key, every row when `Tv = 0`); the reference's too.
        atol: tolerance (absolute and relative); `None` picks one by dtype.
        seed: of `c`.

    Raises:
        AssertionError: naming the layer, the path (variant, policy, eager or
            XLA, content), the output or gradient and the largest difference.
        ValueError: `padding` of a non-float input, an unknown content.

    Example:

    >>> from keras_attn import testing
    >>> x = np.random.default_rng(0).normal(size=(2, 4, 8)).astype("float32")
    >>> mask = np.array([[True, True, True, False], [False, True, True, True]])
    >>> testing.assert_paths_agree(
    ...     keras_attn.MultiHeadAttention(2, 4), {"query": x, "value": x, "value_mask": mask},
    ...     {"value": "value_mask"}, variants=[{"implementation": "fused"}],
    ...     reference={"implementation": "dense"}, policies=["mixed_float16"], gradients=False)
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
    keep_tensor = None if keep is None else keras.ops.convert_to_tensor(keep)

    def tensors(content, dtype=None, wide=False):
        arrays = {n: _adversarial(x, ~marks[n], content, dtype) if n in marks else x
                  for n, x in inputs.items()}  # fmt: skip
        cast = {n: x.astype("float64") if wide and n in floats else x for n, x in arrays.items()}
        return {n: keras.ops.convert_to_tensor(x) for n, x in cast.items()}

    kwargs, name = dict(call_kwargs or {}), type(layer).__name__
    if not layer.built:
        _call(layer, tensors("zeros"), kwargs)
    weights = layer.trainable_weights
    names = [f"input `{n}`" for n in floats] + [f"weight `{w.path}`" for w in weights]
    shapes = [inputs[n].shape for n in floats] + [w.shape for w in weights]
    padded = [~marks[n] if n in marks else None for n in floats] + [None] * len(weights)

    def numpy(tensors, dtype, shapes=None):  # a `None` gradient as zeros of its shape
        if shapes is None:
            return [np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(t, dtype))) if
                    _is_float(t.dtype) else _to_numpy(t) for t in tensors]  # fmt: skip
        return [np.zeros(s, dtype) if t is None else numpy([t], dtype)[0]
                for t, s in zip(tensors, shapes, strict=True)]  # fmt: skip

    with _float64():  # the reference: float64, eager, on the clean inputs
        clean = tensors("zeros", wide=True)
        ref, step = _path(layer, dict(reference or {}), "float64", clean, floats, kwargs, False)
        rng = np.random.default_rng(seed)
        probe = _flatten(_call(ref, clean, kwargs))
        cotangents = [keras.ops.convert_to_tensor(rng.normal(size=tuple(t.shape)))
                      if _is_float(t.dtype) else None for t in probe]  # fmt: skip
        outputs, grads = step(clean, keep_tensor, cotangents, gradients)
        expected = numpy(outputs, "float64")
        expected_grads = numpy(grads, "float64", shapes) if gradients else []
    what = f"{name}: the float64 reference, on clean inputs"
    for i, out in enumerate(expected):
        if _is_float(out.dtype) and not np.all(np.isfinite(out)):
            raise AssertionError(f"{what}: output {i} is not finite")
    checked = zip(names, expected_grads, expected_grads, padded, strict=False)
    _check(what, expected, expected, 0.0, None, zero, checked)

    cotangents = [None if c is None else keras.ops.cast(c, "float32") for c in cotangents]
    for overrides in variants:
        variant = ", ".join(f"{k}={v!r}" for k, v in overrides.items()) or "default"
        for policy in policies:
            for jit in _jit_modes(jit_compile):
                path, step = _path(layer, overrides, policy, tensors("zeros"), floats, kwargs, jit)
                for content in contents if marks else ("no",):
                    sources = tensors(content, path.compute_dtype)
                    outputs, grads = step(sources, keep_tensor, cotangents, gradients)
                    grads = numpy(grads, "float32", shapes) if gradients else []
                    checked = zip(names, grads, expected_grads, padded, strict=False)
                    tol = _tolerance(atol, [keras.backend.standardize_dtype(t.dtype)
                                            for t in outputs])  # fmt: skip
                    mode = "XLA" if jit else "eager"
                    what = (
                        f"{name} [{variant}, {policy}, {mode}, {content} content at padded steps]"
                    )
                    _check(what, numpy(outputs, "float32"), expected, tol, keep, zero, checked)


def _cached_calls(layer):
    """`(call, empty_cache)`: `call(x, mask, cache, index, source, source_mask, cross)`.

    Without a cache, the full causal pass; with one, `(out, cache, cross)`: a
    `MultiHeadAttention` (`cache=`) or a decoder block (`self_attention_cache=`).
    """
    if not hasattr(layer, "compute_cross_attention_cache"):

        def call(x, mask, cache=None, index=None, *source_and_cross):
            masks = {"query_mask": mask, "value_mask": mask, "use_causal_mask": True}
            if cache is None:
                return layer(x, x, **masks)
            return (*layer(x, x, **masks, cache=cache, cache_update_index=index), None)

        return call, layer.empty_cache

    def call(x, mask, cache=None, index=None, source=None, source_mask=None, cross=None):
        cached = {"self_attention_cache": cache, "self_attention_cache_update_index": index}
        cached = {} if cache is None else {**cached, "cross_attention_cache": cross}
        out = layer(
            x, source, decoder_padding_mask=mask, encoder_padding_mask=source_mask, **cached
        )
        # A decoder-only block returns no cross-attention cache.
        return (*out, None) if cache is not None and len(out) == 2 else out

    return call, layer.empty_cache


def assert_cached_decoding_agrees(
    layer: keras.layers.Layer,
    sequence: Any,
    padding_mask: Any,
    *,
    prompt_length: int | None = None,
    encoder_sequence: Any = None,
    encoder_padding_mask: Any = None,
    contents: Sequence[str] = CONTENTS,
    jit_compile: Sequence[bool] | None = None,
    atol: float | None = None,
) -> None:
    """Asserts that a padded prefill, then one step at a time, gives the full causal pass.

    The full causal pass runs eagerly on the clean `sequence`. Then an empty
    cache holding `contents` everywhere takes the prompt `sequence[:, :P]` at
    index 0 and the next steps one at a time (eagerly, and under XLA with a
    tensor index), `contents` at the padded steps of the sequence and source;
    at the real steps the outputs must be the full pass's. `layer`: a
    `keras_attn.MultiHeadAttention` (`cache=`, `cache_update_index=`) or a
    `keras_attn.TransformerDecoder` (`self_attention_cache=`, ...).

    Args:
        layer: the layer; built by the full pass if it is not.
        sequence, padding_mask: float `(B, T, d)`; bool `(B, T)`, `True` =
            real token, padding anywhere.
        prompt_length: `P`, the steps prefilled at once; `T // 2` by default.
        encoder_sequence, encoder_padding_mask: a decoder block's source
            `(B, S, d)` and its bool `(B, S)` mask (all real by default).
        contents, jit_compile, atol: as in `assert_paths_agree`.

    Raises:
        AssertionError: naming the run (eager or XLA, content) and the largest
            difference.
        ValueError: shapes that do not match, a prompt length out of range.

    Example:

    >>> from keras_attn import testing
    >>> x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    >>> mask = np.array([[False, True, True, True, True], [True, True, False, True, False]])
    >>> testing.assert_cached_decoding_agrees(keras_attn.MultiHeadAttention(2, 4), x, mask)
    """
    x, mask = np.asarray(sequence), np.asarray(padding_mask, bool)
    (batch, length), name = mask.shape, type(layer).__name__
    prompt = length // 2 if prompt_length is None else prompt_length
    source = None if encoder_sequence is None else np.asarray(encoder_sequence)
    if not 1 <= prompt <= length or x.shape[:2] != mask.shape:
        raise ValueError(
            f"`padding_mask` must be the (B, T) of `sequence`, and 1 <= prompt_length <= T. "
            f"Received: shapes {x.shape}, {mask.shape}, prompt_length={prompt}"
        )
    if source is not None and not hasattr(layer, "compute_cross_attention_cache"):
        raise ValueError("A `MultiHeadAttention` decodes without an `encoder_sequence`.")
    real = None if source is None else np.ones(source.shape[:2], bool)
    real = real if encoder_padding_mask is None else np.asarray(encoder_padding_mask, bool)
    call, empty_cache = _cached_calls(layer)
    as_tensor = lambda a: None if a is None else keras.ops.convert_to_tensor(a)  # noqa: E731
    dtype, m, sm = layer.compute_dtype, as_tensor(mask), as_tensor(real)

    def padded(content):  # the sequence and the source, with `content` at their padded steps
        pairs = ((x, mask), (source, real))
        return [
            a if a is None else as_tensor(_adversarial(a, ~r, content, dtype)) for a, r in pairs
        ]

    def empty(content):  # an empty cache (nothing valid) holding `content` everywhere
        cache = empty_cache(batch, length)
        fill = [_adversarial(_to_numpy(c), np.ones(c.shape[:3], bool), content, dtype)
                for c in (cache.key, cache.value)]  # fmt: skip
        key, value = (keras.ops.cast(as_tensor(f), cache.key.dtype) for f in fill)
        return cache._replace(key=key, value=value)

    clean, source_clean = padded("zeros")
    expected = [_to_numpy(call(clean, m, None, None, source_clean, sm))]
    tol = _tolerance(atol, [keras.backend.standardize_dtype(dtype)])
    for jit in _jit_modes(jit_compile):
        run = _compile(call, layer.variables) if jit else call
        index = (lambda i: as_tensor(np.int32(i))) if jit else (lambda i: i)
        for content in contents:
            (xs, src), cache = padded(content), empty(content)
            out, cache, cross = run(xs[:, :prompt], m[:, :prompt], cache, index(0), src, sm, None)
            outputs = [out]
            for i in range(prompt, length):
                new = (xs[:, i : i + 1], m[:, i : i + 1], cache, index(i))
                out, cache, cross = run(*new, None, None, cross)
                outputs.append(out)
            actual = [np.concatenate([_to_numpy(o) for o in outputs], axis=1)]
            mode = "XLA" if jit else "eager"
            what = f"{name} [cached decoding, prompt of {prompt}, {mode}, {content} content at "
            what += "padded steps and in the empty cache]: a step differs from the full causal pass"
            _compare(what, actual, expected, tol, mask)
