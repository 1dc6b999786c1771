"""The backend's kernel (`keras.ops.dot_product_attention`) keeps our semantics; who picks it.

On the CPU the kernel is forced (`implementation="backend"`): TensorFlow's
composition, JAX's XLA implementation, torch's SDPA. Its values and
gradients equal the dense path's and a NumPy reference's; the choice of
`"auto"` per backend and device is tested with an injected device.
"""

import dataclasses

import keras
import numpy as np
import pytest
from kernel_calls import run

import keras_attn
import layer_checks
from keras_attn import kernels, ops
from keras_attn.kernels import backend as kernel_backend
from numpy_reference import alibi, attend, band, causal, scaled_dot_scores

rng = np.random.default_rng(0)


def np_(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def qkv(tq=7, tv=9, lead=(2, 3), dk=8, dv=5):
    shapes = [(*lead, tq, dk), (*lead, tv, dk), (*lead, tv, dv)]
    return [rng.normal(size=s).astype("float32") for s in shapes]


def path(implementation, **kwargs):
    def attend_fn(q, k, v, *bias):
        out, _ = ops.attention(
            q, k, v, implementation=implementation, return_weights=False,
            bias=bias[0] if bias else None, **kwargs,
        )  # fmt: skip
        return out

    return attend_fn


def value_and_grads(fn, sources, cotangent, jit=False):
    """NumPy output and d(sum(output * cotangent)) / d(sources); torch's autograd on torch."""
    if keras.backend.backend() != "torch":
        out, grads = layer_checks.value_and_grads(fn, sources, (), cotangent, jit=jit)
        return np_(out), [np_(g) for g in grads]
    import torch

    xs = [keras.ops.convert_to_tensor(x).detach().requires_grad_(True) for x in sources]
    out = fn(*xs)
    loss = torch.sum(out.float() * keras.ops.convert_to_tensor(cotangent))
    grads = torch.autograd.grad(loss, xs, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, xs, strict=True)]
    return np_(out.detach()), [np_(g) for g in grads]


def padding(lead, tv, lengths):
    """`(B, 1, ..., 1, Tv)`: example `b` has `lengths[b]` real keys."""
    mask = np.arange(tv) < np.asarray(lengths)[:, None]
    return mask.reshape(len(lengths), *(1,) * len(lead), tv)


def full_mask(tq, tv, lead, density=0.6):
    mask = rng.random((lead[0], 1, tq, tv)) < density if len(lead) == 2 else None
    return mask if mask is not None else rng.random((lead[0], tq, tv)) < density


# (tq, tv, lead, mask kind, call arguments, numpy mask of the positions)
CASES = {
    "plain": (7, 9, (2, 3), None, {}, None),
    "padding": (7, 9, (2, 3), "padding", {}, None),
    "causal Tq == Tv (Keras' is_causal)": (9, 9, (2, 3), "padding", {"is_causal": True},
                                            causal(9, 9)),
    "causal Tq < Tv, end-aligned": (7, 9, (2, 3), "padding", {"is_causal": True}, causal(7, 9)),
    "causal Tq > Tv: rows with no key": (9, 7, (2, 3), None, {"is_causal": True}, causal(9, 7)),
    "cached step, query_start": (2, 9, (2, 3), "padding", {"is_causal": True, "query_start": 4},
                                 np.arange(2)[:, None] + 4 >= np.arange(9)[None]),
    "(B, Tq, Tv) mask, rank 3": (7, 9, (2,), "full", {}, None),
    "(B, 1, Tq, Tv) mask, rank 4": (7, 9, (2, 3), "full", {"is_causal": True}, causal(7, 9)),
    "window": (7, 9, (2, 3), "padding", {"is_causal": True, "window": 3},
               causal(7, 9) & band(7, 9, 3)),
    "rank 5": (4, 6, (2, 2, 3), "padding", {"is_causal": True}, causal(4, 6)),
    "(Tv,) mask, rank 1": (7, 9, (2, 3), "keys", {}, None),
    "(Tv,) mask, rank 1, causal": (7, 9, (2, 3), "keys", {"is_causal": True}, causal(7, 9)),
}  # fmt: skip


def _case(name):
    tq, tv, lead, kind, kwargs, positions = CASES[name]
    mask = {None: None, "padding": lambda: padding(lead, tv, [tv, tv - 4]),
            "full": lambda: full_mask(tq, tv, lead),
            "keys": lambda: np.arange(tv) % 3 != 1}[kind]  # fmt: skip
    mask = mask() if callable(mask) else mask
    return tq, tv, lead, mask, kwargs, positions


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_equal_dense_and_numpy(name):
    tq, tv, lead, mask, kwargs, positions = _case(name)
    q, k, v = qkv(tq, tv, lead)
    cotangent = rng.normal(size=(*lead, tq, 5)).astype("float32")
    out, grads = value_and_grads(path("backend", mask=mask, **kwargs), (q, k, v), cotangent)
    ref, ref_grads = value_and_grads(path("dense", mask=mask, **kwargs), (q, k, v), cotangent)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    for a, b in zip(grads, ref_grads, strict=True):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=1e-5)
    visible = np.ones((tq, tv), bool) if positions is None else positions
    visible = visible if mask is None else visible & mask
    numpy_out, _ = attend(scaled_dot_scores(q, k), v, visible)
    np.testing.assert_allclose(out, numpy_out, atol=1e-5)


def test_compiled_values_and_gradients_equal_dense():
    q, k, v = qkv()
    mask = padding((2, 3), 9, [9, 3])
    cotangent = rng.normal(size=(2, 3, 7, 5)).astype("float32")
    call = {"mask": mask, "is_causal": True}
    out, grads = value_and_grads(path("backend", **call), (q, k, v), cotangent, jit=True)
    ref, ref_grads = value_and_grads(path("dense", **call), (q, k, v), cotangent)
    for a, b in zip([out, *grads], [ref, *ref_grads], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_bias_tensor_and_position_bias_values_and_gradients():
    q, k, v = qkv()
    bias = rng.normal(size=(1, 3, 7, 9)).astype("float32")
    mask = padding((2, 3), 9, [9, 5])
    cotangent = rng.normal(size=(2, 3, 7, 5)).astype("float32")
    call = {"mask": mask, "is_causal": True}
    out, grads = value_and_grads(path("backend", **call), (q, k, v, bias), cotangent)
    ref, ref_grads = value_and_grads(path("dense", **call), (q, k, v, bias), cotangent)
    for a, b in zip([out, *grads], [ref, *ref_grads], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert np.all(grads[3][..., ~causal(7, 9)] == 0)  # the future: masked in every example
    # ALiBi, evaluated whole: against NumPy's formula.
    out, _ = ops.attention(q, k, v, mask=mask, is_causal=True, implementation="backend",
                           return_weights=False, bias=keras_attn.AlibiBias())  # fmt: skip
    scores = scaled_dot_scores(q, k) + alibi(3, 7, 9)
    np.testing.assert_allclose(np_(out), attend(scores, v, causal(7, 9) & mask)[0], atol=1e-5)


@pytest.mark.parametrize("lead", [(2, 3), (2,), ()])
@pytest.mark.parametrize("with_mask", [False, True])
def test_a_rank_1_bias_broadcasts_as_documented(lead, with_mask):
    """A `(Tv,)` bias (torch's SDPA refused it next to rank-4 inputs), with a `(Tv,)` mask."""
    q, k, v = qkv(lead=lead)
    bias = rng.normal(size=(9,)).astype("float32")
    mask = np.arange(9) % 4 != 2 if with_mask else None
    cotangent = rng.normal(size=(*lead, 7, 5)).astype("float32")
    out, grads = value_and_grads(path("backend", mask=mask), (q, k, v, bias), cotangent)
    ref, ref_grads = value_and_grads(path("dense", mask=mask), (q, k, v, bias), cotangent)
    for a, b in zip([out, *grads], [ref, *ref_grads], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    numpy_out, _ = attend(scaled_dot_scores(q, k) + bias, v, mask)
    inference = np_(path("backend", mask=mask)(q, k, v, bias))  # no gradient: SDPA's own kernel
    for a in (out, inference):
        np.testing.assert_allclose(a, numpy_out, atol=1e-5)


def test_a_float32_bias_on_bfloat16_inputs_is_added_in_float32():
    """A bias of 300 + N(0, 1) rounded to bfloat16 (steps of 2) moved the weights: max error
    0.80 against the dense kernel's 0.0085 (Keras' op and SDPA take the bias in the inputs'
    dtype)."""
    q, k, v = (keras.ops.convert_to_tensor(x, "bfloat16") for x in qkv())
    bias = (300 + rng.normal(size=(1, 3, 7, 9))).astype("float32")
    mask = padding((2, 3), 9, [9, 5])
    out = np_(path("backend", mask=mask, is_causal=True)(q, k, v, bias))
    dense = np_(path("dense", mask=mask, is_causal=True)(q, k, v, bias))
    q64, k64, v64 = (np_(x).astype("float64") for x in (q, k, v))
    ref, _ = attend(scaled_dot_scores(q64, k64) + bias, v64, mask & causal(7, 9))
    assert np.abs(dense - ref).max() < 0.03
    np.testing.assert_allclose(out, ref, atol=0.03)


@pytest.mark.parametrize("content", [1e30, np.inf, np.nan])
def test_hostile_masked_keys_and_values_change_nothing(content):
    q, k, v = qkv()
    mask = padding((2, 3), 9, [9, 6])  # example 1: keys 6, 7, 8 are padding
    bad_k, bad_v = k.copy(), v.copy()
    bad_k[1, :, 6:] = content
    bad_v[1, :, 7:] = -content
    cotangent = rng.normal(size=(2, 3, 7, 5)).astype("float32")
    fn = path("backend", mask=mask, is_causal=True)
    out, grads = value_and_grads(fn, (q, bad_k, bad_v), cotangent)
    ref, ref_grads = value_and_grads(fn, (q, k, v), cotangent)
    for a, b in zip([out, *grads], [ref, *ref_grads], strict=True):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("with_bias", [False, True])
def test_float16_logit_overflow_at_a_causally_masked_key_gets_no_weight(with_bias):
    """A key that later rows see (so not zeroed as padding) and whose logit overflows float16
    for an earlier row, for which the causal mask hides it: that row still sees only its own
    keys. (Keras' torch op adds a large negative, -45852 in float16, to masked logits.)"""
    q, k, v = (x.astype("float16") for x in qkv(tq=4, tv=4, lead=(1, 2), dk=8, dv=8))
    k[..., 3, :] = 200.0  # q . k = 200 * 200 * 8 for row 0: inf in float16
    q[..., 0, :] = 200.0
    mask = np.array([True, False, True, True])[None, None, None, :]  # key 1 is padding
    bias = (np.zeros((1, 2, 4, 4), "float32"),) if with_bias else ()
    out = np_(path("backend", mask=mask, is_causal=True)(q, k, v, *bias))
    # Row 0 sees key 0 only; row 2 keys 0 and 2 (NumPy, in float64 from the float16 inputs).
    np.testing.assert_allclose(out[..., 0, :], v[..., 0, :].astype("float32"), atol=1e-3)
    scores = scaled_dot_scores(*(x.astype("float64") for x in (q, k)))
    ref = attend(scores, v.astype("float64"), causal(4, 4) & mask)[0]
    np.testing.assert_allclose(out[..., :3, :], ref[..., :3, :], atol=2e-2)


def test_nonfinite_visible_key_makes_the_rows_that_see_it_nan():
    q, k, v = qkv(tq=9, tv=9)
    v[0, 1, 4, 2] = np.nan  # visible to rows 4.. of head 1 under the causal mask
    q, k, v = (keras.ops.convert_to_tensor(x) for x in (q, k, v))
    out = np_(ops.attention(q, k, v, is_causal=True, implementation="backend",
                            return_weights=False)[0])  # fmt: skip
    ref = np_(ops.attention(q, k, v, is_causal=True, implementation="dense")[0])
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    assert np.all(np.isnan(out[0, 1, 4:])) and not np.any(np.isnan(out[0, 1, :4]))
    assert not np.any(np.isnan(out[1])) and not np.any(np.isnan(out[0, 0]))


def test_fully_masked_rows_and_no_keys_give_zeros_with_finite_gradients():
    q, k, v = qkv()
    mask = rng.random((2, 3, 7, 9)) > 0.5
    mask[0, :, 2] = False
    mask[1, 1] = False
    cotangent = rng.normal(size=(2, 3, 7, 5)).astype("float32")
    out, (dq, dk, dv) = value_and_grads(path("backend", mask=mask), (q, k, v), cotangent)
    assert np.all(out[0, :, 2] == 0) and np.all(out[1, 1] == 0)
    assert np.all(dq[0, :, 2] == 0) and np.all(dq[1, 1] == 0)
    assert np.all(dk[1, 1] == 0) and np.all(dv[1, 1] == 0)
    assert all(np.all(np.isfinite(g)) for g in (dq, dk, dv))
    q, k, v = qkv(tv=0)
    out, _ = run(kernels.backend_attention, q, k, v, is_causal=True)
    np.testing.assert_array_equal(np_(out), np.zeros((2, 3, 7, 5)))


# -- the choice -----------------------------------------------------------------------------

SMALL, LARGE = (2, 4, 16, 16), (8, 8, 4096, 4096)  # 2^31 scores: past CHUNKED_MIN_SCORES


PREFERRED = {
    ("jax", "gpu"): True, ("jax", "cpu"): False, ("jax", "tpu"): False,
    ("torch", "cuda"): True, ("torch", "cpu"): kernel_backend.TORCH_CPU, ("torch", "mps"): False,
    ("tensorflow", "gpu"): False, ("tensorflow", "cpu"): False,
}  # fmt: skip


@pytest.mark.parametrize("backend,device", sorted(PREFERRED))
def test_preferred_per_backend_and_device(monkeypatch, backend, device):
    monkeypatch.setattr(kernel_backend, "device_kind", lambda: device)
    monkeypatch.setattr(kernel_backend, "_backend_name", lambda: backend)
    assert kernel_backend.preferred() is PREFERRED[backend, device]


@pytest.mark.parametrize(
    "shape,wanted",
    [
        ((1, 8, 1, 4096), False),  # one query (a cached decoding step): SDPA 1.1-14x slower
        ((8, 8, 1, 2048), False),
        ((None, 8, 1, None), False),
        ((1, 8, 2, 128), True),  # more than one query: SDPA
        ((1, 8, 128, 128), True),
        ((32, 8, 128, 128), True),
        ((1, 8, None, 128), True),  # an unknown number of queries counts as many
        ((None, None, None, None), True),
    ],
)
def test_torch_cpu_takes_sdpa_for_more_than_one_query(monkeypatch, shape, wanted):
    monkeypatch.setattr(kernel_backend, "device_kind", lambda: "cpu")
    monkeypatch.setattr(kernel_backend, "_backend_name", lambda: "torch")
    wanted = wanted and kernel_backend.TORCH_CPU
    assert kernel_backend.preferred(shape) is wanted
    # A cached step's keys are masked (the cache's valid positions).
    spec = kernels.AttentionSpec(mask=np.ones((1, 1, 1, 1), bool), return_weights=False)
    assert kernels.choose(spec, shape).name == ("backend" if wanted else "fused")
    monkeypatch.setattr(kernel_backend, "device_kind", lambda: "cuda")  # any size on CUDA
    assert kernels.choose(spec, shape).name == "backend"


@pytest.mark.parametrize(
    "spec,shape,masked",
    [
        (dict(), (1, 8, 1, 4096), False),  # nothing to mask: SDPA as fast, one op eagerly
        (dict(is_causal=True), (1, 8, 1, 1), False),  # Keras' is_causal is the whole mask
        (dict(is_causal=True), (1, 8, 1, 128), True),  # end-aligned: an explicit mask
        (dict(is_causal=True, query_start=0), (1, 8, 1, 1), False),
        (dict(is_causal=True, query_start=3), (1, 8, 1, 4), True),
        (dict(is_causal=True), (None, 8, 1, None), True),
        (dict(mask=np.ones((1, 1, 1, 4), bool)), (1, 8, 1, 4), True),
        (dict(window=2), (1, 8, 1, 4), True),
        (dict(bias=kernels.AttentionBias(np.zeros((1, 1, 1, 4), "float32"))), (1, 8, 1, 4), True),
    ],
)
def test_torch_cpu_takes_sdpa_for_one_query_without_a_mask(monkeypatch, spec, shape, masked):
    monkeypatch.setattr(kernel_backend, "device_kind", lambda: "cpu")
    monkeypatch.setattr(kernel_backend, "_backend_name", lambda: "torch")
    spec = kernels.AttentionSpec(return_weights=False, **spec)
    assert kernel_backend.sdpa_masked(spec, shape) is masked
    wanted = not masked and kernel_backend.TORCH_CPU
    assert kernel_backend.preferred(shape, masked=masked) is wanted
    assert kernels.choose(spec, shape).name == ("backend" if wanted else "fused")


def test_device_kind_is_keras_default_device():
    kind = kernel_backend.device_kind()
    assert kind in ("cpu", "gpu", "cuda", "tpu", "mps")
    assert kernel_backend.preferred() is PREFERRED.get((keras.backend.backend(), kind), False)
    if keras.backend.backend() == "torch":  # where Keras puts a new tensor, in a scope too
        assert kind == keras.ops.convert_to_tensor(0.0).device.type
        for scope in ("meta", "cpu"):
            with keras.device(scope):
                made = keras.ops.convert_to_tensor(0.0).device.type
                assert kernel_backend.device_kind() == made == scope


def test_a_functional_model_runs_the_kernel_its_device_prefers(monkeypatch):
    """The model is built on torch's "meta" device: that kind is never the one kept."""
    chosen = []
    choose = kernels.choose

    def spy(*args, **kwargs):
        kernel = choose(*args, **kwargs)
        chosen.append(kernel.name)
        return kernel

    monkeypatch.setattr(keras_attn.ops.kernels, "choose", spy)
    x = keras.Input((6, 16))
    model = keras.Model(x, keras_attn.MultiHeadAttention(2, 8)(x, x, use_causal_mask=True))
    chosen.clear()
    model.compile(optimizer="sgd", loss="mse")
    data = np.ones((2, 6, 16), "float32")
    model.train_on_batch(data, data)
    assert kernel_backend.device_kind() in ("cpu", "gpu", "cuda", "tpu", "mps")
    # The step's choice (a symbolic pass on "meta" may come first: it runs nothing).
    assert chosen[-1] == ("backend" if kernel_backend.preferred() else "fused")


@pytest.mark.parametrize("preferred", [False, True])
def test_auto_takes_the_backend_kernel_where_preferred(monkeypatch, preferred):
    monkeypatch.setattr(kernel_backend, "preferred", lambda shape=None, masked=True: preferred)
    choose = ops.choose_implementation
    fast = "backend" if preferred else "fused"
    assert choose("auto", SMALL, 0.0, False, False) == fast
    assert choose("auto", LARGE, 0.0, False, False) == ("backend" if preferred else "chunked")
    # A position bias would be evaluated whole: chunked from CHUNKED_MIN_SCORES scores.
    alibi = kernels.AttentionSpec(bias=kernels.AttentionBias(keras_attn.AlibiBias()),
                                  return_weights=False)  # fmt: skip
    assert kernels.choose(alibi, SMALL).name == fast
    assert kernels.choose(alibi, LARGE).name == "chunked"
    assert choose("auto", (None, 4, None, None), 0.0, False, False) == fast
    # Weights or active dropout: dense, wherever.
    assert choose("auto", SMALL, 0.0, False, True) == "dense"
    assert choose("auto", SMALL, 0.1, True, False) == "dense"
    assert choose("auto", SMALL, 0.1, False, False) == fast  # dropout inactive in inference
    # flash_attention: False keeps auto off it, True forces it.
    assert choose("auto", SMALL, 0.0, False, False, flash_attention=False) == "fused"
    assert choose("auto", LARGE, 0.0, False, False, flash_attention=False) == "chunked"
    assert choose("auto", SMALL, 0.0, False, False, flash_attention=True) == "backend"
    assert choose("backend", SMALL, 0.0, False, False) == "backend"
    for name in ("dense", "fused", "chunked"):
        assert choose(name, SMALL, 0.0, False, False) == name


def test_choice_errors():
    choose = ops.choose_implementation
    with pytest.raises(ValueError, match="implementation='backend' never forms the attention"):
        choose("backend", SMALL, 0.0, False, True)
    with pytest.raises(ValueError, match="implementation='backend' never forms the attention"):
        choose("auto", SMALL, 0.0, False, True, flash_attention=True)
    with pytest.raises(ValueError, match=r"'backend' has no dropout.*Received: dropout rate 0.1"):
        choose("backend", SMALL, 0.1, True, False)
    with pytest.raises(ValueError, match="flash_attention=True runs.*implementation='fused'"):
        choose("fused", SMALL, 0.0, False, False, flash_attention=True)
    with pytest.raises(ValueError, match="flash_attention=False, implementation='backend'"):
        choose("backend", SMALL, 0.0, False, False, flash_attention=False)
    q, k, v = qkv()
    with pytest.raises(ValueError, match="never forms the attention weights"):
        ops.attention(q, k, v, implementation="backend")
    with pytest.raises(ValueError, match="has no dropout"):
        ops.attention(q, k, v, implementation="backend", dropout_rate=0.5, training=True,
                      return_weights=False)  # fmt: skip
    with pytest.raises(ValueError, match="has no dropout"):
        kernels.KERNELS["backend"](
            q, k, v, kernels.AttentionSpec(dropout_rate=0.5, training=True, return_weights=False)
        )


# -- the layers -----------------------------------------------------------------------------


@pytest.fixture
def spy(monkeypatch):
    """The number of calls of the backend kernel (through `keras_attn.ops.attention`)."""
    calls = []

    def counted(*args):
        calls.append(1)
        return kernels.backend_attention(*args)

    counting = dataclasses.replace(kernels.KERNELS["backend"], run=counted)
    monkeypatch.setitem(kernels.KERNELS, "backend", counting)
    return calls


LAYERS = {
    "MultiHeadAttention": lambda **kw: keras_attn.MultiHeadAttention(2, 4, **kw),
    "GroupedQueryAttention": lambda **kw: keras_attn.GroupedQueryAttention(4, 4, 2, **kw),
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
@pytest.mark.parametrize(
    "flash,preferred,runs",
    [(True, False, True), (False, True, False), (None, True, True), (None, False, False)],
)
def test_flash_attention_says_which_path_runs(monkeypatch, spy, layer, flash, preferred, runs):
    monkeypatch.setattr(kernel_backend, "preferred", lambda shape=None, masked=True: preferred)
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    mask = np.arange(6)[None] < np.array([[6], [4]])
    attention = LAYERS[layer](flash_attention=flash)
    out = attention(x, x, value_mask=mask, use_causal_mask=True)
    assert bool(spy) is runs
    dense = LAYERS[layer](implementation="dense")
    dense(x, x)
    dense.set_weights(attention.get_weights())
    ref = dense(x, x, value_mask=mask, use_causal_mask=True)
    np.testing.assert_allclose(np_(out), np_(ref), atol=1e-5)
    # Scores requested: dense, unless flash_attention=True (refused, as Keras).
    if flash:
        with pytest.raises(ValueError, match="Returning attention scores is not supported"):
            attention(x, x, return_attention_scores=True)
    else:
        del spy[:]
        attention(x, x, return_attention_scores=True)
        assert not spy


def test_layer_flash_attention_errors():
    with pytest.raises(ValueError, match="flash_attention=True runs.*implementation='chunked'"):
        keras_attn.MultiHeadAttention(2, 4, flash_attention=True, implementation="chunked")
    with pytest.raises(ValueError, match="flash_attention=False, implementation='backend'"):
        keras_attn.GroupedQueryAttention(4, 4, 2, flash_attention=False, implementation="backend")
    with pytest.raises(ValueError, match="Dropout is not supported when flash attention"):
        keras_attn.GroupedQueryAttention(4, 4, 2, flash_attention=True, dropout=0.1)
    with pytest.raises(ValueError, match="'backend' has no dropout"):
        keras_attn.MultiHeadAttention(2, 4, implementation="backend", dropout=0.1)
    layer = keras_attn.MultiHeadAttention(2, 4, implementation="backend")
    assert keras_attn.MultiHeadAttention.from_config(layer.get_config()).implementation == (
        "backend"
    )


def test_cached_decoding_on_the_backend_kernel_equals_the_full_pass():
    """Each step's causal mask starts at the cache index (`query_start`), not Keras' top-left."""
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    mask = np.arange(6)[None] < np.array([[6], [4]])
    mha = keras_attn.MultiHeadAttention(2, 4, num_key_value_heads=1, implementation="backend")
    mha(x, x)
    dense = keras_attn.MultiHeadAttention(2, 4, num_key_value_heads=1, implementation="dense")
    dense(x, x)
    dense.set_weights(mha.get_weights())
    full = dense(x, x, value_mask=mask, use_causal_mask=True)
    cache, steps = mha.empty_cache(batch_size=2, length=6), []
    for i in range(6):
        y, cache = mha(x[:, i : i + 1], x[:, i : i + 1], value_mask=mask[:, i : i + 1],
                       use_causal_mask=True, cache=cache, cache_update_index=i)  # fmt: skip
        steps.append(np_(y))
    stepped = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(stepped[mask], np_(full)[mask], atol=1e-5)  # the real steps
