"""Every kernel keeps the guarantees at the edges: masked scores replaced (never added to,
huge or float16-overflowing), an empty value gives zeros, the chunked kernel's memory
stays linear under an eager tape. Each test failed on an earlier kernel."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from kernel_calls import run

import keras_attn
from keras_attn import kernels
from layer_checks import value_and_grads
from numpy_reference import attend, scaled_dot_scores

rng = np.random.default_rng(7)


def np_(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def t(x, dtype=None):
    return keras.ops.convert_to_tensor(x, dtype)


_MEMORY_CHILD = """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
from keras_attn import kernels

def hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) * 1024

q = tf.random.normal((1, 4, 4096, 32))
def step():
    with tf.GradientTape() as tape:
        tape.watch(q)
        out, _ = kernels.chunked_attention(
            q, q, q, kernels.AttentionSpec(is_causal=True, return_weights=False), block_size=512
        )
        loss = tf.reduce_sum(out)
    return tape.gradient(loss, q)
fn = step if sys.argv[1] == "eager" else tf.function(step)
fn()  # warm up: what stays allocated after one step is not the step's peak
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = hwm()
fn()
print(json.dumps({"peak_increase": hwm() - before}))
"""


@pytest.mark.parametrize("name", ["dense", "fused", "chunked"])
def test_a_masked_score_above_the_old_bias_does_not_leak_in(name):
    """Float32: a masked score of ~1e32 beat the fused and chunked kernels' -1e30 bias."""
    q = rng.normal(size=(2, 2, 5, 8)).astype("float32")
    k = rng.normal(size=(2, 2, 6, 8)).astype("float32")
    v = rng.normal(size=(2, 2, 6, 4)).astype("float32")
    mask = np.ones((2, 1, 1, 6), bool)
    mask[:, ..., 4:] = False
    q = np.abs(q) + 1.0
    k[..., 4:, :] = 1e31  # q . k ~ 1e32 at the masked keys
    kernel = kernels.KERNELS[name]
    out, _ = run(kernel, t(q), t(k), t(v), t(mask), block_size=4 if name == "chunked" else None)
    ref, _ = attend(scaled_dot_scores(q, k), v, mask)
    np.testing.assert_allclose(np_(out), ref, atol=1e-5)


@pytest.mark.parametrize("name", ["dense", "fused", "chunked"])
def test_a_masked_score_that_overflows_float16_does_not_make_the_row_nan(name):
    """Float16 keys of 3e4 at padded positions: q . k overflows to inf, and inf + bias is inf."""
    q = np.abs(rng.normal(size=(2, 2, 5, 8))).astype("float16") + 1
    k = rng.normal(size=(2, 2, 6, 8)).astype("float16")
    v = rng.normal(size=(2, 2, 6, 4)).astype("float16")
    mask = np.ones((2, 1, 1, 6), bool)
    mask[1, ..., 3:] = False
    k[1, :, 3:] = 3e4  # finite in float16; the score is not
    out, _ = run(kernels.KERNELS[name], t(q), t(k), t(v), t(mask))
    ref, _ = attend(scaled_dot_scores(q.astype("float64"), k.astype("float64")), v, mask)
    assert np.all(np.isfinite(np_(out)))
    np.testing.assert_allclose(np_(out), ref, atol=2e-2)


@pytest.mark.parametrize("implementation", ["auto", "fused", "chunked", "dense"])
def test_an_empty_value_gives_zeros_on_every_path(implementation):
    layer = keras_attn.MultiHeadAttention(
        num_heads=2, key_dim=4, bias_initializer="ones", implementation=implementation
    )
    q = t(rng.normal(size=(2, 3, 8)).astype("float32"))
    empty = t(np.zeros((2, 0, 8), "float32"))
    out = layer(q, empty, return_attention_scores=implementation == "dense")
    out = out[0] if isinstance(out, tuple) else out
    np.testing.assert_array_equal(np_(out), np.zeros((2, 3, 8)))


@pytest.mark.tensorflow_only
def test_chunked_training_step_under_an_eager_tape_keeps_linear_memory():
    """One (4, 4096, 4096) float32 score tensor is 256 MiB; the eager step used to keep them all."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux /proc to read the peak RSS")
    increase = {}
    for mode in ("eager", "graph"):
        run = subprocess.run(
            [sys.executable, "-c", _MEMORY_CHILD, mode], capture_output=True, text=True, check=True
        )
        increase[mode] = json.loads(run.stdout.strip().splitlines()[-1])["peak_increase"]
    # Before the fix: ~1.4 GiB eager against ~0.1 GiB in a graph.
    assert increase["eager"] < 256 * 2**20, increase


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("name", ["dense", "fused", "chunked", "backend"])
def test_rows_whose_biased_scores_are_all_very_negative_get_their_softmax(name, masked):
    """A bias far below -1e20 on every key of a row: -3e25, or float32's lowest (an additive
    mask). The chunked kernel's running maximum started at -1e20 and gave such a row zeros;
    with masked keys in the row too, the dense kernel counted them in the softmax's sum, the
    fused and backend kernels gave them the weight. A row counts as seeing nothing by its mask
    only: with every key of example 1 masked (`masked`), its rows are zeros."""
    lowest = float(np.finfo(np.float32).min)
    q = rng.normal(size=(3, 2, 5, 8)).astype("float32")
    k = rng.normal(size=(3, 2, 6, 8)).astype("float32")
    v = rng.normal(size=(3, 2, 6, 4)).astype("float32")
    bias = rng.normal(size=(1, 1, 5, 6)).astype("float32")
    bias[..., 1, :] = -3e25  # uniform over the visible keys (q . k is below its rounding)
    bias[..., 2, :] = lowest
    bias[..., 3, :] = -3e25
    bias[..., 3, 2] = -3e25 + 1e21  # far above the others: weight 1 (a visible key in a row)
    bias[..., 4, :4] = lowest  # the row's only keys above it are masked in example 0
    mask = np.ones((3, 1, 1, 6), bool)
    given_k, given_v = k.copy(), v.copy()
    if masked:
        mask[0, ..., 4:] = False
        mask[1] = False  # example 1 sees nothing
        given_k[~np.broadcast_to(mask[..., 0, :, None], k.shape)] = np.nan
        given_v[~np.broadcast_to(mask[..., 0, :, None], v.shape)] = np.inf
    expected, _ = attend(scaled_dot_scores(q, k) + bias.astype("float64"), v, mask)
    spec_mask = t(mask) if masked else None
    fields = dict(bias=kernels.AttentionBias(t(bias)), block_size=4 if name == "chunked" else None)

    def call(q, k, v):
        return run(kernels.KERNELS[name], q, k, v, spec_mask, **fields)[0]

    cotangent = rng.normal(size=expected.shape).astype("float32")
    out, grads = value_and_grads(call, [t(q), t(given_k), t(given_v)], (), cotangent)
    np.testing.assert_allclose(np_(out), expected, atol=1e-5)
    assert all(np.isfinite(np_(g)).all() for g in grads), name
    if masked:
        assert np.all(np_(out)[1] == 0) and all(np.all(np_(g)[1] == 0) for g in grads)
    else:  # the gradients of the softmax over these rows (lse and all): the dense kernel's

        def dense(q, k, v):
            return run(kernels.KERNELS["dense"], q, k, v, None, bias=fields["bias"])[0]

        _, ref_grads = value_and_grads(dense, [t(q), t(k), t(v)], (), cotangent)
        for what, g, g_ref in zip("qkv", grads, ref_grads, strict=True):
            np.testing.assert_allclose(np_(g), np_(g_ref), atol=1e-5, err_msg=f"d{what}")


@pytest.mark.parametrize("name", ["dense", "fused", "chunked", "backend"])
@pytest.mark.parametrize("lead,tq", [((0, 2), 5), ((2, 2), 0)])
def test_an_empty_batch_or_no_query_gives_an_empty_output(name, lead, tq):
    """B = 0 or Tq = 0: the chunked kernel's eager max over an empty tile raised."""
    q = t(rng.normal(size=(*lead, tq, 8)).astype("float32"))
    k = t(rng.normal(size=(*lead, 6, 8)).astype("float32"))
    v = t(rng.normal(size=(*lead, 6, 4)).astype("float32"))
    block_size = 4 if name == "chunked" else None
    for is_causal, mask in [(False, None), (True, np.ones((1, 1, 1, 6), bool))]:

        def call(q, k, v, mask=mask, is_causal=is_causal):
            return run(kernels.KERNELS[name], q, k, v, mask, is_causal, block_size=block_size)[0]

        out, grads = value_and_grads(call, [q, k, v])
        assert tuple(out.shape) == (*lead, tq, 4)
        for g, x in zip(grads, (q, k, v), strict=True):
            np.testing.assert_array_equal(np_(g), np.zeros(x.shape))
