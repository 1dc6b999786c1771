"""Text generation, ours vs keras-hub: tokens per second and working memory.

    KERAS_BACKEND=tensorflow python -m benchmarks.generation [--quick] [--json PATH]
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.generation [--quick] [--json PATH]
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.generation --memory-scaling
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.generation --ring-memory
    KERAS_BACKEND=torch python -m benchmarks.generation --gpt2-small [--quick] [--json PATH]

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

Working memory (JAX): XLA's own buffer assignment for each library's
compiled generation program (`jax.jit(...).lower(...).compile()
.memory_analysis()`, read from the program the first call compiles):
`temp` is what the program allocates while it runs (activations, the
KV cache, attention scores), apart from its arguments (the weights, the
prompts) and outputs. A static figure from the compiler, not a sampled
RSS: the same on a loaded machine. TensorFlow's XLA does not expose it
(an RSS high-water mark read nothing there: XLA's buffers come from a pool
the first call already holds), so the columns read "-" on TensorFlow.

The long-context row: a 4,096-token prompt, 64 new tokens, batch 1; ours
with `sliding_window=512` (each token sees the last 512) and the chunked
kernel, keras-hub with full attention (it has no window), on backbones with
4,160 positions; the two compute different functions, so only speed and
memory are compared.

The sampler rows (batch 8): ours' `sampler="sample", top_k=10` against keras-hub's
`TopKSampler(k=10)` (different random draws: speed only), and ours' greedy with
`repetition_penalty=1.3` against keras-hub's greedy (keras-hub's samplers have no
repetition penalty: its row is the same decode without one). The overhead rows: ours
against ours, the same compiled decode with and without its extra outputs: `generate`
greedy with `return_scores=True`, and a `transformer_seq2seq` of the same size (32-token
sources, 64 tokens decoded, `greedy_decode` under `tf.function(jit_compile=True)` /
`jax.jit`) with `return_alignment=True`; "time on/off" is the median per-repeat ratio.

The ring rows (`--ring-memory`, JAX): ours alone, a rotary `transformer_lm` of the
same size generating 512 and 4,096 tokens after a 32-token prompt, with
`sliding_window=256` (its caches rings of 256 positions per block,
`keras_attn.cache.RingKVCache`) and with full attention (caches of every
position); the window's temp must stay flat in the number of new tokens.

The GPT-2-small rows (`--gpt2-small`, any backend; issue 47): the same comparison
at GPT-2 small's size (`GPT2_SMALL`: 12 layers, 12 heads, hidden 768,
intermediate 3,072, vocabulary 50,257, 124 M weights, 0.5 GB in float32), greedy,
batch 1 and 8, prompt 32 + 64 new tokens, and, beside tokens/s, the bytes a
decoding step must read (`decode_bytes`: every weight once, the KV cache) times
the steps per second, against the memory bandwidth of a NumPy copy measured in
the same run (`benchmarks.timing.copy_bandwidth`). The steps per second are the
new tokens over the whole call, the prefill included: a lower bound of the
decoding step's own rate (`benchmarks.roofline` times the step alone). With
`--smoke`, a tiny model.

The weights rows (`--gpt2-small --weights float32,bfloat16,int8`; issue 59): the same
GPT-2-small comparison with each weight format in one process, every library and format
timed in the same interleaved repeats: `float32`; `bfloat16` (both libraries built under
Keras' `bfloat16` policy: bf16 weights and KV caches); `int8` (both built in float32, then
`model.quantize("int8")`: int8 kernels and token tables with a float32 scale per output
channel, float32 KV caches). Beside tokens/s: the bytes a step reads at that format
(`decode_bytes`), their share of the copy bandwidth, and ours' speed against ours' float32
(the per-repeat ratio of the two times: > 1 faster).
"""

import argparse
import functools
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import timing  # noqa: E402

VOCAB, LAYERS, HEADS, HIDDEN, INTERMEDIATE = 5000, 4, 8, 256, 1024
# Model sizes, as `keras_hub.models.GPT2Backbone` arguments.
DEFAULT_SIZE = dict(
    vocabulary_size=VOCAB, num_layers=LAYERS, num_heads=HEADS, hidden_dim=HIDDEN,
    intermediate_dim=INTERMEDIATE,
)  # fmt: skip
GPT2_SMALL = dict(
    vocabulary_size=50257, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072
)
TINY = dict(vocabulary_size=VOCAB, num_layers=1, num_heads=2, hidden_dim=32, intermediate_dim=64)
PROMPT, NEW = 32, 64
LONG_PROMPT, WINDOW = 4096, 512
RING_WINDOW, RING_NEW = 256, (512, 4096)
ROWS = [  # (batch, prompt length, sliding window of ours, setting: a key of SETTINGS)
    (1, PROMPT, None, "greedy"),
    (8, PROMPT, None, "greedy"),
    (8, PROMPT, None, "top-k 10"),
    (8, PROMPT, None, "repetition penalty 1.3"),
    (1, LONG_PROMPT, WINDOW, "greedy"),
]
SETTINGS = {  # setting -> (ours' `generate` options, keras-hub's sampler: what it runs)
    "greedy": ({}, "greedy"),
    "top-k 10": ({"sampler": "sample", "top_k": 10, "seed": 0}, "top_k"),
    "repetition penalty 1.3": ({"repetition_penalty": 1.3}, "greedy"),  # keras-hub has none
}


WEIGHTS = ("float32", "bfloat16", "int8")


def build_weights(weights, prompt_length, smoke=False, size=None):
    """`(ours, keras-hub's)` as `build` makes them, with `weights` of `WEIGHTS`.

    `"bfloat16"`: both built under Keras' `bfloat16` policy; `"int8"`: built in float32,
    then `quantize("int8")` (Keras' own: int8 kernels and token tables, a float32 scale per
    output channel, inputs quantized per row at each call).
    """
    import warnings

    if weights not in WEIGHTS:
        raise ValueError(f"`weights` must be one of {WEIGHTS}. Received: weights={weights!r}")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("bfloat16" if weights == "bfloat16" else "float32")
    try:
        ours, hub = build(prompt_length, None, smoke, size)
    finally:
        keras.config.set_dtype_policy(previous)
    if weights == "int8":
        with warnings.catch_warnings():  # layers without int8 weights (norms) say so
            warnings.simplefilter("ignore", UserWarning)
            for model in (ours, hub):
                model.quantize("int8")
    return ours, hub


def build(prompt_length, window, smoke=False, size=None, dropout=0.1):
    """`(ours, keras-hub's GPT2CausalLM)`, the same random weights.

    Args:
        prompt_length: the longest prompt (the backbone has at least
            `prompt_length + NEW` positions, and 1,024).
        window: ours' `sliding_window` (with the chunked kernel), or `None`.
        smoke: the `TINY` model, whatever `size` says.
        size: `GPT2Backbone` sizes (`DEFAULT_SIZE` by default, `GPT2_SMALL`).
        dropout: the backbone's (keras-hub's default); ours has none. Training
            steps pass 0.0 so that both compute the same function.
    """
    import keras_hub

    from keras_attn.models.gpt2 import from_gpt2_backbone

    keras.utils.set_random_seed(0)
    size = TINY if smoke else size or DEFAULT_SIZE
    backbone = keras_hub.models.GPT2Backbone(
        **size, dropout=dropout, max_sequence_length=max(1024, prompt_length + NEW)
    )
    options = {} if window is None else dict(sliding_window=window, implementation="chunked")
    ours = from_gpt2_backbone(backbone, dropout=0.0, **options)
    return ours, keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def decode_bytes(size, batch, cache_length, itemsize=4, weight_itemsize=None):
    """Bytes one decoding step of a GPT-2-shaped model must read from memory.

    Every weight once, and the KV cache:

    - per block: the query, key, value and output kernels and biases
      (`4 d^2 + 4 d`), the feed-forward (`2 d I + I + d`), two layer norms
      (`4 d`);
    - the token table `V x d` once: the tied output projection reads all of
      it (the step's embedding lookup reads `B` of its rows, not counted
      again); the final layer norm (`2 d`); of the position table the `B`
      rows the step looks up (`B d`), not the table;
    - the KV cache: keys and values of every block at `cache_length`
      positions, `2 x layers x B x cache_length x d`.

    The weights are read once whatever the batch (the bound a step at batch
    1 is held to: it reads every weight for one token); activations, the
    logits written and the cache's one new position are left out.

    Args:
        size: `GPT2Backbone` sizes (`GPT2_SMALL`, `DEFAULT_SIZE`, `TINY`).
        batch: sequences decoded at once.
        cache_length: positions a step attends to (mean over the steps timed:
            `mean_cache_length`).
        itemsize: bytes per weight and cache value (4: float32).
        weight_itemsize: bytes per weight where they differ from the cache's (1: an
            int8-quantized model; its float32 per-channel scales, under 1 % of the
            bytes, are left out, as are the biases' and norms' widths).

    Returns:
        Bytes, a float (`cache_length` may be a mean).
    """
    d, inner = size["hidden_dim"], size["intermediate_dim"]
    block = 4 * d * d + 4 * d + 2 * d * inner + inner + d + 4 * d
    weights = size["num_layers"] * block + size["vocabulary_size"] * d + 2 * d + batch * d
    cache = 2 * size["num_layers"] * batch * cache_length * d
    return float(weights) * (weight_itemsize or itemsize) + float(cache) * itemsize


def mean_cache_length(prompt_length, first, last):
    """Mean positions attended to by decoding steps `first..last` (1-based) after a prompt.

    `keras_attn.models.generate` prefills all of the prompt but its last
    token; step `k` feeds the token at position `prompt_length + k - 2` and
    attends to `prompt_length + k - 1` positions (the prompt and the new
    tokens before it, itself included).
    """
    return prompt_length - 1 + (first + last) / 2


def generators(ours, hub, batch, prompt_length, new, setting="greedy"):
    """`(ours(), hub())`: each generates `new` tokens after the same prompts, as `setting`
    (a key of `SETTINGS`) says."""
    import keras_hub

    from keras_attn.models import generate

    options, hub_sampler = SETTINGS[setting]
    vocab = hub.backbone.vocabulary_size
    prompts = np.random.default_rng(1).integers(1, vocab, (batch, prompt_length)).astype("int32")
    hub_inputs = {
        "token_ids": np.concatenate([prompts, np.zeros((batch, new), "int32")], 1),
        "padding_mask": np.arange(prompt_length + new)[None].repeat(batch, 0) < prompt_length,
    }
    if hub_sampler == "top_k":
        hub_sampler = keras_hub.samplers.TopKSampler(k=options["top_k"], seed=options["seed"])
    hub.compile(sampler=hub_sampler)

    def run_ours():
        return generate(ours, prompts + 1, new, **options) - 1  # ids shifted: 0 is our padding

    def run_hub():
        return np.asarray(hub.generate(hub_inputs, stop_token_ids=None)["token_ids"])[
            :, prompt_length:
        ]

    return run_ours, run_hub


def xla_memory(run):
    """MiB of XLA's buffers for the program `run()` compiles first (JAX): temp, arguments, output.

    `jax.jit` is wrapped while `run` makes its first call, so that the jitted function
    it builds (ours in `models.generation.compiled`, keras-hub's in
    `CausalLM.make_generate_function`) and the arguments of its first call are kept; the
    program is lowered and compiled again with them and XLA's `memory_analysis()` read. With
    several programs, the largest temp.
    """
    import jax

    real_jit, calls = jax.jit, []

    def recording_jit(fun=None, **options):
        if fun is None:  # used as `partial(jax.jit, static_argnames=...)`
            return functools.partial(recording_jit, **options)
        jitted = real_jit(fun, **options)

        def call(*args, **kwargs):
            if not any(c[0] is jitted for c in calls):
                calls.append((jitted, args, kwargs))
            return jitted(*args, **kwargs)

        return call

    jax.jit = recording_jit
    try:
        run()
    finally:
        jax.jit = real_jit
    if not calls:
        raise RuntimeError("the generation compiled no jax.jit program (already compiled?)")
    mib = 1 / 2**20
    stats = [jitted.lower(*a, **k).compile().memory_analysis() for jitted, a, k in calls]
    largest = max(stats, key=lambda m: m.temp_size_in_bytes)
    return {
        "temp_mib": largest.temp_size_in_bytes * mib,
        "argument_mib": largest.argument_size_in_bytes * mib,
        "output_mib": largest.output_size_in_bytes * mib,
        "programs": len(stats),
    }


def memory_scaling(new=NEW):
    """Ours' XLA temp MiB at long prompts, full attention vs `sliding_window=512` (JAX).

    Each row generates once (so its program is compiled and read); keras-hub is not run.
    """
    rows = []
    print("| ours | prompt + new | temp MiB | arguments MiB |\n|---|---|---|---|")
    for prompt, window in [(2048, None), (4096, None), (2048, WINDOW), (4096, WINDOW)]:
        ours, hub = build(prompt, window)
        run_ours, _ = generators(ours, hub, 1, prompt, new)
        memory = xla_memory(run_ours)
        rows.append({"prompt": prompt, "new": new, "window": window, **memory})
        label = "full attention" if window is None else f"window {window}, chunked"
        print(f"| {label} | {prompt} + {new} | {memory['temp_mib']:.1f} "
              f"| {memory['argument_mib']:.1f} |", flush=True)  # fmt: skip
    return rows


def ring_memory(news=RING_NEW, window=RING_WINDOW):
    """Ours' XLA temp MiB generating `news` tokens, `sliding_window=window` (ring caches)
    against full attention (JAX); the ratio of the window's temps, last over first."""
    from keras_attn.models import generate, transformer_lm

    prompts = np.random.default_rng(1).integers(1, VOCAB, (1, PROMPT)).astype("int32")
    rows = []
    print("| ours | prompt + new | temp MiB | arguments MiB |\n|---|---|---|---|")
    for sliding_window in (window, None):
        for new in news:
            keras.utils.set_random_seed(0)
            model = transformer_lm(
                VOCAB, LAYERS, HEADS, HIDDEN, INTERMEDIATE, position="rotary",
                sliding_window=sliding_window, dropout=0.0,
            )  # fmt: skip
            memory = xla_memory(lambda model=model, new=new: generate(model, prompts, new))
            rows.append({"prompt": PROMPT, "new": new, "window": sliding_window, **memory})
            label = "full attention" if sliding_window is None else f"window {window}, ring"
            print(f"| {label} | {PROMPT} + {new} | {memory['temp_mib']:.1f} "
                  f"| {memory['argument_mib']:.1f} |", flush=True)  # fmt: skip
    ratio = rows[len(news) - 1]["temp_mib"] / rows[0]["temp_mib"]
    print(f"window {window}: temp at {news[-1]} new tokens / at {news[0]}: {ratio:.3f}")
    return {"rows": rows, "ring_ratio": ratio}


def overhead(repeats, smoke=False):
    """Ours against ours: the same compiled decode without and with its extra outputs.

    `generate` greedy with `return_scores=True` (the language model of the rows), and a
    `transformer_seq2seq` of the same size decoding 8 sources of 32 tokens with
    `greedy_decode(..., return_alignment=True)` under XLA (`generation.compiled._compile`:
    `tf.function(jit_compile=True)`, `jax.jit`). Prints a table; returns its rows, "time
    on/off" being the per-repeat ratio of the two (1.0: free).
    """
    from keras_attn.models import generate, greedy_decode, transformer_seq2seq
    from keras_attn.models.generation.compiled import _compile

    batch, new, prompt = (8, 4, 8) if smoke else (8, NEW, PROMPT)
    inputs = np.random.default_rng(1).integers(1, VOCAB, (batch, prompt)).astype("int32")
    lm = build(prompt, None, smoke)[0]
    keras.utils.set_random_seed(0)
    size = (1, 2, 32, 64) if smoke else (LAYERS, HEADS, HIDDEN, INTERMEDIATE)
    seq2seq = transformer_seq2seq(VOCAB, VOCAB, *size, dropout=0.0)

    def decoder(return_alignment):
        def decode(source):
            return greedy_decode(seq2seq, source, new, 1, return_alignment=return_alignment)

        compiled = _compile(tuple(seq2seq.variables), decode)
        if not return_alignment:
            return lambda: np.asarray(compiled(inputs))
        return lambda: np.asarray(compiled(inputs)[1])  # the alignment (B, new, S), read

    pairs = {
        "scores: `generate`, greedy": (
            lambda: generate(lm, inputs, new),
            lambda: generate(lm, inputs, new, return_scores=True)[1],
        ),
        "alignment: seq2seq `greedy_decode`": (decoder(False), decoder(True)),
    }
    print("| overhead | B | steps | ours off tok/s | ours on tok/s | time on/off |")
    print("|---|---|---|---|---|---|")
    rows = []
    for label, (off, on) in pairs.items():
        result = timing.time_group(
            {"off": off, "on": on}, (), repeats=repeats, min_time=0.0, max_calls=1
        )
        ratio = result["ratio"]["on"]  # per repeat: t_on / t_off
        tokens = batch * new
        rows.append({"overhead": label, "batch": batch, "new": new, "timing": result})
        print(
            f"| {label} | {batch} | {new} | {tokens / result['off']['median_s']:.0f} "
            f"| {tokens / result['on']['median_s']:.0f} | {ratio['median']:.2f} "
            f"[{ratio['min']:.2f}-{ratio['max']:.2f}] |",
            flush=True,
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats, no long-context row")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, 4 new tokens")
    parser.add_argument("--no-memory", action="store_true", help="skip XLA's memory analysis (JAX)")
    parser.add_argument("--json", help="write every sample to this file")
    parser.add_argument(
        "--memory-scaling", action="store_true",
        help="JAX: ours' XLA temp memory at prompts 2,048 and 4,096, full attention vs window",
    )  # fmt: skip
    parser.add_argument(
        "--ring-memory", action="store_true",
        help="JAX: ours' XLA temp memory, 512 and 4,096 new tokens, window 256 (ring) vs full",
    )  # fmt: skip
    parser.add_argument(
        "--gpt2-small", action="store_true",
        help="GPT-2 small's size, batch 1 and 8 greedy, bytes/s against the copy bandwidth",
    )  # fmt: skip
    parser.add_argument(
        "--weights", help="with --gpt2-small: weight formats side by side, e.g. "
        "float32,bfloat16,int8",
    )  # fmt: skip
    parser.add_argument("--batches", default="1,8", help="with --weights: the batch sizes")
    parser.add_argument("--new", type=int, help="new tokens a call (default 64; 4 with --smoke)")
    args = parser.parse_args(argv)
    if args.weights and not args.gpt2_small:
        parser.error("--weights compares formats at GPT-2 small's size: add --gpt2-small")
    if args.ring_memory:
        if keras.backend.backend() != "jax":
            parser.error("--ring-memory reads XLA's memory analysis: KERAS_BACKEND=jax only")
        result = ring_memory()
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"backend": "jax", **result}, f, indent=1, default=str)
        return result
    if args.memory_scaling:
        if keras.backend.backend() != "jax":
            parser.error("--memory-scaling reads XLA's memory analysis: KERAS_BACKEND=jax only")
        return memory_scaling()
    new = args.new or (4 if args.smoke else NEW)
    repeats = 1 if args.smoke else 3 if args.quick else 7
    if args.gpt2_small:
        rows = [(batch, PROMPT, None, "greedy") for batch in (1, 8)]
        size = TINY if args.smoke else GPT2_SMALL
        bandwidth = timing.copy_bandwidth(8 if args.smoke else 256, 3 if args.smoke else 7)
    else:
        rows = [r for r in ROWS if r[2] is None] if (args.quick or args.smoke) else ROWS
        size, bandwidth = DEFAULT_SIZE, None
    backend = keras.backend.backend()
    print(f"backend {backend}, keras {keras.__version__}, loadavg {timing.loadavg()}")
    if bandwidth is not None:
        print(f"memory bandwidth, NumPy copy of {bandwidth['mib']} MiB (read + write): median "
              f"{bandwidth['gbps']:.1f} GB/s, best {bandwidth['max']:.1f}")  # fmt: skip
    memory = backend == "jax" and not args.no_memory
    if args.weights:
        weights = tuple(w.strip() for w in args.weights.split(","))
        batches = tuple(int(b) for b in args.batches.split(","))
        report = compare_weights(weights, batches, new, repeats, args.smoke, size, bandwidth)
    else:
        report = compare(rows, new, repeats, args.smoke, memory, size, bandwidth)
    if args.gpt2_small:
        result = {"backend": backend, "size": size, "bandwidth": bandwidth, "rows": report}
    else:
        result = {"backend": backend, "rows": report, "overhead": overhead(repeats, args.smoke)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return report


def compare(rows, new, repeats, smoke, memory, size, bandwidth=None):
    """Ours vs keras-hub for each row of `rows` (as `ROWS`); prints the table, returns the rows.

    With a `bandwidth` (`timing.copy_bandwidth`), each row also has the bytes a
    decoding step reads (`decode_bytes`, float32) times the steps per second of
    the whole call, and their share of the bandwidth (`bytes`).
    """
    backend = keras.backend.backend()
    head = ("| rows | B | prompt + new | ours tok/s | keras-hub tok/s | speed ours/keras-hub "
            "| same tokens | temp MiB ours | temp MiB keras-hub |")  # fmt: skip
    if bandwidth is not None:
        head += " MB/step | ours GB/s (% copy) | keras-hub GB/s (% copy) |"
    print(head)
    print("|---" * head.count(" |") + "|")
    report = []
    for batch, prompt, window, setting in rows:
        prompt = 8 if smoke else prompt
        ours, hub = build(prompt, window, smoke, size)
        run_ours, run_hub = generators(ours, hub, batch, prompt, new, setting)
        xla = None  # XLA's analysis needs the first call: before any other
        if memory:
            xla = {"ours": xla_memory(run_ours), "keras-hub": xla_memory(run_hub)}
        comparable = window is None and setting == "greedy"  # the same function of the prompts
        same = bool(np.array_equal(run_ours(), run_hub())) if comparable else None
        long_row = window is not None  # in full runs only: two repeats
        result = timing.time_group(
            {"ours": run_ours, "keras-hub": run_hub}, (),
            repeats=2 if long_row else repeats, min_time=0.0, max_calls=1,
        )  # fmt: skip
        tokens = batch * new
        row = {
            "backend": backend, "batch": batch, "prompt": prompt, "new": new, "window": window,
            "setting": setting, "same_tokens": same,
            "ours_tokens_per_s": tokens / result["ours"]["median_s"],
            "hub_tokens_per_s": tokens / result["keras-hub"]["median_s"],
            "ratio": result["ratio"]["keras-hub"], "timing": result,
        }  # fmt: skip
        if xla is not None:
            row["xla_memory"] = xla
        ratio = row["ratio"]
        temp = [f"{xla[w]['temp_mib']:.1f}" if xla else "-" for w in ("ours", "keras-hub")]
        label = f"window {window}, chunked" if window else setting
        if SETTINGS[setting][0].get("repetition_penalty"):
            label += " (keras-hub: greedy, it has none)"
        line = (
            f"| {label} | {batch} | {prompt} + {new} | {row['ours_tokens_per_s']:.0f} "
            f"| {row['hub_tokens_per_s']:.0f} | {ratio['median']:.2f} "
            f"[{ratio['min']:.2f}-{ratio['max']:.2f}] | {'-' if same is None else same} "
            f"| {temp[0]} | {temp[1]} |"
        )
        if bandwidth is not None:
            step = decode_bytes(size, batch, mean_cache_length(prompt, 1, new))
            row["bytes"] = {"per_step": step, "bandwidth_gbps": bandwidth["gbps"]}
            line += f" {step / 1e6:.0f} |"
            for name, key in (("ours", "ours_tokens_per_s"), ("keras-hub", "hub_tokens_per_s")):
                gbps = step * row[key] / batch / 1e9  # steps/s = tokens/s / batch
                share = 100 * gbps / bandwidth["gbps"]
                row["bytes"][name] = {"gbps": gbps, "pct_bandwidth": share}
                line += f" {gbps:.1f} ({share:.0f}%) |"
        report.append(row)
        print(line, flush=True)
    return report


def compare_weights(weights, batches, new, repeats, smoke, size, bandwidth):
    """Ours and keras-hub's at each weight format of `weights`, greedy, all timed together.

    For each batch of `batches`: every `(library, format)` generator in one
    `timing.time_group` (interleaved repeats); prints a row per format and returns them.
    """
    backend = keras.backend.backend()
    head = (
        "| weights | B | ours tok/s | ours / ours float32 | keras-hub tok/s | ours/keras-hub "
        "| same tokens as keras-hub | MB/step | ours GB/s (% copy) | keras-hub GB/s (% copy) |"
    )
    print(head)
    print("|---" * head.count(" |") + "|")
    prompt = 8 if smoke else PROMPT
    report = []
    for batch in batches:
        fns, same = {}, {}
        for w in weights:
            ours, hub = build_weights(w, prompt, smoke, size)
            fns[f"ours {w}"], fns[f"keras-hub {w}"] = generators(ours, hub, batch, prompt, new)
            same[w] = bool(np.array_equal(fns[f"ours {w}"](), fns[f"keras-hub {w}"]()))
        result = timing.time_group(fns, (), repeats=repeats, min_time=0.0, max_calls=1)
        base = result[f"ours {weights[0]}"]["times_s"]
        for w in weights:
            ours_t, hub_t = result[f"ours {w}"]["times_s"], result[f"keras-hub {w}"]["times_s"]
            speed = timing.summarize([b / t for b, t in zip(base, ours_t, strict=True)])
            vs_hub = timing.summarize([h / t for h, t in zip(hub_t, ours_t, strict=True)])
            tokens = batch * new
            row = {
                "backend": backend, "weights": w, "batch": batch, "prompt": prompt, "new": new,
                "same_tokens": same[w],
                "ours_tokens_per_s": tokens / result[f"ours {w}"]["median_s"],
                "hub_tokens_per_s": tokens / result[f"keras-hub {w}"]["median_s"],
                "speed_vs_first": speed, "ratio": vs_hub, "loadavg": timing.loadavg(),
                "timing": {k: v for k, v in result.items() if k.endswith(f" {w}")},
            }  # fmt: skip
            itemsize = 2 if w == "bfloat16" else 4
            step = decode_bytes(
                size, batch, mean_cache_length(prompt, 1, new), itemsize=itemsize,
                weight_itemsize=1 if w == "int8" else None,
            )  # fmt: skip
            row["bytes"] = {"per_step": step, "bandwidth_gbps": bandwidth["gbps"]}
            cells = []
            for name, key in (("ours", "ours_tokens_per_s"), ("keras-hub", "hub_tokens_per_s")):
                gbps = step * row[key] / batch / 1e9  # steps/s = tokens/s / batch
                share = 100 * gbps / bandwidth["gbps"]
                row["bytes"][name] = {"gbps": gbps, "pct_bandwidth": share}
                cells.append(f"{gbps:.1f} ({share:.0f}%)")
            report.append(row)
            print(
                f"| {w} | {batch} | {row['ours_tokens_per_s']:.1f} | {speed['median']:.2f} "
                f"[{speed['min']:.2f}-{speed['max']:.2f}] | {row['hub_tokens_per_s']:.1f} "
                f"| {vs_hub['median']:.2f} [{vs_hub['min']:.2f}-{vs_hub['max']:.2f}] "
                f"| {same[w]} | {step / 1e6:.0f} | {cells[0]} | {cells[1]} |",
                flush=True,
            )
    return report


if __name__ == "__main__":
    main()
