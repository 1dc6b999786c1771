"""One decoding product at batch 1 with int8 / bfloat16 weights: each backend's candidates.

    python -m experiments.int8_matvec [--framework torch|tensorflow|jax] [--repeats 15]

`(1, K) x (K, N)` at GPT-2 small's feed-forward (768 x 3,072) and logits (768 x 50,257)
sizes, the weights in float32, bfloat16 and int8 (Keras' `quantize("int8")` scheme: an
int8 kernel with a scale per output channel, the inputs quantized per row). Per candidate:
milliseconds per product (median of interleaved repeats) and the weight bytes read per
second. Under XLA each product runs 8 times in a `while_loop` (one dispatch). The 768 x
3,072 kernels fit this CPU's caches, the 768 x 50,257 ones do not: only the second reads
memory.

What it shows (benchmarks/README.md, "Weights in int8 and bfloat16"): torch's
`torch._int_mm` reads int8 at about twice float32's speed; XLA's CPU dot takes no int8
(nor bf16) operand as it lies: its HLO converts the whole kernel to a float32 copy first
(a `convert` fusion), so every XLA form of the int8 product costs about a float32 one.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402

SIZES = [(768, 3072), (768, 50257)]
REP = 8  # products per XLA call


def interleaved(fns, repeats):
    """Median seconds per call of each callable, repeats interleaved (order alternating)."""
    for f in fns.values():
        f(), f()
    times = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {k: float(np.median(v)) for k, v in times.items()}


def weights(k, n, seed=0):
    """`(w, wq, scale)`: float32 `(k, n)`, its int8 per-output-channel quantization."""
    w = np.random.default_rng(seed).standard_normal((k, n)).astype("float32")
    scale = (127 / np.abs(w).max(0)).astype("float32")
    return w, np.clip(np.round(w * scale), -127, 127).astype("int8"), scale


def torch_cases(k, n):
    import torch

    w, wq, scale = weights(k, n)
    w, wq, scale = torch.from_numpy(w), torch.from_numpy(wq), torch.from_numpy(scale)
    x = torch.randn(1, k)
    xq = torch.round(x * 127 / x.abs().max()).to(torch.int8)
    wb, wq_t = w.to(torch.bfloat16).t().contiguous(), wq.t().contiguous()
    return {  # name: (fn, bytes per weight)
        "float32 x @ w": (lambda: x @ w, 4),
        "int8 Keras' op (both cast to int32)": (lambda: xq.int() @ wq.int(), 1),
        "int8 torch._int_mm(xq, wq)": (lambda: torch._int_mm(xq, wq), 1),
        "int8 _weight_int8pack_mm, bf16 x": (
            lambda: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), wq_t, scale.bfloat16()),
            1,
        ),
        "bfloat16 linear, bf16 x": (lambda: torch.nn.functional.linear(x.bfloat16(), wb), 2),
    }


def tensorflow_cases(k, n):
    import tensorflow as tf

    w, wq, scale = weights(k, n)
    w_, wq_, s_ = tf.Variable(w), tf.Variable(wq), tf.Variable(scale)
    wb = tf.Variable(w.astype(tf.bfloat16.as_numpy_dtype))
    x = tf.constant(np.random.default_rng(1).standard_normal((1, k)).astype("float32"))

    def quantize(x):
        s = 127 / (tf.reduce_max(tf.abs(x), -1, keepdims=True) + 1e-7)
        return tf.clip_by_value(tf.round(x * s), -127, 127), s

    def keras_int8(x):
        xq, s = quantize(x)
        y = tf.matmul(tf.cast(xq, tf.int8), wq_, output_type=tf.int32)
        return tf.cast(y, tf.float32) / (s * s_)

    def in_loop(body):
        @tf.function(jit_compile=True, autograph=False)
        def run(x):
            def step(i, acc):
                return i + 1, acc + tf.reduce_sum(body(x + tf.cast(i, tf.float32) * 1e-3))

            return tf.while_loop(lambda i, a: i < REP, step, (0, 0.0))[1]

        return lambda: run(x).numpy()

    return {
        "float32 x @ w": (in_loop(lambda x: tf.matmul(x, w_)), 4),
        "int8 Keras' op (s8 x s8 -> s32)": (in_loop(keras_int8), 1),
        "int8 x @ cast(wq) / scale": (
            in_loop(lambda x: tf.matmul(x, tf.cast(wq_, tf.float32)) / s_),
            1,
        ),
        "bfloat16 bf16 x @ w": (
            in_loop(lambda x: tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), wb), tf.float32)),
            2,
        ),
        "bfloat16 x @ cast(w, f32)": (in_loop(lambda x: tf.matmul(x, tf.cast(wb, tf.float32))), 2),
    }


def jax_cases(k, n):
    import jax
    import jax.numpy as jnp

    w, wq, scale = (jnp.asarray(a) for a in weights(k, n))
    wb = w.astype(jnp.bfloat16)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((1, k)).astype("float32"))
    dims = (((1,), (0,)), ((), ()))

    def in_loop(body):
        @jax.jit
        def run(x, w, wq, scale, wb):
            def step(i, acc):
                return acc + jnp.sum(body(x + i * 1e-3, w, wq, scale, wb))

            return jax.lax.fori_loop(0, REP, step, 0.0)

        return lambda: run(x, w, wq, scale, wb).block_until_ready()

    return {
        "float32 x @ w": (in_loop(lambda x, w, wq, s, wb: x @ w), 4),
        "int8 mixed dot (f32 x s8)": (
            in_loop(
                lambda x, w, wq, s, wb: (
                    jax.lax.dot_general(x, wq, dims, preferred_element_type=jnp.float32) / s
                )
            ),
            1,
        ),
        "bfloat16 mixed dot (f32 x bf16)": (
            in_loop(
                lambda x, w, wq, s, wb: jax.lax.dot_general(
                    x, wb, dims, preferred_element_type=jnp.float32
                )
            ),
            2,
        ),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=("torch", "tensorflow", "jax"), default="torch")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    cases = {"torch": torch_cases, "tensorflow": tensorflow_cases, "jax": jax_cases}
    print(f"{args.framework}, loadavg {os.getloadavg()}")
    print("| K x N | product | ms | weight GB/s |\n|---|---|---|---|")
    for k, n in SIZES:
        found = cases[args.framework](k, n)
        per_call = 1 if args.framework == "torch" else REP
        times = interleaved({name: fn for name, (fn, _) in found.items()}, args.repeats)
        for name, (_, itemsize) in found.items():
            t = times[name] / per_call
            print(f"| {k} x {n} | {name} | {t * 1e3:.3f} | {k * n * itemsize / t / 1e9:.1f} |")


if __name__ == "__main__":
    main()
