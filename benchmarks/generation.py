"""Text generation, ours vs keras-hub: tokens per second and peak memory.

    KERAS_BACKEND=tensorflow python -m benchmarks.generation [--quick] [--json PATH]
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.generation [--quick] [--json PATH]

A randomly initialized `keras_hub.models.GPT2Backbone` (4 layers, 8 heads,
hidden 256, intermediate 1024, vocabulary 5,000) and the same weights in a
`keras_attn.models.transformer_lm` (`keras_attn.models.gpt2.from_gpt2_backbone`).
Greedy, a prompt of 32 random tokens, 64 new tokens, batch 1 and 8; each
library compiled as it does by default: `keras_attn.models.generate` (one
`tf.function(jit_compile=True)` / `jax.jit` of the prefill and the cached
loop) against `keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
.generate` (its own compiled `generate_step`, XLA on TensorFlow). In one
process, repeats interleaved (`benchmarks.timing.time_group`); the speed
ratio ours / keras-hub in tokens per second (> 1: ours is faster), median
[min-max]. Both generate the same tokens (checked per row).

Peak memory: each library's generation in a fresh subprocess
(`--child`), compiled by a first call, then the kernel's RSS high-water
mark reset (`/proc/self/clear_refs`, after `malloc_trim` hands the memory the
first call freed back to the kernel) and one more call: the growth of the
peak RSS over the RSS before that call (working memory: activations, caches,
scores; not the weights or the compiled program).

The long-context row: a 4,096-token prompt, 64 new tokens, batch 1; ours
with `sliding_window=512` (each token sees the last 512) and the chunked
kernel, keras-hub with full attention (it has no window), on backbones with
4,160 positions; the two compute different functions, so only speed and
memory are compared.
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import timing  # noqa: E402

VOCAB, LAYERS, HEADS, HIDDEN, INTERMEDIATE = 5000, 4, 8, 256, 1024
PROMPT, NEW = 32, 64
LONG_PROMPT, WINDOW = 4096, 512
ROWS = [  # (batch, prompt length, sliding window of ours)
    (1, PROMPT, None),
    (8, PROMPT, None),
    (1, LONG_PROMPT, WINDOW),
]


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def build(prompt_length, window, smoke=False):
    """`(ours, keras-hub's GPT2CausalLM)`, the same random weights."""
    import keras_hub

    from keras_attn.models.gpt2 import from_gpt2_backbone

    keras.utils.set_random_seed(0)
    size = dict(num_layers=1, num_heads=2, hidden_dim=32, intermediate_dim=64) if smoke else {}
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB,
        num_layers=size.get("num_layers", LAYERS),
        num_heads=size.get("num_heads", HEADS),
        hidden_dim=size.get("hidden_dim", HIDDEN),
        intermediate_dim=size.get("intermediate_dim", INTERMEDIATE),
        max_sequence_length=max(1024, prompt_length + NEW),
    )
    options = {} if window is None else dict(sliding_window=window, implementation="chunked")
    ours = from_gpt2_backbone(backbone, dropout=0.0, **options)
    return ours, keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def generators(ours, hub, batch, prompt_length, new):
    """`(ours(), hub())`: each generates `new` greedy tokens after the same prompts."""
    from keras_attn.models import generate

    prompts = np.random.default_rng(1).integers(1, VOCAB, (batch, prompt_length)).astype("int32")
    hub_inputs = {
        "token_ids": np.concatenate([prompts, np.zeros((batch, new), "int32")], 1),
        "padding_mask": np.arange(prompt_length + new)[None].repeat(batch, 0) < prompt_length,
    }
    hub.compile(sampler="greedy")

    def run_ours():
        return generate(ours, prompts + 1, new) - 1  # ids shifted: token 0 is our padding

    def run_hub():
        return np.asarray(hub.generate(hub_inputs, stop_token_ids=None)["token_ids"])[
            :, prompt_length:
        ]

    return run_ours, run_hub


def _child(args):
    ours, hub = build(args.prompt, args.window, args.smoke)
    run_ours, run_hub = generators(ours, hub, args.batch, args.prompt, args.new)
    run = run_ours if args.child == "ours" else run_hub
    run()  # compile
    # The allocator keeps what the first call freed: hand it back to the kernel, so that the
    # second call's peak counts the memory it needs (else it reuses the pool: no growth).
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := the current RSS
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    print("RESULT " + json.dumps({"delta_mib": (peak - before) / 1024, "seconds": seconds}))


def peak_memory(who, batch, prompt, window, new, smoke):
    command = [sys.executable, "-m", "benchmarks.generation", "--child", who,
               "--batch", str(batch), "--prompt", str(prompt), "--new", str(new)]  # fmt: skip
    command += ["--window", str(window)] if window else []
    command += ["--smoke"] if smoke else []
    out = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"status": "failed", "stderr": out.stderr[-2000:]}
    return {"status": "ok", **json.loads(lines[-1][len("RESULT ") :])}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats, no long-context row")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, 4 new tokens")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--json", help="write every sample to this file")
    parser.add_argument("--child", choices=("ours", "keras-hub"), help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--prompt", type=int, default=PROMPT, help=argparse.SUPPRESS)
    parser.add_argument("--new", type=int, default=NEW, help=argparse.SUPPRESS)
    parser.add_argument("--window", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    new = 4 if args.smoke else NEW
    rows = ROWS[:2] if (args.quick or args.smoke) else ROWS
    repeats = 1 if args.smoke else 3 if args.quick else 7
    backend = keras.backend.backend()
    print(f"backend {backend}, keras {keras.__version__}, loadavg {timing.loadavg()}")
    print("| rows | B | prompt + new | ours tok/s | keras-hub tok/s | speed ours/keras-hub "
          "| same tokens | peak MiB ours | peak MiB keras-hub |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    report = []
    for batch, prompt, window in rows:
        prompt = 8 if args.smoke else prompt
        ours, hub = build(prompt, window, args.smoke)
        run_ours, run_hub = generators(ours, hub, batch, prompt, new)
        same = bool(np.array_equal(run_ours(), run_hub())) if window is None else None
        long_row = window is not None
        result = timing.time_group(
            {"ours": run_ours, "keras-hub": run_hub}, (),
            repeats=2 if long_row and not args.quick else repeats, min_time=0.0, max_calls=1,
        )  # fmt: skip
        tokens = batch * new
        row = {
            "backend": backend, "batch": batch, "prompt": prompt, "new": new, "window": window,
            "same_tokens": same,
            "ours_tokens_per_s": tokens / result["ours"]["median_s"],
            "hub_tokens_per_s": tokens / result["keras-hub"]["median_s"],
            "ratio": result["ratio"]["keras-hub"], "timing": result,
        }  # fmt: skip
        if not args.no_memory:
            row["memory"] = {
                who: peak_memory(who, batch, prompt, window, new, args.smoke)
                for who in ("ours", "keras-hub")
            }
        report.append(row)
        ratio = row["ratio"]
        memory = [
            f"{row['memory'][w].get('delta_mib', float('nan')):.0f}" if "memory" in row else "-"
            for w in ("ours", "keras-hub")
        ]
        label = f"window {window}, chunked" if window else "greedy"
        print(
            f"| {label} | {batch} | {prompt} + {new} | {row['ours_tokens_per_s']:.0f} "
            f"| {row['hub_tokens_per_s']:.0f} | {ratio['median']:.2f} "
            f"[{ratio['min']:.2f}-{ratio['max']:.2f}] | {'-' if same is None else same} "
            f"| {memory[0]} | {memory[1]} |",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": backend, "rows": report}, f, indent=1, default=str)
    return report


if __name__ == "__main__":
    main()
