"""The benchmark command: `python -m benchmarks.run [--quick] [--json PATH]`.

In one process, side by side, repeats interleaved:

- `keras_attn.MultiHeadAttention` vs `keras.layers.MultiHeadAttention` (8 heads),
  training step and inference, at B32xL128xd256, B8xL512xd512, B2xL2048xd256;
- `keras_attn.TransformerEncoder` vs keras-hub's `TransformerEncoder`
  (skipped with a message when keras-hub is not installed);
- each in float32 and under `mixed_bfloat16` (training rows under
  `mixed_bfloat16` also time Keras' layer in float32);
- GFLOP/s against a `tf.matmul` of the row's compute dtype, probed right
  before and after the row (the machine's speed drifts; the run's best probe
  is printed as the peak);

then, each in a fresh subprocess, the peak RSS of one MHA training step at
B1, d256 per sequence length (ours with the automatic choice of the dense or
the chunked path, and Keras' layer), and (full runs, or `--sections
complexity`) the Transformer paper's complexity table, measured
(`benchmarks.complexity`).

Prints a table of speed ratios ours / peer (> 1 means ours is faster; the
median and min-max over the interleaved repeats) and writes everything,
every sample included, as JSON.
"""

import argparse
import datetime
import json
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_attn  # noqa: E402
from benchmarks import cases, memory, timing  # noqa: E402
from benchmarks.targets import targets  # noqa: E402

PEERS = {
    "mha": "keras.layers.MultiHeadAttention",
    "encoder": "keras_hub.layers.TransformerEncoder",
}
OURS = {"mha": "keras_attn.MultiHeadAttention", "encoder": "keras_attn.TransformerEncoder"}
SETTINGS = {
    "full": dict(
        repeats=9,  # interleaved repeats per row
        min_time=0.3,  # seconds per repeat, at least
        probe_n=2048,  # matmul probe size around each row
        vs_fp32=True,  # mixed rows also time the peer in float32
        encoder_modes=("train", "infer"),
        mem_ours=(1024, 2048, 4096, 8192, 16384),  # memory rows, fresh processes
        mem_keras=(1024, 2048, 4096, 8192),
        # ours with the path forced, on the other side of auto's threshold (8 heads, B=1:
        # dense up to L=4096, chunked from 8192)
        mem_forced=(("chunked", 4096), ("dense", 8192)),
        mem_calls=2,
        complexity="full",
    ),
    "quick": dict(
        repeats=5,
        min_time=0.1,
        probe_n=2048,
        vs_fp32=True,
        encoder_modes=("train",),
        mem_ours=(2048, 16384),
        mem_keras=(2048,),
        mem_forced=(),
        mem_calls=1,
        complexity=None,
    ),
    "smoke": dict(
        repeats=2,
        min_time=0.0,
        probe_n=128,
        vs_fp32=True,
        encoder_modes=("train",),
        mem_ours=(64,),
        mem_keras=(),
        mem_forced=(),
        mem_calls=1,
        complexity="smoke",
    ),
}
SECTIONS = ("mha", "encoder", "memory", "complexity")


def _log(msg):
    print(msg, file=sys.stderr, flush=True)


def _probe(policy, settings):
    """Matmul GFLOP/s of the row's compute dtype, measured now (see `timing`)."""
    dtype = "float32" if policy == "float32" else "bfloat16"
    return timing.matmul_peak(dtype, n=settings["probe_n"], repeats=2)["gflops"]


def bench_pair(family, mode, shape, policy, settings):
    """One row: ours vs the peer for a layer family, mode, shape and dtype policy.

    Under `mixed_bfloat16`, training rows also time the peer in float32 (the
    baseline of the issue's "2.5x Keras' fp32" target), interleaved as well.
    """
    batch, length, dim = shape
    row = {
        "family": family,
        "mode": mode,
        "policy": policy,
        "batch": batch,
        "length": length,
        "dim": dim,
        "ours_layer": OURS[family],
        "peer_layer": PEERS[family],
    }
    if family == "encoder" and cases.keras_hub_or_none() is None:
        return {**row, "status": "skipped", "reason": "keras-hub is not installed "
                "(pip install keras-hub, or pip install -e '.[bench]')"}  # fmt: skip
    make = cases.make_mha if family == "mha" else cases.make_encoder
    flops_fn = cases.mha_flops if family == "mha" else cases.encoder_flops
    flops = flops_fn(batch, length, dim, mode == "train")
    x = cases.input_batch(batch, length, dim)
    keras.utils.set_random_seed(0)
    builders = {"ours": ("ours", policy), "peer": ("peer", policy)}
    if policy != "float32" and mode == "train" and settings["vs_fp32"]:
        builders["peer_fp32"] = ("peer", "float32")
    steps = {}
    for name, (kind, layer_policy) in builders.items():
        layer = make(kind, dim, layer_policy)
        steps[name] = (cases.train_step if mode == "train" else cases.infer_step)(layer, x)
    probe_before = _probe(policy, settings)
    result = timing.time_group(steps, (x,), settings["repeats"], settings["min_time"])
    probe = (probe_before + _probe(policy, settings)) / 2
    row.update(status="ok", flops=flops, probe_gflops=probe, loadavg=timing.loadavg())
    for name in builders:
        times = result[name]
        median = times["median_s"]
        row[name] = {
            **times,
            "tokens_per_s": batch * length / median,
            "gflops": flops / median / 1e9,
            "pct_probe": 100.0 * flops / median / 1e9 / probe,
        }
    row["ratio"] = result["ratio"]["peer"]
    if "peer_fp32" in builders:
        row["ratio_vs_peer_fp32"] = result["ratio"]["peer_fp32"]
    return row


def _fmt_ratio(r):
    return f"{r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}]"


def speed_table(rows):
    """Markdown table of the speed rows."""
    lines = [
        "| layer vs peer | mode | dtype | BxLxd | ours ms | peer ms | ours GFLOP/s (% probe) "
        "| peer GFLOP/s (% probe) | speed ours/peer, median [min-max] "
        "| mixed: ours/peer-fp32 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    names = {"mha": "MHA vs keras MHA", "encoder": "EncoderBlock vs keras-hub"}
    for row in rows:
        shape = f"{row['batch']}x{row['length']}x{row['dim']}"
        dtype = "fp32" if row["policy"] == "float32" else "mixed_bf16"
        head = f"| {names[row['family']]} | {row['mode']} | {dtype} | {shape} |"
        if row["status"] != "ok":
            lines.append(f"{head} - | - | - | - | skipped: {row['reason']} | - |")
            continue
        ours, peer = row["ours"], row["peer"]
        vs_fp32 = row.get("ratio_vs_peer_fp32")
        lines.append(
            f"{head} {1e3 * ours['median_s']:.1f} | {1e3 * peer['median_s']:.1f} | "
            f"{ours['gflops']:.0f} ({ours['pct_probe']:.0f}%) | "
            f"{peer['gflops']:.0f} ({peer['pct_probe']:.0f}%) | {_fmt_ratio(row['ratio'])} | "
            f"{_fmt_ratio(vs_fp32) if vs_fp32 else '-'} |"
        )
    return "\n".join(lines)


def memory_table(rows):
    lines = [
        "| layer | L | status | peak RSS MiB | RSS before MiB | first call s | step s |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"keras": "keras MHA", "auto": "ours (auto)", "dense": "ours (dense)",
             "chunked": "ours (chunked)"}  # fmt: skip
    for r in rows:
        ok = r["status"] == "ok"
        cells = [
            names[r["impl"]],
            str(r["length"]),
            r["status"],
            f"{r['peak_rss_mib']:.0f}" if ok else f">= {r['peak_rss_mib']:.0f}",
            f"{r['rss_before_mib']:.0f}" if ok else "-",
            f"{r['first_call_s']:.2f}" if ok else "-",
            f"{r['step_s']:.2f}" if ok else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0]
    )
    speed = parser.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="fewer repeats; a few minutes")
    speed.add_argument(
        "--smoke", action="store_true", help="tiny shapes, one repeat: checks the command"
    )
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    parser.add_argument("--repeats", type=int, help="interleaved repeats per row")
    parser.add_argument(
        "--sections",
        help="comma-separated subset of " + ",".join(SECTIONS) + " (default: all; quick runs "
        "leave out complexity unless it is named here)",
    )
    parser.add_argument("--policies", default=",".join(cases.POLICIES))
    parser.add_argument(
        "--mem-lengths", help="comma-separated lengths for ours (keras: those <= 8192)"
    )
    parser.add_argument("--mem-cap-gib", type=float, default=12.0)
    parser.add_argument("--plot", metavar="PNG", help="where to draw the complexity plot")
    return parser.parse_args(argv)


def main(argv=None):
    """Runs the benchmarks; prints the tables; returns (and writes) the report."""
    args = parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    settings = dict(SETTINGS[mode])
    if args.repeats:
        settings["repeats"] = args.repeats
    if args.mem_lengths:
        lengths = tuple(int(v) for v in args.mem_lengths.split(","))
        settings["mem_ours"] = lengths
        settings["mem_keras"] = tuple(v for v in lengths if v <= 8192)
        settings["mem_forced"] = ()
    sections = set(args.sections.split(",")) if args.sections else set(SECTIONS)
    if not sections <= set(SECTIONS):
        raise SystemExit(f"--sections: unknown {sorted(sections - set(SECTIONS))}")
    if args.sections and "complexity" in sections and not settings["complexity"]:
        settings["complexity"] = "full"  # named in a quick run
    shapes = cases.SMOKE_SHAPES if args.smoke else cases.SHAPES
    started = time.perf_counter()
    meta = {
        "command": "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv),
        "mode": mode,
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
    report = {"meta": meta}

    # Memory first, in subprocesses, while this process is still small.
    report["memory"] = []
    if "memory" in sections:
        plan = [("keras", n) for n in settings["mem_keras"]]
        plan += [("auto", n) for n in settings["mem_ours"]]
        plan += list(settings["mem_forced"])
        for impl, length in plan:
            _log(f"memory: {impl} L={length} ...")
            row = memory.measure(
                length, impl, calls=settings["mem_calls"], cap_gib=args.mem_cap_gib
            )
            row["loadavg"] = timing.loadavg()
            report["memory"].append(row)

    peak_n = settings["probe_n"] if args.smoke else 2048
    report["peak"] = {
        dtype: timing.matmul_peak(dtype, n=peak_n, repeats=3) for dtype in ("float32", "bfloat16")
    }

    rows = []
    plan = []
    for policy in args.policies.split(","):
        for shape in shapes:
            if "mha" in sections:
                plan += [("mha", m, shape, policy) for m in ("train", "infer")]
            if "encoder" in sections:
                plan += [("encoder", m, shape, policy) for m in settings["encoder_modes"]]
    for family, row_mode, shape, policy in plan:
        _log(f"{family} {row_mode} {policy} {shape} ...")
        rows.append(bench_pair(family, row_mode, shape, policy, settings))
        if rows[-1]["status"] != "ok":
            _log(f"  skipped: {rows[-1]['reason']}")
        else:
            _log(f"  speed ours/peer {_fmt_ratio(rows[-1]['ratio'])}")
    report["speed"] = rows
    for dtype in ("float32", "bfloat16"):  # the best matmul seen in the run
        probes = [r["probe_gflops"] for r in rows if r["status"] == "ok" and
                  (r["policy"] == "float32") == (dtype == "float32")]  # fmt: skip
        report["peak"][dtype]["best_gflops"] = max([report["peak"][dtype]["max"], *probes])

    if "complexity" in sections and settings["complexity"]:
        from benchmarks import complexity

        _log("complexity ...")
        plot_path = args.plot
        if plot_path is None and args.json:
            plot_path = os.path.splitext(args.json)[0] + "-complexity.png"
        report["complexity"] = complexity.run(settings["complexity"], plot_path=plot_path)

    report["targets"] = targets(rows, report["memory"])
    meta["loadavg_end"] = timing.loadavg()
    meta["duration_s"] = time.perf_counter() - started

    print(render(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        _log(f"wrote {args.json}")
    return report


def render(report):
    """The printed report: machine line, speed table, memory table, targets."""
    meta, peak = report["meta"], report["peak"]
    parts = [
        f"keras-attn {meta['keras_attn']} | TF {meta['tensorflow']} | Keras {meta['keras']} | "
        f"keras-hub {meta['keras_hub']} | {meta['cpu']['count']} CPUs | mode {meta['mode']} | "
        f"{meta['duration_s']:.0f} s",
        f"loadavg start {meta['loadavg_start']} end {meta.get('loadavg_end')}",
        f"matmul peak (best {peak['float32']['n']}^3 tf.matmul of the run): fp32 "
        f"{peak['float32']['best_gflops']:.0f} GFLOP/s, bf16 "
        f"{peak['bfloat16']['best_gflops']:.0f} GFLOP/s. '% probe' is against a matmul of "
        "the row's compute dtype timed right before and after the row.",
        "",
        speed_table(report["speed"]),
    ]
    if report["memory"]:
        parts += ["", "Peak RSS (VmHWM) of one MHA training step, B1 d256, 8 heads, fresh "
                  "process (TensorFlow itself is ~0.6 GiB of it):", ""]  # fmt: skip
        parts.append(memory_table(report["memory"]))
    if report.get("complexity"):
        from benchmarks import complexity

        parts += ["", complexity.table(report["complexity"])]
    if report["targets"]:
        parts += ["", "| target | shape | measured | met | ceiling: ours at 100% of the "
                  "matmul probe |", "|---|---|---|---|---|"]  # fmt: skip
        for t in report["targets"]:
            shape = "x".join(str(v) for v in t["shape"])
            ceiling = "-" if t.get("ceiling") is None else f"{t['ceiling']:.2f}"
            parts.append(f"| {t['target']} | {shape} | {t['value']:.2f} | {t['met']} | {ceiling} |")
    return "\n".join(parts)


if __name__ == "__main__":
    main()
