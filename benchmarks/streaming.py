"""Streaming from a SavedModel: a Python loop over `decode_step` against the one-shot `generate`.

    python -m benchmarks.streaming [--batch 1] [--new 24] [--repeats 5] [--json PATH]

A `TextLanguageModel` of the `transformer-lm` recipe's size (2 blocks, 4 heads, d_model 64,
feed-forward 256, learned positions, a 5,000-word vocabulary; random weights: the tokens do
not matter, and none is the end token's, so every call makes `--new` tokens) exported with
`export_text` and loaded with `tf.saved_model.load`. Greedy, one prompt of 16 words per row:

- `generate`: the signature with `temperature=0`: the whole loop inside one call;
- `stream`: `prefill`, then `decode_step` once per token from Python, each token's argmax taken
  in the client (`tf.argmax`) before the next step: a client that shows tokens as they come.

Both make the same tokens (checked). Tokens/s = new tokens x batch / median time per call,
repeats interleaved (`benchmarks.timing.time_group`); the ratio is `generate`'s speed over the
loop's (> 1: the one-shot call is faster, by the per-step cost of crossing into the graph).
TensorFlow backend (the export's).
"""

import argparse
import json
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import timing  # noqa: E402

VOCAB, PROMPT_WORDS = 5000, 16


def export(path, new, smoke=False):
    """Writes the text model's SavedModel to `path`; returns its vocabulary."""
    from keras_attn import models
    from keras_attn.models import text

    keras.utils.set_random_seed(0)
    words = ["", "[UNK]", "<s>", "</s>"] + [f"w{i}" for i in range(4, VOCAB)]
    size = dict(num_layers=1, d_model=16, intermediate_dim=32) if smoke else {}
    model = models.transformer_lm(
        VOCAB, num_layers=size.get("num_layers", 2), num_heads=4,
        d_model=size.get("d_model", 64), intermediate_dim=size.get("intermediate_dim", 256),
        sequence_length=PROMPT_WORDS + 1 + new, dropout=0.0,
    )  # fmt: skip
    text_model = text.TextLanguageModel(model, text.string_lookup(words), new, PROMPT_WORDS)
    text_model.export_text(path)
    return words


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new", type=int, default=24, help="new tokens per row")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="a tiny model, 1 repeat")
    parser.add_argument("--json", help="write the timings to this file")
    args = parser.parse_args(argv)
    if keras.backend.backend() != "tensorflow":
        parser.error("the SavedModel is exported from TensorFlow: KERAS_BACKEND=tensorflow")
    import tensorflow as tf

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "lm")
        words = export(path, args.new, args.smoke)
        loaded = tf.saved_model.load(path)
        rows = [" ".join(rng.choice(words[4:], PROMPT_WORDS)) for _ in range(args.batch)]
        texts = tf.constant(rows)
        lookup = {word: i for i, word in enumerate(words)}
        prompts = tf.constant(
            [[2] + [lookup[w] for w in row.split()] for row in rows], tf.int64
        )  # <s> and the words: what the text model looks up
        settings = dict(
            max_length=tf.constant(args.new), temperature=tf.constant(0.0),
            top_k=tf.constant(0), top_p=tf.constant(1.0), seed=tf.constant(0),
            repetition_penalty=tf.constant(1.0), stop_sequences=tf.constant([], tf.string),
            min_new_tokens=tf.constant(0),
        )  # fmt: skip
        generate, prefill = loaded.signatures["generate"], loaded.signatures["prefill"]
        decode_step = loaded.signatures["decode_step"]

        def one_shot():
            return generate(text=texts, **settings)["tokens"].numpy()

        def stream():
            state = prefill(tokens=prompts)
            tokens = []
            for i in range(args.new):
                token = tf.argmax(state["logits"], axis=-1)
                tokens.append(token.numpy())  # shown to the user as it comes
                if i + 1 < args.new:
                    cache = {k: state[k] for k in ("keys", "values", "valid", "positions")}
                    state = decode_step(token=token, index=state["index"], **cache)
            return np.stack(tokens, axis=1).astype("int32")

        same = bool(np.array_equal(one_shot(), stream()))
        repeats = 1 if args.smoke else args.repeats
        result = timing.time_group(
            {"generate": one_shot, "stream": stream}, (), repeats=repeats, min_time=0.0,
            max_calls=1,
        )  # fmt: skip
    tokens = args.batch * args.new
    row = {
        "batch": args.batch, "new": args.new, "same_tokens": same,
        "generate_tokens_per_s": tokens / result["generate"]["median_s"],
        "stream_tokens_per_s": tokens / result["stream"]["median_s"],
        "ratio": result["ratio"]["stream"], "timing": result,
    }  # fmt: skip
    print(f"keras {keras.__version__}, tensorflow {tf.__version__}, loadavg {timing.loadavg()}")
    print("| B | new | generate tok/s | decode_step loop tok/s | generate / loop | same tokens |")
    print("|---|---|---|---|---|---|")
    ratio = row["ratio"]
    print(
        f"| {args.batch} | {args.new} | {row['generate_tokens_per_s']:.0f} "
        f"| {row['stream_tokens_per_s']:.0f} | {ratio['median']:.2f} "
        f"[{ratio['min']:.2f}-{ratio['max']:.2f}] | {same} |"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f, indent=1, default=str)
    return row


if __name__ == "__main__":
    main()
