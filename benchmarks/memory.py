"""Peak memory of one MHA step, each configuration in a fresh subprocess.

The child (`python -m benchmarks.memory --length L --impl IMPL [--layer key_value]`)
builds an 8-head `MultiHeadAttention` with `d = 256` at `B = 1` (or a
single-head `KeyValueAttention` of width `d`, `--layer key_value`), resets the kernel's
RSS high-water mark (`/proc/self/clear_refs`), runs one training step
(forward + backward with respect to the weights) or one inference call in a
`tf.function`, and prints one JSON line: the high-water mark `VmHWM` (the
peak RSS of the whole process, TensorFlow's own ~0.6 GiB included), the RSS
before the first call, and the step time.

The parent polls the child's RSS and kills it past a cap, so that a dense
step at a length that cannot fit stops before it takes the machine's memory.
"""

import argparse
import json
import os
import subprocess
import sys
import time

GIB = 1024**3
MIB = 1024**2
IMPLEMENTATIONS = ("keras", "dense", "chunked", "auto")


def _status_kib(field, pid="self"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def _child(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    from benchmarks import cases

    dim, batch, length = args.dim, args.batch, args.length
    if args.layer == "key_value":
        impl = None if args.impl == "auto" else args.impl
        layer = cases.make_key_value(dim, "float32", implementation=impl)
    elif args.impl == "keras":
        layer = cases.make_mha("peer", dim, "float32")
    else:
        layer = cases.make_mha("ours", dim, "float32", implementation=args.impl)
    x = cases.input_batch(batch, length, dim)
    step = cases.train_step(layer, x) if args.mode == "train" else cases.infer_step(layer, x)
    before_kib = _status_kib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass
    times = []
    for _ in range(args.calls):
        start = time.perf_counter()
        np.asarray(step(x))
        times.append(time.perf_counter() - start)
    peak_kib = _status_kib("VmHWM")
    result = {
        "layer": args.layer,
        "impl": args.impl,
        "mode": args.mode,
        "batch": batch,
        "length": length,
        "dim": dim,
        "status": "ok",
        "peak_rss_mib": peak_kib / 1024,
        "rss_before_mib": before_kib / 1024,
        "delta_mib": (peak_kib - before_kib) / 1024,
        "first_call_s": times[0],
        "step_s": min(times[1:]) if len(times) > 1 else times[0],
        "tf": tf.__version__,
    }
    print("RESULT " + json.dumps(result), flush=True)


def measure(
    length, impl, mode="train", dim=256, batch=1, calls=2, cap_gib=12.0, timeout=300, layer="mha"
):
    """Runs the child for one configuration; returns its result dict.

    `status` is `"ok"`, `"killed (RSS cap)"`, `"timeout"` or `"failed"` (with
    the last lines of the child's output in `error`). A killed child reports
    the largest RSS the parent saw.
    """
    cmd = [
        sys.executable, "-m", "benchmarks.memory", "--length", str(length), "--impl", impl,
        "--mode", mode, "--dim", str(dim), "--batch", str(batch), "--calls", str(calls),
        "--layer", layer,
    ]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = dict(layer=layer, impl=impl, mode=mode, batch=batch, length=length, dim=dim)
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen_kib, status = 0, None
    while proc.poll() is None:
        try:
            seen_kib = max(seen_kib, _status_kib("VmRSS", proc.pid) or 0)
        except (OSError, ValueError):
            pass
        if seen_kib * 1024 > cap_gib * GIB:
            status = "killed (RSS cap)"
        elif time.perf_counter() - start > timeout:
            status = "timeout"
        if status:
            proc.kill()
            break
        time.sleep(0.05)
    output = proc.communicate()[0]
    if status:
        return {**base, "status": status, "peak_rss_mib": seen_kib / 1024, "cap_gib": cap_gib}
    for line in output.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = "\n".join(output.strip().splitlines()[-5:])
    return {**base, "status": "failed", "peak_rss_mib": seen_kib / 1024, "error": tail}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, required=True)
    parser.add_argument("--impl", choices=IMPLEMENTATIONS, default="auto")
    parser.add_argument("--mode", choices=("train", "infer"), default="train")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--layer", choices=("mha", "key_value"), default="mha")
    _child(parser.parse_args(argv))


if __name__ == "__main__":
    main()
