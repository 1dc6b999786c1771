"""Training steps, timing and memory on this process's Keras backend (JAX or torch).

Each builder returns `(run, info)`: `run(n)` makes `n` steps and waits for the last
one; `info` holds the compile time (JAX: lowering + XLA compilation; torch: the first
eager step), the step's memory where the backend tells it before running (JAX's memory
analysis of the compiled step) and whether the compiled step calls cuDNN.

JAX: the layer's `stateless_call` under `jax.value_and_grad`, then the optimizer's
`stateless_apply`, all in one `jax.jit` (the training step `model.fit` compiles on JAX,
without the model around one layer). torch: eager forward, `backward()`, the optimizer's
`apply`, as Keras' own torch trainer does.
"""

import gc
import inspect
import math
import time

import keras
import numpy as np

import keras_attn
from benchmarks.device.report import summarize

LEARNING_RATE = 1e-4


def backend():
    return keras.backend.backend()


# -- what is measured -------------------------------------------------------------


def make_layer(layer, shape, policy, case):
    """`keras_attn.MultiHeadAttention` (defaults: implementation="auto") or Keras' layer."""
    batch, length, dim, heads = shape
    cls = keras_attn.MultiHeadAttention if layer == "ours" else keras.layers.MultiHeadAttention
    dropout = 0.1 if case == "dropout 0.1" else 0.0
    mha = cls(num_heads=heads, key_dim=dim // heads, dropout=dropout, seed=1, dtype=policy)
    mha.build((batch, length, dim), (batch, length, dim))
    return mha


def layer_inputs(shape, policy, case):
    """`x` in the compute dtype; with `"padding mask"` a key mask hiding the last quarter."""
    batch, length, dim, _ = shape
    dtype = "bfloat16" if policy == "mixed_bfloat16" else "float32"
    x = keras.random.normal((batch, length, dim), seed=0, dtype=dtype)
    mask = None
    if case == "padding mask":
        valid = np.arange(length)[None, :] < length - length // 4
        mask = keras.ops.convert_to_tensor(np.broadcast_to(valid, (batch, length)))
    return x, mask


def call_kwargs(case):
    return {"training": True, "return_attention_scores": case == "return scores"}


def chosen_kernel(layer, shape, case, policy):
    """Which kernel runs: ours as `keras_attn.ops.choose_implementation` says, Keras' by its rule.

    Keras' layer calls `keras.ops.dot_product_attention` unless dropout is on or the
    scores are returned (then its einsum + softmax path).
    """
    batch, length, _, heads = shape
    if layer == "keras":
        off = case in ("dropout 0.1", "return scores")
        return "einsum softmax" if off else "ops.dot_product_attention"
    choose = getattr(keras_attn.ops, "choose_implementation", None)
    if choose is None:
        return "?"
    known = {
        "implementation": "auto",
        "scores_shape": (batch, heads, length, length),
        "dropout_rate": 0.1 if case == "dropout 0.1" else 0.0,
        "training": True,
        "return_weights": case == "return scores",
        "mask": None,
        "dtype": "bfloat16" if policy == "mixed_bfloat16" else "float32",
    }
    try:
        params = inspect.signature(choose).parameters
        return str(choose(**{k: v for k, v in known.items() if k in params}))
    except Exception:  # a newer signature this bench does not know: say so
        return "?"


# -- JAX --------------------------------------------------------------------------


def _jax_memory(compiled):
    try:
        stats = compiled.memory_analysis()
        stats = stats[0] if isinstance(stats, (list, tuple)) else stats
        return int(
            stats.argument_size_in_bytes
            + stats.output_size_in_bytes
            - stats.alias_size_in_bytes
            + stats.temp_size_in_bytes
        )
    except Exception:
        return None


def _jax_compile(step, carry, args):
    import jax

    donate = () if jax.devices()[0].platform == "cpu" else (0,)
    start = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=donate).lower(carry, *args).compile()
    info = {"compile_s": time.perf_counter() - start, "mem_bytes": _jax_memory(compiled)}
    try:
        info["cudnn"] = "cudnn$fmha" in compiled.as_text().lower()  # cuDNN's fused attention
    except Exception:
        info["cudnn"] = None
    state = [carry]

    def run(n):
        out = None
        for _ in range(n):
            out, state[0] = compiled(state[0], *args)
        jax.block_until_ready(out)

    return run, info


def _jax_layer_step(mha, x, mask, kwargs):
    import jax
    import jax.numpy as jnp

    optimizer = keras.optimizers.SGD(LEARNING_RATE)
    optimizer.build(mha.trainable_variables)
    carry = (
        [v.value for v in mha.trainable_variables],
        [v.value for v in mha.non_trainable_variables],
        [v.value for v in optimizer.variables],
    )

    def loss_fn(trainable, non_trainable, x, mask):
        out, non_trainable = mha.stateless_call(
            trainable, non_trainable, x, x, value_mask=mask, **kwargs
        )
        out = out[0] if isinstance(out, (tuple, list)) else out
        return jnp.mean(jnp.square(out.astype("float32"))), non_trainable

    def step(carry, x, mask):
        trainable, non_trainable, opt_vars = carry
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, non_trainable), grads = grad_fn(trainable, non_trainable, x, mask)
        trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
        return loss, (trainable, non_trainable, opt_vars)

    return _jax_compile(step, carry, (x, mask))


def _jax_grad_step(fn, tensors):
    import jax
    import jax.numpy as jnp

    def step(carry, *tensors):
        loss = lambda *t: jnp.mean(jnp.square(fn(*t).astype("float32")))  # noqa: E731
        return jax.grad(loss, argnums=tuple(range(len(tensors))))(*tensors), carry

    return _jax_compile(step, jnp.zeros(()), tensors)


def _jax_matmul(a, b):
    return _jax_compile(lambda carry, a, b: (a @ b, carry), a.sum() * 0, (a, b))


# -- torch ------------------------------------------------------------------------


def _torch_sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _torch_run(one):
    start = time.perf_counter()
    one()
    _torch_sync()
    info = {"compile_s": time.perf_counter() - start}

    def run(n):
        for _ in range(n):
            one()
        _torch_sync()

    return run, info


def _torch_layer_step(mha, x, mask, kwargs):
    import torch

    optimizer = keras.optimizers.SGD(LEARNING_RATE)
    optimizer.build(mha.trainable_variables)
    weights = mha.trainable_variables

    def one():
        out = mha(x, x, value_mask=mask, **kwargs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        loss = torch.mean(torch.square(out.float()))
        for v in weights:
            v.value.grad = None
        loss.backward()
        with torch.no_grad():
            optimizer.apply([v.value.grad for v in weights], weights)

    return _torch_run(one)


def _torch_grad_step(fn, tensors):
    import torch

    tensors = [t.detach().requires_grad_(True) for t in tensors]

    def one():
        for t in tensors:
            t.grad = None
        torch.mean(torch.square(fn(*tensors).float())).backward()

    return _torch_run(one)


def _torch_matmul(a, b):
    import torch

    def one():
        with torch.no_grad():
            torch.matmul(a, b)

    return _torch_run(one)


# -- the cases --------------------------------------------------------------------


def layer_step(row):
    mha = make_layer(row["layer"], row["dims"], row["dtype"], row["case"])
    x, mask = layer_inputs(row["dims"], row["dtype"], row["case"])
    build = _jax_layer_step if backend() == "jax" else _torch_layer_step
    return build(mha, x, mask, call_kwargs(row["case"]))


def core_step(row):
    """Attention alone, fwd+bwd: ours on `(B, h, L, dh)`, Keras' op on `(B, L, h, dh)`."""
    batch, length, dim, heads = row["dims"]
    layout = (batch, heads, length, dim // heads)
    if row["layer"] == "keras":
        layout = (batch, length, heads, dim // heads)
        fn = keras.ops.dot_product_attention
    else:
        fn = lambda q, k, v: keras_attn.ops.attention(q, k, v, return_weights=False)[0]  # noqa: E731
    qkv = [keras.random.normal(layout, seed=i, dtype=row["dtype"]) for i in range(3)]
    return (_jax_grad_step if backend() == "jax" else _torch_grad_step)(fn, qkv)


def matmul_step(row, n):
    a, b = (keras.random.normal((n, n), seed=i, dtype=row["dtype"]) for i in range(2))
    return (_jax_matmul if backend() == "jax" else _torch_matmul)(a, b)


def reset_peak():
    if backend() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def peak_bytes():
    """torch: `max_memory_allocated` since `reset_peak`; JAX: the process's peak so far."""
    try:
        if backend() == "torch":
            import torch

            return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
        import jax

        stats = jax.devices()[0].memory_stats()
        return None if not stats else stats.get("peak_bytes_in_use")
    except Exception:
        return None


def measure(run, warmup, repeats, min_sample_s):
    """Per-step seconds: `warmup` steps, then `repeats` samples of at least `min_sample_s`."""
    run(warmup)
    start = time.perf_counter()
    run(1)
    calls = max(1, math.ceil(min_sample_s / max(time.perf_counter() - start, 1e-6)))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(calls)
        samples.append((time.perf_counter() - start) / calls)
    return summarize(samples), calls


def free():
    keras.backend.clear_session()
    gc.collect()
    if backend() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
