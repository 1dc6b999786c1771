"""Timing helpers: interleaved repeats of callables, the matmul peak, memory bandwidth.

A shared 2-core machine changes speed by up to 2x from one second to the next.
Timing ours and the peer's step in alternating repeats (ours, peer, peer,
ours, ...) exposes both to the same phases, and the per-repeat ratio cancels
most of the noise that a median of separate runs would keep. For the same
reason the matmul "peak" a row is compared with is probed right before and
right after the row.
"""

import os
import statistics
import time

import numpy as np
import tensorflow as tf


def loadavg():
    """The 1, 5 and 15 minute load averages (`/proc/loadavg`), or `None`."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def _run(fn, args, n, cpu=None):
    """Wall seconds per call of `n` calls; appends CPU seconds per call to `cpu` if given."""
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        out = fn(*args)
    np.asarray(out)  # the result is a scalar; reading it waits for the step
    if cpu is not None:
        cpu.append((time.process_time() - start_cpu) / n)
    return (time.perf_counter() - start) / n


def summarize(samples):
    """`{"median", "min", "max"}` of a list of numbers."""
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
    }


def time_group(fns, args, repeats=5, min_time=0.2, max_calls=50):
    """Times each callable of `fns` (name -> fn) on `args` in interleaved repeats.

    Each callable is called once to trace (its "first call" time) and once to
    warm up; the slowest warm-up sets how many calls one repeat makes, so
    that a repeat lasts at least `min_time` seconds. Repeat `r` runs the
    callables in an order rotated by `r` (two callables: a b, b a, a b, ...),
    so a slow phase of the machine hits each of them alike.

    Returns:
        `{name: {...}, "ratio": {name: {...}}, "cpu_ratio": {...}}`: per
        callable the per-call wall seconds of every repeat (`times_s`), their
        median/min/max, the CPU seconds of this process per call (`cpu_s`,
        all threads: less sensitive to other processes than wall time, but
        it counts spinning threads too) and the first-call time;
        `ratio[name]` summarizes, per repeat, `t_name / t_first` where
        `first` is the first name of `fns`: the speed of the first callable
        relative to `name` (> 1: the first is faster); `cpu_ratio` the same
        with CPU seconds.
    """
    names = list(fns)
    result = {name: {"times_s": [], "cpu_s": []} for name in names}
    warm = {}
    for name in names:
        start = time.perf_counter()
        np.asarray(fns[name](*args))
        result[name]["first_call_s"] = time.perf_counter() - start
        warm[name] = _run(fns[name], args, 1)
    calls = int(min(max_calls, max(1, np.ceil(min_time / max(warm.values())))))
    ratios = {name: [] for name in names[1:]}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        times = {name: _run(fns[name], args, calls, result[name]["cpu_s"]) for name in order}
        for name in names:
            result[name]["times_s"].append(times[name])
        for name in names[1:]:
            ratios[name].append(times[name] / times[names[0]])
    for name in names:
        result[name].update({f"{k}_s": v for k, v in summarize(result[name]["times_s"]).items()})
        result[name]["cpu_median_s"] = statistics.median(result[name]["cpu_s"])
        result[name]["calls_per_repeat"] = calls
    result["ratio"] = {name: {**summarize(v), "samples": v} for name, v in ratios.items()}
    result["cpu_ratio"] = {}
    for name in names[1:]:
        cpu = [a / b for a, b in zip(result[name]["cpu_s"], result[names[0]]["cpu_s"], strict=True)]
        result["cpu_ratio"][name] = {**summarize(cpu), "samples": cpu}
    return result


def matmul_peak(dtype="float32", n=2048, repeats=5):
    """Measured `tf.matmul` GFLOP/s of an `n^3` product under `tf.function`.

    Returns:
        `{"gflops": median, "max": best, "samples": [...], "n": n}`. With
        `bfloat16` this is the AMX path through oneDNN on CPUs that have it.
    """
    a = tf.cast(tf.random.normal((n, n)), dtype)
    b = tf.cast(tf.random.normal((n, n)), dtype)
    fn = tf.function(lambda a, b: tf.reduce_sum(tf.cast(tf.matmul(a, b)[0, :8], "float32")))
    np.asarray(fn(a, b))
    calls = max(1, int(np.ceil(0.1 / _run(fn, (a, b), 1))))
    flops = 2.0 * n**3
    samples = [flops / _run(fn, (a, b), calls) / 1e9 for _ in range(repeats)]
    return {"gflops": statistics.median(samples), "max": max(samples), "samples": samples, "n": n}


def _rate(fn, nbytes, repeats, min_time):
    """GB/s samples of `fn()` moving `nbytes` a call, each over at least `min_time` seconds."""
    fn()  # touches the pages (first-touch faults are not bandwidth)
    calls = max(1, int(np.ceil(min_time / _run(fn, (), 1))))
    samples = [nbytes / _run(fn, (), calls) / 1e9 for _ in range(repeats)]
    return {"gbps": statistics.median(samples), "max": max(samples), "samples": samples}


def copy_bandwidth(mib=256, repeats=7, min_time=0.05):
    """Memory bandwidth of a NumPy copy, bytes read + written per second.

    `np.copyto` of a `mib` MiB float32 array into a preallocated one (256
    MiB: far past the caches), counted as `2 x mib` MiB moved a copy. This
    is the decoding limit of `benchmarks.roofline` and of
    `benchmarks.generation --gpt2-small` (issue 47: a decoding step at
    batch 1 must stream every weight from memory).

    Returns:
        `{"gbps": median, "max": best, "samples": [...], "mib": mib}`, in
        GB/s (1e9 bytes).
    """
    src = np.ones(mib * 2**20 // 4, "float32")
    dst = np.empty_like(src)
    result = _rate(lambda: np.copyto(dst, src), 2 * src.nbytes, repeats, min_time)
    return {**result, "mib": mib}


def read_bandwidth(mib=256, repeats=7, min_time=0.05):
    """Memory bandwidth of a read-only pass, bytes read per second.

    The same `mib` MiB float32 array summed by `np.sum` (NumPy, one thread)
    and by `tf.reduce_sum` under `tf.function` (TensorFlow's threads); the
    better of the two is the figure (`gbps`, `max`, `method`). It counts
    bytes read only, where `copy_bandwidth` counts a read and a write per
    byte copied: two measures of the same memory, printed side by side.

    Returns:
        `{"gbps", "max", "method", "mib", "numpy_sum": {...}, "tf_reduce_sum": {...}}`:
        each method `{"gbps": median, "max": best, "samples": [...]}` in GB/s;
        `gbps` the better median (of `method`), `max` the best sample of either.
    """
    array = np.ones(mib * 2**20 // 4, "float32")
    tensor = tf.constant(array)
    reduce_sum = tf.function(tf.reduce_sum)
    methods = {
        "numpy_sum": _rate(lambda: np.sum(array), array.nbytes, repeats, min_time),
        "tf_reduce_sum": _rate(lambda: reduce_sum(tensor), array.nbytes, repeats, min_time),
    }
    best = max(methods, key=lambda name: methods[name]["gbps"])
    return {
        "gbps": methods[best]["gbps"],
        "max": max(m["max"] for m in methods.values()),
        "method": best,
        "mib": mib,
        **methods,
    }


def cpu_info():
    """CPU model name and count, for the record."""
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"model": model, "count": os.cpu_count()}
