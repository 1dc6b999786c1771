"""The backend's kernel (`keras.ops.dot_product_attention`) against our fused kernel, one shape.

Decides `keras_attn.kernels.backend.TORCH_CPU` (whether `implementation="auto"`
takes the backend kernel on torch with a CPU): forward, and forward plus
backward, of `keras_attn.ops.attention` with `implementation="backend"` and
`"fused"`, causal, with a padding mask, timed in interleaved repeats (a
shared machine changes speed from one second to the next).

    OMP_NUM_THREADS=1 KERAS_BACKEND=torch python -m benchmarks.backend_kernel --batch 4 --length 256
    # one query against 128 keys (a cached decoding step's shape; causal is then end-aligned):
    OMP_NUM_THREADS=1 KERAS_BACKEND=torch python -m benchmarks.backend_kernel --batch 1 \
        --length 128 --query-length 1

(One thread: on a shared 2-core machine torch's two threads contend with the
other processes, and a run's times then vary up to 10x.)

Prints one JSON line per mode with the median milliseconds per call and the
median per-repeat ratio backend / fused (below 1: the backend's is faster).
"""

import argparse
import json
import os
import statistics
import time

import keras
import numpy as np

import keras_attn


def _step(implementation, backward):
    """A callable `(q, k, v, mask) -> a scalar`, after the gradients when `backward`."""

    def forward(q, k, v, mask):
        out, _ = keras_attn.ops.attention(
            q, k, v, mask=mask, is_causal=True, implementation=implementation,
            return_weights=False,
        )  # fmt: skip
        return keras.ops.sum(out * out)

    backend = keras.backend.backend()
    if not backward:
        if backend == "jax":
            import jax

            return jax.jit(forward)
        return forward
    if backend == "torch":

        def step(q, k, v, mask):
            q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
            forward(q, k, v, mask).backward()
            return q.grad.sum() + k.grad.sum() + v.grad.sum()

        return step
    if backend == "jax":
        import jax

        grad = jax.jit(jax.grad(forward, argnums=(0, 1, 2)))
        return lambda *args: sum(g.sum() for g in grad(*args))
    import tensorflow as tf

    @tf.function
    def step(q, k, v, mask):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = forward(q, k, v, mask)
        return sum(tf.reduce_sum(g) for g in tape.gradient(loss, [q, k, v]))

    return step


def _time(fn, args, calls):
    start = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
    keras.ops.convert_to_numpy(out)
    return (time.perf_counter() - start) / calls


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--query-length", type=int, help="queries (default: --length)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    shape = (args.batch, args.heads, args.length, args.width)
    k, v = (keras.ops.convert_to_tensor(rng.normal(size=shape).astype("float32")) for _ in "kv")
    query_shape = shape[:2] + (args.query_length or args.length, args.width)
    q = keras.ops.convert_to_tensor(rng.normal(size=query_shape).astype("float32"))
    valid = np.ones((args.batch, 1, 1, args.length), bool)
    valid[0, ..., args.length // 2 :] = False  # one padded sequence
    inputs = (q, k, v, keras.ops.convert_to_tensor(valid))
    for mode, backward in (("forward", False), ("forward+backward", True)):
        fns = {name: _step(name, backward) for name in ("backend", "fused")}
        for fn in fns.values():  # trace, warm up
            _time(fn, inputs, 2)
        times = {name: [] for name in fns}
        for r in range(args.repeats):  # alternating order: a b, b a, ...
            for name in list(fns)[:: 1 if r % 2 == 0 else -1]:
                times[name].append(_time(fns[name], inputs, args.calls))
        ratios = [b / f for b, f in zip(times["backend"], times["fused"], strict=True)]
        print(
            json.dumps(
                {
                    "backend": keras.backend.backend(),
                    "device": keras_attn.kernels.backend.device_kind(),
                    "mode": mode,
                    "shape": shape,
                    "query_length": query_shape[2],
                    "cpus": os.cpu_count(),
                    "backend_ms": round(1e3 * statistics.median(times["backend"]), 2),
                    "fused_ms": round(1e3 * statistics.median(times["fused"]), 2),
                    "ratio_backend_over_fused": round(statistics.median(ratios), 3),
                    "ratio_min_max": [round(min(ratios), 3), round(max(ratios), 3)],
                    "loadavg": os.getloadavg()[0],
                }
            )
        )


if __name__ == "__main__":
    main()
