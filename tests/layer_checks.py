"""The shared layer-check helper: every public layer goes through `check_layer`.

It never branches on the layer's type; what differs between layers is described
by the arguments (inputs, masks and which inputs they cover, call options).
`compiled` and `value_and_grads` give the tests one way to compile and to take
gradients on the TensorFlow, JAX and torch backends.
"""

import keras
import numpy as np

from keras_attn import testing
from keras_attn.models.training import build_for_fit
from keras_attn.testing import _support


def dtype_of(tensor):
    """The dtype's Keras name (`"float16"`): torch tensors have `torch.float16`."""
    return keras.backend.standardize_dtype(tensor.dtype)


def compiled(function):
    """`function` compiled with XLA: `tf.function(jit_compile=True)`, or `jax.jit` on JAX.

    On JAX the Keras variables `function` reads are baked in as constants
    when it is first traced: build layers first, and do not change their
    weights afterwards. torch has no XLA: there `function` runs as it is, eagerly
    (a test of what only XLA does is marked `xla`, and skipped on torch).
    """
    if keras.backend.backend() == "torch":
        return function
    return _support._compile(function)


def value_and_grads(function, sources, variables=(), cotangent=None, jit=False):
    """`(outputs, gradients)`: `outputs = function(*sources)` and the gradients of a loss.

    The loss is `sum(float32(first output) * cotangent)` with a `cotangent`,
    `sum(float32(output) ** 2)` over every output otherwise; the gradients are
    with respect to `sources` (float tensors), then `variables` (e.g.
    `layer.trainable_weights`). `jit` compiles the step. One call: outputs
    drawn at random (dropout, sampling) are those the gradients belong to.
    """
    cotangent = None if cotangent is None else keras.ops.convert_to_tensor(cotangent, "float32")

    def loss(outputs):
        if cotangent is not None:
            first = _as_list(outputs)[0]
            return keras.ops.sum(keras.ops.cast(first, "float32") * cotangent)
        squares = [keras.ops.sum(keras.ops.cast(t, "float32") ** 2) for t in _as_list(outputs)]
        return sum(squares, keras.ops.zeros(()))

    sources = [keras.ops.convert_to_tensor(x) for x in sources]
    return _support._value_and_gradients(function, sources, variables, loss, jit)


def _as_list(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _assert_all_close(actual, expected, atol, msg):
    for a, e in zip(_as_list(actual), _as_list(expected), strict=True):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(a),
            keras.ops.convert_to_numpy(e),
            atol=atol,
            rtol=atol,
            err_msg=msg,
        )


def _functional_model(layer, inputs, masks, call_kwargs):
    """A functional model with one `keras.Input` per array in inputs and masks."""
    symbolic = {
        name: keras.Input(shape=value.shape[1:], dtype=str(value.dtype), name=name)
        for name, value in {**inputs, **masks}.items()
    }
    outputs = layer(**symbolic, **call_kwargs)
    return keras.Model(symbolic, outputs), symbolic


def check_layer(
    make_layer,
    inputs,
    *,
    tmp_path,
    masks=None,
    mask_covers=None,
    call_kwargs=None,
    causal=False,
    output_mask=None,
    expect_trainable=True,
    mixed_precision=("mixed_float16", "mixed_bfloat16"),
    atol=1e-5,
):
    """Runs the common checks on a layer.

    Args:
        make_layer: callable `(**kwargs) -> layer`, e.g.
            `functools.partial(AdditiveAttention, units=8)`; called again with
            `dtype=` for the mixed-precision check.
        inputs: ordered dict `call argument name -> np.ndarray`.
        tmp_path: a directory for the saved files.
        masks: dict `mask argument name -> bool np.ndarray` passed with the call.
        mask_covers: dict `mask argument name -> names of the inputs it pads`;
            the padded positions of those inputs are perturbed and the output
            must not change at all.
        call_kwargs: other call arguments (`use_causal_mask=True`, ...).
        causal: changing every input at positions `>= t` (axis 1) must leave
            the outputs before `t` unchanged.
        output_mask: name of a mask in `masks`; the mask-invariance check then
            compares outputs only where it is `True` (for layers whose padded
            rows carry a residual of the padded input, such as Transformer
            blocks). By default every output value must stay the same.
        expect_trainable: the layer has trainable weights and one `fit` step
            must lower the loss.
        mixed_precision: policies under which the output must stay finite and
            close to float32 with the same weights.
    """
    keras.utils.set_random_seed(1234)
    rng = np.random.default_rng(0)
    masks = masks or {}
    mask_covers = mask_covers or {}
    call_kwargs = call_kwargs or {}
    feed = {**inputs, **masks}

    # 1. Config round trip (class and generic Keras serialization).
    layer = make_layer()
    config = layer.get_config()
    assert layer.__class__.from_config(config).get_config() == config
    revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(revived) is type(layer) and revived.get_config() == config

    # 2. Eager call agrees with compute_output_shape and with the symbolic call.
    eager = layer(**feed, **call_kwargs)
    shape_args = [v.shape for v in inputs.values()]
    if not isinstance(eager, (tuple, list)):
        assert tuple(layer.compute_output_shape(*shape_args)) == tuple(eager.shape)
    for out in _as_list(eager):
        assert np.all(np.isfinite(keras.ops.convert_to_numpy(out)))
    model, _ = _functional_model(layer, inputs, masks, call_kwargs)
    for sym, out in zip(_as_list(model.outputs), _as_list(eager), strict=True):
        assert tuple(sym.shape)[1:] == tuple(out.shape)[1:], (sym.shape, out.shape)
        assert tuple(sym.shape)[0] in (None, out.shape[0])
    reference = model(feed)
    _assert_all_close(reference, eager, atol, "functional model differs from eager call")

    # 3. Mask invariance: padded content changes nothing (visible).
    for mask_name, covered in mask_covers.items():
        testing.assert_padding_invariance(
            model, feed, {name: mask_name for name in covered}, output_mask=output_mask, atol=atol
        )

    # 4. Causal invariance: the future does not reach the past.
    if causal:
        testing.assert_causal_invariance(model, feed, sequences=list(inputs), atol=atol)

    # 5, 6. `.keras` reload with safe_mode=True (no custom_objects), SavedModel export
    # (TensorFlow's format: checked on the TensorFlow backend).
    formats = ("keras", "saved_model") if keras.backend.backend() == "tensorflow" else ("keras",)
    testing.assert_save_reload_equal(
        model, feed, directory=str(tmp_path), formats=formats, atol=atol
    )

    # 7. One fit step lowers the loss (on the first output).
    assert bool(layer.trainable_weights) == expect_trainable, layer.trainable_weights
    if expect_trainable:
        first = _as_list(model.outputs)[0]
        train_model = keras.Model(model.inputs, first)
        train_model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        target = rng.normal(
            size=(first.shape[0] or len(next(iter(inputs.values()))),) + tuple(first.shape[1:])
        ).astype("float32")
        build_for_fit(train_model, (feed, target))  # TensorFlow: each step traced once
        before = train_model.evaluate(feed, target, verbose=0)
        train_model.fit(feed, target, epochs=1, batch_size=len(target), verbose=0)
        after = train_model.evaluate(feed, target, verbose=0)
        assert after < before, (before, after)

    # 8. Mixed precision: finite, close to float32 with the same weights.
    full = layer(**feed, **call_kwargs)  # after the fit step changed the weights
    for policy in mixed_precision:
        low = make_layer(dtype=policy)
        low(**feed, **call_kwargs)
        low.set_weights(layer.get_weights())
        out_low = low(**feed, **call_kwargs)
        for a, b in zip(_as_list(out_low), _as_list(full), strict=True):
            a = keras.ops.convert_to_numpy(keras.ops.cast(a, "float32"))
            assert np.all(np.isfinite(a)), policy
            scale = max(1.0, float(np.abs(keras.ops.convert_to_numpy(b)).max()))
            np.testing.assert_allclose(
                a, keras.ops.convert_to_numpy(b), atol=0.05 * scale, err_msg=policy
            )
    return layer


def check_fully_masked_rows(layer, inputs, empty_example, *, jit=False, **call_kwargs):
    """A row with no visible key outputs zeros, and every gradient stays finite.

    Args:
        layer: the layer, built or not, in any dtype policy.
        inputs: ordered dict `call argument name -> float np.ndarray`; the
            gradient is taken with respect to each of them and to the weights.
        empty_example: index of the example whose masks leave nothing visible
            (its output must be exactly zero).
        jit: run the step compiled with XLA (`tf.function(jit_compile=True)`, `jax.jit`).
        **call_kwargs: masks and other call arguments.
    """
    testing.assert_fully_masked_rows_safe(
        layer, inputs, empty=empty_example, call_kwargs=call_kwargs, jit_compile=jit
    )
    assert dtype_of(layer(**inputs, **call_kwargs)) == layer.compute_dtype
