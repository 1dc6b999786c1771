"""Eager calls, ours vs the peers, and torch's `train_on_batch`.

    python -m benchmarks.eager [--quick] [--json PATH] [--backend-note]

In one process, on the backend `KERAS_BACKEND` selects, side by side, repeats
interleaved; layers called eagerly (no `tf.function`, no `jax.jit`, no
`torch.compile`), inference (`training=False`), B1, d256, 8 heads of 32:

- `keras_attn.MultiHeadAttention` vs `keras.layers.MultiHeadAttention`,
  causal self-attention (`use_causal_mask=True`), T = 1, 16, 128;
- `keras_attn.TransformerDecoder` vs keras-hub's `TransformerDecoder`
  (`intermediate_dim=1024`), decoder-only, causal (both blocks' default),
  T = 1, 16, 128;
- one cached decoding step of those blocks: one token at index 64 of a
  128-position self-attention cache prefilled with 64 tokens. Ours with its
  `KVCache` (`block.empty_cache`) and, in a second row, with keras-hub's
  stacked `(B, 2, S, h, dk)` cache; keras-hub's with its own;

and, with `KERAS_BACKEND=torch` only, `model.train_on_batch` of a functional
model around each MHA (causal self-attention, 8 heads, key_dim d/8, loss
MSE, SGD) at B32xL128xd256, B8xL512xd512, B2xL2048xd256 (`--quick`: the first).

Weights are copied from the peer into ours with `set_weights` (the layouts
match), so both compute the same function; each eager row shows the largest
difference of the two outputs. Eager rows print the *time* ratio ours / peer
(< 1: ours is faster), training rows the *speed* ratio ours / Keras, in
tokens per second (> 1: ours is faster); median [min-max] over the repeats.
`--json PATH` writes every sample; `--backend-note` prints what "eager" runs
on this backend (threads, autograd) above the tables.
"""

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_attn  # noqa: E402
from benchmarks import cases, timing  # noqa: E402

NUM_HEADS = 8
KEY_DIM = 32
DIM = NUM_HEADS * KEY_DIM  # 256
INTERMEDIATE_DIM = 1024
CACHE_LENGTH = 128
CACHE_INDEX = 64  # the decoded token's position; the prompt fills 0..63
TRAIN_SHAPES = cases.SHAPES  # (B, L, d): 32x128x256, 8x512x512, 2x2048x256
SETTINGS = {
    "full": dict(
        repeats=9,  # interleaved repeats per row
        min_time=0.2,  # seconds per repeat, at least
        lengths=(1, 16, 128),
        train_shapes=TRAIN_SHAPES,
        train_repeats=7,
        train_min_time=0.3,
    ),
    "quick": dict(
        repeats=5,
        min_time=0.2,
        lengths=(1, 16, 128),
        train_shapes=TRAIN_SHAPES[:1],
        train_repeats=3,
        train_min_time=0.2,
    ),
    "smoke": dict(
        repeats=2,
        min_time=0.0,
        lengths=(1,),
        train_shapes=((2, 16, 32),),
        train_repeats=2,
        train_min_time=0.0,
    ),
}


def _log(msg):
    print(msg, file=sys.stderr, flush=True)


def _numpy(out):
    """The first output as NumPy (detached on torch): waits for the call, copies (1, T, 256)."""
    return keras.ops.convert_to_numpy(out[0] if isinstance(out, tuple) else out)


def _max_diff(a, b):
    return float(np.max(np.abs(_numpy(a) - _numpy(b))))


def _input(length, seed):
    rng = np.random.default_rng(seed)
    return keras.ops.convert_to_tensor(rng.normal(size=(1, length, DIM)).astype("float32"))


def _mha_pair():
    """Keras' MHA and ours, built, with Keras' weights copied into ours."""
    keras.utils.set_random_seed(0)
    peer = keras.layers.MultiHeadAttention(num_heads=NUM_HEADS, key_dim=KEY_DIM)
    ours = keras_attn.MultiHeadAttention(num_heads=NUM_HEADS, key_dim=KEY_DIM)
    shape = (1, 1, DIM)
    peer.build(shape, shape)
    ours.build(shape, shape)
    ours.set_weights(peer.get_weights())
    return ours, peer


def _decoder_pair():
    """keras-hub's `TransformerDecoder` and our block, built decoder-only, weights copied."""
    keras.utils.set_random_seed(0)
    peer = cases.keras_hub_or_none().layers.TransformerDecoder(
        intermediate_dim=INTERMEDIATE_DIM, num_heads=NUM_HEADS
    )
    ours = keras_attn.TransformerDecoder(intermediate_dim=INTERMEDIATE_DIM, num_heads=NUM_HEADS)
    peer.build((1, 1, DIM))
    ours.build((1, 1, DIM))
    ours.set_weights(peer.get_weights())
    return ours, peer


def _time(fns, args, repeats, min_time, warmup=5):
    """`timing.time_group` of `fns` (the first name is the reference) after `warmup` calls.

    Each timed call ends by reading its output as NumPy, as a decoding loop
    reading its token would (on JAX this waits for the asynchronous dispatch).
    A repeat makes enough calls to last `min_time` at the slowest callable's
    median warm-up time (`time_group` alone counts from one call, which a
    slow phase of the machine can make 10x too long).
    """

    def reading_output(fn):
        return lambda *args: _numpy(fn(*args))

    timed = {name: reading_output(fn) for name, fn in fns.items()}
    slowest = 0.0
    for fn in timed.values():
        times = []
        for _ in range(warmup):
            start = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - start)
        slowest = max(slowest, statistics.median(times))
    calls = max(1, math.ceil(min_time / slowest))
    # An infinite `min_time` makes `time_group` take exactly `max_calls` calls per repeat.
    return timing.time_group(timed, args, repeats, math.inf, max_calls=calls)


def _row(section, length, result, name, diff, variant=None):
    """One eager row: `name` (ours) against "peer", time ratio ours / peer per repeat."""
    ours, peer = result[name], result["peer"]
    return {
        "section": section,
        "variant": variant,
        "batch": 1,
        "length": length,
        "dim": DIM,
        "status": "ok",
        "ours": ours,
        "peer": peer,
        "ratio": result["ratio"][name],  # t_ours / t_peer
        "cpu_ratio": result["cpu_ratio"][name],
        "max_abs_diff": diff,
        "loadavg": timing.loadavg(),
    }


def bench_mha(length, settings):
    """Eager causal self-attention of `(1, length, 256)`: ours vs Keras' MHA."""
    ours, peer = _mha_pair()
    x = _input(length, seed=length)

    def call(layer):
        return lambda x: layer(x, x, use_causal_mask=True, training=False)

    fns = {"peer": call(peer), "ours": call(ours)}
    diff = _max_diff(fns["ours"](x), fns["peer"](x))
    result = _time(fns, (x,), settings["repeats"], settings["min_time"])
    return [_row("mha", length, result, "ours", diff)]


def bench_decoder(length, settings):
    """Eager decoder-only block on `(1, length, 256)`: ours vs keras-hub's (both causal)."""
    if cases.keras_hub_or_none() is None:
        return [_skipped("decoder", length)]
    ours, peer = _decoder_pair()
    x = _input(length, seed=length)

    def call(layer):
        return lambda x: layer(x, training=False)

    fns = {"peer": call(peer), "ours": call(ours)}
    diff = _max_diff(fns["ours"](x), fns["peer"](x))
    result = _time(fns, (x,), settings["repeats"], settings["min_time"])
    return [_row("decoder", length, result, "ours", diff)]


def bench_cached_step(settings):
    """One token at `CACHE_INDEX` of a `CACHE_LENGTH` cache prefilled with a prompt.

    Every timed call reads the same prefilled cache (and returns an updated
    copy, dropped), so each call does the same work.
    """
    if cases.keras_hub_or_none() is None:
        return [_skipped("cached_step", 1, v) for v in ("KVCache", "keras-hub cache")]
    ours, peer = _decoder_pair()
    prompt, token = _input(CACHE_INDEX, seed=1), _input(1, seed=2)
    shape = (1, 2, CACHE_LENGTH, NUM_HEADS, KEY_DIM)  # keras-hub: (B, 2, S, h, dk)
    _, stacked = peer(
        prompt, self_attention_cache=keras.ops.zeros(shape), self_attention_cache_update_index=0
    )
    _, kv_cache = ours(
        prompt,
        self_attention_cache=ours.empty_cache(1, CACHE_LENGTH),
        self_attention_cache_update_index=0,
    )

    def step(layer, cache):
        return lambda x: layer(
            x,
            self_attention_cache=cache,
            self_attention_cache_update_index=CACHE_INDEX,
            training=False,
        )

    fns = {"peer": step(peer, stacked), "ours": step(ours, kv_cache)}
    fns["ours_stacked"] = step(ours, stacked)
    want = fns["peer"](token)
    diffs = {name: _max_diff(fns[name](token), want) for name in ("ours", "ours_stacked")}
    result = _time(fns, (token,), settings["repeats"], settings["min_time"])
    return [
        _row("cached_step", 1, result, "ours", diffs["ours"], "KVCache"),
        _row("cached_step", 1, result, "ours_stacked", diffs["ours_stacked"], "keras-hub cache"),
    ]


def _skipped(section, length, variant=None):
    return {
        "section": section,
        "variant": variant,
        "batch": 1,
        "length": length,
        "dim": DIM,
        "status": "skipped",
        "reason": "keras-hub is not installed "
        "(pip install keras-hub, or pip install -e '.[bench]')",
    }


def bench_train(shape, settings):
    """torch: `train_on_batch` of a functional model around our MHA vs Keras' (speed ratio)."""
    batch, length, dim = shape
    row = {"section": "train", "batch": batch, "length": length, "dim": dim}
    if keras.backend.backend() != "torch":
        return {**row, "status": "skipped", "reason": "torch only (KERAS_BACKEND=torch)"}
    keras.utils.set_random_seed(0)
    models = {}
    for name, cls in (("ours", keras_attn.MultiHeadAttention),
                      ("keras", keras.layers.MultiHeadAttention)):  # fmt: skip
        inputs = keras.Input((length, dim))
        outputs = cls(NUM_HEADS, dim // NUM_HEADS)(inputs, inputs, use_causal_mask=True)
        model = keras.Model(inputs, outputs)
        model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
        models[name] = model
    models["ours"].set_weights(models["keras"].get_weights())
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, length, dim)).astype("float32")
    y = rng.normal(size=(batch, length, dim)).astype("float32")
    fns = {name: model.train_on_batch for name, model in models.items()}
    loss_diff = abs(float(fns["ours"](x, y)) - float(fns["keras"](x, y)))  # first steps
    warmup = 2 if settings["train_min_time"] else 1
    result = _time(fns, (x, y), settings["train_repeats"], settings["train_min_time"], warmup)
    for name in fns:
        row[name] = {**result[name], "tokens_per_s": batch * length / result[name]["median_s"]}
    row.update(
        status="ok",
        ratio=result["ratio"]["keras"],  # t_keras / t_ours: the speed ratio ours / Keras
        cpu_ratio=result["cpu_ratio"]["keras"],
        first_loss_abs_diff=loss_diff,
        loadavg=timing.loadavg(),
    )
    return row


def _fmt_ratio(r):
    return f"{r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}]"


def eager_table(rows):
    """Markdown table of the eager rows (time ratio ours / peer)."""
    lines = [
        "| ours vs peer (eager, training=False) | BxTxd | ours ms | peer ms | calls/repeat "
        "| time ours/peer, median [min-max] (< 1: ours faster) | max abs diff |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {
        "mha": "MHA vs keras MHA, causal",
        "decoder": "DecoderBlock vs keras-hub TransformerDecoder",
        "cached_step": f"cached step at {CACHE_INDEX}/{CACHE_LENGTH}, DecoderBlock",
    }
    for row in rows:
        name = names[row["section"]]
        if row["section"] == "cached_step":
            name += f" ({row['variant']}) vs keras-hub (its cache)"
        head = f"| {name} | {row['batch']}x{row['length']}x{row['dim']} |"
        if row["status"] != "ok":
            lines.append(f"{head} - | - | - | skipped: {row['reason']} | - |")
            continue
        ours, peer = row["ours"], row["peer"]
        lines.append(
            f"{head} {1e3 * ours['median_s']:.2f} | {1e3 * peer['median_s']:.2f} | "
            f"{ours['calls_per_repeat']} | {_fmt_ratio(row['ratio'])} | "
            f"{row['max_abs_diff']:.1e} |"
        )
    return "\n".join(lines)


def train_table(rows):
    """Markdown table of the torch training rows (speed ratio ours / Keras)."""
    lines = [
        "| train_on_batch, MHA vs keras MHA | BxLxd | ours tokens/s | keras tokens/s "
        "| ours ms | keras ms | speed ours/keras, median [min-max] (> 1: ours faster) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        head = f"| causal self-attention, MSE, SGD | {row['batch']}x{row['length']}x{row['dim']} |"
        if row["status"] != "ok":
            lines.append(f"{head} - | - | - | - | skipped: {row['reason']} |")
            continue
        ours, peer = row["ours"], row["keras"]
        lines.append(
            f"{head} {ours['tokens_per_s']:.0f} | {peer['tokens_per_s']:.0f} | "
            f"{1e3 * ours['median_s']:.1f} | {1e3 * peer['median_s']:.1f} | "
            f"{_fmt_ratio(row['ratio'])} |"
        )
    return "\n".join(lines)


def backend_info():
    """The backend, its version and thread pools, and what an eager call runs there."""
    backend = keras.backend.backend()
    info = {"backend": backend}
    if backend == "torch":
        import torch

        info.update(
            version=torch.__version__,
            threads=torch.get_num_threads(),
            interop_threads=torch.get_num_interop_threads(),
            note="eager = torch ops dispatched one at a time; outside torch.no_grad, so "
            "autograd records every call (as in a user's own decoding loop); no "
            "torch.compile. Training: Keras' torch trainer, eager.",
        )
    elif backend == "jax":
        import jax

        info.update(
            version=jax.__version__,
            devices=[str(d) for d in jax.devices()],
            note="eager = each keras.ops call dispatched (and compiled once per shape) on "
            "its own; no jax.jit around the layer.",
        )
    elif backend == "tensorflow":
        import tensorflow as tf

        info.update(
            version=tf.__version__,
            intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads(),
            inter_op_threads=tf.config.threading.get_inter_op_parallelism_threads(),
            note="eager = TensorFlow eager ops, one at a time (0 threads: TF's default "
            "pools); no tf.function.",
        )
    return info


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.eager", description=__doc__.split("\n\n")[0]
    )
    speed = parser.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="fewer repeats; about a minute")
    speed.add_argument(
        "--smoke", action="store_true", help="T=1 only, two repeats, tiny training shape"
    )
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    parser.add_argument("--repeats", type=int, help="interleaved repeats per eager row")
    parser.add_argument(
        "--backend-note", action="store_true", help="print the backend, its threads and "
        "what an eager call runs there"
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv=None):
    """Runs the benchmark; prints the tables; returns (and writes) the report."""
    args = parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    settings = dict(SETTINGS[mode])
    if args.repeats:
        settings["repeats"] = args.repeats
    started = time.perf_counter()
    hub = cases.keras_hub_or_none()
    meta = {
        "command": "python -m benchmarks.eager " + " ".join(sys.argv[1:] if argv is None else argv),
        "mode": mode,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "loadavg_start": timing.loadavg(),
        "cpu": timing.cpu_info(),
        "python": platform.python_version(),
        "keras": keras.__version__,
        "keras_attn": keras_attn.__version__,
        "keras_hub": getattr(hub, "__version__", None),
        "backend": backend_info(),
        "settings": settings,
    }
    rows = []
    for section, bench in (("mha", bench_mha), ("decoder", bench_decoder)):
        for length in settings["lengths"]:
            _log(f"{section} T={length} ...")
            rows += bench(length, settings)
            _log(f"  time ours/peer {_fmt_ratio(rows[-1]['ratio'])}" if "ratio" in rows[-1]
                 else f"  skipped: {rows[-1]['reason']}")  # fmt: skip
    _log(f"cached step at {CACHE_INDEX}/{CACHE_LENGTH} ...")
    rows += bench_cached_step(settings)
    train = []
    for shape in settings["train_shapes"]:  # rows skipped, with the reason, off torch
        _log(f"train_on_batch {'x'.join(map(str, shape))} ...")
        train.append(bench_train(shape, settings))
        _log(f"  speed ours/keras {_fmt_ratio(train[-1]['ratio'])}" if "ratio" in train[-1]
             else f"  skipped: {train[-1]['reason']}")  # fmt: skip
    meta["loadavg_end"] = timing.loadavg()
    meta["duration_s"] = time.perf_counter() - started
    report = {"meta": meta, "eager": rows, "train": train}
    print(render(report, backend_note=args.backend_note))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        _log(f"wrote {args.json}")
    return report


def render(report, backend_note=False):
    """The printed report: machine line, the eager table, the training table."""
    meta = report["meta"]
    backend = meta["backend"]
    parts = [
        f"keras-attn {meta['keras_attn']} | {backend['backend']} {backend.get('version')} | "
        f"Keras {meta['keras']} | keras-hub {meta['keras_hub']} | {meta['cpu']['count']} CPUs | "
        f"mode {meta['mode']} | {meta['duration_s']:.0f} s",
        f"loadavg start {meta['loadavg_start']} end {meta.get('loadavg_end')}",
    ]
    if backend_note:
        details = ", ".join(f"{k} {v}" for k, v in backend.items() if k not in ("note",))
        parts.append(f"backend: {details}. {backend.get('note', '')}")
    parts += ["", eager_table(report["eager"]), "", train_table(report["train"])]
    return "\n".join(parts)


if __name__ == "__main__":
    main()
