"""The roofline: each step as a share of the machine's limit, both measured in one run.

    python -m benchmarks.roofline [--quick|--smoke] [--sections ...] [--json PATH]

TensorFlow, one process. First the machine's limits (`benchmarks.timing`):

- the matmul peak: `tf.matmul` of `2048^3` products under `tf.function`, float32
  and bfloat16, probed at the start and at the end of the run and around each
  training row (`benchmarks.run.bench_pair`); the best probe of the run is the
  limit of the training rows of that compute dtype;
- the memory bandwidth: (a) a NumPy copy of a 256 MiB float32 array into a
  preallocated one (`np.copyto`), counted as bytes read + written per second:
  **the decoding limit** (issue 47's definition), and (b) a read-only figure,
  the better of `np.sum` (one thread) and `tf.reduce_sum` under `tf.function`
  (TensorFlow's threads) over the same 256 MiB, bytes read per second, printed
  beside it. Both at the start and at the end; the best sample is the limit.

Then, sections (`--sections`, default all):

- `mha`, `encoder`: the training steps of `benchmarks.run` (forward, backward,
  SGD in one `tf.function`): `keras_attn.MultiHeadAttention` vs
  `keras.layers.MultiHeadAttention` and `keras_attn.TransformerEncoder` vs
  keras-hub's `TransformerEncoder` at `cases.SHAPES`, in float32 and under
  `mixed_bfloat16`, as GFLOP/s (`cases.mha_flops`, `cases.encoder_flops`) and
  their share of the matmul peak of the compute dtype (bfloat16 under
  `mixed_bfloat16`); ours and the peer interleaved (`timing.time_group`);
- `lm`: a next-token cross-entropy training step of a language model, 4 layers,
  8 heads, hidden 256, intermediate 1,024, vocabulary 5,000, B 8 x L 256:
  `keras_attn.models.transformer_lm` (`keras_attn.models.gpt2.from_gpt2_backbone`)
  against keras-hub's `GPT2CausalLM` on the backbone it was copied from (the
  same weights, no dropout in either); FLOPs `cases.lm_flops` (the logits'
  `2 B L d V` included);
- `decode`: a decoding step at batch 1 of a GPT-2-small-sized model
  (`benchmarks.generation.GPT2_SMALL`, the same random weights in both), in float32,
  with both built under Keras' `bfloat16` policy (half the bytes), and both
  `quantize("int8")`d (int8 kernels and token tables: a quarter of the weights' bytes),
  greedy, a 32-token prompt: ours (`keras_attn.models.generate`) against
  keras-hub's `GPT2CausalLM.generate`. The step's time is the difference of two
  generation lengths timed in interleaved repeats, `(t40 - t8) / 32` per repeat,
  which leaves the prefill out (keras-hub's prefill runs over the whole padded
  length, so its difference also holds a prefill of 32 more positions); its
  bytes are `benchmarks.generation.decode_bytes` (every weight once, the KV
  cache at the timed steps' mean length) and bytes/s its share of the copy
  bandwidth (and of the read figure). Also the whole call's tokens/s at
  32 + 64.

Prints one markdown table per section, each row with the limit measured in this
run and the share of it; `--json` writes everything, every sample included:
`{"meta", "limits": {"start", "end", "best"}, "training": [rows of mha, encoder,
lm: "family"], "decode": [rows]}`. `--smoke`: tiny shapes and models (checks the
command); `--quick`: fewer repeats.
"""

import argparse
import datetime
import json
import os
import platform
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_attn  # noqa: E402
from benchmarks import cases, generation, run, timing  # noqa: E402

SECTIONS = ("mha", "encoder", "lm", "decode")
LM_PEER = "keras_hub.models.GPT2CausalLM"
LM_OURS = "keras_attn.models.transformer_lm (from_gpt2_backbone)"
FULL = dict(
    repeats=7,  # interleaved repeats per training row
    min_time=0.3,  # seconds per repeat, at least
    probe_n=2048,  # matmul size: the peak, and the probes around each row
    vs_fp32=False,  # (run.bench_pair) no float32 peer beside the mixed rows
    bandwidth_mib=256,
    bandwidth_repeats=7,
    shapes=cases.SHAPES,
    lm_size=generation.DEFAULT_SIZE,
    lm_shape=(8, 256),  # (B, L)
    decode_size=generation.GPT2_SMALL,
    prompt=32,
    decode_lengths=(8, 40),  # new tokens: the step is the difference
    whole=64,  # new tokens of the whole-call row
    decode_repeats=5,
    decode_policies=("float32", "bfloat16", "int8"),
)
SETTINGS = {
    "full": FULL,
    # the full run's sizes, fewer and shorter repeats
    "quick": dict(FULL, repeats=3, min_time=0.1, bandwidth_repeats=5, decode_repeats=3),
    "smoke": dict(
        repeats=2,
        min_time=0.0,
        probe_n=128,
        vs_fp32=False,
        bandwidth_mib=8,
        bandwidth_repeats=2,
        shapes=cases.SMOKE_SHAPES,
        lm_size=generation.TINY,
        lm_shape=(2, 16),
        decode_size=generation.TINY,
        prompt=8,
        decode_lengths=(2, 34),
        whole=34,
        decode_repeats=3,
        decode_policies=("float32", "bfloat16", "int8"),
    ),
}


def _log(msg):
    print(msg, file=sys.stderr, flush=True)


def limits(settings):
    """The machine's limits, measured now: matmul GFLOP/s (fp32, bf16), copy and read GB/s."""
    peak = {
        dtype: timing.matmul_peak(dtype, n=settings["probe_n"], repeats=3)
        for dtype in ("float32", "bfloat16")
    }
    size = dict(mib=settings["bandwidth_mib"], repeats=settings["bandwidth_repeats"])
    return {
        "matmul": peak,
        "copy": timing.copy_bandwidth(**size),
        "read": timing.read_bandwidth(**size),
    }


def _skipped_without_keras_hub(row):
    return {**row, "status": "skipped", "reason": "keras-hub is not installed "
            "(pip install keras-hub, or pip install -e '.[bench]')"}  # fmt: skip


def lm_pair(policy, settings):
    """The language model's training step, ours vs keras-hub's GPT-2 (a row as `run.bench_pair`'s).

    Both are built under `policy` from one random `GPT2Backbone` without
    dropout (`generation.build`); the tokens are GPT-2's ids, ours' shifted by
    one inside the step (`cases.lm_train_step(offset=1)`: its id 0 is padding).
    """
    batch, length = settings["lm_shape"]
    size = settings["lm_size"]
    row = {
        "family": "lm", "mode": "train", "policy": policy, "batch": batch, "length": length,
        "dim": size["hidden_dim"], "size": size, "ours_layer": LM_OURS, "peer_layer": LM_PEER,
    }  # fmt: skip
    if cases.keras_hub_or_none() is None:
        return _skipped_without_keras_hub(row)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        ours, hub = generation.build(length, None, size=size, dropout=0.0)
    finally:
        keras.config.set_dtype_policy(previous)

    def hub_call(ids, training):
        return hub({"token_ids": ids, "padding_mask": tf.ones_like(ids)}, training=training)

    tokens = cases.token_batch(batch, length + 1, size["vocabulary_size"])
    steps = {
        "ours": cases.lm_train_step(ours, tokens, offset=1),
        "peer": cases.lm_train_step(hub, tokens, call=hub_call),
    }
    flops = cases.lm_flops(
        batch, length, size["num_layers"], size["hidden_dim"], size["intermediate_dim"],
        size["vocabulary_size"], train=True,
    )  # fmt: skip
    probe_before = run._probe(policy, settings)
    result = timing.time_group(steps, (tokens,), settings["repeats"], settings["min_time"])
    probe = (probe_before + run._probe(policy, settings)) / 2
    row.update(status="ok", flops=flops, probe_gflops=probe, loadavg=timing.loadavg())
    for name in steps:
        median = result[name]["median_s"]
        row[name] = {
            **result[name],
            "tokens_per_s": batch * length / median,
            "gflops": flops / median / 1e9,
            "pct_probe": 100.0 * flops / median / 1e9 / probe,
        }
    row["ratio"] = result["ratio"]["peer"]
    return row


def _step_times(result, name, short, long):
    """Per repeat `(t_long - t_short) / (long - short)`: seconds per decoding step."""
    pairs = zip(
        result[f"{name} {long}"]["times_s"], result[f"{name} {short}"]["times_s"], strict=True
    )
    samples = [(a - b) / (long - short) for a, b in pairs]
    return {**timing.summarize(samples), "samples": samples}


def decode_row(settings, policy="float32"):
    """The decoding step at batch 1, ours vs keras-hub's `GPT2CausalLM.generate`: time, bytes.

    `policy="bfloat16"`: both models built under Keras' `bfloat16` policy (weights and
    KV caches in bfloat16: half the bytes a step); `"int8"`: both built in float32, then
    `quantize("int8")` (int8 kernels and token tables with float32 scales, float32 KV
    caches). The tokens may then differ (rounding).
    """
    size, prompt = settings["decode_size"], settings["prompt"]
    short, long = settings["decode_lengths"]
    whole = settings["whole"]
    row = {
        "size": size, "batch": 1, "prompt": prompt, "lengths": [short, long], "whole": whole,
        "policy": policy,
    }  # fmt: skip
    if cases.keras_hub_or_none() is None:
        return _skipped_without_keras_hub(row)
    quantized = policy == "int8"
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32" if quantized else policy)
    try:
        ours, hub = generation.build(prompt, None, size=size)
    finally:
        keras.config.set_dtype_policy(previous)
    if quantized:
        with warnings.catch_warnings():  # layers without int8 weights (norms) say so
            warnings.simplefilter("ignore", UserWarning)
            for model in (ours, hub):
                model.quantize("int8")
    fns = {}
    for new in sorted({short, long, whole}):
        fns[f"ours {new}"], fns[f"keras-hub {new}"] = generation.generators(
            ours, hub, 1, prompt, new
        )
    same = bool(np.array_equal(fns[f"ours {whole}"](), fns[f"keras-hub {whole}"]()))
    result = timing.time_group(fns, (), settings["decode_repeats"], min_time=0.0, max_calls=1)
    cache_length = generation.mean_cache_length(prompt, short + 1, long)
    itemsize = 2 if policy == "bfloat16" else 4
    step_bytes = generation.decode_bytes(
        size, 1, cache_length, itemsize=itemsize, weight_itemsize=1 if quantized else None
    )
    row.update(
        status="ok", same_tokens=same, cache_length=cache_length, bytes_per_step=step_bytes,
        timing=result, loadavg=timing.loadavg(),
    )  # fmt: skip
    for name in ("ours", "keras-hub"):
        step = _step_times(result, name, short, long)
        row[name] = {
            "step_s": step,
            # None where the difference is under the noise (tiny smoke models)
            "bytes_per_s": step_bytes / step["median"] if step["median"] > 0 else None,
            "whole_tokens_per_s": whole / result[f"{name} {whole}"]["median_s"],
        }
    steps = zip(
        row["keras-hub"]["step_s"]["samples"], row["ours"]["step_s"]["samples"], strict=True
    )
    ratios = [hub / ours for hub, ours in steps if ours > 0]
    row["step_ratio"] = {**timing.summarize(ratios), "samples": ratios} if ratios else None
    return row


def best_limits(start, end, rows):
    """The run's best of each limit: matmul (the probes around rows too), copy, read."""
    best = {}
    for dtype in ("float32", "bfloat16"):
        probes = [
            r["probe_gflops"] for r in rows
            if r["status"] == "ok" and (r["policy"] == "float32") == (dtype == "float32")
        ]  # fmt: skip
        best[f"matmul_{dtype}"] = max(
            [start["matmul"][dtype]["max"], end["matmul"][dtype]["max"], *probes]
        )
    for kind in ("copy", "read"):
        best[kind] = max(start[kind]["max"], end[kind]["max"])
    return best


def shares(report):
    """Adds each row's limit and share of it (percent) to the report's rows."""
    best = report["limits"]["best"]
    for row in report["training"]:
        if row["status"] != "ok":
            continue
        dtype = "float32" if row["policy"] == "float32" else "bfloat16"
        row["limit_gflops"] = best[f"matmul_{dtype}"]
        for name in ("ours", "peer"):
            row[name]["pct_peak"] = 100.0 * row[name]["gflops"] / row["limit_gflops"]
    for row in report["decode"]:
        if row["status"] != "ok":
            continue
        row["limit_gbps"] = {"copy": best["copy"], "read": best["read"]}
        for name in ("ours", "keras-hub"):
            rate = row[name]["bytes_per_s"]
            for kind in ("copy", "read"):
                share = None if rate is None else 100.0 * rate / 1e9 / best[kind]
                row[name][f"pct_{kind}"] = share


def limits_table(report):
    start, end, best = report["limits"]["start"], report["limits"]["end"], report["limits"]["best"]
    n = start["matmul"]["float32"]["n"]
    mib = start["copy"]["mib"]
    lines = [
        "| limit | measured by | start: median (best) | end: median (best) | limit of the run |",
        "|---|---|---|---|---|",
    ]
    cells = [
        ("matmul fp32, GFLOP/s", f"`tf.matmul` {n}^3, `tf.function`",
         lambda x: x["matmul"]["float32"], best["matmul_float32"]),
        ("matmul bf16, GFLOP/s", f"`tf.matmul` {n}^3, `tf.function`",
         lambda x: x["matmul"]["bfloat16"], best["matmul_bfloat16"]),
        ("copy, GB/s (read + write): decoding limit", f"`np.copyto` {mib} MiB float32",
         lambda x: x["copy"], best["copy"]),
        ("read, GB/s", f"`np.sum` / `tf.reduce_sum` {mib} MiB, the better",
         lambda x: x["read"], best["read"]),
    ]  # fmt: skip
    for label, how, get, limit in cells:
        at = [f"{get(x)['gflops' if 'gflops' in get(x) else 'gbps']:.1f} ({get(x)['max']:.1f})"
              for x in (start, end)]  # fmt: skip
        lines.append(f"| {label} | {how} | {at[0]} | {at[1]} | {limit:.1f} |")
    return "\n".join(lines)


def training_table(rows, family):
    names = {
        "mha": "`MultiHeadAttention` vs `keras.layers.MultiHeadAttention`",
        "encoder": "`TransformerEncoder` vs keras-hub's `TransformerEncoder`",
        "lm": "`transformer_lm` vs keras-hub's `GPT2CausalLM`",
    }
    lines = [
        f"Training step, {names[family]}: GFLOP/s and share of the matmul peak of the "
        "compute dtype (limit: the best matmul of the run)",
        "",
        "| dtype | BxLxd | ours ms | peer ms | ours GFLOP/s | peer GFLOP/s | limit GFLOP/s "
        "| ours % of limit | peer % of limit | speed ours/peer |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["family"] != family:
            continue
        dtype = "fp32" if row["policy"] == "float32" else "mixed_bf16"
        head = f"| {dtype} | {row['batch']}x{row['length']}x{row['dim']} |"
        if row["status"] != "ok":
            lines.append(f"{head} skipped: {row['reason']} |" + " - |" * 7)
            continue
        ours, peer = row["ours"], row["peer"]
        lines.append(
            f"{head} {1e3 * ours['median_s']:.1f} | {1e3 * peer['median_s']:.1f} | "
            f"{ours['gflops']:.0f} | {peer['gflops']:.0f} | {row['limit_gflops']:.0f} | "
            f"{ours['pct_peak']:.0f}% | {peer['pct_peak']:.0f}% | {run._fmt_ratio(row['ratio'])} |"
        )
    return "\n".join(lines)


def _pct(value):
    return "-" if value is None else f"{value:.0f}%"


def decode_table(rows):
    lines = [
        "Decoding step, batch 1, greedy: bytes read per second (every weight once + "
        "the KV cache) against the copy bandwidth (the decoding limit) and the read figure",
        "",
        "| model | dtype | prompt, steps timed | MB/step | ours ms/step | keras-hub ms/step "
        "| ours GB/s | keras-hub GB/s | copy limit GB/s | ours % | keras-hub % "
        "| read limit GB/s: ours % / keras-hub % | whole call tok/s ours / keras-hub "
        "| same tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        size = row["size"]
        model = (f"{size['num_layers']} layers, hidden {size['hidden_dim']}, "
                 f"vocabulary {size['vocabulary_size']}")  # fmt: skip
        short, long = row["lengths"]
        head = f"| {model} | {row['policy']} | {row['prompt']}, new {short + 1}..{long} |"
        if row["status"] != "ok":
            lines.append(f"{head} skipped: {row['reason']} |" + " - |" * 10)
            continue
        ours, hub = row["ours"], row["keras-hub"]
        rates = [
            "-" if x["bytes_per_s"] is None else f"{x['bytes_per_s'] / 1e9:.1f}"
            for x in (ours, hub)
        ]
        limit = row["limit_gbps"]
        lines.append(
            f"{head} {row['bytes_per_step'] / 1e6:.0f} | {1e3 * ours['step_s']['median']:.1f} "
            f"| {1e3 * hub['step_s']['median']:.1f} | {rates[0]} | {rates[1]} "
            f"| {limit['copy']:.1f} | {_pct(ours['pct_copy'])} | {_pct(hub['pct_copy'])} "
            f"| {limit['read']:.1f}: {_pct(ours['pct_read'])} / {_pct(hub['pct_read'])} "
            f"| {row['prompt']} + {row['whole']}: {ours['whole_tokens_per_s']:.1f} / "
            f"{hub['whole_tokens_per_s']:.1f} | {row['same_tokens']} |"
        )
    return "\n".join(lines)


def render(report):
    meta = report["meta"]
    parts = [
        f"keras-attn {meta['keras_attn']} | TF {meta['tensorflow']} | Keras {meta['keras']} | "
        f"keras-hub {meta['keras_hub']} | {meta['cpu']['count']} CPUs | mode {meta['mode']} | "
        f"{meta['duration_s']:.0f} s",
        f"loadavg start {meta['loadavg_start']} end {meta.get('loadavg_end')}",
        "",
        limits_table(report),
    ]
    for family in ("mha", "encoder", "lm"):
        if any(r["family"] == family for r in report["training"]):
            parts += ["", training_table(report["training"], family)]
    if report["decode"]:
        parts += ["", decode_table(report["decode"])]
    return "\n".join(parts)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.roofline", description=__doc__.split("\n\n")[0]
    )
    speed = parser.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="fewer repeats; about 10 minutes")
    speed.add_argument("--smoke", action="store_true", help="tiny shapes and models")
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    parser.add_argument("--repeats", type=int, help="interleaved repeats per training row")
    parser.add_argument(
        "--sections", help="comma-separated subset of " + ",".join(SECTIONS) + " (default: all)"
    )
    parser.add_argument("--policies", default=",".join(cases.POLICIES))
    return parser.parse_args(argv)


def main(argv=None):
    """Runs the roofline; prints the tables; returns (and writes) the report."""
    args = parse_args(argv)
    if keras.backend.backend() != "tensorflow":
        raise SystemExit("benchmarks.roofline times tf.function steps: KERAS_BACKEND=tensorflow")
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    settings = dict(SETTINGS[mode])
    if args.repeats:
        settings["repeats"] = args.repeats
    sections = set(args.sections.split(",")) if args.sections else set(SECTIONS)
    if not sections <= set(SECTIONS):
        raise SystemExit(f"--sections: unknown {sorted(sections - set(SECTIONS))}")
    started = time.perf_counter()
    meta = {
        "command": "python -m benchmarks.roofline "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "mode": mode,
        "sections": sorted(sections),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "loadavg_start": timing.loadavg(),
        "cpu": timing.cpu_info(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "keras_attn": keras_attn.__version__,
        "keras_hub": getattr(cases.keras_hub_or_none(), "__version__", None),
        "settings": settings,
    }
    _log("limits (start) ...")
    start = limits(settings)

    rows = []
    for policy in args.policies.split(","):
        for family in ("mha", "encoder"):
            if family in sections:
                for shape in settings["shapes"]:
                    _log(f"{family} train {policy} {shape} ...")
                    rows.append(run.bench_pair(family, "train", shape, policy, settings))
        if "lm" in sections:
            _log(f"lm train {policy} {settings['lm_shape']} ...")
            rows.append(lm_pair(policy, settings))
    decode = []
    if "decode" in sections:
        _log("decode ...")
        for policy in settings["decode_policies"]:
            _log(f"decode {policy} ...")
            decode.append(decode_row(settings, policy))

    _log("limits (end) ...")
    end = limits(settings)
    report = {
        "meta": meta,
        "limits": {"start": start, "end": end, "best": best_limits(start, end, rows)},
        "training": rows,
        "decode": decode,
    }
    shares(report)
    meta["loadavg_end"] = timing.loadavg()
    meta["duration_s"] = time.perf_counter() - started
    print(render(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
        _log(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
