"""The int8 KV cache against the float cache: bytes, memory, quality, speed (issue 59).

    python -m benchmarks.kv_cache --bytes [--json PATH]                   # any backend
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.kv_cache --memory [--json PATH]
    python -m benchmarks.kv_cache --quality RUN.keras --data-dir DIR [--json PATH]
    python -m benchmarks.kv_cache --speed [--prompts 1024 4096] [--quick] [--json PATH]
    python -m benchmarks.kv_cache --reads [--quick] [--json PATH]                  # TensorFlow

`--bytes`: the caches of a GPT-2-small-sized `transformer_lm` (`GPT2_SMALL`: 12 blocks,
12 heads of 64, hidden 768) at batch 1 for a 4,096-token prompt and 64 new tokens
(`LanguageModelSteps.start`'s sizes, `P - 1 + new` positions): the arrays' bytes
(`nbytes` of every key, value, scale and valid tensor of `empty_cache`), float32 against
int8 (the int8 numbers and their float32 scale per position and head).

`--memory` (JAX): XLA's buffer assignment (`memory_analysis()`) for one compiled decoding
step of that model at that cache length, the weights passed as arguments (Keras'
`StatelessScope`): arguments (weights, caches), output (logits, the new caches) and temp
(what the step allocates besides: the keys and values read back in float32 for the
int8 cache); peak = their sum (no buffer donated).

`--quality`: the trained language model of results/README.md (`keras-attn train
transformer-lm`'s `.keras`) on its test texts (the first 500 of `keras_attn_rt_polarity`'s
test split, the recipe's `--test-examples` default, from `--data-dir`): the perplexity
computed through cached decoding (each text fed token by token through
`LanguageModelSteps.step`, `exp` of the mean cross-entropy over its real target tokens, as
`recipes.language_model.perplexity` computes it on the full pass, printed beside), float
cache against int8; and greedy agreement: each text's first half (at least its start token)
as the prompt, 24 greedy new tokens (the recipe's `MAX_LENGTH`; `[UNK]` suppressed, as the
text model does), the share of positions where the int8 cache's token equals the float
cache's.

`--speed` (TensorFlow, or the backend set): the GPT-2-small-sized model (random weights),
batch 1, a prompt of 1,024 and of 4,096 random tokens prefilled once per cache, then
compiled loops of 4 and of 20 greedy decoding steps from that state
(`tf.function(jit_compile=True)` / `jax.jit`; torch eagerly), float32 and int8 caches
interleaved (`benchmarks.timing.time_group`); a step is the difference over 16 steps (the
loop's fixed costs cancel): tokens/s (1 / the median step) and int8 / float32 per repeat.

`--reads` (TensorFlow): the attention of one step over 12 blocks' caches at 4,159 positions
alone, float32 against the int8 reads and two ways of folding the scales
(`attention_reads`).
"""

import argparse
import datetime
import functools
import json
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import timing  # noqa: E402

GPT2_SMALL = dict(num_layers=12, num_heads=12, d_model=768, intermediate_dim=3072)
VOCAB, PROMPT, NEW = 50257, 4096, 64
DTYPES = (None, "int8")  # the float cache (the compute dtype), int8


def _label(dtype):
    return "int8" if dtype == "int8" else "float32"


def gpt2_small(sequence_length, vocab=VOCAB):
    from keras_attn.models import transformer_lm

    keras.utils.set_random_seed(0)
    return transformer_lm(vocab, sequence_length=sequence_length, dropout=0.0, **GPT2_SMALL)


def _nbytes(tree):
    return sum(
        int(np.prod(x.shape)) * np.dtype(keras.backend.standardize_dtype(x.dtype)).itemsize
        for x in keras.tree.flatten(tree)
    )


def cache_bytes(prompt=PROMPT, new=NEW):
    """The arrays' bytes of every block's cache, float32 and int8, at `prompt - 1 + new`."""
    from keras_attn.models.transformer_lm import LanguageModelSteps

    steps = LanguageModelSteps(gpt2_small(prompt + new))
    rows = {}
    for dtype in DTYPES:
        caches = [b.empty_cache(1, prompt - 1 + new, dtype) for b in steps.blocks]
        keys_values = [(c.key, c.value) for c in caches]
        rows[_label(dtype)] = {
            "bytes": _nbytes(caches),
            "keys_values_bytes": _nbytes(keys_values),  # without `valid` (1 byte a position)
        }
    ratio = rows["float32"]["bytes"] / rows["int8"]["bytes"]
    kv_ratio = rows["float32"]["keys_values_bytes"] / rows["int8"]["keys_values_bytes"]
    print(f"| cache | bytes (B=1, {prompt - 1 + new} positions, 12 blocks) | MiB |")
    print("|---|---|---|")
    for label, row in rows.items():
        print(f"| {label} | {row['bytes']:,} | {row['bytes'] / 2**20:.1f} |")
    print(f"float32 / int8: {ratio:.3f}x (keys and values alone: {kv_ratio:.3f}x)")
    return {"prompt": prompt, "new": new, "rows": rows, "ratio": ratio, "kv_ratio": kv_ratio}


def step_memory(prompt=PROMPT, new=NEW):
    """XLA's buffers of one compiled decoding step at `prompt - 1 + new` cache positions (JAX)."""
    import jax

    from keras_attn.models.transformer_lm import LanguageModelState, LanguageModelSteps

    model = gpt2_small(prompt + new)
    variables = model.variables
    values = [v.value for v in variables]
    rows = {}
    mib = 1 / 2**20
    for dtype in DTYPES:
        steps = LanguageModelSteps(model, kv_cache_dtype=dtype)
        length = prompt - 1 + new
        state = LanguageModelState(
            [b.empty_cache(1, length, dtype) for b in steps.blocks],
            keras.ops.full((1,), prompt, "int32"),
            keras.ops.full((1,), prompt - 1, "int32"),
        )

        def step(values, tokens, state, steps=steps):
            with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
                return steps.step(tokens, 0, state)

        tokens = keras.ops.ones((1,), "int32")
        analysis = jax.jit(step).lower(values, tokens, state).compile().memory_analysis()
        row = {
            "argument_mib": analysis.argument_size_in_bytes * mib,
            "output_mib": analysis.output_size_in_bytes * mib,
            "temp_mib": analysis.temp_size_in_bytes * mib,
            "cache_mib": _nbytes(state.caches) * mib,
        }
        row["peak_mib"] = row["argument_mib"] + row["output_mib"] + row["temp_mib"]
        rows[_label(dtype)] = row
    print("| cache | arguments MiB (weights + caches) | output MiB | temp MiB | peak MiB |")
    print("|---|---|---|---|---|")
    for label, r in rows.items():
        print(f"| {label} | {r['argument_mib']:.1f} | {r['output_mib']:.1f} "
              f"| {r['temp_mib']:.1f} | {r['peak_mib']:.1f} |")  # fmt: skip
    return {"prompt": prompt, "new": new, "rows": rows}


def _test_texts(data_dir, count=500):
    from keras_attn.models.datasets import loading

    ds = loading.load("keras_attn_rt_polarity", "test", data_dir)
    return [t.numpy() for t, _ in ds.take(count)]


def quality(path, data_dir, count=500, new=24):
    """Perplexity through cached decoding and greedy agreement, float vs int8 cache."""
    from keras_attn.models import generate
    from keras_attn.models.recipes.language_model import SEQUENCE_LENGTH, perplexity
    from keras_attn.models.transformer_lm import LanguageModelSteps

    text_model = keras.saving.load_model(path)
    model = text_model.language_model
    texts = _test_texts(data_dir, count)
    ids = np.asarray(text_model.sequence_ids(np.array(texts)))[:, :SEQUENCE_LENGTH]  # (N, T)
    rows = [row[row != 0] for row in ids]  # each text's tokens (start, words, end)
    width = max(len(r) for r in rows)
    padded = np.zeros((len(rows), width), "int32")
    for i, row in enumerate(rows):
        padded[i, : len(row)] = row
    inputs, targets = padded[:, :-1], padded[:, 1:]
    full, full_tokens = perplexity(model, [(inputs, targets)])

    def cached_perplexity(dtype):
        steps = LanguageModelSteps(model, kv_cache_dtype=dtype)
        state = steps.start(padded[:, :1], width)  # the start token: fed at the first step
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            step = tf.function(steps.step, jit_compile=True)
        else:
            step = steps.step
        total, count = 0.0, 0
        for i in range(width - 1):
            index = keras.ops.convert_to_tensor(i, "int32")  # (a tensor: one trace)
            logits, state = step(keras.ops.convert_to_tensor(padded[:, i]), index, state)
            logits = keras.ops.cast(logits, "float32")
            losses = keras.ops.sparse_categorical_crossentropy(
                targets[:, i], logits, from_logits=True
            )
            real = targets[:, i] != 0
            total += float(np.sum(keras.ops.convert_to_numpy(losses)[real]))
            count += int(real.sum())
        return math.exp(total / count), count

    cached = {_label(d): cached_perplexity(d) for d in DTYPES}
    prompts = np.zeros((len(rows), width), "int32")
    for i, row in enumerate(rows):
        half = max(1, len(row) // 2)
        prompts[i, width - half :] = row[:half]  # left-padded
    suppress = text_model.suppress_ids
    tokens = {
        _label(d): generate(model, prompts, new, suppress_ids=suppress, kv_cache_dtype=d)
        for d in DTYPES
    }
    agreement = float(np.mean(tokens["int8"] == tokens["float32"]))
    prefix = np.cumprod(tokens["int8"] == tokens["float32"], axis=1).sum(1)  # before a change
    report = {
        "texts": len(rows),
        "full_pass_perplexity": full,
        "tokens": full_tokens,
        "cached_perplexity": {k: v[0] for k, v in cached.items()},
        "cached_tokens": {k: v[1] for k, v in cached.items()},
        "perplexity_change": cached["int8"][0] / cached["float32"][0] - 1,
        "greedy_agreement": agreement,
        "greedy_positions": int(tokens["int8"].size),
        "rows_identical": float(np.mean(prefix == new)),
        "new": new,
    }
    print(f"full pass perplexity {full:.4f} over {full_tokens} tokens")
    for label, (value, n) in cached.items():
        print(f"cached, {label} cache: perplexity {value:.4f} over {n} tokens")
    print(f"int8 / float32 perplexity - 1: {report['perplexity_change']:+.4%}")
    print(f"greedy agreement: {agreement:.4%} of {tokens['int8'].size} positions "
          f"({len(rows)} texts x {new}); rows identical: "
          f"{report['rows_identical']:.2%}")  # fmt: skip
    return report


def attention_reads(positions=PROMPT - 1 + NEW, repeats=5):
    """The attention of one decoding step over 12 blocks' caches (TensorFlow, XLA), alone.

    One query per head (12 heads of 64) over `positions` keys and values per block, each
    block its own arrays: float32 caches (`matmul`, softmax, `matmul`), against int8 caches
    read back as the attention reads them (`cast * scale`, then the same), and two ways of
    folding the scales instead: `cast` only into the matmuls, the key scale on the scores and
    the value scale on the weights; and a multiply-and-sum over the int8 numbers (no matmul:
    XLA fuses the cast into the reduction, reading the int8 bytes once).
    """
    import tensorflow as tf

    rng = np.random.default_rng(0)
    shape = (1, 12, positions, 64)
    query = tf.constant(rng.normal(size=(1, 12, 1, 64)).astype("float32"))
    floats = [tf.constant(rng.normal(size=shape).astype("float32")) for _ in range(24)]
    ints = [tf.cast(tf.round(x * 30), tf.int8) for x in floats]
    scales = [tf.fill((1, 12, positions, 1), 1 / 30) for _ in range(24)]

    def each_block(attend):
        def run(keys, values, key_scales, value_scales):
            total = 0.0
            for block in zip(keys, values, key_scales, value_scales, strict=True):
                total += tf.reduce_sum(attend(*block))
            return total

        return tf.function(run, jit_compile=True)

    def softmax_matmuls(k, v, *_):
        weights = tf.nn.softmax(tf.matmul(query, k, transpose_b=True) / 8.0)
        return tf.matmul(weights, v)

    def dequantized(k, v, a, b):
        return softmax_matmuls(tf.cast(k, tf.float32) * a, tf.cast(v, tf.float32) * b)

    def cast_only(k, v, a, b):
        scores = tf.matmul(query, tf.cast(k, tf.float32), transpose_b=True)
        weights = tf.nn.softmax(scores * tf.transpose(a, (0, 1, 3, 2)) / 8.0)
        return tf.matmul(weights * tf.transpose(b, (0, 1, 3, 2)), tf.cast(v, tf.float32))

    def summed(k, v, a, b):
        scores = tf.reduce_sum(query * tf.cast(k, tf.float32), -1)[:, :, None] / 8.0
        weights = tf.nn.softmax(scores * tf.transpose(a, (0, 1, 3, 2)))
        weighted = tf.transpose(weights, (0, 1, 3, 2)) * b  # (1, 12, S, 1)
        return tf.reduce_sum(weighted * tf.cast(v, tf.float32), 2)

    args = {"float32": (floats[:12], floats[12:], scales[:12], scales[12:])}
    int8 = (ints[:12], ints[12:], scales[:12], scales[12:])
    args |= {name: int8 for name in ("int8, cast * scale", "int8, cast only", "int8, summed")}
    kinds = dict(zip(args, (softmax_matmuls, dequantized, cast_only, summed), strict=True))
    fns = {name: functools.partial(each_block(kinds[name]), *args[name]) for name in args}
    reference = float(fns["float32"]())
    result = timing.time_group(fns, (), repeats=repeats, min_time=0.3)
    rows = {}
    print(f"| reads of 12 blocks, {positions} positions | ms | time / float32 |")
    print("|---|---|---|")
    for name in fns:
        ratio = 1.0 if name == "float32" else result["ratio"][name]["median"]
        rows[name] = {"ms": 1000 * result[name]["median_s"], "time_vs_float": ratio}
        print(f"| {name} | {rows[name]['ms']:.1f} | {ratio:.2f} |")
    return {"positions": positions, "rows": rows, "float_output": reference}


def speed(prompts=(1024, PROMPT), repeats=5, new=NEW, short=4, long=20):
    """Tokens/s of compiled decoding steps after a prefill, float32 vs int8 caches.

    A step's time is `(t(long) - t(short)) / (long - short)` per repeat, `t(n)` the time of
    one compiled call running `n` steps in a loop from the prefilled state (the caches
    loop-carried, updated in place as in `generate`'s loop): the call's fixed costs (the
    copy of the caches it is given, the crossing into the compiled function) cancel.
    """
    from keras import ops

    from keras_attn._execution import no_gradients
    from keras_attn.models.transformer_lm import LanguageModelSteps

    backend = keras.backend.backend()

    def compiled(fn):
        if backend == "tensorflow":
            import tensorflow as tf

            return tf.function(fn, jit_compile=True)
        if backend == "jax":
            import jax

            return jax.jit(fn, static_argnums=(2,))
        return fn

    rows = []
    for prompt in prompts:
        model = gpt2_small(prompt + new)
        tokens = np.random.default_rng(1).integers(1, VOCAB, (1, prompt)).astype("int32")
        fns, states = {}, {}
        for dtype in DTYPES:
            steps = LanguageModelSteps(model, kv_cache_dtype=dtype)
            start = compiled(lambda p, steps=steps: steps.start(p, new))

            def loop(token, state, count, steps=steps):
                def body(index, carry, steps=steps):
                    token, state, total = carry
                    logits, state = steps.step(token, index, state)
                    return ops.cast(ops.argmax(logits, -1), "int32"), state, total + logits[0, 0]

                return ops.fori_loop(0, count, body, (token, state, ops.zeros(())))[2]

            loop = compiled(loop)
            with no_gradients():
                states[dtype] = start(ops.convert_to_tensor(tokens))
            token = ops.convert_to_tensor(tokens[:, -1])
            for count in (short, long):

                def run(loop=loop, state=states[dtype], token=token, count=count):
                    with no_gradients():
                        return ops.convert_to_numpy(loop(token, state, count))

                fns[f"{_label(dtype)} {count}"] = run
        result = timing.time_group(fns, (), repeats=repeats, min_time=0.0, max_calls=1)
        row = {"prompt": prompt, "batch": 1, "steps": (short, long), "load": timing.loadavg()}
        step_s = {}
        for dtype in DTYPES:
            label = _label(dtype)
            times = zip(result[f"{label} {long}"]["times_s"], result[f"{label} {short}"]["times_s"],
                        strict=True)  # fmt: skip
            step_s[label] = [(a - b) / (long - short) for a, b in times]
            median = float(np.median(step_s[label]))
            row[label] = {"tokens_per_s": 1 / median, "step_ms": 1000 * median,
                          "step_s": step_s[label]}  # fmt: skip
        speedups = [f / i for f, i in zip(step_s["float32"], step_s["int8"], strict=True)]
        row["int8_speed_vs_float"] = {**timing.summarize(speedups), "samples": speedups}
        row["cache_bytes"] = {_label(d): _nbytes(states[d].caches) for d in DTYPES}
        rows.append(row)
        s = row["int8_speed_vs_float"]
        print(f"| {prompt} | {row['float32']['tokens_per_s']:.2f} | "
              f"{row['int8']['tokens_per_s']:.2f} | {s['median']:.3f} "
              f"[{s['min']:.3f}-{s['max']:.3f}] |", flush=True)  # fmt: skip
    return {"backend": backend, "rows": rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", action="store_true")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--quality", metavar="RUN_KERAS")
    parser.add_argument("--data-dir")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--reads", action="store_true")
    parser.add_argument("--prompts", type=int, nargs="+", default=[1024, PROMPT])
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    report = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "backend": keras.backend.backend(),
        "load_start": timing.loadavg(),
    }
    if args.bytes:
        report["bytes"] = cache_bytes()
    if args.memory:
        report["memory"] = step_memory()
    if args.quality:
        report["quality"] = quality(args.quality, args.data_dir)
    if args.speed:
        print("| prompt | float32 cache tokens/s | int8 cache tokens/s | int8 / float32 [range] |")
        print("|---|---|---|---|")
        report["speed"] = speed(args.prompts, repeats=3 if args.quick else 5)
    if args.reads:
        report["reads"] = attention_reads(repeats=3 if args.quick else 5)
    report["load_end"] = timing.loadavg()
    print(f"load average: start {report['load_start']}, end {report['load_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
