"""Where the time goes: the profiles behind the roofline's unmet targets (issue 47).

    python -m benchmarks.profile attention [--dtype float32|bfloat16]
    python -m benchmarks.profile step
    python -m benchmarks.profile decode
    python -m benchmarks.profile decode-ops
    python -m benchmarks.profile matvec

TensorFlow, one process, repeats interleaved (`benchmarks.timing.time_group`); each
row is a median in ms.

`attention`: the attention core of the 2 x 2048 x 256 (8 heads) training step, q, k,
v of `(2, 8, 2048, 32)`, its pieces against what memory allows: writing the
`(2, 8, 2048, 2048)` scores once (a fill), `Q K^T` alone (its output written), under
XLA, `Q K^T` then softmax then `P V` (forward), and `keras_attn.kernels.fused_attention`
forward and forward + backward, in `tf.function` and under XLA.

`step`: the MultiHeadAttention training step of the roofline's 2 x 2048 x 256 row (8
heads; forward, backward, SGD; `cases.train_step`) under `float32` and `mixed_bfloat16`,
against its two parts timed alone with their gradients: the four projections (the
layer's own `EinsumDense`s on the same input) and the attention core
(`kernels.fused_attention` on `(2, 8, 2048, 32)` heads of the compute dtype). What the
parts leave of the whole step is the rest: the heads' transposes, casts, masks and the
SGD update.

`decode`: one cached decoding step of a GPT-2-small-sized `transformer_lm` (12 layers,
12 heads, hidden 768, vocabulary 50,257; a 32-token prompt prefilled) at batch 1, as a
`tf.function` graph and under XLA: the whole step, the 12 blocks alone, the output
projection alone, the blocks' feed-forward sublayers alone and their attention's
query and output projections alone (the model's own layers: XLA's matrix-vector
products against oneDNN's on the same weights); and a chain of matrix-vector
products with the blocks' weight shapes (12 x 768x2304, 768x768, 768x3072, 3072x768:
the weights a step reads), the bandwidth-bound floor of the blocks, in GB/s.

`decode-ops`: the same GPT-2-small-sized step, ours and keras-hub's `call_with_cache` on
the same weights, as `tf.function` graphs (traced inside `no_gradients()`, as `generate`
traces its loops) under TensorFlow's profiler: each op type's
time per step (the executor's op events, both of its threads), and the step's time
unprofiled. The op times add up to more than the step where the executor runs ops side
by side (and each of two ops at once runs slower). Then ours under XLA, by kind of XLA
kernel (`bitcast_dot_fusion`: a matrix-vector product XLA emits as a loop of its own,
see `matvec`).

`matvec`: why XLA does not help a batch-1 step on this CPU. 48 chained matrix-vector
products `(1, 768) x (768, 768)` (a GPT-2-small step's attention projections), the
kernel a 2-D variable or a 3-D `(768, 12, 64)` one reshaped to 2-D (the layout of
`EinsumDense`'s kernels), with and without a bias, as graphs and under XLA, in GB/s of
weights read; `--dtype bfloat16`: the same in bfloat16 (half the bytes).
"""

import argparse
import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import timing  # noqa: E402


def _print(result, names, extra=None):
    for name in names:
        note = f"  {extra[name]}" if extra and name in extra else ""
        print(f"| {name} | {1e3 * result[name]['median_s']:.1f} |{note}")


def attention(dtype="float32", shape=(2, 8, 2048, 32), repeats=5):
    """The attention core's pieces at `shape` `(B, h, L, dh)`; prints a table."""
    from keras_attn import kernels

    batch, heads, length, dim = shape
    q, k, v = (tf.cast(tf.random.normal(shape, seed=i), dtype) for i in range(3))
    spec = kernels.AttentionSpec(return_weights=False)

    def first(x):  # a scalar that waits for `x` without reading all of it
        return tf.reduce_sum(tf.cast(x[..., :1, :1], "float32"))

    def fused(q, k, v):
        return kernels.fused_attention(q, k, v, spec)[0]

    def forward_backward(fn):
        def step(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                loss = tf.reduce_sum(tf.cast(fn(q, k, v), "float32") ** 2)
            return tf.add_n([first(g) for g in tape.gradient(loss, [q, k, v])])

        return step

    scores = (batch, heads, length, length)
    plain = {
        "write the scores once (a fill)": lambda q, k, v: first(
            tf.fill(scores, tf.cast(q[0, 0, 0, 0], dtype))
        ),
        "Q K^T": lambda q, k, v: first(tf.matmul(q, k, transpose_b=True)),
        "Q K^T, softmax, P V": lambda q, k, v: first(
            tf.matmul(tf.nn.softmax(tf.matmul(q, k, transpose_b=True)), v)
        ),
        "fused kernel, forward": lambda q, k, v: first(fused(q, k, v)),
        "fused kernel, forward + backward": forward_backward(fused),
    }
    xla = {
        "Q K^T (XLA)": plain["Q K^T"],
        "fused kernel, forward + backward (XLA)": plain["fused kernel, forward + backward"],
    }
    fns = {name: tf.function(fn) for name, fn in plain.items()}
    fns.update({name: tf.function(fn, jit_compile=True) for name, fn in xla.items()})
    result = timing.time_group(fns, (q, k, v), repeats=repeats, min_time=0.3)
    nbytes = np.prod(scores) * tf.as_dtype(dtype).size
    print(f"attention core {dtype}, q k v {shape}: the scores are {nbytes / 1e6:.0f} MB")
    print("| piece | ms |\n|---|---|")
    write_gbps = nbytes / result["write the scores once (a fill)"]["median_s"] / 1e9
    gflops = 2 * np.prod(scores) * dim / result["Q K^T"]["median_s"] / 1e9
    _print(result, fns, {
        "write the scores once (a fill)": f"({write_gbps:.1f} GB/s)",
        "Q K^T": f"({gflops:.0f} GFLOP/s)",
    })  # fmt: skip
    return result


def step(shape=(2, 2048, 256), repeats=5):
    """The MHA training step against its projections and its attention core; prints a table."""
    from benchmarks import cases
    from keras_attn import kernels

    batch, length, dim = shape
    heads = cases.NUM_HEADS
    x = cases.input_batch(batch, length, dim)
    spec = kernels.AttentionSpec(return_weights=False)
    fns = {}
    for policy in cases.POLICIES:
        layer = cases.make_mha("ours", dim, policy)
        fns[f"{policy}: whole step"] = cases.train_step(layer, x)
        dense = [layer._query_dense, layer._key_dense, layer._value_dense]

        def projections(x, layer=layer, dense=dense):  # (B, L, h, dh) each, then back to d
            q, k, v = (d(x) for d in dense)
            y = layer._output_dense(q + k + v)
            return tf.reduce_mean(tf.square(tf.cast(y, "float32")))

        fns[f"{policy}: 4 projections"] = cases.sgd_step(projections, layer.trainable_variables)
        compute = layer.compute_dtype
        qkv = [
            tf.Variable(tf.cast(tf.random.normal((batch, heads, length, dim // heads), seed=i),
                                compute))
            for i in range(3)
        ]  # fmt: skip

        def core(x, qkv=qkv):
            out = kernels.fused_attention(*qkv, spec)[0]
            return tf.reduce_mean(tf.square(tf.cast(out, "float32"))) + 0 * tf.reduce_sum(x[0, 0])

        fns[f"{policy}: attention core"] = cases.sgd_step(core, qkv)
    result = timing.time_group(fns, (x,), repeats=repeats, min_time=0.3)
    print(f"MHA training step {batch}x{length}x{dim}, {heads} heads: the whole and its parts")
    print("| piece | ms |\n|---|---|")
    extra = {}
    for policy in cases.POLICIES:
        parts = [result[f"{policy}: {p}"]["median_s"] for p in ("4 projections", "attention core")]
        rest = result[f"{policy}: whole step"]["median_s"] - sum(parts)
        extra[f"{policy}: whole step"] = f"(the rest: {1e3 * rest:.1f} ms)"
    _print(result, fns, extra)
    return result


GPT2_SMALL = dict(vocabulary_size=50257, num_layers=12, num_heads=12, hidden_dim=768,
                  intermediate_dim=3072, max_sequence_length=1024)  # fmt: skip


def _gpt2_steps(config=None, prompt=32):
    """A keras-hub `GPT2Backbone` (`config`, default GPT-2 small) and our model on its weights.

    Returns `(backbone, steps, state, token, whole)`: our `LanguageModelSteps`, its state
    after a `(1, prompt)` prefill, the last prompt token, and `whole(token, state)`, one
    cached step reduced to a scalar that waits for its logits and a cache.
    """
    import keras_hub

    from keras_attn.models.gpt2 import from_gpt2_backbone
    from keras_attn.models.transformer_lm import LanguageModelSteps

    config = config or GPT2_SMALL
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(**config)
    steps = LanguageModelSteps(from_gpt2_backbone(backbone, dropout=0.0))
    vocab = config["vocabulary_size"]
    prompts = tf.constant(np.random.default_rng(1).integers(1, vocab, (1, prompt)), "int32")
    state = steps.start(prompts, 40)

    def whole(token, state):
        logits, new = steps.step(token, 3, state)
        return tf.reduce_sum(logits[:, :4]) + tf.reduce_sum(new.caches[0].key[0, 0, 0])

    return backbone, steps, state, prompts[:, -1], whole


def decode(repeats=5):
    """One decoding step of a GPT-2-small-sized model, graph and XLA; prints a table."""
    _, steps, state, token, whole = _gpt2_steps()

    def blocks(token, state):
        x = steps._embed(token[:, None], state.positions[:, None])
        x, caches = steps._blocks(x, tf.not_equal(token[:, None], 0), state.caches, 34)
        return tf.reduce_sum(x) + tf.reduce_sum(caches[0].key[0, 0, 0])

    def logits(token, state):
        x = tf.ones((1, 768)) * tf.cast(state.positions, "float32")[:, None]  # (1, d)
        return tf.reduce_sum(steps._logits(x)[:, :4])

    def _input(state):  # (1, 1, d), a value the trace cannot fold
        return tf.ones((1, 1, 768)) * tf.cast(state.positions, "float32")[:, None, None] * 1e-3

    def feedforward(token, state):  # the blocks' feed-forward sublayers alone
        x = _input(state)
        for block in steps.blocks:
            x = block._feedforward_residual(x, False)
        return tf.reduce_sum(x)

    def projections(token, state):  # the attention's query and output projections alone
        x = _input(state)
        for block in steps.blocks:
            layer = block._self_attention_layer
            x = x + layer._output_dense(layer._query_dense(x))
        return tf.reduce_sum(x)

    pieces = (("step", whole), ("12 blocks", blocks), ("output projection", logits),
              ("12 feed-forward sublayers", feedforward),
              ("12 query + output projections", projections))  # fmt: skip
    fns = {}
    for name, fn in pieces:
        fns[f"{name}, graph"] = tf.function(fn)
        fns[f"{name}, XLA"] = tf.function(fn, jit_compile=True)
    result = timing.time_group(fns, (token, state), repeats=repeats, min_time=0.3)

    shapes = ((768, 2304), (768, 768), (768, 3072), (3072, 768))
    weights = [tf.Variable(tf.random.normal(s) * 0.02) for _ in range(12) for s in shapes]

    def chain(x):
        for i in range(12):
            a, b, c, d = weights[4 * i : 4 * i + 4]
            x = x + tf.matmul(tf.matmul(x, a)[:, :768], b)
            x = x + tf.matmul(tf.nn.relu(tf.matmul(x, c)), d)
        return tf.reduce_sum(x)

    floor = {"matrix-vector chain, graph": tf.function(chain),
             "matrix-vector chain, XLA": tf.function(chain, jit_compile=True)}  # fmt: skip
    floors = timing.time_group(floor, (tf.random.normal((1, 768)),), repeats, min_time=0.3)
    nbytes = sum(int(np.prod(w.shape)) for w in weights) * 4
    print("decoding step, GPT-2 small, batch 1, float32")
    print("| piece | ms |\n|---|---|")
    _print(result, fns)
    _print(floors, floor, {
        name: f"({nbytes / floors[name]['median_s'] / 1e9:.1f} GB/s of {nbytes / 1e6:.0f} MB)"
        for name in floor
    })  # fmt: skip
    return result, floors


def _op_times(xspace_path, xla=False, skip=()):
    """`{op type: picoseconds}` of the op events in a profile (`.xplane.pb`).

    TensorFlow's ops (events `node:OpType` of the executor's threads), or with `xla`
    the kernels of XLA's executable (`bitcast_dot_fusion.3`, `dot.1`: numbers dropped;
    `skip`: other lower-case event names, the Python function's).
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xspace_path, "rb") as f:
        space.ParseFromString(f.read())
    times = {}
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if not xla and not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name.strip()
                if xla:  # an HLO instruction's name: lower case, `_`, `-`, `.N`
                    if not re.fullmatch(r"[a-z][a-z0-9_\-]*(\.\d+)?", name) or name in skip:
                        continue
                    kind = re.sub(r"\.\d+$", "", name)
                elif ":" not in name or "::" in name:  # "node:OpType" only, not the runtime's
                    continue
                else:
                    kind = name.rsplit(":", 1)[1]
                times[kind] = times.get(kind, 0) + event.duration_ps
    return times


def _profiled(fn, args, calls, xla=False):
    """`{op type: ms per call}` of `calls` calls of `fn(*args)` under the profiler."""
    import glob
    import tempfile

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        for _ in range(calls):
            fn(*args).numpy()
        tf.profiler.experimental.stop()
        (path,) = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
        skip = {getattr(fn, "__name__", "")}
        return {kind: ps / 1e9 / calls for kind, ps in _op_times(path, xla, skip).items()}


def decode_ops(config=None, calls=10, repeats=5, prompt=32, rows=12):
    """Op-type times of ours and keras-hub's GPT-2-small decoding step; prints a table."""
    import keras_hub

    from keras_attn._execution import no_gradients

    config = config or GPT2_SMALL
    backbone, _, state, token, ours = _gpt2_steps(config, prompt)
    hub = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    heads = config["num_heads"]
    cache = tf.zeros((1, config["num_layers"], 2, prompt + 40, heads,
                      config["hidden_dim"] // heads))  # fmt: skip

    def theirs(token, cache):
        logits, _, new = hub.call_with_cache(token[:, None], cache, prompt + 2)
        return tf.reduce_sum(logits[:, :, :4]) + tf.reduce_sum(new[0, 0, 0, 0])

    cases = {"ours": (tf.function(ours), (token, state)),
             "keras-hub": (tf.function(theirs), (token, cache))}  # fmt: skip
    with no_gradients():  # traced as `generate` traces its loops
        for fn, args in cases.values():
            fn(*args)
    calls_of = {name: (lambda fn=fn, args=args: fn(*args)) for name, (fn, args) in cases.items()}
    walls = timing.time_group(calls_of, (), repeats=repeats, min_time=0.3)  # interleaved
    ops = {name: _profiled(fn, args, calls) for name, (fn, args) in cases.items()}
    kinds = sorted(set(ops["ours"]) | set(ops["keras-hub"]), key=lambda k: -ops["ours"].get(k, 0))
    print("decoding step, batch 1, float32, graphs: op time per step (ms), by op type")
    print("| op type | ours | keras-hub |\n|---|---|---|")
    for kind in kinds[:rows]:
        print(f"| {kind} | {ops['ours'].get(kind, 0):.2f} | {ops['keras-hub'].get(kind, 0):.2f} |")
    matmul = {n: sum(t for k, t in ops[n].items() if "MatMul" in k) for n in ops}
    total = {n: sum(ops[n].values()) for n in ops}
    print(f"| every matmul | {matmul['ours']:.2f} | {matmul['keras-hub']:.2f} |")
    print(f"| every op | {total['ours']:.2f} | {total['keras-hub']:.2f} |")
    print(f"| the step, unprofiled | {1e3 * walls['ours']['median_s']:.2f} "
          f"| {1e3 * walls['keras-hub']['median_s']:.2f} |")  # fmt: skip
    compiled = tf.function(ours, jit_compile=True)
    with no_gradients():
        compiled(token, state)
    kernels = _profiled(compiled, (token, state), calls, xla=True)
    print("\nours under XLA: time per step (ms) of each kind of XLA kernel")
    print("| kernel | ms |\n|---|---|")
    for kind in sorted(kernels, key=lambda k: -kernels[k])[:rows]:
        print(f"| {kind} | {kernels[kind]:.2f} |")
    print(f"| every kernel | {sum(kernels.values()):.2f} |")
    ops["ours, XLA"] = kernels
    return ops, walls


def matvec(width=768, heads=12, count=48, repeats=5, dtype="float32"):
    """Chained `(1, width) x (width, width)` products, 2-D or 3-D kernels, graph and XLA."""
    keras.utils.set_random_seed(0)
    flat = [tf.Variable(tf.cast(tf.random.normal((width, width)) * 0.02, dtype))
            for _ in range(count)]  # fmt: skip
    split = [tf.Variable(tf.reshape(w, (width, heads, width // heads))) for w in flat]
    bias = [tf.Variable(tf.cast(tf.random.normal((width,)) * 0.02, dtype)) for _ in range(count)]

    def chain(kernel, with_bias):
        def run(x):
            for i in range(count):
                y = tf.matmul(x, tf.reshape(kernel[i], (width, width)))
                x = x + 1e-3 * (y + bias[i] if with_bias else y)
            return tf.reduce_sum(tf.cast(x, "float32"))

        return run

    fns = {}
    for kernel, layout in ((flat, "2-D kernel"), (split, "3-D kernel reshaped")):
        for with_bias in (False, True):
            name = f"{layout}{', + bias' if with_bias else ''}"
            fns[f"{name}, graph"] = tf.function(chain(kernel, with_bias))
            fns[f"{name}, XLA"] = tf.function(chain(kernel, with_bias), jit_compile=True)
    x = tf.cast(tf.random.normal((1, width)), dtype)
    values = {name: float(fn(x)) for name, fn in fns.items()}  # the same products each way
    reference = values[next(iter(fns))]
    for name, value in values.items():
        if abs(value - values[name.replace("3-D kernel reshaped", "2-D kernel")]) > 3e-2 * (
            1 + abs(reference)
        ):
            raise AssertionError(f"{name} computes {value}, not the 2-D kernel's")
    result = timing.time_group(fns, (x,), repeats=repeats, min_time=0.3)
    nbytes = count * width * width * tf.as_dtype(dtype).size
    print(f"{count} chained matrix-vector products, (1, {width}) x ({width}, {width}), {dtype}")
    print("| kernel | ms |\n|---|---|")
    _print(result, fns, {
        name: f"({nbytes / result[name]['median_s'] / 1e9:.1f} GB/s of {nbytes / 1e6:.0f} MB)"
        for name in fns
    })  # fmt: skip
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("attention", "step", "decode", "decode-ops", "matvec"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args(argv)
    if keras.backend.backend() != "tensorflow":
        sys.exit("benchmarks.profile times tf.function steps: KERAS_BACKEND=tensorflow")
    if args.what == "attention":
        return attention(args.dtype)
    if args.what == "decode-ops":
        return decode_ops()
    if args.what == "matvec":
        return matvec(dtype=args.dtype)
    return step() if args.what == "step" else decode()


if __name__ == "__main__":
    main()
