"""keras_attn.ops against NumPy references and hand-computed cases."""

import dataclasses
import warnings

import keras
import numpy as np
import pytest

from keras_attn import ops
from layer_checks import compiled, dtype_of, value_and_grads
from numpy_reference import (
    additive_scores,
    attend,
    bilinear_scores,
    causal,
    dot_scores,
    scaled_dot_scores,
    softmax_masked,
)

rng = np.random.default_rng(0)
Q = rng.normal(size=(2, 3, 4)).astype("float32")
K = rng.normal(size=(2, 5, 4)).astype("float32")
V = rng.normal(size=(2, 5, 6)).astype("float32")


def np_(x):
    """float32 (or bool) NumPy array of a tensor of any dtype."""
    x = keras.ops.convert_to_tensor(x)
    return keras.ops.convert_to_numpy(x if dtype_of(x) == "bool" else keras.ops.cast(x, "float32"))


def test_scores_match_numpy():
    np.testing.assert_allclose(np_(ops.dot_score(Q, K)), dot_scores(Q, K), atol=1e-5)
    np.testing.assert_allclose(np_(ops.scaled_dot_score(Q, K)), scaled_dot_scores(Q, K), atol=1e-5)
    np.testing.assert_allclose(
        np_(ops.scaled_dot_score(Q, K, scale=0.3)), dot_scores(Q, K) * 0.3, atol=1e-5
    )
    U = rng.normal(size=(4, 7)).astype("float32")
    W = rng.normal(size=(4, 7)).astype("float32")
    v = rng.normal(size=(7,)).astype("float32")
    np.testing.assert_allclose(
        np_(ops.additive_score(Q @ U, K @ W, v)), additive_scores(Q, K, U, W, v), atol=1e-5
    )
    kernel = rng.normal(size=(4, 6)).astype("float32")  # query width 4, key width 6
    np.testing.assert_allclose(
        np_(ops.bilinear_score(Q, V, kernel)), bilinear_scores(Q, V, kernel), atol=1e-4
    )


def test_hand_computed_case():
    # One query [1, 0]; keys [1, 0], [0, 1], [1, 1]; scores 1, 0, 1; key 3 masked.
    q = np.array([[[1.0, 0.0]]], "float32")
    k = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]], "float32")
    v = np.array([[[10.0], [20.0], [30.0]]], "float32")
    mask = np.array([[[True, True, False]]])
    out, w = ops.attention(q, k, v, mask=mask, scale=1.0)
    e = np.e
    np.testing.assert_allclose(np_(w)[0, 0], [e / (e + 1), 1 / (e + 1), 0.0], atol=1e-6)
    np.testing.assert_allclose(np_(out)[0, 0, 0], (10 * e + 20) / (e + 1), atol=1e-5)


def test_attention_matches_numpy_with_masks_and_heads():
    q = rng.normal(size=(2, 3, 4, 8)).astype("float32")  # (B, H, Tq, dk)
    k = rng.normal(size=(2, 3, 6, 8)).astype("float32")
    v = rng.normal(size=(2, 3, 6, 5)).astype("float32")
    mask = rng.random((2, 1, 4, 6)) > 0.4
    mask[0, 0, 1] = False  # a row with nothing visible
    out, w = ops.attention(q, k, v, mask=mask, is_causal=True)
    full = mask & causal(4, 6)
    ref_out, ref_w = attend(scaled_dot_scores(q, k), v, full)
    np.testing.assert_allclose(np_(w), ref_w, atol=1e-5)
    np.testing.assert_allclose(np_(out), ref_out, atol=1e-5)
    assert np.all(np_(w)[0, :, 1] == 0) and np.all(np_(out)[0, :, 1] == 0)


def test_causal_mask_end_aligned():
    np.testing.assert_array_equal(np_(ops.causal_mask(3)), np.tril(np.ones((3, 3), bool)))
    # Tq=2 last positions of Tv=4: query 0 sees keys 0..2, query 1 sees 0..3.
    np.testing.assert_array_equal(np_(ops.causal_mask(2, 4)), [[1, 1, 1, 0], [1, 1, 1, 1]])


def test_compute_attention_mask_merges_everything():
    qm = np.array([[1, 1, 0]], bool)
    vm = np.array([[1, 0, 1]], bool)
    am = np.array([[[1, 1, 1], [0, 1, 1], [1, 1, 1]]], bool)
    got = np_(ops.compute_attention_mask(3, 3, qm, vm, am, use_causal_mask=True))
    expected = qm[:, :, None] & vm[:, None, :] & am & causal(3, 3)
    np.testing.assert_array_equal(np.broadcast_to(got, expected.shape), expected)
    assert ops.compute_attention_mask(3, 3) is None
    assert ops.merge_masks(None, None) is None


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_masked_softmax_fully_masked_rows_and_large_scores(dtype):
    # Scores far beyond the float16 range of a -1e9 fill: still exact zeros, no NaN.
    scores = np.array([[3e4, -3e4, 1.0], [5.0, 6.0, 7.0]], "float32")
    mask = np.array([[True, False, True], [False, False, False]])
    x = keras.ops.cast(scores, dtype)
    w, (grad,) = value_and_grads(
        lambda x: ops.masked_softmax(x, mask), [x], cotangent=[[1.0, 2.0, 3.0]]
    )
    assert dtype_of(w) == dtype
    np.testing.assert_allclose(np_(w), softmax_masked(np_(x).astype("float64"), mask), atol=1e-3)
    assert np.all(np_(w)[1] == 0)
    assert np.all(np.isfinite(np_(grad)))


def test_masked_softmax_integer_mask_and_no_mask():
    s = rng.normal(size=(2, 4)).astype("float32")
    np.testing.assert_allclose(np_(ops.masked_softmax(s)), softmax_masked(s), atol=1e-6)
    m = np.array([[1, 0, 1, 1], [0, 0, 1, 0]], "int32")
    np.testing.assert_allclose(
        np_(ops.masked_softmax(s, m)), softmax_masked(s, m.astype(bool)), atol=1e-6
    )


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_float_masks_of_0s_and_1s_are_read_as_keras_reads_them_eager_and_compiled(dtype):
    # 1 = attend, 0 = masked (Keras casts a float mask to bool); the last row sees nothing.
    s = rng.normal(size=(3, 4)).astype("float32")
    keep = np.array([[1, 0, 1, 1], [0, 0, 1, 0], [0, 0, 0, 0]], bool)
    mask = keep.astype(dtype)
    expected = softmax_masked(s, keep)
    for w in (ops.masked_softmax(s, mask), compiled(ops.masked_softmax)(s, mask)):
        np.testing.assert_allclose(np_(w), expected, atol=1e-6)
        assert np.all(np_(w)[~keep] == 0) and np.all(np.isfinite(np_(w)))
    seen = rng.random((2, 3, 5)) > 0.4  # (B, Tq, Tv)
    seen[1, 2] = False  # a query that sees no key
    ref, ref_w = attend(scaled_dot_scores(Q, K), V, seen)
    attention = compiled(lambda q, k, v, m: ops.attention(q, k, v, mask=m))
    for out, w in (ops.attention(Q, K, V, mask=seen.astype(dtype)),
                   attention(Q, K, V, seen.astype(dtype))):  # fmt: skip
        np.testing.assert_allclose(np_(w), ref_w, atol=1e-6)
        np.testing.assert_allclose(np_(out), ref, atol=1e-5)
        assert np.all(np_(out)[1, 2] == 0)


def test_a_float_mask_other_than_0_and_1_raises_eagerly_and_masks_everything_compiled():
    s = rng.normal(size=(2, 4)).astype("float32")
    additive = np.array([[0, -1e9, 0, 0], [-1e9, -1e9, 0, -1e9]], "float32")
    with pytest.raises(ValueError, match=r"`mask` must be a boolean mask.*holding -1e\+09"):
        ops.masked_softmax(s, additive)
    with pytest.raises(ValueError, match=r"`mask` .*holding nan"):
        ops.masked_softmax(s, np.array([[1, np.nan, 1, 0]] * 2, "float32"))
    if keras.backend.backend() == "torch":  # no tracing on torch: the values are always known
        return
    # Traced, the values are unknown: read as `mask > 0.5`, the additive mask hides every key,
    # and every row gives zero weights (never NaN).
    w = np_(compiled(ops.masked_softmax)(s, additive))
    assert np.all(w == 0)


def test_one_key_gives_weight_one_or_zero_without_a_warning():
    # One key (a decoder's first step): weight 1 if visible, 0 if masked, NaN for a NaN
    # score, gradient 0; and no warning from Keras about a softmax over one element.
    scores = np.array([[[0.3], [-2.0], [np.nan]]], "float32")  # (1, 3, 1)
    mask = np.array([[[True], [False], [True]]])
    with warnings.catch_warnings():  # the calls only: torch's `__array__` warns on NumPy 2
        warnings.simplefilter("error")
        weights = ops.masked_softmax(scores, mask)
        plain = ops.masked_softmax(scores[:, :2])
        out, _ = ops.attention(np.ones((1, 2, 4), "float32"), *[np.ones((1, 1, 4), "float32")] * 2)
    weights, plain = np_(weights), np_(plain)
    np.testing.assert_array_equal(weights[0, :2, 0], [1.0, 0.0])
    assert np.isnan(weights[0, 2, 0])
    np.testing.assert_array_equal(plain, np.ones((1, 2, 1)))
    np.testing.assert_allclose(np_(out), np.ones((1, 2, 4)), atol=1e-6)
    _, grads = value_and_grads(lambda x: ops.masked_softmax(x * 3.0), [scores[:, :2]])
    np.testing.assert_array_equal(np_(grads[0]), np.zeros((1, 2, 1)))


def test_dropout_never_reopens_masked_positions():
    q = rng.normal(size=(2, 6, 4)).astype("float32")
    _, w = ops.attention(q, q, q, is_causal=True, dropout_rate=0.5, training=True, seed=1)
    w = np_(w)
    assert np.all(w[:, ~causal(6, 6)] == 0)
    assert np.any(w == 0) and np.any(w > 1.0 / 6)  # dropout did act (zeros, rescaling)
    _, w_eval = ops.attention(q, q, q, dropout_rate=0.5, training=False)
    np.testing.assert_allclose(np_(w_eval).sum(-1), 1.0, atol=1e-5)


def test_chosen_positions_mask_hand_computed():
    got = np_(ops.chosen_positions_mask(np.array([[2, 0, 1]]), 4))
    expected = [[[1, 1, 1, 1], [1, 1, 0, 1], [0, 1, 0, 1]]]
    np.testing.assert_array_equal(got, np.array(expected, bool))


def test_width_mismatch_errors_name_the_arguments():
    with pytest.raises(ValueError, match=r"`query` and `key`.*query.shape=\(2, 3, 4\)"):
        ops.dot_score(Q, V)
    with pytest.raises(ValueError, match="`kernel` must have shape"):
        ops.bilinear_score(Q, V, np.ones((4, 4), "float32"))


@pytest.mark.xla
def test_jit_compile_gives_same_result():
    fn = compiled(lambda q, k, v: ops.attention(q, k, v, is_causal=True))
    out_jit, _ = fn(Q, K, V)
    out, _ = ops.attention(Q, K, V, is_causal=True)
    np.testing.assert_allclose(np_(out_jit), np_(out), atol=1e-5)


@pytest.mark.parametrize("implementation", ["dense", "fused", "chunked", "backend"])
def test_jax_jit_over_numpy_inputs_with_a_traced_mask_or_bias(implementation):
    """NumPy query, key and value inside `jax.jit`: the non-finite guard looked at their
    values (concrete) with ops that `jax.jit` traces, and raised TracerBoolConversionError."""
    jax = pytest.importorskip("jax")
    if keras.backend.backend() != "jax":
        pytest.skip("jax.jit traces only the JAX backend's ops")
    mask = rng.random((2, 3, 5)) > 0.3
    bias = rng.normal(size=(2, 3, 5)).astype("float32")

    def attention(**kwargs):
        return ops.attention(Q, K, V, implementation=implementation, return_weights=False,
                             **kwargs)[0]  # fmt: skip

    calls = [
        (lambda m: attention(mask=m), (mask,), dict(mask=mask)),
        (lambda b: attention(bias=b), (bias,), dict(bias=bias)),
        (lambda m, b: attention(mask=m, bias=b), (mask, bias), dict(mask=mask, bias=bias)),
        (lambda: attention(mask=mask, bias=bias), (), dict(mask=mask, bias=bias)),
    ]
    for fn, args, kwargs in calls:
        expected, _ = attend(scaled_dot_scores(Q, K) + kwargs.get("bias", 0.0), V, kwargs["mask"]
                             if "mask" in kwargs else None)  # fmt: skip
        np.testing.assert_allclose(np_(jax.jit(fn)(*args)), expected, atol=1e-5)


@pytest.mark.parametrize(
    "keywords",
    [dict(mask=None), dict(is_causal=False, training=False), dict(bias=np.zeros((3, 5), "f4"))],
)
def test_a_spec_with_any_keyword_it_replaces_raises_naming_them(keywords):
    """A keyword passed with `spec=`, even one equal to its default, would be dropped."""
    spec = ops.AttentionSpec(is_causal=True)
    names = ", ".join(keywords)
    with pytest.raises(ValueError, match=rf"`spec` replaces .*Received: spec and {names}$"):
        ops.attention(Q, K, V, spec=spec, **keywords)
    out, _ = ops.attention(Q, K, V, spec=spec, implementation="dense", flash_attention=False)
    np.testing.assert_allclose(np_(out), np_(ops.attention(Q, K, V, is_causal=True)[0]))


def test_the_kernels_table_lists_every_kernel_and_auto_tries_them_by_rank():
    from keras_attn import kernels

    assert ops.IMPLEMENTATIONS == kernels.IMPLEMENTATIONS == ("auto", *kernels.KERNELS)
    assert ops.IMPLEMENTATIONS == ("auto", "dense", "fused", "chunked", "backend")
    auto_order = [kernel.name for kernel in kernels.registry._ordered()]
    assert auto_order == ["backend", "chunked", "fused", "dense"]
    taken = dataclasses.replace(kernels.KERNELS["fused"], name="mine")
    with pytest.raises(ValueError, match=r"Kernel 'mine' takes auto_rank=2, which kernel 'fused'"):
        kernels.registry.register(taken)
    assert list(kernels.KERNELS) == ["dense", "fused", "chunked", "backend"]
