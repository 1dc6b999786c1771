"""Invariance checks: padding, causality and the batch change no output they must not."""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from keras_attn.testing._support import (
    _as_arrays,
    _batch_size,
    _compare,
    _marks,
    _perturb,
    _Runner,
    _tolerance,
)


def assert_padding_invariance(
    fn: Callable,
    inputs: Mapping[str, Any],
    padding: Mapping[str, Any],
    *,
    output_mask: Any = None,
    pad_value: float | None = None,
    extra_steps: int = 2,
    nonfinite: bool = False,
    call_kwargs: Mapping[str, Any] | None = None,
    atol: float | None = None,
    seed: int = 0,
    jit_compile: bool = False,
) -> None:
    """Asserts that padding changes no visible output.

    Two ways padding can be marked:

    - by a mask the callee receives (an entry of `inputs`, or an implicit
      Keras mask): the check writes new values (noise, or NaN/inf with
      `nonfinite=True`) into the padded positions of each input in `padding`;
    - by content (`pad_value`: token id 0 with `mask_zero=True`, a
      `keras.layers.Masking` value): the check appends `extra_steps` steps of
      `pad_value` to each input in `padding`; outputs that grew with it are
      compared on the original positions.

    Args:
        fn, inputs, call_kwargs, jit_compile: see the module docstring.
        padding: dict `input name -> bool (B, T)`, `True` = real step, or the
            name of that boolean mask in `inputs`.
        output_mask: bool `(B, T)` (or the name of an input): outputs whose
            leading axes are `(B, T)` are compared only where it is `True`
            (for layers whose padded rows are not defined, e.g. a residual
            block). `None`: every output value must stay the same.
        pad_value: `None`, or the value that marks padding by content.
        extra_steps: steps appended with `pad_value`.
        nonfinite: write NaN, inf and -inf into padded positions instead of
            noise (then no non-finite value may reach a visible output).
        atol: absolute and relative tolerance; `None` picks one by dtype.
        seed: of the new values.

    Returns:
        None. Raises `AssertionError` when a visible output changed.

    Example:

    >>> from keras_attn import testing
    >>> x = np.random.default_rng(0).normal(size=(2, 4, 8)).astype("float32")
    >>> mask = np.array([[True, True, True, False], [True, True, False, False]])
    >>> testing.assert_padding_invariance(
    ...     keras_attn.DotAttention(), {"query": x, "value": x, "value_mask": mask},
    ...     padding={"value": "value_mask"}, nonfinite=True)
    """
    inputs = _as_arrays(inputs)
    marks = _marks(inputs, padding)
    runner = _Runner(fn, call_kwargs, jit_compile)
    reference = runner(inputs)
    tol = _tolerance(atol, runner.dtypes)
    keep = None
    if output_mask is not None:
        keep = np.asarray(inputs[output_mask] if isinstance(output_mask, str) else output_mask)
        keep = keep.astype(bool)
    names = ", ".join(f"`{name}`" for name in marks)
    if pad_value is None:
        rng = np.random.default_rng(seed)
        changed = dict(inputs)
        for name, real in marks.items():
            changed[name] = _perturb(inputs[name], ~real, rng, nonfinite)
        what = f"Padding invariance: changing {names} at padded steps changed a visible output"
        _compare(what, runner(changed), reference, tol, keep)
        return
    longer = dict(inputs)
    for name, real in marks.items():
        x = inputs[name]
        padded = np.all(x.reshape(x.shape[:2] + (-1,)) == pad_value, axis=-1)
        if np.any(padded != ~real):
            raise ValueError(
                f"`padding[{name!r}]` must be False exactly where `{name}` equals "
                f"pad_value={pad_value!r}."
            )
        widths = [(0, 0), (0, extra_steps)] + [(0, 0)] * (x.ndim - 2)
        longer[name] = np.pad(x, widths, constant_values=pad_value)
    grown = [out[tuple(slice(0, n) for n in ref.shape)] for out, ref in zip(
        runner(longer), reference, strict=True)]  # fmt: skip
    what = f"Padding invariance: {extra_steps} more padded steps on {names} changed an output"
    _compare(what, grown, reference, tol, keep)


def assert_causal_invariance(
    fn: Callable,
    inputs: Mapping[str, Any],
    *,
    sequences: Sequence[str] | None = None,
    steps: Sequence[int] | None = None,
    time_axes: int | Sequence[int | None] = 1,
    call_kwargs: Mapping[str, Any] | None = None,
    atol: float | None = None,
    seed: int = 0,
    jit_compile: bool = False,
) -> None:
    """Asserts that changing the inputs at steps `>= t` changes no output before `t`.

    Args:
        fn, inputs, call_kwargs, jit_compile: see the module docstring.
        sequences: names of the inputs changed from step `t` on (axis 1); by
            default every non-boolean input of rank >= 2. They must share
            their length `T >= 2`.
        steps: the values of `t` to try; by default `1`, `T // 2` and `T - 1`.
        time_axes: the step axis of the outputs: an int for all of them, or
            one entry per (flattened) output, `None` to skip that output
            (e.g. `(1, 2)` for an output `(B, T, d)` and weights
            `(B, heads, T, T)`).
        atol: tolerance; `None` picks one by dtype.
        seed: of the new values.

    Returns:
        None. Raises `AssertionError` when a future step changed the past.

    Example:

    >>> from keras_attn import testing
    >>> x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    >>> testing.assert_causal_invariance(
    ...     keras_attn.ScaledDotAttention(), {"query": x, "value": x},
    ...     call_kwargs={"use_causal_mask": True})
    """
    inputs = _as_arrays(inputs)
    if sequences is None:
        sequences = [n for n, v in inputs.items() if v.dtype != bool and v.ndim >= 2]
    lengths = {name: inputs[name].shape[1] for name in sequences}
    if len(set(lengths.values())) != 1 or min(lengths.values()) < 2:
        raise ValueError(f"`sequences` must share one length T >= 2 on axis 1. Received: {lengths}")
    length = next(iter(lengths.values()))
    steps = sorted({1, length // 2, length - 1}) if steps is None else list(steps)
    runner = _Runner(fn, call_kwargs, jit_compile)
    reference = runner(inputs)
    tol = _tolerance(atol, runner.dtypes)
    axes = [time_axes] * len(reference) if isinstance(time_axes, int) else list(time_axes)
    if len(axes) != len(reference):
        raise ValueError(
            f"`time_axes` needs one entry per output ({len(reference)}). Received: {time_axes}"
        )
    rng = np.random.default_rng(seed)
    for t in steps:
        future = np.zeros(inputs[sequences[0]].shape[:2], bool)
        future[:, t:] = True
        changed = dict(inputs)
        for name in sequences:
            changed[name] = _perturb(inputs[name], future, rng)
        outputs = runner(changed)
        pairs = [(o.take(range(t), a), r.take(range(t), a)) for o, r, a in
                 zip(outputs, reference, axes, strict=True) if a is not None]  # fmt: skip
        what = f"Causal invariance: changing steps >= {t} of {sequences} changed an earlier output"
        _compare(what, [p[0] for p in pairs], [p[1] for p in pairs], tol)


def assert_batch_invariance(
    fn: Callable,
    inputs: Mapping[str, Any],
    *,
    examples: Sequence[int] | None = None,
    call_kwargs: Mapping[str, Any] | None = None,
    atol: float | None = None,
    jit_compile: bool = False,
) -> None:
    """Asserts that each example's output does not depend on the rest of its batch.

    The batch is run reversed, and each example in `examples` alone (a batch
    of one); every output (batch on axis 0) must equal the full batch's.
    Run it in inference: in training, random layers draw per batch.

    Args:
        fn, inputs, call_kwargs, jit_compile: see the module docstring.
            At least two examples.
        examples: indices of the examples run alone; by default all.
        atol: tolerance; `None` picks one by dtype.

    Returns:
        None. Raises `AssertionError` when an output depends on other examples.

    Example:

    >>> from keras_attn import testing
    >>> x = np.random.default_rng(0).normal(size=(3, 4, 8)).astype("float32")
    >>> testing.assert_batch_invariance(keras_attn.AttentionPooling(units=4), {"inputs": x})
    """
    inputs = _as_arrays(inputs)
    batch = _batch_size(inputs)
    if batch < 2:
        raise ValueError(f"`inputs` needs at least 2 examples. Received: batch size {batch}")
    runner = _Runner(fn, call_kwargs, jit_compile)
    reference = runner(inputs)
    tol = _tolerance(atol, runner.dtypes)
    order = np.arange(batch)[::-1]
    reversed_outputs = runner({name: v[order] for name, v in inputs.items()})
    _compare(
        "Batch invariance: reversing the batch changed an example's output",
        [out[np.argsort(order)] for out in reversed_outputs],
        reference,
        tol,
    )
    for i in range(batch) if examples is None else examples:
        alone = runner({name: v[i : i + 1] for name, v in inputs.items()})
        _compare(
            f"Batch invariance: example {i} alone differs from example {i} in the batch",
            alone,
            [out[i : i + 1] for out in reference],
            tol,
        )
